"""BuildConfig: validation, (de)serialisation and config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrt.config import BuildConfig, CalibrationMethod, Precision
from streamrt.errors import ConfigError


def test_round_trip_through_dict() -> None:
    cfg = BuildConfig.from_dict(
        {
            "precision": "int8",
            "profiles": [{"x": {"min": [1, 4], "opt": [2, 4], "max": [8, 4]}}],
            "calibration": {"data": "calib", "method": "percentile", "preprocess": {"size": [32, 32]}},
            "backend_options": {"threads": 2},
        }
    )
    assert cfg.precision is Precision.INT8
    assert cfg.calibration is not None and cfg.calibration.method is CalibrationMethod.PERCENTILE
    assert BuildConfig.from_dict(cfg.to_dict()) == cfg


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "build.yaml"
    path.write_text("precision: fp16\noptimization_level: 1\nfp32_ops: [Softmax]\n")
    cfg = BuildConfig.from_file(path)
    assert (cfg.precision, cfg.optimization_level, cfg.fp32_ops) == (Precision.FP16, 1, ("Softmax",))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"precision": "fp8"}, "precision must be one of"),
        ({"optimization_level": 9}, "optimization_level must be an integer in 0..5, got 9"),
        ({"memory_limit_mb": 0}, "memory_limit_mb must be an integer >= 1, got 0"),
        ({"precison": "fp16"}, "unknown build config keys"),
        ({"precision": "int8"}, "needs calibration data"),
    ],
)
def test_bad_values_are_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BuildConfig.from_dict(data)


def test_cache_key_ignores_calibration_cache_path() -> None:
    a = BuildConfig.from_dict({"precision": "int8", "calibration": {"data": "d", "cache": "a.json"}})
    b = BuildConfig.from_dict({"precision": "int8", "calibration": {"data": "d", "cache": "b.json"}})
    assert a.cache_key_dict() == b.cache_key_dict()
