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

__all__ = ["TorchLetterbox"]


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
