"""Recurrent layers: ONNX ``LSTM`` on torch's fused LSTM kernel.

ONNX stores the four gates in the order input, output, forget, cell (``iofc``) and torch in the
order input, forget, cell, output (``ifgo``); the weights are re-ordered once per call (constant
folded by Inductor). A ``reverse`` LSTM runs forward on the time-reversed sequence. What torch's
kernel cannot express is refused when the model is imported, naming the attribute: per-batch
``sequence_lens``, peepholes, ``clip``, ``input_forget`` and activations other than the defaults
(Sigmoid, Tanh, Tanh), as exported by PyTorch, Keras (tf2onnx) and PaddlePaddle for plain LSTMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .common import input_or, tensor, unsupported
from .registry import Node, OpSpec, RunContext
from .values import Value

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]

_DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")
# torch's gate order i, f, g(c), o as indices into ONNX's i, o, f, c.
_TORCH_FROM_ONNX = (0, 2, 3, 1)


def _check_lstm(node: Node) -> str | None:
    acts = tuple(str(a) for a in node.attr("activations", ()) or ())
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    if acts and acts != _DEFAULT_ACTIVATIONS * directions:
        return f"activations {list(acts)} (only the defaults Sigmoid, Tanh, Tanh run on torch's LSTM kernel)"
    if node.attr("clip") is not None:
        return "the clip attribute"
    if int(node.attr("input_forget", 0)):
        return "input_forget=1"
    if len(node.inputs) > 4 and node.inputs[4]:
        return "per-batch sequence_lens (pad the batch to one length instead)"
    if len(node.inputs) > 7 and node.inputs[7]:
        return "peephole weights (input P)"
    return None


def _reorder(weight: torch.Tensor, hidden: int) -> torch.Tensor:
    """Gate blocks along dim 0 from ONNX's ``iofc`` to torch's ``ifgo`` order."""
    blocks = weight.reshape(4, hidden, *weight.shape[1:])
    return blocks[list(_TORCH_FROM_ONNX)].reshape(4 * hidden, *weight.shape[1:])


def _state(
    value: Value | None, ctx: RunContext, batch_first: bool, shape: tuple[Any, ...], like: torch.Tensor
) -> torch.Tensor:
    """An initial state as ``(dirs, batch, hidden)``, zeros when omitted.

    The reshape also checks the element count: torch's LSTM kernel does not check state shapes
    and corrupts memory on a wrong one.
    """
    if value is None:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    state = tensor(value, ctx)
    return (state.transpose(0, 1) if batch_first else state).reshape(shape).contiguous()


def _lstm(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, w, r = tensor(inputs[0], ctx), tensor(inputs[1], ctx), tensor(inputs[2], ctx)
    hidden = int(node.attr("hidden_size", r.shape[-1]))
    direction = str(node.attr("direction", "forward"))
    batch_first = int(node.attr("layout", 0)) == 1
    if batch_first:
        x = x.transpose(0, 1)  # work in ONNX's default (seq, batch, input) layout
    dirs = int(w.shape[0])
    expected = {"W": (dirs, 4 * hidden, x.shape[-1]), "R": (dirs, 4 * hidden, hidden)}
    for name, t in (("W", w), ("R", r)):
        if tuple(t.shape) != expected[name]:
            raise unsupported(node, f"{name} has shape {tuple(t.shape)}, expected {expected[name]}")
    b_value = input_or(inputs, 3)
    bias = (
        tensor(b_value, ctx).reshape(dirs, 8 * hidden)
        if b_value is not None
        else torch.zeros(dirs, 8 * hidden, dtype=x.dtype, device=x.device)
    )
    shape = (dirs, x.shape[1], hidden)
    h0 = _state(input_or(inputs, 5), ctx, batch_first, shape, x)
    c0 = _state(input_or(inputs, 6), ctx, batch_first, shape, x)
    weights: list[torch.Tensor] = []
    for d in range(dirs):
        weights += [
            _reorder(w[d], hidden),
            _reorder(r[d], hidden),
            _reorder(bias[d, : 4 * hidden], hidden),
            _reorder(bias[d, 4 * hidden :], hidden),
        ]
    reverse = direction == "reverse"
    seq = x.flip(0) if reverse else x
    y, h_n, c_n = torch.lstm(seq.contiguous(), (h0, c0), weights, True, 1, 0.0, False, dirs == 2, False)
    if reverse:
        y = y.flip(0)
    y = y.reshape(y.shape[0], y.shape[1], dirs, hidden).permute(0, 2, 1, 3)  # (seq, dirs, batch, hidden)
    if batch_first:
        y, h_n, c_n = y.permute(2, 0, 1, 3), h_n.transpose(0, 1), c_n.transpose(0, 1)
    return [y, h_n, c_n]


CONVERTERS: dict[str, OpSpec] = {"LSTM": OpSpec(_lstm, 22, _check_lstm)}
