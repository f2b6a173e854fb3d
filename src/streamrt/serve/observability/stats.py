"""Per-model counters with Triton's meanings: one source for the statistics API and /metrics.

Semantics (Triton's ``extension_statistics.md`` and ``metrics.md``):

* ``success``/``fail``: requests, with their total server-side duration (receipt to response).
* ``queue``: per request, time from queueing to the start of its batch.
* ``compute_input``/``compute_infer``/``compute_output``: per request, the durations of the batch
  it ran in (gathering inputs, running the engine, splitting outputs).
* ``inference_count``: rows inferred (a batch of 8 counts 8); ``execution_count``: batches run.
* ``failures``: failed requests by reason (REJECTED, CANCELED, BACKEND, OTHER).

An ensemble's statistics (Triton's) add up its steps: its ``queue`` and ``compute_*`` are the
sums of its step requests' times and each request counts as one execution; ``steps`` keeps
per-step request counts and a duration histogram (step index and model, for ``/metrics``).

Histograms for ``/metrics`` (cumulative buckets, Prometheus' convention): request duration
(per request, success or failure), queue duration (per request), compute duration (per execution:
input + infer + output) and batch size (rows per execution).

Example:
    >>> s = ModelStats()
    >>> s.record_batch(rows=4, requests=2, input_ns=10, infer_ns=100, output_ns=5)
    >>> s.inference_count, s.execution_count, s.compute_infer.ns
    (4, 1, 200)
"""

from __future__ import annotations

import bisect
import collections
import copy
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["BATCH_BUCKETS", "DURATION_BUCKETS_US", "Duration", "Histogram", "ModelStats", "StepStats"]

DURATION_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
                       500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000)
"""Upper bounds (microseconds) of the duration histograms: 100 us to 10 s, about x2.5 apart."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds of the batch-size histogram (rows per execution)."""


@dataclass
class Duration:
    """A count and a total in nanoseconds (the KServe statistics' ``{"count", "ns"}``)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns * count

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class Histogram:
    """Observations counted into fixed buckets (``le`` upper bounds), with their sum; not locked
    (the owning :class:`ModelStats` holds its lock around every call)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, observations <= le)`` for every bound and +Inf, as Prometheus exposes them."""
        out, total = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


@dataclass
class StepStats:
    """One ensemble step's requests: successes, failures, and their durations (us)."""

    index: int
    model: str
    success: Duration
    fail: Duration
    duration_us: Histogram


class ModelStats:
    """Cumulative statistics of one model version (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.memory_usage: list[dict[str, Any]] = []
        """Triton's ``memory_usage``: what the load took per device, ``{"type": "GPU", "id": 1, "byte_size": n}``."""
        self.last_inference_ms = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.batches: dict[int, tuple[Duration, Duration, Duration]] = {}
        self.request_us = Histogram(DURATION_BUCKETS_US)
        self.queue_us = Histogram(DURATION_BUCKETS_US)
        self.compute_us = Histogram(DURATION_BUCKETS_US)
        self.batch_size = Histogram(BATCH_BUCKETS)
        self._steps: dict[int, StepStats] = {}

    def record_step(self, index: int, model: str, ns: int, ok: bool) -> None:
        """One request of ensemble step ``index`` (running ``model``) took ``ns``."""
        with self._lock:
            step = self._steps.get(index)
            if step is None:
                step = self._steps[index] = StepStats(index, model, Duration(), Duration(),
                                                      Histogram(DURATION_BUCKETS_US))
            (step.success if ok else step.fail).add(ns)
            step.duration_us.observe(ns / 1000)

    def steps(self) -> list[StepStats]:
        """Copies of the per-step statistics (empty for models that are not ensembles)."""
        with self._lock:
            return [copy.deepcopy(s) for _, s in sorted(self._steps.items())]

    def histograms(self) -> dict[str, Histogram]:
        """Copies of the four histograms (request, queue, compute, batch_size), taken under the lock."""
        with self._lock:
            return {name: copy.deepcopy(h) for name, h in (
                ("request", self.request_us), ("queue", self.queue_us), ("compute", self.compute_us),
                ("batch_size", self.batch_size))}

    def record_batch(self, rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One engine execution of ``rows`` rows serving ``requests`` requests."""
        with self._lock:
            self.inference_count += rows
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)
            self.compute_input.add(input_ns, requests)
            self.compute_infer.add(infer_ns, requests)
            self.compute_output.add(output_ns, requests)
            per = self.batches.setdefault(rows, (Duration(), Duration(), Duration()))
            per[0].add(input_ns)
            per[1].add(infer_ns)
            per[2].add(output_ns)
            self.compute_us.observe((input_ns + infer_ns + output_ns) / 1000)
            self.batch_size.observe(rows)

    def record_queue(self, ns: int) -> None:
        with self._lock:
            self.queue.add(ns)
            self.queue_us.observe(ns / 1000)

    def record_success(self, ns: int) -> None:
        with self._lock:
            self.success.add(ns)
            self.request_us.observe(ns / 1000)

    def record_failure(self, reason: str, ns: int) -> None:
        with self._lock:
            self.fail.add(ns)
            self.request_us.observe(ns / 1000)
            self.failures[reason] += 1

    def to_kserve(self, name: str, version: str) -> dict[str, Any]:
        """One entry of the statistics extension's ``model_stats`` list."""
        with self._lock:
            return {
                "name": name,
                "version": version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.to_dict(),
                    "fail": self.fail.to_dict(),
                    "queue": self.queue.to_dict(),
                    "compute_input": self.compute_input.to_dict(),
                    "compute_infer": self.compute_infer.to_dict(),
                    "compute_output": self.compute_output.to_dict(),
                    "cache_hit": {"count": 0, "ns": 0},
                    "cache_miss": {"count": 0, "ns": 0},
                },
                "batch_stats": [
                    {
                        "batch_size": rows,
                        "compute_input": d[0].to_dict(),
                        "compute_infer": d[1].to_dict(),
                        "compute_output": d[2].to_dict(),
                    }
                    for rows, d in sorted(self.batches.items())
                ],
                "memory_usage": [dict(m) for m in self.memory_usage],
            }
