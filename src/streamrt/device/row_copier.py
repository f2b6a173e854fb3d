"""Large host gathers in pieces, on a few threads, each piece handed on as soon as it is in place.

A server instance gathers its batch's requests into one pinned slot and then copies the slot to the device.
For ResNet-50's 4.8 MB requests a batch of 64 images is 38.5 MB: one ``np.concatenate`` on one core, and
the host-to-device copy starts only when all of it is done. On the H200 both host transports (gRPC binary
and system shared memory) stopped at ~1,000 requests/s (4.5-5.1 GB/s) while CUDA shared memory, which skips
the host, reached the engine (docs/benchmarks/2026-12-05-h200.md).

:class:`RowCopier` splits such a gather into pieces of whole rows (about ``piece_bytes`` each), copies them
on the calling thread and a small pool of helper threads shared by every caller (NumPy releases the GIL
while it copies; the caller copies too, so helpers busy with another instance's gather never make it slower
than one copy on its own thread), and calls ``on_piece(start, stop)`` on
the calling thread for every piece, in row order, as soon as that piece and every piece before it are in
place. A CUDA instance enqueues the piece's host-to-device copy there (:func:`~streamrt.device.staging.
stage_to_device`), so the DMA of one piece overlaps the host copies of the next ones.

Helper threads: ``$STREAMRT_STAGING_THREADS`` (0: no helpers, and then a CUDA instance gathers in one copy, as
pieces on its own thread alone were slower on the H200; ``off``: no copier, one gather and then one copy to the
device, as before), else :func:`default_staging_threads`. Small gathers (under ``min_bytes``) are one copy, as before.

Example:
    >>> import numpy as np
    >>> copier = RowCopier(threads=0, piece_bytes=16, min_bytes=0)
    >>> out = np.zeros((5, 2), np.float32)
    >>> done = []
    >>> copier.gather(out, [np.ones((2, 2), np.float32), np.full((3, 2), 2, np.float32)],
    ...               on_piece=lambda a, b: done.append((a, b)))
    5
    >>> done
    [(0, 2), (2, 4), (4, 5)]
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from streamrt.device.threads import usable_cores
from streamrt.errors import ConfigError

__all__ = ["ENV_VAR", "MIN_BYTES", "PIECE_BYTES", "Piece", "RowCopier", "default_staging_threads",
           "plan_pieces", "shared_copier"]

ENV_VAR = "STREAMRT_STAGING_THREADS"

PIECE_BYTES = 2 << 20
"""About this many bytes per piece: 19 host-to-device copies for a 38.5 MB batch (each costs a few
microseconds to enqueue), small enough for the first DMA to start after ~5% of the host copies."""

MIN_BYTES = 8 << 20
"""Gathers smaller than this are one ``np.concatenate`` (pieces and threads cost more than they save)."""

OnPiece = Callable[[int, int], None]
"""``on_piece(start, stop)``: destination rows ``start:stop`` are in place (and every row before them)."""


@dataclass(frozen=True)
class Piece:
    """Destination rows ``start:stop``, copied from ``source`` (rows of one of the gathered arrays)."""

    start: int
    stop: int
    source: np.ndarray


def default_staging_threads(cores: int | None = None) -> int:
    """Copy threads when ``$STREAMRT_STAGING_THREADS`` is not set: none on 2 usable cores or fewer (the
    clients, the event loop and the instances need them), else a quarter of the cores, at most 4.

    >>> default_staging_threads(2), default_staging_threads(8), default_staging_threads(16), default_staging_threads(64)
    (0, 2, 4, 4)
    """
    cores = usable_cores() if cores is None else cores
    return 0 if cores <= 2 else max(1, min(4, cores // 4))


def staging_threads() -> int | None:
    """``$STREAMRT_STAGING_THREADS`` when set (0 or more; ``off``: None, no pieces at all), else
    :func:`default_staging_threads`.

    Raises:
        ConfigError: the variable is neither an integer >= 0 nor ``off``.
    """
    env = os.environ.get(ENV_VAR, "").strip()
    if not env:
        return default_staging_threads()
    if env.lower() == "off":
        return None
    try:
        threads = int(env)
    except ValueError:
        threads = -1
    if threads < 0:
        raise ConfigError(f"{ENV_VAR} must be an integer >= 0 (helper threads; 0: none) or 'off' "
                          f"(one gather, then one copy to the device), got {env!r}")
    return threads


def plan_pieces(arrays: Sequence[np.ndarray], piece_bytes: int) -> list[Piece]:
    """The destination's rows in pieces of whole rows, about ``piece_bytes`` each, never across two arrays.

    >>> [(p.start, p.stop) for p in plan_pieces([np.zeros((3, 4), np.uint8), np.zeros((2, 4), np.uint8)], 8)]
    [(0, 2), (2, 3), (3, 5)]
    """
    pieces, start = [], 0
    for array in arrays:
        rows = int(array.shape[0])
        row_bytes = max(1, array.nbytes // rows) if rows else 1
        step = max(1, piece_bytes // row_bytes)
        for first in range(0, rows, step):
            last = min(rows, first + step)
            pieces.append(Piece(start + first, start + last, array[first:last]))
        start += rows
    return pieces


def _check_items(out: np.ndarray, arrays: Sequence[np.ndarray]) -> int:
    """Rows of ``arrays`` together; ValueError (NumPy's concatenate wording) when an item shape differs."""
    item = out.shape[1:]
    for index, array in enumerate(arrays):
        if array.ndim != out.ndim:
            raise ValueError(f"all the input array dimensions except for the concatenation axis must match "
                             f"exactly, but array {index} has {array.ndim} dimension(s) and the destination "
                             f"{out.ndim}")
        if array.shape[1:] != item:
            raise ValueError(f"all the input array dimensions except for the concatenation axis must match "
                             f"exactly, but array {index} has item shape {array.shape[1:]} and the destination "
                             f"{item}")
    rows = sum(int(a.shape[0]) for a in arrays)
    if rows > out.shape[0]:
        raise ValueError(f"{rows} rows do not fit a destination of {out.shape[0]}")
    return rows


class RowCopier:
    """Gathers arrays along axis 0 into a destination, in pieces on ``threads`` threads (see the module).

    Args:
        threads: copy threads (0: the calling thread copies the pieces itself).
        piece_bytes: about this many bytes per piece.
        min_bytes: smaller gathers are one ``np.concatenate`` with one ``on_piece`` call (so is any
            gather without threads and without ``on_piece``: pieces would gain nothing there).
    """

    def __init__(self, threads: int, *, piece_bytes: int = PIECE_BYTES, min_bytes: int = MIN_BYTES) -> None:
        if threads < 0 or piece_bytes < 1 or min_bytes < 0:
            raise ConfigError(f"a row copier needs threads >= 0, piece_bytes >= 1 and min_bytes >= 0, got "
                              f"{threads}, {piece_bytes}, {min_bytes}")
        self.threads, self.piece_bytes, self.min_bytes = threads, piece_bytes, min_bytes
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="streamrt-copy") if threads else None

    def __repr__(self) -> str:
        return f"RowCopier(threads={self.threads}, piece_bytes={self.piece_bytes}, min_bytes={self.min_bytes})"

    def gather(self, out: np.ndarray, arrays: Sequence[np.ndarray], on_piece: OnPiece | None = None) -> int:
        """Copy ``arrays`` one after another along axis 0 into ``out``'s first rows; the rows written.

        The calling thread copies pieces too, so a gather is never slower than on its own thread when the
        helpers are busy with another instance's. ``on_piece`` runs on the calling thread, in row order,
        once per piece (once for a small gather). When a piece fails, no further piece starts, the ones
        already started finish, no later ``on_piece`` runs, and the first error is raised.

        Raises:
            ValueError: an array's rank or item shape differs from ``out``'s, or the rows do not fit.
            TypeError: an array's dtype cannot be cast to ``out``'s (NumPy's ``same_kind`` rule).
        """
        rows = _check_items(out, arrays)
        if sum(a.nbytes for a in arrays) < self.min_bytes or (self._pool is None and on_piece is None):
            np.concatenate(arrays, axis=0, out=out[:rows])
            if on_piece is not None:
                on_piece(0, rows)
            return rows
        job = _Job(out, plan_pieces(arrays, self.piece_bytes))
        pool, count = self._pool, min(self.threads, len(job.pieces) - 1)
        helpers = [pool.submit(job.work) for _ in range(count)] if pool is not None else []
        try:
            job.run(on_piece)
        finally:
            job.stop()
            for helper in helpers:  # nothing may still write into ``out`` once the caller returns or raises
                if not helper.cancel():
                    _wait_quietly(helper)
        return rows

    def close(self) -> None:
        """Stop the threads (after the pieces already given to them)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class _Job:
    """One gather's pieces, taken in row order by the calling thread and the helpers alike."""

    def __init__(self, out: np.ndarray, pieces: list[Piece]) -> None:
        self.out, self.pieces = out, pieces
        self.landed = [threading.Event() for _ in pieces]
        self.error: BaseException | None = None
        self._next, self._stopped = 0, False
        self._lock = threading.Lock()

    def _take(self) -> int | None:
        with self._lock:
            if self._stopped or self.error is not None or self._next == len(self.pieces):
                return None
            self._next += 1
            return self._next - 1

    def _copy(self, index: int) -> None:
        try:
            _copy(self.out, self.pieces[index])
        except BaseException as exc:
            with self._lock:
                self.error = self.error or exc
        finally:
            self.landed[index].set()

    def work(self) -> None:
        """A helper: copy pieces until none is left (or one failed)."""
        while (index := self._take()) is not None:
            self._copy(index)

    def run(self, on_piece: OnPiece | None) -> None:
        """The calling thread: copy pieces, handing on the landed prefix after each; then wait for the rest."""
        handed = 0

        def hand_on(wait: bool) -> None:
            nonlocal handed
            while handed < len(self.pieces) and (wait or self.landed[handed].is_set()):
                self.landed[handed].wait()
                if self.error is not None:
                    raise self.error
                if on_piece is not None:
                    on_piece(self.pieces[handed].start, self.pieces[handed].stop)
                handed += 1

        while (index := self._take()) is not None:
            self._copy(index)
            hand_on(wait=False)
        hand_on(wait=True)

    def stop(self) -> None:
        """No piece starts after this (the caller is done, or failed)."""
        with self._lock:
            self._stopped = True


def _copy(out: np.ndarray, piece: Piece) -> None:
    np.copyto(out[piece.start:piece.stop], piece.source, casting="same_kind")


def _wait_quietly(future: Future[None]) -> None:
    with contextlib.suppress(BaseException):  # the caller raises the first error already
        future.result()


_shared: RowCopier | object | None = None
_shared_lock = threading.Lock()


_OFF = object()


def shared_copier() -> RowCopier | None:
    """The process's copier (:func:`staging_threads` threads), made on first use and shared by every instance;
    None with ``STREAMRT_STAGING_THREADS=off``."""
    global _shared
    with _shared_lock:
        if _shared is None:
            threads = staging_threads()
            _shared = _OFF if threads is None else RowCopier(threads)
        return _shared if isinstance(_shared, RowCopier) else None


def _forget_after_fork() -> None:
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()  # the parent's threads do not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
