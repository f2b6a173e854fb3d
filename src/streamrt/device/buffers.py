"""Buffer allocation helpers and an event-gated buffer pool.

Buffers are torch tensors: one allocator and one type for pinned host memory, device memory and
what engines return. torch is imported lazily so that host streams work without it.

Allocator safety across streams (the choice StreamRT makes): **event-gated reuse**, not
``Tensor.record_stream``. A buffer is pre-allocated once and handed out again only after an event
recorded behind its last consumer has completed. ``record_stream`` makes reuse depend on the
caching allocator's bookkeeping (non-deterministic, and it can look like a leak); gating on our
own events keeps reuse explicit and also works for CUDA-graph static buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamrt._optional import require
from streamrt.errors import PipelineError, StageTimeoutError

if TYPE_CHECKING:
    from streamrt.device.base import Event, Stream

__all__ = ["BufferPool", "import_torch", "torch_dtype"]

T = TypeVar("T")


def import_torch() -> Any:
    """Import torch or raise :class:`MissingDependencyError` naming the extra (many call sites here)."""
    return require("torch", extra="torch", purpose="device buffers")


def torch_dtype(dtype: Any) -> Any:
    """Map a torch dtype, a :class:`~streamrt.types.DType`, a NumPy dtype or a name to a torch dtype."""
    torch = import_torch()
    if isinstance(dtype, torch.dtype):
        return dtype
    from streamrt.types import DType

    return DType.from_any(dtype).torch


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
