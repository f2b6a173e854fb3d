"""Loading models: missing, not ONNX, checker failures, and what inspect reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import catalogue_file, checker_failing_model, save
from streamrt.errors import InvalidModelError, ModelNotFoundError
from streamrt.onnx.model import load_model
from streamrt.types import DType


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        load_model(tmp_path / "nope.onnx")


@pytest.mark.parametrize("content", [b"", b"hello world, not a model", bytes(range(256)) * 4])
def test_not_onnx(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fake.onnx"
    path.write_bytes(content)
    with pytest.raises(InvalidModelError, match="not an ONNX model"):
        load_model(path)


def test_checker_failure(tmp_path: Path) -> None:
    path = save(checker_failing_model(), tmp_path / "bad.onnx")
    with pytest.raises(InvalidModelError, match="fails the ONNX checker"):
        load_model(path)


def test_describe(tmp_path: Path) -> None:
    model = load_model(catalogue_file("small_cnn", tmp_path))
    assert model.inputs[0].dtype is DType.FLOAT32 and model.inputs[0].shape == (-1, 3, 32, 32)
    info = model.describe()
    assert info["op_histogram"]["Conv"] == 2 and info["opset"] == 17
    assert len(info["sha256"]) == 64
