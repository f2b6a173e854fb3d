"""The TensorRT backend's pure logic, on CPU, without TensorRT.

These tests run in CI. Where a function takes the ``tensorrt`` module, a small fake stands in
for it: the fakes check StreamRT's own decisions (flags, tables, messages), not TensorRT's
behaviour, which only ``test_tensorrt.py`` exercises (where TensorRT is installed).
"""

from __future__ import annotations

import dataclasses
import logging
import types
from pathlib import Path
from typing import Any

import pytest

from streamrt.backends.tensorrt import compat
from streamrt.config import BuildConfig
from streamrt.errors import (
    BuildError,
    ConfigError,
    PlanMismatchError,
    ProfileError,
    UnsupportedOperatorError,
)
from streamrt.plan import PlanManifest
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

H200 = {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0", "cuda": "13.0"}


class _Enum:
    """Mimics a pybind11 enum member: has ``.name`` and an ``int()``."""

    def __init__(self, name: str, value: int = 0) -> None:
        self.name = name
        self._value = value

    def __int__(self) -> int:
        return self._value


class _FlagsWithoutExplicitBatch:
    STRONGLY_TYPED = _Enum("STRONGLY_TYPED", 1)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"StreamRT must never read NetworkDefinitionCreationFlag.{name}")


def _fake_trt(version: str, flags: Any = None) -> Any:
    return types.SimpleNamespace(
        __version__=version, NetworkDefinitionCreationFlag=flags or _FlagsWithoutExplicitBatch()
    )


def _manifest(version: str = "10.16.0.72", device: dict[str, Any] | None = None, **facts: Any) -> PlanManifest:
    return PlanManifest(
        backend="tensorrt",
        backend_version=version,
        runtime_versions={"tensorrt": version},
        device=device or H200,
        precision="fp16",
        inputs=(TensorSpec("x", DType.FLOAT32, (-1, 4)),),
        outputs=(TensorSpec("y", DType.FLOAT32, (-1, 2)),),
        profiles=(ShapeProfile({"x": ShapeRange((1, 4), (2, 4), (8, 4))}),),
        source_sha256="ab" * 32,
        source_name="m.onnx",
        build_settings={},
        build_command="streamrt build m.onnx -o m.plan --backend tensorrt",
        created_at="2026-11-30T00:00:00+00:00",
        streamrt_version="0.1.0",
        extra={"tensorrt": facts} if facts else {},
    )


# --- versions and network flags -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [("10.16.0.72", (10, 16, 0)), ("11.1.0", (11, 1, 0)), ("10.8", (10, 8, 0)), ("10.3.0.post1", (10, 3, 0))],
)
def test_parse_version(text: str, want: tuple[int, int, int]) -> None:
    assert compat.parse_version(text) == want


def test_parse_version_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="cannot read a TensorRT version"):
        compat.parse_version("unknown")


def test_network_flags_are_strongly_typed_on_10_and_empty_on_11() -> None:
    assert compat.network_flags(_fake_trt("10.16.0.72")) == 1 << 1
    assert compat.network_flags(_fake_trt("11.1.0.106")) == 0


def test_network_flags_reject_old_tensorrt() -> None:
    with pytest.raises(BuildError, match=r"TensorRT 8\.6\.1 is too old"):
        compat.network_flags(_fake_trt("8.6.1"))


def test_network_flags_without_strong_typing_fail_clearly() -> None:
    with pytest.raises(BuildError, match="no strongly typed networks"):
        compat.network_flags(_fake_trt("10.0.0", types.SimpleNamespace()))


# --- dtype table --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("FLOAT", DType.FLOAT32),
        ("HALF", DType.FLOAT16),
        ("BF16", DType.BFLOAT16),
        ("INT8", DType.INT8),
        ("UINT8", DType.UINT8),
        ("INT32", DType.INT32),
        ("INT64", DType.INT64),
        ("BOOL", DType.BOOL),
    ],
)
def test_dtype_table_round_trips(name: str, dtype: DType) -> None:
    assert compat.dtype_from_trt(_Enum(name)) is dtype
    assert compat.dtype_from_trt(f"DataType.{name}") is dtype
    assert compat.trt_dtype_name(dtype) == name


@pytest.mark.parametrize("dtype", [DType.FLOAT64, DType.INT16])
def test_types_tensorrt_lacks_are_refused(dtype: DType) -> None:
    with pytest.raises(ConfigError, match=f"TensorRT has no {dtype.value} tensors"):
        compat.trt_dtype_name(dtype)


