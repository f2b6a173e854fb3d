"""Convolution, pooling, MatMul/Gemm/Einsum.

Torch's native conv/pool kernels take symmetric padding only, so asymmetric ``pads`` and
``auto_pad=SAME_*`` are applied with an explicit ``F.pad`` first; the common symmetric case calls
the native op directly (that is what Inductor lowers best). Pooling cases torch cannot express
(dilated average pooling, integer max pooling, Lp pooling) go through a general windowed path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .common import input_or, tensor, unsupported
from .registry import Node, OpSpec, RunContext
from .values import Value, is_float_dtype

__all__ = ["CONVERTERS", "ceil_extension", "pool_geometry", "run_conv"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]

_CONV: dict[int, Callable[..., torch.Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T: dict[int, Callable[..., torch.Tensor]] = {
    1: F.conv_transpose1d,
    2: F.conv_transpose2d,
    3: F.conv_transpose3d,
}
_MAX_POOL: dict[int, Callable[..., Any]] = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL: dict[int, Callable[..., torch.Tensor]] = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _is_int(v: Any) -> bool:
    return isinstance(v, int)


def _max0(v: Any) -> Any:
    return max(v, 0) if _is_int(v) else torch.sym_max(v, 0)


def _same_total(size: Any, k: int, s: int) -> Any:
    """Total SAME padding, ``max((ceil(size / s) - 1) * s + k - size, 0)``."""
    if k >= s:
        # Never negative then; written without max() so that a symbolic size gives a simple
        # expression torch.export can reason about.
        return k - 1 - (size - 1) % s
    return _max0(((size + s - 1) // s - 1) * s + k - size)


def _same_pads(auto_pad: str, sizes: Sequence[Any], kernel: Sequence[int], strides: Sequence[int]) -> list[Any]:
    """``[begin_1.., end_1..]`` pads for auto_pad SAME_UPPER/SAME_LOWER (out = ceil(in / stride))."""
    begins, ends = [], []
    for size, k, s in zip(sizes, kernel, strides, strict=True):
        total = _same_total(size, k, s)
        small = total // 2
        big = total - small
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _geometry(node: Node, x: torch.Tensor, kernel: Sequence[int]) -> tuple[list[int], list[int], list[Any]]:
    """Strides, dilations and resolved ``[begins.., ends..]`` pads of a conv/pool node."""
    n = len(kernel)
    strides = [int(s) for s in node.attr("strides", [1] * n)]
    dilations = [int(d) for d in node.attr("dilations", [1] * n)]
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
        pads = _same_pads(auto_pad, x.shape[2:], effective, strides)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = [int(p) for p in node.attr("pads", [0] * (2 * n))]
    return strides, dilations, pads


def _symmetric(pads: Sequence[Any]) -> list[int] | None:
    n = len(pads) // 2
    if all(_is_int(p) for p in pads) and list(pads[:n]) == list(pads[n:]):
        return [int(p) for p in pads[:n]]
    return None


def _torch_pad(pads: Sequence[Any]) -> list[Any]:
    """ONNX ``[b1, b2, .., e1, e2, ..]`` -> F.pad's ``(b_last, e_last, ..., b1, e1)``."""
    n = len(pads) // 2
    out: list[Any] = []
    for i in reversed(range(n)):
        out += [pads[i], pads[i + n]]
    return out


