"""Whether the device ops use Triton kernels or their plain-torch versions.

Triton kernels run on CUDA tensors, or anywhere with ``TRITON_INTERPRET=1`` (Triton's CPU
interpreter, which the tests use to check the kernels on machines without a GPU).
"""

from __future__ import annotations

import os
from typing import Any

from streamrt._features import triton_importable
from streamrt.errors import ConfigError

__all__ = ["use_triton"]


def use_triton(device: Any, requested: bool | None) -> bool:
    """Resolve a ``use_triton`` argument for tensors on ``device`` (a ``torch.device``).

    Raises:
        ConfigError: Triton was requested but cannot run here.
    """
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    possible = triton_importable() and (getattr(device, "type", str(device)) == "cuda" or interpreted)
    if requested and not possible:
        raise ConfigError(
            f"use_triton=True but Triton cannot run on {device}",
            hint="install triton (it comes with CUDA builds of torch) and use a CUDA device, or set TRITON_INTERPRET=1",
        )
    return possible if requested is None else requested
