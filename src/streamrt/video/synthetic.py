"""Synthetic detection data with exact ground truth: shapes of several classes on textured backgrounds.

The bundled detector is trained on :func:`random_scene` images (``scripts/train_detector.py``),
and the demo, the tests and the benchmarks run on :class:`SyntheticClip` videos: the same shapes
moving over a textured background, with every frame's boxes known. Everything is a pure function
of a seed, so a clip generated on one machine is the clip generated on any other.

Classes (:data:`CLASS_NAMES`): circle, square, triangle, star, cross. Objects are filled,
anti-aliased polygons in saturated colours, sometimes outlined, slightly rotated; backgrounds
are one of several textures (:data:`BACKGROUNDS`) plus fine noise.

Example:
    >>> import numpy as np
    >>> image, truth = random_scene(np.random.default_rng(0), 180, 320)
    >>> image.shape, truth.boxes.shape[1]
    ((180, 320, 3), 4)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from streamrt.video._cv2 import import_cv2

__all__ = [
    "BACKGROUNDS",
    "CLASS_NAMES",
    "GroundTruth",
    "SceneConfig",
    "SyntheticClip",
    "draw_shape",
    "make_background",
    "random_scene",
]

CLASS_NAMES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")


@dataclass(frozen=True)
class GroundTruth:
    """Objects of one image: ``boxes`` (n, 4) float32 x1, y1, x2, y2 pixels; ``classes`` (n,) int64."""

    boxes: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return len(self.classes)


@dataclass(frozen=True)
class SceneConfig:
    """How many objects, how large (fraction of the shorter image side), how much they may overlap."""

    min_objects: int = 1
    max_objects: int = 8
    min_size: float = 0.08
    max_size: float = 0.3
    max_iou: float = 0.1
    max_angle_deg: float = 15.0


# -- shapes: unit polygons (radius 1) per class; the circle is drawn as a many-sided polygon ---------


def _regular(n: int, phase: float = -math.pi / 2) -> np.ndarray:
    t = phase + 2 * math.pi * np.arange(n) / n
    return np.stack([np.cos(t), np.sin(t)], 1)


def _star() -> np.ndarray:
    outer = _regular(5)
    inner = _regular(5, -math.pi / 2 + math.pi / 5) * 0.45
    return np.stack([outer, inner], 1).reshape(-1, 2)


def _cross() -> np.ndarray:
    a, b = 1.0, 0.34
    return np.array([(-b, -a), (b, -a), (b, -b), (a, -b), (a, b), (b, b), (b, a), (-b, a), (-b, b), (-a, b),
                     (-a, -b), (-b, -b)])


_SHAPES: dict[str, np.ndarray] = {
    "circle": _regular(48),
    "square": _regular(4, -math.pi / 4) * math.sqrt(2) * 0.85,
    "triangle": _regular(3) * 1.1 + np.array([0.0, 0.2]),
    "star": _star(),
    "cross": _cross(),
}


def _polygon(cls: int, cx: float, cy: float, size: float, angle: float) -> np.ndarray:
    unit = _SHAPES[CLASS_NAMES[cls]]
    c, s = math.cos(angle), math.sin(angle)
    rot = unit @ np.array([[c, s], [-s, c]])
    return rot * (size / 2) + np.array([cx, cy])


def draw_shape(image: np.ndarray, cls: int, cx: float, cy: float, size: float, angle: float,
               color: tuple[int, int, int], outline: tuple[int, int, int] | None = None) -> np.ndarray:
    """Draw one object in place and return the box of its polygon (x1, y1, x2, y2), clipped to the image.

    An ``outline`` is drawn centred on the polygon's edge, so it reaches up to half its width outside
    that box (the training scenes use the polygon's box; clips add the outline, see ``ground_truth``).
    """
    cv2 = import_cv2()
    points = _polygon(cls, cx, cy, size, angle)
    shift = 4  # sub-pixel vertex precision for anti-aliasing
    fixed = np.round(points * (1 << shift)).astype(np.int32).reshape(-1, 1, 2)
    cv2.fillPoly(image, [fixed], color, lineType=cv2.LINE_AA, shift=shift)
    if outline is not None:
        cv2.polylines(image, [fixed], True, outline, _thickness(size), lineType=cv2.LINE_AA, shift=shift)
    return _extent(points, size, False, image.shape[1], image.shape[0])


def _thickness(size: float) -> int:
    return max(1, round(size / 24))


def _extent(points: np.ndarray, size: float, outlined: bool, width: int, height: int) -> np.ndarray:
    """The tight box of a drawn polygon (half the outline's width outside its vertices), clipped."""
    grow = _thickness(size) / 2 if outlined else 0.0
    x1, y1 = points.min(0) - grow
    x2, y2 = points.max(0) + grow
    return np.array([max(x1, 0), max(y1, 0), min(x2, width), min(y2, height)], np.float32)


# -- backgrounds: a table of texture makers ------------------------------------------------------------


def _muted(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(40, 200, 3) * rng.uniform(0.6, 1.0) + rng.uniform(0, 40)


def _blobs(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    cv2 = import_cv2()
    cells = int(rng.integers(3, 12))
    small = rng.uniform(30, 200, (cells, max(2, round(cells * w / h)), 3)).astype(np.float32)
    return np.asarray(cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC))


def _stripes(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    theta = rng.uniform(0, math.pi)
    period = rng.uniform(0.02, 0.2) * min(h, w)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = 0.5 + 0.5 * np.sin((xx * math.cos(theta) + yy * math.sin(theta)) * (2 * math.pi / period))
    a, b = _muted(rng), _muted(rng)
    return np.asarray(a + (b - a) * t[..., None] * rng.uniform(0.3, 0.8), np.float32)


def _checker(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    cell = max(4, int(rng.uniform(0.03, 0.15) * min(h, w)))
    yy, xx = np.mgrid[0:h, 0:w]
    t = ((yy // cell + xx // cell) % 2).astype(np.float32)
    a, b = _muted(rng), _muted(rng)
    return np.asarray(a + (b - a) * t[..., None] * rng.uniform(0.2, 0.6), np.float32)


def _gradient(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    theta = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = xx / w * math.cos(theta) + yy / h * math.sin(theta)
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    a, b = _muted(rng), _muted(rng)
    return np.asarray(a + (b - a) * t[..., None], np.float32)


BACKGROUNDS: dict[str, Callable[[np.random.Generator, int, int], np.ndarray]] = {
    "blobs": _blobs,
    "stripes": _stripes,
    "checker": _checker,
    "gradient": _gradient,
}


def make_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A textured uint8 BGR background: a random texture from :data:`BACKGROUNDS` plus fine noise."""
    names = list(BACKGROUNDS)
    base = BACKGROUNDS[names[int(rng.integers(len(names)))]](rng, height, width)
    noise = rng.normal(0, rng.uniform(2, 12), (height, width, 1)).astype(np.float32)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _color(rng: np.random.Generator) -> tuple[int, int, int]:
    cv2 = import_cv2()
    hsv = np.array([[[rng.integers(0, 180), rng.integers(150, 256), rng.integers(150, 256)]]], np.uint8)
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    if len(boxes) == 0:
        return np.zeros(0, np.float32)
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), 1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], 1)
    return np.asarray(inter / (area + areas - inter + 1e-9))


def random_scene(
    rng: np.random.Generator, height: int, width: int, config: SceneConfig = SceneConfig()
) -> tuple[np.ndarray, GroundTruth]:
    """A textured background with non-overlapping (IoU <= ``max_iou``) random objects fully inside."""
    image = make_background(rng, height, width)
    count = int(rng.integers(config.min_objects, config.max_objects + 1))
    short = min(height, width)
    boxes: list[np.ndarray] = []
    classes: list[int] = []
    for _ in range(count * 10):  # rejection sampling for the overlap limit
        if len(boxes) == count:
            break
        size = float(rng.uniform(config.min_size, config.max_size) * short)
        cls = int(rng.integers(len(CLASS_NAMES)))
        cx = float(rng.uniform(size / 2 + 1, width - size / 2 - 1))
        cy = float(rng.uniform(size / 2 + 1, height - size / 2 - 1))
        angle = math.radians(float(rng.uniform(-config.max_angle_deg, config.max_angle_deg)))
        box = _polygon(cls, cx, cy, size, angle)
        tight = np.concatenate([box.min(0), box.max(0)]).astype(np.float32)
        if len(boxes) and _iou(tight, np.stack(boxes)).max() > config.max_iou:
            continue
        outline = _color(rng) if rng.random() < 0.3 else None
        boxes.append(draw_shape(image, cls, cx, cy, size, angle, _color(rng), outline))
        classes.append(cls)
    truth = GroundTruth(np.stack(boxes).astype(np.float32) if boxes else np.zeros((0, 4), np.float32),
                        np.asarray(classes, np.int64))
    return image, truth


@dataclass
class _Mover:
    cls: int
    x: float
    y: float
    vx: float
    vy: float
    size: float
    angle: float
    sway: float  # amplitude of the rotation (radians); objects sway within the training scenes' range
    period: float  # frames per sway
    color: tuple[int, int, int]
    outline: tuple[int, int, int] | None


class SyntheticClip:
    """A deterministic video: objects of every class moving and bouncing over a textured background.

    Frames are uint8 BGR ``(height, width, 3)`` (the layout OpenCV decodes), generated on demand;
    :meth:`ground_truth` gives the boxes of each frame.

    Example:
        >>> clip = SyntheticClip(width=320, height=180, frames=3, seed=1)
        >>> frame = clip.frame(2)
        >>> frame.shape, len(clip.ground_truth(2)) == clip.objects
        ((180, 320, 3), True)
    """

    def __init__(self, *, width: int = 1280, height: int = 720, frames: int = 90, fps: float = 30.0,
                 seed: int = 0, objects: int = 6, config: SceneConfig = SceneConfig()) -> None:
        self.width, self.height, self.frames, self.fps = width, height, frames, fps
        self.seed, self.objects = seed, objects
        rng = np.random.default_rng(seed)
        self._background = make_background(rng, height, width)
        short = min(width, height)
        self._movers: list[_Mover] = []
        placed: list[np.ndarray] = []
        for i in range(objects):
            for _ in range(20):  # start apart (IoU <= max_iou); they may cross later, as real objects do
                size = float(rng.uniform(config.min_size, config.max_size) * short)
                x, y = float(rng.uniform(size, width - size)), float(rng.uniform(size, height - size))
                box = np.array([x - size / 2, y - size / 2, x + size / 2, y + size / 2], np.float32)
                if not placed or _iou(box, np.stack(placed)).max() <= config.max_iou:
                    break
            placed.append(box)
            speed = float(rng.uniform(0.002, 0.008) * short)
            heading = float(rng.uniform(0, 2 * math.pi))
            self._movers.append(_Mover(
                cls=i % len(CLASS_NAMES), x=x, y=y, vx=speed * math.cos(heading), vy=speed * math.sin(heading),
                size=size, angle=math.radians(float(rng.uniform(-0.6, 0.6) * config.max_angle_deg)),
                sway=math.radians(float(rng.uniform(0, 0.4) * config.max_angle_deg)),
                period=float(rng.uniform(60, 240)),
                color=_color(rng), outline=_color(rng) if rng.random() < 0.3 else None,
            ))

    def __len__(self) -> int:
        return self.frames

    def _positions(self, index: int) -> list[tuple[int, float, float, float, float]]:
        """(class, cx, cy, size, angle) of every object at frame ``index`` (bouncing off the borders)."""
        out = []
        for m in self._movers:
            half = m.size / 2 + 1
            out.append((m.cls, _bounce(m.x + m.vx * index, half, self.width - half),
                        _bounce(m.y + m.vy * index, half, self.height - half), m.size,
                        m.angle + m.sway * math.sin(2 * math.pi * index / m.period)))
        return out

    def frame(self, index: int) -> np.ndarray:
        """Frame ``index`` as uint8 BGR (height, width, 3)."""
        image = self._background.copy()
        for m, (cls, cx, cy, size, angle) in zip(self._movers, self._positions(index), strict=True):
            draw_shape(image, cls, cx, cy, size, angle, m.color, m.outline)
        return image

    def ground_truth(self, index: int) -> GroundTruth:
        """Boxes and classes of frame ``index`` (objects may overlap while they cross)."""
        boxes = []
        classes = []
        for m, (cls, cx, cy, size, angle) in zip(self._movers, self._positions(index), strict=True):
            points = _polygon(cls, cx, cy, size, angle)
            boxes.append(_extent(points, size, m.outline is not None, self.width, self.height))
            classes.append(cls)
        return GroundTruth(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(classes, np.int64))

    def __iter__(self) -> Iterator[np.ndarray]:
        for index in range(self.frames):
            yield self.frame(index)


def _bounce(value: float, low: float, high: float) -> float:
    """Reflect ``value`` into [low, high] as a ball bouncing between two walls."""
    span = high - low
    if span <= 0:
        return (low + high) / 2
    t = (value - low) % (2 * span)
    return low + (t if t <= span else 2 * span - t)
