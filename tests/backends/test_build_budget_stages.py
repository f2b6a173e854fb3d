"""Level 5's autotuning in two stages: a deadline inside coordinate descent keeps the autotuned first stage.

The child here is a stand-in script (the real one compiles for minutes): it follows the real child's
protocol (:mod:`streamrt.backends.torch_inductor._compile_child`: each stage's package written whole,
then a ``streamrt-stage-done`` line) and does what the test asks of each stage: finish, hang or fail.
What is checked is the parent's side: which package the build keeps, what the manifest's events and the
progress say, what the package cache keeps and how a retry with more time uses it. The real child's
staging is checked by the slow test at the end (a real CPU compile of both stages).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from streamrt.backends.torch_inductor import budget as budget_module  # noqa: E402
from streamrt.backends.torch_inductor.budget import (  # noqa: E402
    FALLBACK_TO,
    TUNED_FALLBACK_TO,
    BuildBudget,
    autotune_stages,
    fallback_configs,
)
from streamrt.backends.torch_inductor.package_cache import COMPILED, TUNED_FALLBACK, PackageCache  # noqa: E402

LEVEL5 = {"max_autotune": True, "coordinate_descent_tuning": True, "freezing": True}

STAND_IN = '''
import json, sys, time, os
job = json.load(open(sys.argv[1]))
plan = json.load(open(os.environ["STAND_IN_PLAN"]))
with open(os.environ["STAND_IN_PLAN"] + ".jobs", "a") as log:
    log.write(json.dumps([s["configs"] for s in job["stages"]]) + "\\n")
for index, stage in enumerate(job["stages"]):
    what = plan[len(plan) - len(job["stages"]) + index]
    if what == "hang":
        time.sleep(120)
    if what == "fail":
        print("RuntimeError: coordinate descent broke", flush=True)
        sys.exit(3)
    tmp = stage["out"] + ".partial"
    with open(tmp, "wb") as f:
        f.write(("STAGE-" + str(stage["configs"]["coordinate_descent_tuning"])).encode())
    os.replace(tmp, stage["out"])
    print("streamrt-stage-done", index, 0, flush=True)
json.dump({"hits": 2, "misses": 1}, open(job["stats"], "w"))
'''


class RecordingCompiler:
    """The in-process (level-3) compile: records its configs, returns a marker package."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, ep: Any, configs: Mapping[str, Any]) -> bytes:
        self.calls.append(dict(configs))
        return b"LEVEL3"


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run the stand-in child instead of the real one; ``plan(["finish", "hang"])`` says what each stage does."""
    script = tmp_path / "child.py"
    script.write_text(STAND_IN)
    plan_file = tmp_path / "plan.json"
    monkeypatch.setenv("STAND_IN_PLAN", str(plan_file))
    monkeypatch.setattr(budget_module, "python_command", lambda module, job: [sys.executable, str(script), job])

    def plan(stages: list[str]) -> Path:
        plan_file.write_text(json.dumps(stages))
        return Path(f"{plan_file}.jobs")

    return plan


@pytest.fixture
def program() -> Any:
    return torch.export.export(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),))


def test_only_a_recipe_with_autotuning_and_coordinate_descent_is_compiled_in_two_stages() -> None:
    assert autotune_stages(LEVEL5) == [{**LEVEL5, "coordinate_descent_tuning": False}, LEVEL5]
    level4 = {"max_autotune": True, "coordinate_descent_tuning": False}
    assert autotune_stages(level4) == [level4]
    descent_only = {"max_autotune": False, "coordinate_descent_tuning": True}
    assert autotune_stages(descent_only) == [descent_only]


def test_a_deadline_inside_coordinate_descent_keeps_the_first_stage_and_a_retry_starts_after_it(
        stand_in: Any, program: Any, tmp_path: Path) -> None:
    jobs = stand_in(["finish", "hang"])
    compiler, lines = RecordingCompiler(), []
    cache = PackageCache(tmp_path / "timings", {"device": "test"})
    budget = BuildBudget(4.0, lines.append, compiler, finish_reserve_s=1.0, packages=cache)
    started = time.monotonic()
    package = budget.compile(program, LEVEL5, label="profile 1/1")
    assert time.monotonic() - started < 4.0, lines
    assert package == b"STAGE-False", lines  # the first stage's package, not the level-3 one
    assert compiler.calls == [fallback_configs(LEVEL5)]  # compiled first, as before, then not kept
    event = budget.to_dict()["fell_back"][0]
    assert event["to"] == TUNED_FALLBACK_TO and event["why"].startswith("coordinate descent passed its"), event
    assert budget.outcomes == ["compiled (autotuned fallback, coordinate descent off)"] and budget.exhausted
    assert any("autotuned without coordinate descent in 0 s" in line for line in lines), lines
    assert any("keeping the package autotuned without coordinate descent" in line for line in lines), lines
    assert cache.find(program, autotune_stages(LEVEL5)[0], None) == (b"STAGE-False", COMPILED)
    assert cache.find(program, LEVEL5, 4.0) == (b"STAGE-False", TUNED_FALLBACK)
    assert cache.find(program, LEVEL5, 60.0) is None  # more time: autotune again

    # The retry with more time: no level-3 compile, the child compiles only the second stage, which finishes.
    stand_in(["finish", "finish"])
    compiler, lines = RecordingCompiler(), []
    retry = BuildBudget(60.0, lines.append, compiler, finish_reserve_s=1.0, packages=cache)
    assert retry.compile(program, LEVEL5, label="profile 1/1") == b"STAGE-True"
    assert compiler.calls == [] and not retry.events and retry.outcomes == [COMPILED]
    assert [len(json.loads(job)) for job in jobs.read_text().splitlines()] == [2, 1]
    assert any("without coordinate descent reused from the package cache" in line for line in lines), lines
    assert (retry.hits, retry.misses) == (2, 1)
    assert cache.find(program, LEVEL5, None) == (b"STAGE-True", COMPILED)


def test_a_retry_with_the_same_budget_reuses_the_tuned_fallback_and_says_what_it_is(
        stand_in: Any, program: Any, tmp_path: Path) -> None:
    stand_in(["finish", "hang"])
    cache = PackageCache(tmp_path / "timings", {"device": "test"})
    BuildBudget(3.0, print, RecordingCompiler(), finish_reserve_s=1.0, packages=cache).compile(
        program, LEVEL5, label="p")
    lines: list[str] = []
    again = BuildBudget(3.0, lines.append, RecordingCompiler(), finish_reserve_s=1.0, packages=cache)
    assert again.compile(program, LEVEL5, label="p") == b"STAGE-False" and again.child_compiles == 0
    assert again.outcomes == ["reused (autotuned fallback, coordinate descent off)"]
    assert again.events[0]["to"] == TUNED_FALLBACK_TO  # the plan is not what level 5 asks: not plan-cached


def test_a_retry_whose_coordinate_descent_runs_out_again_keeps_the_cached_first_stage(
        stand_in: Any, program: Any, tmp_path: Path) -> None:
    jobs = stand_in(["finish", "hang"])
    cache = PackageCache(tmp_path / "timings", {"device": "test"})
    BuildBudget(3.0, print, RecordingCompiler(), finish_reserve_s=1.0, packages=cache).compile(
        program, LEVEL5, label="p")
    compiler = RecordingCompiler()
    retry = BuildBudget(4.0, print, compiler, finish_reserve_s=1.0, packages=cache)  # more time, still too little
    assert retry.compile(program, LEVEL5, label="p") == b"STAGE-False" and compiler.calls == []
    assert [len(json.loads(job)) for job in jobs.read_text().splitlines()] == [2, 1]
    assert retry.events[0]["to"] == TUNED_FALLBACK_TO
    assert retry.events[0]["why"].startswith("coordinate descent passed its"), retry.events


def test_a_failed_coordinate_descent_keeps_the_first_stage_instead_of_failing_the_build(
        stand_in: Any, program: Any, caplog: pytest.LogCaptureFixture) -> None:
    stand_in(["finish", "fail"])
    budget = BuildBudget(60.0, print, RecordingCompiler(), finish_reserve_s=1.0)
    with caplog.at_level("WARNING", logger="streamrt.backends.torch_inductor.budget"):
        assert budget.compile(program, LEVEL5, label="p") == b"STAGE-False"
    assert "coordinate descent broke" in caplog.text
    assert budget.events[0]["why"] == "the compile with coordinate descent failed (exit 3)"


def test_a_first_stage_that_does_not_finish_keeps_the_level_3_plan(stand_in: Any, program: Any) -> None:
    stand_in(["hang", "finish"])
    budget = BuildBudget(3.0, print, RecordingCompiler(), finish_reserve_s=1.0)
    assert budget.compile(program, LEVEL5, label="p") == b"LEVEL3"
    assert budget.events[0]["to"] == FALLBACK_TO and budget.events[0]["why"].startswith("autotuning passed")
    assert budget.compile(program, LEVEL5, label="q", optional=True) is None  # the budget is spent


@pytest.mark.slow
def test_the_real_child_writes_each_stage_whole_before_it_says_so(tmp_path: Path) -> None:
    # The real child on the CPU: stage 1 (freezing only: a plain compile) finishes; stage 2 (max_autotune:
    # Inductor's C++ GEMM templates, minutes on the CPU) is killed as soon as stage 1's line arrives, as a
    # deadline would. The first stage's package is whole when its line is read, loads and computes the module.
    from torch._inductor import aoti_load_package

    from streamrt.backends.torch_inductor.budget import PHASES, STAGE_DONE
    from streamrt.backends.torch_inductor.deadline import child_env, kill_group, python_command, run_with_deadline

    ep = torch.export.export(torch.nn.Linear(16, 4).eval(), (torch.randn(2, 16),))
    torch.export.save(ep, str(tmp_path / "program.pt2"))
    stages = [{"max_autotune": False, "freezing": True}, {"max_autotune": True, "freezing": True}]
    outs = [tmp_path / "out-0.pt2", tmp_path / "out-1.pt2"]
    job = {"program": str(tmp_path / "program.pt2"), "stats": str(tmp_path / "stats.json"), "tf32": False,
           "cudnn_benchmark": False,
           "stages": [{"configs": c, "out": str(o)} for c, o in zip(stages, outs, strict=True)]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    child: list[Any] = []
    whole_at_line: list[bool] = []
    phases: list[str] = []

    def line(text: str) -> None:
        if text.startswith(PHASES):
            phases.append(text)
        if text.startswith(f"{STAGE_DONE} 0 "):
            whole_at_line.append(outs[0].is_file())
            kill_group(child[0])

    done = run_with_deadline(python_command(budget_module.CHILD_MODULE, str(tmp_path / "job.json")), 300.0,
                             env=child_env(), on_line=line, on_start=child.append)
    assert whole_at_line == [True], done.tail
    assert len(phases) == 1 and " s, " in phases[0] and "compile" in phases[0], phases  # where stage 1's time went
    assert not outs[1].exists() and not (tmp_path / "stats.json").exists()
    runner = aoti_load_package(str(outs[0]))
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), ep.module()(x), rtol=1e-4, atol=1e-4)


def test_a_rebuild_whose_full_recipe_runs_out_says_autotuning_and_compiles_level_3(
        stand_in: Any, tmp_path: Path) -> None:
    """A structure tuned to the end before compiles the full recipe alone in its child: a deadline there is the
    recipe's autotuning (no first stage ran), and the level-3 recipe kept in reserve is compiled after it."""
    def net(seed: int) -> Any:
        torch.manual_seed(seed)
        return torch.export.export(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),))

    cache = PackageCache(tmp_path / "timings", {"device": "test"})
    stand_in(["finish", "finish"])
    BuildBudget(30.0, print, RecordingCompiler(), finish_reserve_s=1.0, packages=cache).compile(
        net(0), LEVEL5, label="p")
    jobs = stand_in(["hang"])
    compiler = RecordingCompiler()
    rebuild = BuildBudget(4.0, print, compiler, finish_reserve_s=0.5, packages=cache)
    assert rebuild.compile(net(1), LEVEL5, label="p") == b"LEVEL3"
    assert [len(json.loads(job)) for job in jobs.read_text().splitlines()][-1] == 1  # the full recipe alone
    assert compiler.calls == [fallback_configs(LEVEL5)]
    assert rebuild.events[0]["to"] == FALLBACK_TO and rebuild.events[0]["why"].startswith("autotuning passed its")


