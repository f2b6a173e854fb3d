"""Flags and helpers shared by the subcommands that build (build, bench, compare, profile...).

The build flags map one-to-one onto :class:`BuildConfig`; ``--config FILE`` loads the same
fields from YAML/JSON and flags given on the command line override it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from streamrt.config import BuildConfig, CalibrationConfig, CalibrationMethod, ImagePreprocess
from streamrt.errors import ConfigError
from streamrt.plan import is_plan_file

__all__ = [
    "add_build_arguments",
    "config_from_args",
    "engine_from_path",
    "parse_options",
    "stderr_progress",
]


def add_build_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add the build flags. ``prefix`` (e.g. ``"a-"``) makes per-side copies for ``compare``."""
    p = f"--{prefix}"
    group = parser.add_argument_group(f"build options{' (' + prefix.rstrip('-') + ')' if prefix else ''}")
    group.add_argument(f"{p}backend", default=None, help="backend (default onnxruntime)")
    group.add_argument(
        f"{p}precision",
        default=None,
        choices=["fp32", "tf32", "fp16", "bf16", "int8"],
        help="numeric precision, applied to the ONNX graph (default fp32)",
    )
    if prefix:
        return
    group.add_argument(
        "--config", type=Path, help="YAML/JSON file with BuildConfig fields; flags override it"
    )
    group.add_argument(
        "--min-shapes",
        action="append",
        default=[],
        metavar="SPECS",
        help="name:1x3x224x224,... minimum shapes of one profile (repeat per profile)",
    )
    group.add_argument(
        "--opt-shapes",
        action="append",
        default=[],
        metavar="SPECS",
        help="shapes kernels are tuned for (default: the min shapes)",
    )
    group.add_argument("--max-shapes", action="append", default=[], metavar="SPECS", help="maximum shapes")
    group.add_argument(
        "--shape-multiple",
        action="append",
        default=[],
        metavar="SPECS",
        help="name:1x1x32x32,... each dimension must be a multiple of this (checked at build and run; "
        "once for all profiles or once per profile)",
    )
    group.add_argument(
        "--calib",
        type=Path,
        metavar="DIR",
        help="int8 calibration data: a folder of .npy/.npz files or images",
    )
    group.add_argument(
        "--calib-method",
        choices=["entropy", "minmax", "percentile"],
        default=None,
        help="how activation ranges are chosen (default entropy)",
    )
    group.add_argument("--calib-samples", type=int, default=None, help="use at most N calibration samples")
    group.add_argument(
        "--calib-size", metavar="HxW", help="image calibration: resize to HxW (default 224x224)"
    )
    group.add_argument("--calib-mean", metavar="R,G,B", help="image calibration: mean in [0, 1] units")
    group.add_argument("--calib-std", metavar="R,G,B", help="image calibration: std in [0, 1] units")
    group.add_argument("--per-tensor", action="store_true", help="int8: per-tensor weight scales")
    group.add_argument(
        "--no-keep-io-types",
        action="store_true",
        help="fp16/bf16: convert inputs/outputs too (default keeps them fp32)",
    )
    group.add_argument(
        "--fp32-ops", default=None, metavar="OPS", help="comma-separated op types kept in fp32"
    )
    group.add_argument(
        "--opt-level", type=int, default=None, help="0 (fast build) .. 5 (best kernels); default 3"
    )
    group.add_argument("--memory-limit", type=int, default=None, metavar="MB", help="workspace/arena limit")
    group.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='backend option (e.g. threads=4, providers=["cuda"]); repeatable',
    )
    group.add_argument(
        "--verify-shapes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the plan at each profile's min/opt/max and an odd size against ONNX Runtime fp32 and refuse "
        "a mismatch (default: on for every backend but onnxruntime)",
    )
    group.add_argument("--no-cache", action="store_true", help="always build; do not reuse or store plans")
    group.add_argument("--cache-dir", type=Path, default=None, help="build cache (default ~/.cache/streamrt)")


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


