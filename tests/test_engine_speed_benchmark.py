"""``benchmarks/engine_speed.py`` on the CPU: every variant in a child with a deadline, the table always written.

The smoke run (CI) times eager in a child, kills a plan build at a 2 s deadline ("did not finish"),
and merges two calls' JSONL files into one table; SIGTERM mid-build still leaves the table.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "engine_speed.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def _command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out), "--runs", "5", *extra]


def _run(out: Path, *extra: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    done = subprocess.run(_command(out, *extra), capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "# Engine speed" in done.stdout
    return _module().read_jsonl(out / "engine-speed.jsonl")


def _module() -> Any:
    if "_engine_speed" in sys.modules:
        return sys.modules["_engine_speed"]
    spec = importlib.util.spec_from_file_location("_engine_speed", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_engine_speed"] = module
    spec.loader.exec_module(module)
    return module


def test_smoke_eager_times_a_build_past_its_deadline_is_reported_and_two_calls_merge(tmp_path: Path) -> None:
    started = time.monotonic()
    meta, rows = _run(tmp_path / "a", "--baselines", "eager", "--levels", "0", "--deadlines", "L0=2")
    by_variant = {r["variant"]: r for r in rows}
    assert set(by_variant) == {"eager", "L0"}
    eager, plan = by_variant["eager"], by_variant["L0"]
    assert eager["status"] == "ok" and eager["ms"] > 0 and eager["images_per_s"] > 0
    assert eager["rel_l2"] < 1e-6 and "roofline" not in eager  # eager fp32 against itself; no CPU peak
    assert plan["status"] == "did not finish" and "ms" not in plan
    assert plan["notes"].startswith("did not finish in 2 s") and 1.9 < plan["elapsed_s"] < 30
    assert meta["header"][1].startswith("- commit: ") and "--deadlines L0=2" in meta["header"][3]
    text = (tmp_path / "a" / "engine-speed.md").read_text()
    assert "| fp32 | 1 | L0 | did not finish |" in text and "| fp32 | 1 | eager | ok | no |" in text

    _run(tmp_path / "b", "--baselines", "eager", "--levels", "", "--batches", "2")
    module = _module()
    merged = tmp_path / "merged"
    parts = [str(tmp_path / side / "engine-speed.jsonl") for side in ("a", "b")]
    assert module.main(["--merge", *parts, "--out", str(merged)]) == 0
    text = (merged / "engine-speed.md").read_text()
    assert "--deadlines L0=2" in text and "--batches 2" in text  # both calls' headers
    assert "- merged from 2 calls" in text and "spent 0 s" not in text  # no budget line summed from the headers
    assert "| fp32 | 1 | L0 | did not finish |" in text and "| fp32 | 2 | eager | ok |" in text
    assert "| fp32 | 1 | eager | ok | no |" in text and text.count("1.00 |") >= 2  # x eager of each batch
    assert len(_module().read_jsonl(merged / "engine-speed.jsonl")[1]) == 3
    assert time.monotonic() - started < 300


def test_sigterm_kills_the_running_child_and_still_writes_the_table(tmp_path: Path) -> None:
    proc = subprocess.Popen(_command(tmp_path, "--baselines", "eager", "--levels", "3"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:  # eager's row, then the plan build starts: interrupt that
        if line.startswith("# tiny fp32 b1 L3"):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 143, rest[-2000:]
    _, rows = _module().read_jsonl(tmp_path / "engine-speed.jsonl")
    assert [r["status"] for r in rows] == ["ok", "interrupted"]
    assert "| fp32 | 1 | L3 | interrupted |" in (tmp_path / "engine-speed.md").read_text()
    assert "# Engine speed" in rest


def test_budget_skips_variants_that_would_not_fit(tmp_path: Path) -> None:
    _, rows = _run(tmp_path, "--budget", "0")
    assert {r["variant"] for r in rows} == {"eager", "compile", "L0", "L3"}
    assert all(r["status"] == "skipped" and r["notes"].startswith("skipped: budget") for r in rows)


@pytest.mark.slow
def test_quick_cpu_run_builds_times_and_writes_the_table(tmp_path: Path) -> None:
    _, rows = _run(tmp_path, "--runs", "3", "--warmup", "1")
    by_variant = {r["variant"]: r for r in rows}
    assert set(by_variant) == {"eager", "compile", "L0", "L3"}
    for variant, row in by_variant.items():
        assert row["status"] == "ok" and row["ms"] > 0 and row["images_per_s"] > 0, variant
        assert row["rel_l2"] < 1e-4, variant  # fp32 on the CPU against eager fp32
    for variant in ("compile", "L0", "L3"):
        assert by_variant[variant]["build_s"] > 0
    for variant in ("L0", "L3"):  # the plans' shape verification, a part of their build time, reported apart
        verify_s = by_variant[variant]["verify_s"]
        assert 0 < verify_s < by_variant[variant]["build_s"], by_variant[variant]
        assert f"verification {verify_s:.1f} s" in by_variant[variant]["notes"]
    assert "| fp32 | 1 | L3 | ok |" in (tmp_path / "engine-speed.md").read_text()


@pytest.mark.slow
def test_fresh_first_call_times_a_new_process_loading_each_plan(tmp_path: Path) -> None:
    _, rows = _run(tmp_path, "--groups", "tiny@1=L3", "--fresh-first-call", "--runs", "3", "--warmup", "1",
                   "--keep-scratch")
    (row,) = rows
    fresh = row["fresh"]
    assert row["status"] == "ok" and "error" not in fresh, row
    assert fresh["load_s"] > 0 and fresh["first_call_s"] > 0 and fresh["second_call_ms"] > 0
    assert f"fresh process: load {fresh['load_s']:.1f} s, first call {fresh['first_call_s']:.1f} s" in row["notes"]
    # --phases takes the first call apart: runner load, first plain call (profiler table), graph call
    plans = sorted(tmp_path.rglob("*.plan"))
    assert plans, "--keep-scratch kept no plan"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_call.py"), str(plans[0]), "--shape",
                           "input:1x3x48x48", "--phases", "--profile-top", "5"], capture_output=True, text=True,
                          timeout=300, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = json.loads(done.stdout.strip().splitlines()[-1])
    assert parts["runner_load_s"] >= 0 and parts["first_plain_s"] > 0 and parts["second_plain_ms"] > 0
    assert "Self CPU" in done.stderr  # the profiler's table


def test_first_call_says_what_failed_when_the_plan_cannot_load(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from first_call import measure_in_fresh_process
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    (tmp_path / "broken.plan").write_bytes(b"not a plan")
    got = measure_in_fresh_process(tmp_path / "broken.plan", {"input": [1, 3, 8, 8]}, timeout_s=120)
    assert set(got) == {"error"} and got["error"].startswith("exit "), got


def test_one_batch_runs_whole_before_the_next_cheap_variants_first() -> None:
    module = _module()
    tasks = module.tasks_in_order(["resnet50"], ["fp16"], [32, 1], ["eager", "compile", "max-autotune", "L0", "L3",
                                                                    "L5"])
    order = [(t.batch, t.variant) for t in tasks]
    assert order[:6] == [(32, "eager"), (32, "L0"), (32, "L3"), (32, "compile"), (32, "L5"), (32, "max-autotune")]
    assert order[6:] == [(1, v) for _, v in order[:6]]
    assert module.PAIRS["L5"] == "max-autotune" and module.PAIRS["L3"] == "compile"


def test_ratios_pair_each_level_with_its_torch_compile_partner() -> None:
    rows = [{"model": "m", "precision": "fp16", "batch": 32, "variant": v, "ms": ms}
            for v, ms in (("eager", 4.0), ("compile", 2.0), ("max-autotune", 1.6), ("L3", 2.5), ("L5", 1.6))]
    rows.append({"model": "m", "precision": "fp16", "batch": 32, "variant": "L0", "status": "did not finish"})
    _module().add_ratios(rows)
    by_variant = {r["variant"]: r for r in rows}
    assert by_variant["L3"]["x_pair"] == pytest.approx(0.8) and by_variant["L3"]["x_eager"] == pytest.approx(1.6)
    assert by_variant["L5"]["x_pair"] == pytest.approx(1.0)
    assert "x_pair" not in by_variant["L0"] and "x_pair" not in by_variant["eager"]


def test_groups_run_in_the_order_written_on_two_lanes_and_a_rebuild_waits_for_its_build(tmp_path: Path) -> None:
    # The H200 command's path (--groups, --lanes 2, L5 then L5r on lane 1, the GPU gate) with the tiny model:
    # level 5 and its rebuild are killed at their 3 s deadlines, eager is timed on the other lane meanwhile.
    meta, rows = _run(tmp_path, "--groups", "tiny@1=L5,L5r,eager;tiny@2=eager", "--lanes", "2",
                      "--deadlines", "L5=3,L5r=3")
    by_key = {(r["batch"], r["variant"]): r for r in rows}
    assert set(by_key) == {(1, "L5"), (1, "L5r"), (1, "eager"), (2, "eager")}
    assert by_key[(1, "L5")]["status"] == by_key[(1, "L5r")]["status"] == "did not finish"
    assert by_key[(1, "L5")]["lane"] == by_key[(1, "L5r")]["lane"] == 1  # autotuning variants: lane 1
    assert [r["variant"] for r in rows if r["variant"].startswith("L")] == ["L5", "L5r"]
    assert by_key[(1, "eager")]["status"] == by_key[(2, "eager")]["status"] == "ok"
    assert by_key[(1, "eager")]["lane"] == 2  # the other lane took the first unpinned task at once
    assert meta["lanes"] == 2
    assert "- lanes: 2 children built at a time" in (tmp_path / "engine-speed.md").read_text()


def test_lanes_take_their_pinned_work_first_and_a_rebuild_after_its_build() -> None:
    module = _module()
    tasks = module.pin_lanes(module.tasks_of_groups([("m", [32], ["eager", "L5", "L5r", "max-autotune", "L3"]),
                                                     ("n", [1], ["L3/2"])], ["fp16"]), 2, {"max-autotune": 2})
    assert [(t.variant, t.lane) for t in tasks] == [("eager", None), ("L5", 1), ("L5r", 1), ("max-autotune", 2),
                                                    ("L3", None), ("L3", 2)]
    tasks = tasks[:-1]
    from speed_lanes import next_task

    first, _ = next_task(tasks, 1, set())
    other, _ = next_task(tasks, 2, set())
    assert (first.variant, other.variant) == ("L5", "max-autotune")
    waiting = [t for t in tasks if t.variant in ("L5r", "L3")]
    assert next_task(waiting, 1, set())[0].variant == "L3"  # L5r waits for L5
    assert next_task(waiting, 1, {tasks[1].key})[0].variant == "L5r"
    assert next_task(waiting[:1], 2, set()) == (None, False)  # another lane's work: nothing left for lane 2
    assert not module.is_rebuild("eager") and module.is_rebuild("L5r")


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_the_gpu_gate_stops_the_other_lanes_whole_process_tree_while_one_times(tmp_path: Path) -> None:
    _module()  # puts benchmarks/ on sys.path
    from speed_lanes import GpuGate

    grandchild = "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    other = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; {grandchild}; time.sleep(60)"],
                             start_new_session=True)
    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(1.0)
        from speed_lanes import descendants

        tree = descendants(other.pid)
        assert len(tree) == 2
        gate = GpuGate()
        gate.started(1, me)
        gate.started(2, other)
        gate.acquire(1, tmp_path / "go")
        assert (tmp_path / "go").is_file() and {_state(pid) for pid in tree} == {"T"} and _state(me.pid) != "T"
        gate.finished(1)  # the timing child exited holding the gate: the others go on
        assert "T" not in {_state(pid) for pid in tree} and gate.pauses == 1
        gate.acquire(1, tmp_path / "late")  # a child that died waiting never takes the gate
        assert not (tmp_path / "late").exists()
    finally:
        for proc in (other, me):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL) if proc is other else proc.kill()
            proc.wait()


def test_cudnn_epilogue_variants_parse_pair_and_report_their_cpu_refusal(tmp_path: Path) -> None:
    module = _module()
    import speed_variants as variants

    assert [variants.level_of(v) for v in ("L5c", "L5s", "L3c", "L5cr", "L5x")] == [5, 5, 3, 5, None]
    assert [variants.epilogues_of(v) for v in ("L5", "L5i", "L5c", "L5s")] == [None, "inductor", "cudnn",
                                                                              "cudnn_spatial"]
    assert variants.level_of("L5ir") == 5 and variants.base_variant("L5inr") == "L5r"
    assert variants.base_variant("L5cr") == "L5r" and variants.base_variant("eager") == "eager"
    assert [variants.level_of(v) for v in ("L5cn", "L5cb", "L5cnr", "L5nc")] == [5, 5, 5, None]
    assert [variants.benchmark_of(v) for v in ("L5c", "L5cn", "L5cb", "eager")] == [None, False, True, None]
    assert variants.base_variant("L5cnr") == "L5r"
    options = variants.plan_config("fp16", 3, "cuda", None, "cudnn").backend_options
    assert options == {"device": "cuda", "conv_epilogues": "cudnn", "freezing": True}  # BN folded below level 5
    # A plain level is the level as `streamrt build` makes it: no epilogue option at all (level 5's own default).
    assert variants.plan_config("fp16", 5, "cuda", None, None).backend_options == {"device": "cuda"}
    assert variants.plan_config("fp16", 5, "cuda", None, "inductor").backend_options == {
        "device": "cuda", "conv_epilogues": "inductor"}
    rows = [{"model": "m", "precision": "fp16", "batch": 32, "variant": v, "ms": ms}
            for v, ms in (("eager", 4.0), ("max-autotune", 2.0), ("L5c", 1.6))]
    module.add_ratios(rows)
    assert rows[-1]["x_pair"] == pytest.approx(1.25)
    # On the CPU the option is refused; the row says why and the table is still written.
    _, got = _run(tmp_path, "--groups", "tiny@1=L3c", "--deadlines", "L3c=120")
    assert len(got) == 1 and got[0]["variant"] == "L3c" and got[0]["status"] != "ok"
    assert "needs a CUDA build" in json.dumps(got[0])


def test_rebuilds_reuse_the_package_and_with_new_weights_compile_again_from_the_timing_cache(tmp_path: Path) -> None:
    """``L3r`` takes the first build's package from the package cache (the 3.1 s level-5 rebuild of 2026-12-05
    compiled nothing); ``L3w`` (new weights, as after retraining) misses it and compiles, and its error is
    measured against its own weights' fp32 reference."""
    module = _module()  # puts benchmarks/ on the path
    import speed_variants as variants

    assert [variants.level_of(v) for v in ("L5w", "L5cw", "L5cnw", "L5wr")] == [5, 5, 5, None]
    assert variants.base_variant("L5cw") == "L5w" and variants.PAIRS["L5w"] == "max-autotune"
    assert module.default_for(module.DEADLINES_S, "L3r", 1.0) == module.DEADLINES_S["L3"]
    assert module.is_rebuild("L5w") and module.Task("m", "fp16", 1, "L5cw").waits_for() == ("m", "fp16", 1, "L5c")
    _, rows = _run(tmp_path, "--groups", "tiny@1=L3,L3r,L3w", "--runs", "3", "--warmup", "1")
    by_variant = {r["variant"]: r for r in rows}
    assert all(by_variant[v]["status"] == "ok" for v in ("L3", "L3r", "L3w")), rows
    assert by_variant["L3r"]["timing_cache"]["package"] == "reused", by_variant["L3r"]
    assert by_variant["L3w"]["timing_cache"]["package"] == "compiled", by_variant["L3w"]
    assert by_variant["L3w"]["rel_l2"] < 1e-3, by_variant["L3w"]  # fp32 on the CPU: its own weights' reference


def test_a_first_builds_deadline_under_its_build_budget_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    """2026-12-06, H100: a 170 s deadline under a 200 s build budget killed level 5 before the budget could bound it,
    and the row read "did not finish"; a rebuild (L5w, L5r) may have a shorter deadline on purpose."""
    bench = _module()
    assert bench.short_deadlines({"L5": 170.0, "L5w": 100.0, "L3": 60.0, "max-autotune": 100.0}, 200.0) == [
        "L5's deadline 170 s is under its 200 s build budget + 30 s: the benchmark may kill the build before the "
        "budget bounds it (give --deadlines L5=230 or a smaller --build-budget-s)"]
    assert bench.short_deadlines({"L5c": 240.0}, 200.0) == [] and bench.short_deadlines({"L4": 10.0}, 0.0) == []
    assert len(bench.short_deadlines({"L4": 300.0}, None)) == 1  # BuildConfig's default budget, 300 s
    bench.parse_args(["--out", "x", "--groups", "resnet50@32=L5,L5w", "--build-budget-s", "200",
                      "--deadlines", "L5=170,L5w=100"])
    assert "warning: L5's deadline 170 s" in capsys.readouterr().err
