"""trtexec's summary of a benchmark: per-query records, statistics per metric, and warnings.

Metric definitions (``samples/common/sampleReporting.cpp``): latency = H2D + compute + D2H;
enqueue = host time to enqueue one query; throughput = queries / total host walltime, where
walltime runs from the first timed enqueue to the last completion; total compute time = mean
compute x queries. Warnings: compute CoV above :data:`COV_THRESHOLD` percent (unstable);
median enqueue above :data:`ENQUEUE_BOUND_RATIO` x median compute (enqueue-bound); median H2D
or D2H at least the median compute (transfer-bound).

Example:
    >>> rec = IterationRecord.host(0.0, 2.0)
    >>> summary = BenchSummary.from_records([rec], walltime_s=0.002, batch=8)
    >>> summary.throughput_qps, summary.items_per_s
    (500.0, 4000.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrt.measure.noise import COV_THRESHOLD, is_unstable, unstable_advice  # re-exported: the shared rule
from streamrt.measure.stats import Stats

__all__ = [
    "COV_THRESHOLD",
    "ENQUEUE_BOUND_RATIO",
    "BenchSummary",
    "BenchWarning",
    "IterationRecord",
    "check_warnings",
    "is_unstable",
    "unstable_advice",
]

ENQUEUE_BOUND_RATIO = 0.8
"""Median enqueue above this fraction of median compute is reported enqueue-bound."""


@dataclass(frozen=True)
class IterationRecord:
    """Timestamps of one query in ms from the start of the run (warm-up included), as trtexec's."""

    start_enq_ms: float
    end_enq_ms: float
    start_h2d_ms: float
    end_h2d_ms: float
    start_compute_ms: float
    end_compute_ms: float
    start_d2h_ms: float
    end_d2h_ms: float

    @property
    def enqueue_ms(self) -> float:
        return self.end_enq_ms - self.start_enq_ms

    @property
    def h2d_ms(self) -> float:
        return self.end_h2d_ms - self.start_h2d_ms

    @property
    def compute_ms(self) -> float:
        return self.end_compute_ms - self.start_compute_ms

    @property
    def d2h_ms(self) -> float:
        return self.end_d2h_ms - self.start_d2h_ms

    @property
    def latency_ms(self) -> float:
        """H2D + compute + D2H (trtexec's Latency)."""
        return self.h2d_ms + self.compute_ms + self.d2h_ms

    def to_json(self) -> dict[str, float]:
        """One element of ``--export-times``, with trtexec's field names, rounded to the nanosecond."""
        values = {
            "startEnqMs": self.start_enq_ms,
            "endEnqMs": self.end_enq_ms,
            "startH2dMs": self.start_h2d_ms,
            "endH2dMs": self.end_h2d_ms,
            "startComputeMs": self.start_compute_ms,
            "endComputeMs": self.end_compute_ms,
            "startD2hMs": self.start_d2h_ms,
            "endD2hMs": self.end_d2h_ms,
            "h2dMs": self.h2d_ms,
            "computeMs": self.compute_ms,
            "d2hMs": self.d2h_ms,
            "latencyMs": self.latency_ms,
        }
        return {key: round(value, 6) for key, value in values.items()}

    @classmethod
    def host(cls, start_ms: float, end_ms: float) -> IterationRecord:
        """A synchronous host call: zero-length transfers around a compute = enqueue interval."""
        return cls(start_ms, end_ms, start_ms, start_ms, start_ms, end_ms, end_ms, end_ms)


