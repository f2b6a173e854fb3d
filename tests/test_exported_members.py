"""The curated public surface: every name in ``__all__`` exists, and nothing public is missing from it."""

from __future__ import annotations

import importlib

import pytest

import streamrt

MODULES = [
    "streamrt",
    "streamrt.errors",
    "streamrt.types",
    "streamrt.config",
    "streamrt.plan",
    "streamrt.building.builder",
    "streamrt.running.runtime",
    "streamrt.building.opening",
    "streamrt.backends",
    "streamrt.backends.base",
    "streamrt.onnx.model",
    "streamrt.onnx.profiles",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    for member in module.__all__:
        assert getattr(module, member, None) is not None, f"{name}.{member}"


def test_top_level_surface() -> None:
    assert set(streamrt.__all__) == {
        "BuildConfig",
        "BuildResult",
        "DType",
        "Engine",
        "ExecutionContext",
        "Precision",
        "ShapeProfile",
        "ShapeRange",
        "StreamRTError",
        "TensorSpec",
        "__version__",
        "build",
        "build_module",
        "load",
        "open",
    }


def test_every_error_derives_from_the_root() -> None:
    from streamrt import errors

    for member in errors.__all__:
        assert issubclass(getattr(errors, member), errors.StreamRTError)
