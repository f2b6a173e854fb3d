"""Cameras batched into one engine call get their own detections: a slot, row or ordering mix-up between
cameras would hand one camera's objects to another.

The cameras show DIFFERENT scenes (two cameras of one clip cannot tell a swapped row from a right one),
and each camera's detections are compared with that camera run alone through the synchronous loop:

* on ONNX Runtime (the host path: the batch is cut to the frames present), row for row and exactly;
* on the device path (``test_device_path_on_cpu.py``: the CUDA stages on torch CPU tensors, fake CUDA
  streams), alone with the engine at the same batch of 2 (the second row holds a stale frame, as every
  partial batch of the device path does), so both runs use the same kernels: row for row and exactly,
  in every topology. The same check runs on the GPU with CUDA graphs (``test_gpu_detection.py``).

CUDA graph replay itself (captured launches on static buffers) cannot run on the CPU: capture needs a
CUDA stream. What it replays, the stage functions on the slot's full-batch buffers, is what runs here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video import DetectConfig, Detections, SyntheticClip, SyntheticSource, run_detection
from streamrt.video.compare import diff_detections
from video.detection_helpers import FakeCudaDevice, ImportedEngine

torch = pytest.importorskip("torch")


def _run(detector: Any, clips: list[SyntheticClip], config: DetectConfig, device: Any = None) -> list[list[Detections]]:
    """Each source's detections, in frame order."""
    out: list[Detections] = []
    run_detection(detector, [SyntheticSource(c) for c in clips], config, on_result=lambda f, d: out.append(d),
                  device=device)
    return [[d for d in out if d.source == s] for s in range(len(clips))]


@pytest.fixture(scope="module")
def clips() -> list[SyntheticClip]:
    return [SyntheticClip(width=320, height=180, frames=4, seed=4), SyntheticClip(width=320, height=180, frames=4,
                                                                                  seed=7)]


def test_the_two_cameras_see_different_scenes(detector: Any, clips: list[SyntheticClip]) -> None:
    """The premise of the checks below: a swapped row would change the detections."""
    alone = [_run(detector, [c], DetectConfig(pipeline=PipelineConfig(topology=Topology.SYNC)))[0] for c in clips]
    assert all(len(d) for d in alone[0] + alone[1])
    assert not diff_detections(alone[0], alone[1], box_atol=5.0, score_atol=0.05).ok


@pytest.mark.parametrize(
    "pipeline",
    [PipelineConfig(topology=Topology.SYNC), PipelineConfig(topology=Topology.STREAMS, ring_size=3),
     PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=2)],
    ids=lambda p: p.describe(),
)
def test_host_path_batched_cameras_each_get_their_solo_detections(detector: Any, clips: list[SyntheticClip],
                                                                   pipeline: PipelineConfig) -> None:
    alone = [_run(detector, [c], DetectConfig(pipeline=PipelineConfig(topology=Topology.SYNC)))[0] for c in clips]
    both = _run(detector, clips, DetectConfig(pipeline=pipeline, batch=2))
    for s in (0, 1):
        assert [d.index for d in both[s]] == list(range(clips[s].frames))
        diff = diff_detections(alone[s], both[s])
        assert diff.ok, f"camera {s}: {diff.format()}"
    # Swapped cameras: each still gets its own detections.
    swapped = _run(detector, clips[::-1], DetectConfig(pipeline=pipeline, batch=2))
    assert diff_detections(alone[1], swapped[0]).ok and diff_detections(alone[0], swapped[1]).ok


