"""One staging path for batches of rows: gather into pinned slots, copy to the device, copy back, split.

The server's model instances (requests gathered into one batch) and the pipeline workloads (frames
into a ring slot) move data the same way, so they share these steps:

1. :meth:`HostSlots.gather` (or :func:`gather_into` for a caller-owned buffer): per-request arrays,
   concatenated along axis 0 into a host buffer allocated once and reused. On a CUDA device the
   buffer is pinned, so the next step is asynchronous.
2. :func:`to_device`: host rows to the device on a stream (into a pre-allocated device buffer when
   one is given). :func:`stage_to_device` does steps 1 and 2 for a server instance: a large gather is
   copied in pieces on a few threads (:class:`~streamrt.device.row_copier.RowCopier`) and each piece
   goes to the device as soon as it is in the slot, so the DMA overlaps the host copies.
3. :func:`to_host`: device outputs back to pinned host memory on a stream (into a pre-allocated
   buffer when one is given, else a fresh pinned one: torch's caching host allocator recycles those).
4. :func:`split_rows`: the batch's outputs back to per-request views.

Rows that already lie in page-locked memory skip step 1: :func:`rows_to_device` copies each
request's rows straight into the device batch (one DMA each, no host gather). Memory outside
torch's allocator (the front-end processes' shared arenas) is *offered* to :data:`PINNABLE`, which
page-locks it (``cudaHostRegister``) chunk by chunk the first time a device copy reads it, so only
the part of an arena in use is locked.

How they run: the caller is already in the stream's order (a pipeline stage, or an instance's
worker thread). On a CUDA stream each copy is *enqueued* with the stream current; on a host stream
(:mod:`streamrt.device.host`) it runs now, in the calling thread, which is that stream's worker:
the same contract as ``ExecutionContext.infer``. On the host device the device *is* the host, so
:func:`to_device` and :func:`to_host` without a destination hand the rows on without a copy.

Reusing a slot is safe once the copy that read it has completed: an instance waits for its stream at
the end of every batch, and the pipeline gates slot reuse on events.

Example:
    >>> import numpy as np
    >>> from streamrt.device import get_device
    >>> dev = get_device("cpu")
    >>> stream = dev.host_stream("stage", inline=True)
    >>> slots = HostSlots(dev, rows=8)
    >>> batch = slots.gather("x", [np.ones((2, 3), np.float32), np.zeros((1, 3), np.float32)])
    >>> outputs = {"y": to_host(to_device(batch, dev, stream) * 2, stream)}
    >>> [part["y"].shape for part in split_rows(outputs, [2, 1])]
    [(2, 3), (1, 3)]
"""

from __future__ import annotations

import importlib
import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt._env import env_switch
from streamrt._optional import available
from streamrt.device.base import Device, StreamLike
from streamrt.device.buffers import import_torch
from streamrt.device.cuda import stream_scope
from streamrt.device.row_copier import RowCopier
from streamrt.errors import PipelineError

__all__ = ["DIRECT_COPIES", "PINNABLE", "HostBatch", "HostSlots", "PinnableMemory", "cuda_host_register",
           "cuda_host_unregister", "gather_into", "rows_to_device", "split_rows", "stage_to_device", "to_device",
           "to_host"]

log = logging.getLogger(__name__)

Take = Callable[[str, Any, int, int, int], Any]
"""``take(name, value, request, start, stop)``: request ``request``'s part (rows ``start:stop``) of output ``name``."""


@dataclass(frozen=True)
class HostBatch:
    """Rows on the host: ``array`` (NumPy) and, when it lives in a pinned slot of a CUDA device, the same
    memory as a pinned torch tensor ``pinned`` (what an asynchronous host-to-device copy reads)."""

    array: np.ndarray
    pinned: Any | None = None

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def rows(self, count: int) -> HostBatch:
        """The first ``count`` rows, as views of the same memory."""
        return HostBatch(self.array[:count], None if self.pinned is None else self.pinned[:count])


