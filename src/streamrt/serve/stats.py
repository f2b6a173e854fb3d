"""Per-model counters with Triton's meanings: one source for the statistics API and /metrics.

Semantics (Triton's ``extension_statistics.md`` and ``metrics.md``):

* ``success``/``fail``: requests, with their total server-side duration (receipt to response).
* ``queue``: per request, time from queueing to the start of its batch.
* ``compute_input``/``compute_infer``/``compute_output``: per request, the durations of the batch
  it ran in (gathering inputs, running the engine, splitting outputs).
* ``inference_count``: rows inferred (a batch of 8 counts 8); ``execution_count``: batches run.
* ``failures``: failed requests by reason (REJECTED, CANCELED, BACKEND, OTHER).

Example:
    >>> s = ModelStats()
    >>> s.record_batch(rows=4, requests=2, input_ns=10, infer_ns=100, output_ns=5)
    >>> s.inference_count, s.execution_count, s.compute_infer.ns
    (4, 1, 200)
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Duration", "ModelStats"]


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
        self.last_inference_ms = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.batches: dict[int, tuple[Duration, Duration, Duration]] = {}

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

    def record_queue(self, ns: int) -> None:
        with self._lock:
            self.queue.add(ns)

    def record_success(self, ns: int) -> None:
        with self._lock:
            self.success.add(ns)

    def record_failure(self, reason: str, ns: int) -> None:
        with self._lock:
            self.fail.add(ns)
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
                "memory_usage": [],
            }
