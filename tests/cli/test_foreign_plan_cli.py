"""A TensorRT plan on a machine without TensorRT: `inspect` shows it, `bench`/`profile` say what is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from streamrt.cli.main import main
from streamrt.errors import MissingDependencyError, PlanRequirementsError
from streamrt.plan import PlanManifest, write_plan
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                                reason="TensorRT is installed: the plan's backend is there")


def _cuda_here() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture()
def trt_plan(tmp_path: Path) -> Path:
    """A real plan container as a TensorRT build on the H200 writes it, with a stand-in payload."""
    manifest = PlanManifest(
        backend="tensorrt",
        backend_version="10.8.0",
        runtime_versions={"tensorrt": "10.8.0", "torch": "2.11.0+cu130", "cuda": "13.0"},
        device={"kind": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0", "cuda": "13.0"},
        precision="fp16",
        inputs=(TensorSpec("x", DType.FLOAT32, (-1, 3, 32, 32)),),
        outputs=(TensorSpec("logits", DType.FLOAT32, (-1, 10)),),
        profiles=(ShapeProfile({"x": ShapeRange((1, 3, 32, 32), (8, 3, 32, 32), (32, 3, 32, 32))}),),
        source_sha256="cd" * 32,
        source_name="cnn.onnx",
        build_settings={"config": {"precision": "fp16"}},
        build_command="streamrt build /models/cnn.onnx -o /build/cnn.plan --backend tensorrt --precision fp16",
        created_at="2026-12-01T00:00:00+00:00",
        streamrt_version="0.1.0",
    )
    return write_plan(tmp_path / "cnn_trt.plan", manifest, b"not a real engine: never deserialized here")


def test_inspect_shows_the_manifest_without_tensorrt(trt_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(trt_plan)]) == 0
    out = capsys.readouterr().out
    assert "backend      tensorrt 10.8.0" in out and "compute_capability=9.0" in out
    assert "logits" in out and "min 1x3x32x32" in out
    assert "cannot run here:" in out and "'tensorrt' Python package" in out


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_running_says_what_is_missing_and_what_the_plan_needs(
    trt_plan: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, str(trt_plan)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{trt_plan} needs the tensorrt backend (tensorrt 10.8.0, cuda 13.0, torch 2.11.0+cu130)" in line
    assert "NVIDIA H200 it was built on (compute capability 9.0, CUDA 13.0)" in line
    assert "this machine lacks the 'tensorrt' Python package" in line
    assert ("and a CUDA device" in line) is not _cuda_here()
    assert f"rebuild for this machine: streamrt build /models/cnn.onnx -o {trt_plan} --backend onnxruntime" in line


def test_load_error_is_still_a_missing_dependency(trt_plan: Path) -> None:
    import streamrt

    with pytest.raises(PlanRequirementsError) as info:
        streamrt.load(trt_plan)
    assert isinstance(info.value, MissingDependencyError) and info.value.extra == "tensorrt"
