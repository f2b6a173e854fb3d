"""The GPU scripts load their benchmark modules on the CPU exactly as they do on the GPU machine.

``scripts/gpu_detection_check.py --parts 3`` once failed before measuring anything: it executed
``benchmarks/detection.py`` without registering it in ``sys.modules``, and ``dataclass`` looks a
class's module up there. These tests import the scripts and call their loaders.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str) -> Any:
    module_name = f"_test_{name}"
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def test_detection_check_loads_the_benchmark_with_its_dataclasses() -> None:
    check = _script("gpu_detection_check")
    bench = check._load_benchmark()
    assert sys.modules["detection_bench"] is bench
    assert dataclasses.is_dataclass(bench.Case)
    names = [case.name for case in bench.cases(False, [2])]
    assert names[0] == "(a) sync" and "(b) streams" in names
    assert check._load_benchmark() is bench  # loaded once


def test_load_script_unregisters_a_module_that_fails(tmp_path: Path) -> None:
    check = _script("gpu_detection_check")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match="boom"):
        check.load_script(broken, "_broken_bench")
    assert "_broken_bench" not in sys.modules


def test_benchmark_measures_the_sync_loop_with_graphs_too() -> None:
    bench = _script("gpu_detection_check")._load_benchmark()
    table = bench.cases(True, [2])
    names = [c.name for c in table]
    assert "(a) sync graphs" in names and "(b) streams graphs" in names
    assert all(c.pipeline.cuda_graphs == c.name.endswith("graphs") for c in table)
    launched = [c for c in table if c.name.startswith("(b+c) streams launcher x2")]
    assert len(launched) == 2 and all(c.pipeline.launch_thread and c.pipeline.workers == 2 for c in launched)
    unfused = [c for c in table if c.env]  # the A/B of the fused post-processing (the default): eager only
    assert [c.name for c in unfused] == ["(a) sync, post torch", "(b) streams, post torch"]
    assert all(dict(c.env) == {"STREAMRT_FUSED_POSTPROCESS": "0"} and not c.pipeline.cuda_graphs for c in unfused)
    median = {i: 100.0 for i in range(len(table))}
    median[names.index("(a) sync graphs")] = 200.0
    median[names.index("(b) streams")] = 250.0
    median[names.index("(b) streams graphs")] = 500.0
    median[names.index("(b) streams, post torch")] = 200.0  # an A/B case is never the headline
    median[names.index("(a) sync, post torch")] = 80.0
    line, ab = bench.fair_baselines(table, median)
    assert "streams alone (no graphs on either side, best (b) streams) **2.50x**" in line
    assert "(b) streams graphs vs (a) sync graphs) **2.50x**" in line
    assert "graphs alone (sync graphs vs sync) 2.00x" in line
    assert "(a) sync 1.25x; (b) streams 1.25x" in ab, ab


def test_a_case_sets_its_environment_only_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.pipeline.config import PipelineConfig, Topology

    bench = _script("gpu_detection_check")._load_benchmark()
    monkeypatch.delenv("STREAMRT_FUSED_POSTPROCESS", raising=False)
    seen: list[str | None] = []

    def run_detection(*args: object, **kwargs: object) -> str:
        seen.append(os.environ.get("STREAMRT_FUSED_POSTPROCESS"))
        return "report"

    monkeypatch.setattr(bench, "run_detection", run_detection)
    case = bench.Case("x", PipelineConfig(topology=Topology.SYNC), env=(("STREAMRT_FUSED_POSTPROCESS", "0"),))
    frame = np.zeros((8, 8, 3), np.uint8)
    assert bench._measure(None, [frame], case, 1, 0, trace=False) == ("report", [])
    assert seen == ["0"] and "STREAMRT_FUSED_POSTPROCESS" not in os.environ


def test_video_check_loads_and_refuses_to_run_without_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = _script("gpu_video_check")
    monkeypatch.setattr(sys, "argv", ["gpu_video_check.py", str(tmp_path / "out")])
    if not check.torch.cuda.is_available():
        assert check.main() == 2
    assert check._binding.__name__ == "_binding"


def test_a_case_with_a_switch_interval_runs_under_it_and_puts_it_back(detector: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``Case.switch_ms``: the run sees that GIL switch interval, and the interpreter's own is restored after."""
    import numpy as np

    from streamrt.pipeline.config import PipelineConfig, Topology

    bench = _script("gpu_detection_check")._load_benchmark()
    seen: list[float] = []
    real = bench.run_detection

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(sys.getswitchinterval())
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "run_detection", spy)
    before = sys.getswitchinterval()
    case = bench.Case("(b) streams gil0.5", PipelineConfig(topology=Topology.STREAMS, ring_size=2), switch_ms=0.5)
    frames = [np.random.default_rng(k).integers(0, 255, (96, 128, 3), dtype=np.uint8) for k in range(2)]
    report, found = bench._measure(detector, frames, case, items=4, warmup=1, trace=False)
    assert seen == [pytest.approx(0.0005)] and sys.getswitchinterval() == before
    assert report.frames >= 4 and len(found) == 2


