"""torch_inductor output specs from the exported programs' symbolic shapes (issue 24 item 2b).

The helpers run on ``torch.export`` alone (no compile, well under a second each); one ONNX build on
the CPU (tens of seconds) checks that an ONNX graph declaring a static output batch for a dynamic
input gets a plan whose output batch is dynamic, as its compiled kernels are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("torch")

import torch

import streamrt
from streamrt.backends.torch_inductor.builder import export_profiles
from streamrt.backends.torch_inductor.output_specs import exported_outputs, merge_profiles, named, refine_declared
from streamrt.config import BuildConfig
from streamrt.errors import BuildError, ConfigError
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

pytestmark = pytest.mark.torch

F32 = DType.FLOAT32


class ThreeOutputs(torch.nn.Module):
    """Outputs that follow the batch, follow half the width, and stay static."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.linear(x.mean(2)), x[:, :, ::2].half(), torch.ones(3) * x.shape[0]


def _export(module: torch.nn.Module, rng: ShapeRange) -> list[tuple[tuple[int, ...], DType]]:
    return exported_outputs(export_profiles(module, ["x"], [torch.float32], ShapeProfile({"x": rng}), "cpu"))


def test_symbolic_dims_become_minus_one_and_static_dims_stay() -> None:
    got = _export(ThreeOutputs(), ShapeRange((1, 4, 6), (4, 4, 6), (8, 4, 12)))
    assert got == [((-1, 10), F32), ((-1, 4, -1), DType.FLOAT16), ((3,), F32)]


def test_a_static_profile_gives_concrete_outputs() -> None:
    assert _export(ThreeOutputs(), ShapeRange.fixed((5, 4, 6))) == [((5, 10), F32), ((5, 4, 3), DType.FLOAT16),
                                                                    ((3,), F32)]


def test_a_non_tensor_output_is_refused() -> None:
    class Number(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
            return x * 2, 7

    with pytest.raises(BuildError, match="output 1 of the exported program is int, not a tensor"):
        _export(Number(), ShapeRange((1, 4), (2, 4), (4, 4)))


def test_profiles_merge_to_minus_one_where_they_differ() -> None:
    first = [((-1, 10), F32), ((4, 3), F32), ((2,), F32)]
    second = [((16, 10), F32), ((16, 3), F32), ((2,), F32)]
    assert merge_profiles([first, second]) == [((-1, 10), F32), ((-1, 3), F32), ((2,), F32)]
    assert merge_profiles([]) == []
    with pytest.raises(BuildError, match=r"output 0 is float32 \?x10 in profile 1 but float32 16x10x1 in profile 2"):
        merge_profiles([first, [((16, 10, 1), F32), *second[1:]]])
    with pytest.raises(BuildError, match="profile 2 exports 1 outputs, profile 1 exports 3"):
        merge_profiles([first, second[:1]])


def test_names_replace_the_positional_ones() -> None:
    compiled = (TensorSpec("output_0", F32, (-1, 10)),)
    assert named(compiled, ["logits"]) == (TensorSpec("logits", F32, (-1, 10)),)
    assert named(compiled, None) == compiled
    with pytest.raises(ConfigError, match=r"output_names has 2 names .* the module returns 1 outputs"):
        named(compiled, ["a", "b"])


def test_declared_onnx_outputs_take_the_compiled_dynamic_dims() -> None:
    declared = (TensorSpec("y", F32, (8, 3)), TensorSpec("z", DType.INT64, (-1, 2)), TensorSpec("w", F32, ()))
    compiled = (TensorSpec("output_0", F32, (-1, 3)), TensorSpec("output_1", DType.INT32, (4, 2)),
                TensorSpec("output_2", F32, (-1, 5)))
    # Names and dtypes stay the graph's; a dim is -1 when either side says so; a shapeless output
    # takes the compiled shape.
    assert refine_declared(declared, compiled) == (
        TensorSpec("y", F32, (-1, 3)), TensorSpec("z", DType.INT64, (-1, 2)), TensorSpec("w", F32, (-1, 5)))
    assert refine_declared(declared, ()) == declared
    assert refine_declared(declared, compiled[:1]) == declared


def _static_output_model() -> onnx.ModelProto:
    """Gemm over a dynamic batch whose graph output declares a static batch of 8 (as some exporters write)."""
    w = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 3])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.slow
def test_an_onnx_build_records_the_batch_its_kernels_follow(tmp_path: Path) -> None:
    model = _static_output_model()
    onnx.save(model, str(tmp_path / "m.onnx"))
    profile = ShapeProfile({"x": ShapeRange((1, 4), (4, 4), (8, 4))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options={"device": "cpu", "threads": 1})
    plan = streamrt.build(tmp_path / "m.onnx", config, tmp_path / "m.plan", cache=False, cache_dir=tmp_path / "c").path
    engine = streamrt.load(plan)
    assert engine.outputs == (TensorSpec("y", F32, (-1, 3)),)  # before: (8, 3), the graph's declaration
    w = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    x = np.random.default_rng().standard_normal((5, 4)).astype(np.float32)
    got = engine.create_context().infer({"x": x})["y"]
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-6)  # fp32 GEMM of 4 terms
