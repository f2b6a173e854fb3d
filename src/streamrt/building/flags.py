"""The flags of :class:`~streamrt.config.BuildConfig`, declared once and read both ways.

Each :class:`~streamrt._flags.Option` row ties a flag to a config field: the CLI adds these rows
to its parsers (:class:`streamrt.cli.args.BuildArgs`), and :func:`build_flags` turns a config
back into the flags that rebuild it (the ``build_command`` a plan records, printed in every
mismatch error). One table for both directions: a flag added here is written back without a
second edit, and ``tests/test_build_command.py`` checks that each row round-trips.

Example:
    >>> build_flags(BuildConfig(precision="fp16", optimization_level=5))
    ['--backend', 'onnxruntime', '--precision', 'fp16', '--optimization-level', '5']
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streamrt._flags import Option, number_text
from streamrt.config import BuildConfig, CalibrationConfig, CalibrationMethod, ImagePreprocess, Precision
from streamrt.errors import ConfigError
from streamrt.types import ShapeProfile, format_shape

__all__ = [
    "BUILD_OPTIONS",
    "CALIBRATION_OPTIONS",
    "PREPROCESS_OPTIONS",
    "SHAPE_OPTIONS",
    "backend_choices",
    "build_flags",
    "option_texts",
    "parse_options",
]


def backend_choices() -> list[str]:
    """Every registered backend name (whether its library is installed or not)."""
    from streamrt.backends import BACKENDS

    return list(BACKENDS)


def parse_options(items: list[str]) -> dict[str, Any]:
    """``['threads=4', 'providers=["cuda"]']`` -> ``{'threads': 4, 'providers': ['cuda']}``."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad --option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def option_texts(options: Mapping[str, Any]) -> list[str]:
    """Backend options as ``--option`` arguments that :func:`parse_options` reads back unchanged."""
    texts = []
    for key, value in options.items():
        plain = isinstance(value, str) and not _parses_as_json(value)
        texts.append(f"{key}={value if plain else json.dumps(value)}")
    return texts


def _parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _shape_texts(label: str) -> Callable[[tuple[ShapeProfile, ...]], list[str]]:
    """One ``name:AxB,...`` argument per profile (``multiple``: per profile that has one)."""

    def texts(profiles: tuple[ShapeProfile, ...]) -> list[str]:
        out = []
        for profile in profiles:
            shapes = {n: getattr(r, label) for n, r in profile.ranges.items()}
            if label == "multiple":  # optional per input: only the inputs (and profiles) that have one
                shapes = {n: s for n, s in shapes.items() if s}
            if shapes:
                out.append(",".join(f"{n}:{format_shape(s)}" for n, s in shapes.items()))
        return out

    return texts


def _numbers_text(values: tuple[float, ...]) -> str:
    return ",".join(number_text(v) for v in values)


def _floats(name: str) -> Callable[[str], tuple[float, float, float]]:
    def parse(text: str) -> tuple[float, float, float]:
        try:
            a, b, c = (float(v) for v in text.split(","))
        except ValueError:
            raise ConfigError(f"{name} must be three comma-separated numbers, got {text!r}") from None
        return (a, b, c)

    return parse


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--calib-size must be HxW, got {text!r}") from None
    return (h, w)


def _ops(text: str) -> tuple[str, ...]:
    return tuple(op.strip() for op in text.split(",") if op.strip())


_PRECISIONS = [p.value for p in Precision]