def _part5_on_the_cpu_stand_in(monkeypatch: pytest.MonkeyPatch) -> Any:
    """gpu_video_check with part 5's hybrid and its capacity measurement on the decoder processes' CPU stand-in."""
    from streamrt.video import hybrid, hybrid_capacity

    check = _script("gpu_video_check")
    real_hybrid, real_measure = hybrid.HybridDecode, hybrid_capacity.measure_hybrid_capacity_for_plan

    class StandIn(real_hybrid):  # type: ignore[misc, valid-type]
        def __init__(self, paths: Any, **kwargs: Any) -> None:
            super().__init__(paths, **{**kwargs, "process_kind": "cpu", "upload": False})

    monkeypatch.setattr(hybrid, "HybridDecode", StandIn)
    monkeypatch.setattr(hybrid_capacity, "measure_hybrid_capacity_for_plan",
                        lambda *a, **kw: real_measure(*a, **{**kw, "process_kind": "cpu"}))
    return check


def test_video_check_part5_gpu_branch_runs_each_start_mode_on_the_cpu_stand_in(
        clips: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Part 5's CUDA branch (the CPU smoke run takes another one: NV12 detection needs a CUDA engine) with the
    decoder processes' CPU stand-in on both sides and the detection run replaced: one run per start mode over the
    same capacity, each stream opened at its frame, a row each. (A GPU call must not die on the script itself.)"""
    from streamrt.video.report import RunReport

    check = _part5_on_the_cpu_stand_in(monkeypatch)
    firsts: list[list[int]] = []

    def paced(detector: Any, sources: list[Any], seconds: float, state: dict[str, Any], *args: Any,
              **kwargs: Any) -> tuple[RunReport, float]:
        firsts.append([s.first for s in sources])
        state.setdefault("run_gc", []).append("full collections: 0")
        report = RunReport("x", "m", "b", "cuda", len(sources), "320x180", 1, 30, 1.0,
                           latency_ms={"p99": 20.0, "max": 30.0}, per_source=[{"dropped": 0}] * len(sources))
        return report, 0.5

    monkeypatch.setattr(check, "_paced", paced)
    monkeypatch.setattr(check, "_detector", lambda state: None)
    dec = SimpleNamespace(cuda=True, quick=True, processes=1)
    saved: list[list[str]] = []
    state: dict[str, Any] = {}
    lines = check.part_hybrid(clips, 1.0, state, dec, 0.85, 3, "queue", ("lockstep", "staggered"), 1,
                              lambda: saved.append(sorted(state.get("hybrid_runs", {}))))
    rows = [line for line in lines if line.startswith("| 3 / ")]
    assert len(rows) == 2 and "| lockstep |" in rows[0] and "| staggered |" in rows[1], lines
    ran = len(firsts[0])
    assert firsts == [[0] * ran, [i * 20 // ran for i in range(ran)]]  # the smoke clips have 20 frames
    assert set(state["hybrid_runs"]) == {"lockstep", "staggered"} and state["hybrid"]["asked"] == 3
    assert state["hybrid"]["cpu_capacity"]["decoders"] == 1  # --cpu-decoders
    assert saved == [["lockstep"], ["lockstep", "staggered"]]  # saved after each run, not only at the part's end
    assert check.starts_modes("staggered, lockstep") == ("staggered", "lockstep")
    with pytest.raises(SystemExit):
        check.starts_modes("both")


def test_video_check_part5_runs_each_live_queue_depth_asked(clips: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--queue-depths 2,4`` (2026-12-06, H100: every stream dropped alike at depth 2 while the consumer process
    stalled): one run per depth over the same capacity, each run's detection given its depth, a row each."""
    from streamrt.video.report import RunReport

    check = _part5_on_the_cpu_stand_in(monkeypatch)
    depths: list[int] = []

    def paced(detector: Any, sources: list[Any], seconds: float, state: dict[str, Any], *args: Any,
              queue_depth: int = 2, **kwargs: Any) -> tuple[RunReport, float]:
        depths.append(queue_depth)
        state.setdefault("run_gc", []).append("full collections: 0")
        gaps = {"idle_share": 0.3, "over": 34.0, "over_ms": 20.0, "longest_ms": 63.0}
        return RunReport("x", "m", "b", "cuda", len(sources), "320x180", 1, 30, 1.0,
                         latency_ms={"p99": 20.0, "max": 30.0}, per_source=[{"dropped": 0}] * len(sources),
                         compute_gaps=gaps), 0.5

    monkeypatch.setattr(check, "_paced", paced)
    monkeypatch.setattr(check, "_detector", lambda state: None)
    dec = SimpleNamespace(cuda=True, quick=True, processes=1)
    state: dict[str, Any] = {}
    lines = check.part_hybrid(clips, 1.0, state, dec, 0.85, 3, "queue", ("staggered",), 1, None, None, (2, 4))
    rows = [line for line in lines if line.startswith("| 3 / ")]
    assert len(rows) == 2 and "| staggered, queue 2 |" in rows[0] and "| staggered, queue 4 |" in rows[1], lines
    assert depths == [2, 4]
    assert all("GPU compute idle 30%, 34 stretches over 20 ms (longest 63 ms)" in row for row in rows), rows
    assert {k: v["queue_depth"] for k, v in state["hybrid_runs"].items()} == {"staggered, queue 2": 2,
                                                                             "staggered, queue 4": 4}
    assert check.queue_depths("2, 4") == (2, 4)
    for bad in ("0", "two", ""):
        with pytest.raises(SystemExit):
            check.queue_depths(bad)
