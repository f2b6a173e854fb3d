"""Whether an int8 plan pays on the build machine: interleaved rounds against fp32, and a verdict.

An int8 build also builds an fp32 plan with the same backend (in memory) and times the two here.
One timing of each, back to back, says little on a shared machine: the same build read 1.05x and
0.38x fp32 as the load changed. So the two run in **interleaved rounds** (``int8 fp32 fp32 int8
int8 fp32 ...``: each round times a block of calls of each plan, the order flips every round so
neither always runs first), a drifting machine slows both alike, and the speed-up is the
**median of the per-round ratios**. Rounds that disagree by more than the noise rule ``bench``
applies (:func:`streamrt.measure.noise.is_unstable`, through
:class:`streamrt.measure.rounds.Rounds`) give a warning, and a speed-up measured on a noisy
machine is not counted as one. The whole timing stays within :data:`BUDGET_S` (it stops early
once :data:`MIN_ROUNDS` rounds agree).

:func:`int8_verdict` then says what the numbers mean: when int8 is neither faster (below
:data:`FASTER` x fp32, or not measurably so) nor as accurate (the gate's bounds or
``--int8-target`` missed), the build says plainly that fp32 (fp16 on a GPU) is the better plan
for this model on this machine, and records the verdict in ``precision_report.speed``.

Example:
    >>> timing = interleaved_rounds({"int8": run_int8, "fp32": run_fp32})      # doctest: +SKIP
    >>> timing.ratio("int8", "fp32"), timing.noisy                               # doctest: +SKIP
    (0.97, False)
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt.backends.base import BuildJob, Engine
from streamrt.config import BuildConfig, Precision
from streamrt.errors import StreamRTError
from streamrt.measure.rounds import Rounds, noise_warning  # bench's noise rule, one copy below both
from streamrt.plan import Plan, PlanManifest
from streamrt.types import ShapeProfile

if TYPE_CHECKING:
    from streamrt.backends.base import Backend, Progress
    from streamrt.onnx.model import OnnxModel

__all__ = ["BUDGET_S", "FASTER", "Interleaved", "Verdict", "int8_verdict", "interleaved_rounds", "speed_against_fp32"]

log = logging.getLogger(__name__)

BUDGET_S = 3.0
"""Seconds the timing of both plans may take (warm-up included; the fp32 build is not timed)."""
FASTER = 1.05
"""int8 counts as faster from this ratio to fp32 on (and only on a steady machine)."""
MIN_ROUNDS = 5  # stop once this many rounds agree
MAX_ROUNDS = 12  # rounds are sized so that this many fit the budget


@dataclass(frozen=True)
class Interleaved:
    """Throughput (calls/s) of each runner, one value per round, from :func:`interleaved_rounds`."""

    cases: Mapping[str, Rounds]
    calls: Mapping[str, int]  # calls per round of each runner
    seconds: float

    @property
    def rounds(self) -> int:
        return min(len(r.values) for r in self.cases.values())

    @property
    def noisy(self) -> bool:
        """Some runner's rounds disagree by more than ``bench``'s noise rule allows."""
        return any(r.noisy for r in self.cases.values())

    def ms(self, name: str) -> float:
        """Median milliseconds per call of ``name``."""
        return 1e3 / self.cases[name].median

    def ratio(self, test: str, base: str) -> float:
        """How many times faster ``test`` ran than ``base``: the median of the per-round ratios.

        Each round's pair ran back to back, so a load that changes between rounds cancels out.
        """
        pairs = zip(self.cases[test].values, self.cases[base].values, strict=True)
        return statistics.median(t / b for t, b in pairs)

    def warning(self, device: str, more: str) -> str | None:
        """``bench``'s noise warning naming the runners whose rounds disagree, or None."""
        return noise_warning(self.cases, device, more)


