"""``streamrt bench PLAN|MODEL``: trtexec-style throughput and latency of one engine.

Warm-up (``--warmup-ms``), then timed queries until both ``--duration`` and ``--iterations`` are reached (with
only one of them given, the other does not constrain the run). An ONNX model is built on the
fly through the build cache with the build flags of ``streamrt build``. See ``docs/bench.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from streamrt.cli._inputs import add_input_arguments, inputs_from_args
from streamrt.cli.args import add_alias
from streamrt.cli.common import add_build_arguments, check_output, engine_from_path

__all__ = ["register", "run"]

DEFAULT_DURATION_S = 3.0
DEFAULT_ITERATIONS = 10


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark an engine like trtexec: throughput, latency percentiles, warnings",
        description=(
            "Benchmark a plan (or an ONNX model, built on the fly through the cache) on random or given "
            "inputs. Runs a warm-up, then timed queries until both --duration and --iterations are reached "
            f"(defaults: {DEFAULT_DURATION_S:g} s and {DEFAULT_ITERATIONS} queries)."
        ),
    )
    parser.add_argument("engine", type=Path, metavar="PLAN|MODEL", help="plan file or ONNX model")
    timing = parser.add_argument_group("timing")
    warmup = timing.add_argument("--warmup-ms", type=float, default=200.0, metavar="MS",
                                 help="warm-up time in milliseconds (default 200)")
    add_alias(timing, "--warmup", warmup, note=True)
    timing.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help=f"run timed queries for at least S seconds (default {DEFAULT_DURATION_S:g})",
    )
    timing.add_argument(
        "--iterations",
        type=int,
        default=None,
        metavar="N",
        help=f"run at least N timed queries (default {DEFAULT_ITERATIONS})",
    )
    add_input_arguments(parser)
    output = parser.add_argument_group("output")
    output.add_argument(
        "--export-times",
        type=Path,
        metavar="FILE",
        help="write per-query times as JSON with trtexec's field names (startEnqMs, ...)",
    )
    output.add_argument("--json", action="store_true", help="print the result as JSON")
    add_build_arguments(parser)
    parser.set_defaults(func=run)


def _run_length(args: argparse.Namespace) -> tuple[float, int]:
    """Duration and iterations: the defaults when neither is given, else only what was given."""
    if args.duration is None and args.iterations is None:
        return DEFAULT_DURATION_S, DEFAULT_ITERATIONS
    return (args.duration if args.duration is not None else 0.0), (args.iterations or 1)


def run(args: argparse.Namespace) -> int:
    from streamrt.profiling.bench import benchmark

    duration, iterations = _run_length(args)
    if args.export_times:  # before the run, not after it: an unwritable path fails in a second
        check_output(args.export_times, example="times.json", flag="--export-times")
    engine = engine_from_path(args.engine, args)
    with engine:
        inputs, source = inputs_from_args(engine, args)
        m = engine.manifest
        result = benchmark(
            engine,
            inputs,
            warmup_ms=args.warmup_ms,
            duration_s=duration,
            iterations=iterations,
            label=f"{args.engine} ({m.backend} {m.backend_version}, {m.precision})",
            info={"inputs": source},
        )
    if args.export_times:
        args.export_times.parent.mkdir(parents=True, exist_ok=True)  # as build -o does
        result.write_times(args.export_times)
        print(f"wrote {result.summary.queries} per-query times to {args.export_times}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(result.format())
    return 0
