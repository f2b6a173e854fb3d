"""The build budget (``--build-budget-s``): a build that ends within it, autotuned when the time allows.

Inductor's max-autotune cannot be stopped from inside the process once it runs, and on the H200
a level-5 ResNet-50 build autotuned convolutions for more than 9 minutes without finishing. So
each compile whose recipe autotunes (``max_autotune`` or ``coordinate_descent_tuning``: levels
4-5) goes in two steps:

1. The **level-3 recipe** (the same Inductor configs with ``max_autotune`` and
   ``coordinate_descent_tuning`` off) is compiled first, in this process: the fast, safe plan.
2. The autotuned compile runs in a child process (:mod:`._compile_child`, started through
   :mod:`.deadline`) on the exported program saved to a temporary file, with a deadline of what
   is left of the budget (less, for a build with several profiles, the level-3 compile time of
   the profiles still to come). If it finishes, its package is kept; if not, its process group is
   killed and the level-3 package already built is kept, with **no further compile**.
3. A recipe with coordinate descent (level 5) is compiled by the child in **two stages**: first
   without coordinate descent (GEMMs autotuned: what torch.compile's max-autotune does), its
   package written as soon as it is done, then the whole recipe, whose GEMM timings the first
   stage left in the timing cache. A deadline (or a failure) inside the second stage keeps the
   first stage's autotuned package instead of the level-3 one. Why: on the H200 on 2026-12-05
   ViT-tiny's level-5 child had timed all 6 of its GEMM shapes and then ran ~120 s into coordinate
   descent without finishing, so the build kept its level-3 plan, while torch.compile max-autotune
   built the same model in 46 s. The cost is the second stage's lowering and wrapper compile
   (tens of seconds where the whole recipe finishes); a first stage found in the package cache
   (a retry with a larger budget) is not compiled again and replaces the level-3 compile too.

Why first and not after the deadline (the earlier order): the fallback's own compile then came
after the budget was spent (on the H200 on 2026-12-02 it started at 211 s of 300 s and had not
finished at 300 s), so the budget did not bound the build. Why in sequence and not side by side:
Inductor's autotuning times kernels on the device, and a concurrent compile (its compile workers
on the CPU, Triton's pointwise autotuning on the GPU) would skew those timings, which the timing
cache then keeps; in sequence each gets the machine to itself and the level-3 time is measured
before the autotuning deadline is set. The cost: autotuning gets the budget minus the level-3
compile (about 226 s of 300 s for ResNet-50 on the H200, whose level-3 compile took 74 s).

A **rebuild with new weights** (a retrained model: the package misses, the timing cache has every choice) compiled
the level-3 recipe first all the same: 38 of ResNet-50's 96 s on an H100 on 2026-12-05. So a program whose
*structure* (weights aside) was autotuned to the end before (:meth:`.PackageCache.autotuned_before`) is autotuned
first, alone on the machine as before, and the level-3 compile is made only if that does not finish, in time kept
for it: :data:`WARM_LEVEL3_MARGIN` times the level-3 time that build recorded. A build whose first stage finished
and whose coordinate descent ran out of budget records its structure too (for that stage): ResNet-50 at 200 s on an
H100 on 2026-12-06 did, and its rebuild with new weights, lacking the record, compiled level 3 first again (64 s).
A structure autotuned *to the end* before compiles the full recipe alone in its child: the first stage (without
coordinate descent) is a fallback the rebuild does not need when every choice is timed, and it was 49 of that
rebuild's 70 s of compiling (H100, 2026-12-06; the rebuild then took 60.4 s).

Once a child has been killed (or the budget is spent) the rest of the build compiles with the
level-3 recipe only, and an optional compile (level 5's second memory-format candidate) is
skipped. If the level-3 compile alone takes longer than the budget, a warning says that the
budget cannot bound this build and the plan is the level-3 one: a budget never fails a build.
The progress lines and the manifest (``build_settings.backend.build_budget``) say what fell back,
when, to what and why.

What a killed child had already timed stays in the timing cache (Inductor writes each operator's
autotuning result as it is measured), so the next build with the same ``--timing-cache`` starts
further on. The child counts its timing-cache hits and misses and reports them here; each miss as it happens,
with what the cache lacked (:func:`~.cache._why_missed`).

The budget bounds the whole build, not only the compiles: it starts when the build starts (the
caller's ``started``) and the autotuning deadline keeps :data:`FINISH_RESERVE_S` for what follows a
killed child (packaging, the plan's verification and its write). Before that reserve a build on the
H200 ended 2.7 s past its 300 s budget.

With ``--timing-cache`` the compiled packages are kept there too (:mod:`.package_cache`): a compile
whose program and configs were compiled before is copied, the level-3 compile made first included
(so a retry with a larger budget gives all of it to autotuning), and a level-3 fallback stands in
for its autotuned compile in a build whose budget is not larger than the one that fell back.

A build without autotuning, or with ``build_budget_s=None``, compiles in this process as before.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt.backends.torch_inductor.deadline import child_env, python_command, run_with_deadline
from streamrt.backends.torch_inductor.heartbeat import with_heartbeat
from streamrt.backends.torch_inductor.package_cache import COMPILED, FALLBACK, TUNED_FALLBACK, PackageCache
from streamrt.errors import BuildError

__all__ = ["BuildBudget", "autotune_stages", "fallback_configs", "tunes"]

log = logging.getLogger(__name__)

CHILD_MODULE = "streamrt.backends.torch_inductor._compile_child"
HEARTBEAT_S = 15.0
FALLBACK_TO = "level-3 recipe (max_autotune and coordinate_descent_tuning off)"
TUNED_FALLBACK_TO = "autotuned recipe without coordinate descent (the child's first stage)"
STAGE_DONE = "streamrt-stage-done"
"""The line the compile child prints when a stage's package is written (then its index and seconds)."""
MISSED = "streamrt-timing-miss"
"""The compile child's line for each timing-cache miss, as it happens (then what the cache lacked)."""
PHASES = "streamrt-compile-phases"
"""The compile child's line after each stage: where its compile spent its time (:func:`compile_phases`)."""
_TUNING_KNOBS = ("max_autotune", "coordinate_descent_tuning")
REUSED = "reused"
REUSED_FALLBACK = "reused (level-3 fallback)"
REUSED_TUNED_FALLBACK = "reused (autotuned fallback, coordinate descent off)"
_REUSED_AS = {COMPILED: REUSED, FALLBACK: REUSED_FALLBACK, TUNED_FALLBACK: REUSED_TUNED_FALLBACK}
_COMPILED_AS = {COMPILED: COMPILED, FALLBACK: "compiled (level-3 fallback)",
                TUNED_FALLBACK: "compiled (autotuned fallback, coordinate descent off)"}
