"""``streamrt profile PLAN|MODEL``: per-node time table from the backend's own profiler.

The profile runs separately from any timed run (profilers slow execution down), sorted
slowest first, with each node's share of the summed node time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamrt.cli._inputs import add_input_arguments, describe_inputs, inputs_from_args
from streamrt.cli.common import add_build_arguments, engine_from_path
from streamrt.errors import ConfigError

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="per-layer time table from the backend's profiler, slowest first, with shares",
        description="Profile each node of an engine (or an ONNX model built on the fly) with the backend's "
        "own profiler, in a run separate from timed runs.",
    )
    parser.add_argument("engine", type=Path, metavar="PLAN|MODEL", help="plan file or ONNX model")
    parser.add_argument(
        "--iterations", type=int, default=10, metavar="N", help="profiled queries, after one warm-up query (default 10)"
    )
    parser.add_argument(
        "--top", type=int, default=20, metavar="N", help="show the N slowest nodes (default 20; 0 shows all)"
    )
    parser.add_argument("--json", action="store_true", help="print the profile as JSON")
    add_input_arguments(parser)
    add_build_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streamrt.inputs import to_device
    from streamrt.profiling.layers import LayerProfile

    if args.iterations < 1:
        raise ConfigError(f"--iterations must be an integer >= 1, got {args.iterations}")
    if args.top < 0:
        raise ConfigError(f"--top must be >= 0, got {args.top}")
    engine = engine_from_path(args.engine, args)
    with engine:
        arrays, source = inputs_from_args(engine, args)
        timings = engine.profile_layers(to_device(arrays, engine.device_kind), args.iterations)
        m = engine.manifest
    profile = LayerProfile.from_timings(timings, args.iterations)
    top = args.top or None
    if args.json:
        print(
            json.dumps(
                {
                    "engine": str(args.engine),
                    "backend": m.backend,
                    "precision": m.precision,
                    "inputs": source,
                    "shapes": {n: list(a.shape) for n, a in arrays.items()},
                    **profile.to_json(top),
                },
                indent=2,
            )
        )
        return 0
    print(f"Engine: {args.engine} ({m.backend} {m.backend_version}, {m.precision})")
    print(f"Inputs: {source}: {describe_inputs(arrays)}")
    print(profile.format(top))
    return 0
