"""Sharing one GPU between models: three models of different sizes under mixed load, with and without priorities.

Three models are served by one ``streamrt serve`` process and driven at the same time, each by its
own client processes (:mod:`streamrt.client.loadgen`, the engine of ``streamrt perf``) at a load
meant to keep the device saturated. On CUDA the defaults are gRPC, 2 client processes per model,
concurrency 32 per model, 8 images per request and 4 front-end processes in front of the engine
process (``--frontend-processes``): a first H200 run with HTTP, one client process per model, 4
images per request and the one-process front end reached 750-930 requests/s per model at 4-5 %
GPU utilisation, bound by the front end and the clients. The report therefore says plainly
whether the GPU was saturated: NVML's mean utilisation over the measured window against
``--saturation`` (default 80 %); below it, the figures are front-end-bound and say nothing about
sharing a saturated GPU. Each row also gives the server's mean executed batch and the busiest
client process's CPU share (above 80 %: the clients may be the limit).

* ``large``: a ResNet-18-shaped classifier at 224x224 (``streamrt.testing.models.resnet_like``);
* ``medium``: the small CNN at 128x128; ``small``: the small CNN at 32x32.

On CUDA they are torch_inductor fp16 plans (batch 1..16, ``optimization_level`` 0, built through
the build cache, so a second run skips the builds); with ``--device cpu`` they are ONNX Runtime
plans of the small CNN at 64, 32 and 16 pixels (one thread each), for CI.

Every model has dynamic batching (max 16, 500 us) and one instance (``--instances``). Two scenarios, same load:

* ``no priorities``: ``--rate-limit off``: every model executes as soon as it has a batch.
* ``priorities``: ``--rate-limit execution_count``, every instance group needs the resource
  ``device:1`` (one execution on the device at a time), and ``rate_limiter.priority`` is
  medium 1 (the latency-critical model), small 2, large 4: when several wait, the medium model
  is granted 2x as often as small and 4x as often as large.

The table gives throughput and p50/p99 latency per model and scenario; the markdown report goes
to ``OUT/gpu-sharing-<device>.md`` with date, commit and device.

Server start-up: the report gives the seconds from starting ``streamrt serve`` to READY and each
model's load seconds (``nv_model_load_duration_secs``: opening the plan, the batch probe at 1 and
16 rows, the warm-up at 1 and 16 rows, each new batch shape of a CUDA-graph plan costing one
capture), so the rest is the process start (imports, CUDA initialisation, the front-end
processes). The server log (``OUT/gpu-sharing-server.log``, INFO) has each plan's open time.
What the code says about the ~70 s a first H200 run took to become READY: nothing is built on
load (a plan is opened as it is: ``streamrt.open`` of a plan file), the probe and warm-up are four
executions per model at two batch sizes, each new shape a CUDA-graph capture (three warm-up runs
and one capture), and CUDA model loads run one at a time (``MemoryBudget.measuring`` holds a lock
so that each load's memory is measured alone), so READY is the process start plus the sum of the
three loads. None of that accounts for tens of seconds on models this small; the per-model split
in the report says which part it was (a slow process start, e.g. a first import of torch._inductor
and Triton without bytecode caches, shows as a first scenario much slower than the second).

Usage (from the repository root)::

    python benchmarks/gpu_sharing.py OUT                           # the H200: about 3-4 minutes
    python benchmarks/gpu_sharing.py OUT --client-processes 4 --frontend-processes 6 --request-batch 16
    python benchmarks/gpu_sharing.py OUT --device cpu --seconds 5   # CI-sized, ONNX Runtime
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import yaml

from streamrt.config import Precision
from streamrt.profiling.provenance import git_commit
from streamrt.testing.server_process import stop

ROOT = Path(__file__).resolve().parents[1]
START = time.monotonic()


@dataclass(frozen=True)
class Model:
    name: str
    priority: int
    size: int  # image side
    depth: int = 0  # > 0: resnet_like(depth); 0: small_cnn


MODELS = {
    "cuda": (Model("large", 4, 224, depth=18), Model("medium", 1, 128), Model("small", 2, 32)),
    "cpu": (Model("large", 4, 64), Model("medium", 1, 32), Model("small", 2, 16)),
}
SCENARIOS = (("no priorities", "off"), ("priorities", "execution_count"))
LOAD_METRIC = "nv_model_load_duration_secs"


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:5.0f} s] {text}", flush=True)


def onnx_model(model: Model) -> onnx.ModelProto:
    from streamrt.testing.models import resnet_like, small_cnn

    return resnet_like(model.depth) if model.depth else small_cnn(size=model.size)


def build(model: Model, device: str, folder: Path, cache: Path) -> tuple[Path, float]:
    """The model's plan (through the build cache) and the seconds the build took."""
    import streamrt
    from streamrt.types import ShapeProfile, ShapeRange

    source = folder / f"{model.name}.onnx"
    proto = onnx_model(model)
    onnx.save(proto, str(source))
    name = proto.graph.input[0].name
    rest = (3, model.size, model.size)
    profile = ShapeProfile({name: ShapeRange((1, *rest), (8, *rest), (16, *rest))})
    if device == "cuda":
        config = streamrt.BuildConfig(backend="torch_inductor", precision=Precision.FP16, profiles=(profile,),
                                      optimization_level=0, backend_options={"device": "cuda"})
    else:
        config = streamrt.BuildConfig(backend="onnxruntime", profiles=(profile,), backend_options={"threads": 1})
    started = time.perf_counter()
    plan = streamrt.build(source, config, folder / f"{model.name}.plan", cache_dir=cache).path
    return Path(plan), time.perf_counter() - started


