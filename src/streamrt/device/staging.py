"""One staging path for batches of rows: gather into pinned slots, copy to the device, copy back, split.

The server's model instances (requests gathered into one batch) and the pipeline workloads (frames
into a ring slot) move data the same way, so they share these steps:

1. :meth:`HostSlots.gather` (or :func:`gather_into` for a caller-owned buffer): per-request arrays,
   concatenated along axis 0 into a host buffer allocated once and reused. On a CUDA device the
   buffer is pinned, so the next step is asynchronous.
2. :func:`to_device`: host rows to the device on a stream (into a pre-allocated device buffer when
   one is given).
3. :func:`to_host`: device outputs back to pinned host memory on a stream (into a pre-allocated
   buffer when one is given, else a fresh pinned one: torch's caching host allocator recycles those).
4. :func:`split_rows`: the batch's outputs back to per-request views.

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

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt.device.base import Device, StreamLike
from streamrt.device.buffers import import_torch
from streamrt.device.cuda import stream_scope
from streamrt.errors import PipelineError

__all__ = ["HostBatch", "HostSlots", "gather_into", "split_rows", "to_device", "to_host"]

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

    def gather(self, name: str, arrays: Sequence[np.ndarray]) -> HostBatch:
        """``arrays`` concatenated along axis 0 into their slot; the first ``sum(len)`` rows of it.

        More rows than a slot holds get a fresh array instead (no slot grows).

        Raises:
            ValueError: the arrays' item shapes or ranks differ (NumPy's message).
        """
        first = arrays[0]
        rows = sum(int(a.shape[0]) for a in arrays)
        if rows > self._rows:
            return HostBatch(np.concatenate(arrays) if len(arrays) > 1 else np.ascontiguousarray(first))
        batch = self.slot(name, first.dtype, first.shape[1:]).rows(rows)
        np.concatenate(arrays, axis=0, out=batch.array)
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
