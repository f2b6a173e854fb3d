"""Normalisation operators (batch, instance, layer, group, RMS, LRN, Lp, MVN).

Statistics of half-precision inputs are computed in float32 (ONNX's ``stash_type`` default),
then the result is cast back, which is what ONNX Runtime does as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .common import input_or, norm_axis, tensor
from .registry import Node, OpSpec, RunContext
from .values import Value

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]


def _channel_shape(x: torch.Tensor) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.dim() - 2)


def _batch_norm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale, bias, mean, var = (tensor(v, ctx) for v in inputs[:5])
    eps = float(node.attr("epsilon", 1e-5))
    if not node.attr("training_mode", 0):
        return [F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)]
    momentum = float(node.attr("momentum", 0.9))
    dims = [d for d in range(x.dim()) if d != 1]
    batch_mean = x.mean(dim=dims)
    batch_var = x.var(dim=dims, unbiased=False)
    shape = _channel_shape(x)
    y = (x - batch_mean.reshape(shape)) / torch.sqrt(batch_var.reshape(shape) + eps)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    return [y, running_mean, running_var]


def _instance_norm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale, bias = (tensor(v, ctx) for v in inputs[:3])
    return [F.instance_norm(x, weight=scale, bias=bias, eps=float(node.attr("epsilon", 1e-5)))]


def _stash(x: torch.Tensor, node: Node) -> torch.Tensor:
    if node.attr("stash_type", 1) == 1 and x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def _layer_norm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    b = input_or(inputs, 2)
    bias = tensor(b, ctx) if b is not None else None
    axis = norm_axis(node.attr("axis", -1), x.dim())
    eps = float(node.attr("epsilon", 1e-5))
    normalized = tuple(x.shape[axis:])
    wants_stats = len(node.outputs) > 1 and any(node.outputs[1:])
    exact = tuple(scale.shape) == normalized and (bias is None or tuple(bias.shape) == normalized)
    if not wants_stats and exact:
        return [F.layer_norm(x, normalized, scale, bias, eps)]
    xs = _stash(x, node)
    dims = tuple(range(axis, x.dim()))
    mean = xs.mean(dim=dims, keepdim=True)
    inv_std = torch.rsqrt((xs - mean).pow(2).mean(dim=dims, keepdim=True) + eps)
    y = ((xs - mean) * inv_std).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv_std]


def _group_norm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale, bias = (tensor(v, ctx) for v in inputs[:3])
    groups = int(node.attr("num_groups"))
    eps = float(node.attr("epsilon", 1e-5))
    channels = x.shape[1]
    if node.opset < 21:
        # Opset 18 scales and shifts per group; opset 21 per channel.
        scale = scale.repeat_interleave(channels // groups)
        bias = bias.repeat_interleave(channels // groups)
    xs = _stash(x, node)
    y = F.group_norm(xs, groups, None, None, eps).to(x.dtype)
    return [y * scale.reshape(_channel_shape(x)) + bias.reshape(_channel_shape(x))]


def _rms_norm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, scale = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    axis = norm_axis(node.attr("axis", -1), x.dim())
    eps = float(node.attr("epsilon", 1e-5))
    xs = _stash(x, node)
    dims = tuple(range(axis, x.dim()))
    y = xs * torch.rsqrt(xs.pow(2).mean(dim=dims, keepdim=True) + eps)
    return [y.to(x.dtype) * scale]


def _lrn(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    size = int(node.attr("size"))
    alpha, beta, bias = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    # ONNX's window is [c - floor((size-1)/2), c + ceil((size-1)/2)]; torch's differs for even sizes.
    front, back = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = (x * x).unsqueeze(1)
    flat = sq.reshape(x.shape[0], 1, x.shape[1], -1)
    padded = F.pad(flat, (0, 0, front, back))
    summed = F.avg_pool2d(padded, (size, 1), stride=1) * size
    summed = summed.reshape(x.shape)
    return [x / (bias + alpha / size * summed).pow(beta)]


def _lp_norm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    axis = norm_axis(node.attr("axis", -1), x.dim())
    p = int(node.attr("p", 2))
    norm = x.abs().sum(dim=axis, keepdim=True) if p == 1 else x.pow(2).sum(dim=axis, keepdim=True).sqrt()
    return [torch.where(norm == 0, torch.zeros_like(x), x / norm)]


def _mvn(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    axes = tuple(norm_axis(a, x.dim()) for a in node.attr("axes", [0, 2, 3]))
    mean = x.mean(dim=axes, keepdim=True)
    var = (x * x).mean(dim=axes, keepdim=True) - mean * mean
    return [(x - mean) / (torch.sqrt(var) + 1e-9)]


_TABLE: dict[str, tuple[Callable[[Node, Inputs, RunContext], Outputs], int]] = {
    "BatchNormalization": (_batch_norm, 15),
    "InstanceNormalization": (_instance_norm, 22),
    "LayerNormalization": (_layer_norm, 17),
    "GroupNormalization": (_group_norm, 21),
    "RMSNormalization": (_rms_norm, 23),
    "LRN": (_lrn, 13),
    "LpNormalization": (_lp_norm, 22),
    "MeanVarianceNormalization": (_mvn, 13),
}

CONVERTERS: dict[str, OpSpec] = {op: OpSpec(fn, version) for op, (fn, version) in _TABLE.items()}
