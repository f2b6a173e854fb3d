"""A perf_analyzer-style load generator for any KServe v2 server (HTTP or gRPC).

For each concurrency level, ``concurrency`` clients send requests back to back (each waits for
its response) for a warm-up, then for the measurement window; throughput is completed
inferences per second in the window, latency is the client-side time of each request. The
server's statistics extension, read before and after the window, splits the average request
into queue, compute input, compute infer and compute output (as perf_analyzer's "Server:"
block), and the rest of the client latency is network, protocol and client time.

The request body is built once per level and reused (perf_analyzer does the same), so the client
spends its time on the protocol, not on making data. ``shared_memory`` ("system" / "cuda") puts the
inputs once into a registered region and asks for the outputs in another, as perf_analyzer's
``--shared-memory``: requests then carry only their description.

One Python process tops out at a few thousand small requests/s (or ~1 GB/s of payload), so
``processes`` > 1 spreads the concurrency over that many processes (spawned, started together,
one merged result). Each process measures its CPU time in the window: a process busy for more
than 80% of it is likely the limit, and the result says so (``client_busy``, ``warning``).

``request_ids`` gives every request an id of its own (``<client pid>-<n>``, in the message where
protobuf and Triton's JSON put it) and keeps each measured request's send and answer times
(``LevelResult.request_log``, ``time.perf_counter_ns``: CLOCK_MONOTONIC on Linux, the clock of
StreamRT's and Triton's trace timestamps), so that a server's request trace on the same host can be
joined with the client's view of the same requests (``streamrt perf --profile-export-file``).

Example:
    >>> cfg = LoadConfig(url="127.0.0.1:8000", model="cnn", concurrency=(1, 8), duration_s=2)   # doctest: +SKIP
    >>> print(format_results(run_load(cfg)))                                                   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np

from streamrt.client.failures import unreachable
from streamrt.client.load_config import LoadConfig
from streamrt.client.shared_memory import ClientRegions
from streamrt.client.transports import GrpcClient, HttpClient
from streamrt.errors import ConfigError, StreamRTError
from streamrt.measure.stats import Stats
from streamrt.running.inputs import random_inputs
from streamrt.serve.wire.protocol import numpy_dtype
from streamrt.types import DType, TensorSpec

__all__ = ["LevelResult", "LoadConfig", "format_results", "measure_level", "run_async", "run_load", "run_load_async"]

CLIENT_BUSY_WARNING = 0.8
"""A client process busy (CPU time / window) above this share of the window may be the limit."""

log = logging.getLogger(__name__)


T = TypeVar("T")


@dataclass
class LevelResult:
    """One concurrency level: client throughput and latency, and the server's time split (µs)."""

    concurrency: int
    requests: int
    errors: int
    throughput: float
    latency_ms: Stats | None
    server_us: dict[str, float] = field(default_factory=dict)
    first_error: str = ""
    processes: int = 1
    client_cpu_us: float = 0.0
    client_busy: float = 0.0
    warning: str = ""
    request_log: list[tuple[str, int, int]] = field(default_factory=list, repr=False)
    """(id, sent, answered) of each request in the window, ``perf_counter_ns``; with ``request_ids`` only."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["latency_ms"] = self.latency_ms.to_dict() if self.latency_ms else None
        del d["request_log"]  # per request: perf --profile-export-file writes it
        return d


def output_bytes(meta: Mapping[str, Any], cfg: LoadConfig, batched: bool) -> dict[str, int]:
    """Bytes of each output for one request (``cfg.output_shared_memory_size`` when not static)."""
    sizes = {}
    for tensor in meta.get("outputs", []):
        dims = [int(d) for d in tensor["shape"]][1 if batched else 0 :]
        itemsize = numpy_dtype(tensor["datatype"]).itemsize
        static = all(d >= 0 for d in dims)
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        sizes[tensor["name"]] = (count * itemsize * (cfg.batch_size if batched else 1) if static
                                 else cfg.output_shared_memory_size)
    return sizes


def make_inputs(meta: Mapping[str, Any], cfg: LoadConfig, batched: bool) -> dict[str, np.ndarray]:
    """Request tensors from model metadata (``cfg.shapes`` fills -1 dims): random, or zeros."""
    specs, shapes = [], {}
    for tensor in meta["inputs"]:
        name = tensor["name"]
        dims = [int(d) for d in tensor["shape"]][1 if batched else 0 :]
        if name in cfg.shapes:
            dims = list(cfg.shapes[name])
        if any(d < 0 for d in dims):
            raise ConfigError(f"input '{name}' has dynamic dims {dims}", hint=f"pass --shape {name}:DIMS")
        shapes[name] = tuple(([cfg.batch_size] if batched else []) + dims)
        specs.append(TensorSpec(name, DType.from_any(numpy_dtype(tensor["datatype"])), shapes[name]))
    if cfg.data == "zero":
        return {s.name: np.zeros(s.shape, s.dtype.numpy) for s in specs}
    return random_inputs(specs, shapes, np.random.default_rng(0))


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Average server time per request (µs) in the window, from two statistics snapshots."""

    def get(stats: dict[str, Any], key: str) -> tuple[int, int]:
        d = stats.get("inference_stats", {}).get(key, {})
        return int(d.get("count", 0)), int(d.get("ns", 0))

    out = {}
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        (c0, n0), (c1, n1) = get(before, key), get(after, key)
        out[key] = (n1 - n0) / max(c1 - c0, 1) / 1e3
    out["overhead"] = max(0.0, out["success"] - sum(out[k] for k in ("queue", "compute_input", "compute_infer",
                                                                     "compute_output")))
    execs = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    rows = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    out["avg_batch"] = rows / execs if execs else 0.0
    return out


