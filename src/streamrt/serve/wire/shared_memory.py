"""Triton's shared-memory extensions: system (POSIX) and CUDA regions that requests read and write.

A client registers a region once (``/v2/systemsharedmemory/region/{name}/register`` with a POSIX
shared-memory ``key``, or ``/v2/cudasharedmemory/...`` with a CUDA IPC handle), then names it in
the ``shared_memory_region`` / ``shared_memory_offset`` / ``shared_memory_byte_size`` parameters
of inputs and outputs instead of sending tensors. What is checked, and when:

* register: the name is free (system and CUDA regions share one name space, as in Triton), the
  key is no other region's (Triton's second mapping of a key fails too), opens and holds
  ``offset + byte_size`` bytes, the CUDA handle opens on that device;
* decode: the region exists, ``offset + byte_size`` lies inside it, an input's byte size is the
  exact size of its shape and datatype;
* after inference: an output fits in its byte size; if not, the request fails and the region is
  left untouched;
* unregister: a region that a request still reads or writes is refused (400), never pulled away
  from under it. Regions are closed on unregister and on server shutdown.

Every refusal is a :class:`~streamrt.errors.SharedMemoryError` (HTTP 400, gRPC INVALID_ARGUMENT),
with Triton's codes and words where Triton has its own: an unknown region is a
:class:`~streamrt.errors.RegionNotFoundError` (404, NOT_FOUND), a name registered twice a
:class:`~streamrt.errors.RegionExistsError` (400, ALREADY_EXISTS).

Data path: a system-region input is a zero-copy NumPy view of the mapping (the batcher's gather
is its one copy; a CUDA instance copies it to the device straight from the mapping, which is offered
for page-locking: :class:`~streamrt.device.staging.PinnableMemory`); an output is one copy into the
mapping. A CUDA-region input is a
:class:`DeviceTensor` (a torch view of the device memory): CUDA instances gather it on the
device (no host round trip), CPU instances copy it to the host. CUDA-region outputs are copied
from the instance's host output (one H2D copy).

Trust model: regions are the client's memory mapped into the server. Only local, trusted clients
may use them (the server binds loopback by default, and ``--auth-token`` guards registration like
every other call); a client can change an input while the server reads it, as with Triton.

Example:
    >>> registry = SharedMemoryRegistry()
    >>> registry.status()
    []
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from streamrt._optional import available, require
from streamrt.errors import RegionExistsError, RegionNotFoundError, SharedMemoryError
from streamrt.serve.wire.bytes_tensor import deserialize_bytes, serialize_bytes

__all__ = ["DeviceTensor", "RegionRef", "RegionSource", "SharedMemoryRegistry", "region_ref"]

log = logging.getLogger(__name__)

_IPC_HANDLE_SIZE = 64  # CUDA_IPC_HANDLE_SIZE


@dataclass(frozen=True)
class RegionRef:
    """Where one tensor lives: a registered region's name, an offset into it and a byte size."""

    name: str
    offset: int
    byte_size: int


def region_ref(params: Mapping[str, Any], where: str) -> RegionRef:
    """The :class:`RegionRef` of a tensor's ``shared_memory_*`` parameters.

    Raises:
        SharedMemoryError: a missing name or byte size, or negative values.
    """
    name = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if not isinstance(name, str) or not name:
        raise SharedMemoryError(f"{where}: 'shared_memory_region' must be a region name, got {name!r}")
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SharedMemoryError(f"{where}: '{key}' must be an integer >= 0, got {value!r}",
                                    hint="give shared_memory_byte_size (and optionally shared_memory_offset)")
    return RegionRef(name, int(offset), int(size))  # type: ignore[arg-type]


