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

The loop itself, the batch launch and the shutdown are :class:`~streamrt.serve.scheduling.loop.SchedulerLoop`'s;
this module supplies the decisions: expiry, batch cutting, the rate limiter's hand-over.

Every queued request gets exactly one outcome: its outputs, the batch's error, a timeout, or a
shutdown error; a request whose client went away is dropped from the queue unanswered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from streamrt.errors import ModelNotReadyError, RequestTimeoutError
from streamrt.serve.configs.config import BatchingConfig
from streamrt.serve.execution.instances import BatchResult
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.batcher import BatchQueue, Pending
from streamrt.serve.scheduling.loop import Executor, Executors, Job, SchedulerLoop

__all__ = ["ModelScheduler"]

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass(eq=False)
class _Job:
    inputs: Mapping[str, np.ndarray]
    future: asyncio.Future[Outputs]
    enqueued_ns: int
    trace: RequestTrace | None = None


def lane_order(instances: Sequence[Executor]) -> list[Executor]:
    """Each instance once per batch it takes at once (its lanes; one under the rate limiter, whose grant is
    per instance), the instances' first lanes first, so that batches spread over instances before they queue
    behind one."""
    lanes = [1 if each.rate_limit is not None else max(1, each.lanes) for each in instances]
    return [each for lane in range(max(lanes, default=0))
            for each, count in zip(instances, lanes, strict=True) if lane < count]


class ModelScheduler(SchedulerLoop[list[Pending]]):
    """Queue + dynamic batcher + instance dispatch for one model version.

    Args:
        name: ``<model>`` or ``<model>:<version>`` for messages.
        instances: the version's instances (idle at start; an instance with several lanes takes that many batches).
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
        self._queue = BatchQueue(max_batch_size, batching, is_dead=lambda p: p.payload.future.done())
        self._idle: deque[Executor] = deque(lane_order(instances.instances))
        super().__init__(name, instances, stats, task=f"scheduler-{name}")

    @property
    def pending(self) -> int:
        """Requests waiting in the queue (``nv_inference_pending_request_count``)."""
        return len(self._queue)

    def level_for(self, priority: int) -> int:
        """Validate a request's priority against the model's levels (raises RequestError)."""
        return self._queue.level_for(priority)

    def submit(
        self, inputs: Mapping[str, np.ndarray], *, rows: int, key: Hashable, priority: int = 0, timeout_us: int = 0,
        trace: RequestTrace | None = None,
    ) -> asyncio.Future[Outputs]:
        """Queue one request; the future of its outputs (a plain function: one coroutine frame fewer
        for every request to suspend and resume through). Cancelling the future drops the request.

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
        now = time.monotonic()
        item = Pending(job, rows=rows, key=key, enqueued=now)
        self._queue.push(item, priority=priority, timeout_us=timeout_us)
        if not self._armed_for_delay(now):
            self._wakeup.set()
        return future

    def _armed_for_delay(self, now: float) -> bool:
        """The queue waits for its batching delay and the loop's wake-up is set for that moment: a
        pass now would decide nothing new."""
        until = self._queue.waiting_until(now)
        return until is not None and self._armed is not None and self._armed.pending and until == self._armed_for

    # --- the loop's decisions ---------------------------------------------------------------------

    def _step(self, now: float) -> list[float]:
        """Fail the timed-out requests, cut batches for the idle instances; wake at the batching
        delay's end or the earliest queued request's timeout."""
        waiting = self._queue.waiting_until(now)
        if waiting is not None:  # the batch waits for its delay: nothing to expire or cut yet
            return [waiting]
        for item in self._queue.expire(now):
            waited_ms = (now - item.enqueued) * 1e3
            self._fail(item.payload, RequestTimeoutError(
                f"model '{self.name}': request timed out after {waited_ms:.1f} ms in the queue",
                hint="raise the request's timeout or the model's default_timeout_microseconds",
            ))
        wake: float | None = None
        while self._idle and len(self._queue):
            batch, wake = self._queue.next_batch(now)
            if batch is None:
                break
            self._dispatch(self._idle.popleft(), batch)
        return [d for d in (wake, self._queue.next_deadline()) if d is not None]

    def _jobs(self, batch: list[Pending]) -> list[Job]:
        return [item.payload for item in batch]

    def _drain(self) -> list[Job]:
        return [item.payload for item in self._queue.drain()]

    # --- a batch ------------------------------------------------------------------------------------

    def _dispatch(self, instance: Executor, batch: list[Pending], *, releasing: bool = False) -> None:
        self._start(instance, batch, [item.payload.inputs for item in batch], partial(self._complete, instance, batch),
                    releasing=releasing)

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
        self._dispatch(instance, batch, releasing=True)

    def _complete(self, instance: Executor, batch: list[Pending], result: BatchResult | BaseException) -> None:
        self._active.pop(id(batch), None)
        if instance.rate_limit is not None and not self._stopped:
            self._release(instance)
        else:
            self._idle.append(instance)
        self._wakeup.set()
        if isinstance(result, BaseException):
            log.warning("model '%s': a batch of %d requests failed on %s: %s", self.name, len(batch),
                        instance.name, result, exc_info=result)  # the stack: where in the instance it failed
            for item in batch:
                self._fail(item.payload, result)
            return
        self.stats.record_batch(result.rows, len(batch), result.input_ns, result.infer_ns, result.output_ns)
        self._trace_compute(batch, result)
        for index, (item, outputs) in enumerate(zip(batch, result.outputs, strict=True)):
            error = result.errors.get(index) if result.errors else None
            if error is not None:
                self._fail(item.payload, error)  # this request alone failed (a Python model's response error)
            elif not item.payload.future.done():
                item.payload.future.set_result(outputs)
