"""Live streams of one decoder pool, paced by one thread: no reader thread per camera.

A :class:`~streamrt.video.live.LiveStream` gives every camera a thread that blocks in ``read()``.
That is what a CPU decoder needs (the thread *is* the decoder), but a decoder pool
(:class:`~streamrt.video.decode_nvdec.NvdecPool`, :class:`~streamrt.video.decode_processes.ProcessDecodePool`)
decodes on threads or processes of its own, and its ``read()`` is only a hand-over: at 100 cameras
that is 100 more Python threads, each waking, taking the GIL and (decoder processes) synchronising a
copy stream and sending a message for every one of 3,000 pictures a second, beside the one thread
that feeds the engine. On the H200 the detector fed that way achieved 117 of 3,000 offered frames/s
at 100 streams with every thread it traced idle (docs/benchmarks/2026-12-02-h200-session2.md).

:class:`LiveGroup` keeps the camera semantics and drops the threads: one thread releases frame ``k``
of a stream no earlier than ``k / fps`` after that stream started, takes every due picture of the
whole set in one call (:meth:`ReadyLanes.take_ready`: one copy stream, one synchronisation, one
message per worker) and puts each in its stream's drop-oldest queue of ``depth`` frames. Each
:class:`GroupedStream` reads like a ``LiveStream`` (``start``, ``take``, ``done``, ``stats``,
``stop``), so the round-robin consumer of :func:`streamrt.video.runner.run_detection` serves both.

Example:
    >>> import threading
    >>> class Lanes:  # two streams of three pictures each
    ...     def __init__(self): self.left = {0: 3, 1: 3}
    ...     def take_ready(self, indices):
    ...         taken = [(i, f"picture {3 - self.left[i]}", None) for i in indices if self.left[i]]
    ...         for i, _, _ in taken: self.left[i] -= 1
    ...         return ReadyPictures(taken, [i for i in indices if not self.left[i]], {})
    >>> infos = [SourceInfo(name, 64, 48, 30.0, 3) for name in ("a", "b")]
    >>> group = LiveGroup(Lanes(), [0, 1], infos, fps=0, depth=8, wake=threading.Condition())
    >>> for s in group.streams: s.start()
    >>> _ = group.streams[1].wait_finished(5.0); group.streams[1].stats()["produced"]
    3
    >>> [group.streams[1].take().image for _ in range(3)]
    ['picture 0', 'picture 1', 'picture 2']
    >>> group.stop()
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamrt.video.live import LiveQueue
from streamrt.video.sources import SourceError, SourceInfo

__all__ = ["GroupedStream", "LiveGroup", "ReadyLanes", "ReadyPictures", "shared_lanes"]

_POLL_S = 0.001  # how soon a due stream whose picture was not decoded yet is looked at again


@dataclass
class ReadyPictures:
    """What :meth:`ReadyLanes.take_ready` found: pictures (stream, owned picture, pts), streams that ended
    (nothing left to decode) and streams whose decoder failed (stream -> message)."""

    taken: list[tuple[int, Any, Any]] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


class ReadyLanes(Protocol):
    """A decoder pool whose streams can be read together without blocking."""

    def take_ready(self, indices: Sequence[int]) -> ReadyPictures: ...


def shared_lanes(sources: Sequence[Any]) -> tuple[ReadyLanes, list[int]] | None:
    """The pool every source is a stream of, and their indices in it; None when they are not all streams of one
    pool that can be read together (then each source needs a :class:`~streamrt.video.live.LiveStream`)."""
    lanes = [getattr(s, "pool_lane", None) for s in sources]
    if not lanes or any(lane is None for lane in lanes):
        return None
    pools = {id(pool) for pool, _ in lanes}  # type: ignore[misc]
    pool = lanes[0][0]  # type: ignore[index]
    if len(pools) != 1 or not callable(getattr(pool, "take_ready", None)):
        return None
    return pool, [index for _, index in lanes]  # type: ignore[misc]


class GroupedStream(LiveQueue):
    """One camera of a :class:`LiveGroup`: a :class:`~streamrt.video.live.LiveStream` without its thread."""

    def __init__(self, group: LiveGroup, lane: int, info: SourceInfo, first_index: int, max_frames: int | None) -> None:
        super().__init__(group.depth, group.wake, first_index, max_frames)
        self._group, self.lane, self._info = group, lane, info
        self.t0: float | None = None  # when it started: frame k is released from t0 + k / fps

    @property
    def info(self) -> SourceInfo:
        return self._info

    @property
    def started(self) -> bool:
        return self.t0 is not None

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def start(self) -> None:
        with self.wake:
            if self.t0 is None:  # one heap entry per stream
                self._group.starting.append(self.lane)
            self.t0 = time.perf_counter()
        self._group.started()
        self._group.poke()  # its first frame is due now: the thread may be asleep until another stream's next one

    def stop(self) -> None:
        """Stop taking this stream's pictures (the pool stays open: whoever opened it closes it)."""
        with self.wake:
            self._finish()
        self._group.stopped()

    close = stop

    def _finish(self, error: BaseException | None = None) -> None:  # the wake lock held
        if error is not None and not self.finished:
            self._error = error
        self._finished.set()

    def _take_picture(self, picture: Any) -> None:  # the wake lock held
        self._put(picture)
        if self.max_frames is not None and self.produced >= self.max_frames:
            self._finish()

    def next_due(self, period: float) -> float:  # the wake lock held, once started
        """When this stream's next frame is due (``t0`` plus its frames so far at ``period``)."""
        assert self.t0 is not None
        return self.t0 + self.produced * period