class HostSlots:
    """Host buffers of ``rows`` rows, one per (name, dtype, item shape), allocated once and reused.

    On a CUDA device a slot is a pinned torch tensor (and its NumPy view); on the host device a NumPy
    array, which holds any dtype (strings too). At most ``max_keys`` slots are kept: a new key drops the
    oldest, so a model whose shapes keep changing does not pin ever more memory.

    Args:
        device: the device the rows are copied to.
        rows: rows per slot (the largest batch).
        max_keys: slots kept at most.

    Raises:
        PipelineError: ``rows`` or ``max_keys`` is below 1.
    """

    def __init__(self, device: Device, rows: int, *, max_keys: int = 8) -> None:
        if rows < 1 or max_keys < 1:
            raise PipelineError(f"host slots need rows >= 1 and max_keys >= 1, got rows={rows}, max_keys={max_keys}")
        self._device = device
        self._rows = rows
        self._max_keys = max_keys
        self._slots: dict[tuple[str, str, tuple[int, ...]], HostBatch] = {}

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def rows(self) -> int:
        """Rows per slot."""
        return self._rows

    def slot(self, name: str, dtype: Any, item_shape: Sequence[int]) -> HostBatch:
        """The whole slot for ``name`` rows of ``dtype`` and ``item_shape``, allocated on first use."""
        key = (name, np.dtype(dtype).str, tuple(int(d) for d in item_shape))
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= self._max_keys:
                self._slots.pop(next(iter(self._slots)))
            shape = (self._rows, *key[2])
            if self._device.is_cuda:
                tensor = self._device.host_buffer(shape, np.dtype(dtype), pinned=True)
                slot = HostBatch(tensor.numpy(), tensor)
            else:
                slot = HostBatch(np.empty(shape, dtype=dtype))
            self._slots[key] = slot
        return slot

    def gather(self, name: str, arrays: Sequence[np.ndarray], copier: RowCopier | None = None) -> HostBatch:
        """``arrays`` concatenated along axis 0 into their slot; the first ``sum(len)`` rows of it.

        More rows than a slot holds get a fresh array instead (no slot grows). With a ``copier`` a large
        gather is copied in pieces on its threads (:class:`~streamrt.device.row_copier.RowCopier`); without
        one it is one ``np.concatenate``.

        Raises:
            ValueError: the arrays' item shapes or ranks differ (NumPy's message).
        """
        first = arrays[0]
        rows = sum(int(a.shape[0]) for a in arrays)
        if rows > self._rows:
            return HostBatch(np.concatenate(arrays) if len(arrays) > 1 else np.ascontiguousarray(first))
        batch = self.slot(name, first.dtype, first.shape[1:]).rows(rows)
        if copier is None:
            np.concatenate(arrays, axis=0, out=batch.array)
        else:
            copier.gather(batch.array, arrays)
        return batch

    def clear(self) -> None:
        """Drop every slot (their memory goes back to the allocator once nothing views it)."""
        self._slots.clear()


def gather_into(out: Any, parts: Sequence[Any]) -> int:
    """Copy ``parts`` one after another along axis 0 into ``out`` (a NumPy array or a torch tensor, such
    as a ring slot's pinned buffer); return the number of rows written. One part is a plain copy.

    Raises:
        PipelineError: a part's item shape differs from ``out``'s, or the parts hold more rows than ``out``.
    """
    item = tuple(out.shape[1:])
    for part in parts:
        if tuple(part.shape[1:]) != item:
            raise PipelineError(f"cannot gather a part of shape {tuple(part.shape)} into rows of shape {item}",
                             hint="every part must have the destination's item shape (all but axis 0)")
    rows = sum(int(part.shape[0]) for part in parts)
    if rows > out.shape[0]:
        raise PipelineError(f"{rows} rows do not fit a buffer of {out.shape[0]}",
                            hint="allocate the buffer for the largest batch")
    if isinstance(out, np.ndarray):
        np.concatenate(parts, axis=0, out=out[:rows])
        return rows
    torch = import_torch()
    start = 0
    for part in parts:
        stop = start + int(part.shape[0])
        out[start:stop].copy_(torch.as_tensor(part))
        start = stop
    return rows


