"""The package cache in the ``--timing-cache`` directory, without compiling: keys, reuse rules, bad entries.

Real exported programs (torch.export is fast), marker packages from a recording compiler in place of
AOTInductor; tests/backends/test_optimization_builds.py reuses real packages in CPU builds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from streamrt.backends.torch_inductor.budget import BuildBudget, fallback_configs  # noqa: E402
from streamrt.backends.torch_inductor.package_cache import (  # noqa: E402
    COMPILED,
    FALLBACK,
    PACKAGES_DIR,
    PackageCache,
    program_digest,
)

IDENTITY = {"device": "avx2", "torch": "2.13.0", "cuda": "None"}
TUNED = {"max_autotune": True, "coordinate_descent_tuning": False, "freezing": False}


def _export(seed: int = 0, batch: int = 2) -> Any:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    return torch.export.export(net, (torch.randn(batch, 8),))


class RecordingCompiler:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, ep: Any, configs: Mapping[str, Any]) -> bytes:
        self.calls.append(dict(configs))
        return b"PK-" + str(len(self.calls)).encode()


class InstantChildBudget(BuildBudget):
    """A budget whose autotuning child always finishes at once with a marker package."""

    def _in_child(self, ep: Any, stages: list[dict[str, Any]], label: str,
                  ends_at: float) -> tuple[bytes, str, int]:
        self.child_compiles += 1
        return b"TUNED", "", len(stages)


def test_the_key_follows_the_program_weights_shapes_configs_and_identity(tmp_path: Path) -> None:
    assert program_digest(_export()) == program_digest(_export())  # two exports of the same module
    assert program_digest(_export(seed=1)) != program_digest(_export())  # other weights
    assert program_digest(_export(batch=3)) != program_digest(_export())  # another static shape
    ep = _export()
    cache = PackageCache(tmp_path, IDENTITY)
    key = cache.key(ep, {"max_autotune": False})
    assert key == PackageCache(tmp_path, IDENTITY).key(_export(), {"max_autotune": False})
    assert key != cache.key(ep, {"max_autotune": True})
    assert key != PackageCache(tmp_path, {**IDENTITY, "device": "NVIDIA H200"}).key(ep, {"max_autotune": False})
    assert key != PackageCache(tmp_path, IDENTITY, {"tf32": True}).key(ep, {"max_autotune": False})


def test_a_second_budgeted_compile_reuses_the_package_and_a_fallback_only_under_no_larger_budget(
        tmp_path: Path) -> None:
    ep, lines = _export(), []
    compiler = RecordingCompiler()
    # Spent at once: the level-3 compile is kept as the fallback of the autotuned compile, under a 1e-6 s budget.
    first = BuildBudget(1e-6, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))
    assert first.compile(ep, TUNED, label="p1") == b"PK-1" and first.outcomes == ["compiled (level-3 fallback)"]
    entries = sorted(p.name for p in (tmp_path / PACKAGES_DIR).iterdir())
    assert len(entries) == 4 and not [n for n in entries if n.endswith(".partial")]  # two keys: tuned and level 3

    same = BuildBudget(1e-6, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))
    assert same.compile(ep, TUNED, label="p1") == b"PK-1" and same.outcomes == ["reused (level-3 fallback)"]
    assert len(compiler.calls) == 1 and any("package reused (level-3 fallback)" in line for line in lines)
    assert same.events and same.events[0]["to"].startswith("level-3 recipe")  # the manifest's fell_back says so

    more = InstantChildBudget(300.0, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))
    assert more.compile(ep, TUNED, label="p1") == b"TUNED" and more.outcomes == ["compiled"]
    assert len(compiler.calls) == 1 and more.child_compiles == 1  # the level-3 package came from the cache
    assert "p1: level-3 recipe reused from the package cache (not compiled again)" in lines

    again = InstantChildBudget(300.0, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))
    assert again.compile(ep, TUNED, label="p1") == b"TUNED" and again.outcomes == ["reused"]
    assert again.child_compiles == 0 and len(compiler.calls) == 1
    assert not again.events  # a fully autotuned package: nothing fell back

    other = BuildBudget(1e-6, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))
    assert other.compile(_export(seed=3), TUNED, label="p1") == b"PK-2"  # other weights: compiled
    assert compiler.calls[-1] == fallback_configs(TUNED)


def test_a_corrupt_or_foreign_entry_is_ignored_with_one_warning_and_the_build_compiles(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ep, compiler = _export(), RecordingCompiler()
    plain = {"max_autotune": False}
    cache = PackageCache(tmp_path, IDENTITY)
    cache.keep(ep, plain, b"GOOD-PACKAGE", COMPILED)
    key = cache.key(ep, plain)
    assert cache.find(ep, plain, None) == (b"GOOD-PACKAGE", COMPILED)
    (tmp_path / PACKAGES_DIR / f"{key}.pt2").write_bytes(b"GOOD-PACK")  # truncated
    with caplog.at_level("WARNING", logger="streamrt.backends.torch_inductor.package_cache"):
        budget = BuildBudget(None, print, compiler, packages=PackageCache(tmp_path, IDENTITY))
        assert budget.compile(ep, plain, label="p") == b"PK-1" and budget.outcomes == ["compiled"]
        record = tmp_path / PACKAGES_DIR / f"{key}.json"
        entry = json.loads(record.read_text())
        assert entry["sha256"] and entry["kind"] == COMPILED  # the compile replaced the bad entry
        record.write_text(json.dumps({**entry, "identity": {**IDENTITY, "device": "NVIDIA A100"}}))
        foreign = PackageCache(tmp_path, IDENTITY)
        assert foreign.find(ep, plain, None) is None and foreign.find(ep, plain, None) is None
        record.write_text("{not json")
        assert PackageCache(tmp_path, IDENTITY).find(ep, plain, None) is None
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith("package_cache")]
    assert len(warnings) == 3, warnings  # one per build (cache), not one per lookup
    assert "sha256 does not match" in warnings[0] and "NVIDIA A100" in warnings[1] and "unreadable" in warnings[2]


def test_a_fallback_entry_is_not_reused_by_a_build_without_a_budget(tmp_path: Path) -> None:
    ep = _export()
    cache = PackageCache(tmp_path, IDENTITY)
    cache.keep(ep, TUNED, b"LEVEL3", FALLBACK, 300.0)
    assert cache.find(ep, TUNED, 300.0) == (b"LEVEL3", FALLBACK) and cache.find(ep, TUNED, 120.0) is not None
    assert cache.find(ep, TUNED, 301.0) is None and cache.find(ep, TUNED, None) is None


def test_the_plans_package_line_names_the_kind_of_fallback_it_reused() -> None:
    """A warm rebuild of a plan whose first build kept the autotuned fallback reports that, not level 3
    (the H100 run of 2026-12-06 said "reused (level-3 fallback)" for an autotuned package)."""
    from streamrt.backends.torch_inductor.budget import REUSED, REUSED_FALLBACK, REUSED_TUNED_FALLBACK
    from streamrt.backends.torch_inductor.cache import TimingCacheStats

    def package(*kinds: str) -> str:
        return TimingCacheStats("cache", packages=list(kinds)).package

    assert package(REUSED_TUNED_FALLBACK) == "reused (autotuned fallback, coordinate descent off)"
    assert package(REUSED_FALLBACK, REUSED_FALLBACK) == "reused (level-3 fallback)"
    assert package(REUSED, REUSED) == "reused"
    assert package(REUSED, REUSED_FALLBACK) == "reused (mixed: as asked; level-3 fallback)"
    assert package(REUSED, "compiled") == "reused 1 of 2" and package("compiled") == "compiled"
    assert package() == ""


class TimedChildBudget(BuildBudget):
    """A budget whose child finishes (or not, ``finishes=False``) at once, recording its deadline."""

    finishes = True

    def _in_child(self, ep: Any, stages: list[dict[str, Any]], label: str,
                  ends_at: float) -> tuple[bytes | None, str, int]:
        self.child_compiles += 1
        self.deadline_s = ends_at - self.started
        if not self.finishes:
            return None, "autotuning passed its deadline", 0
        return b"TUNED", "", len(stages)


def test_the_structure_digest_ignores_the_weights_values_only() -> None:
    from streamrt.backends.torch_inductor.package_cache import structure_digest

    assert structure_digest(_export(seed=1)) == structure_digest(_export())  # retrained: same kernels
    assert structure_digest(_export(batch=3)) != structure_digest(_export())  # another static shape


def test_a_rebuild_with_new_weights_autotunes_first_and_compiles_level_3_only_if_that_does_not_finish(
        tmp_path: Path) -> None:
    """The retrained model's rebuild (2026-12-05, H100: ResNet-50 96 s, 38 of them the level-3 compile made first
    although the timing cache answered every choice) skips the level-3 compile when its autotuning finishes."""
    compiler, lines = RecordingCompiler(), []

    def budget(**kwargs: Any) -> TimedChildBudget:
        return TimedChildBudget(300.0, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY), **kwargs)

    first = budget()
    assert first.compile(_export(), TUNED, label="p1") == b"TUNED" and len(compiler.calls) == 1  # level 3 first
    assert PackageCache(tmp_path, IDENTITY).autotuned_before(_export(seed=5), TUNED) is not None
    PackageCache(tmp_path, IDENTITY).note_autotuned(_export(), TUNED, 40.0)  # as if its level-3 compile took 40 s

    retrained = budget()
    assert retrained.compile(_export(seed=1), TUNED, label="p1") == b"TUNED"
    assert len(compiler.calls) == 1 and retrained.outcomes == ["compiled"] and not retrained.events
    assert retrained.deadline_s == pytest.approx(300.0 - retrained.finish_reserve_s - 1.5 * 40.0)
    assert any("autotuning first from the timing cache, 60 s kept for the level-3 recipe" in line for line in lines)

    stuck = budget()
    stuck.finishes = False
    assert stuck.compile(_export(seed=2), TUNED, label="p1") == b"PK-2"  # the level-3 recipe, compiled after
    assert compiler.calls[-1] == fallback_configs(TUNED) and stuck.outcomes == ["compiled (level-3 fallback)"]
    assert stuck.events[0]["to"].startswith("level-3 recipe") and "deadline" in stuck.events[0]["why"]

    other = budget()  # another shape, or another device: the level-3 recipe first, as before
    assert other.compile(_export(batch=3), TUNED, label="p1") == b"TUNED" and len(compiler.calls) == 3
    assert PackageCache(tmp_path, {**IDENTITY, "device": "NVIDIA H200"}).autotuned_before(_export(), TUNED) is None


class FirstStageChildBudget(TimedChildBudget):
    """A two-stage child that finishes its first stage (autotuned without coordinate descent) and runs out of time
    in coordinate descent, as ResNet-50's did at a 200 s budget on an H100 on 2026-12-06."""

    def _in_child(self, ep: Any, stages: list[dict[str, Any]], label: str,
                  ends_at: float) -> tuple[bytes | None, str, int]:
        self.child_compiles += 1
        self.deadline_s = ends_at - self.started
        self.stages_asked = [dict(stage) for stage in stages]
        return b"FIRST-STAGE", "coordinate descent passed its deadline", 1


