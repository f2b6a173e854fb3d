"""Serving benchmark: StreamRT's dynamic batcher on/off vs Ray Serve ``@serve.batch`` vs plain FastAPI.

All servers serve the **same engine** (one StreamRT ONNX Runtime plan, 1 intra-op thread, loaded
with ``streamrt.load``) behind the **same protocol** (KServe v2 HTTP with binary tensors, decoded
and encoded by the same :mod:`streamrt.serve.wire.protocol` codec), and are driven by the **same
client** (:mod:`streamrt.client.loadgen`, the engine of ``streamrt perf``) at the same concurrency,
in the same run:

* ``streamrt (batching)``: ``streamrt serve`` with ``dynamic_batching`` (max batch 64).
* ``streamrt (no batching)``: the same server and model without ``dynamic_batching``.
* ``ray serve @serve.batch``: one Ray Serve replica whose ``@serve.batch`` method (max batch 64,
  2 ms wait) runs the engine in a worker thread; Ray's HTTP proxy in front.
* ``fastapi (plain)``: one uvicorn worker, a ``def`` handler running the engine per request
  (Starlette's thread pool gives concurrency, no batching).

Every server runs in its own process (the client must not share a GIL with a server); all are
started first, then measured in interleaved rounds (order rotating), so load from other
processes of a shared machine hits each alike; a variant's number is its median over rounds.

The model is a VGG-style CNN (two conv blocks, then 4096-4096-1000 fully connected layers, 38 M
parameters): its batch-1 time is dominated by reading the FC weights, so batching pays on ONNX
Runtime CPU, as it does for most models on a GPU.

Ray is a benchmark-only dependency: ``pip install 'ray[serve]==2.60.0'`` (it brings fastapi and
uvicorn; it also lifts protobuf to 7.x, so run ``pip install 'protobuf<7'`` afterwards for
tritonclient's tests). Without Ray the Ray row is skipped.

Run from the repository root::

    python benchmarks/serving.py --out docs/benchmarks/serving-cpu.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from streamrt.profiling.provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
MODEL = "vgg"


def vgg_like(size: int = 32, fc: tuple[int, ...] = (4096, 4096), classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """Conv-ReLU-Pool x2, then FC layers: weight-bound at batch 1, compute-bound at batch 64."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, cin = [], {}, "x", 3
    for i, c in enumerate((32, 64)):
        inits[f"w{i}"] = (rng.standard_normal((c, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        inits[f"b{i}"] = np.zeros(c, np.float32)
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])]
        x, cin = f"p{i}", c
    nodes.append(helper.make_node("Flatten", [x], ["f0"]))
    feat, prev = cin * (size // 4) ** 2, "f0"
    for j, h in enumerate((*fc, classes)):
        inits[f"fw{j}"] = (rng.standard_normal((h, feat)) * np.sqrt(2 / feat)).astype(np.float32)
        inits[f"fb{j}"] = np.zeros(h, np.float32)
        out = "logits" if j == len(fc) else f"g{j}"
        nodes.append(helper.make_node("Gemm", [prev, f"fw{j}", f"fb{j}"], [out], transB=1))
        if j < len(fc):
            nodes.append(helper.make_node("Relu", [out], [f"gr{j}"]))
            prev = f"gr{j}"
        feat = h
    graph = helper.make_graph(
        nodes, "vgg_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="streamrt")
    model.ir_version = 8
    return model


# --- the peers: the same engine and codec behind FastAPI and Ray Serve ------------------------


class KServeCodec:
    """The KServe v2 routes the client needs, over the StreamRT codec; ``infer_rows(x)`` runs the engine."""

    def __init__(self, plan: str, infer_rows: Any) -> None:
        import streamrt

        engine = streamrt.load(plan)
        spec_in, spec_out = engine.inputs[0], engine.outputs[0]
        engine.close()
        self.infer_rows = infer_rows
        self.rows = self.executions = 0  # counted by the peers so the report shows their batch sizes
        self.meta = json.dumps({
            "name": MODEL, "versions": ["1"], "platform": "peer",
            "inputs": [{"name": spec_in.name, "datatype": "FP32", "shape": list(spec_in.shape)}],
            "outputs": [{"name": spec_out.name, "datatype": "FP32", "shape": list(spec_out.shape)}],
        }).encode()

    async def handle(
        self, method: str, path: str, length: str | None, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        from streamrt.serve.wire.protocol import InferResponse, decode_http_request, encode_http_response

        if method == "GET" and path == f"/v2/models/{MODEL}":
            return 200, {"content-type": "application/json"}, self.meta
        if method == "GET" and path == f"/v2/models/{MODEL}/stats":
            stats = {"model_stats": [{"inference_count": self.rows, "execution_count": self.executions}]}
            return 200, {"content-type": "application/json"}, json.dumps(stats).encode()
        if method != "POST" or path != f"/v2/models/{MODEL}/infer":
            return 404, {}, b'{"error": "not found"}'
        req = decode_http_request(body, int(length) if length else None, model=MODEL, version="", max_elements=2**24)
        logits = await self.infer_rows(req.inputs["x"])
        payload, json_length = encode_http_response(InferResponse(MODEL, "1", req.id, {"logits": logits}), req)
        headers = {"Inference-Header-Content-Length": str(json_length)} if json_length is not None else {}
        return 200, headers, payload


def run_fastapi(plan: str, port: int) -> None:
    """Plain FastAPI: one uvicorn worker, one engine run per request in Starlette's thread pool."""
    import uvicorn
    from fastapi import FastAPI, Request, Response
    from starlette.concurrency import run_in_threadpool

    import streamrt

    app = FastAPI()
    ctx = streamrt.load(plan).create_context()

    async def infer_rows(x: np.ndarray) -> np.ndarray:
        codec.rows, codec.executions = codec.rows + len(x), codec.executions + 1
        return (await run_in_threadpool(ctx.infer, {"x": x}))["logits"]

    codec = KServeCodec(plan, infer_rows)

    async def route(request: Request) -> Response:
        status, headers, body = await codec.handle(
            request.method, request.url.path, request.headers.get("Inference-Header-Content-Length"),
            await request.body())
        return Response(content=body, status_code=status, headers=headers)

    # A plain Starlette route: FastAPI's annotation-driven injection is not needed for a raw body.
    app.router.add_route("/v2/{rest:path}", route, methods=["GET", "POST"])

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def run_ray(plan: str, port: int) -> None:
    """Ray Serve: one replica with ``@serve.batch`` (max 64, 2 ms wait) in front of the engine."""
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    @serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 1})
    class Engine:
        def __init__(self, plan: str) -> None:
            import streamrt

            self.ctx = streamrt.load(plan).create_context()
            self.codec = KServeCodec(plan, self.infer_batch)

        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
        async def infer_batch(self, xs: list[np.ndarray]) -> list[np.ndarray]:
            rows = [len(x) for x in xs]
            self.codec.rows, self.codec.executions = self.codec.rows + sum(rows), self.codec.executions + 1
            out = (await asyncio.to_thread(self.ctx.infer, {"x": np.concatenate(xs)}))["logits"]
            return list(np.split(out, np.cumsum(rows)[:-1]))

        async def __call__(self, request: Request) -> Response:
            status, headers, body = await self.codec.handle(
                request.method, request.url.path, request.headers.get("Inference-Header-Content-Length"),
                await request.body())
            return Response(content=body, status_code=status, headers=headers)

    serve.run(Engine.bind(plan), name=MODEL, route_prefix="/", blocking=False)
    print("ray serve ready", flush=True)
    while True:
        time.sleep(3600)


# --- the harness -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    rounds: list[Any] = field(default_factory=list)


def wait_ready(port: int, timeout: float, process: subprocess.Popen[bytes]) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def start_servers(plan: Path, work: Path, names: list[str], log: Path) -> list[Server]:
    servers = []
    for name in names:
        port = free_port()
        if name.startswith("streamrt"):
            repo = work / name.replace(" ", "_").replace("(", "").replace(")", "")
            (repo / MODEL / "1").mkdir(parents=True, exist_ok=True)
            (repo / MODEL / "1" / "model.plan").write_bytes(plan.read_bytes())
            config: dict[str, Any] = {"max_batch_size": 64}
            if "no batching" not in name:
                config["dynamic_batching"] = {"max_queue_delay_microseconds": 2000}
            (repo / MODEL / "config.yaml").write_text(json.dumps(config))
            cmd = [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(port),
                   "--grpc-port", "-1", "--metrics-port", "-1", "--log-level", "WARNING"]
        else:
            peer = "ray" if name.startswith("ray") else "fastapi"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", peer, "--plan", str(plan),
                   "--port", str(port)]
        out = open(log / f"{name.split()[0]}-{port}.log", "wb")  # noqa: SIM115 - lives as long as the server
        servers.append(Server(name, port, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)))
    for server in servers:
        if not wait_ready(server.port, 240, server.process):
            print(f"  {server.name}: did not become ready (see {log})", file=sys.stderr)
    return [s for s in servers if s.process.poll() is None]


