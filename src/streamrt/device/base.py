"""Protocols of the device layer: streams, events and devices.

A :class:`Stream` is an in-order queue of work; an :class:`Event` marks a point in one stream
that other streams and the host can wait for. Two implementations share these semantics:

* ``cuda`` (:mod:`streamrt.device.cuda`): ``torch.cuda.Stream`` / ``torch.cuda.Event``. Work is
  *enqueued* by the calling thread with the stream made current; the GPU runs it later.
* ``host`` (:mod:`streamrt.device.host`): each stream is a worker thread that runs submitted
  callables in order; events are markers in that order. An *inline* host stream runs work at
  once in the calling thread (the synchronous baseline uses it).

So that the pipeline has one code path, every stream offers :meth:`Stream.launch`: "run this
callable in your order". For a CUDA stream that means "call it now, with this stream current, so
the kernels it launches land on this stream"; for a host stream "run it on the worker thread
after everything queued before it".

Semantics both implementations keep:

* ``record()`` marks the point after all work launched so far; ``wait(event)`` makes later work
  on this stream wait for the *most recent* record of ``event`` at the time of the call.
* An event that was never recorded counts as complete (as in CUDA).
* Errors raised by work on a host worker thread are kept and raised by the stream's next
  ``synchronize()``, the way CUDA reports asynchronous errors at the next synchronisation.
* A CUDA stream cannot wait on the GPU for a host event that is still pending; the pipeline
  avoids this by launching such CUDA work from the host stream that records the event.

Allocator safety across streams (the choice StreamRT makes, :class:`BufferPool`): **event-gated
reuse**, not ``Tensor.record_stream``. A buffer is pre-allocated once and handed out again only
after an event recorded behind its last consumer has completed. ``record_stream`` makes reuse
depend on the caching allocator's bookkeeping (non-deterministic, and it can look like a leak);
gating on our own events keeps reuse explicit and also works for CUDA-graph static buffers.

Example:
    >>> from streamrt.device import get_device
    >>> dev = get_device("cpu")
    >>> s1, s2 = dev.stream("copy"), dev.stream("compute")
    >>> out = []
    >>> s1.launch(lambda: out.append("copied"))
    >>> s2.wait(s1.record())
    >>> s2.launch(lambda: out.append("computed"))
    >>> s2.synchronize(); out
    ['copied', 'computed']
    >>> s1.close(); s2.close()
    True
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar, Union, runtime_checkable

from streamrt.errors import PipelineError, StageTimeoutError

if TYPE_CHECKING:
    import torch

__all__ = ["BufferPool", "Device", "Event", "Stream", "StreamLike", "StreamWork"]

T = TypeVar("T")

StreamWork = Callable[[], object]
"""A callable a stream runs in its order (its return value is ignored)."""


@runtime_checkable
class Event(Protocol):
    """A point in a stream's order that streams and the host can wait for."""

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA event (device-side waits possible), False for a host event."""
        ...

    @property
    def timing(self) -> bool:
        """Whether :meth:`elapsed_ms` is available."""
        ...

    def query(self) -> bool:
        """True when the stream has passed the most recent record (or it was never recorded)."""
        ...

    def synchronize(self) -> None:
        """Block the calling thread until :meth:`query` would return True."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds (forever with None); return whether the event completed."""
        ...

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end``; both completed and created with timing."""
        ...


@runtime_checkable
class Stream(Protocol):
    """An in-order queue of work (see the module docstring for the shared semantics)."""

    @property
    def name(self) -> str:
        """A name for logs, traces and thread names."""
        ...

    @property
    def handle(self) -> int:
        """The raw ``cudaStream_t`` for CUDA streams (for TensorRT's ``execute_async_v3``), 0 for host."""
        ...

    @property
    def is_cuda(self) -> bool:
        """True when work launched here runs on a CUDA stream."""
        ...

    @property
    def torch_stream(self) -> torch.cuda.Stream | None:
        """The ``torch.cuda.Stream`` work is enqueued on (for ``torch.cuda.stream(...)``), None for host streams."""
        ...

    def new_event(self, timing: bool = False) -> Event:
        """Create an unrecorded event of the kind this stream records (no stream work)."""
        ...

    def record(self, event: Event | None = None) -> Event:
        """Mark the point after all work launched so far; re-records ``event`` when given."""
        ...

    def wait(self, event: Event) -> None:
        """Make work launched after this call wait until ``event`` (its latest record) completes."""
        ...

    def launch(self, fn: StreamWork) -> None:
        """Run ``fn`` in this stream's order (CUDA: now, with this stream current; host: on the worker)."""
        ...

    def synchronize(self) -> None:
        """Block until all launched work finished; raise an error kept from host work."""
        ...

    def close(self, *, cancel: bool = False, timeout: float | None = None) -> bool:
        """Stop accepting work; a host stream drains (or with ``cancel`` skips) its queue.

        Returns False when the worker did not stop within ``timeout`` (a stuck callable).
        """
        ...


StreamLike: TypeAlias = Union[Stream, "torch.cuda.Stream"]
"""What engines and copies accept as a stream: a StreamRT :class:`Stream` or a bare ``torch.cuda.Stream``
(:func:`streamrt.device.as_torch_stream` turns either into the torch stream)."""


class Device(Protocol):
    """Creates streams, events and buffers for one kind of device (``"cuda"`` or ``"cpu"``)."""

    @property
    def kind(self) -> str:
        """``"cuda"`` or ``"cpu"``."""
        ...

    @property
    def is_cuda(self) -> bool:
        """True for the CUDA device."""
        ...

    @property
    def torch_device(self) -> Any:
        """The ``torch.device`` device buffers live on (imports torch)."""
        ...

    def stream(self, name: str, *, priority: int = 0) -> Stream:
        """A new device stream: a ``torch.cuda.Stream`` (never the default stream) or a host worker."""
        ...

    def host_stream(self, name: str, *, inline: bool = False) -> Stream:
        """A stream for host work (decode, encode, callbacks): a worker thread, or inline."""
        ...

    def host_buffer(self, shape: Sequence[int], dtype: Any, *, pinned: bool = True) -> Any:
        """A host tensor; page-locked when ``pinned`` and the device is CUDA (async copies need it)."""
        ...

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        """An uninitialised tensor on the device."""
        ...

    def pool(
        self, shape: Sequence[int], dtype: Any, count: int, *, host: bool = False, pinned: bool = True
    ) -> BufferPool[Any]:
        """``count`` equal buffers (device, or host when ``host``) with event-gated reuse."""
        ...

    def synchronize(self) -> None:
        """Wait for all work on this device (not for the steady state: it is a host sync)."""
        ...


class BufferPool(Generic[T]):
    """``count`` equal buffers handed out round-robin, each reused only after its release event.

    ``acquire`` returns the next buffer once the event passed to its last ``release`` has
    completed. Given a ``stream`` the wait is enqueued on that stream (no host block) when the
    event can be waited on there; otherwise the host waits, up to ``timeout``.

    Example:
        >>> pool = BufferPool(["a", "b"])
        >>> index, buf = pool.acquire()
        >>> pool.release(index, event=None)
        >>> pool.acquire()[1]
        'b'
    """

    def __init__(self, buffers: Sequence[T]) -> None:
        if not buffers:
            raise PipelineError("a BufferPool needs at least one buffer, got 0")
        self._buffers = list(buffers)
        self._held = [False] * len(self._buffers)
        self._release_events: list[Event | None] = [None] * len(self._buffers)
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def buffers(self) -> list[T]:
        """All buffers, for poisoning in tests or for capture-time setup."""
        return list(self._buffers)

    def acquire(self, stream: Stream | None = None, timeout: float | None = None) -> tuple[int, T]:
        """Take the next buffer in turn and make ``stream`` (or the host) wait for its release.

        Raises:
            PipelineError: the next buffer is still held (acquired and not released).
            StageTimeoutError: the host wait for its release event exceeded ``timeout``.
        """
        with self._lock:
            index = self._next
            if self._held[index]:
                raise PipelineError(
                    f"buffer {index} of a pool of {len(self._buffers)} is still held",
                    hint="release buffers in the order they were acquired, or make the pool larger",
                )
            self._held[index] = True
            self._next = (index + 1) % len(self._buffers)
            event = self._release_events[index]
        if event is not None:
            if stream is not None and (not stream.is_cuda or event.is_cuda or event.query()):
                stream.wait(event)
            elif not event.wait(timeout):
                with self._lock:
                    self._held[index] = False
                raise StageTimeoutError(f"buffer {index} was not released within {timeout} s")
        return index, self._buffers[index]

    def release(self, index: int, event: Event | None) -> None:
        """Give buffer ``index`` back; its next user waits for ``event`` (None: reusable at once)."""
        with self._lock:
            if not self._held[index]:
                raise PipelineError(f"buffer {index} is released but was not acquired")
            self._held[index] = False
            self._release_events[index] = event