def test_a_rebuild_with_new_weights_autotunes_first_where_only_the_first_stage_finished_before(
        tmp_path: Path) -> None:
    """2026-12-06, H100: level 5 at 200 s kept ResNet-50's first stage (coordinate descent did not finish), so no
    structure was recorded and the rebuild with new weights compiled level 3 first again (64 s of a 120 s
    deadline). The first stage's finish now records the structure for that stage: the rebuild autotunes first."""
    compiler, lines = RecordingCompiler(), []
    level5 = {**TUNED, "coordinate_descent_tuning": True}
    first_stage = {**level5, "coordinate_descent_tuning": False}

    def budget() -> FirstStageChildBudget:
        return FirstStageChildBudget(200.0, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))

    first = budget()
    assert first.compile(_export(), level5, label="p1") == b"FIRST-STAGE"
    assert compiler.calls == [fallback_configs(level5)]  # level 3 first, then the child
    assert first.outcomes == ["compiled (autotuned fallback, coordinate descent off)"]
    cache = PackageCache(tmp_path, IDENTITY)
    assert cache.autotuned_before(_export(seed=3), level5) is None  # not to the end
    assert cache.autotuned_before(_export(seed=3), first_stage) is not None

    retrained = budget()
    assert retrained.compile(_export(seed=1), level5, label="p1") == b"FIRST-STAGE"
    assert len(compiler.calls) == 1, compiler.calls  # no level-3 compile this time
    assert retrained.stages_asked == [first_stage, level5]  # both stages, the first from the timing cache
    level3_s = cache.autotuned_before(_export(), first_stage)
    assert level3_s is not None
    assert retrained.deadline_s == pytest.approx(200.0 - retrained.finish_reserve_s - 1.5 * level3_s)
    assert any("autotuned without coordinate descent before (other weights allowed): autotuning first" in line
               for line in lines), lines