def measure(server: Server, concurrency: int, seconds: float) -> Any:
    from streamrt.client.loadgen import LoadConfig, run_load

    cfg = LoadConfig(url=f"127.0.0.1:{server.port}", model=MODEL, concurrency=(concurrency,),
                     duration_s=seconds, warmup_s=1.5, timeout_s=60)
    return run_load(cfg)[0]


def offline(plan: Path) -> dict[int, float]:
    """The engine alone (streamrt bench's loop): samples/s at batch 1 and 64."""
    import streamrt
    from streamrt.profiling.bench import benchmark

    engine = streamrt.load(plan)
    rng = np.random.default_rng(0)
    out = {}
    for batch in (1, 64):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        result = benchmark(engine, {"x": x}, warmup_ms=300, duration_s=2.0, iterations=5)
        out[batch] = result.summary.throughput_qps * batch
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0, help="measurement window per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--peer", choices=["fastapi", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        (run_ray if args.peer == "ray" else run_fastapi)(args.plan, args.port)
        return 0

    import streamrt

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="streamrt-serving-bench-"))
    onnx.save(vgg_like(), str(work / "vgg.onnx"))
    build = streamrt.BuildConfig(backend_options={"threads": 1})
    plan = streamrt.build(work / "vgg.onnx", build, work / "vgg.plan", cache_dir=work / "cache").path
    names = ["streamrt (batching)", "streamrt (no batching)", "fastapi (plain)"]
    try:
        import ray  # noqa: F401

        if not args.skip_ray:
            names.insert(2, "ray serve @serve.batch")
    except ImportError:
        print("ray is not installed: skipping Ray Serve (pip install 'ray[serve]==2.60.0')", file=sys.stderr)
    engine_rates = offline(plan)
    servers = start_servers(plan, work, names, work)
    try:
        for r in range(args.rounds):
            order = servers[r % len(servers):] + servers[: r % len(servers)]
            for server in order:
                result = measure(server, args.concurrency, args.seconds)
                server.rounds.append(result)
                print(f"round {r + 1} {server.name:<24} {result.throughput:8.1f} infer/s  "
                      f"p99 {result.latency_ms.p99 if result.latency_ms else float('nan'):7.1f} ms  "
                      f"errors {result.errors}", file=sys.stderr)
    finally:
        for server in servers:
            server.process.terminate()
        for server in servers:
            try:
                server.process.wait(30)
            except subprocess.TimeoutExpired:
                server.process.kill()
        if any(s.name.startswith("ray") for s in servers):
            subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True,
                           timeout=60, check=False)
    report = render(servers, engine_rates, args, time.time() - started)
    print(report)
    if args.out:
        args.out.write_text(report)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def render(servers: list[Server], engine: dict[int, float], args: argparse.Namespace, seconds: float) -> str:
    commit = git_commit(ROOT)
    versions = {}
    for package in ("onnxruntime", "aiohttp", "grpcio", "ray", "fastapi", "uvicorn"):
        try:
            from importlib.metadata import version

            versions[package] = version(package)
        except Exception:
            pass
    base = next((s for s in servers if s.name == "streamrt (no batching)"), None)
    base_tp = median(r.throughput for r in base.rounds) if base and base.rounds else float("nan")
    lines = [
        "# Serving on CPU: StreamRT dynamic batching vs Ray Serve @serve.batch vs plain FastAPI", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {commit}",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
        f"{platform.system()} {platform.machine()} (no GPU); client and servers share these cores",
        f"- command: `{shlex.join(['python', 'benchmarks/serving.py', *sys.argv[1:]])}` ({seconds / 60:.1f} min)",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "- model: VGG-style CNN (`vgg_like` in the benchmark: 2 conv blocks + FC 4096-4096-1000, 38 M params), "
        "input 1x3x32x32 float32 per request, ONNX Runtime plan with 1 intra-op thread, loaded with "
        "`streamrt.load` by every server",
        f"- load: `streamrt.client.loadgen` (as `streamrt perf`), HTTP KServe v2 with binary tensors, concurrency "
        f"{args.concurrency}, {args.rounds} interleaved rounds of 1.5 s warm-up + {args.seconds:g} s measurement per "
        "server; the number is the median over rounds",
        f"- the engine alone (`streamrt bench` loop): batch 1 {engine.get(1, 0):.0f} samples/s, "
        f"batch 64 {engine.get(64, 0):.0f} samples/s", "",
        "| server | throughput (infer/s) | vs streamrt no batching | p50 (ms) | p99 (ms) | errors | avg engine batch |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in servers:
        if not s.rounds:
            continue
        tp = median(r.throughput for r in s.rounds)
        p50 = median(r.latency_ms.median for r in s.rounds if r.latency_ms)
        p99 = median(r.latency_ms.p99 for r in s.rounds if r.latency_ms)
        batch = median(r.server_us.get("avg_batch", 0.0) for r in s.rounds)
        lines.append(f"| {s.name} | {tp:.1f} | {tp / base_tp:.2f}x | {p50:.1f} | {p99:.1f} | "
                     f"{sum(r.errors for r in s.rounds)} | {batch:.1f} |")
    lines += ["", "Throughput of each round:", ""]
    lines += [f"- {s.name}: " + ", ".join(f"{r.throughput:.1f}" for r in s.rounds) for s in servers]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
