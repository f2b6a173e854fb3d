"""Device factory, host buffers and the event-gated pool."""

from __future__ import annotations

import threading

import pytest

from streamrt.device import BufferPool, CpuDevice, HostStream, cuda_available, get_device
from streamrt.errors import ConfigError, PipelineError, StageTimeoutError
from streamrt.types import DType

pytestmark = pytest.mark.timeout(30)


def test_get_device_kinds() -> None:
    assert get_device("cpu").kind == "cpu"
    assert get_device("auto").kind == ("cuda" if cuda_available() else "cpu")
    with pytest.raises(ConfigError, match="bogus"):
        get_device("bogus")


@pytest.mark.skipif(cuda_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(PipelineError, match="CUDA"):
        get_device("cuda")


@pytest.mark.torch
def test_cpu_buffers_take_any_dtype_spelling() -> None:
    import torch

    dev = CpuDevice()
    assert dev.host_buffer((2, 3), "uint8").dtype == torch.uint8
    assert dev.empty((4,), DType.FLOAT16).dtype == torch.float16
    assert dev.empty((4,), torch.int64).shape == (4,)
    assert str(dev.torch_device) == "cpu"
    pool = dev.pool((8,), "float32", 3)
    assert len(pool) == 3 and all(b.shape == (8,) for b in pool.buffers)


def test_pool_hands_out_round_robin_and_rejects_double_use() -> None:
    pool = BufferPool(["a", "b"])
    i, a = pool.acquire()
    _, b = pool.acquire()
    assert (a, b) == ("a", "b")
    with pytest.raises(PipelineError, match="still held"):
        pool.acquire()
    pool.release(i, None)
    with pytest.raises(PipelineError, match="not acquired"):
        pool.release(i, None)
    assert pool.acquire()[1] == "a"
    with pytest.raises(PipelineError):
        BufferPool([])


def test_pool_reuse_waits_for_the_release_event() -> None:
    stream = HostStream("consumer")
    try:
        pool = BufferPool([[0]])
        gate = threading.Event()
        index, buf = pool.acquire()
        stream.launch(lambda: (gate.wait(10), buf.__setitem__(0, 1)))
        pool.release(index, stream.record())
        with pytest.raises(StageTimeoutError):
            pool.acquire(timeout=0.05)
        gate.set()
        _, again = pool.acquire(timeout=5)
        assert again == [1]  # the consumer finished before the buffer came back
        pool.release(0, None)
        # With a stream, the wait is enqueued on it instead of blocking the host.
        other = HostStream("next-user")
        try:
            gate2 = threading.Event()
            stream.launch(lambda: gate2.wait(10))
            pool.acquire()
            pool.release(0, stream.record())
            pool.acquire(stream=other)
            seen: list[int] = []
            other.launch(lambda: seen.append(1))
            gate2.set()
            other.synchronize()
            assert seen == [1]
        finally:
            other.close(cancel=True, timeout=5)
    finally:
        stream.close(cancel=True, timeout=5)
