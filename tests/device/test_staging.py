"""The staging path (streamrt.device.staging): gather into slots, copy to the device and back, split.

Every test runs on the host device (host streams, here) and, marked ``gpu``, on CUDA. The steps run
the way their users run them: launched on a stream (a pipeline stage, an instance's worker), then the
stream is synchronised before the host reads the results. Destination buffers are poisoned so a row
the path failed to write cannot pass for data.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from streamrt.device import (
    Device,
    HostBatch,
    HostSlots,
    HostStream,
    InlineStream,
    Stream,
    as_torch_stream,
    gather_into,
    get_device,
    split_rows,
    stream_scope,
    to_device,
    to_host,
)
from streamrt.errors import PipelineError

pytestmark = pytest.mark.timeout(60)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [np.float32, np.float16, np.int64, np.int32, np.uint8, np.int8]
ITEM = (3, 5)
POISON_INT = 101  # outside the data's [0, 100), and it fits int8 and uint8


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Device:
    return get_device(request.param)


@pytest.fixture
def stream(device: Device) -> Iterator[Stream]:
    s = device.stream("staging")
    yield s
    s.close(timeout=10)


def _on(stream: Stream, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in ``stream``'s order (as a stage or an instance worker does), wait, return its result."""
    box: list[Any] = []
    stream.launch(lambda: box.append(fn()))
    stream.synchronize()
    return box[0]


def _requests(rng: np.random.Generator, dtype: Any, sizes: Sequence[int]) -> list[np.ndarray]:
    """Fresh random rows, never the poison: floats in [-1, 1), integers in [0, 100)."""
    if np.issubdtype(dtype, np.floating):
        return [rng.uniform(-1, 1, (n, *ITEM)).astype(dtype) for n in sizes]
    return [rng.integers(0, 100, (n, *ITEM)).astype(dtype) for n in sizes]


def _poison(buffer: Any) -> None:
    floating = buffer.dtype.is_floating_point if hasattr(buffer.dtype, "is_floating_point") else np.issubdtype(
        buffer.dtype, np.floating)
    value = float("nan") if floating else POISON_INT
    if isinstance(buffer, np.ndarray):
        buffer.fill(value)
    else:
        buffer.fill_(value)


def _still_poisoned(rows: np.ndarray) -> None:
    assert (np.isnan(rows) if np.issubdtype(rows.dtype, np.floating) else rows == POISON_INT).all()


