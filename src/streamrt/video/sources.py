"""Frame sources: video files (OpenCV), folders of images, in-memory frames, synthetic clips.

Every source gives uint8 BGR frames ``(height, width, 3)`` of one size (:class:`SourceInfo`) via
``read()`` (None at the end) and can ``skip(n)`` frames (what a paced camera does with frames the
pipeline was too busy to take). :func:`open_source` turns a command-line string into a source:

==============================  =========================================================
``synthetic``                   a generated 1280x720 clip, 90 frames at 30 FPS
``synthetic:1920x1080x150@30``  a generated clip of that size, length and frame rate
a folder                        its images (``.jpg .jpeg .png .bmp .webp``), sorted by name
an image file                   that one image
any other file                  a video file decoded by PyAV (FFmpeg), else OpenCV
``rtsp://`` ``http(s)://`` ...  a live camera stream (:mod:`streamrt.video.cameras`)
==============================  =========================================================

Failures name the file and what was wrong: missing, not decodable (corrupt or an unsupported
codec), no frames, an unreadable image. :class:`Prefetch` decodes ahead on a thread so the
pipeline's producer never waits for the decoder.

Example:
    >>> src = open_source("synthetic:320x180x3@30")
    >>> src.info.width, src.info.frames, src.read().shape
    (320, 3, (180, 320, 3))
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from streamrt.errors import InputError
from streamrt.video._cv2 import import_cv2
from streamrt.video.synthetic import SyntheticClip

__all__ = [
    "ArraySource",
    "FrameSource",
    "ImageFolderSource",
    "Prefetch",
    "SourceError",
    "SourceInfo",
    "SyntheticSource",
    "VideoFileSource",
    "iter_frames",
    "open_source",
    "register_video_opener",
]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class SourceError(InputError):
    """A frame source cannot be opened or read; the message names it and says why."""


@dataclass(frozen=True)
class SourceInfo:
    """What a source delivers: ``frames`` is None when unknown (a stream).

    ``files`` names the image of each frame index for image sources (empty for videos and clips).
    """

    name: str
    width: int
    height: int
    fps: float
    frames: int | None
    files: tuple[str, ...] = ()


class FrameSource(Protocol):
    """A sequence of same-size uint8 BGR frames."""

    @property
    def info(self) -> SourceInfo: ...

    def read(self) -> np.ndarray | None:
        """The next frame, or None after the last one."""
        ...

    def skip(self, count: int) -> int:
        """Drop the next ``count`` frames; returns how many there were."""
        ...

    def close(self) -> None: ...


def iter_frames(source: FrameSource) -> Iterator[np.ndarray]:
    """Every remaining frame of ``source``."""
    while (frame := source.read()) is not None:
        yield frame


class _SkipByReading:
    def read(self) -> np.ndarray | None:
        raise NotImplementedError

    def skip(self, count: int) -> int:
        skipped = 0
        while skipped < count and self.read() is not None:
            skipped += 1
        return skipped

    def close(self) -> None:
        pass


class VideoFileSource(_SkipByReading):
    """A video file decoded by OpenCV; the first frame is decoded at open so a bad file fails early.

    Frames that fail to decode inside the container's frame count (a damaged stretch of the file)
    are skipped and counted in ``bad_frames``; a file where no frame decodes raises at open.
    ``threads`` caps FFmpeg's decoding threads (``CAP_PROP_N_THREADS``; None: OpenCV's default, one per core):
    one per decoder where many decoders share the cores.
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        cv2 = import_cv2()
        self.path = Path(path)
        if not self.path.is_file():
            raise SourceError(f"video file not found: {self.path}")
        self._cap = cv2.VideoCapture()
        if threads is not None and hasattr(cv2, "CAP_PROP_N_THREADS"):  # OpenCV >= 4.6
            self._cap.open(str(self.path), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, int(threads)])
        if not self._cap.isOpened():  # no thread cap asked for, or no FFmpeg backend to take it
            self._cap.open(str(self.path))
        if not self._cap.isOpened():
            raise SourceError(f"cannot open video {self.path}: not a readable video (not a file OpenCV can decode: "
                              "corrupt, truncated, or an unsupported codec)",
                              hint="check it with ffprobe; re-encode to H.264 MP4 if needed")
        count = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        self._expected = count if count > 0 else None
        self._read = 0
        self.bad_frames = 0
        first = self._decode()
        if first is None:
            self._cap.release()
            raise SourceError(f"video {self.path} opened but none of its {count if count > 0 else '?'} frames "
                              "decodes (corrupt or truncated)",
                              hint=f"check it with: ffprobe -v error -count_frames {self.path}")
        fps = float(self._cap.get(cv2.CAP_PROP_FPS)) or 30.0
        self._first: np.ndarray | None = first
        self._info = SourceInfo(self.path.name, first.shape[1], first.shape[0], fps, self._expected)

    @property
    def info(self) -> SourceInfo:
        return self._info

    def _decode(self) -> np.ndarray | None:
        """The next frame that decodes; failures before the container's frame count are bad frames."""
        while True:
            ok, frame = self._cap.read()
            if ok and frame is not None:
                return np.asarray(frame)
            if self._expected is None or self._read + self.bad_frames + 1 >= self._expected:
                return None
            self.bad_frames += 1

    def read(self) -> np.ndarray | None:
        if self._first is not None:
            frame, self._first = self._first, None
        else:
            decoded = self._decode()
            if decoded is None:
                if self.bad_frames:
                    log.warning("%s: %d of %d frames could not be decoded (corrupt or truncated) and were skipped",
                                self.path, self.bad_frames, self._read + self.bad_frames)
                return None
            frame = decoded
        self._read += 1
        return frame

    def rewind(self) -> bool:
        """Start the file over from its first frame in the same capture (a seek to frame 0, not a new open: what
        a looped stream does at every end, :func:`~streamrt.video.decoding.start_over`). False where OpenCV
        cannot seek, or lands elsewhere than frame 0: the caller reopens the file then."""
        cv2 = import_cv2()
        if not self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0) or self._cap.get(cv2.CAP_PROP_POS_FRAMES) != 0:
            return False
        self._first, self._read = None, 0
        return True

    def close(self) -> None:
        self._cap.release()