def write_repo(repo: Path, plans: dict[str, Path], models: tuple[Model, ...], limited: bool,
               instances: int = 1) -> None:
    for model in models:
        folder = repo / model.name / "1"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.plan").write_bytes(plans[model.name].read_bytes())
        group: dict[str, Any] = {"count": instances}
        if limited:
            group["rate_limiter"] = {"resources": [{"name": "device", "count": 1}], "priority": model.priority}
        config = {"max_batch_size": 16, "instance_group": [group],
                  "dynamic_batching": {"max_queue_delay_microseconds": 500}}
        (repo / model.name / "config.yaml").write_text(yaml.safe_dump(config))


def _serving_frontend() -> Any:
    """benchmarks/serving_frontend.py (free_port, wait_ready), loaded by path: benchmarks is no package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_frontend", ROOT / "benchmarks" / "serving_frontend.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


def start_server(repo: Path, ports: Ports, rate_limit: str, frontends: int, log: Path) -> subprocess.Popen[bytes]:
    port = ports.http
    cmd = [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(ports.http),
           "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics), "--log-level", "INFO",
           "--rate-limit", rate_limit, "--frontend-processes", str(frontends)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with log.open("ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _serving_frontend().wait_ready(port, 300, process)
    except SystemExit as exc:
        process.terminate()
        raise SystemExit(f"{exc}; see {log}") from None
    return process


def load_seconds(port: int) -> dict[str, float]:
    """Each model's load seconds from the server's ``/metrics`` (empty if it cannot be read)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        match = re.match(LOAD_METRIC + r'\{[^}]*model="([^"]+)"[^}]*\} ([0-9.eE+-]+)', line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


class UtilisationSampler:
    """Mean GPU utilisation (NVML, device 0) while the measurement runs; None without pynvml or a GPU."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, delay: float) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            return

        def sample() -> None:
            if self._stop.wait(delay):
                return
            while not self._stop.wait(0.2):
                self.samples.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        return sum(self.samples) / len(self.samples) if self.samples else None


def drive(port: int, models: tuple[Model, ...], args: argparse.Namespace) -> tuple[dict[str, Any], float | None]:
    """Load every model at once, each from its own client process: the LevelResult per model, and the
    mean GPU utilisation over the measured window."""
    from streamrt.client.loadgen import LoadConfig, run_load

    configs = {m.name: LoadConfig(url=f"127.0.0.1:{port}", model=m.name, protocol=args.protocol,
                                  concurrency=(args.concurrency,), batch_size=args.request_batch,
                                  duration_s=args.seconds, warmup_s=args.warmup, timeout_s=120,
                                  processes=args.client_processes) for m in models}
    sampler = UtilisationSampler()
    with ProcessPoolExecutor(len(configs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(run_load, cfg) for name, cfg in configs.items()}
        sampler.start(delay=args.warmup + 2.0 + args.client_processes)  # + the client processes' start
        results = {name: future.result()[0] for name, future in futures.items()}
    return results, sampler.stop()


@dataclass
class Scenario:
    """One scenario's measurements: per-model load results, GPU utilisation and the server's start-up."""

    per_model: dict[str, Any]
    utilisation: float | None
    ready_s: float
    loads: dict[str, float]


def run_scenario(label: str, rate_limit: str, plans: dict[str, Path], models: tuple[Model, ...],
                 args: argparse.Namespace, work: Path) -> Scenario:
    repo = work / f"repo-{rate_limit}"
    write_repo(repo, plans, models, limited=rate_limit != "off", instances=args.instances)
    sf = _serving_frontend()
    ports = Ports(sf.free_port(), sf.free_port(), sf.free_port())
    started = time.perf_counter()
    process = start_server(repo, ports, rate_limit, args.frontend_processes, args.out / "gpu-sharing-server.log")
    ready_s = time.perf_counter() - started
    loads = load_seconds(ports.metrics)
    say(f"{label}: server ready in {ready_s:.1f} s (model loads: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in loads.items())
        + f"); driving {len(models)} models over {args.protocol} at concurrency {args.concurrency} each "
        f"({args.client_processes} client processes per model) for {args.seconds:.0f} s")
    try:
        per_model, utilisation = drive(ports.grpc if args.protocol == "grpc" else ports.http, models, args)
        return Scenario(per_model, utilisation, ready_s, loads)
    finally:
        stop(process)


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return str(torch.cuda.get_device_name(0))
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def verdict(utilisation: float | None, threshold: float) -> str:
    """Whether the GPU was saturated, in words for the report."""
    if utilisation is None:
        return "unknown (no NVML reading): not a measurement of a saturated GPU"
    if utilisation >= threshold:
        return f"yes: GPU util {utilisation:.0f} % >= {threshold:g} %"
    return (f"NO: GPU util {utilisation:.0f} % < {threshold:g} %: the figures are front-end-bound (server front end "
            "or clients), not a measurement of sharing a saturated GPU")


def render(results: dict[str, Scenario], models: tuple[Model, ...], builds: dict[str, float],
           args: argparse.Namespace) -> str:
    transport = "gRPC" if args.protocol == "grpc" else "HTTP binary tensors"
    lines = [
        f"# Sharing one {args.device.upper()} between three models: throughput and latency with and without "
        "priorities", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commit {git_commit(ROOT)}; "
        f"device: {device_name(args.device)}",
        "- command: `python benchmarks/gpu_sharing.py " + " ".join(sys.argv[1:]) + "`",
        f"- load: every model at once, concurrency {args.concurrency} each ({args.client_processes} client "
        f"process(es) per model, {transport}, {args.request_batch} images per request), {args.warmup:g} s "
        f"warm-up, {args.seconds:g} s measured; `GPU util` is NVML's mean over the measured window (- without "
        f"NVML); `saturated`: GPU util >= {args.saturation:g} %; `avg batch`: the server's mean executed batch "
        "(images); `client busy`: the busiest client process's CPU share of the window (> 80 %: the clients may "
        "be the limit)",
        f"- serving: {args.frontend_processes} front-end process(es) (`--frontend-processes`), "
        f"dynamic batching (max 16, 500 us), {args.instances} instance(s) per model; `priorities` runs with "
        "`--rate-limit execution_count`, a resource `device: 1` for every instance group and the "
        "`rate_limiter.priority` shown (lower value: granted more often)",
        "- build seconds (0: from the build cache): "
        + ", ".join(f"{name} {seconds:.1f}" for name, seconds in builds.items()), "",
        "| scenario | model | input | priority | infer/s | images/s | p50 ms | p99 ms | errors | avg batch "
        "| client busy % | GPU util % | saturated |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, scenario in results.items():
        utilisation = scenario.utilisation
        util = f"{utilisation:.0f}" if utilisation is not None else "-"
        saturated = "-" if utilisation is None else ("yes" if utilisation >= args.saturation else "no")
        for model in models:
            r = scenario.per_model[model.name]
            lat = r.latency_ms
            what = f"resnet{model.depth}-like" if model.depth else "small cnn"
            priority = str(model.priority) if label == "priorities" else "-"
            p50 = f"{lat.median:.2f}" if lat else "-"
            p99 = f"{lat.p99:.2f}" if lat else "-"
            lines.append(f"| {label} | {model.name} | {what} {model.size}x{model.size} | {priority} | "
                         f"{r.throughput:.1f} | {r.throughput * args.request_batch:.1f} | {p50} | {p99} | "
                         f"{r.errors} | {r.server_us.get('avg_batch', 0.0):.1f} | {r.client_busy * 100:.0f} | "
                         f"{util} | {saturated} |")
    lines.append("")
    for label, scenario in results.items():
        lines.append(f"- **{label}: GPU saturated? {verdict(scenario.utilisation, args.saturation)}**")
    for label, scenario in results.items():
        loads = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in scenario.loads.items()) or "-"
        lines.append(f"- {label}: server ready {scenario.ready_s:.1f} s after its start; model loads "
                     f"(`{LOAD_METRIC}`, 2 at a time): {loads}")
    warnings = sorted({r.warning for s in results.values() for r in s.per_model.values() if r.warning})
    lines += [f"- client warning: {w}" for w in warnings]
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="folder for the markdown report (and the server log)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per scenario "
                        "(default 15 on CUDA, 5 on the CPU)")
    parser.add_argument("--warmup", type=float, default=None, help="warm-up seconds (default 3 on CUDA, 1 on the CPU)")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight per model "
                        "(default 32 on CUDA, 4 on the CPU)")
    parser.add_argument("--request-batch", type=int, default=None, help="images per request "
                        "(default 8 on CUDA, 1 on the CPU)")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="default grpc")
    parser.add_argument("--client-processes", type=int, default=None, help="load-generator processes per model "
                        "sharing its concurrency (default 2 on CUDA, 1 on the CPU)")
    parser.add_argument("--frontend-processes", type=int, default=None, help="the server's HTTP/gRPC front-end "
                        "processes (default 4 on CUDA, 1 on the CPU)")
    parser.add_argument("--instances", type=int, default=1, help="instances per model (default 1)")
    parser.add_argument("--saturation", type=float, default=80.0, help="GPU util %% from which the GPU counts as "
                        "saturated (default 80)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build cache (default: the user's)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.seconds = args.seconds or (15.0 if cuda else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (3.0 if cuda else 1.0)
    args.concurrency = args.concurrency or (32 if cuda else 4)
    args.request_batch = args.request_batch or (8 if cuda else 1)
    args.client_processes = args.client_processes or (2 if cuda else 1)
    args.frontend_processes = args.frontend_processes or (4 if cuda else 1)
    args.out.mkdir(parents=True, exist_ok=True)
    models = MODELS[args.device]
    with tempfile.TemporaryDirectory(prefix="streamrt-sharing-") as tmp:
        work = Path(tmp)
        cache = args.cache_dir or Path(os.environ.get("STREAMRT_CACHE", Path.home() / ".cache" / "streamrt"))
        plans, builds = {}, {}
        for model in models:
            plans[model.name], builds[model.name] = build(model, args.device, work, cache)
            say(f"{model.name}: plan ready in {builds[model.name]:.1f} s")
        results = {label: run_scenario(label, mode, plans, models, args, work) for label, mode in SCENARIOS}
    report = render(results, models, builds, args)
    path = args.out / f"gpu-sharing-{args.device}.md"
    path.write_text(report)
    print(report)
    say(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