def _conv(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, w = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    b = input_or(inputs, 2)
    return [run_conv(node, x, w, tensor(b, ctx) if b is not None else None)]


def run_conv(node: Node, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Convolution with the node's strides/dilations/group and ONNX padding rules."""
    kernel = list(w.shape[2:])
    strides, dilations, pads = _geometry(node, x, kernel)
    group = int(node.attr("group", 1))
    conv = _CONV[len(kernel)]
    same = _symmetric(pads)
    if same is None:
        x = F.pad(x, _torch_pad(pads))
        same = [0] * len(kernel)
    return conv(x, w, bias, strides, same, dilations, group)


def _conv_transpose(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, w = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    b = input_or(inputs, 2)
    bias = tensor(b, ctx) if b is not None else None
    n = w.dim() - 2
    kernel = list(w.shape[2:])
    strides = [int(s) for s in node.attr("strides", [1] * n)]
    dilations = [int(d) for d in node.attr("dilations", [1] * n)]
    out_pad = [int(p) for p in node.attr("output_padding", [0] * n)]
    group = int(node.attr("group", 1))
    sizes = list(x.shape[2:])
    full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, sizes, kernel, dilations, strict=True)]
    output_shape = node.attr("output_shape")
    auto_pad = node.attr("auto_pad", "NOTSET")
    if node.attr("pads") is not None and output_shape is None:
        pads: list[Any] = [int(p) for p in node.attr("pads")]
    elif output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = (
            [int(o) for o in output_shape[-n:]]
            if output_shape is not None
            else [i * s for i, s in zip(sizes, strides, strict=True)]
        )
        total = [f + op - t for f, op, t in zip(full, out_pad, target, strict=True)]
        if auto_pad == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    else:
        pads = [0] * (2 * n)
    same = _symmetric(pads)
    if same is not None and all(op < max(s, d) for op, s, d in zip(out_pad, strides, dilations, strict=True)):
        return [_CONV_T[n](x, w, bias, strides, same, out_pad, group, dilations)]
    y = _CONV_T[n](x, w, None, strides, 0, 0, group, dilations)
    # Crop the begin pads; crop (or zero-extend by output_padding) at the end.
    ends = [op - pads[i + n] for i, op in enumerate(out_pad)]
    y = F.pad(y, _torch_pad([-p for p in pads[:n]] + ends))
    if bias is not None:
        y = y + bias.reshape(1, -1, *([1] * n))
    return [y]


def _min(a: Any, b: Any) -> Any:
    return min(a, b) if _is_int(a) and _is_int(b) else torch.sym_min(a, b)


def pool_geometry(
    sizes: Sequence[Any],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[Any],
    ceil_mode: bool,
) -> list[Any]:
    """Output sizes of a pooling window sweep (torch's and ONNX's ceil_mode rule).

    Written without Python branches on sizes, so a symbolic size gives an expression instead of
    a guard that would bake the example size's choice into an exported program.
    """
    n = len(kernel)
    out = []
    for i in range(n):
        span = sizes[i] + pads[i] + pads[i + n] - ((kernel[i] - 1) * dilations[i] + 1)
        if not ceil_mode:
            out.append(span // strides[i] + 1)
            continue
        o = (span + strides[i] - 1) // strides[i] + 1
        if not _last_window_always_starts_inside(kernel[i], strides[i], dilations[i], pads[i + n]):
            # A window must start inside the input or the begin padding:
            # (o - 1) * stride < size + begin  <=>  o <= (size + begin - 1) // stride + 1.
            o = _min(o, (sizes[i] + pads[i] - 1) // strides[i] + 1)
        out.append(o)
    return out


def _last_window_always_starts_inside(kernel: int, stride: int, dilation: int, end_pad: Any) -> bool:
    """Whether ONNX's "last window starts inside" rule can never cut a ceil-mode window.

    The last ceil-mode window starts before ``span + stride`` = ``size + begin + end - kernel +
    stride``; when ``end + stride <= kernel`` that is inside ``size + begin`` for every size.
    """
    return _is_int(end_pad) and end_pad + stride <= (kernel - 1) * dilation + 1


def ceil_extension(
    sizes: Sequence[Any],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[Any],
) -> list[Any]:
    """Extra end padding after which floor-mode pooling gives the ceil-mode output size.

    This is how ceil-mode pooling is lowered: explicit padding plus floor-mode pooling. Torch's
    own ``ceil_mode`` chooses the output size with a branch that AOTInductor decides once, at the
    example size: a dynamic plan then gave floor-mode sizes at odd inputs (13x13 -> 6x6 instead
    of 7x7). In the usual case (``end_pad + stride <= kernel``) the extension is
    ``(-span) mod stride``, a plain expression of the size.
    """
    n = len(kernel)
    extra: list[Any] = []
    out = pool_geometry(sizes, kernel, strides, dilations, pads, ceil_mode=True)
    for i in range(n):
        effective = (kernel[i] - 1) * dilations[i] + 1
        span = sizes[i] + pads[i] + pads[i + n] - effective
        if _last_window_always_starts_inside(kernel[i], strides[i], dilations[i], pads[i + n]):
            extra.append(strides[i] - 1 - (span + strides[i] - 1) % strides[i])
        else:
            extra.append(_max0((out[i] - 1) * strides[i] + effective - (sizes[i] + pads[i] + pads[i + n])))
    return extra


def _is_zero(values: Sequence[Any]) -> bool:
    return all(_is_int(v) and v == 0 for v in values)


def _windows(
    x: torch.Tensor, node: Node, kernel: Sequence[int], fill: float, ceil_mode: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """All pooling windows as trailing dims, plus a mask of cells inside input + explicit pads."""
    n = len(kernel)
    strides, dilations, pads = _geometry(node, x, kernel)
    sizes = list(x.shape[2:])
    extra = ceil_extension(sizes, kernel, strides, dilations, pads) if ceil_mode else [0] * n
    ends = [pads[i + n] + extra[i] for i in range(n)]
    padded = F.pad(x, _torch_pad(list(pads[:n]) + ends), value=fill)
    # 1 = real input, 2 = explicit padding, 0 = ceil-mode extension.
    mark = torch.ones((1, 1, *sizes), dtype=torch.int8, device=x.device)
    mark = F.pad(mark, _torch_pad(list(pads)), value=2)
    mark = F.pad(mark, _torch_pad([0] * n + extra), value=0)
    for i in range(n):
        span = (kernel[i] - 1) * dilations[i] + 1
        padded = padded.unfold(2 + i, span, strides[i])
        mark = mark.unfold(2 + i, span, strides[i])
    for i in range(n):
        sl = (Ellipsis, slice(None, None, dilations[i])) + (slice(None),) * (n - 1 - i)
        padded = padded[sl]
        mark = mark[sl]
    return padded, mark


def _ceil_pads(
    x: torch.Tensor, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], pads: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """``[begins.., ends..]`` pads with the ceil-mode extension added to the ends, and the extension."""
    n = len(kernel)
    extra = ceil_extension(list(x.shape[2:]), kernel, strides, dilations, pads)
    return [*pads[:n], *(pads[i + n] + extra[i] for i in range(n))], extra


def _max_pool(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    kernel = [int(k) for k in node.attr("kernel_shape")]
    n = len(kernel)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    strides, dilations, pads = _geometry(node, x, kernel)
    want_indices = len(node.outputs) > 1 and bool(node.outputs[1])
    storage_order = int(node.attr("storage_order", 0))
    if not is_float_dtype(x.dtype):
        if want_indices:
            raise unsupported(node, "the Indices output needs a floating-point input")
        low = torch.iinfo(x.dtype).min
        windows, _ = _windows(x, node, kernel, low, ceil_mode)
        return [windows.amax(dim=tuple(range(-n, 0)))]
    if ceil_mode:
        # Explicit -inf padding then floor mode: see ceil_extension for why.
        pads, _ = _ceil_pads(x, kernel, strides, dilations, pads)
    same = _symmetric(pads)
    if same is not None and all(p <= k // 2 for p, k in zip(same, kernel, strict=True)):
        if not want_indices:
            return [_MAX_POOL[n](x, kernel, strides, same, dilations)]
        y, idx = _MAX_POOL[n](x, kernel, strides, same, dilations, return_indices=True)
        return [y, _global_indices(x, idx, storage_order)]
    padded = F.pad(x, _torch_pad(pads), value=float("-inf"))
    if not want_indices:
        return [_MAX_POOL[n](padded, kernel, strides, 0, dilations)]
    y, idx = _MAX_POOL[n](padded, kernel, strides, 0, dilations, return_indices=True)
    idx = _unpad_indices(idx, list(padded.shape[2:]), list(pads[:n]), list(x.shape[2:]))
    return [y, _global_indices(x, idx, storage_order)]


def _unpad_indices(
    idx: torch.Tensor, padded_sizes: Sequence[Any], begins: Sequence[Any], sizes: Sequence[Any]
) -> torch.Tensor:
    """Per-plane indices into a padded plane -> per-plane indices into the unpadded plane."""
    coords = []
    rest = idx
    for size in reversed(padded_sizes):
        coords.append(rest % size)
        rest = rest // size
    out = torch.zeros_like(idx)
    for coord, begin, size in zip(coords[::-1], begins, sizes, strict=True):
        out = out * size + (coord - begin)
    return out


def _global_indices(x: torch.Tensor, idx: torch.Tensor, storage_order: int) -> torch.Tensor:
    """Per-plane torch pooling indices -> ONNX indices into the whole flattened input."""
    spatial = list(x.shape[2:])
    plane = 1
    for s in spatial:
        plane = plane * s
    if storage_order:
        # Column-major: reverse the order of the spatial coordinates.
        coords = []
        rest = idx
        for s in reversed(spatial):
            coords.append(rest % s)
            rest = rest // s
        col = torch.zeros_like(idx)
        stride: Any = 1
        for coord, size in zip(coords[::-1], spatial, strict=True):
            col = col + coord * stride
            stride = stride * size
        idx = col
    n, c = x.shape[0], x.shape[1]
    base = torch.arange(n * c, device=x.device, dtype=torch.int64).reshape(n, c, *([1] * len(spatial))) * plane
    return idx + base


def _avg_pool(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    kernel = [int(k) for k in node.attr("kernel_shape")]
    n = len(kernel)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    include_pad = bool(node.attr("count_include_pad", 0))
    strides, dilations, pads = _geometry(node, x, kernel)
    if all(d == 1 for d in dilations) and ceil_mode:
        return [_ceil_avg_pool(x, kernel, strides, pads, include_pad)]
    same = _symmetric(pads)
    if (
        same is not None
        and all(d == 1 for d in dilations)
        and all(p <= k // 2 for p, k in zip(same, kernel, strict=True))
    ):
        return [_AVG_POOL[n](x, kernel, strides, same, False, include_pad)]
    windows, mark = _windows(x, node, kernel, 0.0, ceil_mode)
    dims = tuple(range(-n, 0))
    counted = (mark == 1) | (mark == 2) if include_pad else mark == 1
    return [windows.sum(dim=dims) / counted.sum(dim=dims).to(x.dtype)]


def _ceil_avg_pool(
    x: torch.Tensor, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[Any], include_pad: bool
) -> torch.Tensor:
    """Ceil-mode average pooling as zero padding + floor-mode pooling, divided by the window counts.

    ONNX (and ONNX Runtime, and torch) count explicit padding when ``count_include_pad`` is set
    but never the ceil-mode extension past it, so the divisor comes from pooling a mask that
    is 1 on the input (and on explicit pads when counted) and 0 on the extension.
    """
    n = len(kernel)
    full, extra = _ceil_pads(x, kernel, strides, [1] * n, pads)
    pool = _AVG_POOL[n]
    if _is_zero(extra) and (include_pad or _is_zero(pads)):
        return pool(F.pad(x, _torch_pad(full)), kernel, strides, 0, False, True)
    sums = pool(F.pad(x, _torch_pad(full)), kernel, strides, 0, False, True)
    mask = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    mask = F.pad(mask, _torch_pad(list(pads)), value=1.0 if include_pad else 0.0)
    mask = F.pad(mask, _torch_pad([0] * n + list(extra)), value=0.0)
    return sums / pool(mask, kernel, strides, 0, False, True)


def _lp_pool(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    kernel = [int(k) for k in node.attr("kernel_shape")]
    p = float(node.attr("p", 2))
    windows, _ = _windows(x, node, kernel, 0.0, bool(node.attr("ceil_mode", 0)))
    dims = tuple(range(-len(kernel), 0))
    return [windows.abs().pow(p).sum(dim=dims).pow(1.0 / p)]


def _global_pool(
    reduce: Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor],
) -> Callable[[Node, Inputs, RunContext], Outputs]:
    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        x = tensor(inputs[0], ctx)
        return [reduce(x, tuple(range(2, x.dim())))]

    return convert


def _global_lp(x: torch.Tensor, dims: tuple[int, ...], p: float = 2.0) -> torch.Tensor:
    return x.abs().pow(p).sum(dim=dims, keepdim=True).pow(1.0 / p)


def _global_lp_pool(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    return [_global_lp(x, tuple(range(2, x.dim())), float(node.attr("p", 2)))]


def _matmul(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    return [torch.matmul(tensor(inputs[0], ctx), tensor(inputs[1], ctx))]


def _gemm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    a, b = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    c_value = input_or(inputs, 2)
    c = tensor(c_value, ctx) if c_value is not None else None
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if node.attr("transA", 0):
        a = a.t()
    if node.attr("transB", 0):
        if alpha == 1.0 and beta == 1.0 and (c is None or c.dim() == 1):
            return [F.linear(a, b, c)]
        b = b.t()
    y = a @ b
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return [y]


def _einsum(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    equation = str(node.attr("equation")).replace(" ", "")
    return [torch.einsum(equation, *[tensor(v, ctx) for v in inputs if v is not None])]


_TABLE: dict[str, tuple[Callable[[Node, Inputs, RunContext], Outputs], int]] = {
    "Conv": (_conv, 22),
    "ConvTranspose": (_conv_transpose, 22),
    "MaxPool": (_max_pool, 22),
    "AveragePool": (_avg_pool, 22),
    "LpPool": (_lp_pool, 22),
    "GlobalAveragePool": (_global_pool(lambda x, d: x.mean(dim=d, keepdim=True)), 22),
    "GlobalMaxPool": (_global_pool(lambda x, d: x.amax(dim=d, keepdim=True)), 22),
    "GlobalLpPool": (_global_lp_pool, 22),
    "MatMul": (_matmul, 13),
    "Gemm": (_gemm, 13),
    "Einsum": (_einsum, 28),
}

CONVERTERS: dict[str, OpSpec] = {op: OpSpec(fn, version) for op, (fn, version) in _TABLE.items()}
