"""The detection pipeline on a CUDA GPU: the pipeline topologies (with CUDA graphs) and the synchronous
loop give identical detections, which match the CPU path's and the generator's ground truth."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video import DetectConfig, Detections, Frame, SyntheticClip, SyntheticSource, run_detection
from streamrt.video.model import bundled_labels, describe_engine
from video.detection_helpers import ImportedEngine, recall_precision

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gpu_detector() -> Any:
    labels = tuple(bundled_labels().read_text().split())
    return describe_engine(ImportedEngine("cuda", batch=4), labels=labels, source="bundled (imported)",
                           backend="torch")


def _run(detector: Any, clip: SyntheticClip, pipeline: PipelineConfig, batch: int = 1) -> list[Detections]:
    out: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        out.append(det)

    run_detection(detector, [SyntheticSource(clip)], DetectConfig(pipeline=pipeline, batch=batch), on_result=keep)
    return out


def test_pipeline_and_sync_loop_give_identical_detections_on_the_gpu(gpu_detector: Any, detector: Any) -> None:
    clip = SyntheticClip(width=1920, height=1080, frames=24, seed=22)  # recall 0.93 with ONNX Runtime
    sync = _run(gpu_detector, clip, PipelineConfig(topology=Topology.SYNC))
    for cfg in (PipelineConfig(topology=Topology.STREAMS, ring_size=4),
                PipelineConfig(topology=Topology.STREAMS, ring_size=4, cuda_graphs=True),
                PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=3, cuda_graphs=True)):
        got = _run(gpu_detector, clip, cfg)
        assert len(got) == len(sync) and all(a.same_as(b) for a, b in zip(sync, got, strict=True)), cfg.describe()
    recall, precision = recall_precision(sync, clip)
    assert recall >= 0.8 and precision >= 0.8
    cpu = _run(detector, clip, PipelineConfig(topology=Topology.SYNC))  # ONNX Runtime on the host
    for a, b in zip(sync, cpu, strict=True):
        assert len(a) == len(b)
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1.0)


def test_batched_cameras_on_the_gpu(gpu_detector: Any) -> None:
    clip = SyntheticClip(width=1280, height=720, frames=8, seed=4)
    alone = _run(gpu_detector, clip, PipelineConfig(topology=Topology.SYNC))
    out: list[Detections] = []
    config = DetectConfig(batch=2, pipeline=PipelineConfig(cuda_graphs=True))
    run_detection(gpu_detector, [SyntheticSource(clip), SyntheticSource(clip)], config,
                  on_result=lambda f, d: out.append(d))
    for s in (0, 1):
        got = [d for d in out if d.source == s]
        assert all(a.same_as(b, atol=1e-2) for a, b in zip(alone, got, strict=True))