class ImageFolderSource(_SkipByReading):
    """Images of a folder (or one image), sorted by name; other sizes are resized to the first's size."""

    def __init__(self, path: str | Path, fps: float = 30.0) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            files = sorted(p for p in self.path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        elif self.path.is_file():
            files = [self.path]
        else:
            raise SourceError(f"image source not found: {self.path}")
        if not files:
            raise SourceError(f"folder {self.path} has no images ({', '.join(IMAGE_SUFFIXES)})")
        self._files = files
        self._next = 0
        first = self._load(files[0])
        self._info = SourceInfo(self.path.name, first.shape[1], first.shape[0], fps, len(files),
                                files=tuple(p.name for p in files))
        self._first: np.ndarray | None = first
        self._warned = False

    @property
    def info(self) -> SourceInfo:
        return self._info

    def _load(self, path: Path) -> np.ndarray:
        cv2 = import_cv2()
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise SourceError(f"cannot read image {path}: unreadable or not an image")
        return np.asarray(image)

    def read(self) -> np.ndarray | None:
        if self._next >= len(self._files):
            return None
        path = self._files[self._next]
        self._next += 1
        if self._first is not None:
            image, self._first = self._first, None
            return image
        image = self._load(path)
        if image.shape[:2] != (self._info.height, self._info.width):
            if not self._warned:
                log.warning("%s: images of other sizes are resized to %dx%d (the first image's size)", self.path,
                            self._info.width, self._info.height)
                self._warned = True
            image = np.asarray(import_cv2().resize(image, (self._info.width, self._info.height)))
        return image

    def skip(self, count: int) -> int:
        skipped = min(count, len(self._files) - self._next)
        self._next += skipped
        self._first = None if skipped else self._first
        return skipped


class ArraySource:
    """Frames held in memory, optionally looped (benchmarks, camera-paced sweeps, tests)."""

    def __init__(self, frames: Sequence[np.ndarray], *, fps: float = 30.0, name: str = "frames",
                 loop: bool = False, length: int | None = None) -> None:
        if not frames:
            raise SourceError(f"source '{name}' has no frames")
        h, w = frames[0].shape[:2]
        self._frames = list(frames)
        self._loop = loop
        self._length = length if length is not None else (None if loop else len(frames))
        self._next = 0
        self._info = SourceInfo(name, w, h, fps, self._length)

    @property
    def info(self) -> SourceInfo:
        return self._info

    def read(self) -> np.ndarray | None:
        if self._length is not None and self._next >= self._length:
            return None
        if not self._loop and self._next >= len(self._frames):
            return None
        frame = self._frames[self._next % len(self._frames)]
        self._next += 1
        return frame

    def skip(self, count: int) -> int:
        left = count if self._length is None else max(0, min(count, self._length - self._next))
        self._next += left
        return left

    def close(self) -> None:
        pass


class SyntheticSource:
    """A :class:`~streamrt.video.synthetic.SyntheticClip` as a source; ``clip`` gives the ground truth."""

    def __init__(self, clip: SyntheticClip, name: str = "synthetic") -> None:
        self.clip = clip
        self._next = 0
        self._info = SourceInfo(name, clip.width, clip.height, clip.fps, clip.frames)

    @property
    def info(self) -> SourceInfo:
        return self._info

    def read(self) -> np.ndarray | None:
        if self._next >= self.clip.frames:
            return None
        self._next += 1
        return self.clip.frame(self._next - 1)

    def skip(self, count: int) -> int:
        left = max(0, min(count, self.clip.frames - self._next))
        self._next += left
        return left

    def close(self) -> None:
        pass


class Prefetch(_SkipByReading):
    """Decode ``source`` ahead on a daemon thread, ``depth`` frames deep; its frames as they come (BGR arrays, or
    the pictures of a source whose ``frame_format`` says otherwise: NV12 tensors)."""

    _END = object()

    def __init__(self, source: FrameSource, depth: int = 8) -> None:
        self._source = source
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._done = False
        self._thread = threading.Thread(target=self._run, name=f"decode:{source.info.name}", daemon=True)
        self._thread.start()

    @property
    def info(self) -> SourceInfo:
        return self._source.info

    @property
    def frame_format(self) -> str:
        """The wrapped source's (``run_detection`` builds its pre-processing for it)."""
        return str(getattr(self._source, "frame_format", "bgr"))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                frame = self._source.read()
                self._put(self._END if frame is None else frame)
                if frame is None:
                    return
        except BaseException as exc:  # handed to the consumer, raised by read()
            self._error = exc
            self._put(self._END)

    def _put(self, value: object) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self) -> Any:
        if self._done:
            return None
        value = self._queue.get()
        if value is self._END:
            self._done = True
            if self._error is not None:
                raise self._error
            return None
        return value

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._source.close()


