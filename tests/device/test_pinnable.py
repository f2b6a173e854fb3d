"""Direct device copies from page-locked memory outside torch's allocator (streamrt.device.staging's
``PinnableMemory`` and ``rows_to_device``): what the engine process does with its front-end arenas.

On the CPU the registry runs with a recording stand-in for ``cudaHostRegister``; marked ``gpu``, a
real shared mapping (a memfd, as the arenas) is locked and copied from, against the slot path's result.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import numpy as np
import pytest

from streamrt.device import get_device
from streamrt.device.staging import DIRECT_MIN_BYTES, PinnableMemory, rows_to_device
from streamrt.errors import PipelineError

pytestmark = pytest.mark.timeout(60)

CHUNK = 4096


class Recorder:
    """A stand-in for cudaHostRegister / cudaHostUnregister: records (address, nbytes)."""

    def __init__(self, fail: bool = False) -> None:
        self.locked: dict[int, int] = {}
        self.calls = 0
        self.fail = fail

    def register(self, address: int, nbytes: int) -> bool:
        self.calls += 1
        if self.fail:
            return False
        self.locked[address] = nbytes
        return True

    def unregister(self, address: int, nbytes: int) -> bool:
        return self.locked.pop(address) == nbytes


@pytest.fixture
def shared() -> Iterator[np.ndarray]:
    """A shared mapping as the arenas are (a memfd), as a writable uint8 array."""
    fd = os.memfd_create("pinnable-test")
    os.ftruncate(fd, 64 * CHUNK)
    mapping = mmap.mmap(fd, 64 * CHUNK)
    yield np.frombuffer(mapping, np.uint8)
    os.close(fd)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_chunks_are_locked_on_first_use_only_and_unlocked_on_withdraw(shared: np.ndarray) -> None:
    cuda = Recorder()
    memory = PinnableMemory(CHUNK, cuda.register, cuda.unregister)
    memory.offer(shared)
    assert memory.locked_bytes == 0 and cuda.calls == 0  # offering alone locks nothing
    inside = shared[CHUNK - 8 : CHUNK + 24].view(np.float32)  # spans the first two chunks
    pytest.importorskip("torch")
    pieces = memory.pieces(inside)
    assert pieces is not None and [p.numel() for p in pieces] == [8, 24]
    assert sorted(cuda.locked) == [_address(shared), _address(shared) + CHUNK]
    assert memory.pieces(shared[CHUNK : CHUNK + 64]) is not None and cuda.calls == 2  # already locked
    assert b"".join(p.numpy().tobytes() for p in pieces) == inside.tobytes()
    memory.withdraw(shared)
    assert not cuda.locked and memory.locked_bytes == 0
    assert memory.pieces(inside) is None  # forgotten


def test_memory_not_offered_or_not_lockable_takes_the_slot(shared: np.ndarray) -> None:
    cuda = Recorder(fail=True)
    memory = PinnableMemory(CHUNK, cuda.register, cuda.unregister)
    assert memory.pieces(shared[:64]) is None and cuda.calls == 0  # not offered
    memory.offer(shared)
    assert memory.pieces(shared[:64]) is None and cuda.calls == 1
    assert memory.pieces(shared[:64]) is None and cuda.calls == 1  # failed once: not tried again
    assert memory.pieces(np.zeros(8, np.float32)) is None  # private memory
    assert memory.pieces(shared[: 2 * 64 : 2]) is None  # not contiguous
    with pytest.raises(PipelineError, match="writable 1-D uint8"):
        memory.offer(np.zeros(8, np.float32))


def test_rows_to_device_leaves_the_host_device_to_the_slot(shared: np.ndarray) -> None:
    memory = PinnableMemory(CHUNK, Recorder().register, Recorder().unregister)
    memory.offer(shared)
    device = get_device("cpu")
    assert rows_to_device([shared[:64].view(np.float32).reshape(4, 4)], device, None, pinnable=memory) is None


@pytest.mark.gpu
@pytest.mark.parametrize("requests", [1, 3])
def test_rows_copied_straight_from_locked_shared_memory(requests: int) -> None:
    from streamrt._optional import available

    torch = pytest.importorskip("torch")
    if not (available("cuda.bindings.runtime") or available("cuda.cudart")):
        pytest.skip("cuda-python (streamrt[cuda-shm]) locks the memory")
    size = 8 << 20
    fd = os.memfd_create("pinnable-gpu")
    os.ftruncate(fd, size)
    mapping = mmap.mmap(fd, size)
    buffer = np.frombuffer(mapping, np.uint8)
    memory = PinnableMemory(1 << 20)  # small chunks: the parts span several
    memory.offer(buffer)
    device = get_device("cuda")
    stream = device.stream("pinnable")
    rng = np.random.default_rng()
    item = (3, 128, 128)  # 192 KiB a row: every part is past DIRECT_MIN_BYTES, and they cross 1 MiB chunks
    rows = [2, 1, 3][:requests]
    parts, offset = [], 4096 + 64
    for n in rows:
        part = buffer[offset : offset + n * 4 * int(np.prod(item))].view(np.float32).reshape(n, *item)
        part[...] = rng.standard_normal(part.shape, dtype=np.float32)
        parts.append(part)
        offset += part.nbytes + 64
    assert min(p.nbytes for p in parts) >= DIRECT_MIN_BYTES
    try:
        out = rows_to_device(parts, device, stream, pinnable=memory)
        assert out is not None and out.is_cuda and tuple(out.shape) == (sum(rows), *item)
        stream.synchronize()
        np.testing.assert_array_equal(out.cpu().numpy(), np.concatenate(parts))
        assert memory.locked_bytes >= 1 << 20
        assert torch.from_numpy(buffer[4096:8192]).is_pinned()  # cudaHostRegister'ed: DMA, no staging
    finally:
        memory.withdraw(buffer)
        stream.close(timeout=10)
    assert memory.locked_bytes == 0
    os.close(fd)


class _CopyOnlyDevice:
    """Claims CUDA and allocates CPU tensors: runs rows_to_device's copies on a machine without a GPU."""

    is_cuda = True

    def empty(self, shape: tuple[int, ...], dtype: object) -> object:
        from streamrt.device.buffers import torch_dtype

        torch = pytest.importorskip("torch")
        return torch.full(shape, 7, dtype=torch_dtype(dtype))  # poisoned: an unwritten row fails


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_rows_to_device_concatenates_parts_across_chunks(shared: np.ndarray, dtype: type) -> None:
    pytest.importorskip("torch")
    cuda = Recorder()
    memory = PinnableMemory(CHUNK, cuda.register, cuda.unregister)
    memory.offer(shared)
    rng = np.random.default_rng()
    item = (DIRECT_MIN_BYTES // np.dtype(dtype).itemsize // 4 // 4, 4)  # 1/4 of the minimum part per row
    rows, parts, offset = [4, 5, 6], [], 0
    for n in rows:
        nbytes = n * int(np.prod(item)) * np.dtype(dtype).itemsize
        if offset + nbytes > shared.nbytes:
            pytest.skip("the test mapping is too small for these parts")
        part = shared[offset : offset + nbytes].view(dtype).reshape(n, *item)
        part[...] = rng.integers(0, 100, part.shape).astype(dtype)
        parts.append(part)
        offset += nbytes
    out = rows_to_device(parts, _CopyOnlyDevice(), None, pinnable=memory)  # type: ignore[arg-type]
    assert out is not None
    np.testing.assert_array_equal(out.numpy(), np.concatenate(parts))
    assert len(cuda.locked) > 1  # the parts span several chunks, each locked once
    small = [p[:1] for p in parts]  # several parts under DIRECT_MIN_BYTES: one gather is cheaper
    assert rows_to_device(small, _CopyOnlyDevice(), None, pinnable=memory) is None  # type: ignore[arg-type]
    assert rows_to_device([parts[0][:1]], _CopyOnlyDevice(), None, pinnable=memory) is not None  # type: ignore[arg-type]
    assert rows_to_device([parts[0], parts[1][:, :2]], _CopyOnlyDevice(), None, pinnable=memory) is None  # type: ignore[arg-type]
    memory.withdraw(shared)
