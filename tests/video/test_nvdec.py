"""NVDEC through PyNvVideoCodec on the GPU: pictures equal the CPU decoder's, detections equal the
CPU-decoded NV12 path's, several sessions decode in parallel, hybrid moves keep the stream's place.
Skipped without a GPU or without PyNvVideoCodec.

Clips: encoded here with PyAV where it is installed; else (the GPU machine has no PyAV) the clips of
``scripts/make_video_clips.py`` named by ``STREAMRT_VIDEO_CLIPS`` (``scripts/gpu_video_check.py``
sets it). The CPU reference is PyAV's NV12 (bit-exact) or, without PyAV, OpenCV's decode converted
back to NV12 (about one level off).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

HAVE_AV = importlib.util.find_spec("av") is not None
TOLERANCE = 0.0 if HAVE_AV else 1.5  # mean |difference| of NV12 levels vs the CPU reference
FRAMES = 30


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from streamrt.video.decode_nvdec import nvdec_available

    if not nvdec_available():
        pytest.skip("needs PyNvVideoCodec and a CUDA GPU")
    if HAVE_AV:
        from streamrt.video.clips import encode_clip
        from streamrt.video.synthetic import SyntheticClip

        folder = tmp_path_factory.mktemp("clips")
        return [encode_clip(SyntheticClip(width=640, height=360, frames=FRAMES, seed=s), folder / f"c{s}.mp4",
                            codec=c) for s, c in ((1, "h264"), (2, "h265"))]
    carried = sorted(Path(os.environ.get("STREAMRT_VIDEO_CLIPS", "build/video-clips")).glob("*.mp4"))[:2]
    if not carried:
        pytest.skip("no PyAV to make clips and no STREAMRT_VIDEO_CLIPS folder (scripts/make_video_clips.py)")
    return carried


def _reference(path: Path, count: int) -> list[np.ndarray]:
    from streamrt.video.decoding import open_nv12

    source = open_nv12(path)
    frames = [source.read() for _ in range(count)]
    source.close()
    assert all(f is not None for f in frames)
    return frames  # type: ignore[return-value]


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    diff = np.abs(a.astype(int) - b.astype(int))
    return bool(diff.max() <= 1) if HAVE_AV else bool(diff.mean() <= TOLERANCE)


def test_nvdec_pictures_equal_the_cpu_decoders(clips: list[Path]) -> None:
    from streamrt.video.decode_nvdec import NvdecPool

    for path in clips:
        ref = _reference(path, FRAMES)
        with NvdecPool([path], workers=1) as pool:
            (source,) = pool.sources()
            h, w = source.info.height, source.info.width
            assert (h * 3 // 2, w) == ref[0].shape
            ours = []
            while len(ours) < FRAMES and (picture := source.read()) is not None:
                assert picture.is_cuda and picture.dtype == torch.uint8 and tuple(picture.shape) == (h * 3 // 2, w)
                ours.append(picture.cpu().numpy())
        assert len(ours) == FRAMES
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            assert _close(a, b), f"{path.name} frame {i}"


def test_nvdec_decodes_every_frame_of_a_file(clips: list[Path]) -> None:
    from streamrt.video.decode_nvdec import NvdecPool
    from streamrt.video.sources import VideoFileSource

    expected = VideoFileSource(clips[0]).info.frames
    with NvdecPool([clips[0]], workers=1) as pool:
        (source,) = pool.sources()
        count = 0
        while source.read() is not None:
            count += 1
    assert count == expected


def test_nvdec_detections_equal_the_cpu_decoded_nv12_path(detector_cuda: Any, clips: list[Path]) -> None:
    from streamrt.video import DetectConfig, Detections, Frame, run_detection
    from streamrt.video.decode_nvdec import NvdecPool
    from streamrt.video.decoding import open_nv12

    def detect(sources: list[Any]) -> list[Detections]:
        out: list[Detections] = []

        def keep(frame: Frame, det: Detections) -> None:
            out.append(det)

        run_detection(detector_cuda, sources, DetectConfig(max_frames=FRAMES), on_result=keep)
        return sorted(out, key=lambda d: (d.source, d.index))

    with NvdecPool(clips, workers=2) as pool:
        gpu = detect(pool.sources())
    cpu = detect([open_nv12(p) for p in clips])
    assert len(gpu) == len(cpu) == FRAMES * len(clips)
    if HAVE_AV:  # the same pictures: the same detections
        assert all(a.same_as(b, atol=1e-2) for a, b in zip(gpu, cpu, strict=True))
    else:  # pictures a level apart: the same objects in nearly every frame
        same = sum(len(a) == len(b) and (a.classes == b.classes).all() for a, b in zip(gpu, cpu, strict=True))
        assert same >= 0.9 * len(gpu)


def test_several_sessions_decode_in_parallel(clips: list[Path]) -> None:
    from streamrt.video.decode_nvdec import measure_nvdec

    one = measure_nvdec(clips[:1], 1, seconds=1.0)
    four = measure_nvdec(clips[:1], 4, seconds=1.0)
    assert one["fps"] > 100 and four["fps"] > 1.5 * one["fps"], (one, four)


def test_hybrid_moves_a_stream_between_nvdec_and_cpu_at_the_frame_it_reached(clips: list[Path]) -> None:
    from streamrt.video.hybrid import HybridDecode
    from streamrt.video.hybrid_policy import HybridPolicy

    ref = _reference(clips[0], 7)
    policy = HybridPolicy({"nvdec": 1000.0, "cpu": 1000.0}, hold_s=0.0)
    with HybridDecode(clips[:1], policy=policy, interval_s=0) as hybrid:
        (source,) = hybrid.sources()
        assert source.decoder == "nvdec"
        first = [source.read() for _ in range(5)]
        assert all(p.is_cuda for p in first)
        source.switch("cpu")
        on_cpu = source.read()
        assert isinstance(on_cpu, np.ndarray) and source.decoder == "cpu"
        source.switch("nvdec")
        back = source.read()
        assert back.is_cuda and source.moves == 2
    for got, want in zip([*first, on_cpu, back], ref, strict=True):
        got = got.cpu().numpy() if hasattr(got, "cpu") else got
        assert _close(got, want) or np.abs(got.astype(int) - want.astype(int)).mean() <= 1.5


def test_hybrid_in_decoder_processes_moves_through_one_group_at_the_frame_it_reached(clips: list[Path]) -> None:
    """Both sides in decoder processes (NVDEC by CUDA IPC, the CPU's through page-locked shared memory), read as
    the live group reads them (``take_ready``); a move, opened beside the reader, keeps the stream's place."""
    from streamrt.video.hybrid import HybridDecode
    from streamrt.video.hybrid_policy import HybridPolicy
    from streamrt.video.live_group import shared_lanes

    ref = _reference(clips[0], 12)
    policy = HybridPolicy({"nvdec": 1000.0, "cpu": 1000.0}, hold_s=0.0)
    with HybridDecode(clips[:1], policy=policy, interval_s=0, decode_processes=1, cpu_processes=1) as hybrid:
        (source,) = hybrid.sources()
        assert shared_lanes([source]) == (hybrid, [0]) and source.decoder == "nvdec"
        got: list[Any] = []

        def take(count: int) -> None:
            want = len(got) + count
            while len(got) < want:
                got.extend(picture for _, picture, _ in hybrid.take_ready([0]).taken)

        take(4)
        source.switch("cpu")
        take(4)
        source.switch("nvdec")
        take(4)
        assert source.moves == 2 and source.decoder == "nvdec"
    # on CUDA the CPU side's pictures arrive uploaded too (ProcessDecodePool(upload=True): page-locked rings)
    assert hybrid.upload and [p.is_cuda for p in got] == [True] * 12
    for k, (picture, want) in enumerate(zip(got, ref, strict=True)):
        picture = picture.cpu().numpy()
        assert _close(picture, want) or np.abs(picture.astype(int) - want.astype(int)).mean() <= 1.5, k


@pytest.fixture(scope="module")
def detector_cuda() -> Any:
    from streamrt.video.model import bundled_labels, bundled_model, open_detector

    # The plan scripts/gpu_video_check.py builds (default cache, batch <= 128): no second build there.
    model = open_detector(bundled_model(), labels=bundled_labels(), max_batch=128)
    if model.device != "cuda":
        pytest.skip("no CUDA backend for the detector")
    return model


@pytest.mark.parametrize("way", ["primary+reuse", "own+reuse"])
def test_a_kept_decoder_decodes_the_same_pictures_on_every_pass(clips: list[Path], way: str) -> None:
    """Issue 27's fix: decoders in the primary context (torch's stream) and kept across a looping file's passes
    deliver the CPU decoder's pictures, in order, on the second pass too, from one decoder."""
    from streamrt.video.decode_nvdec import NvdecOptions, NvdecPool
    from streamrt.video.sources import VideoFileSource

    path = clips[0]
    probe = VideoFileSource(path)
    frames = probe.info.frames
    probe.close()
    assert frames
    ref = _reference(path, 5)
    options = NvdecOptions(context=way.split("+")[0], reuse=True)
    with NvdecPool([path], workers=1, loop=True, options=options) as pool:
        (source,) = pool.sources()
        pts = []
        for _ in range(frames):
            assert source.read() is not None
            pts.append(source.last_pts)
        again = [source.read().cpu().numpy() for _ in range(5)]
        opened = pool.stats()["opened"]
    assert opened == 1
    assert None in pts or pts == sorted(pts), "pictures of one pass out of order"
    for i, (a, b) in enumerate(zip(again, ref, strict=True)):
        assert _close(a, b), f"{path.name} frame {i} of the second pass"
