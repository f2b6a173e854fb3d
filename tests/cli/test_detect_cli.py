"""`streamrt detect` and `streamrt demo`: outputs, run report, and one-line errors with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrt.cli.main import main

pytest.importorskip("cv2")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def test_detect_writes_video_json_and_report(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, dets, report = tmp_path / "out.mp4", tmp_path / "dets.jsonl", tmp_path / "report"
    rc = main(["detect", "synthetic:320x180x8", "--backend", "onnxruntime", "--cache-dir", str(cache),
               "--out", str(out), "--json", str(dets), "--report", str(report)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "8 frames from 1 source(s) (320x180)" in text and "FPS" in text and "p99" in text
    assert "stage ms/item: pre" in text
    lines = [json.loads(line) for line in dets.read_text().splitlines()]
    assert len(lines) == 8 and any(line["detections"] for line in lines)
    from streamrt.video import VideoFileSource

    assert VideoFileSource(out).info.frames == 8
    data = json.loads((report / "detect.json").read_text())
    assert data["frames"] == 8 and data["fps"] > 0 and "p99" in data["latency_ms"]
    assert (report / "detect_timeline.png").stat().st_size > 0
    assert (report / "detect_trace.json").is_file()


def test_detect_two_sources_sync_topology(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["detect", "synthetic:160x96x4", "synthetic:160x96x4:seed=5", "--backend", "onnxruntime",
               "--cache-dir", str(cache), "--topology", "sync", "--json", str(tmp_path / "d.jsonl")])
    assert rc == 0
    assert "8 frames from 2 source(s)" in capsys.readouterr().out
    sources = [json.loads(line)["source"] for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert sorted(sources) == [0] * 4 + [1] * 4


@pytest.mark.parametrize(
    ("make", "message"),
    [("corrupt_video", "cannot open video"), ("missing_model", "file not found"),
     ("classifier", "expected a 3-D YOLO output")],
)
def test_detect_errors_are_one_line(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str], make: str,
                                    message: str) -> None:
    from video.detection_helpers import not_a_detector

    source, model = "synthetic:64x64x2", []
    if make == "corrupt_video":
        bad = tmp_path / "broken.mp4"
        bad.write_bytes(b"\x00\x01garbage" * 100)
        source = str(bad)
    elif make == "missing_model":
        model = ["--model", str(tmp_path / "nope.onnx")]
    else:
        model = ["--model", str(not_a_detector(tmp_path / "classifier.onnx"))]
    rc = main(["detect", source, *model, "--backend", "onnxruntime", "--cache-dir", str(cache)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("streamrt detect: error:") and message in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_demo_runs_both_loops_and_writes_its_outputs(tmp_path: Path, cache: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--frame-size", "320x192", "--frames", "16", "-o", str(tmp_path), "--cache-dir", str(cache)])
    assert rc == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("StreamRT demo:"))
    plans = {"sync": "shapes_detector.onnxruntime.plan", "pipeline": "shapes_detector.onnxruntime-threads1.plan"}
    if (tmp_path / plans["pipeline"]).exists():  # CPU lanes: one-thread sessions, the loop another plan
        assert f"synchronous loop on {plans['sync']}, pipeline on {plans['pipeline']}" in header, header
    else:
        assert f"both runs on {plans['sync']}" in header, header
    assert "synchronous loop" in out and "speed-up" in out and "same detections in both runs: yes" in out
    for name in ("annotated.mp4", "detections.jsonl", "sync_timeline.png", "pipeline_timeline.png", "demo.json",
                 "shapes_detector.onnxruntime.plan"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["identical"] and summary["map50"] > 0.5