def interleaved_rounds(
    runners: Mapping[str, Callable[[], object]],
    *,
    budget_s: float = BUDGET_S,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    calls_per_round: int | None = None,
) -> Interleaved:
    """Time ``runners`` (each one call of a plan, synchronised) in interleaved rounds.

    One warm-up and one timed call each size the rounds (``calls_per_round`` overrides that) so
    that ``max_rounds`` rounds of all runners fit ``budget_s``; rounds then run in alternating
    order (``a b``, ``b a``, ...) until ``max_rounds``, or ``min_rounds`` rounds on which every
    runner is steady, or until one more round would overrun the budget (after at least 2 rounds:
    a plan whose single call is slower than the budget is timed in 4 calls, plus 2 to warm up).

    Example:
        >>> timing = interleaved_rounds({"slow": lambda: time.sleep(0.002), "fast": lambda: time.sleep(0.001)},
        ...                             budget_s=0.5)
        >>> 1.5 < timing.ratio("fast", "slow") < 2.5
        True
    """
    names = list(runners)
    start = time.perf_counter()
    cost: dict[str, float] = {}
    for name, run in runners.items():
        run()  # warm-up: first-call allocations and lazy initialisation
        began = time.perf_counter()
        run()
        cost[name] = time.perf_counter() - began
    share = budget_s / (len(names) * max_rounds)
    calls = {
        name: calls_per_round if calls_per_round is not None else max(1, int(share / max(cost[name], 1e-7)))
        for name in names
    }
    values: dict[str, list[float]] = {name: [] for name in names}
    done = 0
    while True:
        round_began = time.perf_counter()
        for name in names if done % 2 == 0 else reversed(names):
            run, count = runners[name], calls[name]
            began = time.perf_counter()
            for _ in range(count):
                run()
            values[name].append(count / max(time.perf_counter() - began, 1e-9))
        done += 1
        now = time.perf_counter()
        if done >= max_rounds or (done >= 2 and now + (now - round_began) > start + budget_s):
            break  # another round like the last one would overrun the budget
        if done >= min_rounds and not any(Rounds.of(v).noisy for v in values.values()):
            break
    return Interleaved({name: Rounds.of(v) for name, v in values.items()}, calls, time.perf_counter() - start)


@dataclass(frozen=True)
class Verdict:
    """What the speed and accuracy of a low-precision plan say about it on this machine.

    Attributes:
        faster: the plan ran at least :data:`FASTER` x fp32 on a steady machine.
        accurate: the gate found no miss (its bounds, ``--int8-target``, the sensitivity target).
        better: the plan to build instead (``"fp32"``, ``"fp16"``), or None when this one is fine.
        line: the sentence the build prints (a warning when ``better`` is set), or None.
    """

    faster: bool
    accurate: bool
    better: str | None
    line: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def int8_verdict(
    speedup: float, *, noisy: bool, misses: Sequence[str], device: str, precision: str = "int8"
) -> Verdict:
    """Judge a plan ``speedup`` x fp32 (``noisy``: rounds disagreed) with the gate's ``misses``.

    Not faster and not as accurate: fp32 (on a GPU, fp16: it is where a GPU's speed is) is the
    better plan for this model on this machine, said plainly.

    Example:
        >>> int8_verdict(0.9, noisy=False, misses=["y: top1 0.95 < 0.99"], device="cpu").better
        'fp32'
    """
    faster = speedup >= FASTER and not noisy
    accurate = not misses
    how = f"{speedup:.2f}x fp32" + (", on a noisy machine" if noisy else "")
    if faster:
        line = None if accurate else f"{precision} is faster ({how}) but misses {misses[0]}"
        return Verdict(True, accurate, None, line)
    not_faster = f"{precision} is not {'measurably ' if noisy and speedup >= FASTER else ''}faster than fp32 ({how})"
    if accurate:
        return Verdict(False, True, None, f"{not_faster}: it keeps the gate's accuracy but gains nothing here")
    better = "fp16" if device == "cuda" else "fp32"
    where = "on this GPU (fp32 if fp16 misses too)" if device == "cuda" else "on this machine"
    why = "; ".join(misses[:2]) + (" ..." if len(misses) > 2 else "")
    line = (
        f"{better} is the better plan for this model {where}: {not_faster} and less accurate ({why}); "
        f"build with --precision {better}"
    )
    return Verdict(False, False, better, line)


