"""The CUDA stage path of the detection workload (load, h2d, pre, engine, post, d2h on torch tensors) run on
host streams that act like CUDA streams: same detections as the CPU path, in every topology.

On a GPU the same stages run on real streams (``test_gpu_detection.py``); here they run the torch
versions of the device ops (Triton is absent) on CPU tensors.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video import DetectConfig, Detections, Frame, SyntheticClip, SyntheticSource, run_detection
from video.detection_helpers import FakeCudaDevice, ImportedEngine

torch = pytest.importorskip("torch")


def _run(detector: Any, clip: SyntheticClip, config: DetectConfig, device: Any = None,
         sources: int = 1) -> list[Detections]:
    out: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        out.append(det)

    run_detection(detector, [SyntheticSource(clip) for _ in range(sources)], config, on_result=keep, device=device)
    return out


@pytest.mark.parametrize(
    "pipeline",
    [PipelineConfig(topology=Topology.SYNC), PipelineConfig(topology=Topology.STREAMS, ring_size=3),
     PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=2)],
    ids=lambda p: p.describe(),
)
def test_device_stages_give_the_host_path_detections(detector: Any, pipeline: PipelineConfig) -> None:
    clip = SyntheticClip(width=480, height=270, frames=6, seed=3)
    device_model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch")
    reference = _run(detector, clip, DetectConfig())
    # With TRITON_INTERPRET=1 the synchronous run goes through the Triton kernels; the interpreter
    # patches triton.language globally, so threaded topologies stay on the torch versions. Without the
    # interpreter the torch versions run everywhere: the tensors are on the CPU, and an installed Triton
    # (a CUDA build of torch on a machine without a GPU) would be picked for the "cuda" device and refuse them.
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    use_triton = None if pipeline.topology is Topology.SYNC and interpreted else False
    got = _run(device_model, clip, DetectConfig(pipeline=pipeline, use_triton=use_triton), device=FakeCudaDevice())
    assert [d.index for d in got] == list(range(clip.frames))
    # The host path letterboxes with OpenCV (rounded to uint8) and runs ONNX Runtime; the device path
    # interpolates in float and runs torch: the same boxes to a tenth of a pixel.
    for a, b in zip(reference, got, strict=True):
        assert len(a) == len(b) and (a.classes == b.classes).all()
        assert abs(a.boxes - b.boxes).max() < 0.1 and abs(a.scores - b.scores).max() < 5e-3


def test_device_stages_with_two_cameras_batched(detector: Any) -> None:
    clip = SyntheticClip(width=320, height=180, frames=4, seed=4)
    device_model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch")
    untraced = PipelineConfig(trace=False)  # the pipeline's trace clock needs real CUDA events
    alone = _run(device_model, clip, DetectConfig(pipeline=untraced, use_triton=False), device=FakeCudaDevice())
    both = _run(device_model, clip, DetectConfig(pipeline=untraced, batch=2, use_triton=False),
                device=FakeCudaDevice(), sources=2)
    for s in (0, 1):
        got = [d for d in both if d.source == s]
        assert all(a.same_as(b, atol=1e-3) for a, b in zip(alone, got, strict=True))
