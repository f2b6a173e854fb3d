"""The detection pipeline on a CUDA GPU: the pipeline topologies (with CUDA graphs) and the synchronous
loop give identical detections, which match the CPU path's and the generator's ground truth."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video import DetectConfig, Detections, Frame, SyntheticClip, SyntheticSource, run_detection
from streamrt.video.compare import diff_detections
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


TF32_BOX_PX, TF32_SCORE = 0.25, 1e-2
"""How far two runs of this fp32 detector may differ when one uses TF32 convolutions and the other not.

torch runs fp32 cuDNN convolutions in TF32 by default (10 mantissa bits, unit roundoff 2^-11), and
cuDNN picks its kernels by shape: batch 1 and batch 2 may get a TF32 tensor-core kernel on one side
and an fp32 one on the other. Emulating TF32 on the CPU (every convolution's input and weights rounded
to 10 mantissa bits, the products summed in float64: ImportedEngine(tf32=True)) moves this detector's
boxes on these 1280x720 clips by at most 0.04 frame px and its scores by 1.6e-3 against IEEE fp32; and
a detection within that of the confidence threshold may appear on one side only. Allowed here: 6x that
(truncating instead of rounding doubles the error, and TF32 may run on both sides); the headroom is
checked on the CPU by test_batched_cameras.py::test_the_gpu_tests_tf32_bound_covers_emulated_tf32."""


def _cameras(detector: Any, clips: list[SyntheticClip], config: DetectConfig) -> list[list[Detections]]:
    out: list[Detections] = []
    run_detection(detector, [SyntheticSource(c) for c in clips], config, on_result=lambda f, d: out.append(d))
    return [[d for d in out if d.source == s] for s in range(len(clips))]


def test_batched_cameras_on_the_gpu(gpu_detector: Any) -> None:
    """Two cameras with different scenes, two frames per engine call, CUDA graphs (the pipeline's default
    topology and the replicated one). Row for row, each camera's detections equal that camera alone
    through the synchronous loop at the same engine batch (its second row holds a stale frame): the same
    kernels, so any difference is a slot, row or stale-input defect. Against the camera alone at batch
    1, other kernels: equal within TF32's error (TF32_BOX_PX). Whatever differs is printed."""
    clips = [SyntheticClip(width=1280, height=720, frames=8, seed=s) for s in (4, 9)]
    sync = PipelineConfig(topology=Topology.SYNC)
    same_kernels = [_cameras(gpu_detector, [c], DetectConfig(pipeline=sync, batch=2))[0] for c in clips]
    batch1 = [_cameras(gpu_detector, [c], DetectConfig(pipeline=sync, batch=1))[0] for c in clips]
    failures = []
    for pipeline in (PipelineConfig(cuda_graphs=True),
                     PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=2, cuda_graphs=True)):
        for order in ((0, 1), (1, 0)):
            got = _cameras(gpu_detector, [clips[i] for i in order], DetectConfig(batch=2, pipeline=pipeline))
            for s, camera in enumerate(order):
                exact = diff_detections(same_kernels[camera], got[s], box_atol=1e-2, score_atol=1e-5)
                near = diff_detections(batch1[camera], got[s], match_iou=0.5, box_atol=TF32_BOX_PX,
                                       score_atol=TF32_SCORE)
                label = f"{pipeline.describe()}, camera {camera} in row {s}"
                print(f"{label}: vs alone at batch 2: {exact.format()}\n{label}: vs alone at batch 1: {near.format()}")
                if not exact.ok:
                    failures.append(f"{label} vs alone at batch 2: {exact.format()}")
                if not near.ok:
                    failures.append(f"{label} vs alone at batch 1: {near.format()}")
    assert not failures, "\n".join(failures)
