"""A perf_analyzer-style load generator for any KServe v2 server (HTTP or gRPC).

For each concurrency level, ``concurrency`` clients send requests back to back (each waits for
its response) for a warm-up, then for the measurement window; throughput is completed
inferences per second in the window, latency is the client-side time of each request. The
server's statistics extension, read before and after the window, splits the average request
into queue, compute input, compute infer and compute output (as perf_analyzer's "Server:"
block), and the rest of the client latency is network, protocol and client time.

The request body is built once per level and reused (perf_analyzer does the same), so the client
spends its time on the protocol, not on making data.

Example:
    >>> cfg = LoadConfig(url="127.0.0.1:8000", model="cnn", concurrency=(1, 8), duration_s=2)   # doctest: +SKIP
    >>> print(format_results(run_load(cfg)))                                                   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from streamrt._optional import require
from streamrt.errors import ConfigError, StreamRTError
from streamrt.inputs import random_inputs
from streamrt.profiling.stats import Stats
from streamrt.serve.protocol import HEADER_LENGTH, kserve_dtype, numpy_dtype
from streamrt.types import DType, TensorSpec

__all__ = ["LevelResult", "LoadConfig", "format_results", "run_load", "run_load_async"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadConfig:
    """What to send, where, and how hard.

    Attributes:
        url: ``host:port`` of the HTTP or gRPC endpoint.
        model / version: target model ("" = the server's default version).
        protocol: ``"http"`` or ``"grpc"``.
        concurrency: levels to sweep (outstanding requests).
        batch_size: rows per request (models with a batch dimension).
        shapes: dims (without batch) for inputs whose metadata has -1 dims.
        data: ``"random"`` or ``"zero"``.
        binary: HTTP: tensors as binary data (else JSON); gRPC is always binary.
        duration_s / warmup_s: measurement window and warm-up per level.
        timeout_s: per-request timeout.
        headers: extra HTTP headers / gRPC metadata (e.g. ``authorization``).
    """

    url: str
    model: str
    version: str = ""
    protocol: str = "http"
    concurrency: tuple[int, ...] = (1,)
    batch_size: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    data: str = "random"
    binary: bool = True
    duration_s: float = 5.0
    warmup_s: float = 1.0
    timeout_s: float = 30.0
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.protocol not in ("http", "grpc"):
            raise ConfigError(f"protocol must be http or grpc, got {self.protocol!r}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency levels must be integers >= 1, got {self.concurrency}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size}")
        if self.data not in ("random", "zero"):
            raise ConfigError(f"data must be random or zero, got {self.data!r}")
        if self.duration_s <= 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s}")


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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["latency_ms"] = self.latency_ms.to_dict() if self.latency_ms else None
        return d


class _HttpClient:
    def __init__(self, cfg: LoadConfig, concurrency: int) -> None:
        aiohttp = require("aiohttp", extra="serve", purpose="the HTTP load generator")
        self.cfg = cfg
        base = f"http://{cfg.url}/v2/models/{cfg.model}" + (f"/versions/{cfg.version}" if cfg.version else "")
        self.base = base
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency + 2, force_close=False),
            timeout=aiohttp.ClientTimeout(total=cfg.timeout_s), headers=dict(cfg.headers),
        )
        self.body = b""
        self.headers: dict[str, str] = {}

    async def _get(self, path: str) -> Any:
        async with self.session.get(self.base + path) as r:
            body = await r.read()
            if r.status != 200:
                raise StreamRTError(f"GET {self.base + path}: {r.status} {body[:200]!r}")
            return json.loads(body)

    async def metadata(self) -> dict[str, Any]:
        return dict(await self._get(""))

    def prepare(self, inputs: dict[str, np.ndarray]) -> None:
        entries, blobs = [], []
        for name, a in inputs.items():
            entry: dict[str, Any] = {"name": name, "shape": list(a.shape), "datatype": kserve_dtype(a)}
            if self.cfg.binary:
                entry["parameters"] = {"binary_data_size": a.nbytes}
                blobs.append(a.tobytes())
            else:
                entry["data"] = a.ravel().tolist()
            entries.append(entry)
        header = json.dumps({"inputs": entries, "parameters": {"binary_data_output": self.cfg.binary}}).encode()
        self.body = header + b"".join(blobs)
        self.headers = {HEADER_LENGTH: str(len(header))} if self.cfg.binary else {}

    async def infer(self) -> None:
        async with self.session.post(self.base + "/infer", data=self.body, headers=self.headers) as r:
            body = await r.read()
            if r.status != 200:
                raise StreamRTError(f"HTTP {r.status}: {body[:200].decode(errors='replace')}")

    async def stats(self) -> dict[str, Any]:
        data = await self._get("/stats")
        return dict(data["model_stats"][0]) if data.get("model_stats") else {}

    async def close(self) -> None:
        await self.session.close()


class _GrpcClient:
    def __init__(self, cfg: LoadConfig, concurrency: int) -> None:
        grpc_aio = require("grpc.aio", extra="serve", purpose="the gRPC load generator")
        from streamrt.serve.proto import SERVICE, messages

        self.cfg, self.messages = cfg, messages
        self.channel = grpc_aio.insecure_channel(cfg.url, options=[
            ("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)])
        self.metadata_ = tuple((k.lower(), v) for k, v in cfg.headers.items())

        def call(method: str, response: Any, raw: bool = False) -> Any:
            return self.channel.unary_unary(
                f"/{SERVICE}/{method}",
                request_serializer=(lambda b: b) if raw else (lambda m: m.SerializeToString()),
                response_deserializer=response.FromString,
            )

        self._infer = call("ModelInfer", messages.ModelInferResponse, raw=True)
        self._meta = call("ModelMetadata", messages.ModelMetadataResponse)
        self._stats = call("ModelStatistics", messages.ModelStatisticsResponse)
        self.body = b""

    async def metadata(self) -> dict[str, Any]:
        from google.protobuf import json_format

        reply = await self._meta(self.messages.ModelMetadataRequest(name=self.cfg.model, version=self.cfg.version),
                                 metadata=self.metadata_, timeout=self.cfg.timeout_s)
        meta = json_format.MessageToDict(reply, preserving_proto_field_name=True)
        for t in meta.get("inputs", []):
            t["shape"] = [int(d) for d in t.get("shape", [])]
        return meta

    def prepare(self, inputs: dict[str, np.ndarray]) -> None:
        request = self.messages.ModelInferRequest(model_name=self.cfg.model, model_version=self.cfg.version)
        for name, a in inputs.items():
            request.inputs.add(name=name, datatype=kserve_dtype(a), shape=list(a.shape))
            request.raw_input_contents.append(a.tobytes())
        self.body = request.SerializeToString()

    async def infer(self) -> None:
        await self._infer(self.body, metadata=self.metadata_, timeout=self.cfg.timeout_s)

    async def stats(self) -> dict[str, Any]:
        from google.protobuf import json_format

        reply = await self._stats(self.messages.ModelStatisticsRequest(name=self.cfg.model, version=self.cfg.version),
                                  metadata=self.metadata_, timeout=self.cfg.timeout_s)
        data = json_format.MessageToDict(reply, preserving_proto_field_name=True)
        return dict(data["model_stats"][0]) if data.get("model_stats") else {}

    async def close(self) -> None:
        await self.channel.close()


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


async def _level(cfg: LoadConfig, concurrency: int) -> LevelResult:
    client: Any = (_HttpClient if cfg.protocol == "http" else _GrpcClient)(cfg, concurrency)
    try:
        try:
            meta = await client.metadata()
        except StreamRTError:
            raise
        except Exception as exc:
            raise StreamRTError(f"cannot get the metadata of model '{cfg.model}' from {cfg.protocol}://{cfg.url}: "
                                f"{type(exc).__name__}: {str(exc)[:200]}", hint="is the server running there?") from exc
        batched = bool(meta["inputs"]) and int(meta["inputs"][0]["shape"][0]) == -1
        client.prepare(make_inputs(meta, cfg, batched))
        latencies: list[float] = []
        errors: list[str] = []
        start = time.perf_counter() + cfg.warmup_s
        end = start + cfg.duration_s
        snapshots: dict[str, dict[str, Any]] = {}

        async def worker() -> None:
            while (now := time.perf_counter()) < end:
                try:
                    await client.infer()
                except Exception as exc:
                    if now >= start:
                        errors.append(str(exc)[:300])
                    await asyncio.sleep(0.001)
                    continue
                done = time.perf_counter()
                if now >= start and done <= end:
                    latencies.append((done - now) * 1e3)

        async def snapshot() -> None:
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            snapshots["before"] = await client.stats()
            await asyncio.sleep(max(0.0, end - time.perf_counter()))
            snapshots["after"] = await client.stats()

        await asyncio.gather(snapshot(), *(worker() for _ in range(concurrency)))
        server = _delta(snapshots.get("before", {}), snapshots.get("after", {}))
        rows = cfg.batch_size if batched else 1
        return LevelResult(
            concurrency=concurrency,
            requests=len(latencies),
            errors=len(errors),
            throughput=len(latencies) * rows / cfg.duration_s,
            latency_ms=Stats.from_samples(latencies) if latencies else None,
            server_us=server,
            first_error=errors[0] if errors else "",
        )
    finally:
        await client.close()


async def run_load_async(cfg: LoadConfig) -> list[LevelResult]:
    """Sweep ``cfg.concurrency`` (on the running event loop)."""
    results = []
    for level in cfg.concurrency:
        result = await _level(cfg, level)
        log.debug("concurrency %d: %.1f infer/s, p99 %.2f ms, %d errors", level, result.throughput,
                 result.latency_ms.p99 if result.latency_ms else float("nan"), result.errors)
        results.append(result)
    return results


def run_load(cfg: LoadConfig) -> list[LevelResult]:
    """Sweep ``cfg.concurrency`` on a fresh event loop (blocking)."""
    return asyncio.run(run_load_async(cfg))


def format_results(results: list[LevelResult]) -> str:
    """perf_analyzer-like table: throughput, client latency percentiles, server time split."""
    head = (f"{'conc':>5} {'infer/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'avg ms':>8}"
            f" | {'server us':>9} {'queue':>7} {'c.in':>6} {'c.infer':>8} {'c.out':>6} {'batch':>5} {'errors':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        s, lat = r.server_us, r.latency_ms
        p = (lat.median, lat.p90, lat.p95, lat.p99, lat.mean) if lat else (float("nan"),) * 5
        lines.append(
            f"{r.concurrency:>5} {r.throughput:>10.1f} " + " ".join(f"{v:>8.2f}" for v in p)
            + f" | {s.get('success', 0):>9.0f} {s.get('queue', 0):>7.0f} {s.get('compute_input', 0):>6.0f}"
            f" {s.get('compute_infer', 0):>8.0f} {s.get('compute_output', 0):>6.0f} {s.get('avg_batch', 0):>5.1f}"
            f" {r.errors:>6}"
        )
    errors = [r.first_error for r in results if r.first_error]
    if errors:
        lines.append(f"first error: {errors[0]}")
    return "\n".join(lines)
