"""ONNX Runtime backend on the model catalogue, plus its input checks and errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file, save, unsupported_op_model
from streamrt.config import BuildConfig
from streamrt.errors import (
    DTypeMismatchError,
    InferenceError,
    MissingInputError,
    PlanMismatchError,
    ShapeError,
    UnknownInputError,
    UnsupportedOperatorError,
)
from streamrt.plan import read_plan, write_plan
from streamrt.testing.models import CATALOGUE


def _build(name: str, tmp_path: Path) -> tuple[streamrt.Engine, Path]:
    model = CATALOGUE[name]
    result = streamrt.build(
        catalogue_file(name, tmp_path),
        BuildConfig(profiles=model.profiles),
        tmp_path / f"{name}.plan",
        cache_dir=tmp_path / "cache",
    )
    return streamrt.load(result.path), result.path


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue_matches_numpy_reference(name: str, tmp_path: Path) -> None:
    model = CATALOGUE[name]
    engine, _ = _build(name, tmp_path)
    ctx = engine.create_context()
    rng = np.random.default_rng()
    for batch in (1, 3) if model.profiles else (1,):
        inputs = model.inputs(rng, batch)
        got = ctx.infer(inputs)
        want = model.reference(model.make(), inputs)
        assert set(got) == set(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=model.rtol, atol=model.atol)


def test_shape_outside_profile_names_input_and_range(tmp_path: Path) -> None:
    engine, _ = _build("matmul", tmp_path)
    x = np.random.default_rng().standard_normal((17, 32)).astype(np.float32)
    with pytest.raises(ShapeError, match=r"input 'x' has shape 17x32, outside every profile.*max 16x32"):
        engine.create_context().infer({"x": x})


def test_input_checks(tmp_path: Path) -> None:
    engine, _ = _build("two_io", tmp_path)
    ctx = engine.create_context()
    a = np.ones((2, 10), np.float32)
    with pytest.raises(MissingInputError, match="missing input 'b'"):
        ctx.infer({"a": a})
    with pytest.raises(UnknownInputError, match="unknown input 'c'"):
        ctx.infer({"a": a, "b": a, "c": a})
    with pytest.raises(DTypeMismatchError, match="input 'b' has dtype float64, the engine expects float32"):
        ctx.infer({"a": a, "b": a.astype(np.float64)})
    with pytest.raises(ShapeError, match="rank"):
        ctx.infer({"a": a, "b": a[0]})


def test_input_checks_are_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    engine, _ = _build("two_io", tmp_path)
    ctx = engine.create_context()
    inputs = CATALOGUE["two_io"].inputs(np.random.default_rng(), 3)
    wrong = {**inputs, "b": inputs["b"].astype(np.float64)}
    with pytest.raises(DTypeMismatchError):
        ctx.infer(wrong)
    with pytest.raises(DTypeMismatchError):
        ctx.infer(wrong, check_inputs=True)
    with pytest.raises(InferenceError, match="onnxruntime failed"):  # skipped: ONNX Runtime itself refuses it
        ctx.infer(wrong, check_inputs=False)
    checked, unchecked = ctx.infer(inputs), ctx.infer(inputs, check_inputs=False)
    for name, value in checked.items():
        np.testing.assert_array_equal(unchecked[name], value)
    matmul, _ = _build("matmul", tmp_path)
    outside = np.random.default_rng().standard_normal((17, 32)).astype(np.float32)
    with pytest.raises(ShapeError, match="outside every profile"):  # the profile is still chosen by shape
        matmul.create_context().infer({"x": outside}, check_inputs=False)


def test_unsupported_operator_names_node_op_and_opset(tmp_path: Path) -> None:
    path = save(unsupported_op_model(), tmp_path / "bf16.onnx")
    with pytest.raises(UnsupportedOperatorError, match=r"node 'sqrt_bf16' uses operator Sqrt \(opset 13\)"):
        streamrt.build(path, BuildConfig(), tmp_path / "bf16.plan", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "bf16.plan").exists()


@pytest.mark.parametrize(
    ("field", "value"), [("backend_version", "0.0.1"), ("device", {"kind": "cpu", "arch": "riscv"})]
)
def test_foreign_plan_is_refused_with_rebuild_command(tmp_path: Path, field: str, value: object) -> None:
    _, path = _build("matmul", tmp_path)
    plan = read_plan(path)
    foreign = dataclasses.replace(plan.manifest, **{field: value})
    write_plan(path, foreign, plan.payload)
    with pytest.raises(PlanMismatchError) as info:
        streamrt.load(path)
    assert "streamrt build" in str(info.value) and str(path) in str(info.value)


def test_per_node_profile(tmp_path: Path) -> None:
    engine, _ = _build("small_cnn", tmp_path)
    x = np.random.default_rng().standard_normal((2, 3, 32, 32)).astype(np.float32)
    rows = engine.profile_layers({"x": x}, iterations=3)
    assert rows and all(r.calls == 3 and r.total_ms >= 0 for r in rows)
    assert {r.op_type for r in rows} >= {"Conv", "Gemm"}


def test_spinning_option_is_recorded_and_reaches_the_session(tmp_path: Path) -> None:
    """``--option spinning=false``: idle ONNX Runtime pool threads sleep. In a server running batches beside front
    ends on the same cores, spinning cost ~1.8x the engine's CPU per 602 KB request and 15-30% of the throughput
    (docs/benchmarks/2026-12-05-ort-spinning-cpu.md). Absent, the plan keeps ONNX Runtime's default (spinning)."""
    from streamrt.backends.onnxruntime.session import session_options
    from streamrt.errors import ConfigError

    model = CATALOGUE["conv_bn_relu"]
    source = catalogue_file("conv_bn_relu", tmp_path)
    quiet = streamrt.build(source, BuildConfig(profiles=model.profiles, backend_options={"spinning": False}),
                           tmp_path / "quiet.plan", cache_dir=tmp_path / "cache")
    settings = read_plan(quiet.path).manifest.build_settings["backend"]
    assert settings["spinning"] is False
    options = session_options(settings, 0)
    assert [options.get_session_config_entry(f"session.{k}.allow_spinning") for k in ("intra_op", "inter_op")] == [
        "0", "0"]
    default = streamrt.build(source, BuildConfig(profiles=model.profiles), tmp_path / "default.plan",
                             cache_dir=tmp_path / "cache")
    assert "spinning" not in read_plan(default.path).manifest.build_settings["backend"]  # old plans read the same
    engine = streamrt.load(quiet.path)
    x = {i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape],
                                                          dtype=np.float32) for i in engine.inputs}
    np.testing.assert_allclose(engine.create_context().infer(x)[engine.outputs[0].name],
                               streamrt.load(default.path).create_context().infer(x)[engine.outputs[0].name])
    with pytest.raises(ConfigError, match="spinning must be true or false"):
        streamrt.build(source, BuildConfig(profiles=model.profiles, backend_options={"spinning": "no"}),
                       tmp_path / "bad.plan", cache_dir=tmp_path / "cache")