def test_compile_phases_name_torchs_timers_longest_first() -> None:
    from streamrt.backends.torch_inductor._compile_child import compile_phases

    torch._dynamo.utils.compile_times(repr="csv")  # whatever ran before in this process is fine: only the form
    with torch._dynamo.utils.dynamo_timed("streamrt_test_phase"):
        pass
    text = compile_phases(shown=50)
    pairs = [part.rsplit(" ", 2) for part in text.split(", ")]
    assert any(name == "streamrt_test_phase" for name, _, _ in pairs), text
    seconds = [float(s) for _, s, unit in pairs if unit == "s"]
    assert seconds == sorted(seconds, reverse=True) and len(seconds) == len(pairs), text


def test_both_stages_finishing_say_the_first_stage_once(stand_in: Any, program: Any) -> None:
    """The stage-done line of the last stage is not the first stage's "coordinate descent next" (it said so twice in
    the H100 run of 2026-12-06, eighth session)."""
    stand_in(["finish", "finish"])
    lines: list[str] = []
    BuildBudget(30.0, lines.append, RecordingCompiler(), finish_reserve_s=1.0).compile(program, LEVEL5, label="p")
    assert sum("autotuned without coordinate descent in" in line for line in lines) == 1, lines
    assert any("autotuned in" in line and "timing-cache hits" in line for line in lines), lines
