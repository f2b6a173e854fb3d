"""Device ops on a CUDA GPU: agreement with the host ops, no host synchronisation, CUDA-graph capture,
and the fixed-size NMS against ``torchvision.ops.batched_nms`` (same boxes, >= 10x faster on 20k boxes)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from streamrt.ops.letterbox import CpuLetterbox, Normalize
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("src", "dst"), [((1080, 1920), (640, 640)), ((720, 1280), (320, 320)), ((97, 61), (64, 96))])
def test_gpu_letterbox_agrees_with_the_host(src: tuple[int, int], dst: tuple[int, int], dtype: str) -> None:
    from streamrt.ops.letterbox_torch import TorchLetterbox

    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    frames = np.random.default_rng().integers(0, 256, (2, *src, 3), dtype=np.uint8)
    op = TorchLetterbox(src, dst, n, device="cuda", batch=2)
    out = torch.full((2, 3, *dst), float("nan"), device="cuda", dtype=getattr(torch, dtype))
    op(torch.from_numpy(frames).cuda(), out)
    tol = 1e-4 if dtype == "float32" else 1e-2
    for b in range(2):
        ref = np.empty((3, *dst), np.float32)
        CpuLetterbox(src, dst, n, method="numpy")(frames[b], ref)
        np.testing.assert_allclose(out[b].float().cpu().numpy(), ref, rtol=0, atol=tol)


def _raw(batch: int, n: int, c: int, *, ties: bool = False, size: float = 640.0) -> np.ndarray:
    rng = np.random.default_rng()
    raw = np.empty((batch, 4 + c, n), np.float32)
    raw[:, 0:2] = rng.uniform(0, size, (batch, 2, n))
    raw[:, 2:4] = rng.uniform(0, size / 8, (batch, 2, n))
    raw[:, 2, ::5] = 0  # zero-area boxes
    raw[:, :4, n // 2:] = raw[:, :4, : n - n // 2]  # identical boxes
    scores = rng.random((batch, c, n)).astype(np.float32)
    raw[:, 4:] = np.floor(scores * 8) / 8 if ties else scores
    return raw


@pytest.mark.parametrize("fused", ["0", "1"])
@pytest.mark.parametrize("ties", [False, True])
def test_gpu_postprocess_agrees_with_the_host(ties: bool, fused: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.ops.postprocess_torch import FUSED_ENV, TorchPostprocess

    monkeypatch.setenv(FUSED_ENV, fused)  # both paths: the fused kernels (the default) and the torch steps

    batch, n, c = 3, 8400, 80
    raw = _raw(batch, n, c, ties=ties)
    cfg = PostprocessConfig(conf=0.25, iou=0.45, max_det=300, pre_nms_topk=1024)
    ref_d, ref_c = np.empty((batch, 300, 6), np.float32), np.empty(batch, np.int32)
    CpuPostprocess(cfg, "yolov8", c)(raw, ref_d, ref_c)
    op = TorchPostprocess(cfg, "yolov8", c, n, batch=batch, device="cuda")
    assert op.fused == (fused == "1")
    dets = torch.full((batch, 300, 6), float("nan"), device="cuda")
    counts = torch.full((batch,), -1, dtype=torch.int32, device="cuda")
    op(torch.from_numpy(raw).cuda(), dets, counts)
    assert counts.tolist() == ref_c.tolist()
    np.testing.assert_array_equal(dets.cpu().numpy(), ref_d)


@pytest.mark.parametrize("fused", ["0", "1"])
def test_gpu_ops_never_synchronise_and_replay_as_a_cuda_graph(fused: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.ops.letterbox_torch import TorchLetterbox
    from streamrt.ops.postprocess_torch import FUSED_ENV, TorchPostprocess

    monkeypatch.setenv(FUSED_ENV, fused)
    letterbox = TorchLetterbox((1080, 1920), (640, 640), device="cuda")
    post = TorchPostprocess(PostprocessConfig(), "yolov8", 80, 8400, device="cuda")
    assert letterbox.use_triton and post.use_triton, "the GPU machine has Triton"
    frames = torch.randint(0, 256, (1, 1080, 1920, 3), dtype=torch.uint8, device="cuda")
    images = torch.empty(1, 3, 640, 640, device="cuda")
    raw = torch.from_numpy(_raw(1, 8400, 80)).cuda()
    dets, counts = torch.empty(1, 300, 6, device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            letterbox(frames, images)
            post(raw, dets, counts)
    stream.synchronize()
    eager = (images.clone(), dets.clone(), counts.clone())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(stream):
            letterbox(frames, images)
            post(raw, dets, counts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        letterbox(frames, images)
        post(raw, dets, counts)
    images.zero_()
    dets.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(images, eager[0]) and torch.equal(dets, eager[1]) and torch.equal(counts, eager[2])


def _batched_nms_rows(raw: torch.Tensor, iou: float, max_det: int) -> torch.Tensor:
    torchvision = pytest.importorskip("torchvision")
    cx, cy, w, h = raw[0, :4]
    boxes = torch.stack([cx - w * 0.5, cy - h * 0.5, cx + w * 0.5, cy + h * 0.5], 1)
    scores, classes = raw[0, 4:].max(0)
    keep = torchvision.ops.batched_nms(boxes, scores, classes, iou)[:max_det]
    return torch.cat([boxes[keep], scores[keep, None], classes[keep, None].float()], 1)


def _canonical(rows: torch.Tensor) -> np.ndarray:
    a = rows.double().cpu().numpy()
    return a[np.lexsort((a[:, 3], a[:, 2], a[:, 1], a[:, 0], a[:, 5], -a[:, 4]))]


@pytest.mark.parametrize("ties", [False, True])
def test_nms_returns_the_boxes_of_torchvision_batched_nms_on_20k_boxes(ties: bool) -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    n, c, iou, max_det = 20000, 80, 0.45, 300
    raw = torch.from_numpy(_raw(1, n, c, ties=ties, size=1920)).cuda()
    op = TorchPostprocess(PostprocessConfig(conf=0.0, iou=iou, max_det=max_det, pre_nms_topk=n), "yolov8", c, n,
                          device="cuda")
    dets, counts = torch.empty(1, max_det, 6, device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda")
    op(raw, dets, counts)
    ref = _batched_nms_rows(raw, iou, max_det)
    got = dets[0, : int(counts[0])]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(_canonical(got), _canonical(ref))


def test_nms_is_ten_times_faster_than_batched_nms_on_20k_boxes() -> None:
    torchvision = pytest.importorskip("torchvision")
    from streamrt.ops.postprocess_torch import TorchPostprocess

    n, c = 20000, 80
    raw = torch.from_numpy(_raw(1, n, c, size=1920)).cuda()
    cx, cy, w, h = raw[0, :4]
    boxes = torch.stack([cx - w * 0.5, cy - h * 0.5, cx + w * 0.5, cy + h * 0.5], 1)
    scores, classes = raw[0, 4:].max(0)
    op = TorchPostprocess(PostprocessConfig(conf=0.0, max_det=300, pre_nms_topk=n), "yolov8", c, n, device="cuda")
    dets, counts = torch.empty(1, 300, 6, device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda")

    def median_ms(fn: object) -> float:
        times = []
        for i in range(60):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            torch.cuda.synchronize()
            if i >= 10:
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    theirs = median_ms(lambda: torchvision.ops.batched_nms(boxes, scores, classes, 0.45))
    ours = median_ms(lambda: op(raw, dets, counts))
    assert theirs / ours >= 10, f"batched_nms {theirs:.3f} ms, ours {ours:.3f} ms"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("matrix", ["bt601", "bt709"])
def test_gpu_nv12_letterbox_agrees_with_the_reference(matrix: str, dtype: str) -> None:
    from streamrt.ops.letterbox_torch import TorchNv12Letterbox
    from streamrt.ops.nv12 import CpuNv12Letterbox

    src, dst = (1080, 1920), (640, 640)
    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    frames = np.random.default_rng().integers(0, 256, (2, src[0] * 3 // 2, src[1]), dtype=np.uint8)
    op = TorchNv12Letterbox(src, dst, n, matrix=matrix, device="cuda")
    assert op.use_triton
    out = torch.full((2, 3, *dst), float("nan"), device="cuda", dtype=getattr(torch, dtype))
    op(torch.from_numpy(frames).cuda(), out)
    tol = 2e-4 if dtype == "float32" else 1e-2
    for b in range(2):
        ref = CpuNv12Letterbox(src, dst, n, matrix)(frames[b], np.empty((3, *dst), np.float64))
        np.testing.assert_allclose(out[b].float().cpu().numpy(), ref, rtol=0, atol=tol)
