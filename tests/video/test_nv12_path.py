"""The NV12 path of the detection workload (gather + fused NV12 letterbox) run on CPU tensors through
the CUDA stage table (fake CUDA streams): CPU-decoded NV12 gives the detections of CPU-decoded BGR.

This is the path NVDEC pictures take on the GPU (``test_nvdec.py``), with the pictures here coming
from PyAV as host NV12 arrays; both decoders decode H.264 bit-exactly, so only the YUV -> RGB step
differs from the BGR path (FFmpeg's swscale vs our BT.601 kernel).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("av")
torch = pytest.importorskip("torch")

from streamrt.errors import ConfigError  # noqa: E402
from streamrt.ops.nv12 import nv12_to_rgb  # noqa: E402
from streamrt.pipeline.config import PipelineConfig, Topology  # noqa: E402
from streamrt.video import ArraySource, DetectConfig, Detections, Frame, SyntheticClip, run_detection  # noqa: E402
from streamrt.video.clips import encode_clip  # noqa: E402
from streamrt.video.decode_av import AvSource  # noqa: E402
from streamrt.video.sources import iter_frames  # noqa: E402
from video.detection_helpers import FakeCudaDevice, ImportedEngine  # noqa: E402


def _detect(model: Any, sources: list[Any], config: DetectConfig, device: Any = None) -> list[Detections]:
    out: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        out.append(det)

    run_detection(model, sources, config, on_result=keep, device=device)
    return out


@pytest.mark.parametrize("topology", [Topology.SYNC, Topology.STREAMS])
def test_nv12_frames_give_the_bgr_detections(detector: Any, tmp_path: Path, topology: Topology) -> None:
    clip = SyntheticClip(width=480, height=268, frames=6, seed=7)
    path = encode_clip(clip, tmp_path / "c.mp4", crf=16)
    device_model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch")
    cfg = DetectConfig(pipeline=PipelineConfig(topology=topology, ring_size=2, trace=False), use_triton=False)
    nv12_source = AvSource(path, output="nv12")
    assert nv12_source.frame_format == "nv12"
    nv12 = _detect(device_model, [nv12_source], cfg, device=FakeCudaDevice())
    # The same pictures converted on the host with the same matrix, as BGR frames through the BGR stages:
    # the NV12 path differs only by not rounding the colours to uint8.
    pictures = list(iter_frames(AvSource(path, output="nv12")))
    bgr_frames = [np.rint(nv12_to_rgb(p)[..., ::-1]).astype(np.uint8) for p in pictures]
    bgr = _detect(device_model, [ArraySource(bgr_frames)], cfg, device=FakeCudaDevice())
    assert [d.index for d in nv12] == list(range(clip.frames))
    assert sum(len(d) for d in bgr) > 0
    for a, b in zip(bgr, nv12, strict=True):
        assert len(a) == len(b) and (a.classes == b.classes).all()
        # Scores agree to ~1e-3 (a channel mix-up would move them by far more); boxes of the small
        # detector move by up to ~1 frame pixel with that input change.
        assert abs(a.boxes - b.boxes).max() < 1.5 and abs(a.scores - b.scores).max() < 0.01
    # And against FFmpeg's own YUV -> BGR (bilinear chroma): the same objects found.
    ffmpeg = _detect(device_model, [AvSource(path)], cfg, device=FakeCudaDevice())
    assert sum(len(d) for d in ffmpeg) == pytest.approx(sum(len(d) for d in nv12), abs=2)


def test_nv12_needs_a_cuda_engine_and_one_format(detector: Any, tmp_path: Path) -> None:
    clip = SyntheticClip(width=160, height=96, frames=2, seed=1)
    path = encode_clip(clip, tmp_path / "c.mp4")
    with pytest.raises(ConfigError, match="nv12 on a CUDA engine"):
        run_detection(detector, [AvSource(path, output="nv12")], DetectConfig())
    with pytest.raises(ConfigError, match="one frame format"):
        run_detection(detector, [AvSource(path), AvSource(path, output="nv12")], DetectConfig())


def test_gather_pictures_copies_every_picture_into_its_row_in_one_call() -> None:
    from streamrt.video.workload import gather_pictures

    rng = np.random.default_rng(7)
    pictures: list[Any] = [rng.integers(0, 256, (6, 4), dtype=np.uint8) for _ in range(3)]
    pictures[1] = torch.from_numpy(pictures[1].copy())  # a tensor beside host arrays (NVDEC beside CPU decoders)
    dst = torch.full((5, 6, 4), 255, dtype=torch.uint8)  # poisoned: rows 3 and 4 must stay as they were
    gather_pictures(dst, pictures)
    for row, picture in enumerate(pictures):
        assert np.array_equal(dst[row].numpy(), np.asarray(picture)), row
    assert bool((dst[3:] == 255).all())
    gather_pictures(dst, [])  # an empty call is no call
    assert bool((dst[3:] == 255).all())
