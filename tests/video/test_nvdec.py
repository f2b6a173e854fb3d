"""NVDEC through PyNvVideoCodec on the GPU: pictures equal FFmpeg's, detections equal the CPU-decoded NV12
path's, several sessions decode in parallel. Skipped without a GPU or without PyNvVideoCodec."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

pytest.importorskip("av")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from streamrt.video.decode_nvdec import nvdec_available

    if not nvdec_available():
        pytest.skip("needs PyNvVideoCodec and a CUDA GPU")
    from streamrt.video.clips import encode_clip
    from streamrt.video.synthetic import SyntheticClip

    folder = tmp_path_factory.mktemp("clips")
    return [encode_clip(SyntheticClip(width=640, height=360, frames=30, seed=s), folder / f"c{s}.mp4", codec=c)
            for s, c in ((1, "h264"), (2, "h265"))]


def test_nvdec_pictures_equal_ffmpegs(clips: list[Path]) -> None:
    from streamrt.video.decode_av import AvSource
    from streamrt.video.decode_nvdec import NvdecPool
    from streamrt.video.sources import iter_frames

    for path in clips:
        with NvdecPool([path], workers=1) as pool:
            (source,) = pool.sources()
            assert (source.info.width, source.info.height) == (640, 360)
            ours = []
            while (picture := source.read()) is not None:
                assert picture.is_cuda and picture.dtype == torch.uint8 and tuple(picture.shape) == (540, 640)
                ours.append(picture.cpu().numpy())
        theirs = AvSource(path, output="nv12")
        ref = list(iter_frames(theirs))
        assert len(ours) == len(ref) == 30
        for a, b in zip(ours, ref, strict=True):
            assert np.abs(a.astype(int) - b.astype(int)).max() <= 1  # H.264/H.265 decoding is exact


def test_nvdec_detections_equal_the_cpu_decoded_nv12_path(detector_cuda: Any, clips: list[Path]) -> None:
    from streamrt.video import DetectConfig, Detections, Frame, run_detection
    from streamrt.video.decode_av import AvSource
    from streamrt.video.decode_nvdec import NvdecPool

    def detect(sources: list[Any]) -> list[Detections]:
        out: list[Detections] = []

        def keep(frame: Frame, det: Detections) -> None:
            out.append(det)

        run_detection(detector_cuda, sources, DetectConfig(), on_result=keep)
        return sorted(out, key=lambda d: (d.source, d.index))

    with NvdecPool(clips, workers=2) as pool:
        gpu = detect(pool.sources())
    cpu = detect([AvSource(p, output="nv12") for p in clips])
    assert len(gpu) == len(cpu) == 60
    assert all(a.same_as(b, atol=1e-2) for a, b in zip(gpu, cpu, strict=True))


def test_several_sessions_decode_in_parallel(clips: list[Path]) -> None:
    from streamrt.video.decode_nvdec import measure_nvdec

    one = measure_nvdec(clips[:1], 1, seconds=1.0)
    four = measure_nvdec(clips[:1], 4, seconds=1.0)
    assert one["fps"] > 100 and four["fps"] > 1.5 * one["fps"], (one, four)


@pytest.fixture(scope="module")
def detector_cuda(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from streamrt.video.model import bundled_labels, bundled_model, open_detector

    model = open_detector(bundled_model(), labels=bundled_labels(), cache_dir=tmp_path_factory.mktemp("plans"),
                          max_batch=4)
    if model.device != "cuda":
        pytest.skip("no CUDA backend for the detector")
    return dataclasses.replace(model)


def test_hybrid_moves_a_stream_between_nvdec_and_cpu_at_the_frame_it_reached(clips: list[Path]) -> None:
    from streamrt.video.decode_av import AvSource
    from streamrt.video.hybrid import HybridDecode
    from streamrt.video.hybrid_policy import HybridPolicy
    from streamrt.video.sources import iter_frames

    ref = list(iter_frames(AvSource(clips[0], output="nv12")))
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
    for got, want in zip([*first, on_cpu, back], ref[:7], strict=True):
        got = got.cpu().numpy() if hasattr(got, "cpu") else got
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
