"""The noise rule every measurement shares: a coefficient of variation above 2.5% is unstable.

``bench`` (:mod:`streamrt.profiling.summary`) applies it to per-iteration compute times, the
throughput rounds of ``demo``, ``pipeline-bench`` and ``detect`` (:mod:`streamrt.measure.rounds`)
to their rounds, and the int8 speed check (:mod:`streamrt.building.speed_check`) to its timed
rounds. It lives below all of them so the build side uses the same rule without importing the
profiling room.

Example:
    >>> from streamrt.measure.stats import Stats
    >>> is_unstable(Stats.from_samples([1.0, 1.0, 1.0]))
    False
"""

from __future__ import annotations

from streamrt.measure.stats import Stats

__all__ = ["COV_THRESHOLD", "is_unstable", "unstable_advice"]

COV_THRESHOLD = 2.5
"""Compute time with a coefficient of variation above this (percent) is reported unstable."""


def is_unstable(stats: Stats) -> bool:
    """The noise rule every measurement shares: coefficient of variation above :data:`COV_THRESHOLD`.

    ``bench`` applies it to per-iteration compute times; ``demo``, ``pipeline-bench`` and ``detect``
    to throughput across rounds (:mod:`streamrt.measure.rounds`), and the int8 speed check to its rounds.
    """
    return stats.cov > COV_THRESHOLD


def unstable_advice(device: str, more: str) -> str:
    """What to do about an unstable measurement on ``device``; ``more`` names the command's own knobs."""
    quiet = (
        "lock the GPU clocks (nvidia-smi --lock-gpu-clocks), keep other work off the GPU"
        if device == "cuda"
        else "keep other work off the machine"
    )
    return f"{quiet}, {more}"
