"""Where detections go: JSON Lines, annotated video, both behind a writer thread.

* :class:`JsonlSink`: one JSON object per frame (``source`` index, ``name`` of the source, ``file``
  for image folders or ``timestamp_s`` for videos and clips, ``frame``, ``detections`` with ``box``
  [x1, y1, x2, y2] in frame pixels, ``score``, ``class``, ``label``).
* :class:`VideoSink`: the frames with boxes, labels and scores drawn. ``.mp4``/``.m4v``/``.mov``
  are H.264 (browsers play it) encoded by PyAV; without PyAV, OpenCV's MPEG-4 Part 2 (``mp4v``)
  with a warning. ``.avi``/``.mkv`` are Motion-JPEG through OpenCV. Several sources write
  ``name_0.mp4``, ``name_1.mp4``...
* :class:`ThreadedSink`: runs any sink on its own thread so encoding never stalls the pipeline's
  producer.

Every sink writes to a hidden temporary file next to its output and renames it on ``close()``;
``abort()`` (a failed run) deletes it, so a failed command leaves no empty or half-written output.

Example:
    >>> sink = JsonlSink("dets.jsonl", names=("circle",))          # doctest: +SKIP
    >>> sink(frame, detections); sink.close()                        # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from streamrt._optional import available, require
from streamrt.errors import ConfigError
from streamrt.plan import new_file_mode
from streamrt.video._cv2 import import_cv2
from streamrt.video.sources import SourceInfo
from streamrt.video.workload import Detections, Frame

__all__ = ["JsonlSink", "Sink", "ThreadedSink", "VideoSink", "annotate", "video_codec"]

log = logging.getLogger(__name__)

# OpenCV codecs: the MP4 family only when PyAV (H.264) is missing.
_FOURCC = {".mp4": "mp4v", ".m4v": "mp4v", ".mov": "mp4v", ".avi": "MJPG", ".mkv": "MJPG"}
_H264_SUFFIXES = (".mp4", ".m4v", ".mov")


def _partial(target: Path) -> Path:
    """A new hidden file next to ``target`` with its suffix (encoders pick the format from it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=f".partial{target.suffix}", dir=target.parent)
    os.fchmod(fd, new_file_mode())
    os.close(fd)
    return Path(name)


class Sink(Protocol):
    def __call__(self, frame: Frame, detections: Detections) -> None: ...

    def close(self) -> None:
        """Finish the output and move it to its final name."""
        ...

    def abort(self) -> None:
        """Drop the output: the run failed."""
        ...