class DeviceTensor:
    """A tensor in CUDA memory that quacks like the arrays of a request (``dtype``, ``shape``).

    ``tensor`` is the torch view; ``np.asarray(t)`` copies it to the host (CPU engines).
    """

    def __init__(self, tensor: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.tensor = tensor
        self.dtype = dtype
        self.shape = shape
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        import torch

        host = np.empty(self.shape, self.dtype)
        _torch_view(host).copy_(self.tensor.contiguous().reshape(-1).view(torch.uint8))  # bytes to bytes
        return host if dtype is None else host.astype(dtype)


def _torch_view(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(array.reshape(-1).view(np.uint8))


class RegionSource(Protocol):
    """What a request parser needs of the regions: :class:`SharedMemoryRegistry`, or a front-end
    worker's stand-in that records the names for the engine process (which holds the regions)."""

    def read_input(self, ref: RegionRef, dtype: np.dtype[Any], shape: tuple[int, ...], where: str,
                   leases: list[Any]) -> Any: ...

    def lease_output(self, ref: RegionRef, where: str, leases: list[Any]) -> None: ...


class _Region:
    """A registered region: its size, the requests using it, and how to read and write it."""

    kind = ""

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.byte_size = byte_size
        self.users = 0

    def check(self, ref: RegionRef, where: str) -> None:
        if ref.offset + ref.byte_size > self.byte_size:
            raise SharedMemoryError(
                f"{where}: offset {ref.offset} + byte size {ref.byte_size} exceeds the {self.byte_size} bytes of "
                f"{self.kind} shared memory region '{self.name}'")

    def read(self, ref: RegionRef, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def write(self, ref: RegionRef, array: np.ndarray) -> None:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _SystemRegion(_Region):
    kind = "system"

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        super().__init__(name, byte_size)
        self.key, self.offset = key, offset
        path = os.path.join("/dev/shm", key.lstrip("/"))
        if "/" in key.lstrip("/") or not key.strip("/"):
            raise SharedMemoryError(f"system shared memory key {key!r} is not a POSIX shared-memory name")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise SharedMemoryError(
                f"cannot open system shared memory key {key!r} for region '{name}': {exc.strerror}",
                hint="create it first (tritonclient.utils.shared_memory)") from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise SharedMemoryError(f"region '{name}': offset {offset} + byte size {byte_size} exceeds the "
                                        f"{size} bytes of shared memory key {key!r}")
            self._map = mmap.mmap(fd, offset + byte_size) if offset + byte_size else None
        finally:
            os.close(fd)
        self._view = memoryview(self._map)[offset:] if self._map is not None else memoryview(b"")
        self._pinnable: np.ndarray | None = None
        if self._map is not None:  # CUDA instances lock the chunks they read and copy from them directly
            from streamrt.device.staging import PINNABLE

            self._pinnable = np.frombuffer(self._map, np.uint8)
            PINNABLE.offer(self._pinnable)

    def read(self, ref: RegionRef, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        return np.frombuffer(self._view, dtype=dtype, count=ref.byte_size // dtype.itemsize,
                             offset=ref.offset).reshape(shape)

    def write(self, ref: RegionRef, array: np.ndarray) -> None:
        target = np.frombuffer(self._view, dtype=np.uint8, count=array.nbytes, offset=ref.offset)
        target[:] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        if self._pinnable is not None:  # unregister refuses a region in use: no copy reads it now
            from streamrt.device.staging import PINNABLE

            PINNABLE.withdraw(self._pinnable)
            self._pinnable = None
        self._view.release()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an answered request's array still views it: unmapped when that is freed
                log.debug("region '%s': views still alive, unmapped when they are released", self.name)


def _cudart() -> Any:
    if available("cuda.bindings.runtime"):
        return require("cuda.bindings.runtime", extra="cuda-shm")
    # cuda-python < 12.6 named the module cuda.cudart
    return require("cuda.cudart", extra="cuda-shm", purpose="CUDA shared memory (opening CUDA IPC handles)")


def _check_cuda(result: Any, what: str) -> Any:
    """The value of a cuda-python call's ``(error, value)`` result; SharedMemoryError unless it succeeded."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    code = getattr(err, "value", err)  # cudaError_t is an enum in cuda-bindings 12 and 13
    if code != 0:
        raise SharedMemoryError(f"{what} failed: CUDA error {code} ({getattr(err, 'name', err)})")
    return rest[0] if len(rest) == 1 else rest


class _CudaRegion(_Region):
    kind = "CUDA"

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        super().__init__(name, byte_size)
        if len(raw_handle) != _IPC_HANDLE_SIZE:
            raise SharedMemoryError(f"region '{name}': raw_handle has {len(raw_handle)} bytes, a CUDA IPC handle "
                                    f"has {_IPC_HANDLE_SIZE}", hint="send cuda_shared_memory.get_raw_handle(...)")
        import torch

        if not torch.cuda.is_available() or not 0 <= device_id < torch.cuda.device_count():
            raise SharedMemoryError(f"region '{name}': CUDA device {device_id} is not available on this server")
        cudart = _cudart()
        self.device_id = device_id
        handle = cudart.cudaIpcMemHandle_t()
        if hasattr(handle, "getPtr"):  # cuda-bindings >= 13 dropped the settable 'reserved' field
            ctypes.memmove(handle.getPtr(), raw_handle, _IPC_HANDLE_SIZE)
        else:
            handle.reserved = raw_handle
        with torch.cuda.device(device_id):
            pointer = _check_cuda(cudart.cudaIpcOpenMemHandle(handle, cudart.cudaIpcMemLazyEnablePeerAccess),
                                  f"opening the CUDA IPC handle of region '{name}'")
        self._pointer = int(pointer)
        self._cudart = cudart
        self.tensor = torch.as_tensor(_CudaArray(self._pointer, byte_size), device=f"cuda:{device_id}")

    def read(self, ref: RegionRef, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        import torch

        from streamrt.types import DType

        torch_dtype = DType.from_any(dtype).torch
        raw = self.tensor[ref.offset : ref.offset + ref.byte_size]
        if not ref.byte_size:
            return DeviceTensor(torch.empty(shape, dtype=torch_dtype, device=self.tensor.device), dtype, shape)
        if ref.offset % dtype.itemsize:  # torch views need element alignment: one device copy instead
            raw = raw.clone()
        return DeviceTensor(raw.view(torch_dtype).view(shape), dtype, shape)

    def write(self, ref: RegionRef, array: np.ndarray) -> None:
        self.tensor[ref.offset : ref.offset + array.nbytes].copy_(_torch_view(np.ascontiguousarray(array)))

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def close(self) -> None:
        import torch

        with torch.cuda.device(self.device_id):
            torch.cuda.synchronize()
            del self.tensor
            _check_cuda(self._cudart.cudaIpcCloseMemHandle(self._pointer), f"closing CUDA region '{self.name}'")


class _CudaArray:
    """``__cuda_array_interface__`` over a raw device pointer, so torch can view it without a copy."""

    def __init__(self, pointer: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}


class SharedMemoryRegistry:
    """The registered regions of one server (one name space for system and CUDA regions).

    Used from the server's event loop only; reads of input views happen later on instance
    threads, which is why a region with users cannot be unregistered.
    """

    def __init__(self) -> None:
        self._regions: dict[str, _Region] = {}

    # --- registration -------------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the POSIX shared-memory object ``key`` as ``name``.

        Raises:
            RegionExistsError: ``name`` is registered already.
            SharedMemoryError: ``key`` is another region's already (Triton refuses it too: its second
                mapping of a key fails), does not open, or is smaller than ``offset + byte_size``.
        """
        holder = next((r.name for r in self._regions.values()
                       if isinstance(r, _SystemRegion) and r.key.lstrip("/") == key.lstrip("/")), None)
        if holder is not None and name not in self._regions:
            raise SharedMemoryError(f"failed to register shared memory region '{name}': key {key!r} is already "
                                    f"registered as region '{holder}'",
                                    hint=f"use region '{holder}' with an offset, or unregister it first")
        self._add(name, ("offset", offset), byte_size, lambda: _SystemRegion(name, key, offset, byte_size))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the CUDA IPC handle ``raw_handle`` (``byte_size`` bytes on ``device_id``) as ``name``.

        Raises:
            RegionExistsError: ``name`` is registered already.
            SharedMemoryError: the handle does not open on that device.
        """
        self._add(name, ("device_id", device_id), byte_size,
                  lambda: _CudaRegion(name, raw_handle, device_id, byte_size))

    def _add(self, name: str, where: tuple[str, int], byte_size: int, open_region: Callable[[], _Region]) -> None:
        """Register the region ``open_region`` opens as ``name`` (a free name; ``where`` and the size >= 0)."""
        if not name:
            raise SharedMemoryError("a shared memory region needs a non-empty name")
        if name in self._regions:  # Triton's words and code (ALREADY_EXISTS)
            raise RegionExistsError(f"shared memory region '{name}' already in manager",
                                    hint="unregister it first, or pick another name")
        field, value = where
        if value < 0 or byte_size < 0:
            raise SharedMemoryError(f"region '{name}': {field} and byte_size must be >= 0, got {value}, {byte_size}")
        region = self._regions[name] = open_region()
        log.debug("registered %s shared memory region '%s' (%d bytes)", region.kind, name, byte_size)

    def unregister(self, kind: str, name: str = "") -> None:
        """Close region ``name`` of ``kind`` ("system" or "CUDA"), or every region of that kind when empty.

        Unknown names are no error (as in Triton). Regions that requests still use are refused.
        """
        names = [name] if name else [n for n, r in self._regions.items() if r.kind == kind]
        chosen = [self._regions[n] for n in names if n in self._regions and self._regions[n].kind == kind]
        busy = [r for r in chosen if r.users]
        if busy:
            raise SharedMemoryError(
                "cannot unregister " + ", ".join(f"'{r.name}' ({r.users} requests use it)" for r in busy),
                hint="unregister after the requests that name it have been answered")
        for region in chosen:
            del self._regions[region.name]
            region.close()

    def status(self, kind: str = "system", name: str = "") -> list[dict[str, Any]]:
        """Status entries of ``kind``'s regions (one when ``name`` is given).

        Raises:
            RegionNotFoundError: ``name`` is not a registered region of that kind.
        """
        if name:  # Triton's words (NOT_FOUND)
            region = self._regions.get(name)
            if region is None:
                raise RegionNotFoundError(f"Unable to find {kind.lower()} shared memory region: '{name}'")
            if region.kind != kind:
                raise RegionNotFoundError(f"The region named '{name}' is registered as {region.kind} shared memory, "
                                          f"not {kind} shared memory")
            return [region.status()]
        return [r.status() for r in self._regions.values() if r.kind == kind]

    # --- use by requests ----------------------------------------------------------------------

    def _get(self, ref: RegionRef, where: str) -> _Region:
        region = self._regions.get(ref.name)
        if region is None:
            raise RegionNotFoundError(f"Unable to find shared memory region: '{ref.name}' ({where})",
                                      hint="register it first (register_system_shared_memory / "
                                      "register_cuda_shared_memory)")
        region.check(ref, where)
        return region

    def read_input(self, ref: RegionRef, dtype: np.dtype[Any], shape: tuple[int, ...], where: str,
                   leases: list[Any]) -> Any:
        """The input tensor in ``ref`` (a view); the region is leased until :meth:`release`.

        Raises:
            SharedMemoryError: unknown region, range out of bounds, byte size not the tensor's size.
        """
        region = self._get(ref, where)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if dtype.kind == "O":  # BYTES: the region holds the serialized elements (Triton's layout); copied out
            raw = np.asarray(region.read(ref, np.dtype(np.uint8), (ref.byte_size,)))
            array = deserialize_bytes(raw.data, count, where).reshape(shape)
            region.users += 1
            leases.append(region)
            return array
        needed = count * dtype.itemsize
        if ref.byte_size != needed:
            raise SharedMemoryError(f"{where}: shared_memory_byte_size is {ref.byte_size} but shape {list(shape)} "
                                    f"of this datatype needs {needed} bytes")
        array = region.read(ref, dtype, shape)
        region.users += 1
        leases.append(region)
        return array

    def lease_output(self, ref: RegionRef, where: str, leases: list[Any]) -> None:
        """Check an output's region now (bad names and ranges fail before inference) and lease it."""
        region = self._get(ref, where)
        region.users += 1
        leases.append(region)

    def write_outputs(self, targets: list[tuple[RegionRef, np.ndarray, str]]) -> list[int]:
        """Copy each ``(region, array, where)`` output into its region; nothing is written unless all fit.

        BYTES outputs (and classification results) are written serialized, each element as a 4-byte
        length and its bytes, as Triton writes them and tritonclient's ``get_contents_as_numpy`` reads them.

        Returns:
            The bytes written for each target, in order (what the response reports as its byte size).

        Raises:
            SharedMemoryError: a region is gone or an array is larger than its ``byte_size``.
        """
        regions, payloads = [], []
        for ref, array, where in targets:
            regions.append(self._get(ref, where))
            if array.dtype == object or array.dtype.kind in "SU":
                array = np.frombuffer(serialize_bytes(array), np.uint8)
            payloads.append(array)
            if array.nbytes > ref.byte_size:
                raise SharedMemoryError(
                    f"{where}: the output has {array.nbytes} bytes (shape {list(array.shape)}) but its shared memory "
                    f"region '{ref.name}' gives {ref.byte_size}; nothing was written",
                    hint="register a larger region or give a larger shared_memory_byte_size")
        for region, (ref, _, _), payload in zip(regions, targets, payloads, strict=True):
            region.write(ref, payload)
        return [payload.nbytes for payload in payloads]

    @staticmethod
    def release(leases: list[Any]) -> None:
        """End the leases taken while decoding a request (after its response is written)."""
        for region in leases:
            region.users -= 1
        leases.clear()

    def close(self) -> None:
        """Close every region (server shutdown); requests are over by then."""
        for region in list(self._regions.values()):
            try:
                region.close()
            except Exception:
                log.warning("closing shared memory region '%s' failed", region.name, exc_info=True)
        self._regions.clear()
