"""Chrome-trace export, PNG timeline and the pipeline summary on known spans."""

from __future__ import annotations

import json

import pytest

from streamrt.pipeline import Pipeline, PipelineConfig, Stage, StageKind
from streamrt.pipeline.tracing import PipelineTrace, StageSpan
from streamrt.profiling.pipeline_summary import format_comparison, summarize
from streamrt.profiling.timeline import plot_timeline, steady_window
from streamrt.profiling.trace import to_chrome_trace, write_chrome_trace

pytestmark = pytest.mark.timeout(60)


def synthetic() -> PipelineTrace:
    """Two items over 10 ms: copies on 'in', kernels on 'engine', host enqueue on MainThread."""
    spans = [
        StageSpan("h2d", 0, 0, "in", "h2d", 0.0, 2.0),
        StageSpan("engine", 0, 0, "engine", "compute", 2.0, 6.0),
        StageSpan("h2d", 1, 0, "in", "h2d", 2.0, 4.0),  # hidden under item 0's kernels
        StageSpan("engine", 1, 0, "engine", "compute", 6.0, 10.0),
        StageSpan("engine", 0, 0, "MainThread", "enqueue", 1.0, 2.0),
        StageSpan("engine", 1, 0, "MainThread", "enqueue", 3.0, 4.0),
    ]
    return PipelineTrace(
        "demo",
        spans=spans,
        latencies_ms=[6.0, 8.0],
        items=2,
        start_ms=0.0,
        end_ms=10.0,
        tracks={"in": "cuda stream", "engine": "cuda stream", "MainThread": "host thread"},
        meta={"device": "cuda"},
    )


def test_summary_numbers_on_known_spans() -> None:
    s = summarize(synthetic())
    assert s.items == 2 and s.items_per_s == pytest.approx(200.0)
    assert s.latency_ms["p50"] == pytest.approx(7.0)
    assert s.track_busy == pytest.approx({"MainThread": 0.2, "engine": 0.8, "in": 0.4})
    assert s.resource_busy == pytest.approx({"GPU compute": 0.8, "H2D copy": 0.4, "thread MainThread": 0.2})
    assert s.copy_hidden == pytest.approx(0.5)  # 2 of 4 ms of copies ran under kernels
    assert s.bottleneck == ("GPU compute", pytest.approx(0.8))
    assert s.bound_items_per_s == pytest.approx(250.0)
    assert s.stage_ms == pytest.approx({"h2d": 2.0, "engine": 4.0})
    assert s.enqueue_ms_per_item == pytest.approx(1.0)
    assert json.dumps(s.to_dict())


def test_compute_gaps_count_the_idle_stretches_between_calls() -> None:
    """What the 2026-12-06 H100 trace of 156 camera streams showed and its report did not: the GPU idle between
    calls while frames waited (the busiest resource read "GPU compute 67%")."""
    from streamrt.profiling.pipeline_summary import compute_gaps
    from streamrt.video.report import RunReport

    assert summarize(synthetic()).compute_gaps == {}  # back-to-back kernels: one busy stretch, no gap
    calls = [(0.0, 7.0), (8.0, 15.0), (60.0, 67.0), (68.0, 75.0), (100.0, 107.0)]  # idle 1, 45, 1, 25 ms
    gaps = compute_gaps(calls)
    assert gaps == pytest.approx({"idle_share": 72 / 107, "over": 2.0, "over_ms": 20.0, "longest_ms": 45.0})
    assert compute_gaps(calls[:1]) == {} and compute_gaps([]) == {}
    report = RunReport("streams", "m", "torch_inductor", "cuda", 156, "1920x1080", 128, 100, 1.0, compute_gaps=gaps)
    assert "  compute idle between calls: 67% of the run, 2 stretches over 20 ms, longest 45.0 ms" in \
        report.format_text()
    assert "| compute idle between calls | 67% of the run" in report.to_markdown()
    assert report.to_dict()["compute_gaps"]["longest_ms"] == 45.0


def test_comparison_table() -> None:
    s = summarize(synthetic())
    untraced = summarize(PipelineTrace("sync", latencies_ms=[1.0] * 4, items=4, start_ms=0.0, end_ms=40.0))
    table = format_comparison([(untraced, None), (s, s)])
    lines = table.splitlines()
    assert lines[0].startswith("| config | items/s")
    assert "| sync | 100.0 | 1.00x |" in lines[2] and "| - |" in lines[2]
    assert "| demo | 200.0 | 2.00x |" in lines[3] and "GPU compute | 80% | 250.0 | 50% |" in lines[3]


def test_chrome_trace_layout(tmp_path) -> None:
    doc = to_chrome_trace(synthetic())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 6
    names = {e["args"]["name"]: (e["pid"], e["tid"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names["engine"][0] == names["in"][0] != names["MainThread"][0]
    first = next(e for e in spans if e["name"] == "engine #1" and e["cat"] == "compute")
    assert (first["ts"], first["dur"]) == (6000.0, 4000.0)
    path = write_chrome_trace(synthetic(), tmp_path / "sub" / "trace.json")
    assert json.loads(path.read_text())["otherData"]["label"] == "demo"


def test_timeline_png_from_a_real_host_run(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    stages = [
        Stage("load", lambda slot, item, stream: None, kind=StageKind.HOST),
        Stage("work", lambda slot, item, stream: setattr(slot, "output", item)),
    ]
    with Pipeline(stages, PipelineConfig(device="cpu", trace=True)) as pipe:
        list(pipe.map(range(30)))
        trace = pipe.trace()
    assert {s.item for s in steady_window(trace, 5)} == {13, 14, 15, 16, 17}
    path = plot_timeline(trace, tmp_path / "timeline.png", items=8)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="trace=True"):
        plot_timeline(PipelineTrace("empty"), tmp_path / "x.png")