@pytest.mark.parametrize(
    "pipeline",
    [PipelineConfig(topology=Topology.SYNC, trace=False), PipelineConfig(topology=Topology.STREAMS, ring_size=3,
                                                                          trace=False),
     PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=2, trace=False)],
    ids=lambda p: p.describe(),
)
def test_device_path_batched_cameras_each_get_their_solo_detections(detector: Any, clips: list[SyntheticClip],
                                                                     pipeline: PipelineConfig) -> None:
    model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch")
    sync = PipelineConfig(topology=Topology.SYNC, trace=False)
    # Alone, at the engine batch of the batched run (rows padded): the same kernels, so equal row for row.
    alone = [_run(model, [c], DetectConfig(pipeline=sync, batch=2, use_triton=False), FakeCudaDevice())[0]
             for c in clips]
    both = _run(model, clips, DetectConfig(pipeline=pipeline, batch=2, use_triton=False), FakeCudaDevice())
    for s in (0, 1):
        assert [d.index for d in both[s]] == list(range(clips[s].frames))
        diff = diff_detections(alone[s], both[s])
        assert diff.ok, f"camera {s}: {diff.format()}"


def test_diff_names_what_differs_between_two_runs() -> None:
    box = np.array([[10, 10, 50, 60], [100, 100, 140, 150]], np.float32)

    def det(boxes: np.ndarray, scores: list[float], classes: list[int], index: int = 0) -> Detections:
        return Detections(1, index, boxes, np.asarray(scores, np.float32), np.asarray(classes, np.int64))

    same = det(box, [0.9, 0.6], [1, 2])
    assert diff_detections([same], [det(box.copy(), [0.9, 0.6], [1, 2])]).ok
    moved = box.copy()
    moved[1, 3] += 0.5
    diff = diff_detections([same], [det(moved, [0.9, 0.6], [1, 2])], box_atol=0.1)
    assert not diff.ok and "camera 1 frame 0 row 1: box" in diff.problems[0] and diff.max_box == pytest.approx(0.5)
    assert diff_detections([same], [det(moved, [0.9, 0.6], [1, 2])], box_atol=1.0).ok
    fewer = diff_detections([same], [det(box[:1], [0.9], [1])])
    assert "2 -> 1 detections; first difference at row 1" in fewer.problems[0]
    reordered = det(box[::-1].copy(), [0.6, 0.9], [2, 1])
    assert not diff_detections([same], [reordered]).ok  # row for row: another order is a difference
    assert diff_detections([same], [reordered], match_iou=0.5).ok  # matched: the same objects
    extra = det(np.vstack([box, [[200, 200, 230, 230]]]), [0.9, 0.6, 0.2505], [1, 2, 0])
    matched = diff_detections([same], [extra], match_iou=0.5, score_atol=1e-2, conf=0.25)
    assert matched.ok and matched.unmatched_near_conf == 1  # at the threshold: either run may keep it
    confident = det(np.vstack([box, [[200, 200, 230, 230]]]), [0.9, 0.6, 0.8], [1, 2, 0])
    assert "has no match" in diff_detections([same], [confident], match_iou=0.5).problems[0]
    assert "frame order" in diff_detections([same], [det(box, [0.9, 0.6], [1, 2], index=3)]).problems[0]


def test_the_gpu_tests_tf32_bound_covers_emulated_tf32(detector: Any) -> None:
    """test_gpu_detection.py bounds batch 1 vs batch 2 on the GPU by TF32_BOX_PX / TF32_SCORE (cuDNN may run
    TF32 on one side only). Here, on its clips (fewer frames), TF32 convolutions emulated on the CPU against
    IEEE fp32: the bound leaves at least 4x headroom (measured: 0.04 px and 1.6e-3 over 8 frames)."""
    from video.test_gpu_detection import TF32_BOX_PX, TF32_SCORE

    fp32 = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch")
    tf32 = dataclasses.replace(fp32, engine=ImportedEngine("cpu", tf32=True))
    config = DetectConfig(pipeline=PipelineConfig(topology=Topology.SYNC, trace=False), use_triton=False)
    for seed in (4, 9):
        clip = SyntheticClip(width=1280, height=720, frames=1, seed=seed)
        exact = _run(fp32, [clip], config, FakeCudaDevice())[0]
        emulated = _run(tf32, [clip], config, FakeCudaDevice())[0]
        diff = diff_detections(exact, emulated, match_iou=0.5, box_atol=TF32_BOX_PX / 4, score_atol=TF32_SCORE / 4)
        assert diff.ok, diff.format()
        assert diff.max_box > 1e-3  # the emulation changes the numbers: TF32 is not fp32