def to_device(host: HostBatch | Any, device: Device, stream: StreamLike | None, *, out: Any | None = None,
              non_blocking: bool = True) -> Any:
    """Host rows (a :class:`HostBatch`, NumPy array or CPU tensor) on ``device``, copied on ``stream``.

    Into ``out`` (a pre-allocated device buffer of the same shape) when given, else into a new device
    tensor from torch's caching allocator. On the host device without ``out`` the rows are handed on
    as they are (no copy). ``non_blocking=False`` makes a CUDA copy wait for the stream (the
    synchronous baseline's pageable copy).
    """
    array = host.array if isinstance(host, HostBatch) else host
    if not device.is_cuda:
        if out is None:
            return array
        _copy_on_host(out, array)
        return out
    torch = import_torch()
    source = host.pinned if isinstance(host, HostBatch) and host.pinned is not None else torch.as_tensor(array)
    with stream_scope(stream):
        if out is None:
            return source.to(device.torch_device, non_blocking=non_blocking)
        out.copy_(source, non_blocking=non_blocking)
        return out


def stage_to_device(slots: HostSlots, name: str, arrays: Sequence[np.ndarray], device: Device,
                    stream: StreamLike | None, copier: RowCopier | None = None) -> Any:
    """Requests' rows as one batch on ``device``: gathered into their slot of ``slots`` and copied on ``stream``.

    On a CUDA device with a ``copier`` that has helper threads, each piece of the gather is copied to the device
    (asynchronously, on ``stream``) as soon as it is in the pinned slot, so the DMA overlaps the rest of the host
    copies; the slot must stay as it is until ``stream`` gets there (an instance waits for its stream at the end
    of every batch). Otherwise the slot is filled, then copied once. More rows than a slot holds take the
    slot-less path (a fresh array, then one copy). On the host device the slot's rows are the batch.

    Raises:
        ValueError: the arrays' item shapes or ranks differ.
    """
    rows = sum(int(a.shape[0]) for a in arrays)
    # Pieces without helper threads were slower than one gather on the H200 (0.78-0.85x: each piece's copy to the
    # device costs more to enqueue than the overlap saves; docs/benchmarks/2026-12-05-h200-s4.md).
    if not device.is_cuda or copier is None or copier.threads == 0 or rows > slots.rows:
        return to_device(slots.gather(name, arrays, copier), device, stream)
    first = arrays[0]
    batch = slots.slot(name, first.dtype, first.shape[1:]).rows(rows)
    pinned = batch.pinned  # a CUDA device's slots are pinned tensors
    if pinned is None:
        raise PipelineError(f"the slot for '{name}' is not in pinned memory on {device!r}")
    with stream_scope(stream):
        out = device.empty(batch.array.shape, batch.array.dtype)

        def send(start: int, stop: int) -> None:
            out[start:stop].copy_(pinned[start:stop], non_blocking=True)

        copier.gather(batch.array, arrays, send)
    return out


def to_host(value: Any, stream: StreamLike | None, *, out: Any | None = None, non_blocking: bool = True) -> Any:
    """An output on the host, copied on ``stream``: a CUDA tensor into ``out`` (pre-allocated host memory)
    when given, else into a fresh pinned tensor; host values are handed on as they are (or copied into
    ``out``). The copy is complete once ``stream`` gets there: wait for it before reading."""
    if isinstance(value, np.ndarray) or not value.is_cuda:
        if out is None:
            return value
        _copy_on_host(out, value)
        return out
    torch = import_torch()
    with stream_scope(stream):
        target = out if out is not None else torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        target.copy_(value, non_blocking=non_blocking)
    return target


def split_rows(batch: Mapping[str, Any], rows: Sequence[int], take: Take | None = None) -> list[dict[str, Any]]:
    """The batch's outputs back per request: request ``i`` gets rows ``sum(rows[:i]):sum(rows[:i + 1])``
    of every output, as views (``take`` picks a part differently, e.g. moves device rows to the host)."""
    bounds = list(itertools.accumulate(rows, initial=0))
    pick: Take = take if take is not None else _view
    return [{name: pick(name, value, i, start, stop) for name, value in batch.items()}
            for i, (start, stop) in enumerate(itertools.pairwise(bounds))]


def _view(name: str, value: Any, request: int, start: int, stop: int) -> Any:
    return value[start:stop]


def _copy_on_host(out: Any, value: Any) -> None:
    if isinstance(out, np.ndarray):
        np.copyto(out, np.asarray(value))
    else:
        out.copy_(import_torch().as_tensor(value))


# --- page-locked memory outside torch's allocator -----------------------------------------------------

Register = Callable[[int, int], bool]
"""``register(address, nbytes)`` page-locks host memory for the GPU (``cudaHostRegister``): True when done."""


