"""H200 check (issues 12 and 26): the server's front-end ceiling and ResNet fp16 plans served vs offline.

One call, under 9 minutes, writes ``OUT/serving-h200.md``:

(a) **Front-end ceiling**: a null model (ReduceMean of each item on ONNX Runtime CPU, max batch 64,
    2 instances; see ``benchmarks/serving_frontend.py``) driven by ``streamrt perf`` from
    ``--processes`` client processes at concurrency ``--concurrency``, for 64 B, 600 KB and 4.8 MB
    requests over HTTP (binary tensors) and gRPC: requests/s, GB/s, p50/p99, server CPU per request.
(b) **ResNet-50 fp16** (and ResNet-18 fp16 when the time budget allows) torch_inductor plans,
    batch profile 1..64, served with dynamic batching (max 64) on 2 GPU instances, at concurrency
    64 with ``--request-batch`` images per request over binary gRPC, system shared memory and
    CUDA shared memory. The reference is the engine's best offline at the server's placement,
    measured in the same run: as many threads as server instances, each with a context and stream
    of its own (so CUDA graphs exactly when the server's contexts use them), ``streamrt bench``'s
    loop at the max batch, its half and its quarter; the best of those is 100% and every served
    row gives its share of it. (One bench loop at batch 64, the reference before issue 26, was
    beaten by the two-instance server.)
    Each served row ends with the server's own time per request (queue, input, infer, output: Triton's
    statistics, a batch's times counted for each of its requests). ``--direct-copies both`` serves the
    two host transports a second time from a server whose engine process gathers each batch into a
    pinned staging slot (``STREAMRT_DIRECT_HOST_COPIES=0``) instead of copying each request straight from
    its page-locked arena or shared-memory region to the device (the server's default since 2026-12-05:
    the gathered path stopped both host transports at ~1,000 requests/s of 4.8 MB on the H200).
    ``--env-variants 'A=1;B=2'`` serves them again from a server per variant with those environment variables,
    such as the engine process's copy threads (``STREAMRT_STAGING_THREADS``: a large batch gathered into its
    pinned slot in pieces on that many threads, each piece's host-to-device copy enqueued as it lands, ``off``
    for one gather and one copy; :mod:`streamrt.device.row_copier`) or ``STREAMRT_BLOCKING_SYNC=1`` (instance
    threads sleep instead of spinning while their batch runs).
(c) **Under a latency bound** (first model only): ``streamrt perf --latency-bound-ms 15`` (MLPerf's
    Server bound for ResNet-50) over each transport: the highest images/s whose p99 stays within
    15 ms, searched over concurrency ``--bound-range`` (doubling, then bisecting to its step), a row
    each with the concurrency found and the levels tried.

Targets (issue 26, of the engine's best offline): p99 <= 15 ms: gRPC binary >= 80%, system shm >= 90%,
CUDA shm >= 95%; concurrency 64 without a bound: gRPC binary >= 85%. Issue 12's: CUDA shm >= 85%, system
shm >= 70%; gRPC ceiling >= 3 GB/s at 4.8 MB and >= 10,000 requests/s at 64 B.

``--frontend-processes 1,4,8`` runs (a) once per front-end process count (``streamrt serve
--frontend-processes N``: N worker processes on the ports, tensors to the engine process through
shared memory; docs/serving-frontends.md) and (b) with the largest count.

Plans take 60-100 s each to build here; pass ``--plans DIR`` with ``resnet50.plan`` /
``resnet18.plan`` from an earlier run (this script leaves them in ``OUT/plans``) to skip that.

Usage (on the GPU machine, from the repository root)::

    python scripts/gpu_serving_check.py OUT [--plans DIR] [--models resnet50,resnet18] [--seconds 5] \
        [--frontend-processes 1,4,8] [--latency-bound-ms 15] [--bound-range 4:256:2] [--bound-seconds 3] \
        [--direct-copies off|on|both] [--env-variants 'STREAMRT_STAGING_THREADS=off;STREAMRT_BLOCKING_SYNC=1']

    # (b) and (c) alone, ResNet-50 (about 6 minutes with the plan build, 4.5 with --plans):
    python scripts/gpu_serving_check.py OUT --skip-frontend --models resnet50

``--device cpu --quick`` is the CPU smoke run (tests/serve/test_gpu_serving_check.py): a tiny conv net
built by the same ``build_plan`` on the CPU, one request size per protocol, short windows; it runs
every code path that builds, measures, formats rows and records failures (the CUDA shared-memory
variant fails there, as it should, and becomes a failed row, in (b) and in (c)). Each part handles its own failure
(``scripts/_gpu_parts.py``) and the report is written after every part, so a crash in one part no
longer loses the others' numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from streamrt.profiling.provenance import git_commit
from streamrt.testing.server_process import stop

ROOT = Path(__file__).resolve().parents[1]
START = time.monotonic()
sys.path.insert(0, str(ROOT / "scripts"))
import _serving_check_clients as clients  # noqa: E402 - the scripts folder is not a package
import _serving_check_placement as placement  # noqa: E402
from _gpu_parts import Report  # noqa: E402
from _serving_check_args import (  # noqa: E402
    DIRECT_ENV,
    TRANSPORTS,
    parse_args,
)

sf = clients.sf


def _cell(text: str) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(text.split()).replace("|", "/")


def elapsed() -> float:
    return time.monotonic() - START


def say(text: str) -> None:
    print(f"[{elapsed():5.0f} s] {text}", flush=True)


def _network(name: str) -> Any:
    """torchvision's ``name`` with random weights, or ``tiny`` (the CPU smoke run's conv net)."""
    import torch

    if name == "tiny":
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.Flatten(), torch.nn.Linear(8, 10))
    import torchvision

    return getattr(torchvision.models, name)()


def build_plan(name: str, out: Path, max_batch: int, device: str = "cuda") -> Path:
    """torchvision ResNet (random weights) -> torch_inductor plan, batch 1..max_batch, fp32 I/O.

    fp16 on CUDA; fp32 on the CPU (the smoke run: Inductor's CPU code at fp16 is slow and beside the point).
    """
    import torch

    import streamrt
    from streamrt import build_module
    from streamrt.types import ShapeProfile, ShapeRange

    net = _network(name).eval().to(device)
    profile = ShapeProfile({"images": ShapeRange((1, 3, 224, 224), (max_batch, 3, 224, 224),
                                                 (max_batch, 3, 224, 224))})
    config = streamrt.BuildConfig(backend="torch_inductor",
                                  precision=streamrt.Precision.FP16 if device == "cuda" else streamrt.Precision.FP32,
                                  profiles=(profile,), backend_options={"device": device, "freezing": True})
    started = time.perf_counter()
    built = build_module(net, [torch.randn(max_batch, 3, 224, 224, device=device)], out / f"{name}.plan", config,
                         input_names=["images"], output_names=["logits"])
    say(f"{name}: plan built in {time.perf_counter() - started:.0f} s")
    del net
    if device == "cuda":
        torch.cuda.empty_cache()
    return built.path  # a BuildResult since issue 20 (Path(result) crashed the H200 run)


def offline_batches(max_batch: int, server_batch: int | None = None) -> list[int]:
    """The batches the engine's best is looked for at: the plan's max batch, its half and its quarter, and the
    server's max batch when the batching policy caps it lower."""
    return sorted({max(1, max_batch // 4), max(1, max_batch // 2), max_batch, server_batch or max_batch})


def engine_child(plan: str, instances: int, batches: list[int], seconds: float, warmup_ms: float) -> None:
    """In a child process: the engine offline at the server's placement, one JSON line per batch.

    ``instances`` threads, each with an execution context and stream of its own (what each server
    instance has: ``InstanceGroup`` calls the same ``engine.create_context()``, so CUDA graphs are used
    exactly when the server uses them), run ``streamrt bench``'s loop (on CUDA: pinned H2D, infer, D2H,
    two in flight) from one barrier, with the same warm-up and window, so the windows overlap; the
    images/s are their sum. (Not ``benchmark()`` itself: its kernel count runs the profiler first, at
    different times in different threads, which would shift the windows apart.)
    """
    import threading

    import numpy as np

    import streamrt
    from streamrt.profiling.loops import BenchSettings, TimedRun, host_loop
    from streamrt.running.inputs import to_device

    engine = streamrt.load(plan)
    settings = BenchSettings(warmup_ms=warmup_ms, duration_s=seconds, iterations=20)
    for batch in batches:
        feeds = {"images": np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
        contexts = [engine.create_context() for _ in range(instances)]
        graphs = any(bool(getattr(ctx, "cuda_graph", False)) for ctx in contexts)
        # One call each, one after the other, before the threads (as the server warms its instances at load):
        # a CUDA graph is captured on the first call, and two captures at once may interfere.
        warm = to_device(feeds, "cuda") if engine.device_kind == "cuda" else feeds
        for ctx in contexts:
            ctx.infer(warm)
        if engine.device_kind == "cuda":
            import torch

            torch.cuda.synchronize()
        barrier = threading.Barrier(instances)
        runs: list[TimedRun | None] = [None] * instances
        errors: list[BaseException] = []

        def loop(index: int, contexts: list[Any] = contexts, feeds: dict[str, Any] = feeds,
                 barrier: threading.Barrier = barrier, runs: list[TimedRun | None] = runs,
                 errors: list[BaseException] = errors) -> None:
            ctx = contexts[index]
            try:
                barrier.wait()
                if engine.device_kind == "cuda":
                    from streamrt.profiling.cuda_timing import cuda_loop

                    runs[index] = cuda_loop(ctx, feeds, settings)
                else:
                    runs[index] = host_loop(lambda: ctx.infer(feeds), settings)
            except BaseException as exc:  # re-raised in the main thread below
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(instances)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for ctx in contexts:
            ctx.close()
        if errors:
            raise errors[0]
        rate = sum(len(run.records) / run.walltime_s * batch for run in runs if run is not None)
        print(json.dumps({"batch": batch, "images_per_s": rate, "cuda_graphs": graphs}), flush=True)


def engine_best(plan: Path, instances: int, batches: list[int], seconds: float,
                warmup_ms: float = 1000) -> list[dict[str, Any]]:
    """The engine offline at ``instances`` instances for each of ``batches`` (:func:`engine_child`, in a child)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--engine-child",
           json.dumps([str(plan), instances, batches, seconds, warmup_ms])]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         timeout=len(batches) * (seconds + warmup_ms / 1e3 + 60) + 180)
    if out.returncode != 0:  # check=True would say only "returned non-zero exit status 1"
        raise SystemExit(f"offline benchmark of {plan.name} failed ({out.returncode}): {out.stderr[-1500:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


class Server:
    """``streamrt serve`` on a repository, in a child process, with its log in ``log``."""

    def __init__(self, repo: Path, log: Path, frontend_processes: int = 1, grpc_server: str = "grpcio",
                 env: dict[str, str] | None = None, engine_cpus: frozenset[int] | None = None,
                 http_server: str = "aiohttp") -> None:
        self.http, self.grpc = sf.free_port(), sf.free_port()
        self.log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(self.http),
             "--grpc-port", str(self.grpc), "--metrics-port", "-1", "--log-level", "WARNING",
             "--frontend-processes", str(frontend_processes), "--grpc-server", grpc_server,
             "--http-server", http_server, *placement.server_args(engine_cpus)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        sf.wait_ready(self.http, 300, self.process)

    def stop(self) -> None:
        """Terminate the server; a server that does not exit in 60 s (a hung engine thread) is killed with its
        front-end workers (:func:`~streamrt.testing.server_process.stop`), so the next part starts on a free GPU."""
        try:
            if stop(self.process, 60) is None:
                say(f"server {self.process.pid} did not exit even after SIGKILL")
        finally:
            self.log.close()


def perf(server: Server, protocol: str, model: str, batch: int, args: argparse.Namespace,
         extra: list[str] | None = None, client: str = "streamrt") -> dict[str, Any]:
    port = server.http if protocol == "http" else server.grpc
    result = clients.measure(client, protocol, port, model, batch, args, extra or [])
    lat = result.get("latency_ms") or {}
    say(f"{model} {protocol} b{batch} {' '.join(extra or [])} ({client}): {result.get('throughput', 0):.0f} items/s, "
        f"p99 {lat.get('p99', float('nan')):.1f} ms, errors {result.get('errors')}"
        + (f" ({result['first_error'][:200]})" if result.get("first_error") else "")
        + (f"; {result['warning']}" if result.get("warning") else ""))
    return result


def _failure(exc: BaseException, limit: int) -> str:
    return _cell(f"{type(exc).__name__}: {exc}"[-limit:])


def frontend_rows(args: argparse.Namespace, work: Path, processes: int, report: Report,
                  engine_cpus: frozenset[int] | None = None) -> None:
    """Part (a) at one front-end process count and CPU placement (:mod:`_serving_check_placement`): a row per
    protocol and request size, written as it comes."""
    repo = sf.write_repository(work / "null-repo", instances=2,
                               backend_options={"spinning": False} if args.null_spinning == "off" else None)
    try:
        placement.rest_of(engine_cpus)
    except ValueError as exc:  # a placement this machine cannot give: said, and the next part goes on
        say(f"(a) {exc}")
        report.add([f"Front-end processes: {processes}: not run: {exc}", ""])
        return
    suffix = "" if engine_cpus is None else f"-engine{placement.label(engine_cpus).replace(',', '_')}"
    server = Server(repo, args.out / f"server-null-fp{processes}{suffix}.log", processes, args.grpc_server,
                    engine_cpus=engine_cpus, http_server=args.http_server)
    try:
        with placement.clients_beside_front_ends(engine_cpus) as rest:
            others = "the front ends and clients" if processes > 1 else "the clients (the front end is the engine's)"
            where = ("" if rest is None else
                     f" Engine process on CPUs {placement.label(engine_cpus)}, {others} on {placement.label(rest)}.")
            _frontend_table(args, server, processes, where, report)
    finally:
        server.stop()


def _frontend_table(args: argparse.Namespace, server: Server, processes: int, where: str, report: Report) -> None:
    # Server CPU per request, the engine process apart from the whole server (its front-end workers
    # too): the engine process is the part that does not scale with --frontend-processes.
    report.add([f"Front-end processes: {processes}.{where}", "",
                "| protocol | request | bytes | requests/s | GB/s | p50 ms | p99 ms | server us/req | "
                "server CPU us/req (engine process / all) | client busy | errors |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"])
    sizes = (("small", 1),) if args.quick else (("small", 1), ("image", 1), ("image", 8))
    try:
        for protocol, (kind, batch), client in ((p, size, c) for p in ("grpc", "http") for size in sizes
                                                for c in args.clients):
            model, label = f"null_{kind}", protocol + _by(client, args)
            try:
                pid = server.process.pid
                cpu0, engine0 = sf.cpu_seconds(pid), sf.cpu_seconds(pid, children=False)
                count0 = sf.served(server.http, model)
                r = perf(server, protocol, model, batch, args, client=client)
                count = max(sf.served(server.http, model) - count0, 1)
                engine_us = (sf.cpu_seconds(pid, children=False) - engine0) / count * 1e6
                all_us = (sf.cpu_seconds(pid) - cpu0) / count * 1e6
                nbytes = batch * 4 * (16 if kind == "small" else 3 * 224 * 224)
                reqs = r["throughput"] / batch
                lat = r.get("latency_ms") or {}
                row = (f"| {label} | {model} x{batch} | {nbytes:,} | {reqs:,.0f} | "
                       f"{reqs * nbytes / 1e9:.2f} | {lat.get('median', float('nan')):.2f} | "
                       f"{lat.get('p99', float('nan')):.2f} | "
                       f"{_blank((r.get('server_us') or {}).get('success'), '.0f')} | "
                       f"{engine_us:,.0f} / {all_us:,.0f} | {_blank(r.get('client_busy'), '.0%')} | {r['errors']} |")
            except (SystemExit, Exception) as exc:  # one failed case must not lose the others' numbers
                say(f"{model} {label}: FAILED {exc}")
                row = f"| {label} | {model} x{batch} | failed: {_failure(exc, 200)} | | | | | | | | |"
            report.add([row])
    finally:
        report.add([""])


def reference_rows(name: str, plan: Path, args: argparse.Namespace, report: Report) -> float:
    """The engine's best offline at the server's placement (a row per batch tried); returns its images/s."""
    found = engine_best(plan, args.instances, offline_batches(args.max_batch, args.server_max_batch), args.seconds,
                        200 if args.quick else 1000)
    best = max(found, key=lambda r: float(r["images_per_s"]))
    say(f"{name}: engine offline at {args.instances} instances: "
        + ", ".join(f"batch {r['batch']} {r['images_per_s']:.0f} img/s" for r in found))
    for r in found:
        note = (f"reference: the best batch, CUDA graphs {'on' if r['cuda_graphs'] else 'off'} (as in the server)"
                if r is best else "")
        report.add([f"| {name} {args.precision} | engine offline, {args.instances} instances x batch {r['batch']} | "
                    f"{r['images_per_s']:,.0f} | {r['images_per_s'] / best['images_per_s']:.0%} | | | {note} |"])
    return float(best["images_per_s"])


def _server_split(r: dict[str, Any]) -> str:
    """The server's own time per request in the window (Triton's statistics: a batch's times count for each of
    its requests): where a served row's time goes, beside the engine's offline time per batch."""
    us = r.get("server_us") or {}
    parts = ("queue", "compute_input", "compute_infer", "compute_output")
    if not any(us.get(k) for k in parts):
        return ""
    return "; server us/req: " + ", ".join(f"{k.removeprefix('compute_')} {us.get(k, 0):,.0f}" for k in parts)


def served_rows(name: str, server: Server, reference: float, args: argparse.Namespace, report: Report,
                ratios: dict[str, float], transports: tuple[tuple[str, list[str]], ...] = TRANSPORTS,
                suffix: str = "", where: str = "") -> None:
    """Part (b): each transport at ``--concurrency``, no latency bound; a row each, written as it comes. ``where``
    (the server's CPU placement) is shown in the rows; a transport's ratio is its best over placements."""
    for (label, extra), client in ((t, c) for t in transports for c in args.clients):
        label += suffix
        by = _by(client, args)
        try:
            r = perf(server, "grpc", name, args.request_batch, args, extra, client)
            lat = r.get("latency_ms") or {}
            ratio = r["throughput"] / reference
            row = (f"| {name} {args.precision} | server{where}, {label}{by}, concurrency {args.concurrency} x "
                   f"{args.request_batch} img | {r['throughput']:,.0f} | {ratio:.0%} | "
                   f"{lat.get('median', float('nan')):.1f} / "
                   f"{lat.get('p99', float('nan')):.1f} | {_avg_batch(r)} | "
                   f"{r['errors']} errors" + (f"; {_cell(r['first_error'][:120])}" if r.get("first_error") else "")
                   + (f"; {_cell(r['warning'])}" if r.get("warning") else "") + _server_split(r) + " |")
            # measured, even at 0 (every request failed): a FAIL, not "not measured"
            ratios[label] = max(ratio, ratios.get(label, ratio))
        except (SystemExit, Exception) as exc:  # one failed variant must not lose the others' numbers
            say(f"{name} {label}{by}: FAILED {exc}")
            row = f"| {name} {args.precision} | server{where}, {label}{by} | failed | | | | {_failure(exc, 300)} |"
        report.add([row])


def _blank(value: float | None, spec: str) -> str:
    """A figure one client reports and the other does not (perf_analyzer: no engine batch, no client busy time)."""
    return "" if value is None else format(value, spec)


def _avg_batch(r: dict[str, Any]) -> str:
    """The engine's average batch in the window (``streamrt perf`` reads it from the server's statistics;
    perf_analyzer does not report it: blank)."""
    return _blank((r.get("server_us") or {}).get("avg_batch"), ".1f")


def _by(client: str, args: argparse.Namespace) -> str:
    """The client named in a row's measurement when more than one measures (``--clients``)."""
    return f" ({client})" if len(args.clients) > 1 or client != "streamrt" else ""


def bounded_rows(name: str, server: Server, reference: float, args: argparse.Namespace, report: Report,
                 ratios: dict[str, float], where: str = "") -> None:
    """Part (c): each transport's highest images/s with p99 within ``--latency-bound-ms``, found by
    ``streamrt perf --latency-bound-ms`` (the search of :mod:`streamrt.client.search`), with each level measured by
    that client (perf_analyzer: a run per level); a row per transport and client."""
    bound = f"p99 <= {args.latency_bound_ms:g} ms"
    end = int(args.bound_range.split(":")[1]) if ":" in args.bound_range else 1024
    for (label, extra), client in ((t, c) for t in args.transports for c in args.clients):
        by = _by(client, args)
        try:
            levels, status, stderr = clients.bound_levels(client, server.grpc, name, args, extra)
            if not levels:
                raise SystemExit(f"perf failed ({status}): {stderr.strip()[-1500:]}")
            tried = ",".join(str(level["concurrency"]) for level in levels)
            best = next((level for level in levels if level["latency_bound"]["best"]), None)
            if best is None:
                why = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {status}"
                say(f"{name} {label}{by} {bound}: no level under the bound (tried {tried})")
                # the lowest level tried, in full: a p50 far under the bound says the tail misses it, and the
                # server's own time per request says whether the time is in the server or in the transport
                low = min(levels, key=lambda level: level["concurrency"])
                lat = low.get("latency_ms") or {}
                row = (f"| {name} {args.precision} | server{where}, {label}{by}, {bound} | none under the bound | 0% | "
                       f"{lat.get('median', float('nan')):.1f} / {lat.get('p99', float('nan')):.1f} at concurrency "
                       f"{low['concurrency']} ({low.get('throughput', 0):,.0f} img/s) | "
                       f"{_avg_batch(low)} | "
                       f"{_cell(why[-250:])}; tried concurrency {tried}{_server_split(low)} |")
            else:
                lat, ratio = best["latency_ms"], best["throughput"] / reference
                ratios[f"{label}, {bound}"] = max(ratio, ratios.get(f"{label}, {bound}", ratio))
                say(f"{name} {label}{by} {bound}: {best['throughput']:.0f} img/s at concurrency {best['concurrency']} "
                    f"(p99 {lat['p99']:.1f} ms; tried {tried})")
                row = (f"| {name} {args.precision} | server{where}, {label}{by}, {bound}: concurrency "
                       f"{best['concurrency']} x "
                       f"{args.request_batch} img | {best['throughput']:,.0f} | {ratio:.0%} | {lat['median']:.1f} / "
                       f"{lat['p99']:.1f} | {_avg_batch(best)} | "
                       f"tried concurrency {tried}" + ("; the range's end: raise --bound-range" if
                                                       best["concurrency"] == end else "")
                       + (f"; {_cell(best['warning'])}" if best.get("warning") else "") + _server_split(best) + " |")
        except (SystemExit, Exception) as exc:  # one failed variant must not lose the others' numbers
            say(f"{name} {label}{by} {bound}: FAILED {exc}")
            row = (f"| {name} {args.precision} | server{where}, {label}{by}, {bound} | failed | | | | "
                   f"{_failure(exc, 300)} |")
        report.add([row])


def model_rows(name: str, args: argparse.Namespace, work: Path, plans: Path, report: Report,
               bounded: bool) -> dict[str, float]:
    """Parts (b) and (c) for one model: the reference, then a row per transport (and per transport under
    the latency bound when ``bounded``), written as they come, all against one server."""
    plan = plans / f"{name}.plan"
    if not plan.is_file():
        plan = build_plan(name, args.out / "plans", args.max_batch, args.device)
    reference = reference_rows(name, plan, args, report)
    repo = work / f"{name}-repo"
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    target = repo / name / "1" / "model.plan"
    if not target.exists():
        target.symlink_to(plan.resolve())
    (repo / name / "config.yaml").write_text(json.dumps({
        "max_batch_size": args.server_max_batch,
        "dynamic_batching": {"max_queue_delay_microseconds": args.queue_delay_us,
                             **({"preferred_batch_size": args.preferred_batch_sizes}
                                if args.preferred_batch_sizes else {})},
        "instance_group": [{"count": args.instances, "kind": "KIND_AUTO"}],  # the plan's device: the GPU
    }))
    ratios: dict[str, float] = {}
    direct = "0" if args.direct_copies == "off" else "1"  # the main server's: the default unless off
    for engine_cpus in args.engine_cpus:  # a server per placement, the same plan and reference
        placed_rows(name, repo, reference, args, report, ratios, {DIRECT_ENV: direct}, engine_cpus, bounded)
    if args.direct_copies == "both":  # the host transports again, each batch gathered into a pinned slot
        host_transports_again(name, repo, reference, args, report, ratios, {DIRECT_ENV: "0"},
                              ", gathered (no direct copies)")
    for variant in args.env_variants:  # the host transports again from a server with these variables
        host_transports_again(name, repo, reference, args, report, ratios, {DIRECT_ENV: direct, **variant},
                              ", " + " ".join(f"{k}={v}" for k, v in variant.items()))
    return ratios


def placed_rows(name: str, repo: Path, reference: float, args: argparse.Namespace, report: Report,
                ratios: dict[str, float], env: dict[str, str], engine_cpus: frozenset[int] | None,
                bounded: bool) -> None:
    """Parts (b) and (c) from one server at one CPU placement (``--engine-cpus``: the server's engine process on
    those CPUs, its front ends and this check's clients on the rest)."""
    where = "" if args.engine_cpus == [None] else f" (engine CPUs {placement.label(engine_cpus)})"
    try:
        placement.rest_of(engine_cpus)
    except ValueError as exc:  # a placement this machine cannot give: said, and the next goes on
        say(f"(b) {exc}")
        report.add([f"| {name} {args.precision} | server{where} | not run | | | | {_cell(str(exc))} |"])
        return
    tag = "" if engine_cpus is None else f"-engine{placement.label(engine_cpus).replace(',', '_')}"
    server = Server(repo, args.out / f"server-{name}{tag}.log", max(args.frontend_processes), args.grpc_server,
                    env, engine_cpus, args.http_server)
    try:
        with placement.clients_beside_front_ends(engine_cpus):
            served_rows(name, server, reference, args, report, ratios, args.transports, where=where)
            for options in args.client_variants:  # the same server, the client changed: rows side by side
                variant = tuple((label, [*extra, *options]) for label, extra in args.transports)
                served_rows(name, server, reference, args, report, {}, variant, ", perf " + " ".join(options),
                            where)
            if bounded:
                bounded_rows(name, server, reference, args, report, ratios, where)
    finally:
        server.stop()


def host_transports_again(name: str, repo: Path, reference: float, args: argparse.Namespace, report: Report,
                          ratios: dict[str, float], env: dict[str, str], suffix: str) -> None:
    """Part (b)'s two host transports from a server started with ``env`` (rows labelled with ``suffix``)."""
    tag = suffix.strip(", ").replace(" ", "-")
    try:
        server = Server(repo, args.out / f"server-{name}-{tag}.log", max(args.frontend_processes), args.grpc_server,
                        env, http_server=args.http_server)
    except (SystemExit, Exception) as exc:
        report.add([f"| {name} {args.precision} | server with {' '.join(f'{k}={v}' for k, v in env.items())} | "
                    f"failed | | | | {_failure(exc, 300)} |"])
        return
    try:
        host = tuple(t for t in args.transports if t in TRANSPORTS[:2])  # the transports that copy from host memory
        served_rows(name, server, reference, args, report, ratios, host, suffix)
    finally:
        server.stop()


def targets(ratios: dict[str, float], bound: str) -> list[str]:
    """The issues' targets for ResNet-50, each with its share of the engine's best offline and PASS / FAIL;
    a target whose row was not measured (part (c) skipped, a transport that failed) says so instead."""
    lines = []
    for label, key, share in (
        ("gRPC binary, concurrency 64 (issue 26)", "gRPC binary", 0.85),
        (f"gRPC binary, {bound} (issue 26)", f"gRPC binary, {bound}", 0.80),
        (f"system shm, {bound} (issue 26)", f"gRPC + system shm, {bound}", 0.90),
        (f"CUDA shm, {bound} (issue 26)", f"gRPC + CUDA shm, {bound}", 0.95),
        ("CUDA shm (issue 12)", "gRPC + CUDA shm", 0.85),
        ("system shm (issue 12)", "gRPC + system shm", 0.70),
    ):
        name, _, issue = label.rpartition(" (")
        got = ratios.get(key)
        verdict = ("not measured (no row above)" if got is None
                   else f"{got:.0%} **{'PASS' if got >= share else 'FAIL'}**")
        lines.append(f"- {name} >= {share:.0%} of offline (ResNet-50, {issue}: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--engine-child"]:  # engine_best's child process
        engine_child(*json.loads(sys.argv[2]))
        return 0
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plans").mkdir(exist_ok=True)
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    plans = args.plans or args.out / "plans"
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    report = Report(args.out / f"serving-{'h200' if args.device == 'cuda' else 'cpu'}.md", [
        f"# Serving on {gpu if args.device == 'cuda' else 'the CPU'}: front-end ceiling and ResNet "
        f"{args.precision} through the server", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {git_commit(ROOT)}",
        f"- machine: {gpu}, torch {torch.__version__}, {os.cpu_count()} CPUs, --device {args.device}",
        f"- CPUs: {placement.topology()}",
        f"- host: {placement.host_speed()}",
        f"- command: `{shlex.join(['python', 'scripts/gpu_serving_check.py', *(argv or sys.argv[1:])])}`",
        f"- client: `streamrt perf`, {args.processes} processes, concurrency {args.concurrency}, "
        f"{args.seconds:g} s windows" + ("; and NVIDIA's perf_analyzer (C++, tritonclient 2.43.0's, one process, "
        "`--measurement-mode time_windows --percentile 99`, random input data), rows marked (perf_analyzer)"
        if "perf_analyzer" in args.clients else ""), "",
        "## (a) Front-end ceiling (null model: ReduceMean on ONNX Runtime CPU, 2 instances, max batch 64"
        + (", pool threads not spinning: --option spinning=false" if args.null_spinning == "off" else "") + ")", ""])
    if args.skip_frontend:
        report.add(["skipped", ""])
    for n in args.frontend_processes if not args.skip_frontend else []:
        for engine_cpus in args.engine_cpus:
            with report.part(f"(a) front end, {n} process(es), engine CPUs {placement.label(engine_cpus)}"):
                frontend_rows(args, work, n, report, engine_cpus)
    report.add([
        "Targets: gRPC >= 3 GB/s at 4.8 MB (null_image x8) and >= 10,000 requests/s at 64 B (null_small x1).", "",
        "## (b) ResNet fp16 torch_inductor plans: server vs the engine's best offline, (c) under a latency bound",
        "",
        f"Server: dynamic batching (max {args.server_max_batch}, {args.queue_delay_us} us delay"
        + (f", preferred sizes {args.preferred_batch_sizes}" if args.preferred_batch_sizes else "")
        + f"), {args.instances} GPU instances of "
        f"{os.environ.get('STREAMRT_INSTANCE_LANES') or '1 (the default)'} lane(s) (batches staged at once); "
        f"{args.request_batch} images (fp32, {args.request_batch * 602112 / 1e6:.1f} MB) per request; "
        f"{max(args.frontend_processes)} front-end processes.", "",
        f"Offline reference: the engine alone at the server's placement ({args.instances} instances, each a context "
        f"and stream of its own, CUDA graphs as the server's contexts have them), `streamrt bench`'s loop at batch "
        f"{'/'.join(map(str, offline_batches(args.max_batch, args.server_max_batch)))}, the best of them; measured "
        "in this run. "
        "Every served row's share is of that best.", "",
        f"(c), first model only: `streamrt perf --latency-bound-ms {args.latency_bound_ms:g}` over concurrency "
        f"{args.bound_range} ({args.bound_seconds:g} s per level): doubling, then bisecting; the row is the level "
        "with the highest images/s whose p99 stays within the bound." if args.latency_bound_ms > 0
        else "(c) skipped (--latency-bound-ms 0).", "",
        "| model | measurement | images/s | of offline | p50 / p99 ms | avg engine batch | note |",
        "|---|---|---:|---:|---:|---:|---|"])
    ratios: dict[str, dict[str, float]] = {}
    for index, name in enumerate(m for m in args.models.split(",") if m):
        if index and elapsed() > args.budget_s:
            say(f"{name}: skipped (time budget of {args.budget_s:.0f} s spent)")
            report.add([f"| {name} | skipped: time budget | | | | | |"])
            continue
        try:
            ratios[name] = model_rows(name, args, work, plans, report, bounded=not index and args.latency_bound_ms > 0)
        except (SystemExit, Exception) as exc:  # a failed build or offline run: a row, then the next model
            import traceback

            traceback.print_exc()
            report.failed.append(f"(b) {name}")
            report.add([f"| {name} | failed | | | | | {_failure(exc, 300)} |"])
    report.add(["", *targets(ratios.get("resnet50", {}), f"p99 <= {args.latency_bound_ms:g} ms"),
        f"- {elapsed():.0f} s in all", ""])
    print("\n".join(report.lines))
    return report.exit_status()


if __name__ == "__main__":
    sys.exit(main())
