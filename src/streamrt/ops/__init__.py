"""Pre- and post-processing ops for detection, each with a host (NumPy/OpenCV) and a device (torch/Triton) version.

* letterbox: :class:`CpuLetterbox` / :class:`TorchLetterbox` (resize keeping the aspect ratio,
  pad, BGR->RGB, normalise, HWC->CHW in one pass), sharing :class:`LetterboxGeometry`;
* YOLO output layouts: :data:`LAYOUTS`, :func:`resolve_layout`;
* crops of boxes resized to a fixed size (a detector -> classifier chain): :func:`crop_resize` (torch);
* decode + threshold + top-k + class-aware NMS with fixed-size outputs: :class:`CpuPostprocess` /
  :class:`TorchPostprocess` (Triton kernels on CUDA: no host sync, capturable in a CUDA graph),
  :func:`nms_numpy` (the reference, with ``torchvision.ops.batched_nms`` semantics).

Every op writes into outputs the caller allocated once. The torch versions import torch (and
Triton where it runs) lazily, so the host versions work without either.

Example:
    >>> from streamrt.ops import LetterboxGeometry
    >>> LetterboxGeometry.fit((1080, 1920), (640, 640)).new_h
    360
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrt.ops.layouts import LAYOUTS, OutputLayout, resolve_layout
from streamrt.ops.letterbox import CpuLetterbox, LetterboxGeometry, Normalize
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig, decode_candidates, nms_numpy

if TYPE_CHECKING:
    from streamrt.ops.crop_torch import crop_resize
    from streamrt.ops.letterbox_torch import TorchLetterbox
    from streamrt.ops.postprocess_torch import TorchPostprocess

__all__ = [
    "LAYOUTS",
    "CpuLetterbox",
    "CpuPostprocess",
    "LetterboxGeometry",
    "Normalize",
    "OutputLayout",
    "PostprocessConfig",
    "TorchLetterbox",
    "TorchPostprocess",
    "crop_resize",
    "decode_candidates",
    "nms_numpy",
    "resolve_layout",
]

_LAZY = {
    "crop_resize": "streamrt.ops.crop_torch",
    "TorchLetterbox": "streamrt.ops.letterbox_torch",
    "TorchPostprocess": "streamrt.ops.postprocess_torch",
}


def __getattr__(name: str) -> Any:
    # torch is imported only by the device versions, and only when they are asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'streamrt.ops' has no attribute {name!r}")
