"""The CUDA benchmark loop behind :func:`streamrt.profiling.bench.benchmark` (imports torch).

Per query, on one dedicated ``torch.cuda.Stream`` (never the default stream)::

    record h2d_start -> copy pinned inputs to the device (non_blocking) -> record h2d_end
    infer (host-timed: the enqueue time)                                 -> record compute_end
    copy outputs into pinned host buffers (non_blocking)                 -> record d2h_end

Events carry ``enable_timing=True``; their times are read with ``elapsed_time`` against an
origin event recorded (and waited for) when the run starts, which puts GPU and host timestamps
on one timeline in ms. Like trtexec, the loop keeps :data:`IN_FLIGHT` queries enqueued before it
waits for the oldest one, so host enqueueing overlaps GPU work. Reusing one set of device input
buffers is safe because every copy and kernel of every query runs in order on the same stream.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from streamrt.profiling.loops import BenchSettings, TimedRun
from streamrt.profiling.summary import IterationRecord

if TYPE_CHECKING:
    from streamrt.backends.base import ExecutionContext

__all__ = ["IN_FLIGHT", "cuda_loop"]

IN_FLIGHT = 2
"""Queries enqueued ahead of the one being waited for."""

_clock = time.perf_counter_ns


@dataclass
class _Query:
    h2d_start: torch.cuda.Event
    h2d_end: torch.cuda.Event
    compute_end: torch.cuda.Event
    d2h_end: torch.cuda.Event
    enq_start_ns: int = 0
    enq_end_ns: int = 0

    @classmethod
    def new(cls) -> _Query:
        def event() -> torch.cuda.Event:
            return torch.cuda.Event(enable_timing=True)

        return cls(event(), event(), event(), event())


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s data; bfloat16 (ml_dtypes) arrays go through their bits."""
    a = np.ascontiguousarray(array)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class _Runner:
    """Pinned host inputs, device buffers, pinned output buffers and the stream of one run."""

    def __init__(self, ctx: ExecutionContext, inputs: Mapping[str, np.ndarray]) -> None:
        self.ctx = ctx
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(device=self.device)
        self.pinned = {n: _host_tensor(a).pin_memory() for n, a in inputs.items()}
        with torch.cuda.stream(self.stream):
            self.buffers = {n: torch.empty_like(t, device=self.device) for n, t in self.pinned.items()}
        self.host_outputs: dict[str, torch.Tensor] = {}
        self.stream.synchronize()

    def enqueue(self, q: _Query) -> None:
        s = self.stream
        with torch.cuda.stream(s):
            q.h2d_start.record(s)
            for name, host in self.pinned.items():
                self.buffers[name].copy_(host, non_blocking=True)
            q.h2d_end.record(s)
            q.enq_start_ns = _clock()
            outputs = self.ctx.infer(self.buffers, s)
            q.enq_end_ns = _clock()
            q.compute_end.record(s)
            for name, out in outputs.items():
                self._host_buffer(name, out).copy_(out, non_blocking=True)
            q.d2h_end.record(s)

    def _host_buffer(self, name: str, out: torch.Tensor) -> torch.Tensor:
        buf = self.host_outputs.get(name)
        if buf is None or buf.shape != out.shape or buf.dtype != out.dtype:
            buf = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            self.host_outputs[name] = buf
        return buf


def cuda_loop(ctx: ExecutionContext, inputs: Mapping[str, np.ndarray], settings: BenchSettings) -> TimedRun:
    """Warm up, then time queries until both the duration and the iteration count are reached.

    Walltime runs on the host clock from the first timed enqueue to the last completion.
    """
    runner = _Runner(ctx, inputs)
    origin_event = torch.cuda.Event(enable_timing=True)
    origin_event.record(runner.stream)
    origin_event.synchronize()
    origin = _clock()

    free: list[_Query] = [_Query.new() for _ in range(IN_FLIGHT + 1)]
    pending: collections.deque[_Query] = collections.deque()

    def submit() -> None:
        q = free.pop()
        runner.enqueue(q)
        pending.append(q)

    def wait_oldest() -> _Query:
        q = pending.popleft()
        q.d2h_end.synchronize()
        return q

    warm = 0
    warm_end = origin + int(settings.warmup_ms * 1e6)
    while _clock() < warm_end:
        submit()
        warm += 1
        if len(pending) > IN_FLIGHT:
            free.append(wait_oldest())
    while pending:
        free.append(wait_oldest())
    runner.stream.synchronize()

    records: list[IterationRecord] = []
    start = _clock()
    deadline = start + int(settings.duration_s * 1e9)
    submitted = 0
    while submitted < settings.iterations or _clock() < deadline:
        submit()
        submitted += 1
        if len(pending) > IN_FLIGHT:
            q = wait_oldest()
            records.append(_record(q, origin_event, origin))
            free.append(q)
    while pending:
        q = wait_oldest()
        records.append(_record(q, origin_event, origin))
        free.append(q)
    end = _clock()
    return TimedRun(records, (end - start) / 1e9, warm, (start - origin) / 1e6)


def _record(q: _Query, origin_event: torch.cuda.Event, origin_ns: int) -> IterationRecord:
    """Convert a finished query's events (GPU clock) and host times into one record."""
    h2d_start = origin_event.elapsed_time(q.h2d_start)
    h2d_end = origin_event.elapsed_time(q.h2d_end)
    compute_end = origin_event.elapsed_time(q.compute_end)
    d2h_end = origin_event.elapsed_time(q.d2h_end)
    return IterationRecord(
        start_enq_ms=(q.enq_start_ns - origin_ns) / 1e6,
        end_enq_ms=(q.enq_end_ns - origin_ns) / 1e6,
        start_h2d_ms=h2d_start,
        end_h2d_ms=h2d_end,
        start_compute_ms=h2d_end,
        end_compute_ms=compute_end,
        start_d2h_ms=compute_end,
        end_d2h_ms=d2h_end,
    )
