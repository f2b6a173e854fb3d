"""Admission control: admit the streams that fit the measured capacity, refuse or queue the rest.

Given each stream's frame rate and a :class:`~streamrt.video.capacity.CapacityRecord`, streams are
admitted in order while their summed demand stays within ``headroom`` x the binding capacity
(queues need slack: a pipeline planned to 100% has no room for a slow frame). The others are
refused, or queued (they start when an admitted stream ends), or, with mode ``off``, admitted
anyway. One line says what happened and why::

    admitted 42 of 60 streams: decode capacity 1,420 frames/s (cpu, h264 1920x1080) at 90% headroom,
    60 x 30 FPS = 1,800 frames/s asked; --admission off to try anyway

Example:
    >>> from streamrt.video.capacity import CapacityRecord
    >>> rec = CapacityRecord("h264", 1920, 1080, "cpu", 1420.0, 5000.0, "ab12", "host")
    >>> len(plan_admission([30.0] * 60, rec).admitted)
    42
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamrt.errors import ConfigError
from streamrt.video.capacity import CapacityRecord

__all__ = ["ADMISSION_MODES", "Admission", "AdmissionConfig", "plan_admission"]

ADMISSION_MODES = ("refuse", "queue", "off")


@dataclass(frozen=True)
class AdmissionConfig:
    """How streams are admitted.

    Attributes:
        mode: ``refuse`` the streams that do not fit, ``queue`` them until a running one ends, or
            ``off``: admit every stream (they then share the capacity and drop frames evenly).
        headroom: the fraction of the measured capacity to plan up to, in (0, 1].
    """

    mode: str = "refuse"
    headroom: float = 0.9

    def __post_init__(self) -> None:
        if self.mode not in ADMISSION_MODES:
            raise ConfigError(f"admission mode must be one of {', '.join(ADMISSION_MODES)}, got {self.mode!r}")
        if not 0 < self.headroom <= 1:
            raise ConfigError(f"admission headroom must be in (0, 1], got {self.headroom}",
                              hint="e.g. --headroom 0.9 plans up to 90% of the measured capacity")


@dataclass(frozen=True)
class Admission:
    """Which streams run now, which wait, which are refused, and the line that says so."""

    admitted: list[int]
    queued: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    message: str = ""
    capacity_fps: float = math.inf
    demand_fps: float = 0.0


def _demand(fps: Sequence[float]) -> str:
    rates = set(fps)
    if len(rates) == 1:
        return f"{len(fps)} x {next(iter(rates)):g} FPS"
    return f"{len(fps)} streams at {min(rates):g}-{max(rates):g} FPS"


def plan_admission(fps: Sequence[float], record: CapacityRecord,
                   config: AdmissionConfig = AdmissionConfig()) -> Admission:
    """Admit streams (frame rates ``fps``, in order) within ``headroom`` x ``record``'s capacity."""
    budget = record.capacity_fps * config.headroom
    total = float(sum(fps))
    load, fits = 0.0, []
    for i, rate in enumerate(fps):
        if load + rate <= budget * (1 + 1e-9):
            fits.append(i)
            load += rate
        else:
            break  # in order: a later small stream does not jump ahead of an earlier one
    rest = list(range(len(fits), len(fps)))
    n = len(fps)
    asked = f"{_demand(fps)} = {total:,.0f} frames/s asked"
    where = f"{record.describe()} at {100 * config.headroom:.0f}% headroom"
    if not rest:
        message = f"admitted {n} of {n} streams: {where}, {asked}"
        return Admission(list(range(n)), message=message, capacity_fps=record.capacity_fps, demand_fps=total)
    if config.mode == "off":
        message = (f"admission off: running {n} streams over {where} ({asked}); "
                   f"only {len(fits)} fit, expect every stream to drop frames")
        return Admission(list(range(n)), message=message, capacity_fps=record.capacity_fps, demand_fps=total)
    if config.mode == "queue":
        message = (f"admitted {len(fits)} of {n} streams, {len(rest)} queued until one ends: {where}, {asked}; "
                   "--admission off to try anyway")
        return Admission(fits, queued=rest, message=message, capacity_fps=record.capacity_fps, demand_fps=total)
    message = f"admitted {len(fits)} of {n} streams: {where}, {asked}; --admission off to try anyway"
    return Admission(fits, refused=rest, message=message, capacity_fps=record.capacity_fps, demand_fps=total)
