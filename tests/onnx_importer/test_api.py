"""Public surface of the ONNX -> torch importer: exports, support queries, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import streamrt.onnx.importer as importer
from onnx_importer.importer_models import conv_classifier, single_op
from streamrt.errors import InvalidModelError, MissingInputError, ModelNotFoundError, UnsupportedOperatorError
from streamrt.onnx.importer import OnnxModule, check_supported, import_onnx, supported_ops, to_fx

pytestmark = pytest.mark.torch


def test_public_names_are_curated() -> None:
    public = {name for name in dir(importer) if not name.startswith("_")}
    expected = set(importer.__all__)
    assert expected <= public
    assert {"import_onnx", "OnnxModule", "supported_ops", "check_supported", "to_fx"} <= expected


def test_supported_ops_lists_opset_ranges() -> None:
    ops = supported_ops()
    assert len(ops) > 100
    for op in ("Conv", "Resize", "Concat", "Split", "Slice", "LayerNormalization", "QuantizeLinear", "Where"):
        assert op in ops
    lo, hi = ops["Conv"]
    assert lo == 11 and hi >= 22
    assert ops["LayerNormalization"][0] == 17  # introduced in opset 17
    assert all(lo <= hi for lo, hi in ops.values())
    assert "LSTM" in ops  # runs on torch's LSTM kernel (ops_rnn.py)
    for unsupported in ("Loop", "If", "Scan", "GRU", "NonZero", "NonMaxSuppression"):
        assert unsupported not in ops


def _loop_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu0"),
        helper.make_node("Loop", ["n", "c"], [], name="the_loop", body=body),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


def test_unsupported_operator_names_node_op_and_opset() -> None:
    model = _loop_model()
    with pytest.raises(UnsupportedOperatorError) as info:
        check_supported(model)
    err = info.value
    assert (err.node, err.op_type, err.opset) == ("the_loop", "Loop", 17)
    assert "torch_inductor" in str(err) and "the_loop" in str(err) and "Loop" in str(err) and "17" in str(err)


def test_unsupported_operator_is_reported_before_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.export must not run for an unsupported model")

    monkeypatch.setattr(torch.export, "export", fail)
    with pytest.raises(UnsupportedOperatorError, match="the_loop"):
        to_fx(_loop_model(), [torch.randn(2)])
    with pytest.raises(UnsupportedOperatorError):
        import_onnx(_loop_model())


def test_custom_domain_and_unknown_version_are_unsupported() -> None:
    node = helper.make_node("FusedThing", ["x"], ["y"], name="custom", domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_operatorsetid("", 17), helper.make_operatorsetid("com.example", 1)]
    )
    with pytest.raises(UnsupportedOperatorError, match=r"domain 'com\.example'"):
        check_supported(model)


def test_old_opset_is_rejected_with_a_conversion_hint() -> None:
    model = single_op("Relu", {"x": np.zeros(3, np.float32)}, opset=9)
    with pytest.raises(InvalidModelError) as info:
        import_onnx(model)
    assert "opset 9" in str(info.value) and "version_converter" in str(info.value)


def test_import_from_path_and_names(tmp_path: Path) -> None:
    model = conv_classifier(np.random.default_rng(1))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (path, str(path)):
        module = import_onnx(source)
        assert isinstance(module, OnnxModule)
        assert module.input_names == ("images",)
        assert module.output_names == ("logits",)
        assert module.inputs[0].shape == ("batch", 3, 32, 32)
        (logits,) = module(torch.randn(2, 3, 32, 32))
        assert logits.shape == (2, 10)
    with pytest.raises(ModelNotFoundError):
        import_onnx(tmp_path / "missing.onnx")


def test_forward_takes_inputs_positionally_and_checks_arity() -> None:
    a = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    model = single_op("Sub", {"input.1": a, "1bias": a})
    module = import_onnx(model)
    assert module.arg_names == ("input_1", "input_1bias")
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(module(x, y)[0], x - y)
    torch.testing.assert_close(module(input_1=x, input_1bias=y)[0], x - y)
    with pytest.raises(MissingInputError):
        module.run(x)


def test_initializers_are_buffers_that_move_with_the_module() -> None:
    module = import_onnx(conv_classifier(np.random.default_rng(3)))
    buffers = dict(module.named_buffers())
    assert buffers and all(b.dtype == torch.float32 for b in buffers.values())
    module = module.double()
    (logits,) = module(torch.randn(2, 3, 32, 32, dtype=torch.float64))
    assert logits.dtype == torch.float64
