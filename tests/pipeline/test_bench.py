"""The topology comparison and the pipeline-bench command, on host streams with a tiny workload."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

pytest.importorskip("torch")

from streamrt.cli.pipeline_bench import main  # noqa: E402
from streamrt.device import get_device  # noqa: E402
from streamrt.pipeline.bench import compare, standard_cases  # noqa: E402
from streamrt.testing.workloads import FrameSpec, FrameWorkload, TorchModuleEngine, make_frames, tiny_cnn  # noqa: E402

SPEC = FrameSpec(height=36, width=64, size=32, classes=10, topk=3, channels=4)


def test_standard_cases_cover_the_three_topologies() -> None:
    labels = [c.label for c in standard_cases(ring_size=3, workers=(2,), graphs=(False, True))]
    assert labels == [
        "(a) sync", "(b) streams ring3", "(c) single x2 ring3", "(b+c) streams x2 ring3",
        "(a) sync graphs", "(b) streams ring3 graphs", "(c) single x2 ring3 graphs", "(b+c) streams x2 ring3 graphs",
    ]


def test_compare_interleaves_rounds_and_keeps_outputs() -> None:
    engine = TorchModuleEngine(tiny_cnn(SPEC))
    seen: list[str] = []
    results = compare(
        standard_cases(ring_size=2, workers=(2,)), lambda: FrameWorkload(engine, SPEC), get_device("cpu"),
        make_frames(4, SPEC), items=6, warmup=2, rounds=2, warmup_rounds=1, trace_items=5, keep_outputs=4,
        on_round=lambda r, case, trace: seen.append(f"{r}{case.name}"),
    )
    assert seen == ["0(a)", "0(b)", "0(c)", "0(b+c)", "1(a)", "1(b)", "1(c)", "1(b+c)"]
    for result in results:
        assert len(result.rounds) == 2 and all(t.items == 6 for t in result.rounds)
        assert result.items_per_s > 0 and result.median in result.rounds
        assert result.traced is not None and result.traced.items == 5 and result.traced.spans
        assert len(result.outputs) == 4
        assert all(a.equal(b) for a, b in zip(results[0].outputs, result.outputs, strict=True))


def test_case_throughput_is_the_median_rounds_figure() -> None:
    from streamrt.pipeline.bench import BenchCase, CaseResult
    from streamrt.pipeline.tracing import PipelineTrace

    def round_at(items_per_s: float) -> PipelineTrace:
        trace = PipelineTrace("x", start_ms=0.0, end_ms=1000.0)
        for _ in range(int(items_per_s)):
            trace.add_latency(1.0)
        return trace

    result = CaseResult(standard_cases()[0], rounds=[round_at(300), round_at(100), round_at(200), round_at(400)])
    assert isinstance(result.case, BenchCase)
    # Two rounds or four: the summary line and the table read one round, never an average of two.
    assert result.items_per_s == result.median.items_per_s == 200.0


def test_pipeline_bench_command_writes_its_report(tmp_path, capsys) -> None:
    out = tmp_path / "report"
    code = main(["--device", "cpu", "--frame-size", "64x36", "--size", "32", "--classes", "10",
                 "--items", "6", "--warmup", "2", "--rounds", "1", "--warmup-rounds", "0", "--trace-items", "6",
                 "--workers", "2", "--distinct-frames", "3", "--verify", "4", "-o", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| (a) sync |" in printed and "bit-identical in every case" in printed
    report = (out / "pipeline_bench.md").read_text()
    assert "## Stage times" in report and "- commit:" in report
    data = json.loads((out / "pipeline_bench.json").read_text())
    labels = [c["label"] for c in data["cases"]]
    assert labels == ["(a) sync", "(b) streams ring4", "(c) single x2 ring4", "(b+c) streams x2 ring4"]
    assert len(list((out / "timelines").glob("*.png"))) == 4
    assert len(list((out / "traces").glob("*.json"))) == 4
