"""Streams, events, pinned/device buffers and pools, on CUDA (torch) or on host threads; the staging
path (gather into pinned slots, copy to the device and back, split) in :mod:`streamrt.device.staging`.

Example:
    >>> from streamrt.device import get_device
    >>> dev = get_device("cpu")
    >>> dev.kind
    'cpu'
"""

from __future__ import annotations

import contextlib

from streamrt._features import cuda_available
from streamrt.device.base import BufferPool, Device, Event, Stream, StreamLike, StreamWork
from streamrt.device.cuda import as_torch_stream, stream_scope
from streamrt.device.host import CpuDevice, HostEvent, HostStream, InlineStream
from streamrt.device.staging import HostBatch, HostSlots, gather_into, split_rows, to_device, to_host
from streamrt.errors import ConfigError

__all__ = [
    "BufferPool",
    "CpuDevice",
    "Device",
    "Event",
    "HostBatch",
    "HostEvent",
    "HostSlots",
    "HostStream",
    "InlineStream",
    "Stream",
    "StreamLike",
    "StreamWork",
    "as_torch_stream",
    "cuda_available",
    "device_scope",
    "gather_into",
    "get_device",
    "split_rows",
    "stream_scope",
    "to_device",
    "to_host",
]

_KINDS = ("auto", "cuda", "cpu")


def get_device(kind: str = "auto", index: int = 0) -> Device:
    """Return the device for ``kind``: ``"cuda"``, ``"cpu"`` (host streams) or ``"auto"``.

    ``"auto"`` picks CUDA when it is available, so the same pipeline code runs on a GPU machine
    and on CI.

    Raises:
        ConfigError: ``kind`` is not one of auto, cuda, cpu.
        PipelineError: ``"cuda"`` was asked for on a machine without CUDA.
    """
    if kind not in _KINDS:
        raise ConfigError(f"device must be one of {', '.join(_KINDS)}, got {kind!r}")
    if kind == "cpu" or (kind == "auto" and not cuda_available()):
        return CpuDevice()
    from streamrt.device.cuda import CudaDevice

    return CudaDevice(index)


def device_scope(index: int | None) -> contextlib.AbstractContextManager[None]:
    """GPU ``index`` as the calling thread's current CUDA device inside a ``with`` block (None: no change);
    see :func:`streamrt.device.cuda.device_scope`."""
    if index is None:
        return contextlib.nullcontext()
    from streamrt.device.cuda import device_scope as scope

    return scope(index)