ORT_IN_A_NARROW_MASK = """
import os, sys
cpu = int(sys.argv[1])
os.sched_setaffinity(0, {cpu})  # as taskset would, before any other thread starts
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
from streamrt.backends.onnxruntime.session import session_options
graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
session = ort.InferenceSession(model.SerializeToString(), session_options({}, 99), providers=["CPUExecutionProvider"])
session.run(None, {"x": np.random.default_rng().standard_normal((256, 256)).astype(np.float32)})
masks = set()
for t in os.listdir(f"/proc/{os.getpid()}/task"):
    try:
        masks.add(tuple(sorted(os.sched_getaffinity(int(t)))))
    except ProcessLookupError:  # the thread exited meanwhile
        pass
print(sorted(masks))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_default_threads_stay_inside_the_process_cpu_mask() -> None:
    """ONNX Runtime's default thread count pins each pool thread to a core of the machine, outside a narrowed
    process mask too (found by `streamrt serve --engine-cpus`): a confined process gets an explicit count."""
    cpu = min(os.sched_getaffinity(0))  # ONNX Runtime's own pinning leaves the first core to the caller's thread
    out = subprocess.run([sys.executable, "-c", ORT_IN_A_NARROW_MASK, str(cpu)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             filter(None, [str(Path(__file__).resolve().parents[2] / "src"),
                                           os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str([(cpu,)])