def _numpy(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.cpu().numpy()


def _equal(got: Any, want: np.ndarray) -> None:
    got = _numpy(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # copies are exact; a poisoned row (NaN, -7) fails


def _sizes(rng: np.random.Generator) -> list[int]:
    return [int(n) for n in rng.integers(1, 6, size=int(rng.integers(2, 6)))]  # ragged, 2..5 requests


@pytest.mark.torch
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("into", [False, True], ids=["fresh", "preallocated"])
def test_gather_copy_split_round_trip(device: Device, stream: Stream, dtype: Any, into: bool) -> None:
    """Per-request rows -> slot -> device -> host -> per-request views, bit for bit, for ragged batches."""
    rng = np.random.default_rng()
    slots = HostSlots(device, rows=32)
    slot = slots.slot("x", dtype, ITEM)
    device_out = device.empty((32, *ITEM), dtype) if into else None
    host_out = device.host_buffer((32, *ITEM), dtype, pinned=True) if into else None
    for _ in range(3):  # the same buffers, new data each time
        sizes = _sizes(rng)
        requests = _requests(rng, dtype, sizes)
        rows = sum(sizes)
        _poison(slot.array)
        if into:
            _poison(device_out)
            _poison(host_out)
            if device.is_cuda:
                # The poison is written on the current (default) stream; the copies below run on
                # ``stream``, which does not wait for it: without this, the fill could land after the
                # copy (seen on the H200 under six test processes: a poisoned row read back).
                import torch

                torch.cuda.synchronize()

        def step(requests: list[np.ndarray] = requests, sizes: list[int] = sizes, rows: int = rows) -> list[Any]:
            batch = slots.gather("x", requests)
            on_device = to_device(batch, device, stream, out=None if device_out is None else device_out[:rows])
            back = to_host(on_device, stream, out=None if host_out is None else host_out[:rows])
            return split_rows({"x": back}, sizes)

        parts = _on(stream, step)
        assert len(parts) == len(requests)
        for part, want in zip(parts, requests, strict=True):
            _equal(part["x"], want)
        assert slots.slot("x", dtype, ITEM) is slot  # the one slot, reused
        _still_poisoned(slot.array[rows:])  # nothing wrote past the batch's rows
        if into:
            _still_poisoned(_numpy(host_out)[rows:])


def test_string_rows_gather_on_the_host_device() -> None:
    """The host device's slots are NumPy, so BYTES/string tensors (object arrays) batch too."""
    rng = np.random.default_rng()
    sizes = _sizes(rng)
    requests = [np.array([[str(v)] for v in rng.integers(0, 10**6, n)], dtype=object) for n in sizes]
    slots = HostSlots(get_device("cpu"), rows=32)
    slots.slot("s", object, (1,)).array.fill("poison")
    batch = slots.gather("s", requests)
    for part, want in zip(split_rows({"s": batch.array}, sizes), requests, strict=True):
        assert part["s"].tolist() == want.tolist()


class _CountingDevice:
    """A device that counts its allocations (delegates everything else to ``inner``)."""

    def __init__(self, inner: Device) -> None:
        self.inner = inner
        self.allocations = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def host_buffer(self, shape: Sequence[int], dtype: Any, *, pinned: bool = True) -> Any:
        self.allocations += 1
        return self.inner.host_buffer(shape, dtype, pinned=pinned)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


@pytest.mark.torch
def test_slots_are_allocated_once_and_reused(device: Device, stream: Stream) -> None:
    """Steady state: the same slot (same object, same memory) every call, and no new host allocation."""
    rng = np.random.default_rng()
    item = (64, 64)  # 16 KiB a row: a copy of even one request's rows would exceed the bound below
    counting = _CountingDevice(device)
    slots = HostSlots(counting, rows=32)  # type: ignore[arg-type]
    first = [rng.standard_normal((n, *item), dtype=np.float32) for n in (4, 7)]
    slot = slots.slot("x", np.float32, item)
    start = _address(slot.array)
    allocated = counting.allocations
    host_out = device.host_buffer((32, *item), np.float32, pinned=True)
    device_out = device.empty((32, *item), np.float32)
    _on(stream, lambda: to_host(to_device(slots.gather("x", first), device, stream, out=device_out[:11]), stream,
                                out=host_out[:11]))

    tracemalloc.start()  # NumPy reports its data allocations to tracemalloc
    try:
        for _ in range(10):
            sizes = _sizes(rng)
            requests = [rng.standard_normal((n, *item), dtype=np.float32) for n in sizes]  # before the measure
            rows = sum(sizes)
            snapshot = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            batch = _on(stream, lambda r=requests, n=rows: slots.gather("x", r))
            got_device = _on(stream, lambda b=batch, n=rows: to_device(b, device, stream, out=device_out[:n]))
            got_host = _on(stream, lambda d=got_device, n=rows: to_host(d, stream, out=host_out[:n]))
            grown = tracemalloc.get_traced_memory()[1] - snapshot
            assert grown < 64 * 64 * 4, f"a steady-state call allocated {grown} bytes"
            assert slots.slot("x", np.float32, item) is slot and _address(batch.array) == start
            assert got_device.data_ptr() == device_out.data_ptr() and got_host.data_ptr() == host_out.data_ptr()
            _equal(got_host, np.concatenate(requests))
    finally:
        tracemalloc.stop()
    assert counting.allocations == allocated and len(slots) == 1


def test_slots_keep_at_most_max_keys_and_overflow_gets_a_fresh_array() -> None:
    rng = np.random.default_rng()
    slots = HostSlots(get_device("cpu"), rows=4, max_keys=2)
    a = slots.slot("a", np.float32, ITEM)
    slots.slot("b", np.float32, ITEM)
    slots.slot("c", np.int64, ITEM)  # a third key drops the oldest ("a")
    assert len(slots) == 2 and slots.slot("a", np.float32, ITEM) is not a
    big = _requests(rng, np.float32, [3, 3])  # 6 rows > 4: not a slot
    batch = slots.gather("b", big)
    assert not any(np.shares_memory(batch.array, slots.slot(k, np.float32, ITEM).array) for k in ("a", "b"))
    _equal(batch.array, np.concatenate(big))
    with pytest.raises(PipelineError, match="rows >= 1"):
        HostSlots(get_device("cpu"), rows=0)


@pytest.mark.torch
def test_gather_into_a_caller_buffer(device: Device) -> None:
    """A ring slot's own (pinned) buffer: parts land one after another; a wrong shape is refused."""
    import torch

    rng = np.random.default_rng()
    parts = _requests(rng, np.float32, [2, 3])
    for out in (device.host_buffer((8, *ITEM), np.float32, pinned=True), np.empty((8, *ITEM), np.float32)):
        _poison(out)
        assert gather_into(out, [torch.from_numpy(parts[0]), parts[1]]) == 5
        _equal(_numpy(out)[:5], np.concatenate(parts))
        assert np.isnan(_numpy(out)[5:]).all()
        with pytest.raises(PipelineError, match="item shape"):
            gather_into(out, [np.zeros((1, 4, 5), np.float32)])
        with pytest.raises(PipelineError, match="do not fit"):
            gather_into(out, [np.zeros((9, *ITEM), np.float32)])


def test_split_rows_gives_views_and_take_picks_parts() -> None:
    rng = np.random.default_rng()
    sizes = _sizes(rng)
    batch = {"y": rng.standard_normal((sum(sizes), 4)), "z": rng.integers(0, 9, (sum(sizes),))}
    parts = split_rows(batch, sizes)
    bounds = np.cumsum([0, *sizes])
    for i, part in enumerate(parts):
        assert np.shares_memory(part["y"], batch["y"])
        _equal(part["z"], batch["z"][bounds[i]:bounds[i + 1]])
    taken = split_rows(batch, sizes, lambda name, value, i, a, b: (name, i, b - a))
    assert [p["y"] for p in taken] == [("y", i, n) for i, n in enumerate(sizes)]


def test_host_batch_rows_are_views() -> None:
    array = np.arange(12.0).reshape(4, 3)
    assert np.shares_memory(HostBatch(array).rows(2).array, array) and len(HostBatch(array).rows(2)) == 2


def test_host_streams_have_no_torch_stream() -> None:
    host, inline = HostStream("h"), InlineStream("i")
    try:
        assert isinstance(host, Stream) and host.torch_stream is None and inline.torch_stream is None
        assert as_torch_stream(host) is None and as_torch_stream(inline) is None and as_torch_stream(None) is None
        with stream_scope(host):  # nothing to enter: runs here
            pass
    finally:
        host.close()


@pytest.mark.gpu
def test_cuda_streams_expose_their_torch_stream() -> None:
    import torch

    s = get_device("cuda").stream("typed")
    bare = torch.cuda.Stream()
    assert isinstance(s.torch_stream, torch.cuda.Stream) and s.torch_stream.cuda_stream == s.handle
    assert as_torch_stream(s) is s.torch_stream and as_torch_stream(bare) is bare
    with stream_scope(s):
        assert torch.cuda.current_stream() == s.torch_stream
    with stream_scope(bare):
        assert torch.cuda.current_stream() == bare