@pytest.mark.parametrize("name", ["FP8", "INT4", "FP4", "E8M0"])
def test_tensorrt_only_types_are_named_in_the_error(name: str) -> None:
    with pytest.raises(ConfigError, match=f"TensorRT data type {name} has no StreamRT equivalent"):
        compat.dtype_from_trt(_Enum(name))


# --- options and profiles -----------------------------------------------------------------------


def test_build_options_defaults_and_values() -> None:
    assert compat.build_options(BuildConfig(backend="tensorrt")) == compat.BuildOptions()
    opts = compat.build_options(
        BuildConfig(
            backend="tensorrt",
            backend_options={
                "hardware_compatibility": "Ampere+",
                "version_compatible": "true",
                "refit": True,
                "timing_cache": "off",
                "cuda_graphs": True,
            },
        )
    )
    assert opts == compat.BuildOptions(True, "ampere_plus", True, "", True)
    assert opts.facts() == {"version_compatible": True, "hardware_compatibility": "ampere_plus", "refit": True}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fp16": True}, r"unknown tensorrt backend options \['fp16'\]"),
        ({"hardware_compatibility": "turing"}, "hardware_compatibility must be one of none, ampere_plus"),
        ({"refit": "maybe"}, "refit must be true or false"),
    ],
)
def test_build_options_reject_bad_values(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compat.build_options(BuildConfig(backend="tensorrt", backend_options=options))


def test_timing_cache_flag_wins_over_the_option(tmp_path: Path) -> None:
    config = BuildConfig(backend="tensorrt", timing_cache=tmp_path / "t.cache", backend_options={"timing_cache": "off"})
    assert compat.build_options(config).timing_cache == str(tmp_path / "t.cache")


def test_timing_cache_path_is_per_version_and_gpu(tmp_path: Path) -> None:
    path = compat.timing_cache_path(tmp_path, "10.16.0.72", H200)
    assert path == tmp_path / "tensorrt" / "timing-10.16.0.72-nvidia-h200-sm90.cache"


def test_profile_shapes_cover_static_and_dynamic_inputs() -> None:
    inputs = (TensorSpec("x", DType.FLOAT32, (-1, 3, 8)), TensorSpec("scale", DType.FLOAT32, (1,)))
    profile = ShapeProfile({"x": ShapeRange((1, 3, 8), (4, 3, 8), (16, 3, 8))})
    assert compat.profile_shapes(profile, inputs) == {
        "x": ((1, 3, 8), (4, 3, 8), (16, 3, 8)),
        "scale": ((1,), (1,), (1,)),
    }


def test_profile_shapes_reject_missing_dynamic_input_and_wrong_rank() -> None:
    inputs = (TensorSpec("x", DType.FLOAT32, (-1, 4)),)
    with pytest.raises(ProfileError, match="no range for dynamic input 'x'"):
        compat.profile_shapes(ShapeProfile({}), inputs)
    with pytest.raises(ProfileError, match="min shape 1 has rank 1"):
        compat.profile_shapes(ShapeProfile({"x": ShapeRange((1,), (2, 4), (8, 4))}), inputs)


# --- plan compatibility -------------------------------------------------------------------------


def test_same_version_and_gpu_loads() -> None:
    compat.check_plan(_manifest(), "10.16.0.72", H200)


def test_other_tensorrt_version_is_refused_with_the_standard_message() -> None:
    with pytest.raises(PlanMismatchError) as info:
        compat.check_plan(_manifest(), "10.16.1.11", H200)
    text = str(info.value)
    assert "plan was built for tensorrt version='10.16.0.72'" in text
    assert "this machine has tensorrt version='10.16.1.11'" in text
    assert "rebuild it here: streamrt build m.onnx" in text


@pytest.mark.parametrize(
    ("plan", "runtime", "ok"),
    [
        ("10.3.0", "10.16.0", True),
        ("10.16.0", "11.1.0", True),
        ("11.0.0", "11.1.0", True),
        ("8.6.1", "10.4.0", True),
        ("11.1.0", "10.16.0", False),
        ("10.16.0", "10.3.0", False),
        ("8.6.1", "11.1.0", False),
        ("10.16.0", "12.0.0", False),
    ],
)
def test_version_compatible_rule(plan: str, runtime: str, ok: bool) -> None:
    assert compat.version_can_run(plan, runtime) is ok
    manifest = _manifest(plan, version_compatible=True)
    if ok:
        compat.check_plan(manifest, runtime, H200)
    else:
        with pytest.raises(PlanMismatchError, match="version-compatible plan"):
            compat.check_plan(manifest, runtime, H200)


def test_other_gpu_is_refused_unless_hardware_compatible() -> None:
    h100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    a100 = {"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    t4 = {"kind": "cuda", "name": "Tesla T4", "compute_capability": "7.5"}
    with pytest.raises(PlanMismatchError, match=r"device\.name"):
        compat.check_plan(_manifest(), "10.16.0.72", h100)
    compat.check_plan(_manifest(hardware_compatibility="same_compute_capability"), "10.16.0.72", h100)
    with pytest.raises(PlanMismatchError, match=r"device\.compute_capability"):
        compat.check_plan(_manifest(hardware_compatibility="same_compute_capability"), "10.16.0.72", a100)
    compat.check_plan(_manifest(hardware_compatibility="ampere_plus"), "10.16.0.72", a100)
    with pytest.raises(PlanMismatchError, match=r"Ampere or newer.*'>= 8.0 \(built on 9.0\)'.*'7.5'"):
        compat.check_plan(_manifest(hardware_compatibility="ampere_plus"), "10.16.0.72", t4)


def test_machine_without_gpu_is_refused() -> None:
    with pytest.raises(PlanMismatchError, match=r"device\.kind"):
        compat.check_plan(_manifest(), "10.16.0.72", None)


# --- parser and build errors --------------------------------------------------------------------


class _FakeParserError:
    """The methods of ``trt.ParserError`` that StreamRT reads."""

    def __init__(self, code: str, desc: str, node: int, name: str, op: str) -> None:
        self._fields = (_Enum(code), desc, node, name, op)

    def code(self) -> Any:
        return self._fields[0]

    def desc(self) -> str:
        return self._fields[1]

    def node(self) -> int:
        return self._fields[2]

    def node_name(self) -> str:
        return self._fields[3]

    def node_operator(self) -> str:
        return self._fields[4]


def test_unsupported_node_becomes_unsupported_operator_error() -> None:
    record = compat.ParserErrorRecord.from_trt(
        _FakeParserError("UNSUPPORTED_NODE", "No importer registered for op: Frobnicate", 7, "frob_1", "Frobnicate")
    )
    error = compat.parser_failure([record], opset=17, model_name="m.onnx")
    assert isinstance(error, UnsupportedOperatorError)
    assert (error.node, error.op_type, error.opset) == ("frob_1", "Frobnicate", 17)
    assert "node 'frob_1' uses operator Frobnicate (opset 17) which backend 'tensorrt' cannot run" in str(error)
    assert "node 7 'frob_1' (Frobnicate): UNSUPPORTED_NODE: No importer registered for op: Frobnicate" in str(error)


def test_other_parser_errors_become_build_errors_listing_a_few() -> None:
    records = [compat.ParserErrorRecord("INVALID_GRAPH", f"problem {i}", i, f"n{i}", "Reshape") for i in range(6)]
    error = compat.parser_failure(records, opset=17, model_name="m.onnx")
    assert type(error) is BuildError
    assert "TensorRT's ONNX parser failed on m.onnx: node 0 'n0' (Reshape): INVALID_GRAPH: problem 0" in str(error)
    assert "; and 2 more" in str(error)
    graph_level = compat.ParserErrorRecord("MODEL_DESERIALIZE_FAILED", "bad protobuf")
    assert "graph: MODEL_DESERIALIZE_FAILED: bad protobuf" in str(
        compat.parser_failure([graph_level], opset=17, model_name="m")
    )
    assert "without reporting an error" in str(compat.parser_failure([], opset=17, model_name="m"))


@pytest.mark.parametrize(
    ("message", "hint"),
    [
        ("Requested amount of GPU memory (68719476736 bytes) could not be allocated", "lower the workspace"),
        ("[optimizer.cpp::computeCosts] Could not find any implementation for node conv1", "found no kernel"),
        ("Specified optimization profiles must satisfy MIN<=OPT<=MAX.", "a shape profile does not fit"),
        ("Something else went wrong.", "rerun with --verbose"),
    ],
)
def test_build_failure_hints(message: str, hint: str) -> None:
    error = compat.build_failure([("WARNING", "noise"), ("ERROR", message)], what="m.onnx (1 profile)")
    assert f"TensorRT could not build m.onnx (1 profile): {message[:40]}" in str(error)
    assert hint in str(error.hint)


def test_build_failure_without_errors_shows_warnings() -> None:
    error = compat.build_failure([("WARNING", "skipping tactic 3: out of memory")], what="m")
    assert "skipping tactic 3" in str(error) and "lower the workspace" in str(error)


# --- logging bridge -----------------------------------------------------------------------------


def test_severity_levels() -> None:
    assert compat.python_level(_Enum("INTERNAL_ERROR")) == logging.CRITICAL
    assert compat.python_level("Severity.ERROR") == logging.ERROR
    assert compat.python_level(_Enum("WARNING")) == logging.WARNING
    assert compat.python_level(_Enum("INFO")) == logging.DEBUG
    assert compat.python_level(_Enum("VERBOSE")) == logging.DEBUG


def test_log_capture_collects_only_inside_the_block() -> None:
    logs = compat.LogCapture(keep=2)
    logs.record(_Enum("ERROR"), "before")
    with logs.capture() as got:
        logs.record(_Enum("INFO"), "chatter")
        logs.record(_Enum("WARNING"), "careful")
        logs.record(_Enum("ERROR"), "broken")
    logs.record(_Enum("ERROR"), "after")
    assert got == [("WARNING", "careful"), ("ERROR", "broken")]
    assert logs.last_errors() == "broken | after"


def test_logger_bridge_forwards_to_logging(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    class _ILogger:
        def __init__(self) -> None:
            pass

    monkeypatch.setattr(compat, "_LOGGER", None)
    bridge = compat.get_logger(types.SimpleNamespace(ILogger=_ILogger))
    assert compat.get_logger(types.SimpleNamespace(ILogger=_ILogger)) is bridge
    with caplog.at_level(logging.DEBUG, logger="streamrt.backends.tensorrt.library"):
        bridge.log(_Enum("WARNING"), "workspace too small")
        bridge.log(_Enum("VERBOSE"), "tactic 12")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "workspace too small"),
        (logging.DEBUG, "tactic 12"),
    ]


# --- progress -----------------------------------------------------------------------------------


def test_build_progress_reports_outer_phases_and_throttles_steps() -> None:
    lines: list[str] = []
    now = [0.0]
    progress = compat.BuildProgress(lines.append, interval=1.0, clock=lambda: now[0])
    progress.phase_start("Building engine", None, 3)
    progress.phase_start("Tactic selection", "Building engine", 100)
    progress.phase_start("Timing conv1", "Tactic selection", 5)
    for step in range(100):
        now[0] += 0.25
        assert progress.step_complete("Tactic selection", step)
        progress.step_complete("Timing conv1", step % 5)
    progress.phase_finish("Timing conv1")
    progress.phase_finish("Tactic selection")
    progress.phase_finish("Building engine")
    assert lines[0] == "tensorrt: Building engine (3 steps)"
    assert lines[1] == "tensorrt: Tactic selection (100 steps)"
    steps = [line for line in lines if line.startswith("tensorrt: Tactic selection ") and "/" in line]
    assert 20 <= len(steps) <= 26  # every ~1 s of 25 s
    assert not any("Timing conv1" in line for line in lines)
    assert lines[-1] == "tensorrt: Building engine done in 25.0 s"


def test_build_progress_cancels_when_the_report_raises() -> None:
    def report(line: str) -> None:
        if "Tactic" in line:
            raise KeyboardInterrupt

    progress = compat.BuildProgress(report, interval=0.0)
    progress.phase_start("Building engine", None, 2)
    assert progress.step_complete("Building engine", 0)
    progress.phase_start("Tactic selection", "Building engine", 4)
    assert isinstance(progress.error, KeyboardInterrupt)
    assert progress.step_complete("Building engine", 1) is False


# --- inspector ----------------------------------------------------------------------------------


def test_inspector_json_from_10x_and_11x_has_one_shape() -> None:
    layer = {"Name": "conv1 + relu1", "LayerType": "CaskConvolution", "TacticName": "sm90_xmma"}
    v10 = {"Layers": [layer], "Bindings": ["x", "y"]}
    v11 = {"Layers": [layer], "I/O Tensors": ["x", "y"]}
    for data in (v10, v11):
        got = compat.normalize_inspector(data)
        assert got["layers"] == [{"name": "conv1 + relu1", "type": "CaskConvolution", "details": layer}]
        assert got["io_tensors"] == ["x", "y"]
    names_only = compat.normalize_inspector({"Layers": ["conv1 + relu1", "gemm"]})
    assert [(r["name"], r["type"]) for r in names_only["layers"]] == [("conv1 + relu1", "?"), ("gemm", "?")]
    assert compat.normalize_inspector(["a"])["layers"][0]["name"] == "a"
    with pytest.raises(ConfigError):
        compat.normalize_inspector("not json")


def test_build_options_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        compat.BuildOptions().refit = True  # type: ignore[misc]
