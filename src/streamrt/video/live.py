"""Live streams: each source on its own thread at its own pace, behind a bounded drop-oldest queue.

The lock-step paced mode of :mod:`streamrt.video.runner` reads one frame of every source per
tick on the consumer's thread and, when the pipeline fell behind, *skips* frames by reading
them: for a decoded stream that is decoding frames only to throw them away, on the one thread
that should be feeding the engine. Past the capacity every tick costs more than its period, the
skips grow, and the whole set collapses. A :class:`LiveStream` does what a camera does instead:
its thread reads (decodes) frame ``k`` no earlier than ``k / fps`` after the start, stamps its
capture instant, and puts it in a queue of ``depth`` frames; a full queue drops its **oldest**
frame and counts it. The consumer (:func:`streamrt.video.runner.run_detection` with
``DetectConfig(live=True)``) serves the streams round-robin, one frame per stream per turn, so
under overload every stream gets the same share and drops the same number of frames, and a frame
waits at most ``depth`` turns: latency stays bounded by about
``(depth x streams + frames in flight) x service time per frame`` however long the run.

Example:
    >>> from streamrt.video.sources import open_source
    >>> s = LiveStream(open_source("synthetic:64x48x3@30"), fps=30.0, depth=2)
    >>> s.start(); _ = s.wait_finished(5.0); s.stats()["produced"], s.stats()["dropped"]
    (3, 1)
    >>> s.close()
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

from streamrt.errors import ConfigError
from streamrt.video.sources import FrameSource, SourceInfo

__all__ = ["LiveFrame", "LiveQueue", "LiveStream"]


@dataclass(frozen=True)
class LiveFrame:
    """A frame taken from a live stream: its index in the stream and its capture instant (perf_counter)."""

    index: int
    image: Any
    captured: float


class LiveQueue:
    """A camera's drop-oldest queue of ``depth`` frames and its counters: what the consumer reads.

    :class:`LiveStream` fills it from a thread of its own; a
    :class:`~streamrt.video.live_group.GroupedStream` is filled by its group's thread.
    """

    def __init__(self, depth: int, wake: threading.Condition | None, first_index: int,
                 max_frames: int | None) -> None:
        if depth < 1:
            raise ConfigError(f"live stream queue depth must be >= 1, got {depth}")
        self.depth, self.first_index, self.max_frames = depth, first_index, max_frames
        self.wake = wake or threading.Condition()
        self._queue: collections.deque[LiveFrame] = collections.deque(maxlen=depth)
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self.produced = self.delivered = self.dropped = 0

    def take(self) -> LiveFrame | None:
        """The oldest queued frame, or None when none is queued (never blocks)."""
        with self.wake:
            if not self._queue:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self.delivered += 1
            return self._queue.popleft()

    @property
    def done(self) -> bool:
        """The stream ended (or failed, or was stopped) and every queued frame was taken."""
        with self.wake:
            return self._finished.is_set() and not self._queue and self._error is None

    def wait_finished(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    def stats(self) -> dict[str, int]:
        with self.wake:
            return {"produced": self.produced, "delivered": self.delivered, "dropped": self.dropped,
                    "queue_depth": self.depth}

    def _put(self, image: Any) -> None:
        """Queue the stream's next frame, stamped now, dropping the oldest when full (the wake lock held)."""
        if len(self._queue) == self.depth:
            self.dropped += 1  # the deque drops the oldest on append
        self._queue.append(LiveFrame(self.first_index + self.produced, image, time.perf_counter()))
        self.produced += 1
        self.wake.notify_all()


class LiveStream(LiveQueue):
    """One source read on a thread, paced at ``fps``, behind a drop-oldest queue of ``depth`` frames.

    Args:
        source: any :class:`~streamrt.video.sources.FrameSource` (a file, a clip, a decoder).
        fps: release rate; None or 0 reads as fast as the source goes (the queue still drops).
        depth: frames held for the consumer.
        max_frames: stop after this many frames.
        wake: a condition notified on every new frame (the consumer waits on it; shared by streams).
        first_index: the source's index of the next frame read (frames read before, e.g. warm-up).
    """

    def __init__(self, source: FrameSource, *, fps: float | None, depth: int = 2, max_frames: int | None = None,
                 wake: threading.Condition | None = None, first_index: int = 0) -> None:
        super().__init__(depth, wake, first_index, max_frames)
        self.source = source
        self.fps = fps or 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"live:{source.info.name}", daemon=True)

    @property
    def info(self) -> SourceInfo:
        return self.source.info

    @property
    def started(self) -> bool:
        return self._thread.is_alive() or self._finished.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (the source stays open: whoever opened it closes it)."""
        self._stop.set()
        with self.wake:
            self.wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def close(self) -> None:
        """Stop reading and close the source."""
        self.stop()
        self.source.close()

    def _run(self) -> None:
        period = 1.0 / self.fps if self.fps > 0 else 0.0
        t0 = time.perf_counter()
        k = 0
        try:
            while not self._stop.is_set() and (self.max_frames is None or k < self.max_frames):
                image = self.source.read()  # decoding happens here, on this thread, for every frame
                if image is None:
                    break
                delay = t0 + k * period - time.perf_counter()
                if delay > 0 and self._stop.wait(delay):
                    break
                with self.wake:
                    self._put(image)
                k += 1
        except BaseException as exc:  # handed to the consumer by take()
            with self.wake:
                self._error = exc
        finally:
            self._finished.set()
            with self.wake:
                self.wake.notify_all()
