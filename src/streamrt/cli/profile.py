"""``streamrt profile PLAN|MODEL``: per-node time table from the backend's own profiler.

The profile runs separately from any timed run (profilers slow execution down), sorted
slowest first, with each node's share of the summed node time. A CUDA engine gets a kernel
table instead (torch.profiler's trace: kernel names, share, calls, mean time), the time per
kernel kind with the rate the matmul/conv kernels reached, and a whole-model roofline line
(counted FLOPs over the measured query time against the device's peak); see
:mod:`streamrt.profiling.gpu_report`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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
    parser.add_argument(
        "--flops-model", type=Path, metavar="MODEL.onnx",
        help="CUDA plans: the ONNX model the plan was built from, to count FLOPs for the roofline "
        "(an ONNX PLAN|MODEL argument is counted without it)",
    )
    parser.add_argument(
        "--timed-runs", type=int, default=50, metavar="N",
        help="CUDA engines: queries timed with CUDA events for the roofline's query time (default 50)",
    )
    parser.add_argument("--trace", type=Path, metavar="FILE", help="CUDA engines: keep the kernel trace (Chrome JSON)")
    parser.add_argument(
        "--per-node", action="store_true",
        help="CUDA engines: the backend's own per-node profiler instead of the kernel table and roofline",
    )
    add_input_arguments(parser)
    add_build_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streamrt.profiling.layers import LayerProfile
    from streamrt.running.inputs import to_device

    if args.iterations < 1:
        raise ConfigError(f"--iterations must be an integer >= 1, got {args.iterations}")
    if args.top < 0:
        raise ConfigError(f"--top must be >= 0, got {args.top}")
    if args.timed_runs < 1:
        raise ConfigError(f"--timed-runs must be an integer >= 1, got {args.timed_runs}")
    engine = engine_from_path(args.engine, args)
    with engine:
        arrays, source = inputs_from_args(engine, args)
        if engine.device_kind == "cuda" and not args.per_node:
            return _run_cuda(engine, arrays, source, args)
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


def _run_cuda(engine: Any, arrays: dict[str, Any], source: str, args: argparse.Namespace) -> int:
    """Kernel table, kinds with rates and the roofline of a CUDA engine."""
    import torch

    from streamrt.plan import is_plan_file
    from streamrt.profiling.flops import count_onnx_flops
    from streamrt.profiling.gpu_report import GpuProfileReport, plan_precision
    from streamrt.profiling.kernel_profile import profile_cuda_kernels
    from streamrt.running.inputs import to_device

    flops_model = args.flops_model or (None if is_plan_file(args.engine) else args.engine)
    if flops_model is not None and not Path(flops_model).is_file():
        raise ConfigError(
            f"--flops-model {flops_model} is not a file", hint="pass the ONNX model the plan was built from"
        )
    feeds = to_device(arrays, "cuda")
    profile = profile_cuda_kernels(engine, feeds, args.iterations, timed_runs=args.timed_runs, trace_path=args.trace)
    flops = count_onnx_flops(flops_model, arrays, device="cuda") if flops_model is not None else None
    m = engine.manifest
    report = GpuProfileReport.build(profile, flops, plan_precision(m), torch.cuda.get_device_name())
    top = args.top or None
    if args.json:
        print(json.dumps({
            "engine": str(args.engine),
            "backend": m.backend,
            "precision": m.precision,
            "inputs": source,
            "shapes": {n: list(a.shape) for n, a in arrays.items()},
            **report.to_json(top),
        }, indent=2))
        return 0
    print(f"Engine: {args.engine} ({m.backend} {m.backend_version}, {m.precision}) on {report.device_name}")
    print(f"Inputs: {source}: {describe_inputs(arrays)}")
    print(report.format(top))
    return 0
