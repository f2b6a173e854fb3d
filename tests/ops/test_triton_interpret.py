"""The Triton kernels against the host ops, on CPU tensors through Triton's interpreter.

Runs where Triton imports and ``TRITON_INTERPRET=1`` is set (the variable must be set before
Triton is imported, so it cannot be switched on from inside the test run):

    TRITON_INTERPRET=1 pytest tests/ops/test_triton_interpret.py

On a GPU machine ``tests/ops/test_gpu_ops.py`` runs the compiled kernels.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from streamrt.ops.letterbox import CpuLetterbox, Normalize
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
    reason="needs triton and TRITON_INTERPRET=1",
)

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("src", "dst"), [((90, 160), (64, 64)), ((61, 97), (96, 64))])
def test_letterbox_kernel_equals_the_numpy_letterbox(src: tuple[int, int], dst: tuple[int, int]) -> None:
    from streamrt.ops.letterbox_torch import TorchLetterbox

    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    frames = np.random.default_rng(0).integers(0, 256, (2, *src, 3), dtype=np.uint8)
    op = TorchLetterbox(src, dst, n, device="cpu", batch=2, use_triton=True)
    out = torch.full((2, 3, *dst), float("nan"))
    op(torch.from_numpy(frames), out)
    for b in range(2):
        ref = np.empty((3, *dst), np.float32)
        CpuLetterbox(src, dst, n, method="numpy")(frames[b], ref)
        np.testing.assert_allclose(out[b].numpy(), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("agnostic", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_nms_kernels_equal_the_numpy_postprocess(agnostic: bool, ties: bool) -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    rng = np.random.default_rng(int(agnostic) * 2 + int(ties))
    batch, n, c = 2, 300, 3
    raw = np.empty((batch, 4 + c, n), np.float32)
    raw[:, 0:2] = rng.uniform(0, 200, (batch, 2, n))
    raw[:, 2:4] = rng.uniform(0, 50, (batch, 2, n))
    raw[:, 2, ::7] = 0  # zero-area boxes
    raw[:, :4, n // 2:] = raw[:, :4, : n - n // 2]  # identical boxes
    scores = rng.random((batch, c, n)).astype(np.float32)
    raw[:, 4:] = np.floor(scores * 4) / 4 if ties else scores
    for cfg in (PostprocessConfig(conf=0.2, iou=0.5, max_det=30, pre_nms_topk=200, class_agnostic=agnostic),
                PostprocessConfig(conf=0.0, iou=0.45, max_det=300, pre_nms_topk=300, class_agnostic=agnostic)):
        ref_d = np.empty((batch, cfg.max_det, 6), np.float32)
        ref_c = np.empty(batch, np.int32)
        CpuPostprocess(cfg, "yolov8", c)(raw, ref_d, ref_c)
        op = TorchPostprocess(cfg, "yolov8", c, n, batch=batch, device="cpu", use_triton=True)
        dets = torch.full((batch, cfg.max_det, 6), float("nan"))
        counts = torch.full((batch,), -1, dtype=torch.int32)
        op(torch.from_numpy(raw), dets, counts)
        assert counts.tolist() == ref_c.tolist()
        np.testing.assert_array_equal(dets.numpy(), ref_d)
