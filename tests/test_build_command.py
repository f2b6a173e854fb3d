"""A plan's rebuild command gives its config back (issue 25 item 5).

``build_command`` turns a config into ``streamrt build`` flags from the CLI's option table
(:mod:`streamrt.building.flags`); the CLI's own parser must read those flags back into the same
config. Each row of the table is checked with a non-default value of its field. Before,
``build_command`` was a hand-written second copy of the table that had lost ``--no-keep-io-types``,
``--fp32-ops``, ``--calib-samples``, ``--per-tensor`` and the ``--calib-size/mean/std`` flags, so a
plan built with them printed a rebuild command that built something else.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import pytest

from streamrt.building.builder import build_command
from streamrt.building.flags import BUILD_OPTIONS, CALIBRATION_OPTIONS, PREPROCESS_OPTIONS, SHAPE_OPTIONS
from streamrt.cli.common import config_from_args
from streamrt.cli.main import _parser
from streamrt.config import BuildConfig, CalibrationConfig, CalibrationMethod, ImagePreprocess
from streamrt.onnx.profiles import parse_profiles

PROFILES = parse_profiles(["x:1x3x32x32", "x:8x3x64x64"], ["x:4x3x32x32", "x:8x3x64x64"],
                          ["x:8x3x32x32", "x:16x3x64x64"], ["x:1x1x32x32", "x:1x1x32x32"])
CALIBRATION = CalibrationConfig(data=Path("/data/calib"))

# One non-default value per field of every row of the table (int8 needs calibration data).
BUILD_VALUES: dict[str, Any] = {
    "backend": "torch_inductor",
    "precision": "fp16",
    "optimization_level": 5,
    "tf32": True,
    "timing_cache": Path("/caches/timing"),
    "build_budget_s": None,
    "memory_limit_mb": 2048,
    "keep_io_types": False,
    "fp32_ops": ("Softmax", "LayerNormalization"),
    "backend_options": {"threads": 4, "providers": ["cuda"], "device": "cpu", "mode": "4"},
    "verify_shapes": False,
    "sample_inputs": Path("/data/samples.npz"),
    "accuracy_threshold": "cosine=0.999,top1=0.99",
    "int8_target": "top1=0.99",
    "speed_check": False,
}
CALIBRATION_VALUES: dict[str, Any] = {
    "data": Path("/data/other"),
    "method": CalibrationMethod.PERCENTILE,
    "max_samples": 64,
    "per_channel": False,
}
PREPROCESS_VALUES: dict[str, Any] = {"size": (320, 240), "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 1.0 / 3)}


def _round_trip(config: BuildConfig) -> BuildConfig:
    words = shlex.split(build_command("model.onnx", "model.plan", config))
    assert words[:2] == ["streamrt", "build"]
    return config_from_args(_parser().parse_args(words[1:]))


def _configs() -> list[Any]:
    int8 = {"precision": "int8", "calibration": CALIBRATION}
    cases = []
    for field, value in BUILD_VALUES.items():
        extra = int8 if field in ("int8_target", "speed_check") else {}
        cases.append(pytest.param(BuildConfig(**{**extra, field: value}), id=field))
    cases.append(pytest.param(BuildConfig(profiles=PROFILES), id="profiles"))
    for field, value in CALIBRATION_VALUES.items():
        calibration = dataclasses.replace(CALIBRATION, **{field: value})
        cases.append(pytest.param(BuildConfig(precision="int8", calibration=calibration), id=f"calibration.{field}"))
    for field, value in PREPROCESS_VALUES.items():
        calibration = dataclasses.replace(CALIBRATION, preprocess=ImagePreprocess(**{field: value}))
        cases.append(pytest.param(BuildConfig(precision="int8", calibration=calibration), id=f"preprocess.{field}"))
    return cases


def test_every_option_of_the_table_has_a_value_here() -> None:
    # A new row without a value here fails, so the round trip below covers it.
    assert {o.field for o in BUILD_OPTIONS} == set(BUILD_VALUES)
    assert {o.field for o in SHAPE_OPTIONS} == {"min", "opt", "max", "multiple"}
    assert {o.field for o in CALIBRATION_OPTIONS} == set(CALIBRATION_VALUES)
    assert {o.field for o in PREPROCESS_OPTIONS} == set(PREPROCESS_VALUES)
    for field, value in BUILD_VALUES.items():
        assert value != getattr(BuildConfig(), field), field


@pytest.mark.parametrize("config", _configs())
def test_build_command_round_trips_through_the_cli_parser(config: BuildConfig) -> None:
    assert _round_trip(config) == config


def test_all_options_at_once_round_trip() -> None:
    calibration = CalibrationConfig(**CALIBRATION_VALUES, preprocess=ImagePreprocess(**PREPROCESS_VALUES))
    values = {**BUILD_VALUES, "precision": "int8", "tf32": False, "keep_io_types": True}
    config = BuildConfig(**values, profiles=PROFILES, calibration=calibration)
    assert _round_trip(config) == config


def test_the_default_config_writes_backend_and_precision_only() -> None:
    assert build_command("m.onnx", "m.plan", BuildConfig()) == (
        "streamrt build m.onnx -o m.plan --backend onnxruntime --precision fp32")