class StagesChildBudget(TimedChildBudget):
    """A child that finishes every stage it is asked for, recording them."""

    def _in_child(self, ep: Any, stages: list[dict[str, Any]], label: str,
                  ends_at: float) -> tuple[bytes | None, str, int]:
        self.stages_asked = [dict(stage) for stage in stages]
        return super()._in_child(ep, stages, label, ends_at)


def test_a_rebuild_of_a_structure_tuned_to_the_end_compiles_the_full_recipe_alone(tmp_path: Path) -> None:
    """2026-12-06, H100: the rebuild of ResNet-50 with new weights took 73.6 s, 49 of them the first stage (the
    program compiled without coordinate descent) although the timing cache held every choice of the full recipe:
    a structure tuned to the end before skips the first stage."""
    compiler, lines = RecordingCompiler(), []
    level5 = {**TUNED, "coordinate_descent_tuning": True}
    first_stage = {**level5, "coordinate_descent_tuning": False}

    def budget() -> StagesChildBudget:
        return StagesChildBudget(200.0, lines.append, compiler, packages=PackageCache(tmp_path, IDENTITY))

    first = budget()
    assert first.compile(_export(), level5, label="p1") == b"TUNED"
    assert first.stages_asked == [first_stage, level5]  # a first build: both stages, level 3 before them

    retrained = budget()
    assert retrained.compile(_export(seed=1), level5, label="p1") == b"TUNED"
    assert retrained.stages_asked == [level5] and len(compiler.calls) == 1  # no level 3, no first stage
    assert any("the full recipe alone, no first stage" in line for line in lines), lines
