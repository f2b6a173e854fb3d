"""Summary statistics of timing samples, with trtexec's conventions.

trtexec (``samples/common/sampleReporting.cpp``) reports min, max, mean, median and the
90/95/99th percentiles of every metric, and the coefficient of variation (CoV) only in its
"unstable" warning. Its conventions, kept here so numbers read the same way:

- **Percentile p** excludes the top ``floor((1 - p/100) * n)`` samples of the ascending sort and
  returns the largest remaining one: ``sorted[max(n - 1 - floor((1 - p/100) * n), 0)]``. It is
  always an observed sample (no interpolation): NumPy's ``method="inverted_cdf"``, not its
  default ``linear`` method.
  trtexec computes the excluded count in single precision, which for p99 can exclude one sample
  fewer than the exact value (e.g. it returns the maximum of 100 samples); StreamRT uses the
  exact count.
- **Median** is the middle sample, or the mean of the two middle samples.
- **CoV** is the population standard deviation divided by the mean, in percent.

Example:
    >>> s = Stats.from_samples([1.0, 2.0, 3.0, 4.0])
    >>> s.median, s.p90, s.max
    (2.5, 4.0, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

__all__ = ["PERCENTILES", "Stats", "median", "percentile"]

PERCENTILES = (90.0, 95.0, 99.0)
"""The percentiles every summary reports (trtexec's default ``--percentile=90,95,99``)."""


def percentile(sorted_samples: Sequence[float], p: float) -> float:
    """trtexec's percentile of ascending ``sorted_samples`` (see module docs).

    Args:
        sorted_samples: samples in ascending order.
        p: percentile in [0, 100].

    Returns:
        An element of ``sorted_samples``; ``inf`` when there are none (as trtexec).

    Raises:
        ValueError: when ``p`` is outside [0, 100].
    """
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    n = len(sorted_samples)
    if n == 0:
        return math.inf
    # Exact rational arithmetic: (1 - 99/100) * 100 must exclude exactly 1 sample, not 0.
    exclude = math.floor((1 - Fraction(str(p)) / 100) * n)
    return float(sorted_samples[max(n - 1 - exclude, 0)])


def median(sorted_samples: Sequence[float]) -> float:
    """Middle sample of ascending ``sorted_samples``, or the mean of the two middle ones."""
    n = len(sorted_samples)
    if n == 0:
        return math.inf
    m = n // 2
    if n % 2:
        return float(sorted_samples[m])
    return (float(sorted_samples[m - 1]) + float(sorted_samples[m])) / 2


@dataclass(frozen=True)
class Stats:
    """min/max/mean/median/p90/p95/p99 and CoV of one metric, in the samples' unit (ms).

    Attributes:
        count: number of samples.
        min: smallest sample.
        max: largest sample.
        mean: arithmetic mean.
        median: trtexec's median.
        p90: trtexec's 90th percentile.
        p95: trtexec's 95th percentile.
        p99: trtexec's 99th percentile.
        std: population standard deviation.
        cov: coefficient of variation, ``std / mean`` in percent (0 for a constant metric
            and for an all-zero metric such as a CPU engine's H2D time).

    Example:
        >>> Stats.from_samples([2.0, 1.0, 3.0]).mean
        2.0
    """

    count: int
    min: float
    max: float
    mean: float
    median: float
    p90: float
    p95: float
    p99: float
    std: float
    cov: float

    @classmethod
    def from_samples(cls, samples: Iterable[float]) -> Stats:
        """Summarise ``samples`` (any order).

        Raises:
            ValueError: when there are no samples.
        """
        values = np.sort(np.asarray(list(samples), dtype=np.float64))
        if values.size == 0:
            raise ValueError("cannot summarise an empty list of samples")
        as_list = values.tolist()
        mean = float(values.mean())
        std = float(values.std())
        cov = 0.0 if mean == 0.0 else std / mean * 100.0
        p90, p95, p99 = (percentile(as_list, p) for p in PERCENTILES)
        return cls(
            count=len(as_list),
            min=as_list[0],
            max=as_list[-1],
            mean=mean,
            median=median(as_list),
            p90=p90,
            p95=p95,
            p99=p99,
            std=std,
            cov=cov,
        )

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready mapping with the attribute names as keys."""
        return asdict(self)

    def format(self, unit: str = "ms") -> str:
        """trtexec's one-line form: ``min = 1 ms, max = 2 ms, mean = ..., percentile(99%) = ...``."""
        parts = [("min", self.min), ("max", self.max), ("mean", self.mean), ("median", self.median)]
        tails = (self.p90, self.p95, self.p99)
        parts += [(f"percentile({p:g}%)", v) for p, v in zip(PERCENTILES, tails, strict=True)]
        return ", ".join(f"{name} = {value:.6g} {unit}" for name, value in parts)
