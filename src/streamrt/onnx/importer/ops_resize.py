"""``Resize`` with the full ONNX semantics, and a fast path to ``F.interpolate``.

The general path is separable: for every resized axis it computes, from the output index, the
source coordinate (``coordinate_transformation_mode``), the neighbour indices (edge-clamped) and
their weights (nearest rounding mode, linear, cubic with ``cubic_coeff_a``, antialias,
``exclude_outside``), then gathers and sums. It mirrors ``onnx.reference``'s Resize. Index math
uses ``torch.arange`` over the (possibly symbolic) output size, so it exports with dynamic H/W.

Where ``F.interpolate`` computes exactly the same thing (the usual YOLO ``nearest``/``asymmetric``
/``floor`` 2x upsample, ``linear`` with ``half_pixel`` or ``align_corners``, ``cubic`` with
``half_pixel`` and a=-0.75), it is used instead: Inductor lowers it to one fused kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .common import input_or, norm_axis, tensor
from .registry import Node, OpSpec, RunContext
from .values import ShapeValue, Value, is_float_dtype, static_floats, static_ints

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]

_INTERP_MODE = {"linear": {3: "linear", 4: "bilinear", 5: "trilinear"}, "cubic": {4: "bicubic"}}


@dataclass(frozen=True)
class _Attrs:
    mode: str
    coord: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    extrapolation: float
    antialias: bool


def _attrs(node: Node) -> _Attrs:
    return _Attrs(
        mode=str(node.attr("mode", "nearest")),
        coord=str(node.attr("coordinate_transformation_mode", "half_pixel")),
        nearest=str(node.attr("nearest_mode", "round_prefer_floor")),
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        extrapolation=float(node.attr("extrapolation_value", 0.0)),
        antialias=bool(node.attr("antialias", 0)),
    )


def _present(value: Value | None) -> bool:
    return (
        value is not None
        and (not isinstance(value, ShapeValue) or len(value.items) > 0)
        and (not isinstance(value, torch.Tensor) or value.numel() > 0)
    )


def _floor_size(size: Any, scale: float) -> Any:
    if scale == 1.0:
        return size
    if isinstance(size, int):
        return int(size * scale)
    if float(scale).is_integer():
        return size * int(scale)
    return math.floor(torch.sym_float(size) * scale)


def _plan(node: Node, x: torch.Tensor, inputs: Inputs) -> tuple[list[Any], list[Any], bool]:
    """Per-axis scales and output sizes, and whether the scales were given (not derived)."""
    rank = x.dim()
    axes = [norm_axis(int(a), rank) for a in node.attr("axes", list(range(rank)))]
    sizes_in = list(x.shape)
    scales_v, sizes_v = input_or(inputs, 2), input_or(inputs, 3)
    scales: list[Any] = [1.0] * rank
    out: list[Any] = list(sizes_in)
    if _present(scales_v):
        for a, s in zip(axes, static_floats(scales_v), strict=True):  # type: ignore[arg-type]
            scales[a] = s
            out[a] = _floor_size(sizes_in[a], s)
        return scales, out, True
    if not _present(sizes_v):
        raise ValueError(f"Resize node '{node.name}' has neither scales nor sizes")
    for a, s in zip(axes, static_ints(sizes_v), strict=True):  # type: ignore[arg-type]
        out[a] = s
        scales[a] = (
            s / sizes_in[a] if isinstance(s, int) and isinstance(sizes_in[a], int) else torch.sym_float(s) / sizes_in[a]
        )
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        picked = [scales[a] for a in axes]
        scale = min(picked) if policy == "not_larger" else max(picked)
        for a in axes:
            scales[a] = scale
            out[a] = int(scale * sizes_in[a] + 0.5)
    return scales, out, False


def _same(a: Any, b: Any) -> bool:
    """Sizes known equal while tracing, without adding a guard on symbolic sizes."""
    return bool(statically_known_true(a == b))


def _pow2(scale: Any) -> bool:
    return isinstance(scale, float) and scale >= 1 and scale.is_integer() and (int(scale) & (int(scale) - 1)) == 0


def _fast_path(x: torch.Tensor, attrs: _Attrs, scales: list[Any], out: list[Any], given: bool) -> torch.Tensor | None:
    rank = x.dim()
    if rank < 3 or attrs.antialias or not all(_same(o, s) for o, s in zip(out[:2], x.shape[:2], strict=True)):
        return None
    if given and any(s != 1.0 for s in scales[:2]):
        return None
    spatial_scales, spatial_out = scales[2:], out[2:]
    kwargs: dict[str, Any] = (
        {"scale_factor": [float(s) for s in spatial_scales], "recompute_scale_factor": False}
        if given and all(isinstance(s, float) for s in spatial_scales)
        else {"size": spatial_out}
    )
    if attrs.mode == "nearest":
        exact = all(_pow2(s) for s in spatial_scales)
        if exact and attrs.coord == "asymmetric" and attrs.nearest == "floor" and is_float_dtype(x.dtype):
            return F.interpolate(x, mode="nearest", **kwargs)
        if exact and attrs.coord == "half_pixel" and attrs.nearest == "round_prefer_ceil" and is_float_dtype(x.dtype):
            return F.interpolate(x, mode="nearest-exact", **kwargs)
        return None
    mode = _INTERP_MODE.get(attrs.mode, {}).get(rank)
    if mode is None or not is_float_dtype(x.dtype) or (x.dtype == torch.float64 and mode == "bicubic"):
        return None
    if attrs.mode == "cubic" and (attrs.cubic_a != -0.75 or attrs.exclude_outside):
        return None
    if attrs.coord == "half_pixel":
        return F.interpolate(x, mode=mode, align_corners=False, **kwargs)
    if attrs.coord == "align_corners" and not given:
        return F.interpolate(x, mode=mode, align_corners=True, **kwargs)
    return None


def _source_coords(
    coord: str, y: torch.Tensor, scale: Any, size: Any, out_size: Any, roi: tuple[float, float] | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    width = scale * size  # ONNX uses scale * input size here, not the rounded output size
    if coord == "align_corners":
        return (y * 0 if width == 1 else y * (size - 1) / (width - 1)), None
    if coord == "asymmetric":
        return y / scale, None
    if coord == "tf_half_pixel_for_nn":  # opset 11 only
        return (y + 0.5) / scale, None
    if coord == "pytorch_half_pixel":
        return (y * 0 - 0.5 if width == 1 else (y + 0.5) / scale - 0.5), None
    if coord == "half_pixel_symmetric":
        offset = size / 2 * (1 - out_size / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if coord == "tf_crop_and_resize":
        assert roi is not None
        lo, hi = roi
        x = y * 0 + (hi - lo) * (size - 1) / 2 if width == 1 else y * (hi - lo) * (size - 1) / (width - 1)
        x = x + lo * (size - 1)
        return x, (x < 0) | (x > size - 1)
    return (y + 0.5) / scale - 0.5, None


# nearest_mode -> source index from the source coordinate (exact integers map to themselves)
_NEAREST: dict[str, Any] = {
    "round_prefer_floor": lambda x: torch.where(x - torch.floor(x) <= 0.5, torch.floor(x), torch.floor(x) + 1),
    "round_prefer_ceil": lambda x: torch.where(x - torch.floor(x) < 0.5, torch.floor(x), torch.floor(x) + 1),
    "floor": torch.floor,
    "ceil": torch.ceil,
}


def _nearest_index(x: torch.Tensor, rule: str) -> torch.Tensor:
    return _NEAREST[rule](x)


def _taps(attrs: _Attrs, scale: Any) -> tuple[int, int]:
    """(number of taps, offset of the first tap from ceil(x) - 1)."""
    support = 2 if attrs.mode == "cubic" else 1
    if attrs.antialias and not isinstance(scale, float):
        # The filter width depends on the scale, so it must be known while tracing.
        raise NotImplementedError("Resize with antialias needs a scale known at trace time (static sizes)")
    if attrs.antialias and scale < 1:
        first = math.floor(-support / scale) + 1
        return 2 - 2 * first, first
    return 2 * support, 1 - support


def _weights(attrs: _Attrs, ratio: torch.Tensor, offsets: torch.Tensor, scale: Any) -> torch.Tensor:
    """Tap weights, ``ratio`` in (0, 1] is the distance from the tap at offset 0."""
    s = min(scale, 1.0) if attrs.antialias and isinstance(scale, float) else 1.0
    dist = torch.abs((offsets.unsqueeze(0) - ratio.unsqueeze(1)) * s)
    if attrs.mode == "linear":
        w = torch.clamp(1 - dist, min=0)
    else:
        a = attrs.cubic_a
        near = ((a + 2) * dist - (a + 3)) * dist * dist + 1
        far = ((a * dist - 5 * a) * dist + 8 * a) * dist - 4 * a
        w = torch.where(dist <= 1, near, torch.where(dist < 2, far, torch.zeros_like(dist)))
    return w / w.sum(dim=1, keepdim=True) if attrs.antialias else w


def _resize_axis(
    x: torch.Tensor, axis: int, attrs: _Attrs, scale: Any, out_size: Any, roi: tuple[float, float] | None
) -> torch.Tensor:
    size = x.shape[axis]
    y = torch.arange(out_size, dtype=torch.float64, device=x.device)
    src, outside = _source_coords(attrs.coord, y, scale, size, out_size, roi)
    if attrs.mode == "nearest":
        idx = _nearest_index(src, attrs.nearest).long().clamp(0, size - 1)
        result = x.index_select(axis, idx)
    else:
        count, first = _taps(attrs, scale)
        base = torch.ceil(src) - 1  # the tap left of src, or src - 1 when src is an integer
        ratio = src - base
        offsets = torch.arange(first, first + count, dtype=torch.float64, device=x.device)
        weights = _weights(attrs, ratio, offsets, scale)
        index = base.unsqueeze(1) + offsets.unsqueeze(0)
        if attrs.exclude_outside:
            weights = torch.where((index < 0) | (index > size - 1), torch.zeros_like(weights), weights)
            total = weights.sum(dim=1, keepdim=True)
            weights = weights / torch.where(total == 0, torch.ones_like(total), total)
        index = index.long().clamp(0, size - 1)
        gathered = x.index_select(axis, index.reshape(-1))
        gathered = gathered.reshape(*x.shape[:axis], out_size, count, *x.shape[axis + 1 :])
        w_shape = [1] * axis + [out_size, count] + [1] * (x.dim() - axis - 1)
        result = (gathered * weights.to(x.dtype).reshape(w_shape)).sum(dim=axis + 1)
    if outside is not None:
        mask_shape = [1] * axis + [out_size] + [1] * (x.dim() - axis - 1)
        fill = torch.full((), attrs.extrapolation, dtype=result.dtype, device=x.device)
        result = torch.where(outside.reshape(mask_shape), fill, result)
    return result


def _resize(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    attrs = _attrs(node)
    scales, out, given = _plan(node, x, inputs)
    fast = _fast_path(x, attrs, scales, out, given)
    if fast is not None:
        return [fast]
    rank = x.dim()
    rois: list[tuple[float, float] | None] = [None] * rank
    roi_v = input_or(inputs, 1)
    if attrs.coord == "tf_crop_and_resize" and _present(roi_v):
        roi = static_floats(roi_v)  # type: ignore[arg-type]
        axes = [norm_axis(int(a), rank) for a in node.attr("axes", list(range(rank)))]
        half = len(roi) // 2
        rois = [(0.0, 1.0)] * rank
        for i, a in enumerate(axes):
            rois[a] = (roi[i], roi[half + i])
    work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    for axis in range(rank):
        identity = isinstance(scales[axis], float) and scales[axis] == 1.0 and _same(out[axis], x.shape[axis])
        if identity and (rois[axis] is None or rois[axis] == (0.0, 1.0)):
            continue
        work = _resize_axis(work, axis, attrs, scales[axis], out[axis], rois[axis])
    if is_float_dtype(x.dtype):
        return [work if work.dtype == x.dtype else work.to(x.dtype)]
    info = torch.iinfo(x.dtype)
    return [torch.round(work).clamp(info.min, info.max).to(x.dtype)]


CONVERTERS: dict[str, OpSpec] = {"Resize": OpSpec(_resize, 19)}
