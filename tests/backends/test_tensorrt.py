"""TensorRT backend on a GPU: catalogue vs references, profiles, plan checks, contexts, profiler.

These tests run wherever ``import tensorrt`` works and torch sees a CUDA GPU; ``conftest.py``
skips them elsewhere, with the reason. TensorRT cannot be installed in this repository's
environment, so **they have not been run here**: they are written to be run on a machine with
TensorRT 10.x or 11.x (``pip install 'streamrt[tensorrt]'`` from NVIDIA's index).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import streamrt
from helpers import catalogue_file, save
from streamrt.config import BuildConfig
from streamrt.errors import InferenceError, PlanFormatError, PlanMismatchError, ShapeError, UnsupportedOperatorError
from streamrt.plan import read_plan, write_plan
from streamrt.testing.models import CATALOGUE
from streamrt.types import ShapeProfile, ShapeRange

pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu]

# fp32 plans are built with TF32 off, so TensorRT's kernels are IEEE fp32 like the CPU references.
RTOL = ATOL = 1e-3


def _build(source: Path, out: Path, **config: Any) -> Path:
    options = {"timing_cache": str(out.parent / "timing.cache"), **config.pop("backend_options", {})}
    cfg = BuildConfig(backend="tensorrt", backend_options=options, **config)
    return streamrt.build(source, cfg, out, cache=False).path


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("trt")
    return {
        name: _build(catalogue_file(name, tmp), tmp / f"{name}.plan", profiles=model.profiles)
        for name, model in CATALOGUE.items()
    }


def _cuda(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}


def _stream(name: str = "trt") -> Any:
    from streamrt.device import get_device

    return get_device("cuda").stream(name)


def _batches(name: str) -> list[int]:
    return [1, 3, 16] if CATALOGUE[name].profiles else [1]


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue_matches_numpy_reference(plans: dict[str, Path], name: str) -> None:
    import torch

    model = CATALOGUE[name]
    engine = streamrt.load(plans[name])
    assert engine.device_kind == "cuda"
    ctx = engine.create_context()
    stream = _stream()
    rng = np.random.default_rng()
    for batch in _batches(name):
        inputs = model.inputs(rng, batch)
        got = ctx.infer(_cuda(inputs), stream)
        stream.synchronize()
        want = model.reference(model.make(), inputs)
        assert set(got) == set(want)
        for key, ref in want.items():
            assert isinstance(got[key], torch.Tensor) and got[key].is_cuda
            np.testing.assert_allclose(got[key].cpu().numpy(), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue_matches_onnxruntime(plans: dict[str, Path], name: str, tmp_path: Path) -> None:
    model = CATALOGUE[name]
    ort_plan = streamrt.build(
        catalogue_file(name, tmp_path), BuildConfig(profiles=model.profiles), tmp_path / "ort.plan", cache=False
    ).path
    ort_ctx = streamrt.load(ort_plan).create_context()
    trt_ctx = streamrt.load(plans[name]).create_context()
    rng = np.random.default_rng()
    for batch in _batches(name):
        inputs = model.inputs(rng, batch)
        want = ort_ctx.infer(inputs)
        got = trt_ctx.infer(inputs)  # NumPy in, NumPy out
        for key in want:
            assert isinstance(got[key], np.ndarray)
            np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL)


def test_plan_loads_in_a_fresh_process(plans: dict[str, Path]) -> None:
    code = (
        "import sys, numpy as np, streamrt\n"
        "e = streamrt.load(sys.argv[1])\n"
        "y = e.create_context().infer({'x': np.ones((2, 32), np.float32)})['y']\n"
        "print('ok', y.shape, type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(plans["matmul"])], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok (2, 16) TensorRTEngine" in out.stdout


def test_manifest_records_version_gpu_and_flags(plans: dict[str, Path]) -> None:
    import tensorrt as trt
    import torch

    manifest = read_plan(plans["matmul"]).manifest
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert manifest.backend_version == trt.__version__
    assert manifest.device["name"] == props.name
    assert manifest.device["compute_capability"] == f"{props.major}.{props.minor}"
    assert manifest.extra["tensorrt"] == {"version_compatible": False, "hardware_compatibility": "none", "refit": False}
    assert manifest.build_settings["backend"]["strongly_typed"] is True
    assert manifest.build_settings["backend"]["tf32"] is False


def test_tf32_level_and_timing_cache_flags(tmp_path: Path) -> None:
    cache = tmp_path / "flag.cache"
    cfg = BuildConfig(backend="tensorrt", tf32=True, optimization_level=1, timing_cache=cache,
                      profiles=CATALOGUE["matmul"].profiles)
    result = streamrt.build(catalogue_file("matmul", tmp_path), cfg, tmp_path / "tf32.plan", cache=False)
    settings = result.manifest.build_settings["backend"]
    assert settings["tf32"] is True and settings["builder_optimization_level"] == 1
    assert settings["timing_cache"] == str(cache) and cache.is_file() and result.manifest.precision == "tf32"


def test_dynamic_shapes_across_profiles(tmp_path: Path) -> None:
    profiles = (
        ShapeProfile({"x": ShapeRange((1, 32), (2, 32), (4, 32))}),
        ShapeProfile({"x": ShapeRange((5, 32), (8, 32), (16, 32))}),
    )
    plan = _build(catalogue_file("matmul", tmp_path), tmp_path / "two.plan", profiles=profiles)
    model = CATALOGUE["matmul"]
    ctx = streamrt.load(plan).create_context()
    stream = _stream()
    rng = np.random.default_rng()
    for batch, profile in ((3, 0), (12, 1), (2, 0), (16, 1), (16, 1)):
        inputs = model.inputs(rng, batch)
        got = ctx.infer(_cuda(inputs), stream)["y"]
        assert ctx.active_profile == profile
        stream.synchronize()
        np.testing.assert_allclose(got.cpu().numpy(), model.reference(model.make(), inputs)["y"], rtol=RTOL, atol=ATOL)


def test_shape_outside_every_profile_is_rejected_before_enqueue(plans: dict[str, Path]) -> None:
    import torch

    ctx = streamrt.load(plans["matmul"]).create_context()
    with pytest.raises(ShapeError, match=r"input 'x' has shape 17x32, outside every profile.*max 16x32"):
        ctx.infer({"x": torch.randn(17, 32, device="cuda")})
    assert ctx.active_profile is None  # TensorRT was never asked
    assert ctx.infer({"x": torch.randn(16, 32, device="cuda")})["y"].shape == (16, 16)


def test_plan_from_another_version_or_gpu_fails_before_deserializing(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = read_plan(plans["matmul"])
    old = dataclasses.replace(plan.manifest, backend_version="9.9.9.9")
    write_plan(tmp_path / "old.plan", old, b"never handed to TensorRT")
    with pytest.raises(PlanMismatchError, match=r"tensorrt version='9\.9\.9\.9'.*rebuild it here: streamrt build"):
        streamrt.load(tmp_path / "old.plan")
    other_gpu = dataclasses.replace(plan.manifest, device={**plan.manifest.device, "name": "Some Other GPU"})
    write_plan(tmp_path / "gpu.plan", other_gpu, b"never handed to TensorRT")
    with pytest.raises(PlanMismatchError, match=r"device\.name='Some Other GPU'"):
        streamrt.load(tmp_path / "gpu.plan")


def test_plan_tensorrt_cannot_deserialize_is_a_plan_error(plans: dict[str, Path], tmp_path: Path) -> None:
    plan = read_plan(plans["matmul"])
    write_plan(tmp_path / "bad.plan", plan.manifest, plan.payload[: len(plan.payload) // 2])
    with pytest.raises(PlanFormatError, match="could not deserialize"):
        streamrt.load(tmp_path / "bad.plan")


def test_profiler_reports_every_layer_per_iteration(plans: dict[str, Path]) -> None:
    model = CATALOGUE["small_cnn"]
    engine = streamrt.load(plans["small_cnn"])
    rows = engine.profile_layers(_cuda(model.inputs(np.random.default_rng(), 4)), iterations=5)
    assert rows and all(r.calls % 5 == 0 and r.total_ms >= 0 for r in rows)
    assert rows == sorted(rows, key=lambda r: r.total_ms, reverse=True)
    layer_names = {layer["name"] for layer in engine.inspect_layers()["layers"]}
    assert {r.name for r in rows} & layer_names


def test_inspect_layers_has_detailed_layers(plans: dict[str, Path]) -> None:
    info = streamrt.load(plans["small_cnn"]).inspect_layers()
    assert info["profiling_verbosity"] == "DETAILED"
    assert info["layers"] and all(layer["type"] != "?" for layer in info["layers"])
    assert "x" in str(info["io_tensors"]) and "logits" in str(info["io_tensors"])


def test_cuda_graph_matches_plain_runs_and_recaptures_on_shape_change(plans: dict[str, Path]) -> None:
    import torch

    engine = streamrt.load(plans["small_cnn"])
    plain, graphed = engine.create_context(), engine.create_context(cuda_graph=True)
    stream = _stream()
    results = []
    for batch in (4, 4, 2, 2, 4):
        x = torch.randn(batch, 3, 32, 32, device="cuda")
        want = plain.infer({"x": x}, stream)["logits"]
        got = graphed.infer({"x": x}, stream)["logits"]
        results.append((got, want))
    stream.synchronize()
    for got, want in results:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_infer_into_writes_every_element_of_poisoned_outputs(plans: dict[str, Path]) -> None:
    import torch

    model = CATALOGUE["two_io"]
    inputs = model.inputs(np.random.default_rng(), 5)
    for cuda_graph in (False, True):
        ctx = streamrt.load(plans["two_io"]).create_context(cuda_graph=cuda_graph)
        outs = {name: torch.full((5, 10), float("nan"), device="cuda") for name in ("sum", "probs")}
        stream = _stream()
        got = ctx.infer_into(_cuda(inputs), outs, stream)
        stream.synchronize()
        assert got["sum"] is outs["sum"]
        for key, ref in model.reference(model.make(), inputs).items():
            np.testing.assert_allclose(outs[key].cpu().numpy(), ref, rtol=RTOL, atol=ATOL)
        with pytest.raises(InferenceError, match="output 'sum' must be"):
            ctx.infer_into(_cuda(inputs), {**outs, "sum": torch.empty(4, 10, device="cuda")}, stream)


def test_input_consumed_event_completes(plans: dict[str, Path]) -> None:
    import torch

    ctx = streamrt.load(plans["matmul"]).create_context()
    assert ctx.input_consumed is None
    stream = _stream()
    ctx.infer({"x": torch.randn(8, 32, device="cuda")}, stream)
    event = ctx.input_consumed
    assert event is not None and event.is_cuda
    stream.synchronize()
    assert event.query()


def test_two_contexts_on_two_streams(plans: dict[str, Path]) -> None:
    model = CATALOGUE["small_cnn"]
    engine = streamrt.load(plans["small_cnn"])
    rng = np.random.default_rng()
    work = [(engine.create_context(), _stream(f"s{i}"), model.inputs(rng, 2 + i)) for i in range(2)]
    outs = [ctx.infer(_cuda(inputs), stream)["logits"] for ctx, stream, inputs in work]
    for (_, stream, inputs), got in zip(work, outs, strict=True):
        stream.synchronize()
        want = model.reference(model.make(), inputs)["logits"]
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=RTOL, atol=ATOL)


def test_caller_on_the_default_stream(plans: dict[str, Path]) -> None:
    import torch

    model = CATALOGUE["matmul"]
    inputs = model.inputs(np.random.default_rng(), 4)
    got = streamrt.load(plans["matmul"]).create_context().infer(_cuda(inputs))["y"]
    torch.cuda.current_stream().synchronize()
    np.testing.assert_allclose(got.cpu().numpy(), model.reference(model.make(), inputs)["y"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_steady_state_has_no_host_sync(plans: dict[str, Path], cuda_graph: bool) -> None:
    import torch

    ctx = streamrt.load(plans["small_cnn"]).create_context(cuda_graph=cuda_graph)
    stream = _stream()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    ctx.infer({"x": x}, stream)  # warm-up (and capture)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            ctx.infer({"x": x}, stream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def _nonzero_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["idx"], name="nonzero")],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, "K"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_data_dependent_output_through_the_output_allocator(tmp_path: Path) -> None:
    profiles = (ShapeProfile({"x": ShapeRange((1, 8), (4, 8), (8, 8))}),)
    plan = _build(save(_nonzero_model(), tmp_path / "nz.onnx"), tmp_path / "nz.plan", profiles=profiles)
    rng = np.random.default_rng()
    for cuda_graph in (False, True):  # graphs fall back to plain enqueues for data-dependent shapes
        ctx = streamrt.load(plan).create_context(cuda_graph=cuda_graph)
        for batch in (3, 8, 1):
            x = np.where(rng.random((batch, 8)) < 0.5, 0.0, rng.standard_normal((batch, 8))).astype(np.float32)
            got = ctx.infer({"x": x})["idx"]
            np.testing.assert_array_equal(got, np.stack(np.nonzero(x)))


def test_unsupported_operator_names_the_node(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob_1", domain="com.streamrt.test")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.streamrt.test", 1)]
    )
    model.ir_version = 8
    path = save(model, tmp_path / "custom.onnx")
    with pytest.raises(UnsupportedOperatorError, match=r"node 'frob_1' uses operator Frobnicate .* backend 'tensorrt'"):
        _build(path, tmp_path / "custom.plan")
    assert not (tmp_path / "custom.plan").exists()


def test_fp16_plan_gets_its_types_from_the_graph(tmp_path: Path) -> None:
    model = CATALOGUE["small_cnn"]
    plan = _build(
        catalogue_file("small_cnn", tmp_path), tmp_path / "fp16.plan", profiles=model.profiles, precision="fp16"
    )
    ctx = streamrt.load(plan).create_context()
    inputs = model.inputs(np.random.default_rng(), 4)
    got = ctx.infer(inputs)["logits"]  # keep_io_types: float32 in and out
    want = model.reference(model.make(), inputs)["logits"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * float(np.abs(want).max()))


def test_timing_cache_is_saved_and_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = catalogue_file("matmul", tmp_path)
    profiles = CATALOGUE["matmul"].profiles
    cache = tmp_path / "shared.cache"
    lines: list[str] = []
    config = BuildConfig(backend="tensorrt", profiles=profiles, backend_options={"timing_cache": str(cache)})
    with caplog.at_level(logging.DEBUG, logger="streamrt.backends.tensorrt.library"):
        streamrt.build(source, config, tmp_path / "a.plan", cache=False, progress=lines.append)
    assert cache.is_file() and cache.stat().st_size > 0
    assert any(r.name == "streamrt.backends.tensorrt.library" for r in caplog.records)  # TensorRT's log, bridged
    assert any(line.startswith("tensorrt: ") for line in lines)  # IProgressMonitor phases
    lines.clear()
    streamrt.build(source, config, tmp_path / "b.plan", cache=False, progress=lines.append)
    assert any(line.startswith(f"timing cache {cache}") for line in lines)
