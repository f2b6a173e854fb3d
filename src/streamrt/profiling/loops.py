"""The timing loops' shared pieces: how long to run (:class:`BenchSettings`), what a loop hands
back (:class:`TimedRun`), and the host loop for synchronous calls.

The CUDA loop (:mod:`streamrt.profiling.cuda_timing`, which imports torch) and the benchmark driver
(:mod:`streamrt.profiling.bench`) both build on this module, so neither imports the other's module
at load time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamrt.errors import ConfigError
from streamrt.profiling.summary import IterationRecord

__all__ = ["BenchSettings", "TimedRun", "host_loop"]


@dataclass(frozen=True)
class BenchSettings:
    """How long to run: warm-up, then until both ``duration_s`` and ``iterations`` are reached."""

    warmup_ms: float = 200.0
    duration_s: float = 3.0
    iterations: int = 10

    def __post_init__(self) -> None:
        if self.warmup_ms < 0:
            raise ConfigError(f"warm-up must be >= 0 ms, got {self.warmup_ms}")
        if self.duration_s < 0:
            raise ConfigError(f"duration must be >= 0 s, got {self.duration_s}")
        if self.iterations < 1:
            raise ConfigError(f"iterations must be an integer >= 1, got {self.iterations}")



_clock = time.perf_counter_ns


def _ms(ns: int) -> float:
    return ns / 1e6


@dataclass(frozen=True)
class TimedRun:
    """What a run loop hands back: timed records and how the run went."""

    records: list[IterationRecord]
    walltime_s: float  # first timed enqueue to last completion
    warmup_queries: int
    warmup_ms: float


def host_loop(call: Callable[[], Any], settings: BenchSettings) -> TimedRun:
    """Time a synchronous host call (CPU engines and plain callables)."""
    origin = _clock()
    warm_end = origin + int(settings.warmup_ms * 1e6)
    warm = 0
    while _clock() < warm_end:
        call()
        warm += 1
    start = _clock()
    deadline = start + int(settings.duration_s * 1e9)
    records: list[IterationRecord] = []
    t0 = start
    while len(records) < settings.iterations or t0 < deadline:
        t0 = _clock()
        call()
        t1 = _clock()
        records.append(IterationRecord.host(_ms(t0 - origin), _ms(t1 - origin)))
        t0 = t1
    end = _clock()
    return TimedRun(records, (end - start) / 1e9, warm, _ms(start - origin))
