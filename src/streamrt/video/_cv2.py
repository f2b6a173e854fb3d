"""The one place that imports OpenCV, so a missing ``[video]`` extra is one clear error."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from streamrt.errors import MissingDependencyError

__all__ = ["has_cv2", "import_cv2"]


@cache
def import_cv2() -> Any:
    """Import ``cv2`` or raise :class:`MissingDependencyError` naming the ``video`` extra.

    FFmpeg's own log lines (``[h264 @ 0x...] error while decoding MB``) are silenced: StreamRT
    reports undecodable files and frames itself. Set ``OPENCV_FFMPEG_LOGLEVEL`` to see them.
    """
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when FFmpeg starts
    try:
        import cv2
    except ImportError as exc:
        raise MissingDependencyError("opencv-python-headless", "video", purpose="video decoding and drawing") from exc
    return cv2


def has_cv2() -> bool:
    """True when OpenCV imports."""
    try:
        import_cv2()
    except MissingDependencyError:
        return False
    return True
