"""A model remembers the input signatures it accepted (names, datatypes, shapes), so a request like
one seen before skips the checks; a request that fails them fails every time, cached or not."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.errors import DTypeMismatchError, MissingInputError, ShapeError, UnknownInputError
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.models import scheduled as model_module
from streamrt.serve.models.model import ServedModel
from streamrt.testing.models import CATALOGUE


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    root = tmp_path_factory.mktemp("validation")
    onnx_path = root / "small_cnn.onnx"
    onnx.save(CATALOGUE["small_cnn"].make(), str(onnx_path))
    config = streamrt.BuildConfig(profiles=CATALOGUE["small_cnn"].profiles, backend_options={"threads": 1})
    (root / "cnn" / "1").mkdir(parents=True)
    streamrt.build(onnx_path, config, root / "cnn" / "1" / "model.plan", cache_dir=root / "cache")
    model = ServedModel.load(root / "cnn", 1, ModelConfig(name="cnn", max_batch_size=8))
    yield model
    model.instances.close()


def _x(rows: int, dtype: type = np.float32, size: int = 32) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 3, size, size)).astype(dtype)


def test_accepted_signatures_are_remembered_and_refusals_are_not(served: ServedModel) -> None:
    name = next(iter(served.config.input)).name
    served._accepted.clear()
    assert served.validate({name: _x(3)}) == 3
    assert len(served._accepted) == 1
    assert served.validate({name: _x(3)}) == 3  # the same signature, fresh data
    assert len(served._accepted) == 1
    for _ in range(2):  # refused the second time too: nothing about a refusal is remembered
        with pytest.raises(ShapeError, match="batch size 9"):
            served.validate({name: _x(9)})
        with pytest.raises(DTypeMismatchError, match="FP64"):
            served.validate({name: _x(3, np.float64)})
        with pytest.raises(ShapeError):
            served.validate({name: _x(3, size=31)})
        with pytest.raises(UnknownInputError):
            served.validate({name: _x(3), "extra": _x(3)})
        with pytest.raises(MissingInputError):
            served.validate({})
    assert len(served._accepted) == 1


def test_the_memory_of_signatures_is_bounded(served: ServedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    name = next(iter(served.config.input)).name
    monkeypatch.setattr(model_module, "_ACCEPTED_SIGNATURES", 3)
    served._accepted.clear()
    for rows in range(1, 9):
        assert served.validate({name: _x(rows)}) == rows
        assert len(served._accepted) <= 3


