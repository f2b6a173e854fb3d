"""Host streams: worker threads with in-order queues and events, for machines without CUDA.

A :class:`HostStream` owns one daemon thread that runs launched callables in order. ``record``
queues a marker that completes its :class:`HostEvent` when the worker reaches it; ``wait`` queues
a barrier that blocks the worker until the event completes. That is the CUDA stream model with a
thread in place of a GPU queue, so the pipeline's scheduling logic runs unchanged, and is tested,
on a 2-core CI machine. An :class:`InlineStream` runs everything at once in the calling thread:
the naive synchronous loop.

Events use generations instead of one flag: ``record`` bumps the generation and ``wait`` snapshots
it at call time, so re-recording a pre-allocated event (as the pipeline's slot ring does) keeps
CUDA's "waits for the most recent record at the time of the call" semantics.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from streamrt._oom import INFER_HINT, out_of_memory_guard
from streamrt.device.base import BufferPool, Event, Stream, StreamWork
from streamrt.device.buffers import import_torch, torch_dtype
from streamrt.errors import PipelineClosedError, PipelineError

__all__ = ["CpuDevice", "HostEvent", "HostStream", "InlineStream"]

logger = logging.getLogger(__name__)

# How often a blocked worker looks at its cancel flag: short enough that close(cancel=True)
# returns promptly, long enough to cost nothing while waiting.
_CANCEL_POLL_S = 0.05


class HostEvent:
    """An event recorded on a host stream; ``timestamp`` is the host clock when it completed.

    Example:
        >>> ev = HostEvent()
        >>> ev.query()  # never recorded counts as complete, as in CUDA
        True
    """

    def __init__(self, timing: bool = False) -> None:
        self._timing = timing
        self._cond = threading.Condition()
        self._recorded = 0
        self._completed = 0
        self._timestamp: float | None = None

    @property
    def is_cuda(self) -> bool:
        return False

    @property
    def timing(self) -> bool:
        return self._timing

    @property
    def timestamp(self) -> float | None:
        """``time.perf_counter()`` at the latest completion, None before the first."""
        return self._timestamp

    @property
    def generation(self) -> int:
        """The number of the most recent record; waits snapshot it."""
        return self._recorded

    def arm(self) -> int:
        """Start a new record and return its generation (the stream fires it later)."""
        with self._cond:
            self._recorded += 1
            return self._recorded

    def fire(self, generation: int) -> None:
        """Mark ``generation`` complete and wake every waiter."""
        with self._cond:
            if generation > self._completed:
                self._completed = generation
                self._timestamp = time.perf_counter()
            self._cond.notify_all()

    def reached(self, generation: int) -> bool:
        """Whether record ``generation`` (or a later one) has completed."""
        return self._completed >= generation

    def wait_generation(self, generation: int, timeout: float | None) -> bool:
        """Block until record ``generation`` completed or ``timeout`` passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._completed >= generation, timeout)

    def query(self) -> bool:
        return self._completed >= self._recorded

    def synchronize(self) -> None:
        self.wait_generation(self._recorded, None)

    def wait(self, timeout: float | None = None) -> bool:
        return self.wait_generation(self._recorded, timeout)

    def elapsed_ms(self, end: Event) -> float:
        if not isinstance(end, HostEvent):
            raise PipelineError("elapsed_ms between a host event and a CUDA event is undefined")
        if not (self._timing and end.timing):
            raise PipelineError("elapsed_ms needs both events created with timing=True")
        if self._timestamp is None or end.timestamp is None:
            raise PipelineError("elapsed_ms needs both events completed")
        return (end.timestamp - self._timestamp) * 1e3


def _as_host_event(event: Event | None, timing: bool = False) -> HostEvent:
    if event is None:
        return HostEvent(timing)
    if not isinstance(event, HostEvent):
        raise PipelineError(f"a host stream can only record host events, got {type(event).__name__}")
    return event


_STOP = object()
_CALL, _WAIT, _RECORD = 0, 1, 2