def _runtime() -> Any | None:
    """cuda-python's runtime, or None. Its calls run on the driver API with an error state of their own:
    a failed registration there cannot leave an error in torch's runtime for its next kernel launch check
    to raise (torch's ``cudart().cudaHostRegister`` would, and torch exposes no ``cudaGetLastError``)."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):  # cuda-python < 12.6 named it cuda.cudart
        if available(name):
            return importlib.import_module(name)
    return None


def _succeeded(result: Any) -> bool:
    err = result[0] if isinstance(result, tuple) else result
    return getattr(err, "value", err) == 0  # cudaError_t is an enum in cuda-bindings 12 and 13


def cuda_host_register(address: int, nbytes: int) -> bool:
    """Page-lock ``nbytes`` of host memory at ``address`` for the GPU (``cudaHostRegister``, portable): True
    when done. Unregister it (:func:`cuda_host_unregister`) before the memory is unmapped.

    Raises:
        PipelineError: cuda-python is not installed.
    """
    runtime = _runtime()
    if runtime is None:
        raise PipelineError("cuda-python is not installed", hint="install streamrt[cuda-shm]")
    return _succeeded(runtime.cudaHostRegister(address, nbytes, getattr(runtime, "cudaHostRegisterPortable", 1)))


def cuda_host_unregister(address: int, nbytes: int) -> bool:
    """Release memory :func:`cuda_host_register` locked: True when done (False without cuda-python)."""
    runtime = _runtime()
    return runtime is not None and _succeeded(runtime.cudaHostUnregister(address))


class _Offered:
    """One offered buffer: its address range, a writable uint8 view (kept alive) and its locked chunks."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer = buffer
        self.start = int(buffer.__array_interface__["data"][0])
        self.end = self.start + buffer.nbytes
        self.tensor: Any | None = None  # torch's uint8 view of ``buffer``, made on first use
        self.locked: dict[int, int] = {}  # chunk start offset -> bytes locked
        self.failed = False


