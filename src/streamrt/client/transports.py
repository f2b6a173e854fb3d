"""The load generator's two protocol clients: one prepared request, sent again and again.

:class:`HttpClient` (aiohttp: a connection per concurrent request) and :class:`GrpcClient` (grpc.aio:
``LoadConfig.grpc_channel_share`` concurrent requests per channel, each channel a connection of its own) share
one small interface that :mod:`streamrt.client.loadgen` drives: ``metadata``, ``prepare`` (the body, built
once), ``register``/``unregister`` (shared-memory regions), ``infer`` (one request), ``stats`` and ``close``.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt._optional import require
from streamrt.client.failures import grpc_error_line, http_error_text
from streamrt.errors import StreamRTError
from streamrt.serve.wire.grpc_wire import encode_length_delimited
from streamrt.serve.wire.protocol import HEADER_LENGTH, kserve_dtype

if TYPE_CHECKING:
    from streamrt.client.load_config import LoadConfig
    from streamrt.client.shared_memory import ClientRegions

__all__ = ["GrpcClient", "HttpClient", "grpc_shm_params", "shm_params"]


class HttpClient:
    """KServe v2 over HTTP/1.1 (aiohttp): binary tensors after a JSON header, or JSON data."""

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
                entry["parameters"] = shm_params(regions.inputs[name])
            elif self.cfg.binary:
                entry["parameters"] = {"binary_data_size": a.nbytes}
                blobs.append(a.tobytes())
            else:
                entry["data"] = a.ravel().tolist()
            entries.append(entry)
        request: dict[str, Any] = {"inputs": entries, "parameters": {"binary_data_output": self.cfg.binary}}
        if regions is not None:
            request["outputs"] = [{"name": n, "parameters": shm_params(r)} for n, r in regions.outputs.items()]
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


class GrpcClient:
    """KServe v2 over gRPC (grpc.aio): the serialized request kept as bytes and sent as is; ``infer``'s
    ``worker`` picks the channel, so the concurrent requests spread evenly over the channels."""

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
                grpc_shm_params(tensor.parameters, regions.inputs[name])
            else:
                request.raw_input_contents.append(a.tobytes())
        for name, region in (regions.outputs if regions is not None else {}).items():
            grpc_shm_params(request.outputs.add(name=name).parameters, region)
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


def shm_params(region: tuple[str, int, int]) -> dict[str, Any]:
    name, offset, size = region
    return {"shared_memory_region": name, "shared_memory_offset": offset, "shared_memory_byte_size": size}


def grpc_shm_params(parameters: Any, region: tuple[str, int, int]) -> None:
    name, offset, size = region
    parameters["shared_memory_region"].string_param = name
    parameters["shared_memory_offset"].int64_param = offset
    parameters["shared_memory_byte_size"].int64_param = size
