"""The build budget: autotuning compiles end on time or fall back to the level-3 recipe; bounded knobs; GPU int8.

The level-3 recipe is compiled first and the autotuning child gets what is left of the budget; a
test with a fake 4.5 s level-3 compile and the real child checks that the whole compile ends
within the budget (plus the kill) with the level-3 plan. The slow test builds a real level-4 CPU
plan with a budget smaller than its level-3 compile: no child is started, a warning says so, the
manifest and progress record it, and the plan still computes the module (fresh random data, 1e-4).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from streamrt.cli.args import BuildArgs
from streamrt.config import BuildConfig, CalibrationConfig
from streamrt.errors import ConfigError

torch = pytest.importorskip("torch")

from streamrt.backends.torch_inductor.budget import BuildBudget, fallback_configs, tunes  # noqa: E402
from streamrt.backends.torch_inductor.levels import BOUNDED_AUTOTUNE, inductor_knows, resolve_recipe  # noqa: E402
from streamrt.backends.torch_inductor.target import refuse_gpu_int8  # noqa: E402


class RecordingCompiler:
    """A compile function that records the configs it was given and returns a marker package."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, ep: Any, configs: Mapping[str, Any]) -> bytes:
        self.calls.append(dict(configs))
        return b"PK-" + str(len(self.calls)).encode()


def test_build_budget_s_defaults_to_300_and_is_checked() -> None:
    assert BuildConfig().build_budget_s == 300.0 and BuildConfig(build_budget_s=None).build_budget_s is None
    for bad in (0, -1, True, "300"):
        with pytest.raises(ConfigError, match="build_budget_s must be a number of seconds > 0"):
            BuildConfig(build_budget_s=bad)
    parser = argparse.ArgumentParser()
    BuildArgs().add_to(parser)
    assert BuildArgs().config(parser.parse_args(["--build-budget-s", "120"])).build_budget_s == 120.0
    assert BuildArgs().config(parser.parse_args(["--build-budget-s", "0"])).build_budget_s is None
    assert BuildArgs().config(parser.parse_args([])).build_budget_s == 300.0
    assert BuildConfig(build_budget_s=120).cache_key_dict()["build_budget_s"] == 120.0


def test_a_spent_budget_compiles_required_work_without_autotuning_and_skips_optional_work() -> None:
    compiler = RecordingCompiler()
    lines: list[str] = []
    budget = BuildBudget(1e-6, lines.append, compiler)  # spent before it starts: no child is started
    configs = {"max_autotune": True, "coordinate_descent_tuning": True, "freezing": True, "layout_optimization": False}
    assert budget.compile(None, configs, label="profile 1/2") == b"PK-1"
    assert compiler.calls == [{**configs, "max_autotune": False, "coordinate_descent_tuning": False}]
    assert budget.compile(None, configs, label="profile 1 contiguous", optional=True) is None
    assert budget.compile(None, configs, label="profile 2/2") == b"PK-2" and len(compiler.calls) == 2
    assert budget.child_compiles == 0 and budget.exhausted
    fell = budget.to_dict()["fell_back"]
    assert [e["what"] for e in fell] == ["profile 1/2", "profile 1 contiguous", "profile 2/2"]
    assert fell[1]["to"] == "skipped" and fell[0]["to"].startswith("level-3 recipe")
    assert any("compiling with the level-3 recipe (no autotuning) instead" in line for line in lines)


