"""Gathers in pieces on threads (streamrt.device.row_copier) and the staging step built on it
(:func:`streamrt.device.staging.stage_to_device`).

Destinations are poisoned so a row the copier skipped cannot pass for data, every batch is fresh random
data, and every piece is checked at the moment it is handed on: a piece announced before its rows (or an
earlier piece's rows) are in place would let a device copy read a half-written slot.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from streamrt.device import Device, HostSlots, get_device, stream_scope
from streamrt.device import row_copier as rc
from streamrt.device.row_copier import RowCopier, default_staging_threads, plan_pieces, staging_threads
from streamrt.device.staging import stage_to_device
from streamrt.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

ITEM = (3, 7)


def _batch(rng: np.random.Generator, sizes: Sequence[int], dtype: Any = np.float32) -> list[np.ndarray]:
    if np.issubdtype(dtype, np.floating):
        return [rng.uniform(-1, 1, (n, *ITEM)).astype(dtype) for n in sizes]
    return [rng.integers(0, 100, (n, *ITEM)).astype(dtype) for n in sizes]


def _poisoned(rows: int, dtype: Any = np.float32) -> np.ndarray:
    out = np.empty((rows, *ITEM), dtype)
    out.fill(np.nan if np.issubdtype(dtype, np.floating) else 101)
    return out


@pytest.fixture(params=[0, 1, 3], ids=lambda t: f"threads{t}")
def copier(request: pytest.FixtureRequest) -> Iterator[RowCopier]:
    c = RowCopier(request.param, piece_bytes=2 * 3 * 7 * 4 + 1, min_bytes=0)  # two float32 rows a piece
    yield c
    c.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_pieces_land_in_row_order_each_complete_when_handed_on(copier: RowCopier, dtype: Any) -> None:
    rng = np.random.default_rng()
    sizes = [int(n) for n in rng.integers(1, 6, 5)]
    arrays = _batch(rng, sizes, dtype)
    expected = np.concatenate(arrays)
    out = _poisoned(sum(sizes) + 3, dtype)
    handed: list[tuple[int, int]] = []

    def on_piece(start: int, stop: int) -> None:
        assert start == (handed[-1][1] if handed else 0), "pieces out of order or with a gap"
        np.testing.assert_array_equal(out[:stop], expected[:stop])  # this piece and every one before it
        handed.append((start, stop))

    assert copier.gather(out, arrays, on_piece) == sum(sizes)
    np.testing.assert_array_equal(out[: sum(sizes)], expected)
    assert handed[-1][1] == sum(sizes) and len(handed) > len(sizes) // 2
    assert (np.isnan(out[sum(sizes):]) if np.issubdtype(dtype, np.floating) else out[sum(sizes):] == 101).all()


def test_a_small_gather_is_one_copy_and_one_piece() -> None:
    rng = np.random.default_rng()
    arrays = _batch(rng, [2, 3])
    copier = RowCopier(2, piece_bytes=8, min_bytes=1 << 20)
    try:
        handed: list[tuple[int, int]] = []
        out = _poisoned(5)
        copier.gather(out, arrays, lambda a, b: handed.append((a, b)))
        assert handed == [(0, 5)]
        np.testing.assert_array_equal(out, np.concatenate(arrays))
    finally:
        copier.close()


def test_pieces_are_whole_rows_and_never_span_two_arrays() -> None:
    arrays = [np.zeros((5, 4), np.uint8), np.zeros((1, 4), np.uint8), np.zeros((3, 4), np.uint8)]
    pieces = plan_pieces(arrays, 9)  # two 4-byte rows fit
    assert [(p.start, p.stop) for p in pieces] == [(0, 2), (2, 4), (4, 5), (5, 6), (6, 8), (8, 9)]
    assert all(np.shares_memory(p.source, arrays[0]) for p in pieces[:3])
    assert [(p.start, p.stop) for p in plan_pieces([np.zeros((2, 100), np.uint8)], 10)] == [(0, 1), (1, 2)]


def test_wrong_shapes_are_refused_before_anything_is_written(copier: RowCopier) -> None:
    rng = np.random.default_rng()
    out = _poisoned(6)
    with pytest.raises(ValueError, match="item shape"):
        copier.gather(out, [*_batch(rng, [2]), np.zeros((2, 3, 8), np.float32)])
    with pytest.raises(ValueError, match="dimension"):
        copier.gather(out, [np.zeros((2, 3), np.float32)])
    with pytest.raises(ValueError, match="do not fit"):
        copier.gather(out, _batch(rng, [4, 3]))
    assert np.isnan(out).all()


def test_a_failing_piece_raises_its_error_and_nothing_after_it_is_handed_on(copier: RowCopier) -> None:
    rng = np.random.default_rng()
    good = _batch(rng, [4, 4], np.int32)
    bad = rng.uniform(size=(4, *ITEM))  # float64 into int32: NumPy's same_kind rule refuses it
    handed: list[tuple[int, int]] = []
    out = _poisoned(12, np.int32)
    with pytest.raises(TypeError, match="same_kind"):
        copier.gather(out, [good[0], bad, good[1]], lambda a, b: handed.append((a, b)))
    # pieces before the bad one may be handed on before a helper reaches it; none of the bad one's or after it
    assert all(stop <= 4 for _, stop in handed), handed
    assert handed or copier.threads, "on its own thread the copier hands on what landed before the failure"


def test_an_error_while_handing_on_stops_the_rest(copier: RowCopier) -> None:
    rng = np.random.default_rng()
    calls: list[int] = []

    def on_piece(start: int, stop: int) -> None:
        calls.append(start)
        if len(calls) == 2:
            raise RuntimeError("the device copy failed")

    with pytest.raises(RuntimeError, match="device copy failed"):
        copier.gather(_poisoned(8), _batch(rng, [4, 4]), on_piece)
    assert len(calls) == 2


def test_threads_come_from_the_environment_or_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rc.ENV_VAR, "3")
    assert staging_threads() == 3
    for bad in ("-1", "two"):
        monkeypatch.setenv(rc.ENV_VAR, bad)
        with pytest.raises(ConfigError, match=rc.ENV_VAR):
            staging_threads()
    monkeypatch.setenv(rc.ENV_VAR, "off")
    assert staging_threads() is None
    monkeypatch.delenv(rc.ENV_VAR)
    assert staging_threads() == default_staging_threads()
    assert [default_staging_threads(n) for n in (1, 2, 4, 8, 16, 96)] == [0, 0, 1, 2, 4, 4]
    with pytest.raises(ConfigError, match="threads >= 0"):
        RowCopier(-1)


def test_the_shared_copier_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rc, "_shared", None)
    monkeypatch.setenv(rc.ENV_VAR, "0")
    first = rc.shared_copier()
    assert first is not None and first is rc.shared_copier() and first.threads == 0
    monkeypatch.setattr(rc, "_shared", None)
    monkeypatch.setenv(rc.ENV_VAR, "off")  # no copier: one gather, then one copy (the path before pieces)
    assert rc.shared_copier() is None and rc.shared_copier() is None


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.torch])]


@pytest.mark.parametrize("kind", DEVICES)
def test_stage_to_device_gives_the_batch_and_reuses_its_slot(kind: str, copier: RowCopier) -> None:
    """Two batches one after the other through the same slot, the way an instance runs them (on its stream,
    then waiting for it): each comes out as its own rows (the second never reads the first's)."""
    device: Device = get_device(kind)
    stream = device.stream("stage")
    slots = HostSlots(device, rows=16)
    rng = np.random.default_rng()
    try:
        for sizes in ([3, 1, 4], [2, 5]):
            arrays = _batch(rng, sizes)
            box: list[Any] = []

            def stage(arrays: list[np.ndarray] = arrays, box: list[Any] = box) -> None:
                with stream_scope(stream):
                    box.append(stage_to_device(slots, "x", arrays, device, stream, copier))

            stream.launch(stage)
            stream.synchronize()
            got = box[0]
            host = got if isinstance(got, np.ndarray) else got.cpu().numpy()
            assert getattr(got, "is_cuda", device.is_cuda) == device.is_cuda
            np.testing.assert_array_equal(host, np.concatenate(arrays))
        assert len(slots) == 1
    finally:
        stream.close(timeout=10)


def test_a_gather_finishes_on_its_own_thread_while_the_helpers_are_busy() -> None:
    """Two instances share the helpers: one instance's gather must not wait for the other's to free them."""
    import threading

    copier = RowCopier(1, piece_bytes=8, min_bytes=0)
    release = threading.Event()
    blocker = copier._pool.submit(release.wait) if copier._pool is not None else None  # the one helper, busy
    try:
        rng = np.random.default_rng()
        arrays = _batch(rng, [3, 2])
        out = _poisoned(5)
        handed: list[tuple[int, int]] = []
        assert copier.gather(out, arrays, lambda a, b: handed.append((a, b))) == 5
        np.testing.assert_array_equal(out, np.concatenate(arrays))
        assert handed == [(i, i + 1) for i in range(5)]
    finally:
        release.set()
        assert blocker is not None and blocker.result(timeout=5)
        copier.close()


class _TorchHostAsDevice:
    """The CUDA branch of :func:`stage_to_device` on the CPU: a "device" whose slots and batches are CPU torch
    tensors (the batch poisoned), so the piece-by-piece copies run where CI can see them."""

    is_cuda = True

    def __init__(self) -> None:
        self.copies: list[tuple[int, int]] = []

    @property
    def torch_device(self) -> Any:  # the one-copy path (no helpers) moves the whole slot with torch's .to()
        import torch

        return torch.device("cpu")

    def host_buffer(self, shape: Sequence[int], dtype: Any, *, pinned: bool = True) -> Any:
        import torch

        return torch.from_numpy(np.empty(tuple(shape), dtype))

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        import torch

        device = self

        class Recording(torch.Tensor):
            def __getitem__(self, index: Any) -> Any:
                part = super().__getitem__(index)
                if isinstance(index, slice):
                    device.copies.append((index.start, index.stop))
                return part

        return torch.full(tuple(shape), float("nan"), dtype=torch.from_numpy(np.empty(0, dtype)).dtype
                          ).as_subclass(Recording)


@pytest.mark.torch
def test_the_cuda_branch_copies_each_piece_into_its_rows(copier: RowCopier) -> None:
    pytest.importorskip("torch")
    device = _TorchHostAsDevice()
    slots = HostSlots(device, rows=16)  # type: ignore[arg-type]
    rng = np.random.default_rng()
    for sizes in ([3, 1, 4], [5, 2]):
        device.copies.clear()
        arrays = _batch(rng, sizes)
        out = stage_to_device(slots, "x", arrays, device, None, copier)  # type: ignore[arg-type]
        np.testing.assert_array_equal(out.numpy(), np.concatenate(arrays))
        # one device copy per piece, in row order (pieces never span two requests); without helpers one copy
        pieces = [(p.start, p.stop) for p in plan_pieces(arrays, copier.piece_bytes)] if copier.threads else []
        assert device.copies == pieces, device.copies
