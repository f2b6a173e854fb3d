"""ONNX LSTM in the importer vs ONNX Runtime: directions, layouts, biases, initial states, all outputs.

Random weights, fresh random inputs; tolerance rtol 1e-5, atol 1e-5 (measured <= 1e-6).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.export import Dim

from onnx_importer.test_models import ort_run
from streamrt.errors import UnsupportedOperatorError
from streamrt.onnx.importer import export_program, import_onnx

pytestmark = pytest.mark.torch

SEQ, BATCH, INPUT, HIDDEN = 7, 3, 5, 4


def _lstm_model(
    direction: str, layout: int = 0, bias: bool = True, states: bool = False, **attrs: Any
) -> onnx.ModelProto:
    rng = np.random.default_rng()
    dirs = 2 if direction == "bidirectional" else 1
    inits = [
        numpy_helper.from_array(rng.standard_normal((dirs, 4 * HIDDEN, INPUT)).astype(np.float32) * 0.5, "W"),
        numpy_helper.from_array(rng.standard_normal((dirs, 4 * HIDDEN, HIDDEN)).astype(np.float32) * 0.5, "R"),
    ]
    names = ["x", "W", "R"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal((dirs, 8 * HIDDEN)).astype(np.float32) * 0.5, "B"))
    names.append("B" if bias else "")
    graph_inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", INPUT] if layout else ["t", "b", INPUT])
    ]
    if states:
        names += ["", "h0", "c0"]
        state_shape = [None, None, HIDDEN]  # (dirs, batch) or (batch, dirs) by layout
        graph_inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, state_shape) for n in ("h0", "c0")]
    node = helper.make_node(
        "LSTM", names, ["y", "y_h", "y_c"], hidden_size=HIDDEN, direction=direction, layout=layout, **attrs
    )
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")]
    graph = helper.make_graph([node], "g", graph_inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


CASES = {
    "forward": {"direction": "forward"},
    "reverse": {"direction": "reverse"},
    "bidirectional": {"direction": "bidirectional"},
    "no_bias": {"direction": "forward", "bias": False},
    "initial_states": {"direction": "bidirectional", "states": True},
    "batch_first": {"direction": "bidirectional", "layout": 1, "states": True},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lstm_matches_onnxruntime(name: str) -> None:
    case = CASES[name]
    model = _lstm_model(**case)
    rng = np.random.default_rng()
    dirs = 2 if case["direction"] == "bidirectional" else 1
    layout = case.get("layout", 0)
    feeds = {"x": rng.standard_normal((BATCH, SEQ, INPUT) if layout else (SEQ, BATCH, INPUT)).astype(np.float32)}
    if case.get("states"):
        shape = (BATCH, dirs, HIDDEN) if layout else (dirs, BATCH, HIDDEN)
        feeds |= {n: rng.standard_normal(shape).astype(np.float32) for n in ("h0", "c0")}
    with torch.no_grad():
        got = import_onnx(model)(*[torch.from_numpy(v) for v in feeds.values()])
    expected = _ort_layout_1(model, feeds) if layout else ort_run(model, feeds)
    for g, e, out in zip(got, expected, ("y", "y_h", "y_c"), strict=True):
        assert tuple(g.shape) == e.shape, f"{name}: {out}"
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=f"{name}: {out}")


def _ort_layout_1(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime has no batch-first LSTM: run the same weights with layout 0 and transpose."""
    seq_first = onnx.ModelProto()
    seq_first.CopyFrom(model)
    (attr,) = [a for a in seq_first.graph.node[0].attribute if a.name == "layout"]
    attr.i = 0
    y, y_h, y_c = ort_run(seq_first, {n: np.ascontiguousarray(v.swapaxes(0, 1)) for n, v in feeds.items()})
    return [y.transpose(2, 0, 1, 3), y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)]


def test_lstm_exports_with_dynamic_batch() -> None:
    model = _lstm_model("bidirectional")
    program = export_program(model, [torch.randn(SEQ, 2, INPUT)], ({1: Dim("b", min=1, max=16)},))
    x = np.random.default_rng().standard_normal((SEQ, 5, INPUT)).astype(np.float32)
    for g, e in zip(program.module()(torch.from_numpy(x)), ort_run(model, {"x": x}), strict=True):
        np.testing.assert_allclose(g.detach().numpy(), e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("attrs", "why"),
    [
        ({"clip": 3.0}, "the clip attribute"),
        ({"input_forget": 1}, "input_forget=1"),
        ({"activations": ["Relu", "Tanh", "Tanh"]}, r"activations \['Relu', 'Tanh', 'Tanh'\]"),
    ],
)
def test_what_torch_cannot_run_is_refused_at_import(attrs: dict[str, Any], why: str) -> None:
    with pytest.raises(UnsupportedOperatorError, match=why):
        import_onnx(_lstm_model("forward", **attrs))
