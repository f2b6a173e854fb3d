"""CPU decoding with PyAV (FFmpeg): video files, RTSP and HTTP(S) streams, decoder threads.

:class:`AvSource` is the portable decoder, the default wherever PyAV is installed (the ``video``
extra); OpenCV's :class:`~streamrt.video.sources.VideoFileSource` stays as the fallback. Frames
come out as uint8 BGR ``(height, width, 3)`` like every other source, and each carries its
presentation time: :attr:`AvSource.last_time` is the time of the frame ``read()`` returned last
(seconds from the stream's first frame), which the camera source paces on.

Decoding uses FFmpeg's frame and slice threads (``threads``, default 2 per stream). ``skip`` decodes
without converting to BGR, so a paced camera drops frames cheaply. Packets that do not decode
(a damaged stretch of a file) are skipped and counted in :attr:`AvSource.bad_frames`; a file
where nothing decodes fails at open, naming the file.

Example:
    >>> src = AvSource("clip.mp4", threads=2)                    # doctest: +SKIP
    >>> frame = src.read(); src.last_time, frame.shape           # doctest: +SKIP
    (0.0, (1080, 1920, 3))
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Generator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from streamrt._optional import require
from streamrt.video.sources import SourceError, SourceInfo

__all__ = ["STREAM_SCHEMES", "AvSource", "import_av", "is_stream_url"]

log = logging.getLogger(__name__)

# URL schemes that name a live stream rather than a file.
STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")

# FFmpeg options per scheme: TCP for RTSP (no lost UDP packets), reconnect hints for HTTP.
_URL_OPTIONS: dict[str, dict[str, str]] = {
    "rtsp": {"rtsp_transport": "tcp"},
    "rtsps": {"rtsp_transport": "tcp"},
}


def import_av() -> Any:
    """PyAV, or a clear error naming the ``video`` extra."""
    return require("av", extra="video", purpose="decoding H.264/H.265 video and streams")


def is_stream_url(spec: str) -> bool:
    """Whether ``spec`` is a network stream URL (:data:`STREAM_SCHEMES`)."""
    return spec.lower().startswith(STREAM_SCHEMES)


class AvSource:
    """A video file or stream URL decoded on the CPU by FFmpeg through PyAV.

    Args:
        spec: a file path or a stream URL (``rtsp://``, ``http://``, ...).
        threads: FFmpeg decoder threads for this stream (0: FFmpeg picks, one per core).
        timeout_s: network open and read timeout for URLs.
        options: extra FFmpeg demuxer options (``{"rtsp_transport": "udp"}``).
        size: (width, height) to deliver, scaling frames of any other size (default: the first frame's).
        output: ``bgr`` (uint8 (H, W, 3), every source's format) or ``nv12`` (uint8 (H * 3 / 2, W):
            no colour conversion on the CPU, half the bytes to copy to the GPU, where the fused
            NV12 letterbox converts; what the decoder-agnostic GPU path takes, see ``frame_format``).

    Raises:
        SourceError: missing file, nothing decodable, no video stream, an unreachable URL.
    """

    def __init__(self, spec: str | Path, *, threads: int = 2, timeout_s: float = 10.0,
                 options: dict[str, str] | None = None, size: tuple[int, int] | None = None,
                 output: str = "bgr") -> None:
        av = import_av()
        if output not in ("bgr", "nv12"):
            raise SourceError(f"decoder output must be bgr or nv12, got {output!r}")
        self.frame_format = output
        self.spec = str(spec)
        self.url = is_stream_url(self.spec)
        self.name = self.spec if self.url else Path(self.spec).name
        if not self.url and not Path(self.spec).is_file():
            raise SourceError(f"video file not found: {self.spec}")
        opts = dict(_URL_OPTIONS.get(self.spec.split("://", 1)[0].lower(), {})) if self.url else {}
        opts.update(options or {})
        self.bad_frames = 0
        self.stream_error: str | None = None  # why demuxing stopped early (a dropped connection), if it did
        self.last_time = 0.0
        self._read = 0
        try:
            self._container = av.open(self.spec, options=opts, timeout=(timeout_s, timeout_s) if self.url else None)
        except (av.FFmpegError, OSError) as exc:
            if self.url:
                raise SourceError(f"cannot reach stream {self.spec}: {type(exc).__name__}: {exc}",
                                  hint="check it with ffprobe; re-encode to H.264 MP4 if needed") from None
            # The file exists (checked above): say it is not a video, in FFmpeg's words without its errno.
            why = getattr(exc, "strerror", None) or str(exc)
            raise SourceError(f"cannot open video {self.spec}: not a readable video (FFmpeg: {why}; corrupt, "
                              "truncated, or not a video file)",
                              hint="check it with ffprobe; re-encode to H.264 MP4 if needed") from None
        if not self._container.streams.video:
            self._container.close()
            raise SourceError(f"{self.spec} has no video stream", hint=f"check it with: ffprobe {self.spec}")
        self._stream = stream = self._container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = max(0, int(threads))
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 30.0
        self._expected = int(stream.frames) if stream.frames and not self.url else None
        self._t0: float | None = None
        self._frames = self._decode()
        first = self._next_frame()
        if first is None:
            self._container.close()
            raise SourceError(f"video {self.spec} opened but none of its {self._expected or '?'} frames decodes "
                              "(corrupt or truncated)",
                              hint=f"check it with: ffprobe -v error -count_frames {self.spec}")
        self._first: Any = first
        width, height = size or (first.width, first.height)
        self._info = SourceInfo(self.name, width, height, fps, self._expected)

    @property
    def info(self) -> SourceInfo:
        return self._info

    @property
    def frames_read(self) -> int:
        """Frames delivered (read or skipped) so far."""
        return self._read

    def _decode(self) -> Generator[Any, None, None]:
        av = import_av()
        packets = self._container.demux(self._stream)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                break
            except (av.FFmpegError, OSError) as exc:  # the connection dropped, or the file is cut short
                self.stream_error = f"{type(exc).__name__}: {exc}"
                break
            try:
                yield from packet.decode()
            except av.FFmpegError as exc:  # a damaged packet: skip it, the next keyframe recovers
                log.debug("%s: packet at pts %s does not decode: %s", self.name, packet.pts, exc)
                if self.url:
                    self.bad_frames += 1
        with contextlib.suppress(av.FFmpegError):
            yield from self._stream.codec_context.decode(None)  # flush the frames the decoder holds

    def _next_frame(self) -> Any:
        frame = next(self._frames, None)
        if frame is None:
            return None
        self._time(frame)
        return frame

    def _time(self, frame: Any) -> None:
        t = frame.time
        if t is None or not math.isfinite(t):
            # No timestamp (a flushed frame of a cut stream): one frame period after the last one.
            fps = self._info.fps if hasattr(self, "_info") else 30.0
            self.last_time = self.last_time + 1 / fps if self._t0 is not None else 0.0
            self._t0 = 0.0 if self._t0 is None else self._t0
            return
        if self._t0 is None:
            self._t0 = float(t)
        self.last_time = float(t) - self._t0

    def _bgr(self, frame: Any) -> np.ndarray:
        info = getattr(self, "_info", None)
        if info is not None and (frame.width, frame.height) != (info.width, info.height):
            frame = frame.reformat(width=info.width, height=info.height)  # a camera changed resolution
        if self.frame_format == "bgr":
            return np.asarray(frame.to_ndarray(format="bgr24"))
        return _nv12(frame)

    def read(self) -> np.ndarray | None:
        """The next frame (uint8 BGR), or None at the end of the file / stream."""
        if self._first is not None:
            frame, self._first = self._first, None
        else:
            frame = self._next_frame()
            if frame is None:
                self._finish()
                return None
        self._read += 1
        return self._bgr(frame)

    def skip(self, count: int) -> int:
        """Decode and drop ``count`` frames without converting them; returns how many there were."""
        skipped = 0
        while skipped < count:
            if self._first is not None:
                self._first = None
            elif self._next_frame() is None:
                self._finish()
                break
            skipped += 1
            self._read += 1
        return skipped

    def rewind(self) -> bool:
        """Start a file over from its first frame in the same container and codec context (a seek, not a new
        open: PyAV's open probes the file and builds a decoder, ~44 ms for a 1080p H.264 clip on the CI
        machine, which a looped stream pays at every end; all of a benchmark's streams at once when their
        clips end together). False where it cannot (a network stream, a failed seek): reopen then."""
        if self.url:
            return False
        av = import_av()
        self._frames.close()
        try:
            self._container.seek(0, stream=self._stream)  # the keyframe at or before pts 0: the first one
            self._stream.codec_context.flush_buffers()  # no reference frame of the old pass leaks into the new
        except (av.FFmpegError, OSError) as exc:
            log.debug("%s: rewind failed (%s); the caller reopens the file", self.name, exc)
            return False
        self._frames = self._decode()
        self._first, self._read, self._t0, self.last_time, self.stream_error = None, 0, None, 0.0, None
        return True

    def _finish(self) -> None:
        if self._expected and self._read < self._expected and not self.bad_frames:
            self.bad_frames = self._expected - self._read
            log.warning("%s: %d of %d frames could not be decoded (corrupt or truncated) and were skipped",
                        self.name, self.bad_frames, self._expected)

    @property
    def time_base(self) -> Fraction | None:
        """The stream's time base (seconds per pts tick)."""
        tb = self._stream.time_base
        return Fraction(tb) if tb is not None else None

    def close(self) -> None:
        self._frames.close()
        self._container.close()


def _nv12(frame: Any) -> np.ndarray:
    """NV12 of a decoded frame. From planar 4:2:0 (what H.264/H.265 decode to) the chroma planes are
    interleaved with NumPy: ~8x faster than FFmpeg's conversion through PyAV."""
    if frame.format.name != "yuv420p":
        return np.asarray(frame.to_ndarray(format="nv12"))
    h, w = frame.height, frame.width
    planar = frame.to_ndarray()  # (h * 3 / 2, w): Y, then U and V planes, each (h / 2) x (w / 2)
    out = np.empty((h * 3 // 2, w), np.uint8)
    out[:h] = planar[:h]
    chroma = out[h:].reshape(h // 2, w // 2, 2)
    quarter = h * w // 4
    flat = planar[h:].reshape(-1)
    chroma[..., 0] = flat[:quarter].reshape(h // 2, w // 2)
    chroma[..., 1] = flat[quarter:].reshape(h // 2, w // 2)
    return out
