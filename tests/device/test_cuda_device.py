"""CUDA streams, events and buffers on a real GPU (marker ``gpu``)."""

from __future__ import annotations

import threading

import pytest

from streamrt.device import get_device
from streamrt.errors import PipelineError

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

SLEEP_CYCLES = 500_000_000  # torch.cuda._sleep: ~250 ms at H200 clocks, long enough under host contention


@pytest.fixture
def dev():
    return get_device("cuda")


def test_streams_are_fresh_non_default_streams_with_raw_handles(dev) -> None:
    import torch

    s1, s2 = dev.stream("a"), dev.stream("b")
    default = torch.cuda.default_stream()
    assert s1.is_cuda and isinstance(s1.torch, torch.cuda.Stream)
    assert s1.handle == s1.torch.cuda_stream != 0
    assert s1.handle != default.cuda_stream and s1.handle != s2.handle


def test_launch_makes_the_stream_current_then_restores(dev) -> None:
    import torch

    stream = dev.stream("x")
    seen: list[int] = []
    stream.launch(lambda: seen.append(torch.cuda.current_stream().cuda_stream))
    assert seen == [stream.handle]
    assert torch.cuda.current_stream().cuda_stream == torch.cuda.default_stream().cuda_stream


def test_wait_orders_work_across_streams_without_a_host_sync(dev) -> None:
    import torch

    a, b = dev.stream("a"), dev.stream("b")
    x = dev.empty((1 << 20,), torch.float32)
    out = dev.empty((1 << 20,), torch.float32)
    # Load the kernels first: a first launch (lazy module loading) on a busy host can outlast the sleep.
    torch.mul(x.fill_(1.0), 2, out=out)
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    a.launch(lambda: (torch.cuda._sleep(SLEEP_CYCLES), x.fill_(1.0)))
    b.wait(a.record())
    b.launch(lambda: torch.mul(x, 2, out=out))
    done = b.record()
    assert not done.query()  # the host did not block: the sleep is still running
    done.synchronize()
    assert bool((out == 2).all())


def test_timing_events_and_host_wait_with_timeout(dev) -> None:
    import torch

    stream = dev.stream("t")
    start = stream.record(stream.new_event(timing=True))
    stream.launch(lambda: torch.cuda._sleep(SLEEP_CYCLES))
    end = stream.record(stream.new_event(timing=True))
    assert end.wait(timeout=0.001) is False
    assert end.wait(timeout=30) is True
    assert start.elapsed_ms(end) > 1.0


def test_pinned_and_device_buffers(dev) -> None:
    import torch

    pinned = dev.host_buffer((16,), "float32")
    assert pinned.is_pinned() and pinned.device.type == "cpu"
    assert not dev.host_buffer((16,), torch.uint8, pinned=False).is_pinned()
    assert dev.empty((4, 4), "float16").device.type == "cuda"
    pool = dev.pool((8,), torch.float32, 2, host=True)
    assert all(b.is_pinned() for b in pool.buffers)


def test_host_stream_waits_for_a_cuda_event(dev) -> None:
    import torch

    cuda, host = dev.stream("gpu"), dev.host_stream("host")
    src = dev.empty((1024,), torch.float32)
    dst = dev.host_buffer((1024,), torch.float32)
    dst.fill_(-1)
    seen: list[float] = []
    try:
        cuda.launch(lambda: (torch.cuda._sleep(SLEEP_CYCLES), src.fill_(3.0), dst.copy_(src, non_blocking=True)))
        host.wait(cuda.record())
        host.launch(lambda: seen.append(float(dst.min())))
        host.synchronize()
        assert seen == [3.0]
    finally:
        host.close(timeout=10)


def test_a_cuda_stream_waits_only_for_completed_host_events(dev) -> None:
    cuda, host = dev.stream("gpu"), dev.host_stream("host")
    try:
        done = host.record()
        done.synchronize()
        cuda.wait(done)  # completed: nothing to wait for on the GPU
        gate = threading.Event()
        host.launch(lambda: gate.wait(10))
        pending = host.record()
        with pytest.raises(PipelineError, match="pending host event"):
            cuda.wait(pending)
        gate.set()
    finally:
        host.close(timeout=10)


def test_a_gpu_index_that_does_not_exist_is_refused() -> None:
    import torch

    from streamrt.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"CUDA device {torch.cuda.device_count()} does not exist"):
        get_device("cuda", torch.cuda.device_count())


@pytest.mark.skipif(not __import__("torch").cuda.is_available() or __import__("torch").cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs (torch.cuda.device_count() < 2)")
def test_second_gpu_streams_buffers_and_scope() -> None:
    import numpy as np
    import torch

    from streamrt.device import device_scope

    dev = get_device("cuda", 1)
    s = dev.stream("one")
    assert s.torch.device.index == 1 and dev.empty((4,), "float32").device.index == 1
    host = dev.host_buffer((4,), "float32")
    assert host.is_pinned()
    data = np.random.default_rng().standard_normal(4).astype(np.float32)
    host.numpy()[:] = data
    out = torch.empty(4, device="cuda:1")
    s.launch(lambda: out.copy_(host, non_blocking=True))
    s.record().synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), data)
    with device_scope(1):
        assert torch.cuda.current_device() == 1
    assert torch.cuda.current_device() == 0
