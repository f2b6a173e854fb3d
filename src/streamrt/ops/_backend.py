"""Whether the device ops use Triton kernels or their plain-torch versions.

Triton kernels run on CUDA tensors, or anywhere with ``TRITON_INTERPRET=1`` (Triton's CPU
interpreter, which the tests use to check the kernels on machines without a GPU).
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from typing import Any

from streamrt.errors import ConfigError

__all__ = ["triton_importable", "use_triton"]


@cache
def triton_importable() -> bool:
    """True when ``import triton`` would work."""
    return importlib.util.find_spec("triton") is not None


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
