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
import base64
import itertools
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np

from streamrt._optional import require
from streamrt.client.failures import grpc_error_line, http_error_text, unreachable
from streamrt.client.shared_memory import ClientRegions
from streamrt.errors import ConfigError, StreamRTError
from streamrt.measure.stats import Stats
from streamrt.running.inputs import random_inputs
from streamrt.serve.wire.grpc_wire import encode_length_delimited
from streamrt.serve.wire.protocol import HEADER_LENGTH, kserve_dtype, numpy_dtype
from streamrt.types import DType, TensorSpec

__all__ = ["LevelResult", "LoadConfig", "format_results", "measure_level", "run_async", "run_load", "run_load_async"]

CLIENT_BUSY_WARNING = 0.8
"""A client process busy (CPU time / window) above this share of the window may be the limit."""

log = logging.getLogger(__name__)

GRPC_CHANNEL_SHARE = 0
"""Concurrent requests per gRPC channel by default: 0, one channel (one connection) per client process.
tritonclient's C++ library opens a new channel once 6 clients share one (triton-inference-server/client#55);
``grpc_channel_share=6`` does the same. Not the default: on the 2-core CPU machine 64 B requests over 16
connections served 0.85-0.88x the rate over 8 (docs/benchmarks/2026-12-05-frontend-balance-cpu.md)."""

