"""The shared-memory arena of one front-end worker, and the block allocator of each half.

The engine process creates the arena as an anonymous ``memfd`` (no ``/dev/shm`` name that could
leak, and not bound by the size of ``/dev/shm``; the memory goes when the last process holding it
exits or unmaps it) and passes the descriptor to the worker. Pages are used as tensors first land
on them: the allocator reuses the lowest free offsets, so the memory an arena uses is its peak of
tensors in flight, not its size. The worker writes request inputs into the first half (and
frees a block when the engine's reply arrives: the engine replies only after ``core.infer``
returned, so nothing still reads it); the engine writes outputs into the second half (and frees a
block when the worker says it has serialised the response). Each side allocates only in its own
half, so no lock crosses the processes.

In the engine process the input half is also offered for page-locking
(:meth:`Arena.offer_inputs`): a CUDA instance then copies a request's tensors straight from the
arena to the device, with no gather into a pinned staging slot first (the chunks a copy reads are
locked on first use, so only the part of the arena in use is locked).

Example:
    >>> blocks = Blocks(0, 1024)
    >>> a, b = blocks.alloc(100), blocks.alloc(100)
    >>> (a, b), blocks.free(a), blocks.alloc(64)
    ((0, 128), None, 0)
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os

import numpy as np

from streamrt.errors import ConfigError

__all__ = ["ALIGN", "Arena", "Blocks"]

ALIGN = 64
"""Blocks start on 64-byte boundaries (a cache line; every dtype's alignment)."""


class Blocks:
    """First-fit allocator over ``[start, start + size)``: ``alloc`` returns an offset or None when full."""

    def __init__(self, start: int, size: int) -> None:
        self._starts: list[int] = [start]
        self._sizes: list[int] = [size]
        self._used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for i, size in enumerate(self._sizes):
            if size >= need:
                offset = self._starts[i]
                if size == need:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += need
                    self._sizes[i] -= need
                self._used[offset] = need
                return offset
        return None

    def free(self, offset: int) -> None:
        size = self._used.pop(offset)
        i = bisect.bisect(self._starts, offset)
        if i < len(self._starts) and offset + size == self._starts[i]:  # merge with the next free block
            size += self._sizes[i]
            del self._starts[i], self._sizes[i]
        if i and self._starts[i - 1] + self._sizes[i - 1] == offset:  # and with the previous one
            self._sizes[i - 1] += size
            return
        self._starts.insert(i, offset)
        self._sizes.insert(i, size)

    @property
    def used(self) -> int:
        """Bytes in allocated blocks."""
        return sum(self._used.values())


class Arena:
    """A shared mapping of ``size`` bytes split in an input half (worker) and an output half (engine).

    Attributes:
        fd: the memfd (pass it to the worker; closed by :meth:`close`).
        array: the whole mapping as a uint8 array (views of it are the request tensors).
        base: the mapping's address (to recognise arrays that already live in it).
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self._map = mmap.mmap(fd, size)
        self.array = np.frombuffer(self._map, np.uint8)
        self.base = int(self.array.__array_interface__["data"][0])
        half = size // 2 // ALIGN * ALIGN
        self.inputs = Blocks(0, half)
        self.outputs = Blocks(half, size - half)
        self.input_bytes = half
        self._offered = False

    @classmethod
    def create(cls, size: int, name: str = "streamrt-frontend") -> Arena:
        """A new arena of ``size`` bytes (address space: pages are used when written).

        Raises:
            ConfigError: the memfd cannot be created or sized.
        """
        try:
            fd = os.memfd_create(name)
        except OSError as exc:
            raise ConfigError(f"cannot create a front-end arena: {exc}",
                              hint="--frontend-processes 1 serves without one") from None
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(f"cannot size a {size >> 20} MiB front-end arena: {exc}",
                              hint="lower --frontend-arena-mb") from None
        return cls(fd, size)

    def offset_of(self, array: np.ndarray) -> int | None:
        """``array``'s offset in the arena when it is a contiguous view inside it, else None."""
        if not array.flags.c_contiguous or array.dtype.hasobject:
            return None
        start = int(array.__array_interface__["data"][0]) - self.base
        return start if start >= 0 and start + array.nbytes <= self.size else None

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        return self.array[offset : offset + nbytes]

    def offer_inputs(self) -> None:
        """Let CUDA instances page-lock the input half and copy from it directly (the engine process's
        arenas; see :class:`~streamrt.device.staging.PinnableMemory`). No CUDA call until a copy needs one."""
        from streamrt.device.staging import PINNABLE

        PINNABLE.offer(self.array[: self.input_bytes])
        self._offered = True

    def close(self) -> None:
        """Close the descriptor and unmap (the mapping stays until the last view of it is gone); what was
        page-locked of it is unlocked first (the engine closes an arena once nothing reads it)."""
        if self._offered:
            from streamrt.device.staging import PINNABLE

            PINNABLE.withdraw(self.array)
            self._offered = False
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.array = np.empty(0, np.uint8)
        with contextlib.suppress(BufferError):  # arrays still view it: the mapping goes with the last of them
            self._map.close()
