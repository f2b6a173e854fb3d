"""Frozen configuration dataclasses. The CLI flags and YAML/JSON config files map onto these.

Files and mappings are read and written by :mod:`streamrt._configio` (cattrs); the CLI's flags
for these fields are declared in :mod:`streamrt.cli.args`. Value checks live in ``__post_init__``
so a config built in Python is checked the same way as one read from a file.

Example:
    >>> cfg = BuildConfig.from_dict({"precision": "fp16", "profiles": [
    ...     {"x": {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}}]})
    >>> cfg.precision
    <Precision.FP16: 'fp16'>
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt import _configio
from streamrt.errors import ConfigError
from streamrt.types import ShapeProfile

__all__ = ["BuildConfig", "CalibrationConfig", "CalibrationMethod", "ImagePreprocess", "Precision"]


class Precision(enum.Enum):
    """Numeric precision of an engine. Decided in the ONNX graph before any backend builds."""

    FP32 = "fp32"
    TF32 = "tf32"  # fp32 graph, tensor-core matmuls allowed (GPU backends only)
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


class CalibrationMethod(enum.Enum):
    """How int8 activation ranges are chosen from calibration data."""

    ENTROPY = "entropy"
    MINMAX = "minmax"
    PERCENTILE = "percentile"


def _enum(cls: type[enum.Enum], value: Any, field_name: str) -> Any:
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).lower())
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise ConfigError(f"{field_name} must be one of {allowed}, got {value!r}") from None


@dataclass(frozen=True)
class ImagePreprocess:
    """How a folder of calibration images becomes input tensors (resize, scale, layout).

    Pixel values are read as RGB in [0, 255], resized to ``size`` (height, width), then
    ``(x / 255 - mean) / std`` per channel, laid out as NCHW (or NHWC).
    """

    size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    layout: str = "NCHW"

    def __post_init__(self) -> None:
        if self.layout not in ("NCHW", "NHWC"):
            raise ConfigError(f"preprocess layout must be NCHW or NHWC, got {self.layout!r}")
        if len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"preprocess size must be (height, width) >= 1, got {self.size!r}")


@dataclass(frozen=True)
class CalibrationConfig:
    """Where int8 calibration data comes from and how ranges are computed."""

    data: Path
    method: CalibrationMethod = CalibrationMethod.ENTROPY
    per_channel: bool = True
    max_samples: int | None = None
    percentile: float = 99.999
    preprocess: ImagePreprocess | None = None
    cache: Path | None = None  # defaults to <cache_dir>/calibration/<hash>.json

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", Path(self.data))
        object.__setattr__(self, "method", _enum(CalibrationMethod, self.method, "calibration method"))
        if self.cache is not None:
            object.__setattr__(self, "cache", Path(self.cache))
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples must be an integer >= 1, got {self.max_samples}")
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"percentile must be in (50, 100], got {self.percentile}")


def default_cache_dir() -> Path:
    """``$STREAMRT_CACHE`` or ``~/.cache/streamrt``."""
    import os

    return Path(os.environ.get("STREAMRT_CACHE", Path.home() / ".cache" / "streamrt"))


@dataclass(frozen=True)
class BuildConfig:
    """Everything that decides what engine a build produces.

    Two builds with equal configs, equal models and the same target give the same plan, which
    is what the build cache relies on (see :meth:`cache_key_dict`).

    Attributes:
        backend: registry name of the backend (``onnxruntime``, ``torch_inductor``, ``tensorrt``).
        precision: numeric precision; applied to the ONNX graph before the backend builds.
        profiles: shape profiles for dynamic inputs; empty means "static shapes from the model"
            (dynamic dims then default to 1..64 for a leading batch dim, else must be given).
        keep_io_types: keep fp32 inputs/outputs when converting to fp16/bf16.
        fp32_ops: op types kept in fp32 by the fp16/bf16 conversion (numerically sensitive ops).
        calibration: int8 calibration data; required for ``precision=int8``.
        memory_limit_mb: workspace/arena limit for backends that take one.
        optimization_level: 0 (fastest build) .. 5 (slowest build, best kernels), 3 the default,
            with TensorRT's meaning; backends map it (``docs/optimization-levels.md``).
        tf32: fp32 plans may use TF32 tensor-core math (about 10 mantissa bits) for matmuls and
            convolutions; off by default (plans stay IEEE fp32). Only with ``precision=fp32``;
            ``precision="tf32"`` is the older spelling of ``fp32`` with ``tf32=True``.
        timing_cache: a file (TensorRT) or directory (torch_inductor) keeping kernel timings
            across builds, like trtexec's ``--timingCacheFile``; ``None``: the backend's default
            under the cache directory.
        build_budget_s: seconds one autotuning build may take (torch_inductor levels 4-5): the
            level-3 recipe is compiled first, autotuning gets what is left, and past it the
            level-3 plan is kept (said in the progress lines and the manifest); ``None``: no limit.
        backend_options: backend-specific settings, recorded in the plan (e.g. ``threads``).
        verify_shapes: run the plan at every profile's corners against ONNX Runtime fp32 before
            writing it (see :mod:`streamrt.building.verify`); ``None``: on for every backend but onnxruntime.
        sample_inputs: an ``.npz`` of real inputs (keyed by input name) that fp16 range checks
            and the accuracy gate run on (default: the calibration data, else random inputs).
        accuracy_threshold: bounds the fp16/bf16/int8 plan must meet against ONNX Runtime fp32,
            e.g. ``"cosine=0.999"`` (:class:`streamrt.measure.accuracy.AccuracyThreshold`); a miss fails
            the build. Without it the metrics are still measured, recorded and warned about.
        int8_target: the accuracy int8's sensitivity pass restores by keeping the most
            sensitive quantized layers in fp32, e.g. ``"top1=0.99"`` or ``"cosine=0.99"``.
        speed_check: int8 builds also build an fp32 plan with the same backend (in memory) and
            time both here, warning when int8 is not faster; off saves that second build.
    """

    backend: str = "onnxruntime"
    precision: Precision = Precision.FP32
    profiles: tuple[ShapeProfile, ...] = ()
    keep_io_types: bool = True
    fp32_ops: tuple[str, ...] = ()
    calibration: CalibrationConfig | None = None
    memory_limit_mb: int | None = None
    optimization_level: int = 3
    tf32: bool = False
    timing_cache: Path | None = None
    build_budget_s: float | None = 300.0
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    verify_shapes: bool | None = None
    sample_inputs: Path | None = None
    accuracy_threshold: str | None = None
    int8_target: str | None = None
    speed_check: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", _enum(Precision, self.precision, "precision"))
        object.__setattr__(self, "profiles", tuple(self.profiles))
        object.__setattr__(self, "fp32_ops", tuple(self.fp32_ops))
        if self.precision is Precision.TF32:  # the older spelling: one config, one cache key
            object.__setattr__(self, "precision", Precision.FP32)
            object.__setattr__(self, "tf32", True)
        if self.tf32 and self.precision is not Precision.FP32:
            raise ConfigError(
                f"tf32 applies to fp32 plans only, not precision {self.precision.value}",
                hint="drop --tf32, or build with --precision fp32 --tf32",
            )
        if self.timing_cache is not None:
            object.__setattr__(self, "timing_cache", Path(self.timing_cache))
        if isinstance(self.optimization_level, bool) or not isinstance(self.optimization_level, int) \
                or not 0 <= self.optimization_level <= 5:
            raise ConfigError(f"optimization_level must be an integer in 0..5, got {self.optimization_level}")
        if self.build_budget_s is not None:
            if isinstance(self.build_budget_s, bool) or not isinstance(self.build_budget_s, (int, float)) \
                    or not self.build_budget_s > 0:
                raise ConfigError(f"build_budget_s must be a number of seconds > 0 (or None: no limit), "
                                  f"got {self.build_budget_s!r}", hint="e.g. --build-budget-s 300; 0 means no limit")
            object.__setattr__(self, "build_budget_s", float(self.build_budget_s))
        if self.memory_limit_mb is not None and self.memory_limit_mb < 1:
            raise ConfigError(f"memory_limit_mb must be an integer >= 1, got {self.memory_limit_mb}")
        if self.sample_inputs is not None:
            object.__setattr__(self, "sample_inputs", Path(self.sample_inputs))
        from streamrt.measure.accuracy import AccuracyThreshold  # numpy only: checks the grammar early

        for name in ("accuracy_threshold", "int8_target"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, str(AccuracyThreshold.parse(value)))
        if self.precision is Precision.INT8 and self.calibration is None:
            raise ConfigError(
                "precision int8 needs calibration data",
                hint="pass --calib DIR (a folder of .npy/.npz files or images)",
            )

    @property
    def numeric_precision(self) -> str:
        """What the plan computes in: ``tf32`` for an fp32 plan with TF32 on, else the precision."""
        return "tf32" if self.tf32 else self.precision.value

    def replace(self, **changes: Any) -> BuildConfig:
        return dataclasses.replace(self, **changes)

    # --- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain values (the inverse of :meth:`from_dict`), as written to plans and the build cache key."""
        return _configio.unstructure(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildConfig:
        """Build from a mapping (YAML/JSON); unknown keys and bad values are a ConfigError naming them."""
        return _configio.structure(data, cls)

    @classmethod
    def from_file(cls, path: str | Path) -> BuildConfig:
        """Read a YAML or JSON file whose keys are this dataclass's fields."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        text = p.read_text()
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {p} must hold a mapping, got {type(data).__name__}")
        return cls.from_dict(data)

    def cache_key_dict(self) -> dict[str, Any]:
        """What identifies the build, without paths that do not change the result."""
        d = self.to_dict()
        if d["calibration"] is not None:
            d["calibration"].pop("cache")
        d.pop("timing_cache")  # where timings are kept; the level and recipe decide the plan
        if self.sample_inputs is not None and self.sample_inputs.is_file():
            import hashlib

            d["sample_inputs"] = hashlib.sha256(self.sample_inputs.read_bytes()).hexdigest()
        return d


_configio.register_class(ImagePreprocess)
_configio.register_class(CalibrationConfig)
_configio.register_class(BuildConfig, name="build config")
