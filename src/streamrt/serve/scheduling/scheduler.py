"""The per-model scheduler: an asyncio task that feeds free instances from the batch queue.

Everything here runs on the server's event loop, so the queue needs no locks: requests are queued
by the front ends' handlers, batches are cut when an instance is idle (:class:`BatchQueue` decides
which and when), instances run them on their worker threads, and each completion comes back to
the loop with one ``call_soon_threadsafe`` per batch. The loop sleeps until the next thing that
can change a decision: an arrival, a completion, the batching delay running out, or the earliest
queued request's timeout, so timeouts fire on time even while every instance is busy.

With the server's rate limiter on (:mod:`streamrt.serve.execution.rate_limiter`), a cut batch waits for its
instance's grant before it runs (that wait counts as queue time), and the instance returns its
resources when the batch's completion reaches the loop (waiting again at once when its next batch is ready).

Every queued request gets exactly one outcome: its outputs, the batch's error, a timeout, or a
shutdown error; a request whose client went away is dropped from the queue unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from streamrt.errors import ModelNotReadyError, RequestTimeoutError, ServerShuttingDownError
from streamrt.serve.configs.config import BatchingConfig
from streamrt.serve.execution.instances import BatchResult
from streamrt.serve.execution.rate_limiter import Ticket
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.batcher import BatchQueue, Pending
from streamrt.serve.scheduling.timers import wake_at

__all__ = ["ModelScheduler"]

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


class Executor(Protocol):
    """What runs a batch: an engine :class:`~streamrt.serve.execution.instances.Instance`, or a Python model's."""

    name: str
    rate_limit: Ticket | None  # its place in the server's rate limiter (None: not limited)

    def submit(self, requests: Sequence[Mapping[str, np.ndarray]],
               done: Callable[[BatchResult | BaseException], None]) -> None: ...


class Executors(Protocol):
    """A model version's executors (:class:`~streamrt.serve.execution.instances.InstanceGroup` or a Python model's)."""

    @property
    def instances(self) -> Sequence[Executor]: ...

    def close(self, timeout: float | None = None) -> None: ...


@dataclass(eq=False)
class _Job:
    inputs: Mapping[str, np.ndarray]
    future: asyncio.Future[Outputs]
    enqueued_ns: int
    trace: RequestTrace | None = None


