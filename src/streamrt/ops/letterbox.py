"""Letterbox pre-processing: resize keeping the aspect ratio, pad, BGR->RGB, normalise, HWC->CHW.

One geometry (:class:`LetterboxGeometry`) is shared by every implementation and by the inverse
mapping of detections back to frame pixels, so the host, torch and Triton versions cannot
disagree about where the picture sits in the model input.

Resampling is bilinear with half-pixel centres and clamped borders, which is what OpenCV's
``INTER_LINEAR`` and torch's ``interpolate(mode="bilinear", align_corners=False)`` compute
(no antialiasing: Ultralytics' letterbox does the same). The result is
``(pixel / 255 - mean) / std`` per channel, laid out CHW; the padding is ``pad_value`` (114, grey)
normalised the same way.

This module is the host version (:class:`CpuLetterbox`: OpenCV when installed, else NumPy);
:mod:`streamrt.ops.letterbox_torch` has the device version.

Example:
    >>> import numpy as np
    >>> op = CpuLetterbox((720, 1280), (320, 320))
    >>> out = np.empty((3, 320, 320), np.float32)
    >>> _ = op(np.zeros((720, 1280, 3), np.uint8), out)
    >>> op.geometry.top, op.geometry.new_h, round(float(out[0, 0, 0]), 3)
    (70, 180, 0.447)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamrt._features import cv2_available
from streamrt._optional import require
from streamrt.errors import ConfigError, ShapeError

__all__ = ["CpuLetterbox", "LetterboxGeometry", "Normalize", "linear_taps"]


@dataclass(frozen=True)
class LetterboxGeometry:
    """Where a ``src_h`` x ``src_w`` frame lands inside a ``dst_h`` x ``dst_w`` model input.

    Attributes:
        new_h, new_w: size of the resized picture (the aspect ratio kept, rounded).
        top, left: padding above and left of it (the rest of the padding is below / right).
    """

    src_h: int
    src_w: int
    dst_h: int
    dst_w: int
    new_h: int
    new_w: int
    top: int
    left: int

    @classmethod
    def fit(cls, src_hw: Sequence[int], dst_hw: Sequence[int], *, scaleup: bool = True) -> LetterboxGeometry:
        """Centre the largest aspect-preserving resize of ``src_hw`` inside ``dst_hw``.

        Args:
            src_hw: frame (height, width).
            dst_hw: model input (height, width).
            scaleup: allow enlarging frames smaller than the input (False keeps them 1:1).
        """
        (sh, sw), (dh, dw) = (int(v) for v in src_hw), (int(v) for v in dst_hw)
        if min(sh, sw, dh, dw) < 1:
            raise ShapeError(f"letterbox sizes must be >= 1, got frame {sh}x{sw} -> input {dh}x{dw}")
        r = min(dh / sh, dw / sw)
        if not scaleup:
            r = min(r, 1.0)
        nh, nw = min(dh, max(1, round(sh * r))), min(dw, max(1, round(sw * r)))
        return cls(sh, sw, dh, dw, nh, nw, (dh - nh) // 2, (dw - nw) // 2)

    @property
    def scale_x(self) -> float:
        return self.new_w / self.src_w

    @property
    def scale_y(self) -> float:
        return self.new_h / self.src_h

    def to_source(self, boxes: np.ndarray) -> np.ndarray:
        """Map x1, y1, x2, y2 boxes from model-input pixels to frame pixels (in place), clipped."""
        boxes[..., 0::2] = np.clip((boxes[..., 0::2] - self.left) / self.scale_x, 0, self.src_w)
        boxes[..., 1::2] = np.clip((boxes[..., 1::2] - self.top) / self.scale_y, 0, self.src_h)
        return boxes

    def to_input(self, boxes: np.ndarray) -> np.ndarray:
        """Map boxes from frame pixels to model-input pixels (in place): the inverse of :meth:`to_source`."""
        boxes[..., 0::2] = boxes[..., 0::2] * self.scale_x + self.left
        boxes[..., 1::2] = boxes[..., 1::2] * self.scale_y + self.top
        return boxes


@dataclass(frozen=True)
class Normalize:
    """``(pixel / 255 - mean) / std`` per RGB channel, and whether frames arrive as BGR.

    YOLO exports take RGB in [0, 1]: the defaults. ``scale``/``shift`` fold it into one
    multiply-add per pixel on 0..255 values (``dst = pixel * scale + shift``).
    """

    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    bgr_to_rgb: bool = True
    pad_value: int = 114

    def __post_init__(self) -> None:
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(f"normalize needs 3 means and 3 stds > 0, got mean={self.mean} std={self.std}")
        if not 0 <= self.pad_value <= 255:
            raise ConfigError(f"pad_value must be in 0..255, got {self.pad_value}")

    @property
    def scale(self) -> tuple[float, float, float]:
        """Per output (RGB) channel multiplier on 0..255 pixels."""
        s = self.std
        return (1 / (255 * s[0]), 1 / (255 * s[1]), 1 / (255 * s[2]))

    @property
    def shift(self) -> tuple[float, float, float]:
        m, s = self.mean, self.std
        return (-m[0] / s[0], -m[1] / s[1], -m[2] / s[2])

    @property
    def source_channel(self) -> tuple[int, int, int]:
        """For each output channel, the frame channel it reads (BGR frames: 2, 1, 0)."""
        return (2, 1, 0) if self.bgr_to_rgb else (0, 1, 2)

    def pad(self, channel: int) -> float:
        """The normalised padding value of output channel ``channel``."""
        return self.pad_value * self.scale[channel] + self.shift[channel]


def linear_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps of a ``src`` -> ``dst`` resize along one axis: (index0, index1, weight of index1).

    Half-pixel centres, clamped at the borders (OpenCV ``INTER_LINEAR``, torch ``align_corners=False``).
    """
    pos = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    pos = np.clip(pos, 0, None)
    i0 = np.minimum(np.floor(pos).astype(np.int64), src - 1)
    frac = np.where(i0 >= src - 1, 0.0, pos - i0)
    i1 = np.minimum(i0 + 1, src - 1)
    return i0, i1, frac.astype(np.float32)