class PinnableMemory:
    """Host buffers that may be page-locked for direct device copies, chunk by chunk on first use.

    :meth:`offer` records a buffer (no CUDA call: a CPU-only server never imports torch for it);
    :meth:`pieces` hands the pinned torch views of an array inside one, locking the chunks it
    covers first; :meth:`withdraw` unlocks them (call it once no copy reads the buffer any more).
    A chunk that cannot be locked marks its buffer as unpinnable: its arrays take the staging slot,
    as before.

    Args:
        chunk_bytes: the unit locked at a time (aligned to the buffer's start).
        register / unregister: page-lock and release ``(address, nbytes)``; CUDA's by default.
    """

    def __init__(self, chunk_bytes: int = 64 << 20, register: Register = cuda_host_register,
                 unregister: Register = cuda_host_unregister) -> None:
        self.chunk_bytes = chunk_bytes
        self._register, self._unregister = register, unregister
        self._offered: list[_Offered] = []
        self._lock = threading.Lock()  # instances of several models gather on their own threads

    def offer(self, buffer: np.ndarray) -> None:
        """Allow ``buffer`` (C-contiguous, writable, uint8) to be page-locked when a device copy reads it."""
        if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.writeable:
            raise PipelineError("only a writable 1-D uint8 buffer can be offered for page-locking",
                                hint="offer the whole mapping (for example Arena.array)")
        with self._lock:
            self._offered.append(_Offered(buffer))

    def withdraw(self, buffer: np.ndarray) -> None:
        """Unlock what was locked of ``buffer`` and forget it (nothing happens for a buffer never offered)."""
        start = int(buffer.__array_interface__["data"][0])
        with self._lock:
            kept = [o for o in self._offered if o.start != start]
            gone = [o for o in self._offered if o.start == start]
            self._offered = kept
        for offered in gone:
            for offset, nbytes in offered.locked.items():
                if not self._unregister(offered.start + offset, nbytes):
                    log.warning("could not unlock %d bytes of page-locked host memory", nbytes)

    def offers(self, array: np.ndarray) -> bool:
        """Whether ``array``'s memory lies inside an offered buffer."""
        start = int(array.__array_interface__["data"][0])
        with self._lock:
            return any(o.start <= start and start + array.nbytes <= o.end for o in self._offered)

    @property
    def locked_bytes(self) -> int:
        """Bytes page-locked now, over every offered buffer."""
        return sum(sum(o.locked.values()) for o in self._offered)

    def pieces(self, array: np.ndarray) -> list[Any] | None:
        """``array``'s bytes as page-locked torch uint8 views, one per locked chunk it spans; None when
        it is not contiguous inside an offered buffer or its chunks cannot be locked."""
        if not array.flags.c_contiguous or array.dtype.hasobject or not array.nbytes:
            return None
        address = int(array.__array_interface__["data"][0])
        with self._lock:
            offered = next((o for o in self._offered if o.start <= address and address + array.nbytes <= o.end), None)
            if offered is None or offered.failed:
                return None
            first = address - offered.start
            last = first + array.nbytes
            chunks = range(first // self.chunk_bytes * self.chunk_bytes, last, self.chunk_bytes)
            for chunk in chunks:
                if chunk not in offered.locked and not self._lock_chunk(offered, chunk):
                    return None
            if offered.tensor is None:
                offered.tensor = import_torch().from_numpy(offered.buffer)
            tensor = offered.tensor
        return [tensor[max(first, c) : min(last, c + self.chunk_bytes)] for c in chunks]

    def _lock_chunk(self, offered: _Offered, chunk: int) -> bool:
        nbytes = min(self.chunk_bytes, offered.buffer.nbytes - chunk)
        why = "cudaHostRegister failed"
        try:
            done = self._register(offered.start + chunk, nbytes)
        except Exception as exc:  # no cuda-python, say
            done, why = False, str(exc)
        if not done:
            offered.failed = True
            log.warning("cannot page-lock %.1f MiB of shared host memory (%s); its tensors are staged through "
                        "pinned slots instead (one more host copy)", nbytes / 2**20, why)
            return False
        offered.locked[chunk] = nbytes
        return True


PINNABLE = PinnableMemory()
"""The process's offered memory (the front-end arenas of the engine process)."""

DIRECT_MIN_BYTES = 64 * 1024
"""A batch of several requests is copied part by part only when each part has at least this many bytes
(many small copies cost more than one gather and one copy)."""

DIRECT_COPIES = env_switch("STREAMRT_DIRECT_HOST_COPIES", True)
"""Whether the server's CUDA instances use :func:`rows_to_device` (on by default; ``STREAMRT_DIRECT_HOST_COPIES=0``
gathers every batch into a pinned slot instead). Off until 2026-12-05: page-locking front-end arenas and
shared-memory mappings with ``cudaHostRegister`` hung on the H200 on 2026-12-02; their GPU tests passed on
2026-12-05 (twice), and served ResNet-50 in the same run went 1.6-2.1x (gRPC binary) and 1.9-2.7x (system shared
memory) the gathered path (docs/benchmarks/2026-12-05-h200-s5.md)."""


def rows_to_device(parts: Sequence[np.ndarray], device: Device, stream: StreamLike | None, *,
                   pinnable: PinnableMemory = PINNABLE) -> Any | None:
    """``parts`` concatenated along axis 0 on ``device``, copied on ``stream`` straight from page-locked
    memory (no host gather, no staging slot); None when that cannot be done (the host device, parts not
    all in offered memory, several small parts, mismatched dtypes or item shapes): gather them instead.

    The copies are asynchronous: the parts' memory must stay as it is until ``stream`` gets there.
    """
    if not device.is_cuda or not parts or not all(isinstance(p, np.ndarray) for p in parts):
        return None
    first = parts[0]
    if first.dtype.hasobject:
        return None
    item = tuple(first.shape[1:])
    if any(p.dtype != first.dtype or tuple(p.shape[1:]) != item or p.ndim != first.ndim for p in parts):
        return None
    if len(parts) > 1 and min(p.nbytes for p in parts) < DIRECT_MIN_BYTES:
        return None
    pieces = [pinnable.pieces(p) for p in parts]
    if any(p is None for p in pieces):
        return None
    rows = sum(int(p.shape[0]) for p in parts) if first.ndim else 1
    with stream_scope(stream):
        out = device.empty((rows, *item) if first.ndim else (), first.dtype)
        flat = out.reshape(-1).view(import_torch().uint8)
        position = 0
        for part in pieces:
            for piece in part or ():
                flat[position : position + piece.numel()].copy_(piece, non_blocking=True)
                position += piece.numel()
    return out
