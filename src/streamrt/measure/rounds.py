"""Throughput measured in several rounds: the median, the spread, and whether to trust a ratio.

``demo`` and ``pipeline-bench`` run each case several times, interleaved (``a b a b ...``) so a
drifting machine slows every case alike; ``detect`` splits its one run into windows of frames.
:class:`Rounds` holds those throughputs and reports their median with the spread. A case is
*noisy* by the rule ``bench`` applies to compute times (:func:`streamrt.measure.noise.is_unstable`:
coefficient of variation above ``COV_THRESHOLD``), and a ratio whose baseline is noisy is not
printed as a number: a baseline that fell to a tenth of its speed in one round headlines a 10x
speed-up that the code did not earn.

Example:
    >>> base, piped = Rounds.of([100.0, 101.0, 99.0]), Rounds.of([200.0, 203.0, 198.0])
    >>> format_ratio(piped, base)
    '2.00x'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamrt.measure.noise import COV_THRESHOLD, is_unstable, unstable_advice
from streamrt.measure.stats import Stats

__all__ = ["Rounds", "format_ratio", "noise_warning", "ratio"]


@dataclass(frozen=True)
class Rounds:
    """Throughputs of one case, one per round (or window), in the order they ran."""

    values: tuple[float, ...]
    stats: Stats

    @classmethod
    def of(cls, values: Iterable[float]) -> Rounds:
        """Summarise throughputs (at least one)."""
        vals = tuple(float(v) for v in values)
        return cls(vals, Stats.from_samples(vals))

    @property
    def median(self) -> float:
        return self.stats.median

    @property
    def noisy(self) -> bool:
        """The rounds disagree by more than the shared noise rule allows (one round is never noisy)."""
        return len(self.values) > 1 and is_unstable(self.stats)

    def describe(self, unit: str, what: str = "rounds") -> str:
        """``'median of 3 rounds, 98.0-101.0 FPS, CoV 1.2%'``."""
        n = len(self.values)
        if n == 1:
            return f"1 {what[:-1]}"
        return f"median of {n} {what}, {self.stats.min:.1f}-{self.stats.max:.1f} {unit}, CoV {self.stats.cov:.1f}%"


def ratio(test: Rounds, base: Rounds) -> float | None:
    """``test.median / base.median``, or None when the baseline is noisy or zero."""
    if base.noisy or base.median <= 0:
        return None
    return test.median / base.median


def format_ratio(test: Rounds, base: Rounds) -> str:
    """``'2.31x'``, or ``'baseline unstable'`` when the ratio cannot be trusted."""
    value = ratio(test, base)
    return "baseline unstable" if value is None else f"{value:.2f}x"


def noise_warning(cases: Mapping[str, Rounds], device: str, more: str = "and run more rounds (--rounds)",
                  what: str = "rounds") -> str | None:
    """One warning line naming the noisy cases, or None when every case is steady."""
    noisy = {name: r for name, r in cases.items() if r.noisy}
    if not noisy:
        return None
    which = ", ".join(f"{name} CoV {r.stats.cov:.1f}%" for name, r in noisy.items())
    return (f"warning: the machine was noisy, {what} disagree: {which} (the limit is {COV_THRESHOLD}%); "
            f"{unstable_advice(device, more)}")
