"""`streamrt compare`: same engine passes, fp16/int8 show their error, another model fails with exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from helpers import catalogue_file, save
from streamrt.cli.main import main
from streamrt.testing.models import small_cnn

PROFILE = ["--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:4x3x32x32", "--max-shapes", "x:16x3x32x32"]


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return catalogue_file("small_cnn", tmp_path)


def _compare(a: Path, b: Path, *extra: str) -> list[str]:
    return ["compare", str(a), str(b), *PROFILE, "--cache-dir", str(a.parent / "cache"), *extra]


def test_same_model_and_its_plan_pass(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "cnn.plan"
    assert main(["build", str(model), "-o", str(plan), *PROFILE, "--cache-dir", str(tmp_path / "cache")]) == 0
    capsys.readouterr()
    assert main(_compare(model, plan, "--batch", "8")) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "logits" in out and "100.00%" in out
    assert out.startswith(f"A: {model} (onnxruntime")


def test_fp16_side_shows_a_small_error(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_compare(model, model, "--b-precision", "fp16", "--batch", "8", "--json")) == 1
    data = json.loads(capsys.readouterr().out)
    (out,) = data["outputs"]
    assert not data["passed"] and "fp16" in data["b"] and "fp32" in data["a"]
    assert 0 < out["max_abs"] < 0.05 and out["cosine"] > 0.999 and out["top1"] >= 0.75
    assert main(_compare(model, model, "--b-precision", "fp16", "--atol", "0.05", "--rtol", "0.05")) == 0


def test_int8_side_with_calibration_data(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(7)
    for i in range(8):
        np.savez(calib / f"{i:02d}.npz", x=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    args = _compare(model, model, "--b-precision", "int8", "--calib", str(calib), "--calib-method", "minmax")
    assert main([*args, "--batch", "16", "--json"]) == 1
    (out,) = json.loads(capsys.readouterr().out)["outputs"]
    assert out["max_abs"] > 0 and out["cosine"] > 0.9 and out["top1"] is not None


def test_a_different_model_fails_with_exit_1(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = save(small_cnn(seed=99), tmp_path / "other.onnx")
    assert main(_compare(model, other, "--atol", "1e-3", "--rtol", "1e-3")) == 1
    out = capsys.readouterr().out
    assert "FAILED (1 of 1 outputs)" in out


def test_inputs_file_and_bad_inputs(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(_compare(model, model, "--inputs", str(tmp_path / "in.npz"))) == 0
    assert "x=3x3x32x32 float32" in capsys.readouterr().out
    np.savez(tmp_path / "bad.npz", x=x.astype(np.int32))
    assert main(_compare(model, model, "--inputs", str(tmp_path / "bad.npz"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("streamrt compare: error:") and "int32" in err[-1]


def test_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(small_cnn(), tmp_path / "m.onnx")
    assert main(["compare", str(tmp_path / "m.onnx"), str(tmp_path / "nope.onnx")]) == 2
    assert "nope.onnx" in capsys.readouterr().err.strip().splitlines()[-1]


def test_inputs_file_gives_the_shapes_of_a_dynamic_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], "g", [x], [y])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dyn.onnx")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).standard_normal((1, 3, 13, 7)).astype(np.float32))
    args = ["compare", str(model), str(model), "--inputs", str(tmp_path / "in.npz"), "--cache-dir", str(tmp_path / "c")]
    assert main([*args, "--json"]) == 0  # no --min/opt/max-shapes needed
    data = json.loads(capsys.readouterr().out)
    assert data["shapes"] == {"x": [1, 3, 13, 7]} and data["passed"]
    (out,) = data["outputs"]
    assert out["rel_l2"] == 0 and out["top1"] == 1.0  # 1 x 3 x 13 x 7: argmax over the last axis
    (tmp_path / "bad.npz").write_text("not a zip")
    assert main(["compare", str(model), str(model), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "cannot read --inputs" in capsys.readouterr().err
