"""Letterbox on the device: uint8 HWC frames -> normalised CHW model input, into a pre-allocated tensor.

On CUDA with Triton, one kernel does everything in a single pass over the output (each output
pixel reads its four source pixels from the frame, interpolates, swaps channels, normalises, or
writes the padding). Without Triton (or on CPU tensors, which the tests use) the same result is
computed with torch ops whose outputs all live in scratch buffers allocated once, so neither
path allocates in the steady state and both can be captured in a CUDA graph.

Example:
    >>> import torch
    >>> op = TorchLetterbox((90, 160), (64, 64), device="cpu")
    >>> out = torch.empty(1, 3, 64, 64)
    >>> _ = op(torch.zeros(90, 160, 3, dtype=torch.uint8), out)
    >>> round(out[0, 0, 0, 0].item(), 3), op.geometry.top
    (0.447, 14)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from streamrt.errors import ShapeError
from streamrt.ops._backend import use_triton as resolve_triton
from streamrt.ops.letterbox import LetterboxGeometry, Normalize, linear_taps

__all__ = ["TorchLetterbox", "TorchNv12Letterbox"]


class TorchLetterbox:
    """Letterbox + pad + BGR->RGB + normalise + HWC->CHW of device frames, one call per batch.

    Args:
        src_hw: frame (height, width); one op per source resolution.
        dst_hw: model input (height, width).
        normalize: channel order, mean/std and padding (default YOLO's: RGB / 255, grey 114 padding).
        device: where frames and outputs live.
        batch: the most frames per call (sizes the scratch buffers of the torch path).
        use_triton: None picks the Triton kernel wherever it can run.
    """

    def __init__(self, src_hw: Sequence[int], dst_hw: Sequence[int], normalize: Normalize | None = None, *,
                 device: Any = "cuda", batch: int = 1, use_triton: bool | None = None) -> None:
        self.geometry = LetterboxGeometry.fit(src_hw, dst_hw)
        self.normalize = normalize or Normalize()
        self.device = torch.device(device)
        self.batch = batch
        self.use_triton = resolve_triton(self.device, use_triton)
        self._scratch: dict[str, torch.Tensor] = {}
        if not self.use_triton:
            self._allocate()

    def _allocate(self) -> None:
        g, dev, b = self.geometry, self.device, self.batch
        y0, y1, fy = linear_taps(g.src_h, g.new_h)
        x0, x1, fx = linear_taps(g.src_w, g.new_w)
        self._scratch = {
            "y": torch.from_numpy(_cat(y0, y1)).to(dev),
            "x": torch.from_numpy(_cat(x0, x1)).to(dev),
            "fy": torch.from_numpy(fy).to(dev).view(1, -1, 1, 1),
            "fx": torch.from_numpy(fx).to(dev).view(1, 1, -1, 1),
            "rows": torch.empty((b, 2 * g.new_h, g.src_w, 3), dtype=torch.uint8, device=dev),
            "quad8": torch.empty((b, 2 * g.new_h, 2 * g.new_w, 3), dtype=torch.uint8, device=dev),
            "quad": torch.empty((b, 2 * g.new_h, 2 * g.new_w, 3), dtype=torch.float32, device=dev),
            "upper": torch.empty((b, g.new_h, g.new_w, 3), dtype=torch.float32, device=dev),
            "lower": torch.empty((b, g.new_h, g.new_w, 3), dtype=torch.float32, device=dev),
        }

    def __call__(self, frames: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the letterboxed input of ``frames`` ((B,) H, W, 3 uint8) into ``out`` ((B,) 3, h, w); return it."""
        g = self.geometry
        frames4 = frames.unsqueeze(0) if frames.dim() == 3 else frames
        out4 = out.unsqueeze(0) if out.dim() == 3 else out
        b = frames4.shape[0]
        if tuple(frames4.shape[1:]) != (g.src_h, g.src_w, 3) or frames4.dtype != torch.uint8:
            raise ShapeError(f"letterbox expects uint8 frames of {g.src_h}x{g.src_w}x3, got {frames.dtype} "
                             f"{tuple(frames.shape)}")
        if tuple(out4.shape) != (b, 3, g.dst_h, g.dst_w):
            raise ShapeError(f"letterbox output must be ({b}, 3, {g.dst_h}, {g.dst_w}), got {tuple(out.shape)}")
        if b > self.batch and not self.use_triton:
            raise ShapeError(f"letterbox was sized for batches of {self.batch}, got {b}")
        if self.use_triton:
            from streamrt.ops import triton_kernels

            if not out4[0].is_contiguous():  # the kernel writes whole CHW planes of each image
                raise ShapeError("letterbox output must be contiguous per image (B, 3, h, w)")

            triton_kernels.letterbox(frames4.contiguous(), out4, g, self.normalize)
        else:
            self._torch(frames4, out4)
        return out

    @torch.no_grad()
    def _torch(self, frames: torch.Tensor, out: torch.Tensor) -> None:
        g, n, s = self.geometry, self.normalize, self._scratch
        b = frames.shape[0]
        rows, quad8, quad = s["rows"][:b], s["quad8"][:b], s["quad"][:b]
        upper, lower = s["upper"][:b], s["lower"][:b]
        torch.index_select(frames, 1, s["y"], out=rows)
        torch.index_select(rows, 2, s["x"], out=quad8)
        quad.copy_(quad8)
        nh, nw = g.new_h, g.new_w
        torch.lerp(quad[:, :nh, :nw], quad[:, :nh, nw:], s["fx"], out=upper)
        torch.lerp(quad[:, nh:, :nw], quad[:, nh:, nw:], s["fx"], out=lower)
        torch.lerp(upper, lower, s["fy"], out=upper)
        inner = out[:, :, g.top: g.top + nh, g.left: g.left + nw]
        for c, (src_c, scale, shift) in enumerate(zip(n.source_channel, n.scale, n.shift, strict=True)):
            out[:, c].fill_(n.pad(c))
            torch.mul(upper[..., src_c], scale, out=inner[:, c])
            if shift:
                inner[:, c].add_(shift)


def _cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([a, b]).astype(np.int64)


class TorchNv12Letterbox:
    """Letterbox of NV12 device pictures (a hardware decoder's output) into the model input, one pass.

    NV12 -> RGB (limited range, ``matrix`` ``bt601`` or ``bt709``, see :mod:`streamrt.ops.nv12`),
    bilinear letterbox, padding, normalisation and CHW in one Triton kernel
    (:func:`streamrt.ops.triton_kernels.nv12_letterbox`): RGB frames never exist in memory. Without
    Triton a torch version computes the same (it allocates per call and is meant for tests and CPU
    tensors, not for CUDA graphs).

    Args:
        src_hw: picture (height, width), both even.
        dst_hw: model input (height, width).
        normalize: mean/std and padding; ``bgr_to_rgb`` True writes R, G, B planes (YOLO), False B, G, R.
        matrix: the stream's colour matrix (``bt601`` for what libx264 makes from RGB by default).
        device, use_triton: as :class:`TorchLetterbox`.
    """

    def __init__(self, src_hw: Sequence[int], dst_hw: Sequence[int], normalize: Normalize | None = None, *,
                 matrix: str = "bt601", device: Any = "cuda", use_triton: bool | None = None) -> None:
        from streamrt.ops.nv12 import color_matrix, nv12_shape

        self.geometry = LetterboxGeometry.fit(src_hw, dst_hw)
        self.nv12_hw = nv12_shape(self.geometry.src_h, self.geometry.src_w)
        self.normalize = normalize or Normalize()
        self.matrix = color_matrix(matrix)
        self.device = torch.device(device)
        self.use_triton = resolve_triton(self.device, use_triton)
        g = self.geometry
        y0, y1, fy = linear_taps(g.src_h, g.new_h)
        x0, x1, fx = linear_taps(g.src_w, g.new_w)
        self._taps = [torch.from_numpy(t).to(self.device) for t in (y0, y1, fy, x0, x1, fx)]

    def __call__(self, frames: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the model input of ``frames`` ((B,) H * 3 / 2, W uint8) into ``out`` ((B,) 3, h, w); return it."""
        g = self.geometry
        frames3 = frames.unsqueeze(0) if frames.dim() == 2 else frames
        out4 = out.unsqueeze(0) if out.dim() == 3 else out
        b = frames3.shape[0]
        if tuple(frames3.shape[1:]) != self.nv12_hw or frames3.dtype != torch.uint8 or frames3.stride(2) != 1:
            raise ShapeError(f"NV12 letterbox expects uint8 ({self.nv12_hw[0]}, {self.nv12_hw[1]}) pictures with "
                             f"contiguous rows, got {frames.dtype} {tuple(frames.shape)}")
        if tuple(out4.shape) != (b, 3, g.dst_h, g.dst_w) or not out4[0].is_contiguous():
            raise ShapeError(f"letterbox output must be contiguous ({b}, 3, {g.dst_h}, {g.dst_w}), got "
                             f"{tuple(out.shape)}")
        if self.use_triton:
            from streamrt.ops import triton_kernels

            triton_kernels.nv12_letterbox(frames3, out4, g, self.normalize, self.matrix)
        else:
            self._torch(frames3, out4)
        return out

    @torch.no_grad()
    def _torch(self, frames: torch.Tensor, out: torch.Tensor) -> None:
        g, n, m = self.geometry, self.normalize, self.matrix
        h = g.src_h
        y = frames[:, :h].float() - 16.0
        uv = frames[:, h:].reshape(frames.shape[0], h // 2, g.src_w // 2, 2).float() - 128.0
        u = uv[..., 0].repeat_interleave(2, 1).repeat_interleave(2, 2)
        v = uv[..., 1].repeat_interleave(2, 1).repeat_interleave(2, 2)
        rgb = torch.stack([m.ky * y + m.kvr * v, m.ky * y - m.kug * u - m.kvg * v, m.ky * y + m.kub * u], -1)
        rgb = rgb.clamp_(0.0, 255.0)
        y0, y1, fy, x0, x1, fx = self._taps
        rows = torch.lerp(rgb[:, y0], rgb[:, y1], fy.view(1, -1, 1, 1))
        resized = torch.lerp(rows[:, :, x0], rows[:, :, x1], fx.view(1, 1, -1, 1))
        order = (0, 1, 2) if n.bgr_to_rgb else (2, 1, 0)
        for c in range(3):
            out[:, c].fill_(n.pad(c))
            inner = out[:, c, g.top: g.top + g.new_h, g.left: g.left + g.new_w]
            inner.copy_(resized[..., order[c]] * n.scale[c] + n.shift[c])
