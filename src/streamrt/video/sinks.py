"""Where detections go: JSON Lines, annotated video, both behind a writer thread.

* :class:`JsonlSink`: one JSON object per frame (``source``, ``frame``, ``detections`` with
  ``box`` [x1, y1, x2, y2] in frame pixels, ``score``, ``class``, ``label``).
* :class:`VideoSink`: the frames with boxes, labels and scores drawn, encoded by OpenCV (MP4
  ``mp4v`` for ``.mp4``, Motion-JPEG for ``.avi``); several sources write ``name_0.mp4``,
  ``name_1.mp4``...
* :class:`ThreadedSink`: runs any sink on its own thread so encoding never stalls the pipeline's
  producer.

Example:
    >>> sink = JsonlSink("dets.jsonl", names=("circle",))          # doctest: +SKIP
    >>> sink(frame, detections); sink.close()                        # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path
from typing import IO, Protocol

import numpy as np

from streamrt.errors import ConfigError
from streamrt.video._cv2 import import_cv2
from streamrt.video.workload import Detections, Frame

__all__ = ["JsonlSink", "Sink", "ThreadedSink", "VideoSink", "annotate"]

log = logging.getLogger(__name__)

_FOURCC = {".mp4": "mp4v", ".m4v": "mp4v", ".mov": "mp4v", ".avi": "MJPG", ".mkv": "MJPG"}


class Sink(Protocol):
    def __call__(self, frame: Frame, detections: Detections) -> None: ...

    def close(self) -> None: ...


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
    """Detections as JSON Lines, one line per frame in the order frames complete."""

    def __init__(self, path: str | Path, names: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.names = names
        self._file: IO[str] = open(self.path, "w")  # noqa: SIM115 - closed in close()
        self.frames = 0

    def __call__(self, frame: Frame, detections: Detections) -> None:
        self._file.write(json.dumps(detections.to_json(self.names)) + "\n")
        self.frames += 1

    def close(self) -> None:
        self._file.close()


class VideoSink:
    """Annotated video files, one per source (``stem_<source>.ext`` when there are several)."""

    def __init__(self, path: str | Path, *, fps: float, size: tuple[int, int], sources: int = 1,
                 names: tuple[str, ...] = ()) -> None:
        cv2 = import_cv2()
        self.path = Path(path)
        fourcc = _FOURCC.get(self.path.suffix.lower())
        if fourcc is None:
            raise ConfigError(f"cannot write video {self.path}: use one of {', '.join(_FOURCC)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.names = names
        self.paths = [self.path] if sources == 1 else [
            self.path.with_name(f"{self.path.stem}_{i}{self.path.suffix}") for i in range(sources)]
        self._writers = []
        for p in self.paths:
            writer = cv2.VideoWriter(str(p), cv2.VideoWriter_fourcc(*fourcc), fps, size)
            if not writer.isOpened():
                raise ConfigError(f"OpenCV cannot write {p} with codec {fourcc}")
            self._writers.append(writer)
        self.frames = 0

    def __call__(self, frame: Frame, detections: Detections) -> None:
        self._writers[frame.source].write(annotate(frame.image, detections, self.names))
        self.frames += 1

    def close(self) -> None:
        for writer in self._writers:
            writer.release()


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
        self.sink.close()
        if self._error is not None:
            raise self._error
