"""``streamrt build MODEL.onnx -o PLAN``: build (or reuse from the cache) an engine plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamrt.cli._optimization import optimization_lines
from streamrt.cli.args import CacheArgs
from streamrt.cli.common import add_build_arguments, check_output, config_from_args, require_file, stderr_progress

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        help="build an engine plan from an ONNX model (profiles, precision, int8 calibration)",
        description="Build an engine plan. Identical builds are reused from the cache.",
    )
    parser.add_argument("model", type=Path, help="ONNX model")
    parser.add_argument("-o", "--output", type=Path, required=True, help="plan file to write")
    add_build_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan's manifest as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import streamrt

    require_file(args.model)
    check_output(args.output, example=f"{args.model.stem}.plan")
    config = config_from_args(args)
    result = streamrt.build(
        args.model,
        config,
        args.output,
        cache=CacheArgs.use_cache(args),
        cache_dir=CacheArgs.cache_dir(args),
        progress=stderr_progress,
    )
    if args.json:
        print(json.dumps({**result.manifest.to_dict(), "cached": result.cached}, indent=2))
        return 0
    m = result.manifest
    how = "reused from cache" if result.cached else f"built in {result.seconds:.1f} s"
    print(f"{result.path}: {m.backend} {m.backend_version}, {m.precision}, {how}")
    for line in optimization_lines(m.build_settings, timing_cache=not result.cached):
        print(line)
    return 0
