"""YOLO output layouts, as a registry: which axis holds the anchors, where boxes, objectness and scores are.

Detectors exported from the common YOLO families give one of these raw output tensors:

==========  ==========================  ==============================================================
name        shape                       channels
==========  ==========================  ==============================================================
yolov8      (batch, 4 + C, anchors)     cx, cy, w, h in input pixels, C class scores (after sigmoid);
                                        YOLOv8, YOLO11, StreamRT's bundled detector
yolov5      (batch, anchors, 5 + C)     cx, cy, w, h, objectness, C class scores; YOLOv5, YOLOv7
yolov8t     (batch, anchors, 4 + C)     YOLOv8 transposed (some third-party exports)
==========  ==========================  ==============================================================

:func:`resolve_layout` picks the layout from the output shape and the class count (from the
model's metadata or a labels file); a shape that fits none is a clear error naming the shapes
each layout expects. A new family is one more row in :data:`LAYOUTS`.

Example:
    >>> layout, classes = resolve_layout((1, 84, 8400))
    >>> layout.name, classes
    ('yolov8', 80)
    >>> resolve_layout((1, 25200, 85))[0].name
    'yolov5'
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt.errors import ModelError

__all__ = ["LAYOUTS", "OutputLayout", "resolve_layout"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputLayout:
    """One raw output layout.

    Attributes:
        name: registry key (``--layout`` on the command line).
        anchors_last: the anchors are the last axis (``(batch, channels, anchors)``).
        objectness: channel 4 is an objectness score multiplied into the class scores.
        description: one line for help texts and errors.
    """

    name: str
    anchors_last: bool
    objectness: bool
    description: str

    @property
    def score_offset(self) -> int:
        """Index of the first class score channel."""
        return 5 if self.objectness else 4

    def channels(self, num_classes: int) -> int:
        """Channels per anchor for ``num_classes`` classes."""
        return self.score_offset + num_classes

    def split(self, shape: Sequence[int]) -> tuple[int, int]:
        """``(channels, anchors)`` of a ``(batch, ., .)`` output shape."""
        return (int(shape[1]), int(shape[2])) if self.anchors_last else (int(shape[2]), int(shape[1]))

    def classes_of(self, shape: Sequence[int]) -> int:
        """The class count a shape implies under this layout (may be < 1 when it does not fit)."""
        return self.split(shape)[0] - self.score_offset

    def channels_first(self, output: Any) -> Any:
        """A ``(batch, channels, anchors)`` view of a raw output (NumPy array or torch tensor)."""
        if self.anchors_last:
            return output
        return output.transpose(1, 2) if not isinstance(output, np.ndarray) else output.transpose(0, 2, 1)

    def expected(self, num_classes: int | None) -> str:
        c = "C" if num_classes is None else str(self.channels(num_classes))
        return f"(batch, {c}, anchors)" if self.anchors_last else f"(batch, anchors, {c})"


LAYOUTS: dict[str, OutputLayout] = {
    "yolov8": OutputLayout("yolov8", True, False, "YOLOv8/YOLO11: (batch, 4 + classes, anchors), no objectness"),
    "yolov5": OutputLayout("yolov5", False, True, "YOLOv5/YOLOv7: (batch, anchors, 5 + classes) with objectness"),
    "yolov8t": OutputLayout("yolov8t", False, False, "YOLOv8 transposed: (batch, anchors, 4 + classes)"),
}

# Tried in this order when neither the layout nor the class count settles it.
_AUTO_ORDER = ("yolov8", "yolov5")


def _fits(layout: OutputLayout, shape: Sequence[int], num_classes: int | None) -> bool:
    channels, anchors = layout.split(shape)
    if num_classes is not None:
        return channels == layout.channels(num_classes)
    return channels > layout.score_offset and anchors > channels


def resolve_layout(
    shape: Sequence[int], *, num_classes: int | None = None, layout: str | None = None
) -> tuple[OutputLayout, int]:
    """The layout of a raw output of ``shape`` and its class count.

    Args:
        shape: the output shape ``(batch, ., .)`` (a dynamic batch may be -1).
        num_classes: the class count when known (metadata, labels file); it disambiguates.
        layout: a name from :data:`LAYOUTS` to use instead of guessing.

    Raises:
        ModelError: the shape fits no layout (or not the one asked for), naming what each expects.
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) != 3 or min(shape[1:]) < 1:
        raise ModelError(
            f"detector output has shape {shape}; expected a 3-D YOLO output: "
            + "; ".join(f"{n} {lay.expected(num_classes)}" for n, lay in LAYOUTS.items()),
            hint="export the raw head output (no NMS plugin), or pass --layout",
        )
    if layout is not None:
        if layout not in LAYOUTS:
            raise ModelError(f"unknown output layout {layout!r}; known: {', '.join(LAYOUTS)}")
        candidates = [LAYOUTS[layout]]
    elif num_classes is not None:
        candidates = list(LAYOUTS.values())
    else:
        candidates = [LAYOUTS[n] for n in _AUTO_ORDER]
    for candidate in candidates:
        if _fits(candidate, shape, num_classes) or (layout is not None and num_classes is None
                                                    and candidate.classes_of(shape) >= 1):
            classes = candidate.classes_of(shape)
            log.debug("output %s: layout %s, %d classes", shape, candidate.name, classes)
            return candidate, classes
    wanted = "; ".join(f"{c.name} {c.expected(num_classes)}" for c in candidates)
    known = f" with {num_classes} classes" if num_classes is not None else ""
    raise ModelError(
        f"detector output shape {shape} fits no known YOLO layout{known}: expected {wanted}",
        hint="check the labels file / class count, or name the layout with --layout "
        f"({', '.join(LAYOUTS)})",
    )