def speed_against_fp32(
    engine: Engine,
    manifest: PlanManifest,
    *,
    source: OnnxModel,
    config: BuildConfig,
    profiles: tuple[ShapeProfile, ...],
    backend: Backend,
    cache_dir: Path,
    feeds: Mapping[str, np.ndarray],
    misses: Sequence[str],
    progress: Progress,
    budget_s: float = BUDGET_S,
) -> dict[str, Any]:
    """Build an fp32 plan of ``source`` with ``backend``, time it against ``engine``, judge: the record.

    Prints the speed line, warns when the rounds were noisy and when fp32 is the better plan,
    and returns what goes into ``precision_report.speed``.
    """
    precision = config.precision.value
    fp32_config = config.replace(precision=Precision.FP32, accuracy_threshold=None, int8_target=None)
    progress(f"timing {precision} against fp32 ({backend.name}, this machine, interleaved rounds)")
    try:
        built = backend.build(BuildJob(source, fp32_config, profiles, lambda line: None, cache_dir))
        fp32_manifest = dataclasses.replace(
            manifest,
            precision="fp32",
            inputs=source.inputs,
            outputs=source.outputs,
            build_settings={"config": fp32_config.to_dict(), "backend": dict(built.settings)},
        )
        reference = backend.load(Plan(fp32_manifest, built.payload))
        try:
            with engine.create_context() as low_ctx, reference.create_context() as fp32_ctx:
                timing = interleaved_rounds(
                    {precision: _call(engine, low_ctx, feeds), "fp32": _call(reference, fp32_ctx, feeds)},
                    budget_s=budget_s,
                )
        finally:
            reference.close()
    except StreamRTError as exc:
        log.warning("could not time the fp32 plan: %s", exc)
        return {"error": str(exc)}
    speedup = timing.ratio(precision, "fp32")
    low, fp32 = timing.cases[precision], timing.cases["fp32"]
    line = (
        f"{precision} {timing.ms(precision):.3f} ms vs fp32 {timing.ms('fp32'):.3f} ms per call on {backend.name} "
        f"here: {speedup:.2f}x fp32 (median of {timing.rounds} interleaved rounds in {timing.seconds:.1f} s; "
        f"CoV {precision} {low.stats.cov:.1f}%, fp32 {fp32.stats.cov:.1f}%)"
    )
    noise = timing.warning(engine.device_kind, "and rebuild, or compare the two plans with streamrt bench")
    verdict = int8_verdict(speedup, noisy=timing.noisy, misses=misses, device=engine.device_kind, precision=precision)
    progress(line)
    if noise:
        log.warning("%s", noise)
    if verdict.line:
        log.warning("warning: %s", verdict.line)
    return {
        "low_ms": timing.ms(precision),
        "fp32_ms": timing.ms("fp32"),
        "speedup": speedup,
        "device": engine.device_kind,
        "rounds": timing.rounds,
        "seconds": timing.seconds,
        "low_cov": low.stats.cov,
        "fp32_cov": fp32.stats.cov,
        "noisy": timing.noisy,
        "noise_warning": noise,
        "verdict": verdict.to_dict(),
    }


def _call(engine: Engine, ctx: Any, feeds: Mapping[str, np.ndarray]) -> Callable[[], object]:
    """One synchronised call of ``engine`` on ``feeds`` (already on its device) in ``ctx``."""
    from streamrt.running.inputs import cast_inputs, to_device

    values = to_device(cast_inputs(dict(feeds), engine.inputs), engine.device_kind)
    if engine.device_kind != "cuda":
        return lambda: ctx.infer(values)
    import torch

    def run() -> object:
        out = ctx.infer(values)
        torch.cuda.synchronize()  # the outputs are valid once the engine's stream gets there
        return out

    return run
