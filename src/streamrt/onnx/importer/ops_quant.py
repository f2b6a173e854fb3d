"""Quantisation operators: Q/DQ (per tensor, per axis, blocked) and the integer ops.

``QuantizeLinear``/``DequantizeLinear`` are what ``onnxruntime.quantization.quantize_static``
writes in QDQ format (uint8/int8 activations per tensor, int8 weights per channel). They become
plain elementwise torch ops (divide, round half to even, add zero point, clamp; or subtract and
multiply), which Inductor fuses into the neighbouring kernels; no int8 kernels are involved.
Integer matmul/conv run in float64, which is exact for any realistic reduction length and works
on devices without integer GEMM kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .common import input_or, norm_axis, tensor
from .narrow import QUANT_RANGES, cast_to, has_special_cast
from .ops_nn import run_conv
from .registry import Node, OpSpec, RunContext
from .values import Value, onnx_to_torch_dtype, torch_to_onnx_type

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]

_FLOAT8 = frozenset({torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz})
_UINT8, _FP4 = 2, 23
_RANGES: dict[torch.dtype, tuple[int, int]] = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
}


def _broadcast(param: torch.Tensor, x: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """Shape a scale/zero point for broadcasting against ``x`` (per tensor, per axis, blocked)."""
    if param.dim() == 0 or (param.numel() == 1 and block_size == 0):
        return param.reshape(())
    axis = norm_axis(axis, x.dim())
    if block_size > 0:
        expanded = param.repeat_interleave(block_size, dim=axis)
        return expanded.narrow(axis, 0, x.shape[axis])
    shape = [1] * x.dim()
    shape[axis] = -1
    return param.reshape(shape)


def _quantize(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    zp_value = input_or(inputs, 2)
    zp = tensor(zp_value, ctx) if zp_value is not None else None
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    # The ONNX type decides the range: an int8 tensor may be an INT4 container.
    out_type = node.input_type(2) if zp is not None else int(node.attr("output_dtype") or _UINT8)
    if zp is not None and not out_type:
        out_type = torch_to_onnx_type(zp.dtype)
    precision = node.attr("precision")
    compute = (
        onnx_to_torch_dtype(int(precision)) if precision else (x.dtype if x.dtype == torch.float64 else torch.float32)
    )
    scaled = x.to(compute) / _broadcast(scale, x, axis, block).to(compute)
    if out_type not in QUANT_RANGES:
        if zp is not None and out_type == _FP4:
            scaled = scaled + _broadcast(zp, x, axis, block).to(scaled.dtype)
        return [cast_to(scaled, out_type, saturate=bool(node.attr("saturate", 1)))]
    lo, hi = QUANT_RANGES[out_type]
    q = torch.round(scaled)  # round half to even, as ONNX requires
    if zp is not None:
        q = q + _broadcast(zp, x, axis, block).to(q.dtype)
    return [torch.clamp(q, lo, hi).to(onnx_to_torch_dtype(out_type))]


def _dequantize(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    zp_value = input_or(inputs, 2)
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    out_dtype = onnx_to_torch_dtype(int(node.attr("output_dtype"))) if node.attr("output_dtype") else scale.dtype
    dx = x.to(torch.float32)
    if zp_value is not None and x.dtype not in _FLOAT8:
        dx = dx - _broadcast(tensor(zp_value, ctx), x, axis, block).to(torch.float32)
    return [(dx * _broadcast(scale, x, axis, block).to(torch.float32)).to(out_dtype)]


def _check_quant(node: Node) -> str | None:
    value = node.attr("output_dtype")
    if value:
        try:
            onnx_to_torch_dtype(int(value))
        except Exception as exc:
            return str(exc)
        if node.op_type == "QuantizeLinear" and int(value) not in QUANT_RANGES and not has_special_cast(int(value)):
            return f"quantized element type {value} is not supported"
    return None


def _dynamic_quantize(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx).to(torch.float32)
    lo = torch.clamp(x.min(), max=0.0)
    hi = torch.clamp(x.max(), min=0.0)
    scale = (hi - lo) / 255.0
    zp = torch.clamp(torch.round(-lo / scale), 0, 255)
    y = torch.clamp(torch.round(x / scale) + zp, 0, 255).to(torch.uint8)
    return [y, scale, zp.to(torch.uint8)]


def _centered(value: torch.Tensor, zp: Value | None, ctx: RunContext, row_axis: int | None = None) -> torch.Tensor:
    out = value.to(torch.float64)
    if zp is None:
        return out
    z = tensor(zp, ctx).to(torch.float64)
    if row_axis is not None and z.dim() == 1 and z.numel() > 1:
        shape = [1] * value.dim()
        shape[row_axis] = -1
        z = z.reshape(shape)
    return out - z


def _matmul_integer(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    a, b = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    # A's zero point may be per row (M elements), B's per column (N elements).
    a_c = _centered(a, input_or(inputs, 2), ctx, row_axis=a.dim() - 2 if a.dim() >= 2 else None)
    b_c = _centered(b, input_or(inputs, 3), ctx)
    return [torch.matmul(a_c, b_c).to(torch.int32)]


def _requantize(
    acc: torch.Tensor, multiplier: torch.Tensor, zp: Value | None, like: torch.Tensor, ctx: RunContext
) -> torch.Tensor:
    out_dtype = tensor(zp, ctx).dtype if zp is not None else like.dtype
    y = acc * multiplier
    if zp is not None:
        y = y + tensor(zp, ctx).to(y.dtype)
    lo, hi = _RANGES[out_dtype]
    return torch.clamp(torch.round(y), lo, hi).to(out_dtype)


def _qlinear_matmul(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs[:8]
    ta, tb = tensor(a, ctx), tensor(b, ctx)
    acc = torch.matmul(_centered(ta, a_zp, ctx), _centered(tb, b_zp, ctx))
    multiplier = tensor(a_scale, ctx).double() * tensor(b_scale, ctx).double() / tensor(y_scale, ctx).double()
    return [_requantize(acc, multiplier, y_zp, ta, ctx)]


def _conv_integer(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, w = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    xc = _centered(x, input_or(inputs, 2), ctx)
    wc = _centered(w, input_or(inputs, 3), ctx, row_axis=0)
    return [run_conv(node, xc, wc, None).to(torch.int32)]


def _qlinear_conv(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
    bias_value = input_or(inputs, 8)
    tx, tw = tensor(x, ctx), tensor(w, ctx)
    bias = tensor(bias_value, ctx).double() if bias_value is not None else None
    acc = run_conv(node, _centered(tx, x_zp, ctx), _centered(tw, w_zp, ctx, row_axis=0), bias)
    ws = tensor(w_scale, ctx).double()
    if ws.numel() > 1:
        ws = ws.reshape(1, -1, *([1] * (tx.dim() - 2)))
    multiplier = tensor(x_scale, ctx).double() * ws / tensor(y_scale, ctx).double()
    return [_requantize(acc, multiplier, y_zp, tx, ctx)]


_TABLE: dict[str, tuple[Callable[[Node, Inputs, RunContext], Outputs], int, Callable[[Node], str | None] | None]] = {
    "QuantizeLinear": (_quantize, 28, _check_quant),
    "DequantizeLinear": (_dequantize, 28, _check_quant),
    "DynamicQuantizeLinear": (_dynamic_quantize, 11, None),
    "MatMulInteger": (_matmul_integer, 10, None),
    "QLinearMatMul": (_qlinear_matmul, 21, None),
    "ConvInteger": (_conv_integer, 10, None),
    "QLinearConv": (_qlinear_conv, 10, None),
}

CONVERTERS: dict[str, OpSpec] = {op: OpSpec(fn, version, check) for op, (fn, version, check) in _TABLE.items()}
