"""Buffer allocation helpers: torch imported on demand, dtypes mapped to torch's.

Buffers are torch tensors: one allocator and one type for pinned host memory, device memory and
what engines return. torch is imported lazily so that host streams work without it. The
event-gated pool that hands buffers out is :class:`streamrt.device.base.BufferPool`.
"""

from __future__ import annotations

from typing import Any

from streamrt._optional import require

__all__ = ["import_torch", "torch_dtype"]


def import_torch() -> Any:
    """Import torch or raise :class:`MissingDependencyError` naming the extra (many call sites here)."""
    return require("torch", extra="torch", purpose="device buffers")


def torch_dtype(dtype: Any) -> Any:
    """Map a torch dtype, a :class:`~streamrt.types.DType`, a NumPy dtype or a name to a torch dtype."""
    torch = import_torch()
    if isinstance(dtype, torch.dtype):
        return dtype
    from streamrt.types import DType

    return DType.from_any(dtype).torch
