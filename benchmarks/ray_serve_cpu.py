"""Ray Serve on the CPU: N StreamRT replicas vs one, and the per-request cost of Ray's edge.

Measures, with the same client (:mod:`streamrt.client.loadgen`, binary KServe v2 HTTP):

* a CPU-bound model (ResNet-18-shaped, 3x224x224, ONNX Runtime with 1 intra-op thread per
  instance, no dynamic batching: every request is one engine run) at concurrency 4, served by
  ``streamrt serve`` with 1 and 2 instances, and by Ray Serve with 1 and 2 replicas (1 CPU each);
* a light model (``small_cnn``, 3x32x32) at concurrency 1, ``streamrt serve`` vs one Ray replica:
  the latency difference is what Ray's proxy and routing add per request.

Run from the repository root (needs the ``ray`` extra)::

    python benchmarks/ray_serve_cpu.py --out docs/benchmarks/ray-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import onnx

from streamrt.profiling.provenance import git_commit
from streamrt.testing import server_process
from streamrt.testing.models import CATALOGUE, resnet_like
from streamrt.testing.server_process import free_port

ROOT = Path(__file__).resolve().parents[1]


def make_repo(root: Path, instances: int) -> Path:
    for name, model in (("heavy", resnet_like(18)), ("light", CATALOGUE["small_cnn"].make())):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
        (root / name / "config.yaml").write_text(
            f"max_batch_size: 8\ninstance_group: [{{count: {instances}, kind: KIND_CPU}}]\n"
            "build: {backend_options: {threads: 1}}\n")
    return root


def wait_ready(port: int, timeout: float = 300) -> None:
    server_process.wait_ready(port, timeout, path="/v2/models/heavy/ready", poll_s=0.5)


def measure(port: int, model: str, concurrency: int, seconds: float) -> Any:
    from streamrt.client.loadgen import LoadConfig, run_load

    cfg = LoadConfig(url=f"127.0.0.1:{port}", model=model, concurrency=(concurrency,), duration_s=seconds,
                     warmup_s=2.0, timeout_s=120)
    return run_load(cfg)[0]


def row(name: str, result: Any) -> str:
    lat = result.latency_ms
    return (f"| {name} | {result.throughput:.1f} | {lat.median:.2f} | {lat.p99:.2f} | {result.requests} | "
            f"{result.errors} |" if lat else f"| {name} | - | - | - | {result.requests} | {result.errors} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    import ray
    from ray import serve

    from streamrt.integrations.ray_serve import streamrt_app

    work = Path(tempfile.mkdtemp(prefix="streamrt-ray-bench-"))
    rows: dict[str, Any] = {}
    for instances in (1, 2):
        repo, port = make_repo(work / f"serve{instances}", instances), free_port()
        path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))  # keep carried packages
        env = {**os.environ, "PYTHONPATH": path}
        proc = subprocess.Popen([sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port",
                                 str(port), "--grpc-port", "-1", "--metrics-port", "-1", "--log-level", "WARNING"],
                                env=env)
        try:
            wait_ready(port)
            rows[f"streamrt serve, {instances} instance(s): heavy c=4"] = measure(port, "heavy", 4, args.seconds)
            if instances == 1:
                rows["streamrt serve: light c=1"] = measure(port, "light", 1, args.seconds)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    repo = make_repo(work / "ray", 1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        for replicas in (1, 2):
            serve.run(streamrt_app(repo, num_replicas=replicas, ray_actor_options={"num_cpus": 1}),
                      name="streamrt", route_prefix="/", blocking=False)
            wait_ready(port)
            time.sleep(2.0)
            rows[f"ray serve, {replicas} replica(s): heavy c=4"] = measure(port, "heavy", 4, args.seconds)
            if replicas == 1:
                rows["ray serve, 1 replica: light c=1"] = measure(port, "light", 1, args.seconds)
    finally:
        serve.shutdown()
        ray.shutdown()
    table = ["| server: model, concurrency | req/s | p50 ms | p99 ms | requests | errors |",
             "|---|---|---|---|---|---|"]
    table += [row(name, result) for name, result in rows.items()]
    one, two = (rows[f"ray serve, {n} replica(s): heavy c=4"].throughput for n in (1, 2))
    light_serve, light_ray = rows["streamrt serve: light c=1"], rows["ray serve, 1 replica: light c=1"]
    overhead = (light_ray.latency_ms.median - light_serve.latency_ms.median) if light_ray.latency_ms and \
        light_serve.latency_ms else float("nan")
    summary = [f"- Ray, 2 replicas / 1 replica (heavy, c=4): **{two / one:.2f}x** (target >= 0.8 x 2 = 1.6x)",
               f"- Ray's edge per request (light, c=1, p50 Ray - p50 streamrt serve): **{overhead:.2f} ms**"]
    report = "\n".join([
        "# Ray Serve on the CPU: replicas and per-request overhead", "",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Commit: {git_commit(ROOT)}. "
        f"Python {platform.python_version()}, ray {ray.__version__}.",
        f"Command: `{' '.join(shlex.quote(a) for a in ['python', *sys.argv])}`", "",
        "Machine: a **shared 2-core box** (up to 8 other jobs running at the same time): one round each, "
        "not interleaved; read ratios as rough.", "",
        *summary, "", *table, ""])
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