class ModelScheduler:
    """Queue + dynamic batcher + instance dispatch for one model version.

    Args:
        name: ``<model>`` or ``<model>:<version>`` for messages.
        instances: the version's instances (idle at start).
        max_batch_size: rows per execution (1 for models without a batch dimension).
        batching: dynamic batching settings, or None to run every request alone.
        stats: counters to update (queue time, batches).
    """

    def __init__(
        self,
        name: str,
        instances: Executors,
        *,
        max_batch_size: int,
        batching: BatchingConfig | None,
        stats: ModelStats,
    ) -> None:
        self.name = name
        self.stats = stats
        self._instances = instances
        self._queue = BatchQueue(max_batch_size, batching, is_dead=lambda p: p.payload.future.done())
        self._idle: deque[Executor] = deque(instances.instances)
        self._running = 0
        self._active: dict[int, list[Pending]] = {}
        self._closing = False
        self._stopped = False
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name=f"scheduler-{name}")

    @property
    def pending(self) -> int:
        """Requests waiting in the queue (``nv_inference_pending_request_count``)."""
        return len(self._queue)

    def level_for(self, priority: int) -> int:
        """Validate a request's priority against the model's levels (raises RequestError)."""
        return self._queue.level_for(priority)

    async def submit(
        self, inputs: Mapping[str, np.ndarray], *, rows: int, key: Hashable, priority: int = 0, timeout_us: int = 0,
        trace: RequestTrace | None = None,
    ) -> Outputs:
        """Queue one request and wait for its outputs.

        Raises:
            QueueFullError: the queue is at ``max_queue_size``.
            RequestTimeoutError: the request's queue timeout passed before it ran.
            ModelNotReadyError: the model is being unloaded.
            InferenceError: the batch it ran in failed.
        """
        if self._closing:
            raise ModelNotReadyError(f"model '{self.name}' is unloading and accepts no new requests")
        future: asyncio.Future[Outputs] = self._loop.create_future()
        job = _Job(inputs, future, time.perf_counter_ns(), trace)
        if trace is not None:
            trace.mark("QUEUE_START", job.enqueued_ns)
        item = Pending(job, rows=rows, key=key, enqueued=time.monotonic())
        self._queue.push(item, priority=priority, timeout_us=timeout_us)
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        loop = self._loop
        while True:
            now = time.monotonic()
            for item in self._queue.expire(now):
                waited_ms = (now - item.enqueued) * 1e3
                self._fail(item, RequestTimeoutError(
                    f"model '{self.name}': request timed out after {waited_ms:.1f} ms in the queue",
                    hint="raise the request's timeout or the model's default_timeout_microseconds",
                ))
            wake: float | None = None
            while self._idle and len(self._queue):
                batch, wake = self._queue.next_batch(now)
                if batch is None:
                    break
                self._dispatch(self._idle.popleft(), batch)
            batch = None  # this frame must not keep the last batch's inputs (request views) alive while it waits
            if self._closing and not len(self._queue) and self._running == 0:
                self._drained.set()
            deadlines = [d for d in (wake, self._queue.next_deadline()) if d is not None]
            handle = None
            if deadlines:
                handle = wake_at(loop, min(deadlines), self._wakeup.set)
            await self._wakeup.wait()
            self._wakeup.clear()
            if handle is not None:
                handle.cancel()

    def _dispatch(self, instance: Executor, batch: list[Pending]) -> None:
        self._running += 1
        self._active[id(batch)] = batch
        if instance.rate_limit is None:
            self._launch(instance, batch)
        else:
            self._stage(instance, batch)

    def _stage(self, instance: Executor, batch: list[Pending]) -> None:
        """Run ``batch`` once the rate limiter grants ``instance`` (the grant may come from another thread)."""
        ticket = instance.rate_limit
        assert ticket is not None
        ticket.stage(ticket.on_loop(self._loop, self._launch, instance, batch))

    def _release(self, instance: Executor) -> None:
        """Return a finished instance's resources; when its next batch is ready, it waits for the next
        grant in the same step (so it competes by priority, as in Triton), else it goes idle."""
        ticket = instance.rate_limit
        assert ticket is not None
        batch = None
        if len(self._queue):
            batch, _ = self._queue.next_batch(time.monotonic())
        if batch is None:
            ticket.release()
            self._idle.append(instance)
            return
        self._running += 1
        self._active[id(batch)] = batch
        ticket.release(then=ticket.on_loop(self._loop, self._launch, instance, batch))

    def _launch(self, instance: Executor, batch: list[Pending]) -> None:
        ticket = instance.rate_limit
        if self._stopped:  # granted after close gave up on this batch and closed the instances
            if ticket is not None:
                ticket.release()
            return
        start = time.perf_counter_ns()
        for item in batch:
            self.stats.record_queue(start - item.payload.enqueued_ns)
            if item.payload.trace is not None:
                item.payload.trace.mark("COMPUTE_START", start)

        def done(result: BatchResult | BaseException) -> None:
            try:
                self._loop.call_soon_threadsafe(self._complete, instance, batch, result)
            except RuntimeError:  # the loop is closed: the server is gone, nobody waits
                log.debug("batch of %s finished after the event loop closed", self.name)

        instance.submit([item.payload.inputs for item in batch], done)

    def _complete(self, instance: Executor, batch: list[Pending], result: BatchResult | BaseException) -> None:
        self._running -= 1
        self._active.pop(id(batch), None)
        if instance.rate_limit is not None and not self._stopped:
            self._release(instance)
        else:
            self._idle.append(instance)
        self._wakeup.set()
        if isinstance(result, BaseException):
            log.warning("model '%s': a batch of %d requests failed on %s: %s", self.name, len(batch),
                        instance.name, result)
            for item in batch:
                self._fail(item, result)
            return
        self.stats.record_batch(result.rows, len(batch), result.input_ns, result.infer_ns, result.output_ns)
        self._trace_compute(batch, result)
        for index, (item, outputs) in enumerate(zip(batch, result.outputs, strict=True)):
            error = result.errors.get(index) if result.errors else None
            if error is not None:
                self._fail(item, error)  # this request alone failed (a Python model's response error)
            elif not item.payload.future.done():
                item.payload.future.set_result(outputs)

    @staticmethod
    def _trace_compute(batch: list[Pending], result: BatchResult) -> None:
        """COMPUTE_INPUT_END, COMPUTE_OUTPUT_START and COMPUTE_END of the traced requests of a batch.

        The instance reports durations, not times: the engine run is placed so that it ends
        ``output_ns`` before now (the hand-back to the loop is counted in COMPUTE_END only)."""
        traces = [item.payload.trace for item in batch if item.payload.trace is not None]
        if not traces:
            return
        end = time.perf_counter_ns()
        output_start = end - result.output_ns
        for trace in traces:
            trace.mark("COMPUTE_INPUT_END", output_start - result.infer_ns)
            trace.mark("COMPUTE_OUTPUT_START", output_start)
            trace.mark("COMPUTE_END", end)

    @staticmethod
    def _fail(item: Pending, error: BaseException) -> None:
        if not item.payload.future.done():
            item.payload.future.set_exception(error)

    async def close(self, timeout: float) -> None:
        """Stop accepting; let queued and running requests finish for up to ``timeout`` seconds;
        fail what is left with :class:`ServerShuttingDownError`; release the instances."""
        self._closing = True
        self._wakeup.set()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("model '%s': %d queued and %d running batches left after %.1f s", self.name,
                        len(self._queue), self._running, timeout)
        for item in self._queue.drain():
            self._fail(item, ServerShuttingDownError(f"model '{self.name}' was unloaded before the request ran"))
        for batch in list(self._active.values()):
            for item in batch:
                self._fail(item, ServerShuttingDownError(
                    f"model '{self.name}': the request was still running when the shutdown timeout passed"))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._stopped = True
        await asyncio.get_running_loop().run_in_executor(None, self._instances.close, max(timeout, 1.0))
