"""Fixed-size NMS: the NumPy op against a brute-force reference, the torch op against the NumPy op.

Inputs are fresh random boxes plus the adversarial cases: tied scores, identical boxes, zero-area
boxes (IoU 0/0 = NaN never suppresses, as in torchvision), many classes, truncation at max_det
and at the pre-NMS top-k.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig, nms_numpy

torch = pytest.importorskip("torch")


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


def _iou32(a: np.ndarray, b: np.ndarray) -> np.float32:
    f = np.float32
    w = max(f(0), min(a[2], b[2]) - max(a[0], b[0]))
    h = max(f(0), min(a[3], b[3]) - max(a[1], b[1]))
    inter = f(w * h)
    area_a, area_b = f((a[2] - a[0]) * (a[3] - a[1])), f((b[2] - b[0]) * (b[3] - b[1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return f(inter / f(f(area_a + area_b) - inter))


def reference_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray | None, iou: float) -> list[int]:
    """Greedy NMS written the slow, obvious way: keep a box unless a kept box of its class overlaps it."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    keep: list[int] = []
    for i in order:
        if all((classes is not None and classes[j] != classes[i]) or not _iou32(boxes[j], boxes[i]) > np.float32(iou)
               for j in keep):
            keep.append(i)
    return keep


def random_boxes(rng: np.random.Generator, n: int, *, size: float = 200.0, ties: bool = False,
                 duplicates: bool = False, zero_area: bool = False) -> tuple[np.ndarray, np.ndarray]:
    xy = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(2, size / 4, (n, 2))
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
    scores = rng.random(n).astype(np.float32)
    if ties:
        scores = np.floor(scores * 5).astype(np.float32) / 5
    if duplicates:
        boxes[n // 2:] = boxes[: n - n // 2]
    if zero_area:
        boxes[::3, 2] = boxes[::3, 0]
    return boxes, scores


CASES = {"random": {}, "ties": {"ties": True}, "identical": {"duplicates": True}, "zero-area": {"zero_area": True},
         "all": {"ties": True, "duplicates": True, "zero_area": True}}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("classes", [1, 3])
def test_nms_numpy_equals_the_brute_force_reference(case: str, classes: int) -> None:
    rng = np.random.default_rng(_seed(case, classes))
    boxes, scores = random_boxes(rng, 150, **CASES[case])
    cls = rng.integers(0, classes, 150) if classes > 1 else None
    for iou in (0.3, 0.5, 0.7):
        assert nms_numpy(boxes, scores, iou, cls).tolist() == reference_nms(boxes, scores, cls, iou)


def test_identical_boxes_keep_the_first_of_equal_scores() -> None:
    boxes = np.array([[0, 0, 10, 10]] * 3, np.float32)
    assert nms_numpy(boxes, np.array([0.5, 0.5, 0.5], np.float32), 0.5).tolist() == [0]
    zero = np.array([[5, 5, 5, 9]] * 2, np.float32)  # zero area: IoU is NaN, nothing is suppressed
    assert nms_numpy(zero, np.array([0.9, 0.8], np.float32), 0.5).tolist() == [0, 1]


def test_max_det_truncates_the_greedy_order() -> None:
    rng = np.random.default_rng(5)
    boxes, scores = random_boxes(rng, 300)
    full = nms_numpy(boxes, scores, 0.5)
    assert nms_numpy(boxes, scores, 0.5, max_det=7).tolist() == full[:7].tolist()


def _raw_v8(rng: np.random.Generator, batch: int, n: int, c: int, **kw: bool) -> np.ndarray:
    raw = np.empty((batch, 4 + c, n), np.float32)
    for b in range(batch):
        boxes, _ = random_boxes(rng, n, size=320, **kw)
        raw[b, 0:2] = ((boxes[:, :2] + boxes[:, 2:]) / 2).T
        raw[b, 2:4] = (boxes[:, 2:] - boxes[:, :2]).T
        scores = rng.random((c, n)).astype(np.float32)
        raw[b, 4:] = np.floor(scores * 4) / 4 if kw.get("ties") else scores
    return raw


def _run_cpu(raw: np.ndarray, cfg: PostprocessConfig, layout: str, c: int) -> tuple[np.ndarray, np.ndarray]:
    dets = np.full((raw.shape[0], cfg.max_det, 6), np.nan, np.float32)
    counts = np.full(raw.shape[0], -1, np.int32)
    return CpuPostprocess(cfg, layout, c)(raw, dets, counts)


def test_postprocess_equals_decode_then_reference_nms() -> None:
    rng = np.random.default_rng(7)
    raw = _raw_v8(rng, 1, 400, 3)
    cfg = PostprocessConfig(conf=0.3, iou=0.45, max_det=500)
    dets, counts = _run_cpu(raw, cfg, "yolov8", 3)
    scores, classes = raw[0, 4:].max(0), raw[0, 4:].argmax(0)
    cand = np.flatnonzero(scores >= np.float32(0.3))
    cx, cy, w, h = raw[0, :4][:, cand]
    boxes = np.stack([cx - w * np.float32(0.5), cy - h * np.float32(0.5), cx + w * np.float32(0.5),
                      cy + h * np.float32(0.5)], 1)
    keep = reference_nms(boxes, scores[cand], classes[cand], 0.45)
    assert counts[0] == len(keep)
    np.testing.assert_array_equal(dets[0, : len(keep), :4], boxes[keep])
    np.testing.assert_array_equal(dets[0, : len(keep), 5], classes[cand][keep])
    assert not dets[0, len(keep):].any()  # rows past the count are zero


def test_pre_nms_topk_keeps_the_best_candidates() -> None:
    rng = np.random.default_rng(8)
    raw = _raw_v8(rng, 1, 500, 2)
    small = _run_cpu(raw, PostprocessConfig(conf=0.0, iou=0.5, max_det=100, pre_nms_topk=50), "yolov8", 2)
    scores = raw[0, 4:].max(0)
    top = np.sort(np.argsort(-scores, kind="stable")[:50])
    only_top = raw[:, :, top]
    ref = _run_cpu(only_top, PostprocessConfig(conf=0.0, iou=0.5, max_det=100), "yolov8", 2)
    np.testing.assert_array_equal(small[0], ref[0])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("layout", "agnostic"), [("yolov8", False), ("yolov5", False), ("yolov8", True)])
