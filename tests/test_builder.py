"""streamrt.build: the cache, provenance and leaving nothing behind on failure."""

from __future__ import annotations

from pathlib import Path

import pytest

import streamrt
from helpers import catalogue_file
from streamrt.backends import get_backend
from streamrt.config import BuildConfig
from streamrt.errors import OutOfMemoryError
from streamrt.plan import read_plan


def test_second_build_is_served_from_cache(tmp_path: Path) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    lines: list[str] = []
    first = streamrt.build(
        src, BuildConfig(), tmp_path / "a.plan", cache_dir=tmp_path / "c", progress=lines.append
    )
    second = streamrt.build(
        src, BuildConfig(), tmp_path / "b.plan", cache_dir=tmp_path / "c", progress=lines.append
    )
    assert not first.cached and second.cached
    assert any("reused cached plan" in line for line in lines)
    assert read_plan(second.path).payload == read_plan(first.path).payload


def test_changed_settings_rebuild(tmp_path: Path) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    streamrt.build(src, BuildConfig(), tmp_path / "a.plan", cache_dir=tmp_path / "c")
    other = streamrt.build(
        src, BuildConfig(optimization_level=1), tmp_path / "b.plan", cache_dir=tmp_path / "c"
    )
    assert not other.cached


def test_manifest_provenance(tmp_path: Path) -> None:
    src = catalogue_file("matmul", tmp_path)
    result = streamrt.build(src, BuildConfig(), tmp_path / "m.plan", cache=False)
    m = result.manifest
    assert m.backend == "onnxruntime" and m.precision == "fp32"
    assert m.runtime_versions["onnxruntime"] == m.backend_version
    assert m.device["kind"] == "cpu" and m.build_settings["backend"]["graph_optimization_level"] == 3
    assert m.build_command.startswith("streamrt build")
    assert [t.name for t in m.inputs] == ["x"] and m.profiles[0].ranges["x"].max == (64, 32)


def test_failed_build_leaves_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = catalogue_file("matmul", tmp_path)
    backend = get_backend("onnxruntime")

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("simulated out of memory during build")

    monkeypatch.setattr(backend, "build", out_of_memory)
    with pytest.raises(OutOfMemoryError):  # issue 20 item 4: one typed error, not a bare MemoryError
        streamrt.build(src, BuildConfig(), tmp_path / "out" / "m.plan", cache_dir=tmp_path / "c")
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "matmul.onnx"]
    assert leftovers == []


def test_plan_keeps_the_source_metadata(tmp_path: Path) -> None:
    import onnx

    from streamrt.testing.models import CATALOGUE

    proto = CATALOGUE["small_cnn"].make()
    onnx.helper.set_model_props(proto, {"names": "{0: 'cat', 1: 'dog'}", "imgsz": "[32, 32]"})
    src = tmp_path / "m.onnx"
    onnx.save(proto, str(src))
    result = streamrt.build(src, BuildConfig(), tmp_path / "m.plan", cache=False)
    assert read_plan(result.path).manifest.source_metadata == {"names": "{0: 'cat', 1: 'dog'}", "imgsz": "[32, 32]"}
