"""Throughput measured in rounds: :mod:`streamrt.measure.rounds`, re-exported where the profiling room had it."""

from __future__ import annotations

from streamrt.measure.rounds import Rounds, format_ratio, noise_warning, ratio

__all__ = ["Rounds", "format_ratio", "noise_warning", "ratio"]