class LiveGroup:
    """Streams ``indices`` of ``lanes`` as live cameras at ``fps``, paced and read by one thread.

    Args:
        lanes: the decoder pool (:class:`ReadyLanes`).
        indices: the streams' indices in the pool.
        infos: the streams' :class:`~streamrt.video.sources.SourceInfo` (names in reports).
        fps: release rate per stream; 0 releases pictures as soon as they are decoded.
        depth: frames each stream's queue holds (a full queue drops its oldest).
        wake: notified on every new frame (the consumer waits on it).
        first_index: per stream, the index of its next frame (frames read before, e.g. warm-up).
        max_frames: per stream, stop after this many frames (None: until the stream ends).
    """

    def __init__(self, lanes: ReadyLanes, indices: Sequence[int], infos: Sequence[SourceInfo], *, fps: float | None,
                 depth: int = 2, wake: threading.Condition | None = None, first_index: Sequence[int] | None = None,
                 max_frames: Sequence[int | None] | None = None) -> None:
        self.lanes, self.fps, self.depth = lanes, float(fps or 0.0), depth  # depth is checked by each LiveQueue
        self.wake = wake or threading.Condition()
        firsts = list(first_index or [0] * len(indices))
        limits = list(max_frames or [None] * len(indices))
        self.streams = [GroupedStream(self, lane, info, first, limit)
                        for lane, info, first, limit in zip(indices, infos, firsts, limits, strict=True)]
        self._by_lane = {s.lane: s for s in self.streams}
        self.starting: list[int] = []  # lanes started since the thread last looked (the wake lock held)
        self._stop = threading.Event()
        self._poked = threading.Event()  # wakes the thread before its next due time: a stream started, or stop
        self._thread = threading.Thread(target=self._run, name="live-group", daemon=True)

    def started(self) -> None:
        """A stream started: the thread runs from the first one on."""
        with self.wake:
            if self._thread.ident is None and not self._stop.is_set():
                self._thread.start()

    def poke(self) -> None:
        """Wake the thread now (a stream started: until 2026-12-06 its first frame waited for the thread's next
        due time, up to one frame period of the other streams)."""
        self._poked.set()

    def stopped(self) -> None:
        """A stream was stopped: the thread ends with the last one."""
        with self.wake:
            if not all(s.finished for s in self.streams):
                return
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        with self.wake:
            for s in self.streams:
                s._finish()
            self.wake.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        """Release each stream's frames on time, visiting only the streams that are due.

        A heap of (next due time, lane) holds the started streams; a stream whose due picture was not decoded yet
        is looked at again :data:`_POLL_S` later. Until 2026-12-06 every pass scanned all streams three times (due
        ones, live ones, the earliest next) and passed every millisecond while any due picture was missing: at 160
        streams behind a CPU decoder process that kept this thread busy all the time, 45% of it in those scans
        (``benchmarks/live_consumer.py --pools processes``), beside the thread that feeds the engine.
        """
        period = 1.0 / self.fps if self.fps > 0 else 0.0
        heap: list[tuple[float, int]] = []
        try:
            while not self._stop.is_set():
                with self.wake:
                    for lane in self.starting:
                        heapq.heappush(heap, (self._by_lane[lane].next_due(period), lane))
                    self.starting.clear()
                    now = time.perf_counter()
                    due = []
                    while heap and heap[0][0] <= now:
                        lane = heapq.heappop(heap)[1]
                        if not self._by_lane[lane].finished:
                            due.append(lane)
                taken = self._take(due) if due else set()
                with self.wake:
                    now = time.perf_counter()
                    for lane in due:
                        stream = self._by_lane[lane]
                        if not stream.finished:  # its next frame's time; with no picture decoded yet, soon again
                            later = stream.next_due(period) if lane in taken else now + _POLL_S
                            heapq.heappush(heap, (later, lane))
                    if not heap and not self.starting and all(s.started for s in self.streams):
                        return  # every stream ended
                    delay = heap[0][0] - now if heap else _POLL_S
                if delay > 0:
                    self._poked.wait(delay)
                self._poked.clear()  # a start after this is seen at the top of the loop, or wakes the next wait
        except BaseException as exc:  # handed to every stream's consumer by take()
            with self.wake:
                for s in self.streams:
                    s._finish(exc)
                self.wake.notify_all()

    def _take(self, due: list[int]) -> set[int]:
        """One picture of each ``due`` stream that has one, queued; the lanes that got one."""
        ready = self.lanes.take_ready(due)
        with self.wake:
            for lane, picture, _pts in ready.taken:
                stream = self._by_lane[lane]
                if not stream.finished:
                    stream._take_picture(picture)
            for lane in ready.ended:
                self._by_lane[lane]._finish()
            for lane, message in ready.failed.items():
                self._by_lane[lane]._finish(SourceError(message))
            self.wake.notify_all()
        return {lane for lane, _, _ in ready.taken}