class SlowCompiler(RecordingCompiler):
    """A :class:`RecordingCompiler` that takes ``seconds`` per compile, as a real level-3 compile takes its time."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(self, ep: Any, configs: Mapping[str, Any]) -> bytes:
        time.sleep(self.seconds)
        return super().__call__(ep, configs)


def test_a_budget_too_small_for_autotuning_bounds_the_whole_build_and_keeps_the_level_3_plan() -> None:
    # The level-3 compile (faked: 4.5 s) comes first; the real autotuning child gets the 1.5 s left
    # after the 1 s finish reserve and cannot finish (it imports torch and runs g++), so it is killed
    # and nothing more is compiled, by 6 s: the reserve is left for the rest of the build.
    # Before the fix the child ran to its deadline first and the fallback came after it: ~9.4 s.
    ep = torch.export.export(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),))
    compiler = SlowCompiler(4.5)
    lines: list[str] = []
    configs = {"max_autotune": True, "coordinate_descent_tuning": False, "freezing": False}
    started = time.monotonic()
    budget = BuildBudget(7.0, lines.append, compiler, finish_reserve_s=1.0)
    package = budget.compile(ep, configs, label="profile 1/1")
    took = time.monotonic() - started
    assert took < 7.0 - 1.0 + 0.5, (took, lines)  # 0.5 s: the kill and reaping the child
    assert package == b"PK-1" and compiler.calls == [fallback_configs(configs)]  # the plan is the level-3 one
    assert budget.exhausted and budget.child_compiles == 1
    record = budget.to_dict()
    assert [e["what"] for e in record["fell_back"]] == ["profile 1/1"] and record["fallback_s"] >= 4.5
    assert record["fell_back"][0]["to"].startswith("level-3 recipe") and "deadline" in record["fell_back"][0]["why"]
    assert lines[0].startswith("profile 1/1: compiling the level-3 recipe first"), lines
    assert any(line.startswith("build budget 7 s: autotuning passed its") and "no further compile" in line
               for line in lines), lines


class InstantChildBudget(BuildBudget):
    """A budget whose autotuning child always finishes at once, recording the deadline it was given."""

    deadlines: list[float]

    def _in_child(self, ep: Any, stages: list[dict[str, Any]], label: str,
                  ends_at: float) -> tuple[bytes, str, int]:
        self.deadlines.append(ends_at - self.started)
        return b"TUNED", "", len(stages)


def test_an_autotuned_compile_that_ends_in_time_is_kept_and_later_profiles_keep_their_level_3_time() -> None:
    compiler = RecordingCompiler()
    budget = InstantChildBudget(300.0, print, compiler)
    budget.deadlines = deadlines = []
    configs = {"max_autotune": True}
    assert budget.compile(None, configs, label="profile 1/2", later=1) == b"TUNED"
    assert budget.compile(None, configs, label="profile 2/2") == b"TUNED"
    assert compiler.calls == [fallback_configs(configs)] * 2 and not budget.events and not budget.exhausted
    reserve = budget.finish_reserve_s  # kept after the deadline for packaging, verifying and writing the plan
    assert reserve == 5.0
    # what the build spent before each deadline was set (microseconds; more on a loaded machine: 0.3 ms in CI)
    assert deadlines[0] == pytest.approx(300.0 - budget.fallback_each_s - reserve, abs=0.05)
    assert deadlines[1] == pytest.approx(300.0 - reserve, abs=0.05)
    assert budget.compile(None, {**configs, "layout_optimization": False}, label="p2 contiguous",
                          optional=True) == b"TUNED"
    assert len(compiler.calls) == 2  # an optional compile gets no level-3 package first


def test_a_level_3_compile_longer_than_the_budget_warns_and_keeps_it_without_autotuning(
        caplog: pytest.LogCaptureFixture) -> None:
    compiler = SlowCompiler(0.05)
    lines: list[str] = []
    budget = BuildBudget(0.01, lines.append, compiler)
    with caplog.at_level("WARNING", logger="streamrt.backends.torch_inductor.budget"):
        assert budget.compile(None, {"max_autotune": True}, label="profile 1/1") == b"PK-1"
    assert budget.child_compiles == 0 and budget.exhausted and len(compiler.calls) == 1
    assert "cannot bound this build" in caplog.text
    assert "level-3 compile alone took" in budget.events[0]["why"]


def test_compiles_without_autotuning_or_without_a_budget_run_here_unchanged() -> None:
    compiler = RecordingCompiler()
    plain = {"max_autotune": False, "freezing": True}
    assert BuildBudget(1e-6, print, compiler).compile(None, plain, label="p") == b"PK-1"
    tuned = {"max_autotune": True}
    assert BuildBudget(None, print, compiler).compile(None, tuned, label="p") == b"PK-2"
    assert compiler.calls == [plain, tuned]
    assert tunes({"coordinate_descent_tuning": True}) and not tunes(plain)
    assert fallback_configs(tuned) == {"max_autotune": False, "coordinate_descent_tuning": False}


def test_levels_4_and_5_on_cuda_prune_choices_that_cannot_fit_shared_memory() -> None:
    assert inductor_knows("max_autotune_prune_choices_based_on_shared_mem")
    assert inductor_knows("triton.autotune_pointwise") and not inductor_knows("triton.no_such_knob")
    for level in (4, 5):
        knobs = resolve_recipe(BuildConfig(backend="torch_inductor", optimization_level=level), "cuda").inductor
        assert knobs["max_autotune_prune_choices_based_on_shared_mem"] is True, level
        assert knobs["max_autotune_gemm_search_space"] == "DEFAULT"
    for level, kind in ((3, "cuda"), (5, "cpu")):
        knobs = resolve_recipe(BuildConfig(backend="torch_inductor", optimization_level=level), kind).inductor
        assert not set(BOUNDED_AUTOTUNE) & set(knobs), (level, kind)


def test_int8_is_refused_for_cuda_with_what_to_use_instead(tmp_path: Path) -> None:
    config = BuildConfig(backend="torch_inductor", precision="int8", calibration=CalibrationConfig(tmp_path))
    with pytest.raises(ConfigError, match="no int8 GPU kernels") as info:
        refuse_gpu_int8(config, "cuda")
    assert "--precision fp16" in str(info.value.hint) and "--backend onnxruntime" in str(info.value.hint)
    assert "--backend tensorrt" in str(info.value.hint)
    refuse_gpu_int8(config, "cpu")  # the CPU's float int8 preview stays
    refuse_gpu_int8(BuildConfig(backend="torch_inductor", precision="fp16"), "cuda")


@pytest.mark.gpu
def test_int8_torch_inductor_build_on_a_gpu_is_refused_before_calibration(tmp_path: Path) -> None:
    import streamrt
    from helpers import catalogue_file

    config = BuildConfig(backend="torch_inductor", precision="int8", calibration=CalibrationConfig(tmp_path),
                         backend_options={"device": "cuda"})
    with pytest.raises(ConfigError, match="no int8 GPU kernels"):
        streamrt.build(catalogue_file("conv_bn_relu", tmp_path), config, tmp_path / "m.plan", cache=False)


@pytest.mark.slow
def test_a_level_4_build_whose_level_3_compile_exceeds_the_budget_keeps_it_and_still_computes_the_module(
        tmp_path: Path) -> None:
    from streamrt import load
    from streamrt.building.module_builder import build_module

    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    # 1 s: less than any real AOTInductor compile (g++ alone takes longer), so the path is the same on every machine.
    config = BuildConfig(backend="torch_inductor", optimization_level=4, build_budget_s=1.0,
                         timing_cache=tmp_path / "timings", backend_options={"device": "cpu"})
    lines: list[str] = []
    built = build_module(net, [torch.randn(4, 64)], tmp_path / "m.plan", config, progress=lines.append,
                         cache_dir=tmp_path / "c")
    budget = built.manifest.build_settings["backend"]["build_budget"]
    assert budget["seconds"] == 1.0 and budget["child_compiles"] == 0 and budget["fallback_s"] > 1.0
    assert [e["what"] for e in budget["fell_back"]] == ["profile 1/1"]
    assert "level-3 compile alone took" in budget["fell_back"][0]["why"]
    assert any(line.startswith("build budget 1 s: the level-3 compile alone took") for line in lines), lines
    x = torch.randn(4, 64)
    with load(built.path) as engine, engine.create_context() as ctx:
        got = ctx.infer({"input_0": x})["output_0"]
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(got), net(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_budget_bounds_the_whole_build_and_a_retry_with_more_time_reuses_the_level_3_package(
        tmp_path: Path) -> None:
    # The first build (1 s) keeps its level-3 compile; the second (10 s) finds that package in the timing
    # cache, so nothing is compiled before its autotuning child, which gets 10 s less what was spent and the
    # 5 s finish reserve, cannot finish (it imports torch, then runs g++) and is killed: the whole
    # build_module call (export, child, packaging, verification, the plan's write) ends within 10 s.
    # The third (10 s again) reuses that fallback at once.
    from streamrt import load
    from streamrt.building.module_builder import build_module

    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    config = BuildConfig(backend="torch_inductor", optimization_level=4, build_budget_s=1.0,
                         timing_cache=tmp_path / "timings", backend_options={"device": "cpu"})

    def build(seconds: float, name: str) -> tuple[Any, float, list[str]]:
        lines: list[str] = []
        started = time.monotonic()
        built = build_module(net, [torch.randn(4, 64)], tmp_path / name, config.replace(build_budget_s=seconds),
                             progress=lines.append, cache_dir=tmp_path / "c")
        return built, time.monotonic() - started, lines

    build(1.0, "first.plan")
    second, took, lines = build(10.0, "second.plan")
    backend = second.manifest.build_settings["backend"]
    assert took <= 10.0, (took, lines)
    assert backend["build_budget"]["child_compiles"] == 1 and backend["build_budget"]["fell_back"], lines
    assert "profile 1/1: level-3 recipe reused from the package cache (not compiled again)" in lines
    assert backend["timing_cache"]["package"] == "compiled" and backend["timing_cache"]["packages"] == [
        "compiled (level-3 fallback)"]
    third, quick, lines = build(10.0, "third.plan")
    assert third.manifest.build_settings["backend"]["timing_cache"]["package"] == "reused (level-3 fallback)"
    reused = third.manifest.build_settings["backend"]["build_budget"]
    assert quick < took and reused["child_compiles"] == 0
    assert "reused the level-3 fallback" in reused["fell_back"][0]["why"]  # not a complete plan: not plan-cached
    x = torch.randn(4, 64)
    with load(third.path) as engine, engine.create_context() as ctx:
        got = ctx.infer({"input_0": x})["output_0"]
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(got), net(x), rtol=1e-4, atol=1e-4)