class _HostStreamBase:
    """What every host stream shares: a name, no raw handle, host events."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def handle(self) -> int:
        return 0

    @property
    def is_cuda(self) -> bool:
        return False

    @property
    def torch_stream(self) -> None:
        """None: work on a host stream runs on a thread, not on a CUDA stream."""
        return None

    def new_event(self, timing: bool = False) -> HostEvent:
        return HostEvent(timing)


class HostStream(_HostStreamBase):
    """A worker thread that runs launched callables in order (see the module docstring).

    Example:
        >>> s = HostStream("decode")
        >>> s.launch(lambda: None)
        >>> s.record().wait(timeout=5)
        True
        >>> s.close()
        True
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"streamrt:{name}", daemon=True)
        self._thread.start()

    @property
    def thread_name(self) -> str:
        """Name of the worker thread (the track its work shows up on in traces)."""
        return self._thread.name

    def _put(self, op: Any) -> None:
        with self._lock:
            if self._closed:
                raise PipelineClosedError(f"host stream '{self._name}' is closed")
            self._queue.put(op)

    def launch(self, fn: StreamWork) -> None:
        self._put((_CALL, fn))

    def record(self, event: Event | None = None) -> HostEvent:
        ev = _as_host_event(event)
        self._put((_RECORD, (ev, ev.arm())))
        return ev

    def wait(self, event: Event) -> None:
        if isinstance(event, HostEvent):
            generation = event.generation
            if not event.reached(generation):
                self._put((_WAIT, (event, generation)))
        elif not event.query():
            self._put((_WAIT, (event, 0)))

    def synchronize(self) -> None:
        if self._thread.is_alive() and not self._closed:
            self.record().synchronize()
        if self._errors:
            first = self._errors[0]
            self._errors.clear()
            raise PipelineError(
                f"work on host stream '{self._name}' failed: {type(first).__name__}: {first}"
            ) from first

    def close(self, *, cancel: bool = False, timeout: float | None = None) -> bool:
        with self._lock:
            if not self._closed:
                self._closed = True
                if cancel:
                    self._cancel.set()
                self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("host stream '%s' did not stop within %s s: a callable is stuck",
                           self._name, timeout)
            return False
        return True

    def _block(self, event: Event, generation: int) -> None:
        if isinstance(event, HostEvent):
            while not event.wait_generation(generation, _CANCEL_POLL_S):
                if self._cancel.is_set():
                    return
        else:
            event.synchronize()  # a CUDA event: the GPU finishes the work, no cancel needed

    def _run(self) -> None:
        while True:
            op = self._queue.get()
            if op is _STOP:
                return
            kind, arg = op
            if kind == _RECORD:
                arg[0].fire(arg[1])  # always fire, even when cancelled, so no waiter hangs
            elif self._cancel.is_set():
                continue
            elif kind == _WAIT:
                self._block(*arg)
            else:
                try:
                    arg()
                except Exception as exc:
                    logger.debug("work on host stream '%s' raised", self._name, exc_info=True)
                    self._errors.append(exc)
            # Drop the finished work now, not when the next item arrives: it may hold request data
            # (the server's shared-memory regions cannot be unmapped while anything views them).
            op = kind = arg = None


class InlineStream(_HostStreamBase):
    """A host "stream" that runs work at once in the calling thread, and waits by blocking it.

    Used by the synchronous topology: the plain loop a user writes, no threads involved.
    Exceptions from launched work propagate to the caller immediately.
    """

    def launch(self, fn: StreamWork) -> None:
        if self._closed:
            raise PipelineClosedError(f"stream '{self._name}' is closed")
        fn()

    def record(self, event: Event | None = None) -> HostEvent:
        ev = _as_host_event(event)
        ev.fire(ev.arm())
        return ev

    def wait(self, event: Event) -> None:
        event.synchronize()

    def synchronize(self) -> None:
        return None

    def close(self, *, cancel: bool = False, timeout: float | None = None) -> bool:
        self._closed = True
        return True


class CpuDevice:
    """The host device: streams are worker threads, buffers are ordinary CPU tensors.

    ``pinned`` is accepted and ignored: page-locking needs CUDA, and nothing here copies to a GPU.
    """

    def __init__(self) -> None:
        self._streams: weakref.WeakSet[HostStream] = weakref.WeakSet()

    def __repr__(self) -> str:
        return "CpuDevice()"

    @property
    def kind(self) -> str:
        return "cpu"

    @property
    def is_cuda(self) -> bool:
        return False

    @property
    def torch_device(self) -> Any:
        return import_torch().device("cpu")

    def _worker(self, name: str) -> HostStream:
        stream = HostStream(name)
        self._streams.add(stream)
        return stream

    def stream(self, name: str, *, priority: int = 0) -> Stream:
        return self._worker(name)

    def host_stream(self, name: str, *, inline: bool = False) -> Stream:
        return InlineStream(name) if inline else self._worker(name)

    def host_buffer(self, shape: Sequence[int], dtype: Any, *, pinned: bool = True) -> Any:
        return import_torch().empty(tuple(shape), dtype=torch_dtype(dtype))

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        # torch's CPU allocator fails with a RuntimeError; say out of memory, with the size.
        with out_of_memory_guard(f"allocating a {'x'.join(map(str, shape))} {dtype} tensor on the cpu", INFER_HINT):
            return import_torch().empty(tuple(shape), dtype=torch_dtype(dtype))

    def pool(
        self, shape: Sequence[int], dtype: Any, count: int, *, host: bool = False, pinned: bool = True
    ) -> BufferPool[Any]:
        return BufferPool([self.empty(shape, dtype) for _ in range(count)])

    def synchronize(self) -> None:
        for stream in list(self._streams):
            stream.synchronize()
