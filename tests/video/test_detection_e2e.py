"""End to end on short generated clips: detections where the generator drew objects, sync == pipeline,
several cameras batched, camera-paced runs, valid JSON Lines and video outputs, the YOLOv5 layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video import (
    ArraySource,
    DetectConfig,
    Detections,
    Frame,
    JsonlSink,
    SyntheticClip,
    SyntheticSource,
    ThreadedSink,
    VideoFileSource,
    VideoSink,
    open_detector,
    run_detection,
)
from video.detection_helpers import recall_precision, yolov5_from_bundled

CLIP = {"width": 640, "height": 360, "frames": 10}


def _run(detector: Any, sources: list[Any], config: DetectConfig) -> tuple[Any, list[Detections]]:
    out: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        out.append(det)

    return run_detection(detector, sources, config, on_result=keep), out


@pytest.fixture(scope="module")
def clip() -> SyntheticClip:
    return SyntheticClip(**CLIP, seed=3)  # clips are deterministic: this one has no heavy occlusion


@pytest.fixture(scope="module")
def runs(detector: Any, clip: SyntheticClip) -> dict[str, tuple[Any, list[Detections]]]:
    configs = {
        "sync": PipelineConfig(topology=Topology.SYNC, trace=True),
        "streams": PipelineConfig(topology=Topology.STREAMS, ring_size=3, trace=True),
        "workers": PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=2),
    }
    return {name: _run(detector, [SyntheticSource(clip)], DetectConfig(pipeline=cfg)) for name, cfg in configs.items()}


def test_detections_appear_where_objects_were_drawn(runs: dict[str, Any], clip: SyntheticClip) -> None:
    report, detections = runs["streams"]
    assert [d.index for d in detections] == list(range(clip.frames))
    recall, precision = recall_precision(detections, clip)
    assert recall >= 0.9, recall
    assert precision >= 0.9, precision
    assert report.frames == clip.frames and report.fps > 0
    assert set(report.stage_ms) == {"pre", "engine", "post"}
    assert {"p50", "p99"} <= set(report.latency_ms)


def test_sync_loop_and_pipelines_give_identical_detections(runs: dict[str, Any]) -> None:
    reference = runs["sync"][1]
    for name in ("streams", "workers"):
        got = runs[name][1]
        assert len(got) == len(reference)
        assert all(a.same_as(b) for a, b in zip(reference, got, strict=True)), name


def test_several_cameras_batched_into_the_engine(detector: Any, runs: dict[str, Any], clip: SyntheticClip) -> None:
    other = SyntheticClip(**CLIP, seed=4)
    report, detections = _run(detector, [SyntheticSource(clip), SyntheticSource(other)], DetectConfig(batch=2))
    assert report.batch == 2 and report.sources == 2 and report.frames == 2 * clip.frames
    by_source = {s: [d for d in detections if d.source == s] for s in (0, 1)}
    assert [d.index for d in by_source[0]] == list(range(clip.frames))
    # Batched with another camera, camera 0 gets the detections it gets alone (float tolerance: another batch size).
    assert all(a.same_as(b, atol=1e-3) for a, b in zip(runs["sync"][1], by_source[0], strict=True))
    recall, _ = recall_precision(by_source[1], other)
    assert recall >= 0.8


def test_camera_paced_run_keeps_up_at_a_modest_rate(detector: Any, clip: SyntheticClip) -> None:
    frames = [clip.frame(i) for i in range(6)]
    source = ArraySource(frames, fps=10.0)
    report, detections = _run(detector, [source], DetectConfig(paced=True))
    assert report.paced and report.target_fps == 10.0
    assert report.dropped == 0 and len(detections) == 6
    assert report.latency_ms["p99"] < 100.0
    assert report.sustained


def test_camera_paced_run_drops_frames_it_cannot_take(detector: Any, clip: SyntheticClip) -> None:
    frames = [clip.frame(i) for i in range(3)]
    source = ArraySource(frames, fps=2000.0, loop=True, length=60)
    report, _ = _run(detector, [source], DetectConfig(paced=True))
    assert report.dropped > 0
    assert report.frames + report.dropped == 60
    assert not report.sustained


def test_json_lines_and_annotated_video_outputs_are_valid(detector: Any, clip: SyntheticClip, tmp_path: Path) -> None:
    names = detector.names
    jsonl = ThreadedSink(JsonlSink(tmp_path / "dets.jsonl", names))
    video = ThreadedSink(VideoSink(tmp_path / "out.mp4", fps=30, size=(clip.width, clip.height), names=names))

    def deliver(frame: Frame, det: Detections) -> None:
        jsonl(frame, det)
        video(frame, det)

    run_detection(detector, [SyntheticSource(clip)], DetectConfig(), on_result=deliver)
    jsonl.close()
    video.close()
    lines = [json.loads(line) for line in (tmp_path / "dets.jsonl").read_text().splitlines()]
    assert [line["frame"] for line in lines] == list(range(clip.frames))
    first = lines[0]["detections"][0]
    assert set(first) == {"box", "score", "class", "label"} and first["label"] in names
    assert len(first["box"]) == 4 and 0 <= first["score"] <= 1
    decoded = VideoFileSource(tmp_path / "out.mp4")
    assert (decoded.info.width, decoded.info.height, decoded.info.frames) == (clip.width, clip.height, clip.frames)
    annotated = decoded.read()
    assert annotated is not None and not np.array_equal(annotated, clip.frame(0))  # boxes were drawn
    decoded.close()


def test_yolov5_layout_export_gives_the_same_detections(detector: Any, cache_dir: Path, tmp_path: Path,
                                                        runs: dict[str, Any], clip: SyntheticClip) -> None:
    v5 = open_detector(yolov5_from_bundled(tmp_path / "v5.onnx"), backend="onnxruntime", cache_dir=cache_dir,
                       labels=detector.names)
    assert v5.layout.name == "yolov5" and v5.num_classes == detector.num_classes
    _, detections = _run(v5, [SyntheticSource(clip)], DetectConfig())
    assert all(a.same_as(b, atol=1e-4) for a, b in zip(runs["sync"][1], detections, strict=True))
