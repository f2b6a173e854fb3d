"""The fused post-processing kernels (``streamrt.ops.triton_postprocess``) without a GPU, run through Triton's
interpreter (``TRITON_INTERPRET=1``) against the plain-torch path of the same op, every
layout, float32 and float16 raw outputs, poisoned output buffers (their sm_90 compile: test_triton_interpret.py).

    TRITON_INTERPRET=1 pytest tests/ops/test_triton_postprocess.py

On a GPU machine ``tests/ops/test_gpu_ops.py`` runs the compiled op against torchvision.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from streamrt.ops.postprocess import PostprocessConfig

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused kernels are the default: no setting of the developer's shell turns them off here."""
    monkeypatch.delenv("STREAMRT_FUSED_POSTPROCESS", raising=False)


def _raw(layout: str, batch: int, anchors: int, classes: int, dtype: torch.dtype, seed: int,
         threshold: float = 0.25) -> torch.Tensor:
    """Boxes that overlap (clusters of near copies), ties in the scores, and every 11th anchor's best score
    exactly ``threshold`` in ``dtype`` (0.1 is not a half: the kernels must compare as torch does)."""
    rng = np.random.default_rng(seed)
    objectness = layout == "yolov5"
    channels = 4 + int(objectness) + classes
    raw = np.empty((batch, channels, anchors), np.float32)
    centres = rng.uniform(0, 600, (batch, 2, anchors // 4 + 1))
    raw[:, 0:2] = np.repeat(centres, 4, axis=2)[:, :, :anchors] + rng.normal(0, 3, (batch, 2, anchors))
    raw[:, 2:4] = rng.uniform(4, 80, (batch, 2, anchors))
    scores = rng.random((batch, channels - 4, anchors))
    scores[:, :, ::5] = np.round(scores[:, :, ::5] * 8) / 8  # ties, and scores equal to 0.25
    scores[:, :, rng.random(anchors) < 0.7] *= 0.05  # most anchors under every threshold: fewer than K candidates
    raw[:, 4:] = scores
    raw[:, 4:, ::11] = 0.01
    raw[:, 4 + int(objectness), ::11] = threshold  # the first class's score (times an objectness of 1)
    if objectness:
        raw[:, 4, ::11] = 1.0
    out = torch.from_numpy(raw).to(dtype)
    return out if layout == "yolov8" else out.transpose(1, 2).contiguous()  # anchors first


@interpreted
@pytest.mark.parametrize("layout", ["yolov8", "yolov5", "yolov8t"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_kernels_give_the_torch_paths_detections(layout: str, dtype: str) -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    dt = getattr(torch, dtype)
    batch, anchors, classes = 3, 700, 5
    for cfg in (PostprocessConfig(conf=0.25, iou=0.5, max_det=40, pre_nms_topk=300),
                PostprocessConfig(conf=0.1, iou=0.6, max_det=300, pre_nms_topk=1024, class_agnostic=True)):
        raw = _raw(layout, batch, anchors, classes, dt, seed=anchors + cfg.max_det, threshold=cfg.conf)
        found = {}
        for fused in (True, False):
            op = TorchPostprocess(cfg, layout, classes, anchors, batch=batch, device="cpu", dtype=dt, use_triton=fused)
            assert op.fused == fused
            dets = torch.full((batch, cfg.max_det, 6), float("nan"))
            counts = torch.full((batch,), -1, dtype=torch.int32)
            op(raw, dets, counts)
            op(raw, dets, counts)  # twice: the second call starts from the first's buffers, as in a replayed lane
            found[fused] = dets, counts
        assert found[True][1].tolist() == found[False][1].tolist()
        assert min(found[True][1].tolist()) > 0  # the case is not empty
        torch.testing.assert_close(found[True][0], found[False][0], rtol=0, atol=0)


@interpreted
def test_a_smaller_batch_than_the_op_was_made_for_leaves_the_rest_alone() -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    cfg = PostprocessConfig(conf=0.25, iou=0.5, max_det=20, pre_nms_topk=100)
    op = TorchPostprocess(cfg, "yolov8", 3, 200, batch=4, device="cpu", use_triton=True)
    raw = _raw("yolov8", 2, 200, 3, torch.float32, seed=1)
    dets = torch.full((2, 20, 6), float("nan"))
    counts = torch.full((2,), -1, dtype=torch.int32)
    op(raw, dets, counts)
    assert not torch.isnan(dets).any() and (counts > 0).all()
    for b in range(2):  # rows past each image's count are zero
        assert (dets[b, counts[b]:] == 0).all()


@interpreted
def test_the_switch_keeps_the_triton_nms_with_the_torch_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """``STREAMRT_FUSED_POSTPROCESS=0``: the Triton NMS with steps 1, 2 and 4 in torch (the benchmark's A/B)
    gives the fused op's detections."""
    from streamrt.ops.postprocess_torch import FUSED_ENV, TorchPostprocess

    cfg = PostprocessConfig(conf=0.25, iou=0.5, max_det=30, pre_nms_topk=200)
    raw = _raw("yolov5", 2, 400, 4, torch.float16, seed=3)
    found = []
    for value in (None, "0"):  # unset: the fused kernels (the default)
        if value is not None:
            monkeypatch.setenv(FUSED_ENV, value)
        op = TorchPostprocess(cfg, "yolov5", 4, 400, batch=2, device="cpu", dtype=torch.float16, use_triton=True)
        assert op.use_triton and op.fused == (value is None)
        dets = torch.full((2, 30, 6), float("nan"))
        counts = torch.full((2,), -1, dtype=torch.int32)
        op(raw, dets, counts)
        found.append((dets, counts))
    assert found[0][1].tolist() == found[1][1].tolist() and min(found[0][1].tolist()) > 0
    torch.testing.assert_close(found[0][0], found[1][0], rtol=0, atol=0)


@interpreted
def test_a_strided_output_falls_back_to_the_torch_gather_with_the_same_rows() -> None:
    """Output rows that are not contiguous (a view into a wider buffer) take the torch gather; the rows past each
    image's count, never cleared by the fused path, must not reach it as indices."""
    from streamrt.ops.postprocess_torch import TorchPostprocess

    cfg = PostprocessConfig(conf=0.25, iou=0.5, max_det=150, pre_nms_topk=200)
    raw = _raw("yolov8", 2, 200, 3, torch.float32, seed=5)
    op = TorchPostprocess(cfg, "yolov8", 3, 200, batch=2, device="cpu", use_triton=True)
    op._buf["keep"].fill_(10**9)  # what an uncleared keep row may hold
    wide = torch.full((2, 150, 8), float("nan"))
    strided = wide[..., :6]
    counts = torch.full((2,), -1, dtype=torch.int32)
    op(raw, strided, counts)
    dets = torch.full((2, 150, 6), float("nan"))
    op(raw, dets, counts)
    torch.testing.assert_close(strided, dets, rtol=0, atol=0)
    assert (counts > 0).all() and (counts < 150).all()
