"""The loop under both schedulers: one asyncio task per model version that wakes, decides, and
sleeps until the next deadline.

:class:`~streamrt.serve.scheduling.scheduler.ModelScheduler` (the dynamic batcher) and
:class:`~streamrt.serve.scheduling.sequence.SequenceScheduler` (Triton's sequence batcher) decide
differently which requests run together; everything around that decision is the same and lives
here:

* the wake/wait loop: each pass runs one :meth:`SchedulerLoop._step` (expire, form, dispatch),
  which returns the times at which a decision can change; the task sleeps until the earliest of
  them (on the timer thread, :func:`~streamrt.serve.scheduling.timers.wake_at`) or until an
  arrival or a completion sets the wake-up event;
* running a formed batch: with the rate limiter on, after the instance's grant (the wait counts
  as queue time); the queue-time and ``COMPUTE_START`` marks; the completion handed back to the
  loop with one ``call_soon_threadsafe`` per batch; the ``COMPUTE_*`` marks of the result;
* :meth:`SchedulerLoop.close`: drain with a timeout, fail what is left with
  :class:`~streamrt.errors.ServerShuttingDownError`, stop the task, close the instances off the
  loop.

A scheduler supplies its decisions: :meth:`~SchedulerLoop._step`, :attr:`~SchedulerLoop.pending`,
:meth:`~SchedulerLoop._jobs` (the requests of a batch) and :meth:`~SchedulerLoop._drain` (take
every queued request out), and forms, dispatches (through :meth:`~SchedulerLoop._start`) and
completes its batches itself.

Example:
    >>> class Alone(SchedulerLoop[list[Job]]):  # doctest: +SKIP
    ...     def _step(self, now):  # each queued request alone on the first idle instance
    ...         while self.queue and self.idle:
    ...             batch = [self.queue.popleft()]
    ...             instance = self.idle.popleft()
    ...             self._start(instance, batch, [j.inputs for j in batch], partial(self._complete, instance, batch))
    ...         return []  # no timers: only an arrival or a completion changes anything
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from streamrt.errors import ServerShuttingDownError
from streamrt.serve.execution.instances import BatchResult
from streamrt.serve.execution.rate_limiter import Ticket
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.timers import Cancellable, wake_at

__all__ = ["Executor", "Executors", "Job", "SchedulerLoop"]

BatchT = TypeVar("BatchT")

Completion = Callable[[BatchResult | BaseException], None]
"""What a batch's outcome is handed to, on the loop (a scheduler's ``_complete`` bound to the batch)."""


def _let_the_instance_start() -> None:
    """Give up this core (and the GIL) for a moment, so that the instance thread just handed a batch runs it now.

    Without it the instance thread waited for a core while the event loop went on with other requests:
    250 us (p50) and 730-800 us (p90) from the hand-over to the batch's first step on the 2-core CPU machine,
    64 B gRPC requests through h2corn; with it 66-69 us and ~510 us, and 5,743-5,747 instead of 5,363-5,502
    requests/s at less CPU per request (docs/benchmarks/2026-12-04-grpc-path-cpu.md). The batch carries the
    replies of all its requests; the loop's next request can wait the few tens of microseconds its first
    Python steps take. With nobody else runnable on this core the call returns at once."""
    if _SCHED_YIELD is not None:
        _SCHED_YIELD()


_SCHED_YIELD: Callable[[], None] | None = getattr(os, "sched_yield", None)


class _Signal:
    """``asyncio.Event`` for the one task that waits on it, without the Event's per-wait loop check
    and waiter deque (the scheduler waits once per pass)."""

    __slots__ = ("_flag", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    async def wait(self) -> None:
        if self._flag:
            return
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class Executor(Protocol):
    """What runs a batch: an engine :class:`~streamrt.serve.execution.instances.Instance`, or a Python model's."""

    name: str
    rate_limit: Ticket | None  # its place in the server's rate limiter (None: not limited)
    lanes: int  # batches it takes at once (an engine instance stages one while another runs)

    def submit(self, requests: Sequence[Mapping[str, Any]],
               done: Callable[[BatchResult | BaseException], None]) -> None: ...


class Executors(Protocol):
    """A model version's executors (:class:`~streamrt.serve.execution.instances.InstanceGroup` or a Python model's)."""

    @property
    def instances(self) -> Sequence[Executor]: ...

    def close(self, timeout: float | None = None) -> None: ...


class Job(Protocol):
    """One queued request, as the loop sees it: whom to answer, since when it waits, its trace."""

    @property
    def future(self) -> asyncio.Future[Any]: ...

    @property
    def enqueued_ns(self) -> int: ...  # perf_counter_ns at arrival (queue time, QUEUE_START)

    @property
    def trace(self) -> RequestTrace | None: ...


