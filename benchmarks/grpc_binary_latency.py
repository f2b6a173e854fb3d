"""Where one 4.8 MB binary gRPC request's latency goes, against the same request in system shared memory.

Issue 26: on the H200 a binary gRPC request of 8 fp32 images took ~20 ms at p99 at concurrency 4
while its tensor in system shared memory took ~10 ms at concurrency 10. This benchmark serves a null
model (``benchmarks/serving_frontend.py``'s ReduceMean, ONNX Runtime CPU, max batch 64, 500 us
delay, 2 instances: compute is negligible and fixed) with a real ``streamrt serve`` and sends
``[8, 3, 224, 224]`` fp32 requests from ``concurrency`` client processes (one channel each, requests
back to back, the body serialized once, as ``streamrt perf`` does), binary (``raw_input_contents``)
or with the input in a registered system shared-memory region.

Every request carries an ``x-probe`` id (metadata and request id). Probes in every server process
(a ``sitecustomize`` on the server's ``PYTHONPATH``; front-end workers inherit it) and the server's
own trace file (``--trace-file``) record ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, one clock for
every process of the machine) at each step, so one request's time splits into: client build,
client call -> server call start (headers seen by a server interceptor), call start -> handler
(the message body received by grpcio), parse, front-end hand-off (arena write, channel), queue and
batching, compute, the way back, and reply send + client receive.

``--variants`` names server configurations to compare side by side in one run (``VARIANTS``).

Usage (from the repository root)::

    python benchmarks/grpc_binary_latency.py [--requests 60] [--concurrency 1,2,4] [--frontends 1,2] \
        [--variants default] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamrt.profiling.provenance import git_commit
from streamrt.testing.server_process import stop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
PROBE_ENV = "STREAMRT_LATENCY_PROBE_DIR"
SHAPE = (8, 3, 224, 224)
MODEL = "null_image"

VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    # glibc keeps freed 4.8 MB buffers in the heap (no first-touch page faults per request): tried, no gain
    "malloc-env": {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
}
"""Server configurations: name -> environment variables of the server's processes."""

# (label, start event, end event, path): "1" one process only, "N" front-end workers only, "" both.
STAGES = (
    ("client: request id + body", "start", "built", ""),
    ("client call -> server call start", "built", "headers", ""),
    ("call start -> handler (body received)", "headers", "handler", ""),
    ("parse", "handler", "parsed", ""),
    ("worker: arena write + send", "parsed", "sent", "N"),
    ("channel -> engine", "sent", "engine", "N"),
    ("engine: unpack -> queued", "engine", "QUEUE_START", "N"),
    ("parse -> queued", "parsed", "QUEUE_START", "1"),
    ("queue + batching delay", "QUEUE_START", "COMPUTE_START", ""),
    ("compute (instance)", "COMPUTE_START", "COMPUTE_END", ""),
    ("compute end -> response ready", "COMPUTE_END", "REQUEST_END", ""),
    ("engine -> worker reply", "REQUEST_END", "replied", "N"),
    ("serialize reply (-> handler return)", "replied", "answered", "N"),
    ("serialize reply", "REQUEST_END", "answered", "1"),
    ("reply send + client receive", "answered", "done", ""),
)


# --- the probes (run inside the server's processes) -------------------------------------------------