def _floats(text: str, name: str) -> tuple[float, float, float]:
    try:
        a, b, c = (float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{name} must be three comma-separated numbers, got {text!r}") from None
    return (a, b, c)


def _calibration(args: argparse.Namespace, base: CalibrationConfig | None) -> CalibrationConfig | None:
    if args.calib is None:
        return base
    pre = None
    if args.calib_size or args.calib_mean or args.calib_std:
        size = (224, 224)
        if args.calib_size:
            try:
                h, w = (int(v) for v in args.calib_size.lower().split("x"))
            except ValueError:
                raise ConfigError(f"--calib-size must be HxW, got {args.calib_size!r}") from None
            size = (h, w)
        pre = ImagePreprocess(
            size=size,
            mean=_floats(args.calib_mean, "--calib-mean") if args.calib_mean else (0.0, 0.0, 0.0),
            std=_floats(args.calib_std, "--calib-std") if args.calib_std else (1.0, 1.0, 1.0),
        )
    return CalibrationConfig(
        data=args.calib,
        method=CalibrationMethod(args.calib_method or "entropy"),
        per_channel=not args.per_tensor,
        max_samples=args.calib_samples,
        preprocess=pre,
    )


def config_from_args(args: argparse.Namespace, prefix: str = "") -> BuildConfig:
    """A BuildConfig from ``--config`` (if any) overridden by the flags given."""
    from streamrt.onnx.profiles import parse_profiles

    base = BuildConfig.from_file(args.config) if getattr(args, "config", None) else BuildConfig()
    key = prefix.replace("-", "_")
    changes: dict[str, Any] = {}
    backend = getattr(args, f"{key}backend", None) or (getattr(args, "backend", None) if prefix else None)
    precision = getattr(args, f"{key}precision", None) or (
        getattr(args, "precision", None) if prefix else None
    )
    if backend:
        changes["backend"] = backend
    if precision:
        changes["precision"] = precision
    multiples = getattr(args, "shape_multiple", [])
    if args.min_shapes or args.max_shapes or args.opt_shapes or multiples:
        changes["profiles"] = parse_profiles(args.min_shapes, args.opt_shapes, args.max_shapes, multiples)
    if args.opt_level is not None:
        changes["optimization_level"] = args.opt_level
    if args.memory_limit is not None:
        changes["memory_limit_mb"] = args.memory_limit
    if args.option:
        changes["backend_options"] = {**base.backend_options, **parse_options(args.option)}
    if getattr(args, "verify_shapes", None) is not None:
        changes["verify_shapes"] = args.verify_shapes
    if args.no_keep_io_types:
        changes["keep_io_types"] = False
    if args.fp32_ops:
        changes["fp32_ops"] = tuple(op.strip() for op in args.fp32_ops.split(",") if op.strip())
    calibration = _calibration(args, base.calibration)
    if calibration is not base.calibration:
        changes["calibration"] = calibration
    merged = {**base.to_dict(), **{k: v for k, v in changes.items() if k not in ("calibration", "profiles")}}
    merged["profiles"] = changes.get("profiles", base.profiles)
    merged["calibration"] = changes.get("calibration", base.calibration)
    return BuildConfig.from_dict(merged)


def stderr_progress(line: str) -> None:
    """Build progress for the terminal: one line per step on stderr."""
    print(f"  · {line}", file=sys.stderr, flush=True)


def engine_from_path(path: Path, args: argparse.Namespace, prefix: str = "", profiles: tuple[Any, ...] = ()) -> Any:
    """Load a plan, or build an ONNX file through the cache (with the flags in ``args``) and load it.

    ``profiles`` are used when neither the flags nor ``--config`` give any (e.g. the shapes of
    ``--inputs`` data).
    """
    import streamrt

    if is_plan_file(path):
        return streamrt.load(path)
    config = config_from_args(args, prefix)
    if profiles and not config.profiles:
        config = config.replace(profiles=tuple(profiles))
    result = streamrt.build(
        path,
        config,
        cache=not getattr(args, "no_cache", False),
        cache_dir=getattr(args, "cache_dir", None),
        progress=stderr_progress,
    )
    return streamrt.load(result.path)
