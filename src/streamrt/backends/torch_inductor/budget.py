"""The build budget (``--build-budget-s``): autotuning compiles that end on time, or fall back.

Inductor's max-autotune cannot be stopped from inside the process once it runs, and on the H200
a level-5 ResNet-50 build autotuned convolutions for more than 9 minutes without finishing. So a
compile whose recipe autotunes (``max_autotune`` or ``coordinate_descent_tuning``: levels 4-5) runs
in a child process (:mod:`._compile_child`, started through :mod:`.deadline`) on the exported
program saved to a temporary file, with a deadline of what is left of the budget minus a reserve
(30%, at most 120 s) kept for the fallback compile. When the child passes its deadline its process
group is killed and the build goes on with the **level-3 recipe** (the same Inductor configs with
``max_autotune`` and ``coordinate_descent_tuning`` off) in this process; the rest of the build
(later profiles) uses it too, and an optional compile (level 5's second memory-format candidate)
is skipped. The progress lines and the manifest (``build_settings.backend.build_budget``) say
what fell back, when, and to what.

What a killed child had already timed stays in the timing cache (Inductor writes each operator's
autotuning result as it is measured), so the next build with the same ``--timing-cache`` starts
further on. The child counts its timing-cache hits and misses and reports them here.

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
from streamrt.errors import BuildError

__all__ = ["BuildBudget", "fallback_configs", "tunes"]

log = logging.getLogger(__name__)

CHILD_MODULE = "streamrt.backends.torch_inductor._compile_child"
RESERVE_FRACTION = 0.3
RESERVE_MAX_S = 120.0
HEARTBEAT_S = 15.0
_TUNING_KNOBS = ("max_autotune", "coordinate_descent_tuning")


def tunes(configs: Mapping[str, Any]) -> bool:
    """Whether a compile with these Inductor configs autotunes (and so runs under the budget)."""
    return any(bool(configs.get(k)) for k in _TUNING_KNOBS)


def fallback_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """The level-3 recipe of ``configs``: autotuning off, everything else (layout, freezing, metadata) kept."""
    return {**configs, **{k: False for k in _TUNING_KNOBS}}


@dataclass
class BuildBudget:
    """Seconds of autotuning left to one build, and what happened when they ran out.

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

    @property
    def spent_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def reserve_s(self) -> float:
        return min(RESERVE_FRACTION * (self.seconds or 0.0), RESERVE_MAX_S)

    def to_dict(self) -> dict[str, Any]:
        """What the manifest records (``build_settings.backend.build_budget``)."""
        return {"seconds": self.seconds, "spent_s": round(self.spent_s, 1), "reserve_s": round(self.reserve_s, 1),
                "child_compiles": self.child_compiles, "fell_back": list(self.events)}

    def compile(self, ep: Any, configs: Mapping[str, Any], *, label: str, optional: bool = False) -> bytes | None:
        """One ``.pt2``: autotuned within the budget, else with the fallback recipe.

        ``None`` only for an ``optional`` compile once the budget is spent (it is skipped)."""
        if self.seconds is None or not tunes(configs):
            return self.compile_here(ep, configs)
        if self.exhausted:
            if optional:
                self.progress(f"build budget: {label} skipped (the {self.seconds:g} s budget is spent)")
                self.events.append({"what": label, "to": "skipped", "after_s": round(self.spent_s, 1)})
                return None
            return self._fallback(ep, configs, label, "the budget was already spent")
        deadline = self.seconds - self.spent_s - self.reserve_s
        if deadline <= 0:
            self.exhausted = True
            return self.compile(ep, configs, label=label, optional=optional)
        package = self._in_child(ep, configs, label, deadline)
        if package is not None:
            return package
        self.exhausted = True
        if optional:
            self.events.append({"what": label, "to": "skipped", "after_s": round(self.spent_s, 1)})
            self.progress(f"build budget: {label} skipped after {self.spent_s:.0f} s of {self.seconds:g} s")
            return None
        return self._fallback(ep, configs, label, f"autotuning passed its {deadline:.0f} s deadline")

    def _fallback(self, ep: Any, configs: Mapping[str, Any], label: str, why: str) -> bytes:
        self.progress(f"build budget {self.seconds:g} s: {why} ({self.spent_s:.0f} s spent); {label}: compiling "
                      "with the level-3 recipe (no autotuning) instead")
        self.events.append({"what": label, "to": "level-3 recipe (max_autotune and coordinate_descent_tuning off)",
                            "after_s": round(self.spent_s, 1), "why": why})
        return self.compile_here(ep, fallback_configs(configs))

    def _in_child(self, ep: Any, configs: Mapping[str, Any], label: str, deadline: float) -> bytes | None:
        """Compile in a child with ``deadline``; ``None`` when it had to be killed."""
        import torch

        with tempfile.TemporaryDirectory(prefix="streamrt-budget-") as tmp:
            folder = Path(tmp)
            try:
                torch.export.save(ep, str(folder / "program.pt2"))
            except Exception as exc:  # a program torch cannot serialise still builds, without a deadline
                log.warning("build budget not enforced for %s: the exported program could not be saved (%s: %s)",
                            label, type(exc).__name__, exc)
                self.events.append({"what": label, "to": "in-process compile without a deadline",
                                    "why": f"torch.export.save failed: {type(exc).__name__}"})
                return self.compile_here(ep, configs)
            job = {"program": str(folder / "program.pt2"), "configs": dict(configs), "out": str(folder / "out.pt2"),
                   "stats": str(folder / "stats.json"), "tf32": self.tf32, "cudnn_benchmark": self.cudnn_benchmark}
            (folder / "job.json").write_text(json.dumps(job))
            tuned = [0]

            def line(text: str) -> None:
                if "AUTOTUNE " in text:
                    tuned[0] += 1
                log.debug("compile child: %s", text)

            def beat(elapsed: float) -> None:
                self.progress(f"{label}: autotuning, {elapsed:.0f} s of its {deadline:.0f} s deadline "
                              f"({tuned[0]} operators timed; budget {self.seconds:g} s)")

            self.progress(f"{label}: autotuning in a child process, deadline {deadline:.0f} s "
                          f"(budget {self.seconds:g} s, {self.spent_s:.0f} s spent)")
            self.child_compiles += 1
            done = run_with_deadline(python_command(CHILD_MODULE, str(folder / "job.json")), deadline,
                                     env=child_env(), on_line=line, heartbeat_s=HEARTBEAT_S, on_heartbeat=beat)
            if done.timed_out:
                return None
            if not done.ok or not (folder / "out.pt2").is_file():
                tail = " | ".join(t for t in done.tail[-6:] if t.strip())[-800:]
                raise BuildError(f"AOTInductor compilation failed in the build's compile process "
                                 f"(exit {done.returncode}): {tail}",
                                 hint="try --optimization-level 3 (no autotuning), or --build-budget-s 0 to "
                                      "compile in this process and see the full error")
            stats = json.loads((folder / "stats.json").read_text())
            self.hits += int(stats.get("hits", 0))
            self.misses += int(stats.get("misses", 0))
            self.progress(f"{label}: autotuned in {done.elapsed_s:.0f} s ({stats.get('hits', 0)} timing-cache hits, "
                          f"{stats.get('misses', 0)} misses)")
            return (folder / "out.pt2").read_bytes()
