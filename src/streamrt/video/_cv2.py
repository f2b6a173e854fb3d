"""The one place that imports OpenCV, so a missing ``[video]`` extra is one clear error."""

from __future__ import annotations

from functools import cache
from typing import Any

from streamrt.errors import MissingDependencyError

__all__ = ["has_cv2", "import_cv2"]


@cache
def import_cv2() -> Any:
    """Import ``cv2`` or raise :class:`MissingDependencyError` naming the ``video`` extra."""
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