_SYNTHETIC = re.compile(r"^synthetic(?::(\d+)x(\d+)(?:x(\d+))?(?:@([\d.]+))?)?(?::seed=(\d+))?$")
SYNTHETIC_GRAMMAR = "synthetic[:WxH[xFRAMES][@FPS]][:seed=N], e.g. synthetic:1920x1080x150@30"


def _synthetic(spec: str, fps: float | None) -> FrameSource | None:
    match = _SYNTHETIC.match(spec)
    if match is None:
        if spec.startswith("synthetic:") and not Path(spec).exists():
            raise SourceError(f"cannot parse source {spec!r}: a generated clip is written {SYNTHETIC_GRAMMAR}")
        return None
    w, h, n, rate, seed = match.groups()
    clip = SyntheticClip(width=int(w or 1280), height=int(h or 720), frames=int(n or 90),
                         fps=float(rate or fps or 30.0), seed=int(seed or 0))
    return SyntheticSource(clip, name=spec)


def _folder(spec: str, fps: float | None) -> FrameSource | None:
    p = Path(spec)
    if p.is_dir() or p.suffix.lower() in IMAGE_SUFFIXES:
        return ImageFolderSource(p, fps=fps or 30.0)
    return None


# The decoder choice for video files and stream URLs; video/decoding.py registers it (PyAV for
# files where installed, cameras for URLs) so this module imports no decoder.
_VIDEO_OPENERS: list[Callable[[str, float | None], FrameSource]] = []


def register_video_opener(opener: Callable[[str, float | None], FrameSource]) -> None:
    """Make ``opener`` open every video file and stream URL :func:`open_source` is given."""
    _VIDEO_OPENERS[:] = [opener]


def _video(spec: str, fps: float | None) -> FrameSource | None:
    return _VIDEO_OPENERS[0](spec, fps) if _VIDEO_OPENERS else VideoFileSource(spec)


# Tried in order; the first opener that recognises the string opens it.
_OPENERS: tuple[Callable[[str, float | None], FrameSource | None], ...] = (_synthetic, _folder, _video)


def open_source(spec: str, *, fps: float | None = None) -> FrameSource:
    """Open a source from a command-line string (see the module docstring's table).

    Raises:
        SourceError: the source does not exist or cannot be decoded.
        MissingDependencyError: OpenCV (the ``video`` extra) is not installed.
    """
    for opener in _OPENERS:
        source = opener(spec, fps)
        if source is not None:
            return source
    raise SourceError(f"cannot open source {spec!r}")  # pragma: no cover - _video always answers