@dataclass(frozen=True)
class BenchSummary:
    """trtexec's performance summary of the timed queries.

    Attributes:
        queries: timed queries (``infer`` calls).
        batch: items per query.
        walltime_s: first timed enqueue to last completion, host clock.
        latency / enqueue / h2d / compute / d2h: statistics of each metric, in ms.
    """

    queries: int
    batch: int
    walltime_s: float
    latency: Stats
    enqueue: Stats
    h2d: Stats
    compute: Stats
    d2h: Stats

    @property
    def throughput_qps(self) -> float:
        """Queries per second (a query is one batch)."""
        return self.queries / self.walltime_s if self.walltime_s > 0 else float("inf")

    @property
    def items_per_s(self) -> float:
        return self.throughput_qps * self.batch

    @property
    def total_compute_s(self) -> float:
        """Mean compute time x queries (trtexec's Total GPU Compute Time)."""
        return self.compute.mean * self.queries / 1000.0

    @classmethod
    def from_records(
        cls, records: list[IterationRecord] | tuple[IterationRecord, ...], walltime_s: float, batch: int
    ) -> BenchSummary:
        """Summarise timed records.

        Raises:
            ValueError: when there are no records.
        """
        if not records:
            raise ValueError("no timed queries to summarise")
        return cls(
            queries=len(records),
            batch=batch,
            walltime_s=walltime_s,
            latency=Stats.from_samples(r.latency_ms for r in records),
            enqueue=Stats.from_samples(r.enqueue_ms for r in records),
            h2d=Stats.from_samples(r.h2d_ms for r in records),
            compute=Stats.from_samples(r.compute_ms for r in records),
            d2h=Stats.from_samples(r.d2h_ms for r in records),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "batch": self.batch,
            "throughput_qps": self.throughput_qps,
            "throughput_items_per_s": self.items_per_s,
            "total_host_walltime_s": self.walltime_s,
            "total_compute_time_s": self.total_compute_s,
            "latency_ms": self.latency.to_dict(),
            "enqueue_ms": self.enqueue.to_dict(),
            "h2d_ms": self.h2d.to_dict(),
            "compute_ms": self.compute.to_dict(),
            "d2h_ms": self.d2h.to_dict(),
        }


@dataclass(frozen=True)
class BenchWarning:
    """One of trtexec's automatic warnings: what was seen, and what to do about it."""

    code: str  # "unstable", "enqueue-bound", "h2d-bound", "d2h-bound"
    message: str
    advice: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "advice": self.advice}


def check_warnings(summary: BenchSummary, device: str) -> list[BenchWarning]:
    """trtexec's warnings for a summary.

    - ``unstable``: compute CoV > :data:`COV_THRESHOLD` percent.
    - ``enqueue-bound``: median enqueue > :data:`ENQUEUE_BOUND_RATIO` x median compute (CUDA only:
      on a CPU engine enqueue *is* compute).
    - ``h2d-bound`` / ``d2h-bound``: median transfer >= median compute (CUDA only).
    """
    out: list[BenchWarning] = []
    c = summary.compute
    if is_unstable(c):
        out.append(
            BenchWarning(
                "unstable",
                f"compute time is unstable: coefficient of variation {c.cov:.2f}% > {COV_THRESHOLD}%",
                unstable_advice(device, ("" if device == "cuda" else "fix the thread count (--option threads=N), ")
                                + "and run longer (--duration)"),
            )
        )
    if device != "cuda":
        return out
    if summary.enqueue.median > ENQUEUE_BOUND_RATIO * c.median:
        out.append(
            BenchWarning(
                "enqueue-bound",
                f"throughput may be bound by enqueue time (median {summary.enqueue.median:.4g} ms > "
                f"{ENQUEUE_BOUND_RATIO} x median compute {c.median:.4g} ms); the GPU may be under-used",
                "use an engine with cheaper launches (a compiled plan, CUDA graphs), a larger --batch, "
                "or several contexts on several streams",
            )
        )
    for code, what, stats, advice in (
        (
            "h2d-bound",
            "host-to-device transfers of the inputs",
            summary.h2d,
            "keep inputs on the GPU (pre-process there), send smaller dtypes (uint8 images), or overlap copies "
            "with compute on another stream (streamrt pipelines)",
        ),
        (
            "d2h-bound",
            "device-to-host transfers of the outputs",
            summary.d2h,
            "post-process on the GPU and copy back only the results, or overlap copies with compute on another "
            "stream (streamrt pipelines)",
        ),
    ):
        if stats.median >= c.median:
            out.append(
                BenchWarning(
                    code,
                    f"throughput may be bound by {what} (median {stats.median:.4g} ms >= median compute "
                    f"{c.median:.4g} ms)",
                    advice,
                )
            )
    return out