def test_torch_postprocess_equals_the_numpy_postprocess(case: str, layout: str, agnostic: bool) -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    rng = np.random.default_rng(_seed(case, layout, agnostic))
    n, c, batch = 600, 4, 2
    raw = _raw_v8(rng, batch, n, c, **CASES[case])
    if layout == "yolov5":
        raw = np.concatenate([raw[:, :4], rng.random((batch, 1, n)).astype(np.float32), raw[:, 4:]], 1)
        raw = raw.transpose(0, 2, 1).copy()
    for cfg in (PostprocessConfig(conf=0.25, iou=0.5, max_det=40, pre_nms_topk=256, class_agnostic=agnostic),
                PostprocessConfig(conf=0.0, iou=0.6, max_det=1000, pre_nms_topk=1000, class_agnostic=agnostic)):
        ref_d, ref_c = _run_cpu(raw, cfg, layout, c)
        op = TorchPostprocess(cfg, layout, c, n, batch=batch, device="cpu", use_triton=False)
        dets = torch.full((batch, cfg.max_det, 6), float("nan"))
        counts = torch.full((batch,), -1, dtype=torch.int32)
        op(torch.from_numpy(raw), dets, counts)
        assert counts.tolist() == ref_c.tolist()
        np.testing.assert_array_equal(dets.numpy(), ref_d)


def test_torch_postprocess_float16_outputs() -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    rng = np.random.default_rng(11)
    raw = _raw_v8(rng, 1, 300, 3).astype(np.float16)
    cfg = PostprocessConfig(conf=0.25, iou=0.5, max_det=30)
    ref_d, ref_c = _run_cpu(raw, cfg, "yolov8", 3)
    op = TorchPostprocess(cfg, "yolov8", 3, 300, device="cpu", dtype=torch.float16, use_triton=False)
    dets, counts = torch.empty(1, 30, 6), torch.empty(1, dtype=torch.int32)
    op(torch.from_numpy(raw), dets, counts)
    assert counts.tolist() == ref_c.tolist()
    np.testing.assert_array_equal(dets.numpy(), ref_d)


def test_torch_postprocess_rejects_wrong_shapes() -> None:
    from streamrt.errors import ShapeError
    from streamrt.ops.postprocess_torch import TorchPostprocess

    op = TorchPostprocess(PostprocessConfig(max_det=5), "yolov8", 2, 10, device="cpu", use_triton=False)
    with pytest.raises(ShapeError, match="anchors"):
        op(torch.zeros(1, 6, 11), torch.empty(1, 5, 6), torch.empty(1, dtype=torch.int32))
    with pytest.raises(ShapeError, match="int32"):
        op(torch.zeros(1, 6, 10), torch.empty(1, 5, 6), torch.empty(1, dtype=torch.int64))