def _palette(cls: int) -> tuple[int, int, int]:
    """A distinct, stable BGR colour per class."""
    hue = (cls * 47) % 180
    cv2 = import_cv2()
    b, g, r = cv2.cvtColor(np.array([[[hue, 220, 255]]], np.uint8), cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def annotate(image: np.ndarray, detections: Detections, names: tuple[str, ...] = ()) -> np.ndarray:
    """Draw boxes, labels and scores on a copy of ``image`` (BGR) and return it."""
    cv2 = import_cv2()
    out = image.copy()
    scale = max(0.4, min(out.shape[:2]) / 900)
    thickness = max(1, round(scale * 2))
    for box, score, cls in zip(detections.boxes, detections.scores, detections.classes, strict=True):
        color = _palette(int(cls))
        x1, y1, x2, y2 = (round(float(v)) for v in box)
        cv2.rectangle(out, (x1, y1), (x2, y2), color, thickness, cv2.LINE_AA)
        name = names[int(cls)] if int(cls) < len(names) else f"class{int(cls)}"
        text = f"{name} {float(score):.2f}"
        (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale * 0.6, thickness)
        top = max(y1 - th - base - 2, 0)
        cv2.rectangle(out, (x1, top), (x1 + tw + 4, top + th + base + 2), color, -1)
        cv2.putText(out, text, (x1 + 2, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, scale * 0.6, (0, 0, 0), thickness,
                    cv2.LINE_AA)
    return out


class JsonlSink:
    """Detections as JSON Lines, one line per frame in the order frames complete.

    ``sources`` (the runs' :class:`SourceInfo`, by source index) add each record's origin: the
    source's ``name``, and the image ``file`` (folders) or the frame's ``timestamp_s`` (videos).
    """

    def __init__(self, path: str | Path, names: tuple[str, ...] = (), sources: Sequence[SourceInfo] = ()) -> None:
        self.path = Path(path)
        self.names = names
        self.sources = tuple(sources)
        self._partial = _partial(self.path)
        self._file: IO[str] = open(self._partial, "w")  # noqa: SIM115 - closed in close()/abort()
        self.frames = 0

    def _origin(self, source: int, index: int) -> dict[str, Any]:
        if source >= len(self.sources):
            return {}
        info = self.sources[source]
        if info.files:
            return {"name": info.name, "file": info.files[index] if index < len(info.files) else None}
        return {"name": info.name, "timestamp_s": round(index / info.fps, 6) if info.fps else None}

    def __call__(self, frame: Frame, detections: Detections) -> None:
        record = detections.to_json(self.names)
        record = {"source": record.pop("source"), **self._origin(frame.source, frame.index), **record}
        self._file.write(json.dumps(record) + "\n")
        self.frames += 1

    def close(self) -> None:
        self._file.close()
        os.replace(self._partial, self.path)

    def abort(self) -> None:
        self._file.close()
        self._partial.unlink(missing_ok=True)


def video_codec(path: str | Path) -> str:
    """The codec :class:`VideoSink` writes for ``path``: ``h264`` (PyAV), ``mp4v`` or ``MJPG`` (OpenCV)."""
    suffix = Path(path).suffix.lower()
    if suffix not in _FOURCC:
        raise ConfigError(f"cannot write video {path}: use one of {', '.join(_FOURCC)}")
    if suffix in _H264_SUFFIXES and _h264_encoder() is not None:
        return "h264"
    return _FOURCC[suffix]


def _h264_encoder() -> str | None:
    """The name of an H.264 *encoder* PyAV's FFmpeg has (``codecs_available`` also lists decoders)."""
    if not available("av"):
        return None
    av = require("av", extra="video")
    for name in ("libx264", "libopenh264", "h264"):
        try:
            return str(av.Codec(name, "w").name)
        except ValueError:  # UnknownCodecError: no such encoder in this build
            continue
    return None


class _PyAVWriter:
    """H.264 in MP4 (yuv420p, +faststart: browsers start playing before the download ends)."""

    def __init__(self, path: Path, fps: float, size: tuple[int, int], encoder: str) -> None:
        import av

        width, height = size
        # yuv420p needs even sizes: odd frames get one black row/column.
        self._pad = (height % 2, width % 2)
        self._container = av.open(str(path), "w", options={"movflags": "+faststart"})
        stream = self._container.add_stream(encoder, rate=Fraction(fps).limit_denominator(1001))
        assert isinstance(stream, av.VideoStream)
        self._stream = stream
        self._stream.width, self._stream.height = width + self._pad[1], height + self._pad[0]
        self._stream.pix_fmt = "yuv420p"
        if encoder == "libx264":
            self._stream.options = {"preset": "veryfast", "crf": "23"}
        self._av = av

    def write(self, image: np.ndarray) -> None:
        if any(self._pad):
            image = np.pad(image, ((0, self._pad[0]), (0, self._pad[1]), (0, 0)))
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def release(self) -> None:
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()


class _OpenCVWriter:
    def __init__(self, path: Path, fps: float, size: tuple[int, int], fourcc: str) -> None:
        cv2 = import_cv2()
        self._writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, size)
        if not self._writer.isOpened():
            raise ConfigError(f"OpenCV cannot write {path} with codec {fourcc}")

    def write(self, image: np.ndarray) -> None:
        self._writer.write(image)

    def release(self) -> None:
        self._writer.release()


class VideoSink:
    """Annotated video files, one per source (``stem_<source>.ext`` when there are several)."""

    def __init__(self, path: str | Path, *, fps: float, size: tuple[int, int], sources: int = 1,
                 names: tuple[str, ...] = ()) -> None:
        import_cv2()  # drawing needs OpenCV whatever encodes
        self.path = Path(path)
        self.codec = video_codec(self.path)
        if self.codec == "mp4v":
            log.warning("writing %s as MPEG-4 Part 2 (mp4v), which browsers do not play: "
                        "pip install av for H.264", self.path)
        self.names = names
        self.paths = [self.path] if sources == 1 else [
            self.path.with_name(f"{self.path.stem}_{i}{self.path.suffix}") for i in range(sources)]
        self._partials: list[Path] = []
        self._writers: list[_PyAVWriter | _OpenCVWriter] = []
        try:
            for p in self.paths:
                self._partials.append(_partial(p))
                if self.codec == "h264":
                    encoder = _h264_encoder()
                    assert encoder is not None
                    self._writers.append(_PyAVWriter(self._partials[-1], fps, size, encoder))
                else:
                    self._writers.append(_OpenCVWriter(self._partials[-1], fps, size, self.codec))
        except BaseException:
            self.abort()
            raise
        self.frames = 0

    def __call__(self, frame: Frame, detections: Detections) -> None:
        self._writers[frame.source].write(annotate(frame.image, detections, self.names))
        self.frames += 1

    def close(self) -> None:
        for writer in self._writers:
            writer.release()
        for partial, final in zip(self._partials, self.paths, strict=True):
            os.replace(partial, final)

    def abort(self) -> None:
        for writer in self._writers:
            try:
                writer.release()
            except Exception as exc:  # the run already failed; its error is the one to report
                log.debug("releasing a video writer after a failure: %s", exc)
        for partial in self._partials:
            partial.unlink(missing_ok=True)


class ThreadedSink:
    """Runs ``sink`` on a worker thread behind a bounded queue (encoding overlaps the pipeline)."""

    def __init__(self, sink: Sink, depth: int = 64) -> None:
        self.sink = sink
        self._queue: queue.Queue[tuple[Frame, Detections] | None] = queue.Queue(maxsize=depth)  # None: stop
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"sink:{type(sink).__name__}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                self.sink(*work)
            except BaseException as exc:  # raised by close() in the caller's thread
                self._error = exc
                log.error("sink %s failed: %s", type(self.sink).__name__, exc)

    def __call__(self, frame: Frame, detections: Detections) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((frame, detections))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            self.sink.abort()
            raise self._error
        self.sink.close()

    def abort(self) -> None:
        self._error = self._error or _Aborted()
        self._queue.put(None)
        self._thread.join()
        self.sink.abort()


class _Aborted(Exception):
    """Marks a sink whose run failed: queued frames are skipped."""
