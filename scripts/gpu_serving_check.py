"""H200 check: server throughput over binary gRPC at concurrency 64 vs the engine offline.

Builds a ResNet-18-shaped model into a torch_inductor fp16 plan (batch 1..64), measures the engine
offline with ``streamrt bench``'s loop at batch 64 (the server's max batch), then serves the same
plan with ``streamrt serve`` (dynamic batching, max batch 64, 2 GPU instances) and drives it with
``streamrt perf`` over gRPC (binary ``raw_input_contents``) from several client processes whose
concurrencies add up to 64. Target (issue 7): server images/s >= 70% of offline images/s.

Requests carry ``--request-batch`` images each (default 8): a Python client cannot push tens of
thousands of 600 KB single-image requests per second through loopback gRPC, so batching on the
client side keeps the measurement about the server. The report states it.

Usage (on the GPU machine, from the repository root)::

    python scripts/gpu_serving_check.py OUT_DIR [--request-batch 8] [--clients 4] [--seconds 15]

Prints a table and writes OUT_DIR/serving-h200.md (plus the server log).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx

from streamrt.profiling.provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
MODEL = "resnet18"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_plan(out: Path, max_batch: int) -> Path:
    import streamrt
    from streamrt.testing.models import resnet_like
    from streamrt.types import ShapeProfile, ShapeRange

    onnx.save(resnet_like(18), str(out / "resnet18.onnx"))
    profile = ShapeProfile({"images": ShapeRange((1, 3, 224, 224), (max_batch, 3, 224, 224),
                                                 (max_batch, 3, 224, 224))})
    config = streamrt.BuildConfig(backend="torch_inductor", precision="fp16", profiles=(profile,))
    result = streamrt.build(out / "resnet18.onnx", config, out / "resnet18.plan")
    print(f"plan: {result.path} ({'cached' if result.cached else f'built in {result.seconds:.0f} s'})", flush=True)
    return result.path


def offline(plan: Path, batch: int, seconds: float) -> float:
    """Images/s of the engine alone at ``batch`` (streamrt bench's loop), in a child process."""
    code = (
        "import json, numpy as np, streamrt\n"
        "from streamrt.profiling.bench import benchmark\n"
        f"e = streamrt.load({str(plan)!r})\n"
        f"x = np.random.default_rng(0).standard_normal(({batch}, 3, 224, 224)).astype(np.float32)\n"
        f"r = benchmark(e, {{'images': x}}, warmup_ms=1000, duration_s={seconds}, iterations=20)\n"
        f"print(json.dumps({{'qps': r.summary.throughput_qps}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["qps"]) * batch


def wait_ready(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"server not ready after {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--request-batch", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--clients", type=int, default=4, help="client processes sharing the concurrency")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plan = build_plan(args.out, args.max_batch)
    offline_max = offline(plan, args.max_batch, args.seconds)
    offline_req = offline(plan, args.request_batch, args.seconds)
    print(f"offline: batch {args.max_batch} {offline_max:.0f} img/s, batch {args.request_batch} "
          f"{offline_req:.0f} img/s", flush=True)

    repo = args.out / "repo"
    (repo / MODEL / "1").mkdir(parents=True, exist_ok=True)
    target = repo / MODEL / "1" / "model.plan"
    target.write_bytes(plan.read_bytes())
    (repo / MODEL / "config.yaml").write_text(json.dumps({
        "max_batch_size": args.max_batch,
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
        "instance_group": [{"count": args.instances, "kind": "KIND_GPU"}],
    }))
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = open(args.out / "server.log", "wb")  # noqa: SIM115 - closed after the server stops
    server = subprocess.Popen([sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http),
                               "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log-level", "WARNING"],
                              stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_ready(http, 600)
        per = [args.concurrency // args.clients + (i < args.concurrency % args.clients) for i in range(args.clients)]
        procs = [subprocess.Popen(
            [sys.executable, "-m", "streamrt.cli.main", "perf", "-m", MODEL, "-i", "grpc", "-u", f"127.0.0.1:{grpc}",
             "--concurrency-range", str(c), "-b", str(args.request_batch), "--measurement-interval",
             str(int(args.seconds * 1000)), "--warmup-ms", "3000", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for c in per if c > 0]
        results = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=args.seconds + 300)
            if p.returncode != 0:
                print(stderr, file=sys.stderr)
            results.append(json.loads(stdout)[0])
        gpu = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
    finally:
        server.terminate()
        server.wait(120)
        log.close()
    served = sum(r["throughput"] for r in results)
    p99 = max(r["latency_ms"]["p99"] for r in results if r["latency_ms"])
    p50 = float(np.median([r["latency_ms"]["median"] for r in results if r["latency_ms"]]))
    batch = float(np.mean([r["server_us"].get("avg_batch", 0) for r in results]))
    errors = sum(r["errors"] for r in results)
    ratio = served / offline_max
    util = [line for line in gpu.splitlines() if line.startswith(("nv_gpu_utilization{", "nv_gpu_memory_used"))]
    commit = git_commit(ROOT)
    import torch

    gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    table = [
        "| measurement | images/s | note |", "|---|---:|---|",
        f"| engine offline, batch {args.max_batch} (`streamrt bench` loop) | {offline_max:.0f} | the reference |",
        f"| engine offline, batch {args.request_batch} | {offline_req:.0f} | one request's batch alone |",
        f"| server, gRPC binary, concurrency {args.concurrency} x {args.request_batch} img/request | {served:.0f} | "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, avg engine batch {batch:.1f} rows, {errors} errors |",
        f"| **server / offline** | **{ratio:.0%}** | target >= 70%: **{'PASS' if ratio >= 0.7 else 'FAIL'}** |",
    ]
    report = "\n".join([
        "# Serving on the H200: binary gRPC vs the engine offline", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {commit}",
        f"- machine: {gpu_name}, torch {torch.__version__}",
        f"- command: `{shlex.join(['python', 'scripts/gpu_serving_check.py', *sys.argv[1:]])}`",
        f"- model: resnet_like(18), torch_inductor fp16 plan (fp32 I/O), batch profile 1..{args.max_batch}; server: "
        f"dynamic batching (max {args.max_batch}, 500 us delay), {args.instances} GPU instances; "
        f"{len(procs)} `streamrt perf` client processes over gRPC", "",
        *table, "", "GPU metrics at the end of the run:", "", "```", *util, "```", "",
    ])
    print(report)
    (args.out / "serving-h200.md").write_text(report)
    return 0 if ratio >= 0.7 else 1


if __name__ == "__main__":
    sys.exit(main())
