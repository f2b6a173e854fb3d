"""OpenCV for the video package: one named import, so a missing ``[video]`` extra is one clear error."""

from __future__ import annotations

import os
from typing import Any

from streamrt._optional import require

__all__ = ["import_cv2"]


def import_cv2() -> Any:
    """Import ``cv2`` or raise :class:`MissingDependencyError` naming the ``video`` extra.

    FFmpeg's own log lines (``[h264 @ 0x...] error while decoding MB``) are silenced: StreamRT
    reports undecodable files and frames itself. Set ``OPENCV_FFMPEG_LOGLEVEL`` to see them.
    """
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when FFmpeg starts
    return require("cv2", extra="video", purpose="video decoding and drawing")
