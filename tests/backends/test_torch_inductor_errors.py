"""torch_inductor on the CPU: small dynamic ranges build, export failures say what to change, no torch warnings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import streamrt
from helpers import catalogue_file, save
from streamrt.cli.main import main
from streamrt.config import BuildConfig
from streamrt.errors import BuildError, ShapeError
from streamrt.running.inputs import to_device, to_numpy
from streamrt.testing.models import CATALOGUE
from streamrt.types import ShapeProfile, ShapeRange

pytestmark = [pytest.mark.torch]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batch_profile_1_to_2_builds_and_runs_without_torch_warnings(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], device: str
) -> None:
    src = catalogue_file("matmul", tmp_path)
    plan = tmp_path / "mm.plan"
    rc = main(["build", str(src), "-o", str(plan), "--backend", "torch_inductor", "--option", f"device={device}",
               "--no-cache", "--cache-dir", str(tmp_path / "cache"),
               "--min-shapes", "x:1x32", "--opt-shapes", "x:1x32", "--max-shapes", "x:2x32"])
    err = capfd.readouterr().err
    assert rc == 0, err
    assert "Warning" not in err, err
    model = CATALOGUE["matmul"]
    ctx = streamrt.load(plan).create_context()
    rng = np.random.default_rng()
    engine = ctx.engine
    for batch in (1, 2):
        inputs = model.inputs(rng, batch)
        got = to_numpy(ctx.infer(to_device(inputs, engine.device_kind))["y"])
        # fp32 with TF32 off (the plan's default), against NumPy's float64 reference
        np.testing.assert_allclose(got, model.reference(model.make(), inputs)["y"], rtol=1e-4, atol=1e-4)
    # The export bound (3) is wider than the profile (1..2): the profile still rules.
    with pytest.raises(ShapeError, match="outside every profile"):
        ctx.infer(to_device(model.inputs(rng, 3), engine.device_kind))


def _fixed_batch_model() -> onnx.ModelProto:
    """Declares a dynamic batch, but adds a (3, 32) constant: the batch can only be 3."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 32])],
        [numpy_helper.from_array(np.ones((3, 32), np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_export_failure_says_which_size_to_use(tmp_path: Path) -> None:
    src = save(_fixed_batch_model(), tmp_path / "fixed.onnx")
    profile = ShapeProfile({"x": ShapeRange((3, 32), (3, 32), (4, 32))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options={"device": "cpu"})
    with pytest.raises(BuildError) as info:
        streamrt.build(src, config, tmp_path / "f.plan", cache=False, cache_dir=tmp_path / "cache")
    assert "specialized it to be a constant (3)" in info.value.message
    assert info.value.hint == ("the model fixes axis 0 of input 'x' to 3: build with that axis at 3 "
                               "in --min-shapes, --opt-shapes and --max-shapes")
    assert not (tmp_path / "f.plan").exists()
