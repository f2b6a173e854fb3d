"""Live cameras: RTSP/HTTP streams read on a thread, reconnecting, paced, behind a bounded queue.

A :class:`CameraSource` owns one capture thread that decodes its stream with PyAV
(:class:`~streamrt.video.decode_av.AvSource`) and hands frames to the pipeline through a queue
of ``queue_depth`` frames. When the consumer falls behind, the **oldest** queued frame is dropped
and counted (a camera shows the newest picture; memory stays bounded whatever the consumer
does). When the stream fails or ends, the thread reconnects with exponential back-off
(``backoff_s`` doubling up to ``backoff_max_s``), for ever or ``max_reconnects`` times.

Pacing: a stream served from a file (or replayed) can arrive faster than real time; with
``pace=True`` the thread releases frame ``k`` no earlier than its presentation time after the
first frame of the connection (FFmpeg's ``-re``), so the pipeline sees the camera's real rate.
Each frame's capture instant (``time.perf_counter()`` when it left the decoder) travels with it
(:attr:`CameraSource.last_captured`): the run report's latency is capture -> result, per camera.

Example:
    >>> cam = CameraSource("rtsp://10.0.0.7/stream1", CameraConfig(queue_depth=4))  # doctest: +SKIP
    >>> frame = cam.read(); cam.stats().dropped                                      # doctest: +SKIP
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from streamrt.errors import ConfigError
from streamrt.video.sources import SourceError, SourceInfo

__all__ = ["CameraConfig", "CameraSource", "CameraStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CameraConfig:
    """How a camera is read.

    Attributes:
        queue_depth: frames held for the consumer; beyond it the oldest is dropped.
        reconnect: reconnect when the stream fails or ends (a live camera never ends on purpose).
        max_reconnects: give up after this many reconnects in a row without a frame (None: never).
        backoff_s: first wait before reconnecting; doubles per failed attempt ...
        backoff_max_s: ... up to this.
        pace: release frames at their presentation times (see the module docstring).
        threads: FFmpeg decoder threads.
        timeout_s: network open/read timeout.
        open_timeout_s: how long the first ``info`` waits for the first frame.
        fps: the frame rate to report when the stream does not say.
    """

    queue_depth: int = 4
    reconnect: bool = True
    max_reconnects: int | None = None
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    pace: bool = True
    threads: int = 2
    timeout_s: float = 10.0
    open_timeout_s: float = 30.0
    fps: float | None = None

    def __post_init__(self) -> None:
        if self.queue_depth < 1:
            raise ConfigError(f"camera queue_depth must be >= 1, got {self.queue_depth}")
        if self.backoff_s <= 0 or self.backoff_max_s < self.backoff_s:
            raise ConfigError(f"camera back-off needs 0 < backoff_s <= backoff_max_s, got {self.backoff_s}, "
                              f"{self.backoff_max_s}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (1, 2, ...)."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** max(0, attempt - 1)))


@dataclass
class CameraStats:
    """What a camera did: frames decoded and delivered, dropped (queue full), reconnects, last error."""

    name: str
    decoded: int = 0
    delivered: int = 0
    dropped: int = 0
    reconnects: int = 0
    bad_frames: int = 0
    max_queued: int = 0
    last_error: str | None = None
    connected: bool = False

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class _Captured:
    image: np.ndarray
    captured: float
    pts_s: float


@dataclass
class _Shared:
    queue: collections.deque[_Captured]
    cond: threading.Condition = field(default_factory=threading.Condition)
    info: SourceInfo | None = None
    finished: bool = False
    error: BaseException | None = None


class CameraSource:
    """A live stream as a :class:`~streamrt.video.sources.FrameSource` (see the module docstring).

    ``read()`` blocks until a frame is there and returns None only when the camera has given up
    (``reconnect=False`` and the stream ended, or ``max_reconnects`` exhausted) or was closed.

    Raises:
        SourceError: from ``info``/``read`` when the first connection never delivers a frame within
            ``open_timeout_s`` and the camera gave up.
    """

    def __init__(self, url: str, config: CameraConfig | None = None, *, name: str | None = None) -> None:
        self.url = url
        self.config = cfg = config or CameraConfig()
        self._stats = CameraStats(name or url)
        self._shared = _Shared(collections.deque(maxlen=cfg.queue_depth))
        self._stop = threading.Event()
        self.last_captured = 0.0
        self.last_time = 0.0
        self._thread = threading.Thread(target=self._run, name=f"camera:{self._stats.name}", daemon=True)
        self._thread.start()

    # -- the consumer's side ----------------------------------------------------------------------

    @property
    def info(self) -> SourceInfo:
        """Size and rate of the stream (waits for the first frame up to ``open_timeout_s``)."""
        sh = self._shared
        with sh.cond:
            sh.cond.wait_for(lambda: sh.info is not None or sh.finished, timeout=self.config.open_timeout_s)
            if sh.info is None:
                why = self._stats.last_error or f"no frame within {self.config.open_timeout_s:g} s"
                raise SourceError(f"camera {self.url} delivered no frame: {why}",
                                  hint=f"check the stream with: ffprobe {self.url}")
            return sh.info

    def stats(self) -> CameraStats:
        """A snapshot of the camera's counters."""
        with self._shared.cond:
            return CameraStats(**self._stats.__dict__)

    def read(self) -> np.ndarray | None:
        """The oldest queued frame (blocking), or None once the camera has given up."""
        sh = self._shared
        _ = self.info  # a camera that never connected raises here, once
        with sh.cond:
            sh.cond.wait_for(lambda: bool(sh.queue) or sh.finished or self._stop.is_set())
            if not sh.queue:
                return None
            item = sh.queue.popleft()
            self._stats.delivered += 1
        self.last_captured, self.last_time = item.captured, item.pts_s
        return item.image

    def skip(self, count: int) -> int:
        """Drop up to ``count`` queued frames (a live camera has no older frames to skip)."""
        with self._shared.cond:
            n = min(count, len(self._shared.queue))
            for _ in range(n):
                self._shared.queue.popleft()
            self._stats.dropped += n
        return n

    def close(self) -> None:
        self._stop.set()
        with self._shared.cond:
            self._shared.cond.notify_all()
        self._thread.join(timeout=self.config.timeout_s + 5)

    # -- the capture thread ---------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            got = self._connection()
            failures = 0 if got else failures + 1
            cfg = self.config
            if not cfg.reconnect or (cfg.max_reconnects is not None and failures > cfg.max_reconnects):
                break
            wait = cfg.backoff(max(1, failures))
            log.info("camera %s: reconnecting in %.1f s (%s)", self._stats.name, wait, self._stats.last_error)
            if self._stop.wait(wait):
                break
            with self._shared.cond:
                self._stats.reconnects += 1
        with self._shared.cond:
            self._shared.finished = True
            self._stats.connected = False
            self._shared.cond.notify_all()

    def _connection(self) -> bool:
        """Read one connection to its end; True when it delivered at least one frame."""
        from streamrt.video.decode_av import AvSource

        cfg, sh, st = self.config, self._shared, self._stats
        try:
            size = None if sh.info is None else (sh.info.width, sh.info.height)  # a reconnect keeps the size
            source = AvSource(self.url, threads=cfg.threads, timeout_s=cfg.timeout_s, size=size)
        except SourceError as exc:
            with sh.cond:
                st.last_error = str(exc)
            return False
        got = False
        try:
            with sh.cond:
                st.connected = True
                if sh.info is None:
                    i = source.info
                    sh.info = SourceInfo(st.name, i.width, i.height, cfg.fps or i.fps, None)
                    sh.cond.notify_all()
            wall0 = time.perf_counter()
            while not self._stop.is_set():
                image = source.read()
                if image is None:
                    st.last_error = source.stream_error or "stream ended"
                    break
                if cfg.pace:
                    delay = wall0 + source.last_time - time.perf_counter()
                    if delay > 0 and self._stop.wait(delay):
                        break
                self._push(_Captured(image, time.perf_counter(), source.last_time))
                got = True
        except Exception as exc:  # a stream that breaks mid-way: reconnect
            st.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            with sh.cond:
                st.bad_frames += source.bad_frames
                st.connected = False
            source.close()
        return got

    def _push(self, item: _Captured) -> None:
        sh, st = self._shared, self._stats
        with sh.cond:
            if len(sh.queue) == sh.queue.maxlen:
                st.dropped += 1  # the deque drops the oldest on append
            sh.queue.append(item)
            st.decoded += 1
            st.max_queued = max(st.max_queued, len(sh.queue))
            sh.cond.notify_all()
