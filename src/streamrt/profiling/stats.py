"""Summary statistics of timing samples: :mod:`streamrt.measure.stats`, re-exported where bench reads it."""

from __future__ import annotations

from streamrt.measure.stats import PERCENTILES, Stats, median, percentile

__all__ = ["PERCENTILES", "Stats", "median", "percentile"]