def install_probes(folder: str) -> None:
    """Record the steps of each probed request in this process (called by the server's ``sitecustomize``)."""
    import contextvars

    import grpc

    from streamrt.serve.listeners import grpc_service
    from streamrt.serve.listeners.frontends import supervisor, tensors

    out = open(Path(folder) / f"{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115 - process lifetime
    current: contextvars.ContextVar[str | None] = contextvars.ContextVar("probe", default=None)

    def record(probe: str | None, event: str) -> None:
        if probe:
            out.write(json.dumps({"id": probe, "event": event, "ns": time.perf_counter_ns()}) + "\n")

    class CallStart(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            record(dict(details.invocation_metadata or ()).get("x-probe"), "headers")
            return await continuation(details)

    server = grpc.aio.server

    def _server(*args: Any, **kwargs: Any) -> Any:
        kwargs["interceptors"] = [*kwargs.get("interceptors", ()), CallStart()]
        return server(*args, **kwargs)

    grpc.aio.server = _server

    model_infer = grpc_service.InferenceRpcs.ModelInfer

    async def ModelInfer(self: Any, request: bytes, context: Any) -> Any:
        probe = dict(context.invocation_metadata() or ()).get("x-probe")
        current.set(probe)
        record(probe, "handler")
        answer = await model_infer(self, request, context)
        record(probe, "answered")
        return answer

    grpc_service.InferenceRpcs.ModelInfer = ModelInfer  # type: ignore[method-assign]

    parse = grpc_service.parse_infer_request

    def parse_infer_request(*args: Any, **kwargs: Any) -> Any:
        request = parse(*args, **kwargs)
        record(current.get(), "parsed")
        return request

    grpc_service.parse_infer_request = parse_infer_request

    pack = tensors.pack_request_tensors

    def pack_request_tensors(*args: Any, **kwargs: Any) -> Any:
        packed = pack(*args, **kwargs)
        record(current.get(), "sent")
        return packed

    tensors.pack_request_tensors = pack_request_tensors  # the worker (__main__) imports it after this

    unpack_outputs = tensors.unpack_outputs

    def _unpack_outputs(*args: Any, **kwargs: Any) -> Any:
        record(current.get(), "replied")
        return unpack_outputs(*args, **kwargs)

    tensors.unpack_outputs = _unpack_outputs

    unpack = supervisor.unpack_request

    def unpack_request(message: Any, *args: Any, **kwargs: Any) -> Any:
        record(message[4], "engine")
        return unpack(message, *args, **kwargs)

    supervisor.unpack_request = unpack_request


SITECUSTOMIZE = f"""import os, sys
if os.environ.get({PROBE_ENV!r}):
    sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
    import grpc_binary_latency
    grpc_binary_latency.install_probes(os.environ[{PROBE_ENV!r}])
"""


# --- the client (one process per concurrent request stream) ----------------------------------------


def client(port: int, tag: str, requests: int, shm: bool, start_at: float, out: Path) -> None:
    """``requests`` back-to-back ModelInfer calls on one channel; client timestamps to ``out``."""
    import grpc
    import numpy as np

    from streamrt.serve.wire.proto import SERVICE, messages

    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
        ("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)])
    infer = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=lambda b: b,
                                response_deserializer=messages.ModelInferResponse.FromString)
    x = np.random.default_rng().standard_normal(SHAPE, dtype=np.float32)
    region = None
    if shm:
        import tritonclient.utils.shared_memory as shm_utils

        name = f"latency_{os.getpid()}"
        region = shm_utils.create_shared_memory_region(name, f"/{name}", x.nbytes)
        shm_utils.set_shared_memory_region(region, [x])
        register = channel.unary_unary(f"/{SERVICE}/SystemSharedMemoryRegister",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=messages.SystemSharedMemoryRegisterResponse.FromString)
        register(messages.SystemSharedMemoryRegisterRequest(name=name, key=f"/{name}", offset=0, byte_size=x.nbytes))
    request = messages.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=list(SHAPE))
    if shm:
        tensor.parameters["shared_memory_region"].string_param = name
        tensor.parameters["shared_memory_byte_size"].int64_param = x.nbytes
    else:
        request.raw_input_contents.append(x.tobytes())
    body = request.SerializeToString()  # once, as streamrt perf does; each request prepends its id (field 3)
    records = []
    time.sleep(max(0.0, start_at - time.time()))
    for index in range(requests):
        probe = f"{tag}-{index}"
        started = time.perf_counter_ns()
        message = messages.ModelInferRequest(id=probe).SerializeToString() + body
        built = time.perf_counter_ns()
        infer(message, metadata=(("x-probe", probe),), timeout=60)
        records.append({"id": probe, "start": started, "built": built, "done": time.perf_counter_ns()})
    out.write_text(json.dumps(records))
    channel.close()
    if region is not None:
        shm_utils.destroy_shared_memory_region(region)


# --- the driver -------------------------------------------------------------------------------------


def _events(folder: Path, trace: Path) -> dict[str, dict[str, int]]:
    events: dict[str, dict[str, int]] = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            events.setdefault(record["id"], {})[record["event"]] = record["ns"]
    if trace.exists():
        for line in trace.read_text().splitlines():
            record = json.loads(line)
            for stamp in record["timestamps"]:
                events.setdefault(record["request_id"], {})[stamp["name"]] = stamp["ns"]
    return events


def run_level(port: int, work: Path, probes: Path, trace: Path, concurrency: int, requests: int, shm: bool,
              warmup: int = 5) -> dict[str, Any]:
    """One concurrency level: per-stage and total latency percentiles (ms) of the measured requests."""
    import numpy as np

    level = f"{'s' if shm else 'b'}{concurrency}"
    outs = [work / f"client-{level}-{w}.json" for w in range(concurrency)]
    start_at = time.time() + 1.5
    children = [subprocess.Popen([sys.executable, __file__, "--client", str(port), f"{level}-{w}",
                                  str(requests + warmup), str(int(shm)), str(start_at), str(out)], cwd=ROOT)
                for w, out in enumerate(outs)]
    for child in children:
        if child.wait(300) != 0:
            raise SystemExit(f"client failed ({child.returncode})")
    time.sleep(0.3)  # the last trace lines
    events = _events(probes, trace)
    rows: list[dict[str, int]] = []
    for out in outs:
        for record in json.loads(out.read_text()):
            if int(record["id"].split("-")[-1]) >= warmup:
                rows.append({**events.get(record["id"], {}), **record})
    stages: dict[str, tuple[float, float, float]] = {}
    for label, first, last, _ in STAGES:
        spans = [(r[last] - r[first]) / 1e6 for r in rows if first in r and last in r]
        if len(spans) == len(rows):
            stages[label] = (float(np.percentile(spans, 50)), float(np.mean(spans)), float(np.percentile(spans, 99)))
    totals = [(r["done"] - r["built"]) / 1e6 for r in rows]  # from the call, as streamrt perf times it
    return {"stages": stages, "p50": float(np.percentile(totals, 50)), "p99": float(np.percentile(totals, 99)),
            "mean": float(np.mean(totals)), "requests": len(rows)}


def measure(frontends: int, variant: str, levels: list[int], requests: int, work: Path) -> dict[str, Any]:
    """Every (transport, concurrency) level through one server: ``{"binary c1": level, ...}``."""
    import serving_frontend as sf

    folder = work / f"{variant}-{frontends}"
    probes = folder / "probes"
    probes.mkdir(parents=True)
    (work / "site").mkdir(exist_ok=True)
    (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    repo = work / "repo"
    if not repo.exists():
        sf.write_repository(repo)
    http, grpc_port = sf.free_port(), sf.free_port()
    trace = folder / "trace.jsonl"
    env = {**os.environ, **VARIANTS[variant], PROBE_ENV: str(probes), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(work / "site"), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    extra = ["--frontend-processes", str(frontends)] if frontends > 1 else []
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - closed after the server stops
    server = subprocess.Popen(
        [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--model", MODEL, "--http-port", str(http),
         "--grpc-port", str(grpc_port), "--metrics-port", "-1", "--log-level", "WARNING", "--trace-file", str(trace),
         *extra], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    results: dict[str, Any] = {}
    try:
        sf.wait_ready(http, 300, server)
        for shm in (False, True):
            for concurrency in levels:
                key = f"{'system shm' if shm else 'binary'} c{concurrency}"
                results[key] = run_level(grpc_port, folder, probes, trace, concurrency, requests, shm)
                print(f"  {variant}, {frontends} front end(s), {key}: p50 {results[key]['p50']:.2f} "
                      f"p99 {results[key]['p99']:.2f} ms", flush=True)
    finally:
        stop(server)
        log.close()
    return results


def tables(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: a latency table over every configuration, then one breakdown table per configuration."""
    configs = list(results)
    keys = list(next(iter(results.values())))
    lines = ["| configuration | " + " | ".join(keys) + " |", "|---" + "|---:" * len(keys) + "|"]
    for config in configs:
        cells = [f"{results[config][k]['p50']:.1f} / {results[config][k]['p99']:.1f}" for k in keys]
        lines.append(f"| {config} (p50 / p99 ms) | " + " | ".join(cells) + " |")
    for config in configs:
        lines += ["", f"**{config}**: each stage's mean / p99 in ms (from the call on, the means add up to the "
                  "mean total, timed from the call as `streamrt perf` times it)", "",
                  "| stage | " + " | ".join(keys) + " |", "|---" + "|---:" * len(keys) + "|"]
        one = "1 process" in config
        labels = [label for label, _, _, path in STAGES if path != ("N" if one else "1")]
        for label in labels:
            cells = []
            for k in keys:
                stage = results[config][k]["stages"].get(label)
                cells.append("" if stage is None else f"{stage[1]:.2f} / {stage[2]:.2f}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("| **total (mean / p99)** | " + " | ".join(
            f"**{results[config][k]['mean']:.2f} / {results[config][k]['p99']:.2f}**" for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--client":
        port, tag, requests, shm, start_at, out = argv[1:7]
        client(int(port), tag, int(requests), shm == "1", float(start_at), Path(out))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="measured requests per client (after 5 warm-ups)")
    parser.add_argument("--concurrency", default="1,2,4", help="client processes, comma-separated levels")
    parser.add_argument("--frontends", default="1,2", help="front-end process counts, comma-separated")
    parser.add_argument("--variants", default="default", help=f"server variants of {sorted(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=None, help="append the tables to this markdown file")
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="streamrt-latency-"))
    levels = [int(c) for c in args.concurrency.split(",")]
    results = {}
    for variant in args.variants.split(","):
        for frontends in (int(f) for f in args.frontends.split(",")):
            label = f"{variant}, {'1 process' if frontends == 1 else f'{frontends} front ends'}"
            results[label] = measure(frontends, variant, levels, args.requests, work)
    text = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit(ROOT)}, "
            f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}), "
            f"`python benchmarks/grpc_binary_latency.py {' '.join(argv)}`\n\n{tables(results)}\n")
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    if args.out is not None:
        with args.out.open("a") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
