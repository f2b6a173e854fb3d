"""Multiple-of constraints in shape profiles: flags, config files, validation, the plan, run-time checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import streamrt
from streamrt.cli.main import main
from streamrt.config import BuildConfig
from streamrt.errors import ProfileError, ShapeError
from streamrt.onnx.profiles import check_shapes, parse_profiles, resolve_profiles
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

INPUTS = (TensorSpec("x", DType.FLOAT32, (1, 3, -1, -1)),)
RANGE = ShapeRange((1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 512, 512), (1, 1, 32, 32))


def _relu_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_flags_make_a_multiple_per_dimension() -> None:
    (p,) = parse_profiles(["x:1x3x32x32"], ["x:1x3x64x64"], ["x:1x3x512x512"], ["x:1x1x32x32"])
    assert p.ranges["x"] == RANGE
    assert p.ranges["x"].describe().endswith("multiple of 1x1x32x32")


def test_one_multiple_applies_to_every_profile_and_counts_must_match() -> None:
    two = parse_profiles(["x:1x3x32x32", "x:1x3x64x64"], [], ["x:1x3x64x64", "x:1x3x128x128"], ["x:1x1x32x32"])
    assert all(p.ranges["x"].multiple == (1, 1, 32, 32) for p in two)
    with pytest.raises(ProfileError, match="got 2 --shape-multiple for 3 profiles"):
        parse_profiles(["x:1x3x32x32"] * 3, [], ["x:1x3x64x64"] * 3, ["x:1x1x32x32"] * 2)
    with pytest.raises(ProfileError, match="names input 'y', which has no min/max shapes"):
        parse_profiles(["x:1x3x32x32"], [], ["x:1x3x64x64"], ["y:1x1x32x32"])


def test_all_ones_is_no_constraint() -> None:
    assert ShapeRange((1,), (1,), (4,), (1,)) == ShapeRange((1,), (1,), (4,))
    assert "multiple" not in ShapeRange((1,), (1,), (4,), (1,)).to_dict()


@pytest.mark.parametrize(
    ("rng", "message"),
    [
        (ShapeRange((1, 3, 40, 32), (1, 3, 64, 64), (1, 3, 512, 512), (1, 1, 32, 32)), "dimension 2: min 40 is not"),
        (ShapeRange((1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 500, 512), (1, 1, 32, 32)), r"max 500 is not a multiple"),
        (ShapeRange((1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 512, 512), (1, 1, 0, 32)), "the multiple must be >= 1"),
        (ShapeRange((1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 512, 512), (1, 32)), "multiple shape 1x32 has rank 2"),
    ],
)
def test_profiles_off_their_own_grid_are_rejected(rng: ShapeRange, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        resolve_profiles(INPUTS, [ShapeProfile({"x": rng})])


def test_check_shapes_names_dimension_value_and_multiple() -> None:
    profiles = resolve_profiles(INPUTS, [ShapeProfile({"x": RANGE})])
    assert check_shapes(profiles, {"x": (1, 3, 320, 64)}) == 0
    with pytest.raises(ShapeError, match=r"dimension 2 of 'x' is 336, must be a multiple of 32") as info:
        check_shapes(profiles, {"x": (1, 3, 336, 64)})
    assert "320 or 352" in str(info.value)
    with pytest.raises(ShapeError, match="outside every profile"):
        check_shapes(profiles, {"x": (1, 3, 544, 64)})


def test_config_file_round_trip_keeps_the_multiple(tmp_path: Path) -> None:
    data = {
        "profiles": [
            {"x": {"min": [1, 3, 32, 32], "opt": [1, 3, 64, 64], "max": [1, 3, 512, 512], "multiple": [1, 1, 32, 32]}}
        ]
    }
    path = tmp_path / "build.json"
    path.write_text(json.dumps(data))
    config = BuildConfig.from_file(path)
    assert config.profiles[0].ranges["x"] == RANGE
    assert BuildConfig.from_dict(config.to_dict()) == config
    with pytest.raises(Exception, match="unknown shape range keys"):
        BuildConfig.from_dict({"profiles": [{"x": {"min": [1], "opt": [1], "max": [1], "step": [1]}}]})


def test_plan_stores_the_constraint_and_refuses_off_grid_inputs(tmp_path: Path) -> None:
    model = _relu_model(tmp_path / "relu.onnx")
    config = BuildConfig(profiles=(ShapeProfile({"x": RANGE}),))
    plan = streamrt.build(model, config, tmp_path / "relu.plan", cache=False)
    assert "--shape-multiple x:1x1x32x32" in plan.manifest.build_command
    engine = streamrt.load(plan.path)
    assert engine.profiles[0].ranges["x"].multiple == (1, 1, 32, 32)
    ctx = engine.create_context()
    x = np.random.default_rng().standard_normal((1, 3, 96, 352)).astype(np.float32)
    np.testing.assert_array_equal(ctx.infer({"x": x})["y"], np.maximum(x, 0))
    with pytest.raises(ShapeError, match=r"dimension 3 of 'x' is 336, must be a multiple of 32"):
        ctx.infer({"x": np.zeros((1, 3, 96, 336), np.float32)})


def test_cli_flag_reaches_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _relu_model(tmp_path / "relu.onnx")
    plan = tmp_path / "relu.plan"
    args = [
        "build",
        str(model),
        "-o",
        str(plan),
        "--no-cache",
        "--min-shapes",
        "x:1x3x32x32",
        "--opt-shapes",
        "x:1x3x64x64",
        "--max-shapes",
        "x:1x3x512x512",
        "--shape-multiple",
        "x:1x1x32x32",
    ]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["inspect", str(plan), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["profiles"][0]["x"]["multiple"] == [1, 1, 32, 32]
    bad = [*args[:-1], "x:1x1x48x32"]
    assert main(bad) == 2
    assert "min 32 is not a multiple of 48" in capsys.readouterr().err