class SchedulerLoop(ABC, Generic[BatchT]):
    """The task, the running batches and the shutdown of one model version's scheduler.

    ``BatchT`` is the scheduler's batch (a list of its queue entries); :attr:`_active` holds the
    batches that were dispatched and have not completed, keyed by ``id``. Every request gets
    exactly one outcome: the subclass answers the ones that ran, the loop fails the ones left at
    :meth:`close`.

    Args:
        name: ``<model>`` or ``<model>:<version>`` for messages.
        instances: the version's instances; closed at the end of :meth:`close`.
        stats: counters to update (queue time; the subclass records batches).
        task: the asyncio task's name.
    """

    _QUEUED: ClassVar[str] = ""
    """What the queued count is of, in :meth:`close`'s timeout warning (after "queued")."""

    def __init__(self, name: str, instances: Executors, stats: ModelStats, *, task: str) -> None:
        self.name = name
        self.stats = stats
        self._instances = instances
        self._active: dict[int, BatchT] = {}
        self._closing = False
        self._stopped = False
        self._loop = asyncio.get_running_loop()
        self._wakeup = _Signal(self._loop)
        self._armed: Cancellable | None = None
        """The wake-up set for the earliest deadline :meth:`_step` returned (:attr:`_armed_for`)."""
        self._armed_for = 0.0
        self._drained = asyncio.Event()
        self._log = logging.getLogger(type(self).__module__)  # the scheduler's own logger, not this module's
        # The task's first pass runs once the caller yields, after the subclass's __init__ is done.
        self._task = self._loop.create_task(self._run(), name=task)

    # --- what a scheduler supplies ---------------------------------------------------------------

    @property
    @abstractmethod
    def pending(self) -> int:
        """Requests waiting to run (``nv_inference_pending_request_count``)."""

    @abstractmethod
    def _step(self, now: float) -> list[float]:
        """One pass of the loop at ``now`` (``time.monotonic``): expire, form and dispatch what can
        run; returns the times at which to look again (empty: only an arrival or a completion)."""

    @abstractmethod
    def _jobs(self, batch: BatchT) -> list[Job]:
        """The requests of ``batch`` (fillers left out)."""

    @abstractmethod
    def _drain(self) -> list[Job]:
        """Take every queued request out of the queue (at :meth:`close`, after the drain timeout)."""

    # --- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        # _step is a call of its own so that no local of it (a batch's inputs: request views)
        # stays alive while the loop sleeps.
        # The wake-up set for the earliest deadline stays set while that deadline stays the earliest:
        # requests joining a forming batch do not move it, and re-arming it per arrival cost a timer
        # wake-up each time.
        while True:
            deadlines = self._step(time.monotonic())
            if self._closing and not self.pending and not self._active:
                self._drained.set()
            due = min(deadlines) if deadlines else None
            if self._armed is not None and (due != self._armed_for or not self._armed.pending):
                self._armed.cancel()
                self._armed = None
            if self._armed is None and due is not None:
                self._armed_for, self._armed = due, wake_at(self._loop, due, self._wakeup.set)
            await self._wakeup.wait()
            self._wakeup.clear()

    # --- a batch ---------------------------------------------------------------------------------

    def _start(self, instance: Executor, batch: BatchT, requests: Sequence[Mapping[str, Any]],
               complete: Completion, *, releasing: bool = False) -> None:
        """Count ``batch`` as running and run it on ``instance``: at once, or once the rate limiter
        grants the instance (the grant may come from another thread).

        ``releasing``: the instance still holds the grant of the batch that just completed; it
        gives it back and waits for the next one in the same step (so it competes by priority,
        as in Triton)."""
        self._active[id(batch)] = batch
        ticket = instance.rate_limit
        if ticket is None:
            self._launch(instance, batch, requests, complete)
            return
        granted = ticket.on_loop(self._loop, self._launch, instance, batch, requests, complete)
        if releasing:
            ticket.release(then=granted)
        else:
            ticket.stage(granted)

    def _launch(self, instance: Executor, batch: BatchT, requests: Sequence[Mapping[str, Any]],
                complete: Completion) -> None:
        """Submit a formed batch to its instance; ``complete`` gets the outcome on the loop. The
        wait for a grant counts as queue time."""
        ticket = instance.rate_limit
        if self._stopped:  # granted after close gave up on this batch and closed the instances
            if ticket is not None:
                ticket.release()
            return
        start = time.perf_counter_ns()
        for job in self._jobs(batch):
            self.stats.record_queue(start - job.enqueued_ns)
            if job.trace is not None:
                job.trace.mark("COMPUTE_START", start)

        def done(result: BatchResult | BaseException) -> None:
            try:
                self._loop.call_soon_threadsafe(complete, result)
            except RuntimeError:  # the loop is closed: the server is gone, nobody waits
                self._log.debug("batch of %s finished after the event loop closed", self.name)

        instance.submit(requests, done)
        _let_the_instance_start()

    def _trace_compute(self, batch: BatchT, result: BatchResult) -> None:
        """COMPUTE_INPUT_END, COMPUTE_OUTPUT_START and COMPUTE_END of the traced requests of a batch.

        The instance reports durations, not times: the engine run is placed so that it ends
        ``output_ns`` before now (the hand-back to the loop is counted in COMPUTE_END only)."""
        traces = [job.trace for job in self._jobs(batch) if job.trace is not None]
        if not traces:
            return
        end = time.perf_counter_ns()
        output_start = end - result.output_ns
        for trace in traces:
            trace.mark("COMPUTE_INPUT_END", output_start - result.infer_ns)
            trace.mark("COMPUTE_OUTPUT_START", output_start)
            trace.mark("COMPUTE_END", end)

    @staticmethod
    def _fail(job: Job, error: BaseException) -> None:
        if not job.future.done():
            job.future.set_exception(error)

    # --- shutdown --------------------------------------------------------------------------------

    async def close(self, timeout: float) -> None:
        """Stop accepting; let queued and running requests finish for up to ``timeout`` seconds;
        fail what is left with :class:`ServerShuttingDownError`; release the instances."""
        self._closing = True
        self._wakeup.set()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except asyncio.TimeoutError:
            self._log.warning("model '%s': %d queued%s and %d running batches left after %.1f s", self.name,
                              self.pending, self._QUEUED, len(self._active), timeout)
        for job in self._drain():
            self._fail(job, ServerShuttingDownError(f"model '{self.name}' was unloaded before the request ran"))
        for batch in list(self._active.values()):
            for job in self._jobs(batch):
                self._fail(job, ServerShuttingDownError(
                    f"model '{self.name}': the request was still running when the shutdown timeout passed"))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._stopped = True
        await asyncio.get_running_loop().run_in_executor(None, self._instances.close, max(timeout, 1.0))
