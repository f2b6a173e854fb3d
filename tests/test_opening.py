"""streamrt.open: plans load as they are, ONNX builds through the cache with a default batch profile, read once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrt
import streamrt.building.builder
import streamrt.onnx.model
from helpers import catalogue_file
from streamrt.building.opening import batch_profile, with_batch_profile
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.models.model import load_engine
from streamrt.testing.models import CATALOGUE
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

X = TensorSpec("x", DType.FLOAT32, (-1, 3, 32, 32))
IMAGE = TensorSpec("image", DType.FLOAT32, (-1, 3, -1, -1))
STATIC = TensorSpec("scale", DType.FLOAT32, (4,))


def test_batch_profile_covers_dynamic_batch_inputs_only() -> None:
    profile = batch_profile([X, IMAGE, STATIC], 8)
    assert profile is not None and set(profile.ranges) == {"x"}
    assert profile.ranges["x"] == ShapeRange((1, 3, 32, 32), (8, 3, 32, 32), (8, 3, 32, 32))
    assert batch_profile([X], 8, opt_batch=20).ranges["x"].opt == (8, 3, 32, 32)  # type: ignore[union-attr]
    assert batch_profile([X], 8, opt_batch=2).ranges["x"].opt == (2, 3, 32, 32)  # type: ignore[union-attr]
    assert batch_profile([IMAGE, STATIC], 8) is None
    with pytest.raises(ConfigError, match="max_batch must be an integer >= 1, got 0"):
        batch_profile([X], 0)


def test_given_profiles_and_unset_batch_leave_the_config_alone() -> None:
    given = BuildConfig(profiles=(ShapeProfile({"x": ShapeRange((2, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))}),))
    assert with_batch_profile(given, [X], 16) is given
    assert with_batch_profile(BuildConfig(), [X], None) == BuildConfig()


def test_onnx_builds_through_the_cache_with_the_batch_profile(tmp_path: Path) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    lines: list[str] = []
    engine = streamrt.open(src, max_batch=6, cache_dir=tmp_path / "c", progress=lines.append)
    assert [p.ranges["x"].max[0] for p in engine.profiles] == [6]
    again = streamrt.open(src, max_batch=6, cache_dir=tmp_path / "c", progress=lines.append)
    assert any("reused cached plan" in line for line in lines)
    x = np.random.default_rng().standard_normal((6, 3, 32, 32)).astype(np.float32)
    expected = CATALOGUE["small_cnn"].reference(CATALOGUE["small_cnn"].make(), {"x": x})["logits"]
    got = again.create_context().infer({"x": x})["logits"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_plan_is_loaded_as_it_is(tmp_path: Path) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    plan = streamrt.build(src, BuildConfig(), tmp_path / "m.plan", cache_dir=tmp_path / "c").path
    engine = streamrt.open(plan, BuildConfig(optimization_level=1), max_batch=2)  # build settings do not apply
    assert engine.manifest == streamrt.load(plan).manifest
    assert engine.profiles[0].ranges["x"].max[0] == 64  # the plan's own profile, not 1..2


def test_the_server_reads_an_onnx_model_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "cnn" / "1"
    folder.mkdir(parents=True)
    catalogue_file("small_cnn", folder).rename(folder / "model.onnx")
    monkeypatch.setenv("STREAMRT_CACHE", str(tmp_path / "cache"))
    reads: list[Any] = []
    real = streamrt.onnx.model.load_model

    def counting(path: Any) -> Any:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(streamrt.onnx.model, "load_model", counting)
    monkeypatch.setattr(streamrt.building.builder, "load_model", counting)
    engine = load_engine(tmp_path / "cnn", 1, ModelConfig(name="cnn", max_batch_size=4))
    assert len(reads) == 1
    assert engine.profiles[0].ranges["x"].max[0] == 4