@dataclass
class _Part:
    """What one client process measured in the window (merged across processes by :func:`_merge`)."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu_s: float = 0.0
    rows: int = 1
    log: list[tuple[str, int, int]] = field(default_factory=list)


async def _open(cfg: LoadConfig, concurrency: int) -> tuple[Any, ClientRegions | None, int]:
    """A client with its request prepared (and its shared-memory regions registered)."""
    client: Any = (HttpClient if cfg.protocol == "http" else GrpcClient)(cfg, concurrency)
    try:
        meta = await client.metadata()
    except StreamRTError:
        await client.close()
        raise
    except Exception as exc:
        await client.close()
        raise unreachable(cfg.protocol, cfg.url, cfg.model, exc) from exc
    batched = bool(meta["inputs"]) and int(meta["inputs"][0]["shape"][0]) == -1
    inputs = make_inputs(meta, cfg, batched)
    regions = None
    if cfg.shared_memory != "none":
        regions = ClientRegions.create(cfg.shared_memory, inputs, output_bytes(meta, cfg, batched))
        try:
            await client.register(regions)
        except BaseException:
            regions.close()
            await client.close()
            raise
    client.prepare(inputs, regions)
    return client, regions, cfg.batch_size if batched else 1


async def _close(client: Any, regions: ClientRegions | None) -> None:
    try:
        if regions is not None:
            try:
                await client.unregister(regions)
            finally:
                regions.close()
    finally:
        await client.close()


async def _drive(client: Any, cfg: LoadConfig, concurrency: int, start: float, snapshots: bool) -> _Part:
    """``concurrency`` back-to-back workers until the window ``[start, start + duration)`` ends."""
    part = _Part()
    end = start + cfg.duration_s
    start_ns, end_ns = int(start * 1e9), int(end * 1e9)  # perf_counter and perf_counter_ns: one clock
    cpu: dict[str, float] = {}

    ids = itertools.count() if cfg.request_ids else None
    prefix = f"{os.getpid()}-"

    async def worker(index: int) -> None:
        while (sent := time.perf_counter_ns()) < end_ns:
            request_id = None if ids is None else prefix + str(next(ids))
            try:
                await client.infer(request_id, index)
            except Exception as exc:
                if sent >= start_ns:
                    part.errors.append(str(exc)[:300])
                await asyncio.sleep(0.001)
                continue
            done = time.perf_counter_ns()
            if sent >= start_ns and done <= end_ns:
                part.latencies.append((done - sent) / 1e6)
                if request_id is not None:
                    part.log.append((request_id, sent, done))

    async def window() -> None:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        cpu["start"] = time.process_time()
        if snapshots:
            part.snapshots["before"] = await client.stats()
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        cpu["end"] = time.process_time()
        if snapshots:
            part.snapshots["after"] = await client.stats()

    await asyncio.gather(window(), *(worker(i) for i in range(concurrency)))
    part.cpu_s = cpu.get("end", 0.0) - cpu.get("start", 0.0)
    return part


async def _level(cfg: LoadConfig, concurrency: int) -> LevelResult:
    client, regions, rows = await _open(cfg, concurrency)
    try:
        part = await _drive(client, cfg, concurrency, time.perf_counter() + cfg.warmup_s, snapshots=True)
    finally:
        await _close(client, regions)
    part.rows = rows
    return _merge(cfg, concurrency, [part])


def _process_main(cfg: LoadConfig, concurrency: int, index: int, ready: Any, go: Any, start_at: Any,
                  results: Any) -> None:
    """One client process: prepare, say ready, wait for the common start, drive, send its part back."""

    async def main() -> _Part:
        client, regions, rows = await _open(cfg, concurrency)
        try:
            ready.put((index, ""))
            await asyncio.get_running_loop().run_in_executor(None, go.wait, 300)
            start = time.perf_counter() + (start_at.value - time.time())
            part = await _drive(client, cfg, concurrency, start, snapshots=index == 0)
        finally:
            await _close(client, regions)
        part.rows = rows
        return part

    try:
        results.put((index, run_async(main()), ""))
    except BaseException as exc:
        ready.put((index, f"{type(exc).__name__}: {exc}"))
        results.put((index, None, f"{type(exc).__name__}: {exc}"))


def _level_processes(cfg: LoadConfig, concurrency: int) -> LevelResult:
    """The level from ``cfg.processes`` spawned processes sharing ``concurrency``, started together."""
    n = min(cfg.processes, concurrency)
    shares = [concurrency // n + (i < concurrency % n) for i in range(n)]
    ctx = multiprocessing.get_context("spawn")  # no fork: gRPC and event loops do not survive it
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_process_main, args=(cfg, c, i, ready, go, start_at, results), daemon=True)
             for i, c in enumerate(shares)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            index, error = ready.get(timeout=cfg.timeout_s + 120)
            if error:
                raise StreamRTError(f"client process {index} failed to start: {error}")
        start_at.value = time.time() + 0.2 + cfg.warmup_s
        go.set()
        parts: list[_Part | None] = [None] * n
        for _ in procs:
            index, part, error = results.get(timeout=cfg.warmup_s + cfg.duration_s + cfg.timeout_s + 120)
            if error:
                raise StreamRTError(f"client process {index} failed: {error}")
            parts[index] = part
    finally:
        go.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
    return _merge(cfg, concurrency, [p for p in parts if p is not None], processes=n)


def _merge(cfg: LoadConfig, concurrency: int, parts: list[_Part], processes: int = 1) -> LevelResult:
    latencies = [x for p in parts for x in p.latencies]
    errors = [e for p in parts for e in p.errors]
    snaps = next((p.snapshots for p in parts if p.snapshots), {})
    rows = parts[0].rows if parts else 1
    cpu = sum(p.cpu_s for p in parts)
    busy = max((p.cpu_s / cfg.duration_s for p in parts), default=0.0)
    warning = ""
    if busy > CLIENT_BUSY_WARNING:
        warning = (f"a client process was busy {busy:.0%} of the window: the client may be the limit "
                   f"(use more --processes)")
        log.warning(warning)
    return LevelResult(
        concurrency=concurrency,
        requests=len(latencies),
        errors=len(errors),
        throughput=len(latencies) * rows / cfg.duration_s,
        latency_ms=Stats.from_samples(latencies) if latencies else None,
        server_us=_delta(snaps.get("before", {}), snaps.get("after", {})),
        first_error=errors[0] if errors else "",
        processes=processes,
        client_cpu_us=cpu / max(len(latencies), 1) * 1e6,
        client_busy=busy,
        warning=warning,
        request_log=[entry for p in parts for entry in p.log],
    )


async def measure_level(cfg: LoadConfig, concurrency: int) -> LevelResult:
    """One level at ``concurrency`` (``cfg.processes`` > 1: in a worker thread driving the processes).

    The sweep (:func:`run_load_async`) and the latency-bound search (:mod:`streamrt.client.search`)
    both measure through here, so a level means the same in both.
    """
    if cfg.processes > 1:
        result = await asyncio.get_running_loop().run_in_executor(None, _level_processes, cfg, concurrency)
    else:
        result = await _level(cfg, concurrency)
    log.debug("concurrency %d: %.1f infer/s, p99 %.2f ms, %d errors", concurrency, result.throughput,
              result.latency_ms.p99 if result.latency_ms else float("nan"), result.errors)
    return result


async def run_load_async(cfg: LoadConfig) -> list[LevelResult]:
    """Sweep ``cfg.concurrency`` (on the running event loop; ``processes`` > 1 runs in worker threads)."""
    return [await measure_level(cfg, level) for level in cfg.concurrency]


def run_load(cfg: LoadConfig) -> list[LevelResult]:
    """Sweep ``cfg.concurrency`` on a fresh event loop (blocking)."""
    return run_async(run_load_async(cfg))


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``main`` on uvloop when it is installed (about 15% less client CPU per gRPC request than
    asyncio's loop, measured against a real tritonserver), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def format_results(results: list[LevelResult], marks: Sequence[str] | None = None) -> str:
    """perf_analyzer-like table: throughput, client latency percentiles, server time split.

    ``marks`` (one per result) adds a last column, e.g. the latency-bound search's ``best`` / ``under`` / ``over``.
    """
    head = (f"{'conc':>5} {'infer/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'avg ms':>8}"
            f" | {'server us':>9} {'queue':>7} {'c.in':>6} {'c.infer':>8} {'c.out':>6} {'batch':>5} {'errors':>6}"
            + (f" {'bound':>5}" if marks is not None else ""))
    lines = [head, "-" * len(head)]
    for i, r in enumerate(results):
        s, lat = r.server_us, r.latency_ms
        p = (lat.median, lat.p90, lat.p95, lat.p99, lat.mean) if lat else (float("nan"),) * 5
        lines.append(
            f"{r.concurrency:>5} {r.throughput:>10.1f} " + " ".join(f"{v:>8.2f}" for v in p)
            + f" | {s.get('success', 0):>9.0f} {s.get('queue', 0):>7.0f} {s.get('compute_input', 0):>6.0f}"
            f" {s.get('compute_infer', 0):>8.0f} {s.get('compute_output', 0):>6.0f} {s.get('avg_batch', 0):>5.1f}"
            f" {r.errors:>6}" + (f" {marks[i]:>5}" if marks is not None else "")
        )
    errors = [r.first_error for r in results if r.first_error]
    if errors:
        lines.append(f"first error: {errors[0]}")
    for r in results:
        lines.append(f"client: {r.processes} process(es), {r.client_cpu_us:.0f} us CPU per request, busiest process "
                     f"{r.client_busy:.0%} of the window" + (f"; WARNING: {r.warning}" if r.warning else ""))
    return "\n".join(lines)