"""Each package kind as the timing cache's report names it (``BuildBudget.outcomes``)."""
WARM_LEVEL3_MARGIN = 1.5
"""An autotuned-first compile (its structure autotuned before) keeps this many times the recorded level-3 compile
time after its deadline, for the level-3 compile should it not finish."""
FINISH_RESERVE_S = 5.0
"""What the build does after a killed child: reap it, pack the payload, write the manifest, verify the
plan (load its package, run it at the profile's corners against the module) and write it. On the H200
(2026-12-02, ResNet-50 fp16 batch 32) that took the build 2.7 s past a 300 s budget whose child was
killed exactly at the budget; 5 s keeps it inside with room for a larger package."""


def tunes(configs: Mapping[str, Any]) -> bool:
    """Whether a compile with these Inductor configs autotunes (and so runs under the budget)."""
    return any(bool(configs.get(k)) for k in _TUNING_KNOBS)


def fallback_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """The level-3 recipe of ``configs``: autotuning off, everything else (layout, freezing, metadata) kept."""
    return {**configs, **{k: False for k in _TUNING_KNOBS}}


def autotune_stages(configs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The compiles of an autotuning child, in order, the last one being ``configs``: with both GEMM
    autotuning and coordinate descent on, the same recipe without coordinate descent comes first."""
    if configs.get("max_autotune") and configs.get("coordinate_descent_tuning"):
        return [{**configs, "coordinate_descent_tuning": False}, dict(configs)]
    return [dict(configs)]


@dataclass
class BuildBudget:
    """Seconds one build may take, and which of its compiles kept their autotuning.

    Example:
        >>> budget = BuildBudget(300.0, progress=print, compile_here=compile_package)   # doctest: +SKIP
        >>> package = budget.compile(ep, configs, label="profile 1/1")                   # doctest: +SKIP
    """

    seconds: float | None
    progress: Callable[[str], None]
    compile_here: Callable[[Any, Mapping[str, Any]], bytes]
    tf32: bool = False
    cudnn_benchmark: bool = False
    started: float = field(default_factory=time.monotonic)
    hits: int = 0
    misses: int = 0
    exhausted: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    child_compiles: int = 0
    fallback_s: float = 0.0
    """Seconds spent on the level-3 compiles made first (kept or not)."""
    fallback_each_s: float = 0.0
    """The longest of those compiles: what each profile still to come is expected to need."""
    finish_reserve_s: float = FINISH_RESERVE_S
    """Seconds kept after the autotuning deadline for the rest of the build (see :data:`FINISH_RESERVE_S`)."""
    packages: PackageCache | None = None
    outcomes: list[str] = field(default_factory=list)
    """Per package of the plan: compiled, reused, ... (:meth:`compile`); the timing cache's report shows them."""
    _level3_took: float | None = field(default=None, repr=False)
    """The current compile's level-3 compile time, when it compiled one (recorded with a finished autotuning)."""
    _whole_recipe: bool = field(default=False, repr=False)
    """The current compile's child runs the full recipe alone (its structure tuned to the end before): a deadline
    there is the recipe's autotuning, not coordinate descent after a first stage."""

    @property
    def spent_s(self) -> float:
        return time.monotonic() - self.started

    def to_dict(self) -> dict[str, Any]:
        """What the manifest records (``build_settings.backend.build_budget``)."""
        return {"seconds": self.seconds, "spent_s": round(self.spent_s, 1), "fallback_s": round(self.fallback_s, 1),
                "child_compiles": self.child_compiles, "finish_reserve_s": self.finish_reserve_s,
                "fell_back": list(self.events)}

    def compile(self, ep: Any, configs: Mapping[str, Any], *, label: str, optional: bool = False,
                later: int = 0) -> bytes | None:
        """One ``.pt2``: autotuned if that finishes within the budget, else the level-3 one compiled first.

        ``later`` is how many required compiles of this build come after this one (later shape
        profiles): the autotuning deadline leaves each of them the level-3 compile time measured
        here. An ``optional`` compile gets no level-3 package first and returns ``None`` (it is
        skipped) when its autotuning does not finish or the budget is spent. With a package cache
        (``packages``, the ``--timing-cache`` directory) a package made before for the same
        program and configs is copied instead (:mod:`.package_cache`), and what is compiled is kept.
        """
        if self.packages is not None:
            found = self.packages.find(ep, configs, self.seconds)
            if found is not None:
                outcome = _REUSED_AS[found[1]]
                self.progress(f"{label}: package {outcome} from the package cache {self.packages.root} "
                              "(same program, configs and device; nothing compiled)")
                if found[1] != COMPILED:  # not the plan asked for: the manifest says so, the plan cache skips it
                    tuned = found[1] == TUNED_FALLBACK
                    self._event(label, TUNED_FALLBACK_TO if tuned else FALLBACK_TO,
                                f"reused the {'autotuned' if tuned else 'level-3'} fallback an earlier build kept "
                                "when its autotuning did not finish within a budget not smaller than this one")
                self.outcomes.append(outcome)
                return found[0]
        package, kind = self._compile(ep, configs, label, optional, later)
        if package is not None:
            self.outcomes.append(_COMPILED_AS[kind])
            if self.packages is not None:
                self.packages.keep(ep, configs, package, kind, self.seconds)
        return package

    def _compile(self, ep: Any, configs: Mapping[str, Any], label: str, optional: bool,
                 later: int) -> tuple[bytes | None, str]:
        """:meth:`compile` without the package cache: the package and what it is (``kind``: :data:`COMPILED`,
        :data:`FALLBACK` or :data:`TUNED_FALLBACK`)."""
        if self.seconds is None or not tunes(configs):
            return self.compile_here(ep, configs), COMPILED
        if self.exhausted:
            if optional:
                self.progress(f"build budget: {label} skipped (the {self.seconds:g} s budget is spent)")
                self._event(label, "skipped")
                return None, FALLBACK
            return self._fallback(ep, configs, label, "the budget was already spent"), FALLBACK
        stages = autotune_stages(configs)
        self._level3_took, self._whole_recipe = None, False
        warm = None  # autotuned first: the level-3 compile's time (kept in reserve), when this structure was tuned
        fallback, kind = self._cached_first_stage(ep, stages, label), TUNED_FALLBACK
        if fallback is not None:
            stages = stages[1:]
        elif not optional and (before := self._autotuned_before(ep, configs, stages, label)) is not None:
            kind = FALLBACK  # compiled after the child, only if the child does not finish
            warm, to_the_end = before
            if to_the_end:  # every choice is in the timing cache: the full recipe alone (a first stage would compile
                stages = stages[-1:]  # the program once more: 49 of ResNet-50's 70 s on an H100, 2026-12-06)
                self._whole_recipe = True
        else:
            fallback, kind = (None if optional else self._fallback_first(ep, configs, label)), FALLBACK
            if self.exhausted:  # the level-3 compile alone used the budget up
                return fallback, FALLBACK
        reserve = 0.0 if warm is None else WARM_LEVEL3_MARGIN * warm
        ends_at = self.started + self.seconds - later * self.fallback_each_s - self.finish_reserve_s - reserve
        package, why, finished = self._in_child(ep, stages, label, ends_at)
        level3_s = self._level3_took if self._level3_took is not None else warm  # measured here, or recorded
        if package is not None and finished == len(stages):
            if self.packages is not None and level3_s is not None:
                self.packages.note_autotuned(ep, configs, level3_s)
            return package, COMPILED
        if package is not None:  # the first stage finished, coordinate descent did not
            fallback, kind = package, TUNED_FALLBACK
            if self.packages is not None:
                self.packages.keep(ep, stages[0], package, COMPILED)
                if level3_s is not None:  # a rebuild with new weights autotunes this stage first
                    self.packages.note_autotuned(ep, stages[0], level3_s)
        self.exhausted = True
        if kind == TUNED_FALLBACK:
            self._event(label, TUNED_FALLBACK_TO, why)
            self.progress(f"build budget {self.seconds:g} s: {why} ({self.spent_s:.0f} s spent); {label}: keeping "
                          "the package autotuned without coordinate descent, no further compile")
            return fallback, TUNED_FALLBACK
        if optional:
            self._event(label, "skipped", why)
            self.progress(f"build budget {self.seconds:g} s: {why} ({self.spent_s:.0f} s spent); {label} skipped")
            return None, FALLBACK
        if fallback is None:  # autotuned first: the level-3 recipe now, in the time kept for it
            return self._fallback(ep, configs, label, why), FALLBACK
        self._event(label, FALLBACK_TO, why)
        self.progress(f"build budget {self.seconds:g} s: {why} ({self.spent_s:.0f} s spent); {label}: keeping the "
                      "level-3 recipe compiled first (no autotuning), no further compile")
        return fallback, FALLBACK

    def _autotuned_before(self, ep: Any, configs: Mapping[str, Any], stages: list[dict[str, Any]],
                          label: str) -> tuple[float, bool] | None:
        """The level-3 compile time recorded when an earlier build autotuned this program's structure to the end,
        or finished its first stage (autotuned without coordinate descent, kept when coordinate descent ran out of
        budget: ResNet-50 at 200 s on an H100 on 2026-12-06), and whether it was to the end; the package cache's
        record, whose choices are in the timing cache. ``None`` if neither. With one, the autotuned compile runs
        first and that time (x :data:`WARM_LEVEL3_MARGIN`) is kept after its deadline."""
        if self.packages is None:
            return None
        what, level3 = "to the end", self.packages.autotuned_before(ep, configs)
        to_the_end = level3 is not None
        if level3 is None and len(stages) > 1:
            what, level3 = "without coordinate descent", self.packages.autotuned_before(ep, stages[0])
        if level3 is None:
            return None
        self.fallback_each_s = max(self.fallback_each_s, level3)  # what later profiles are still expected to need
        self.progress(f"{label}: this program's structure was autotuned {what} before (other weights allowed): "
                      f"autotuning first from the timing cache, {WARM_LEVEL3_MARGIN * level3:.0f} s kept for the "
                      "level-3 recipe should it not finish" + ("; the full recipe alone, no first stage" if to_the_end
                                                                 and len(stages) > 1 else ""))
        return level3, to_the_end

    def _cached_first_stage(self, ep: Any, stages: list[dict[str, Any]], label: str) -> bytes | None:
        """A two-stage compile's first stage, finished by an earlier build, from the package cache; else ``None``.

        It stands in for the level-3 compile (a better plan to fall back to) and the child starts at
        the second stage."""
        if len(stages) < 2 or self.packages is None:
            return None
        found = self.packages.find(ep, stages[0], self.seconds)
        if found is None or found[1] != COMPILED:
            return None
        self.progress(f"{label}: the autotuned compile without coordinate descent reused from the package cache "
                      "(kept if coordinate descent does not finish; no level-3 compile needed)")
        return found[0]

    def _event(self, label: str, to: str, why: str | None = None) -> None:
        event = {"what": label, "to": to, "after_s": round(self.spent_s, 1)}
        self.events.append({**event, "why": why} if why else event)

    def _fallback_first(self, ep: Any, configs: Mapping[str, Any], label: str) -> bytes:
        """Compile the level-3 recipe here and time it; past the budget, warn and mark the budget spent.

        A level-3 package in the package cache is taken instead: nothing is spent, and the
        autotuning deadline gets the whole budget.
        """
        cached = self._cached_level3(ep, configs, label)
        if cached is not None:
            return cached
        self.progress(f"{label}: compiling the level-3 recipe first (no autotuning): the plan kept if autotuning "
                      f"does not finish within the {self.seconds:g} s budget")
        started = time.monotonic()
        package = self._level3(ep, configs, label)
        took = time.monotonic() - started
        self.fallback_s += took
        self.fallback_each_s = max(self.fallback_each_s, took)
        self.progress(f"{label}: level-3 recipe compiled in {took:.0f} s")
        self._level3_took = took
        assert self.seconds is not None
        if self.spent_s >= self.seconds - self.finish_reserve_s:
            self.exhausted = True
            why = (f"the level-3 compile alone took {took:.1f} s ({self.spent_s:.1f} s spent) "
                   f"of the {self.seconds:g} s budget ({self.finish_reserve_s:g} s of it kept to finish the build)")
            log.warning("build budget %g s cannot bound this build: %s; %s keeps the level-3 recipe, no autotuning "
                        "(raise --build-budget-s, or build at --optimization-level 3)", self.seconds, why, label)
            self.progress(f"build budget {self.seconds:g} s: {why}; {label}: keeping it, no autotuning")
            self._event(label, FALLBACK_TO, why)
        return package

    def _fallback(self, ep: Any, configs: Mapping[str, Any], label: str, why: str) -> bytes:
        self.progress(f"build budget {self.seconds:g} s: {why} ({self.spent_s:.0f} s spent); {label}: compiling "
                      "with the level-3 recipe (no autotuning) instead")
        self._event(label, FALLBACK_TO, why)
        return self._cached_level3(ep, configs, label) or self._level3(ep, configs, label)

    def _cached_level3(self, ep: Any, configs: Mapping[str, Any], label: str) -> bytes | None:
        """The level-3 package of ``configs`` an earlier build compiled first, from the package cache; else ``None``."""
        found = self.packages.find(ep, fallback_configs(configs), self.seconds) if self.packages is not None else None
        if found is None:
            return None
        self.progress(f"{label}: level-3 recipe reused from the package cache (not compiled again)")
        return found[0]

    def _level3(self, ep: Any, configs: Mapping[str, Any], label: str) -> bytes:
        """The level-3 recipe of ``configs``, compiled here behind a heartbeat (it is silent for a minute or more)."""
        plain = fallback_configs(configs)
        package = with_heartbeat(lambda: self.compile_here(ep, plain), self.progress, f"{label}: level-3 recipe")
        if self.packages is not None:
            self.packages.keep(ep, plain, package, COMPILED)
        return package

    def _in_child(self, ep: Any, stages: list[dict[str, Any]], label: str,
                  ends_at: float) -> tuple[bytes | None, str, int]:
        """Compile ``stages`` in order in a child that must end by ``ends_at`` (monotonic).

        Returns the package of the last stage that finished (``None`` when none did), why the child
        stopped short of the last one (``""`` when it did not), and how many stages finished.
        """
        import torch

        with tempfile.TemporaryDirectory(prefix="streamrt-budget-") as tmp:
            folder = Path(tmp)
            try:
                torch.export.save(ep, str(folder / "program.pt2"))
            except Exception as exc:  # autotuning cannot run where it can be stopped: the level-3 plan it is
                log.warning("build budget: %s not autotuned, the exported program could not be saved for the "
                            "compile process (%s: %s)", label, type(exc).__name__, exc)
                return None, (f"torch.export.save failed ({type(exc).__name__}), so autotuning could not run in "
                              "a child"), 0
            deadline = ends_at - time.monotonic()  # the save above is inside the budget too
            if deadline <= 0:
                return None, "no time left for autotuning after the level-3 compile", 0
            outs = [folder / f"out-{i}.pt2" for i in range(len(stages))]
            job = {"program": str(folder / "program.pt2"), "stats": str(folder / "stats.json"), "tf32": self.tf32,
                   "cudnn_benchmark": self.cudnn_benchmark,
                   "stages": [{"configs": dict(c), "out": str(o)} for c, o in zip(stages, outs, strict=True)]}
            (folder / "job.json").write_text(json.dumps(job))
            tuned = [0]

            def line(text: str) -> None:
                if "AUTOTUNE " in text:
                    tuned[0] += 1
                if text.startswith(MISSED):
                    self.progress(f"{label}: timing cache miss: {text[len(MISSED):].strip()}")
                if text.startswith(PHASES):
                    self.progress(f"{label}: compile phases: {text[len(PHASES):].strip()}")
                if text.startswith(STAGE_DONE) and len(stages) > 1 and text.split()[1] == "0":
                    self.progress(f"{label}: autotuned without coordinate descent in {text.split()[-1]} s (kept "
                                  "if coordinate descent does not finish); coordinate descent next")
                log.debug("compile child: %s", text)

            def beat(elapsed: float) -> None:
                self.progress(f"{label}: autotuning, {elapsed:.0f} s of its {deadline:.0f} s deadline "
                              f"({tuned[0]} operators timed; budget {self.seconds:g} s)")

            staged = f", {len(stages)} stages" if len(stages) > 1 else ""
            self.progress(f"{label}: autotuning in a child process{staged}, deadline {deadline:.0f} s "
                          f"(budget {self.seconds:g} s, {self.spent_s:.0f} s spent)")
            self.child_compiles += 1
            done = run_with_deadline(python_command(CHILD_MODULE, str(folder / "job.json")), deadline,
                                     env=child_env(), on_line=line, heartbeat_s=HEARTBEAT_S, on_heartbeat=beat)
            finished = next((i for i, out in enumerate(outs) if not out.is_file()), len(outs))
            kept = outs[finished - 1].read_bytes() if finished else None
            if done.timed_out:  # what it timed is in the timing cache (Inductor writes each result as it goes)
                self.misses += tuned[0]
                # past the first stage, or a child that starts at the second (its first from the package cache)
                after_first = finished or (len(autotune_stages(stages[0])) > 1 and not self._whole_recipe)
                what = "coordinate descent" if after_first else "autotuning"
                return kept, f"{what} passed its {deadline:.0f} s deadline after timing {tuned[0]} operators", finished
            tail = " | ".join(t for t in done.tail[-6:] if t.strip())[-800:]
            if not done.ok or finished < len(outs):
                if finished:  # the first stage's package is whole: the build keeps it rather than failing
                    log.warning("build budget: %s: the compile with coordinate descent failed (exit %s), keeping "
                                "the one without it: %s", label, done.returncode, tail)
                    return kept, f"the compile with coordinate descent failed (exit {done.returncode})", finished
                raise BuildError(f"AOTInductor compilation failed in the build's compile process "
                                 f"(exit {done.returncode}): {tail}",
                                 hint="try --optimization-level 3 (no autotuning), or --build-budget-s 0 to "
                                      "compile in this process and see the full error")
            stats = json.loads((folder / "stats.json").read_text())
            self.hits += int(stats.get("hits", 0))
            self.misses += int(stats.get("misses", 0))
            self.progress(f"{label}: autotuned in {done.elapsed_s:.0f} s ({stats.get('hits', 0)} timing-cache hits, "
                          f"{stats.get('misses', 0)} misses)")
            return kept, "", finished
