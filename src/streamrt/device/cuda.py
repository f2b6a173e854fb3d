"""CUDA streams, events and buffers on ``torch.cuda``.

Rules this module keeps (pytorch docs/source/notes/cuda.md, "CUDA streams", "pinned memory"):

* Every stream is a fresh ``torch.cuda.Stream``, never the default stream: the legacy default
  stream synchronises with all blocking streams and would serialise the pipeline.
* ``launch(fn)`` calls ``fn`` with ``torch.cuda.stream(s)`` current, so torch ops, AOTInductor
  kernels and CUDA-graph replays issued inside land on ``s``. Engines that take a raw stream
  (TensorRT ``execute_async_v3``) use :attr:`CudaStream.handle`. Code that enters the torch stream
  itself uses :func:`stream_scope` (or :func:`as_torch_stream`), typed for host and CUDA streams alike.
* Host buffers for asynchronous copies are pinned (``torch.empty(..., pin_memory=True)``) and
  allocated once; a ``non_blocking`` copy from pageable memory is staged and blocks the host.
* Allocator safety is event-gated reuse (see :mod:`streamrt.device.buffers`): buffers consumed on
  another stream stay referenced until an event recorded behind the consumer has completed.
* Host waits use ``Event.synchronize``/``query`` (not ``Stream.synchronize``, which
  ``torch.cuda.set_sync_debug_mode("error")`` flags), so the steady state passes that check.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from streamrt._oom import INFER_HINT, out_of_memory_guard
from streamrt.device.base import BufferPool, Event, Stream, StreamLike, StreamWork
from streamrt.device.buffers import import_torch, torch_dtype
from streamrt.device.host import HostStream, InlineStream, _HostStreamBase
from streamrt.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    import torch

__all__ = ["CudaDevice", "CudaEvent", "CudaStream", "as_torch_stream", "device_scope", "stream_scope"]

# Host polling of a CUDA event with a timeout: start short (results are usually ready), back off
# so a long wait does not burn a core or hold the GIL.
# The cap stays small: a producer that wakes late leaves the GPU idle when the ring is short.
_POLL_START_S = 10e-6
_POLL_MAX_S = 100e-6


@contextlib.contextmanager
def device_scope(index: int | None) -> Iterator[None]:
    """Make GPU ``index`` the calling thread's current device inside the block (None: leave it as it is).

    What runs on "the current device" lands there: loading a plan (TensorRT deserializes onto it,
    AOTInductor packages load for it, the compatibility check reads its name), creating execution
    contexts, ``device="cuda"`` tensors. The current device is per thread, so worker threads set it
    themselves (entering a stream on another device switches it too: ``torch.cuda.stream``).
    """
    if index is None:
        yield
        return
    with import_torch().cuda.device(index):
        yield


def as_torch_stream(stream: StreamLike | None) -> torch.cuda.Stream | None:
    """The ``torch.cuda.Stream`` behind ``stream``: a CUDA stream's own, a bare torch stream as it is,
    None for a host stream or None (work then runs in the calling thread, on torch's current stream).

    Example:
        >>> from streamrt.device import HostStream
        >>> as_torch_stream(HostStream("decode")) is None
        True
    """
    if stream is None:
        return None
    if isinstance(stream, (CudaStream, _HostStreamBase)):  # StreamRT's own: no torch import needed
        return stream.torch_stream
    import torch

    if isinstance(stream, torch.cuda.Stream):
        return stream
    return stream.torch_stream  # another implementation of the Stream protocol


@contextlib.contextmanager
def stream_scope(stream: StreamLike | None) -> Iterator[None]:
    """Make ``stream``'s torch stream current inside the block, so torch ops issued there land on it;
    a host stream (or None) changes nothing: its work runs in the calling thread, its worker."""
    torch_stream = as_torch_stream(stream)
    if torch_stream is None:
        yield
        return
    with import_torch().cuda.stream(torch_stream):
        yield


class CudaEvent:
    """A ``torch.cuda.Event``; the underlying object is :attr:`torch`.

    ``blocking=True`` makes :meth:`synchronize` yield the CPU instead of spinning.
    """

    def __init__(self, timing: bool = False, blocking: bool = False) -> None:
        torch = import_torch()
        self._timing = timing
        self._event = torch.cuda.Event(enable_timing=timing, blocking=blocking)

    @property
    def torch(self) -> Any:
        """The wrapped ``torch.cuda.Event``."""
        return self._event

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def timing(self) -> bool:
        return self._timing

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()  # releases the GIL while it waits

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            self._event.synchronize()
            return True
        if self._event.query():
            return True
        deadline = time.perf_counter() + timeout
        pause = _POLL_START_S
        while not self._event.query():
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)
        return True

    def elapsed_ms(self, end: Event) -> float:
        if not isinstance(end, CudaEvent):
            raise PipelineError("elapsed_ms between a CUDA event and a host event is undefined")
        return float(self._event.elapsed_time(end.torch))


class CudaStream:
    """A non-default ``torch.cuda.Stream`` with the :class:`~streamrt.device.base.Stream` protocol.

    Example (on a GPU machine):
        >>> s = CudaDevice().stream("engine")  # doctest: +SKIP
        >>> s.launch(lambda: model(x))  # kernels land on s  # doctest: +SKIP
        >>> context.execute_async_v3(s.handle)  # TensorRT takes the raw handle  # doctest: +SKIP
    """

    def __init__(self, name: str, device_index: int = 0, priority: int = 0) -> None:
        torch = import_torch()
        self._name = name
        self._stream = torch.cuda.Stream(device=device_index, priority=priority)
        self._stream_ctx = torch.cuda.stream

    def __repr__(self) -> str:
        return f"CudaStream({self._name!r}, handle={self.handle:#x})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def handle(self) -> int:
        return int(self._stream.cuda_stream)

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def torch_stream(self) -> torch.cuda.Stream:
        """The wrapped ``torch.cuda.Stream`` (for ``with torch.cuda.stream(s.torch_stream):``)."""
        return self._stream

    @property
    def torch(self) -> torch.cuda.Stream:
        """The wrapped ``torch.cuda.Stream``, as :attr:`torch_stream` (the name :attr:`CudaEvent.torch` uses)."""
        return self._stream

    def new_event(self, timing: bool = False) -> CudaEvent:
        return CudaEvent(timing)

    def launch(self, fn: StreamWork) -> None:
        with self._stream_ctx(self._stream):
            fn()

    def record(self, event: Event | None = None) -> CudaEvent:
        if event is None:
            event = CudaEvent()
        elif not isinstance(event, CudaEvent):
            raise PipelineError(f"a CUDA stream can only record CUDA events, got {type(event).__name__}")
        event.torch.record(self._stream)
        return event

    def wait(self, event: Event) -> None:
        if isinstance(event, CudaEvent):
            self._stream.wait_event(event.torch)  # device-side: the host does not block
        elif not event.query():
            raise PipelineError(
                f"CUDA stream '{self._name}' cannot wait on the GPU for a pending host event",
                hint="launch the CUDA work from the host stream that records the event",
            )

    def synchronize(self) -> None:
        self._stream.synchronize()

    def close(self, *, cancel: bool = False, timeout: float | None = None) -> bool:
        # CUDA work cannot be cancelled; wait for it (with a timeout) so buffers can be freed.
        return self.record().wait(timeout)


class CudaDevice:
    """One CUDA GPU seen through torch: streams, events, pinned and device buffers."""

    def __init__(self, index: int = 0) -> None:
        torch = import_torch()
        if not torch.cuda.is_available():
            raise PipelineError("CUDA device requested but torch.cuda.is_available() is False",
                                hint="run on the CPU with --device cpu (in Python: get_device('cpu'))")
        count = torch.cuda.device_count()
        if not 0 <= index < count:
            raise ConfigError(f"CUDA device {index} does not exist; torch sees {count} GPU(s), indices 0..{count - 1}",
                              hint="pick a visible GPU (CUDA_VISIBLE_DEVICES renumbers them from 0)")
        self._index = index
        self._torch_device = torch.device("cuda", index)

    def __repr__(self) -> str:
        return f"CudaDevice({self._index})"

    @property
    def kind(self) -> str:
        return "cuda"

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def index(self) -> int:
        return self._index

    @property
    def torch_device(self) -> Any:
        return self._torch_device

    def stream(self, name: str, *, priority: int = 0) -> Stream:
        return CudaStream(name, self._index, priority)

    def host_stream(self, name: str, *, inline: bool = False) -> Stream:
        return InlineStream(name) if inline else HostStream(name)

    def host_buffer(self, shape: Sequence[int], dtype: Any, *, pinned: bool = True) -> Any:
        torch = import_torch()
        if not pinned or self._index == 0:
            return torch.empty(tuple(shape), dtype=torch_dtype(dtype), pin_memory=pinned)
        with torch.cuda.device(self._index):  # pinned for this GPU's copies (portable across GPUs anyway)
            return torch.empty(tuple(shape), dtype=torch_dtype(dtype), pin_memory=True)

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        torch = import_torch()
        with out_of_memory_guard(f"allocating a {'x'.join(map(str, shape))} {dtype} tensor on {self._torch_device}",
                                 INFER_HINT):
            return torch.empty(tuple(shape), dtype=torch_dtype(dtype), device=self._torch_device)

    def pool(
        self, shape: Sequence[int], dtype: Any, count: int, *, host: bool = False, pinned: bool = True
    ) -> BufferPool[Any]:
        make = (lambda: self.host_buffer(shape, dtype, pinned=pinned)) if host else (
            lambda: self.empty(shape, dtype)
        )
        return BufferPool([make() for _ in range(count)])

    def synchronize(self) -> None:
        import_torch().cuda.synchronize(self._index)