T = TypeVar("T")


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
        processes: client processes sharing each concurrency level (>= 1).
        shared_memory: ``"none"``, ``"system"`` or ``"cuda"`` (inputs and outputs in registered regions).
        output_shared_memory_size: bytes per output region when an output's size is not static.
        request_ids: give each request its own id and keep its send and answer times (``request_log``).
        grpc_channel_share: gRPC: concurrent requests per channel, each channel its own connection (6:
            tritonclient's C++ rule); 0 (the default): one channel per process. With several front-end
            processes on one port (SO_REUSEPORT) the kernel places connections, not requests, so few
            connections spread unevenly over them.
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
    processes: int = 1
    shared_memory: str = "none"
    output_shared_memory_size: int = 102400
    request_ids: bool = False
    grpc_channel_share: int = GRPC_CHANNEL_SHARE

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
        if self.processes < 1:
            raise ConfigError(f"processes must be an integer >= 1, got {self.processes}")
        if self.shared_memory not in ("none", "system", "cuda"):
            raise ConfigError(f"shared_memory must be none, system or cuda, got {self.shared_memory!r}")
        if self.grpc_channel_share < 0:
            raise ConfigError(f"grpc_channel_share must be >= 0 (0: one channel per process), "
                              f"got {self.grpc_channel_share}")
        if self.output_shared_memory_size < 1:
            raise ConfigError(f"output_shared_memory_size must be >= 1, got {self.output_shared_memory_size}")


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
        self._header_bytes: int | None = None  # the JSON header's length when binary tensors follow it

    async def _get(self, path: str) -> Any:
        async with self.session.get(self.base + path) as r:
            body = await r.read()
            if r.status != 200:
                raise StreamRTError(f"GET {self.base + path}: {r.status} {body[:200]!r}")
            return json.loads(body)

    async def metadata(self) -> dict[str, Any]:
        return dict(await self._get(""))

    def prepare(self, inputs: dict[str, np.ndarray], regions: ClientRegions | None = None) -> None:
        entries, blobs = [], []
        for name, a in inputs.items():
            entry: dict[str, Any] = {"name": name, "shape": list(a.shape), "datatype": kserve_dtype(a)}
            if regions is not None:
                entry["parameters"] = _shm_params(regions.inputs[name])
            elif self.cfg.binary:
                entry["parameters"] = {"binary_data_size": a.nbytes}
                blobs.append(a.tobytes())
            else:
                entry["data"] = a.ravel().tolist()
            entries.append(entry)
        request: dict[str, Any] = {"inputs": entries, "parameters": {"binary_data_output": self.cfg.binary}}
        if regions is not None:
            request["outputs"] = [{"name": n, "parameters": _shm_params(r)} for n, r in regions.outputs.items()]
        header = json.dumps(request).encode()
        self.body = header + b"".join(blobs)
        self.headers = {HEADER_LENGTH: str(len(header))} if blobs else {}
        self._header_bytes = len(header) if blobs else None

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        async with self.session.post(f"http://{self.cfg.url}{path}", json=body) as r:
            if r.status != 200:
                raise StreamRTError(f"POST {path}: {r.status} {(await r.read())[:300]!r}")

    async def register(self, regions: ClientRegions) -> None:
        for reg in regions.registrations:
            if reg.kind == "system":
                await self._post(f"/v2/systemsharedmemory/region/{reg.name}/register",
                                 {"key": reg.key, "offset": 0, "byte_size": reg.byte_size})
            else:
                await self._post(f"/v2/cudasharedmemory/region/{reg.name}/register",
                                 {"raw_handle": {"b64": base64.b64encode(reg.raw_handle).decode()}, "device_id": 0,
                                  "byte_size": reg.byte_size})

    async def unregister(self, regions: ClientRegions) -> None:
        for reg in regions.registrations:
            kind = "systemsharedmemory" if reg.kind == "system" else "cudasharedmemory"
            await self._post(f"/v2/{kind}/region/{reg.name}/unregister", {})

    async def infer(self, request_id: str | None = None, worker: int = 0) -> None:
        """One request (aiohttp's pool opens a connection per concurrent request: ``worker`` is not needed)."""
        body, headers = self.body, self.headers
        if request_id is not None:  # the id first in the JSON header (ids are ASCII: no escaping needed)
            field_ = b'{"id": "' + request_id.encode() + b'", '
            body = field_ + body[1:]
            if self._header_bytes is not None:
                headers = {HEADER_LENGTH: str(self._header_bytes + len(field_) - 1)}
        async with self.session.post(self.base + "/infer", data=body, headers=headers) as r:
            body = await r.read()
            if r.status != 200:
                raise StreamRTError(f"HTTP {r.status}: {http_error_text(body)}")

    async def stats(self) -> dict[str, Any]:
        data = await self._get("/stats")
        return dict(data["model_stats"][0]) if data.get("model_stats") else {}

    async def close(self) -> None:
        await self.session.close()


class _GrpcClient:
    def __init__(self, cfg: LoadConfig, concurrency: int) -> None:
        grpc_aio = require("grpc.aio", extra="serve", purpose="the gRPC load generator")
        from streamrt.serve.wire.proto import SERVICE, messages

        self.cfg, self.messages = cfg, messages
        count = -(-concurrency // cfg.grpc_channel_share) if cfg.grpc_channel_share else 1
        # a local subchannel pool each: channels of one process to one target would otherwise share a connection
        self.channels = [grpc_aio.insecure_channel(cfg.url, options=[
            ("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1),
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(count)]
        self.channel = self.channels[0]  # metadata, statistics and shared-memory registrations
        self.metadata_ = tuple((k.lower(), v) for k, v in cfg.headers.items())

        def call(channel: Any, method: str, response: Any, raw: bool = False) -> Any:
            return channel.unary_unary(
                f"/{SERVICE}/{method}",
                request_serializer=(lambda b: b) if raw else (lambda m: m.SerializeToString()),
                response_deserializer=response.FromString,
            )

        self._infers = [call(channel, "ModelInfer", messages.ModelInferResponse, raw=True) for channel in self.channels]
        self._meta = call(self.channel, "ModelMetadata", messages.ModelMetadataResponse)
        self._stats = call(self.channel, "ModelStatistics", messages.ModelStatisticsResponse)
        self.body = b""
        self._before_id = 0  # bytes of model_name and model_version: the id goes after them, as protobuf writes it

    async def metadata(self) -> dict[str, Any]:
        from google.protobuf import json_format

        reply = await self._meta(self.messages.ModelMetadataRequest(name=self.cfg.model, version=self.cfg.version),
                                 metadata=self.metadata_, timeout=self.cfg.timeout_s)
        meta = json_format.MessageToDict(reply, preserving_proto_field_name=True)
        for t in meta.get("inputs", []):
            t["shape"] = [int(d) for d in t.get("shape", [])]
        return meta

    def prepare(self, inputs: dict[str, np.ndarray], regions: ClientRegions | None = None) -> None:
        request = self.messages.ModelInferRequest(model_name=self.cfg.model, model_version=self.cfg.version)
        for name, a in inputs.items():
            tensor = request.inputs.add(name=name, datatype=kserve_dtype(a), shape=list(a.shape))
            if regions is not None:
                _grpc_shm_params(tensor.parameters, regions.inputs[name])
            else:
                request.raw_input_contents.append(a.tobytes())
        for name, region in (regions.outputs if regions is not None else {}).items():
            _grpc_shm_params(request.outputs.add(name=name).parameters, region)
        self.body = request.SerializeToString()
        self._before_id = len(self.messages.ModelInferRequest(model_name=self.cfg.model,
                                                              model_version=self.cfg.version).SerializeToString())

    async def register(self, regions: ClientRegions) -> None:
        for reg in regions.registrations:
            if reg.kind == "system":
                await self._rpc("SystemSharedMemoryRegister", self.messages.SystemSharedMemoryRegisterRequest(
                    name=reg.name, key=reg.key, offset=0, byte_size=reg.byte_size))
            else:
                await self._rpc("CudaSharedMemoryRegister", self.messages.CudaSharedMemoryRegisterRequest(
                    name=reg.name, raw_handle=reg.raw_handle, device_id=0, byte_size=reg.byte_size))

    async def unregister(self, regions: ClientRegions) -> None:
        for reg in regions.registrations:
            method = "SystemSharedMemoryUnregister" if reg.kind == "system" else "CudaSharedMemoryUnregister"
            await self._rpc(method, getattr(self.messages, f"{method}Request")(name=reg.name))

    async def _rpc(self, method: str, message: Any) -> Any:
        from streamrt.serve.wire.proto import SERVICE

        call = self.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=getattr(self.messages, f"{method}Response").FromString)
        return await call(message, metadata=self.metadata_, timeout=self.cfg.timeout_s)

    async def infer(self, request_id: str | None = None, worker: int = 0) -> None:
        """One request on ``worker``'s channel (workers spread evenly over the channels)."""
        body = self.body
        if request_id is not None:  # ModelInferRequest.id is field 3
            body = b"".join((body[:self._before_id], encode_length_delimited(3, request_id.encode()),
                             body[self._before_id:]))
        try:
            await self._infers[worker % len(self._infers)](body, metadata=self.metadata_, timeout=self.cfg.timeout_s)
        except Exception as exc:
            code = getattr(exc, "code", lambda: None)()
            if code is not None and code.name == "RESOURCE_EXHAUSTED" and len(self.body) > 4 * 2**20:
                raise StreamRTError(f"{exc.details()} (request of {len(self.body)} bytes)",  # type: ignore[attr-defined]
                                    hint="start the server with a larger --grpc-max-message-mb") from None
            if code is not None:  # AioRpcError's str() is a multi-line block; one line is "CODE: details"
                raise StreamRTError(grpc_error_line(exc)) from None
            raise

    async def stats(self) -> dict[str, Any]:
        from google.protobuf import json_format

        reply = await self._stats(self.messages.ModelStatisticsRequest(name=self.cfg.model, version=self.cfg.version),
                                  metadata=self.metadata_, timeout=self.cfg.timeout_s)
        data = json_format.MessageToDict(reply, preserving_proto_field_name=True)
        return dict(data["model_stats"][0]) if data.get("model_stats") else {}

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


def _shm_params(region: tuple[str, int, int]) -> dict[str, Any]:
    name, offset, size = region
    return {"shared_memory_region": name, "shared_memory_offset": offset, "shared_memory_byte_size": size}


def _grpc_shm_params(parameters: Any, region: tuple[str, int, int]) -> None:
    name, offset, size = region
    parameters["shared_memory_region"].string_param = name
    parameters["shared_memory_offset"].int64_param = offset
    parameters["shared_memory_byte_size"].int64_param = size


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
    client: Any = (_HttpClient if cfg.protocol == "http" else _GrpcClient)(cfg, concurrency)
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
