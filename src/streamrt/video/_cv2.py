"""OpenCV for the video package: one named import, so a missing ``[video]`` extra is one clear error."""

from __future__ import annotations

from typing import Any

from streamrt._optional import require

__all__ = ["import_cv2"]


def import_cv2() -> Any:
    """Import ``cv2`` or raise :class:`MissingDependencyError` naming the ``video`` extra."""
    return require("cv2", extra="video", purpose="video decoding and drawing")