BUILD_OPTIONS = (
    Option("backend", ("--backend",), "backend (default onnxruntime)", {"choices": backend_choices()},
           per_side=True, shown=True),
    Option("precision", ("--precision",), "numeric precision, applied to the ONNX graph (default fp32)",
           {"choices": _PRECISIONS}, per_side=True, shown=True),
    Option("optimization_level", ("--optimization-level", "--opt-level"), "0 (fastest build) .. 5 (slowest build, "
           "fastest kernels), TensorRT's levels; default 3 (docs/optimization-levels.md)",
           {"type": int, "choices": range(6), "metavar": "{0..5}"}),
    Option("tf32", ("--tf32",), "fp32 plans: allow TF32 tensor-core math in matmuls and convolutions (about 1e-3 "
           "relative error; default off: IEEE fp32)", {"action": "store_true"}),
    Option("timing_cache", ("--timing-cache",), "keep kernel timings across builds here and reuse them (like "
           "trtexec --timingCacheFile): a file for tensorrt, a directory for torch_inductor",
           {"type": Path, "metavar": "PATH"}),
    Option("build_budget_s", ("--build-budget-s",), "seconds one autotuning build may take (torch_inductor "
           "levels 4-5; default 300): the level-3 recipe is compiled first and kept if autotuning does not "
           "finish in what is left, and the build says so; 0: no limit", {"type": float, "metavar": "SECONDS"},
           value=lambda v: None if v == 0 else v,
           text=lambda v: "0" if v is None else number_text(v)),
    Option("memory_limit_mb", ("--memory-limit",), "workspace/arena limit", {"type": int, "metavar": "MB"}),
    Option("keep_io_types", ("--no-keep-io-types",), "fp16/bf16: convert inputs/outputs too (default keeps them fp32)",
           {"action": "store_true"}, value=lambda _: False),
    Option("fp32_ops", ("--fp32-ops",), "comma-separated op types kept in fp32", {"metavar": "OPS"}, value=_ops,
           text=",".join),
    Option("backend_options", ("--option",), 'backend option (e.g. threads=4, providers=["cuda"]); repeatable',
           {"action": "append", "metavar": "KEY=VALUE"}, value=parse_options, text=option_texts),
    Option("verify_shapes", ("--verify-shapes",),
           "run the plan at each profile's min/opt/max and an odd size against ONNX Runtime fp32 and refuse a "
           "mismatch (default: on for every backend but onnxruntime)", {"action": argparse.BooleanOptionalAction}),
    # fp16/bf16/int8 accuracy (streamrt.building.accuracy_gate): sample data, the gate, int8's sensitivity target
    Option("sample_inputs", ("--sample-inputs",), "real inputs (keyed by input name) for fp16 range checks and "
           "the accuracy gate (default: calibration data, else random inputs)", {"type": Path, "metavar": "FILE.npz"}),
    Option("accuracy_threshold", ("--accuracy-threshold",), "fail the fp16/bf16/int8 build when the plan misses it "
           "vs onnxruntime fp32: cosine=0.999, top1=0.99, rel_l2=0.01, max_abs=..., rel_p99=... (comma-separated; "
           "a bare number is a min cosine)", {"metavar": "SPEC"}),
    Option("int8_target", ("--int8-target",), "int8: keep the most sensitive quantized layers in fp32 until this "
           "is met (e.g. top1=0.99)", {"metavar": "SPEC"}),
    Option("speed_check", ("--no-speed-check",), "int8: skip timing the plan against an fp32 plan of the same "
           "backend (a second build)", {"action": "store_true"}, value=lambda _: False),
)
"""BuildConfig fields set by one flag each; profiles and calibration are read by BuildArgs itself."""

SHAPE_OPTIONS = (
    Option("min", ("--min-shapes",), "name:1x3x224x224,... minimum shapes of one profile (repeat per profile)",
           {"action": "append", "metavar": "SPECS"}, text=_shape_texts("min")),
    Option("opt", ("--opt-shapes",), "shapes kernels are tuned for (default: the min shapes)",
           {"action": "append", "metavar": "SPECS"}, text=_shape_texts("opt")),
    Option("max", ("--max-shapes",), "maximum shapes", {"action": "append", "metavar": "SPECS"},
           text=_shape_texts("max")),
    Option("multiple", ("--shape-multiple",), "name:1x1x32x32,... each dimension must be a multiple of this "
           "(checked at build and run; once for all profiles or once per profile)",
           {"action": "append", "metavar": "SPECS"}, text=_shape_texts("multiple")),
)

CALIBRATION_OPTIONS = (
    Option("data", ("--calib",), "int8 calibration data: a folder of .npy/.npz files or images",
           {"type": Path, "metavar": "DIR"}, shown=True),
    Option("method", ("--calib-method",), "how activation ranges are chosen (default entropy)",
           {"choices": [m.value for m in CalibrationMethod]}, value=CalibrationMethod),
    Option("max_samples", ("--calib-samples",), "use at most N calibration samples", {"type": int, "metavar": "N"}),
    Option("per_channel", ("--per-tensor",), "int8: per-tensor weight scales", {"action": "store_true"},
           value=lambda _: False),
)

PREPROCESS_OPTIONS = (
    # --calib-size is always written back: a preprocess given with its defaults stays given
    Option("size", ("--calib-size",), "image calibration: resize to HxW (default 224x224)", {"metavar": "HxW"},
           value=_size, text=lambda hw: f"{hw[0]}x{hw[1]}", shown=True),
    Option("mean", ("--calib-mean",), "image calibration: mean in [0, 1] units", {"metavar": "R,G,B"},
           value=_floats("--calib-mean"), text=_numbers_text),
    Option("std", ("--calib-std",), "image calibration: std in [0, 1] units", {"metavar": "R,G,B"},
           value=_floats("--calib-std"), text=_numbers_text),
)


def _changed(options: tuple[Option, ...], config: Any, default: Any) -> list[str]:
    words: list[str] = []
    for option in options:
        value = getattr(config, option.field)
        if option.shown or value != getattr(default, option.field):
            words += option.to_args(value)
    return words


def build_flags(config: BuildConfig) -> list[str]:
    """The ``streamrt build`` flags that give ``config`` back, from the tables above.

    Fields at their defaults are left out (``--backend`` and ``--precision`` are always written);
    the CLI's parser reads the words back into ``config`` (fields without a flag, such as the
    calibration's ``percentile``, keep their defaults).
    """
    words = _changed(BUILD_OPTIONS, config, BuildConfig())
    for option in SHAPE_OPTIONS:
        words += option.to_args(config.profiles) if config.profiles else []
    calibration = config.calibration
    if calibration is not None:
        words += _changed(CALIBRATION_OPTIONS, calibration, CalibrationConfig(data=calibration.data))
        if calibration.preprocess is not None:
            words += _changed(PREPROCESS_OPTIONS, calibration.preprocess, ImagePreprocess())
    return words