class CpuLetterbox:
    """Letterbox on the host into a pre-allocated ``(3, dst_h, dst_w)`` array (float32 or float16).

    Uses OpenCV's ``resize`` when OpenCV is installed (``method="opencv"``), else a NumPy
    bilinear resize from precomputed taps (``method="numpy"``). OpenCV computes in 11-bit fixed
    point, so the two differ by at most about 1/255 before normalisation. Only the resized picture
    passes through a scratch buffer allocated once; each call writes the caller's ``out``.

    Args:
        src_hw: frame (height, width); frames of another size are an error (make one op per source).
        dst_hw: model input (height, width).
        normalize: channel order, mean/std and padding (default YOLO's: RGB / 255, grey 114 padding).
        method: ``"auto"`` (OpenCV if installed), ``"opencv"`` or ``"numpy"``.
    """

    def __init__(self, src_hw: Sequence[int], dst_hw: Sequence[int], normalize: Normalize | None = None, *,
                 method: str = "auto") -> None:
        self.geometry = LetterboxGeometry.fit(src_hw, dst_hw)
        self.normalize = normalize or Normalize()
        self._cv2 = None
        if method not in ("auto", "opencv", "numpy"):
            raise ConfigError(f"letterbox method must be auto, opencv or numpy, got {method!r}")
        if method != "numpy" and (method == "opencv" or cv2_available()):
            self._cv2 = require("cv2", extra="video", purpose="video decoding and drawing")
        g = self.geometry
        self.method = "opencv" if self._cv2 is not None else "numpy"
        self._resized = np.empty((g.new_h, g.new_w, 3), np.uint8 if self._cv2 is not None else np.float32)
        if self._cv2 is None:
            y0, y1, fy = linear_taps(g.src_h, g.new_h)
            x0, x1, fx = linear_taps(g.src_w, g.new_w)
            self._y = (y0, y1, fy[:, None, None])
            self._x = (x0, x1, fx[None, :, None])
            self._rows8 = np.empty((2, g.new_h, g.src_w, 3), np.uint8)
            self._rows = np.empty((2, g.new_h, g.src_w, 3), np.float32)
            self._tmp = np.empty((g.new_h, g.new_w, 3), np.float32)

    def _resize_numpy(self, frame: np.ndarray) -> np.ndarray:
        (y0, y1, fy), (x0, x1, fx) = self._y, self._x
        rows, out, tmp = self._rows, self._resized, self._tmp
        np.take(frame, y0, axis=0, out=self._rows8[0], mode="clip")
        np.take(frame, y1, axis=0, out=self._rows8[1], mode="clip")
        np.copyto(rows, self._rows8)
        np.subtract(rows[1], rows[0], out=rows[1])
        np.multiply(rows[1], fy, out=rows[1])
        np.add(rows[0], rows[1], out=rows[0])  # rows[0]: vertically interpolated
        np.take(rows[0], x0, axis=1, out=out)
        np.take(rows[0], x1, axis=1, out=tmp)
        np.subtract(tmp, out, out=tmp)
        np.multiply(tmp, fx, out=tmp)
        np.add(out, tmp, out=out)
        return out

    def __call__(self, frame: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Write the letterboxed, normalised CHW picture of ``frame`` (HWC uint8) into ``out``; return it."""
        g, n = self.geometry, self.normalize
        if frame.shape != (g.src_h, g.src_w, 3) or frame.dtype != np.uint8:
            raise ShapeError(f"letterbox expects uint8 frames of {g.src_h}x{g.src_w}x3, got "
                             f"{frame.dtype} {'x'.join(map(str, frame.shape))}")
        view = out.reshape(out.shape[-3:]) if out.ndim == 4 else out
        if view.shape != (3, g.dst_h, g.dst_w):
            raise ShapeError(f"letterbox output must be 3x{g.dst_h}x{g.dst_w}, got {'x'.join(map(str, out.shape))}")
        if self._cv2 is not None:
            resized = self._cv2.resize(frame, (g.new_w, g.new_h), dst=self._resized,
                                       interpolation=self._cv2.INTER_LINEAR)
        else:
            resized = self._resize_numpy(frame)
        bottom, right = g.top + g.new_h, g.left + g.new_w
        for c, (src_c, scale, shift) in enumerate(zip(n.source_channel, n.scale, n.shift, strict=True)):
            plane = view[c]
            pad = n.pad(c)
            plane[: g.top] = pad
            plane[bottom:] = pad
            plane[g.top: bottom, : g.left] = pad
            plane[g.top: bottom, right:] = pad
            inner = plane[g.top: bottom, g.left: right]
            np.multiply(resized[..., src_c], np.float32(scale), out=inner, casting="unsafe")
            if shift:
                np.add(inner, np.float32(shift), out=inner, casting="unsafe")
        return out
