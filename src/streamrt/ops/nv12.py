"""NV12 frames (what hardware decoders output) -> RGB, and the letterbox of NV12 frames: the host reference.

NVDEC writes 8-bit 4:2:0 pictures as NV12: the full-resolution luma plane (``H`` rows of ``W``
bytes) followed by the half-resolution chroma plane (``H / 2`` rows of interleaved ``U, V``
bytes), one ``(H * 3 / 2, W)`` uint8 array. It does not convert colour; that is ours to do.

The conversion is the **limited-range** ("TV", ``Y`` in 16..235, ``U/V`` in 16..240) matrix of
BT.601 (SD, and what libx264/FFmpeg tag 4:2:0 clips made from RGB with by default) or BT.709
(HD broadcast); :data:`COLOR_MATRICES` has both. Chroma is sampled nearest (each 2x2 block of
pixels shares one ``U, V`` pair, no chroma interpolation). RGB stays in float (clamped to
0..255, not rounded), and the letterbox interpolates those floats: the device kernel
(:func:`streamrt.ops.triton_kernels.nv12_letterbox`) computes exactly this, and
:class:`CpuNv12Letterbox` is the NumPy reference the tests hold it to.

Example:
    >>> import numpy as np
    >>> nv12 = np.full((6, 4), 128, np.uint8); nv12[:4] = 235      # white luma, neutral chroma
    >>> nv12_to_rgb(nv12, "bt601")[0, 0].round(1).tolist()
    [255.0, 255.0, 255.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamrt.errors import ConfigError, ShapeError
from streamrt.ops.letterbox import LetterboxGeometry, Normalize, linear_taps

__all__ = ["COLOR_MATRICES", "ColorMatrix", "CpuNv12Letterbox", "color_matrix", "nv12_shape", "nv12_to_rgb",
           "rgb_to_nv12"]


@dataclass(frozen=True)
class ColorMatrix:
    """Limited-range YUV -> RGB: ``R = ky (Y - 16) + kvr (V - 128)``, ``G = ky (Y - 16) - kug (U - 128) -
    kvg (V - 128)``, ``B = ky (Y - 16) + kub (U - 128)``."""

    name: str
    ky: float
    kvr: float
    kug: float
    kvg: float
    kub: float


def _limited(name: str, kr: float, kb: float) -> ColorMatrix:
    kg = 1.0 - kr - kb
    ky, kc = 255.0 / 219.0, 255.0 / 224.0
    return ColorMatrix(name, ky, kc * 2 * (1 - kr), kc * 2 * (1 - kb) * kb / kg, kc * 2 * (1 - kr) * kr / kg,
                       kc * 2 * (1 - kb))


COLOR_MATRICES: dict[str, ColorMatrix] = {
    "bt601": _limited("bt601", 0.299, 0.114),
    "bt709": _limited("bt709", 0.2126, 0.0722),
}


def color_matrix(name: str) -> ColorMatrix:
    """The matrix named ``bt601`` or ``bt709``."""
    if name not in COLOR_MATRICES:
        raise ConfigError(f"colour matrix must be one of {', '.join(COLOR_MATRICES)}, got {name!r}")
    return COLOR_MATRICES[name]


def nv12_shape(height: int, width: int) -> tuple[int, int]:
    """The (rows, columns) of an NV12 picture of ``height`` x ``width`` (both even)."""
    if height % 2 or width % 2 or height < 2 or width < 2:
        raise ShapeError(f"NV12 pictures have even sizes >= 2, got {height}x{width}")
    return height * 3 // 2, width


def nv12_to_rgb(nv12: np.ndarray, matrix: str = "bt601") -> np.ndarray:
    """``(H * 3 / 2, W)`` uint8 NV12 -> ``(H, W, 3)`` float32 RGB in 0..255 (see the module docstring)."""
    m = color_matrix(matrix)
    rows, w = nv12.shape
    h = rows * 2 // 3
    nv12_shape(h, w)
    y = nv12[:h].astype(np.float64) - 16.0
    uv = nv12[h:].reshape(h // 2, w // 2, 2).astype(np.float64) - 128.0
    u = np.repeat(np.repeat(uv[..., 0], 2, axis=0), 2, axis=1)
    v = np.repeat(np.repeat(uv[..., 1], 2, axis=0), 2, axis=1)
    rgb = np.stack([m.ky * y + m.kvr * v, m.ky * y - m.kug * u - m.kvg * v, m.ky * y + m.kub * u], axis=-1)
    return np.clip(rgb, 0.0, 255.0).astype(np.float32)


def rgb_to_nv12(rgb: np.ndarray, matrix: str = "bt601") -> np.ndarray:
    """The inverse, for tests: ``(H, W, 3)`` RGB -> NV12 uint8 (chroma averaged over 2x2 blocks)."""
    m = color_matrix(matrix)
    h, w = rgb.shape[:2]
    nv12_shape(h, w)
    inv = np.linalg.inv(np.array([[m.ky, 0.0, m.kvr], [m.ky, -m.kug, -m.kvg], [m.ky, m.kub, 0.0]]))
    yuv = rgb.astype(np.float64) @ inv.T  # (Y - 16, U - 128, V - 128)
    out = np.empty((h * 3 // 2, w), np.uint8)
    out[:h] = np.clip(np.rint(yuv[..., 0] + 16), 0, 255)
    chroma = yuv[..., 1:].reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3)) + 128
    out[h:] = np.clip(np.rint(chroma), 0, 255).reshape(h // 2, w)
    return out


class CpuNv12Letterbox:
    """The NumPy reference of the fused device op: NV12 -> RGB (float) -> letterbox -> normalise -> CHW.

    Args:
        src_hw: picture (height, width), both even.
        dst_hw: model input (height, width).
        normalize: mean/std and padding; ``bgr_to_rgb=True`` (YOLO) writes R, G, B planes, False
            writes B, G, R (the order a BGR-trained model expects).
        matrix: ``bt601`` or ``bt709`` (limited range).
    """

    def __init__(self, src_hw: Sequence[int], dst_hw: Sequence[int], normalize: Normalize | None = None,
                 matrix: str = "bt601") -> None:
        self.geometry = g = LetterboxGeometry.fit(src_hw, dst_hw)
        nv12_shape(g.src_h, g.src_w)
        self.normalize = normalize or Normalize()
        self.matrix = color_matrix(matrix).name
        self._y = linear_taps(g.src_h, g.new_h)
        self._x = linear_taps(g.src_w, g.new_w)

    def __call__(self, nv12: np.ndarray, out: np.ndarray) -> np.ndarray:
        g, n = self.geometry, self.normalize
        if nv12.shape != nv12_shape(g.src_h, g.src_w) or nv12.dtype != np.uint8:
            raise ShapeError(f"expected uint8 NV12 of {nv12_shape(g.src_h, g.src_w)}, got {nv12.dtype} {nv12.shape}")
        rgb = nv12_to_rgb(nv12, self.matrix).astype(np.float64)
        (y0, y1, fy), (x0, x1, fx) = self._y, self._x
        rows = rgb[y0] + (rgb[y1] - rgb[y0]) * fy[:, None, None]
        resized = rows[:, x0] + (rows[:, x1] - rows[:, x0]) * fx[None, :, None]
        order = (0, 1, 2) if n.bgr_to_rgb else (2, 1, 0)
        for c in range(3):
            out[c] = n.pad(c)
            out[c, g.top: g.top + g.new_h, g.left: g.left + g.new_w] = resized[..., order[c]] * n.scale[c] + n.shift[c]
        return out
