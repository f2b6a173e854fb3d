"""A plan's load and first call in a fresh process: what a user waits for before the first answer.

``engine_speed.py --fresh-first-call`` runs this after each plan variant's build (the builder's
process has cuDNN's benchmark cache, compiled kernels and CUDA graphs warm, so its own first call
says nothing about a server that starts). A new interpreter loads the plan, makes a context,
and times its first call and its second on one random input (CUDA-synchronised), so any
first-call work (cuDNN's benchmark mode timing algorithms, runtime-compiled fusion engines, CUDA
graph capture) shows as ``first_call_s`` against ``second_call_ms``.

Usage:
    python benchmarks/first_call.py PLAN --shape input:32x3x224x224   # prints one JSON line
    python benchmarks/first_call.py PLAN --shape ... --phases [--profile-top 25]
        # where the first call's time goes: the runner's load, the first call without CUDA graphs (its
        # torch.profiler table: top operators by CPU time), the second, then the CUDA-graph captures
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def measure_in_fresh_process(plan: Path, shapes: dict[str, list[int]], timeout_s: float) -> dict[str, Any]:
    """Run this script on ``plan`` in a new interpreter; its timings, or ``{"error": ...}``."""
    spec = ",".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in shapes.items())
    try:
        done = subprocess.run([sys.executable, str(HERE / "first_call.py"), str(plan), "--shape", spec],
                              capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:200]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    from streamrt.onnx.profiles import parse_shape_list

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("plan", type=Path)
    p.add_argument("--shape", type=parse_shape_list, required=True, metavar="NAME:DxDx...",
                   help="input shapes, comma list (trtexec syntax)")
    p.add_argument("--phases", action="store_true", help="time the first call's phases (see the usage)")
    p.add_argument("--profile-top", type=int, default=25, help="--phases: operators in the profiler table")
    args = p.parse_args(argv)
    if args.phases:
        return phases(args.plan, args.shape, args.profile_top)
    import numpy as np

    from streamrt import load
    from streamrt.running.inputs import cast_inputs, random_inputs, to_device

    t0 = time.perf_counter()
    engine = load(args.plan)
    ctx = engine.create_context()
    loaded = time.perf_counter()
    feeds = to_device(cast_inputs(random_inputs(engine.inputs, args.shape, np.random.default_rng(0)), engine.inputs),
                      engine.device_kind)
    calls = []
    for _ in range(2):
        start = time.perf_counter()
        ctx.infer(feeds)
        if engine.device_kind == "cuda":
            import torch

            torch.cuda.synchronize()
        calls.append(time.perf_counter() - start)
    ctx.close()
    engine.close()
    print(json.dumps({"load_s": round(loaded - t0, 3), "first_call_s": round(calls[0], 3),
                      "second_call_ms": round(calls[1] * 1e3, 3)}), flush=True)
    return 0


def phases(plan: Path, shapes: dict[str, list[int]], top: int) -> int:
    """The first call taken apart in this fresh process; one JSON line, the profiler table on stderr."""
    import numpy as np
    import torch

    from streamrt import load
    from streamrt.running.inputs import cast_inputs, random_inputs, to_device

    def sync() -> None:
        if engine.device_kind == "cuda":
            torch.cuda.synchronize()

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    engine = load(plan)
    out["load_s"] = round(time.perf_counter() - t0, 3)
    feeds = to_device(cast_inputs(random_inputs(engine.inputs, shapes, np.random.default_rng(0)), engine.inputs),
                      engine.device_kind)
    plain = engine.create_context(cuda_graph=False)
    t0 = time.perf_counter()
    runner = plain._runner(0)  # the AOTInductor runner (nogil where the package allows it)
    out["runner_load_s"] = round(time.perf_counter() - t0, 3)
    out["runner"] = type(runner).__name__
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        plain.infer(feeds)
        sync()
        out["first_plain_s"] = round(time.perf_counter() - t0, 3)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    plain.infer(feeds)
    sync()
    out["second_plain_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    plain.close()
    graphs = engine.create_context()
    t0 = time.perf_counter()
    graphs.infer(feeds)
    sync()
    out["first_graph_call_s"] = round(time.perf_counter() - t0, 3)
    graphs.close()
    engine.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
