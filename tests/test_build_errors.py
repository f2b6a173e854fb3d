"""streamrt.build failures: unsupported operators name the node, domain and the backends that could run them."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import streamrt
from helpers import save
from streamrt.config import BuildConfig
from streamrt.errors import UnsupportedOperatorError


def _model_with(op_type: str, domain: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"], name="relu"),
         helper.make_node(op_type, ["h"], ["y"], name="custom_1", domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    model.ir_version = 8
    return model


def test_custom_domain_operator_names_node_domain_and_that_no_backend_runs_it(tmp_path: Path) -> None:
    src = save(_model_with("FancyOp", "com.acme"), tmp_path / "custom.onnx")
    with pytest.raises(UnsupportedOperatorError) as info:
        streamrt.build(src, BuildConfig(), tmp_path / "c.plan", cache=False, cache_dir=tmp_path / "cache")
    error = info.value
    assert (error.node, error.op_type, error.domain, error.opset) == ("custom_1", "FancyOp", "com.acme", 1)
    assert error.alternatives == ()
    assert "node 'custom_1' uses operator FancyOp from domain 'com.acme'" in str(error)
    assert "no StreamRT backend installed here can run it" in str(error)
    assert not (tmp_path / "c.plan").exists()


@pytest.mark.torch
def test_refused_operator_names_the_backend_that_runs_it(tmp_path: Path) -> None:
    src = save(_model_with("Gelu", "com.microsoft"), tmp_path / "ms.onnx")
    config = BuildConfig(backend="torch_inductor", backend_options={"device": "cpu"})
    with pytest.raises(UnsupportedOperatorError) as info:
        streamrt.build(src, config, tmp_path / "c.plan", cache=False, cache_dir=tmp_path / "cache")
    assert info.value.alternatives == ("onnxruntime",)
    assert info.value.hint == "rebuild with --backend onnxruntime"
