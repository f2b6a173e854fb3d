"""Latency-bound search: the highest throughput whose latency percentile stays under a bound.

perf_analyzer's ``--latency-threshold`` ends a concurrency sweep at the first level whose latency
exceeds the threshold, and its ``--binary-search`` bisects a given range instead, with the range's
step as the precision. :func:`search_bound` does both, so neither a step nor a range has to be
guessed: it doubles the concurrency from ``start`` until a level's percentile goes over the bound
(or ``end`` is reached), then bisects between the last level under the bound and the first one
over it until they are ``step`` apart. The answer is the level with the highest throughput among
those under the bound (on a well-behaved server, the highest concurrency under it).

This is the measurement of MLPerf's Server scenario (ResNet-50 under a 15 ms p99 bound) done
with a closed loop of ``concurrency`` clients, as perf_analyzer does, rather than LoadGen's
Poisson arrivals.

A level counts as under the bound only when it had no errors: failed requests come back fast and
would pull the percentile down. Every level is measured by :func:`streamrt.client.loadgen.measure_level`,
the same code as a plain sweep.

Example:
    >>> bound = LatencyBound(bound_ms=15, percentile=99, end=256)                # doctest: +SKIP
    >>> found = run_search(LoadConfig(url="127.0.0.1:8001", model="resnet50", protocol="grpc"), bound)  # doctest: +SKIP
    >>> print(found.summary())  # "best under 15 ms p99: N infer/s at concurrency C (p99 Y ms)"  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamrt.client.loadgen import LevelResult, LoadConfig, measure_level, run_async
from streamrt.errors import ConfigError

__all__ = ["DEFAULT_MAX_CONCURRENCY", "PERCENTILES", "LatencyBound", "SearchResult", "run_search", "search_bound"]

PERCENTILES = {50: "median", 90: "p90", 95: "p95", 99: "p99"}
"""The percentiles a bound can be put on, and the :class:`~streamrt.measure.stats.Stats` field of each."""

DEFAULT_MAX_CONCURRENCY = 1024
"""Where the doubling stops when the range gives no end."""


@dataclass(frozen=True)
class LatencyBound:
    """What to search for: ``percentile`` of the client latency <= ``bound_ms``, concurrency in ``[start, end]``.

    Attributes:
        bound_ms: the latency bound in milliseconds (> 0).
        percentile: 50, 90, 95 or 99.
        start / end: the lowest and highest concurrency tried.
        step: the bisection stops when the last level under and the first over are this close.
    """

    bound_ms: float
    percentile: int = 99
    start: int = 1
    end: int = DEFAULT_MAX_CONCURRENCY
    step: int = 1

    def __post_init__(self) -> None:
        if not (self.bound_ms > 0 and math.isfinite(self.bound_ms)):
            raise ConfigError(f"the latency bound must be a number of milliseconds > 0, got {self.bound_ms}")
        if self.percentile not in PERCENTILES:
            raise ConfigError(f"percentile must be one of {', '.join(map(str, PERCENTILES))}, got {self.percentile}")
        if not 1 <= self.start <= self.end:
            raise ConfigError(f"the search range needs 1 <= start <= end, got {self.start}:{self.end}")
        if self.step < 1:
            raise ConfigError(f"the search step must be an integer >= 1, got {self.step}")

    @property
    def label(self) -> str:
        """``"15 ms p99"``: how reports name the bound."""
        return f"{self.bound_ms:g} ms p{self.percentile}"

    def latency(self, result: LevelResult) -> float:
        """The level's latency at the bound's percentile (ms; ``inf`` with no completed request)."""
        return float(getattr(result.latency_ms, PERCENTILES[self.percentile])) if result.latency_ms else math.inf

    def under(self, result: LevelResult) -> bool:
        """The level met the bound: requests completed, none failed, and the percentile is within it."""
        return result.requests > 0 and result.errors == 0 and self.latency(result) <= self.bound_ms


@dataclass
class SearchResult:
    """Every level tried (in the order tried) and the best one under the bound (None: no level met it)."""

    bound: LatencyBound
    levels: list[LevelResult] = field(default_factory=list)

    @property
    def best(self) -> LevelResult | None:
        """The level under the bound with the highest throughput."""
        under = [r for r in self.levels if self.bound.under(r)]
        return max(under, key=lambda r: r.throughput) if under else None

    @property
    def reached_end(self) -> bool:
        """The range's end was under the bound: the true best may lie beyond it."""
        return any(r.concurrency == self.bound.end and self.bound.under(r) for r in self.levels)

    def marks(self) -> list[str]:
        """``best`` / ``under`` / ``over`` for each level, in :attr:`levels` order."""
        best = self.best
        return ["best" if r is best else "under" if self.bound.under(r) else "over" for r in self.levels]

    def summary(self) -> str:
        """The one-line answer: ``best under 15 ms p99: N infer/s at concurrency C (p99 Y ms)``."""
        p = f"p{self.bound.percentile}"
        best = self.best
        if best is None:
            first = self.levels[0] if self.levels else None
            seen = (f"concurrency {first.concurrency} had {p} {self.bound.latency(first):.2f} ms"
                    + (f" and {first.errors} errors" if first.errors else "")) if first else "nothing was measured"
            return f"no concurrency level meets {p} <= {self.bound.bound_ms:g} ms: {seen}"
        return (f"best under {self.bound.label}: {best.throughput:.1f} infer/s at concurrency {best.concurrency} "
                f"({p} {self.bound.latency(best):.2f} ms)")

    def to_json(self) -> list[dict[str, Any]]:
        """perf's JSON (one object per level, in the order tried), each with its ``latency_bound`` verdict."""
        out = []
        for r, mark in zip(self.levels, self.marks(), strict=True):
            d = r.to_json()
            d["latency_bound"] = {"ms": self.bound.bound_ms, "percentile": self.bound.percentile,
                                  "under": mark != "over", "best": mark == "best"}
            out.append(d)
        return out


async def search_bound(bound: LatencyBound, measure: Callable[[int], Awaitable[LevelResult]]) -> SearchResult:
    """Double from ``bound.start`` until a level goes over the bound, then bisect (see the module docs).

    Args:
        bound: the bound and the concurrency range.
        measure: measures one concurrency level (:func:`~streamrt.client.loadgen.measure_level` in use;
            a fake in tests of the search itself).

    Returns:
        Every level tried. A start level that fails ends the search: nothing lower is tried.
    """
    found = SearchResult(bound)

    async def under(concurrency: int) -> bool:
        result = await measure(concurrency)
        found.levels.append(result)
        return bound.under(result)

    low, high, level = 0, 0, bound.start
    while await under(level):
        low = level
        if level >= bound.end:
            return found
        level = min(level * 2, bound.end)
    high = level
    if low:
        while high - low > bound.step:
            middle = (low + high) // 2
            if await under(middle):
                low = middle
            else:
                high = middle
    return found


def run_search(cfg: LoadConfig, bound: LatencyBound) -> SearchResult:
    """:func:`search_bound` against the server ``cfg`` names, on a fresh event loop (blocking);
    ``cfg.concurrency`` is ignored (the search picks the levels)."""

    async def main() -> SearchResult:
        return await search_bound(bound, lambda level: measure_level(cfg, level))

    return run_async(main())
