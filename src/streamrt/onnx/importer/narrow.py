"""Conversions to the narrow ONNX element types, with ONNX's rounding and overflow rules.

torch has no dtype for the sub-byte ONNX types, so they travel in a wider *container* dtype that
holds exactly the same values: ``INT4``/``INT2`` in ``int8``, ``UINT4``/``UINT2`` in ``uint8``,
``FLOAT4E2M1`` in ``float32``. Graph inputs and outputs of those types use the container dtype.
torch's own casts to float8 also differ from ONNX (e4m3fn always saturates, others never do), so
every cast to a narrow type goes through :func:`cast_to`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["QUANT_RANGES", "cast_to", "has_special_cast", "round_fp4"]

# ONNX TensorProto element types
_UINT8, _INT8, _UINT16, _INT16 = 2, 3, 4, 5
_FP8 = {17: torch.float8_e4m3fn, 18: torch.float8_e4m3fnuz, 19: torch.float8_e5m2, 20: torch.float8_e5m2fnuz}
_UINT4, _INT4, _FP4, _E8M0, _UINT2, _INT2 = 21, 22, 23, 24, 25, 26

#: Integer quantisation ranges by ONNX element type (QuantizeLinear saturates to these).
QUANT_RANGES: dict[int, tuple[int, int]] = {
    _UINT8: (0, 255),
    _INT8: (-128, 127),
    _UINT16: (0, 65535),
    _INT16: (-32768, 32767),
    _UINT4: (0, 15),
    _INT4: (-8, 7),
    _UINT2: (0, 3),
    _INT2: (-2, 1),
}
_CONTAINER = {_UINT4: torch.uint8, _INT4: torch.int8, _UINT2: torch.uint8, _INT2: torch.int8}

# Above this magnitude a non-saturating cast to float8 e4m3fn is NaN (halfway to the missing 480).
_E4M3FN_OVERFLOW = 464.0
_FP4_MAX = 6.0


def _to_float8(x: torch.Tensor, onnx_type: int, saturate: bool, round_mode: str) -> torch.Tensor:
    dtype = _FP8[onnx_type]
    wide = x.to(torch.float32)
    if saturate:
        limit = torch.finfo(dtype).max
        return torch.clamp(wide, -limit, limit).to(dtype)
    if dtype == torch.float8_e4m3fn:
        wide = torch.where(torch.abs(wide) > _E4M3FN_OVERFLOW, torch.full((), float("nan"), device=x.device), wide)
    return wide.to(dtype)


def _wrap_int(x: torch.Tensor, onnx_type: int, saturate: bool, round_mode: str) -> torch.Tensor:
    """Cast to a sub-byte integer: truncate, then wrap modulo 2**bits (ONNX Cast semantics)."""
    lo, hi = QUANT_RANGES[onnx_type]
    span = hi - lo + 1
    v = x.to(torch.int64)
    return (torch.remainder(v - lo, span) + lo).to(_CONTAINER[onnx_type])


def round_fp4(x: torch.Tensor) -> torch.Tensor:
    """Round to the FLOAT4E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even, saturating at 6."""
    a = torch.abs(x.to(torch.float32))
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    r = torch.clamp(torch.round(a / step) * step, max=_FP4_MAX)
    r = torch.copysign(r, x.to(torch.float32))
    # Like ml_dtypes (the ONNX reference), NaN has no encoding and becomes -0.0.
    return torch.where(torch.isnan(x.to(torch.float32)), torch.full((), -0.0, device=x.device), r)


def _to_fp4(x: torch.Tensor, onnx_type: int, saturate: bool, round_mode: str) -> torch.Tensor:
    return round_fp4(x)


def _to_e8m0(x: torch.Tensor, onnx_type: int, saturate: bool, round_mode: str) -> torch.Tensor:
    """Cast to FLOAT8E8M0 (a bare exponent) from float32 bits, as ``onnx.numpy_helper.to_float8e8m0``."""
    bits = x.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent = (bits >> 23) & 0xFF
    special = exponent == 0xFF
    if round_mode == "up":
        bump = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":
        g, r, s = (bits & 0x400000) > 0, (bits & 0x200000) > 0, (bits & 0x1FFFFF) > 0
        bump = g & (r | s | (exponent > 0))
    else:
        bump = torch.zeros_like(special)
    if saturate:
        bump = bump & (exponent != 0xFE)
    exponent = torch.where(special, 0xFF, exponent + bump.to(torch.int64)) & 0xFF
    return exponent.to(torch.uint8).view(torch.float8_e8m0fnu)


_CASTS: dict[int, Callable[[torch.Tensor, int, bool, str], torch.Tensor]] = {
    **dict.fromkeys(_FP8, _to_float8),
    **dict.fromkeys(_CONTAINER, _wrap_int),
    _FP4: _to_fp4,
    _E8M0: _to_e8m0,
}


def has_special_cast(onnx_type: int) -> bool:
    """Whether casting to ``onnx_type`` needs :func:`cast_to` rather than ``Tensor.to``."""
    return onnx_type in _CASTS


def cast_to(x: torch.Tensor, onnx_type: int, *, saturate: bool = True, round_mode: str = "up") -> torch.Tensor:
    """Cast ``x`` to a narrow ONNX type (see :func:`has_special_cast`), in its container dtype."""
    return _CASTS[onnx_type](x, onnx_type, saturate, round_mode)
