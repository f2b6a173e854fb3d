"""KServe v2 gRPC front end (``inference.GRPCInferenceService``) on ``grpc.aio``.

Served through a generic handler over the messages of :mod:`streamrt.serve.wire.proto`, so no
generated ``_pb2_grpc`` code is needed. Inputs come as ``raw_input_contents`` (what tritonclient
sends), typed ``contents`` (``bytes_contents`` for BYTES) or shared-memory regions, never raw and
typed contents in one request (the KServe spec forbids mixing them); outputs go back as
``raw_output_contents`` (the form tritonclient's ``InferResult.as_numpy`` reads; BYTES
length-prefixed) or into shared-memory regions. An output's ``class_count`` asks for the
classification extension. ``ModelInfer`` takes and returns serialized bytes:
:mod:`streamrt.serve.wire.grpc_wire` keeps the tensors out of protobuf (zero-copy views in, one copy
out). Errors use the status table's gRPC codes; RPCs not registered here answer ``UNIMPLEMENTED``.

:class:`InferenceRpcs` is the inference path over an :class:`~streamrt.serve.port.InferencePort`;
:class:`GrpcService` adds the other RPCs (:data:`UNARY_RPCS`) over a
:class:`~streamrt.serve.core.ServerCore`. A front-end worker serves ``InferenceRpcs`` over its
engine link and forwards the others to the engine process.

Messages larger than ``ServerConfig.grpc_max_message_bytes`` (``--grpc-max-message-mb``) are
refused by gRPC itself with ``RESOURCE_EXHAUSTED`` ("Received message larger than max").
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from streamrt._optional import require
from streamrt.errors import RequestError, StreamRTError, UnparsableRequestError, UnsupportedRequestError
from streamrt.serve.core import ServerCore
from streamrt.serve.port import InferencePort, port_in_use
from streamrt.serve.wire.grpc_layouts import known_request, known_whole_request, remember_request, reply_header
from streamrt.serve.wire.grpc_wire import encode_infer_response, encode_length_delimited, split_infer_request
from streamrt.serve.wire.proto import SERVICE
from streamrt.serve.wire.protocol import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    deserialize_bytes,
    kserve_dtype,
    numpy_dtype,
    raw_bytes,
    sequence_flags,
)
from streamrt.serve.wire.shared_memory import RegionSource, SharedMemoryRegistry, region_ref
from streamrt.serve.wire.status import status_for

__all__ = ["UNARY_RPCS", "UNPARSABLE", "GrpcService", "InferenceRpcs", "bind_grpc", "decode_grpc_request",
           "encode_grpc_response", "grpc_server", "listen_grpc", "parse_infer_request", "serialize_grpc_response",
           "service_handler", "start_grpc"]

UNPARSABLE = "Unable to parse request"
"""What a message that is not the RPC's request message gets (INTERNAL), in gRPC C++'s words as Triton answers."""

log = logging.getLogger(__name__)

# Typed contents field for each datatype (FP16/BF16 have none: they must come raw).
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def import_grpc() -> Any:
    """``grpc`` with ``grpc.aio`` loaded, or MissingDependencyError naming the ``serve`` extra."""
    require("grpc.aio", extra="serve", purpose="the gRPC front end")
    return require("grpc", extra="serve", purpose="the gRPC front end")


_PROTO: Any = None


def _messages() -> Any:
    """:data:`streamrt.serve.wire.proto.messages`, imported once (an import statement per request cost ~1.5 us)."""
    global _PROTO
    if _PROTO is None:
        from streamrt.serve.wire.proto import messages

        _PROTO = messages
    return _PROTO


def _metadata(context: Any) -> dict[str, Any]:
    """The call's metadata by key (``authorization``, OpenTelemetry's ``traceparent``)."""
    return dict(context.invocation_metadata() or ())


def _param(value: Any) -> Any:
    choice = value.WhichOneof("parameter_choice")
    return getattr(value, choice) if choice else None


def parse_infer_request(data: bytes, max_elements: int, memory: RegionSource | None = None) -> InferRequest:
    """Serialized ``ModelInferRequest`` -> :class:`InferRequest`; tensors are zero-copy views of ``data``.

    The message is split from its raw contents first (:func:`split_infer_request`); a rest decoded
    before is looked up instead of parsed again (:mod:`streamrt.serve.wire.grpc_layouts`).
    """
    known = known_whole_request(data, max_elements)
    if known is not None:
        return known
    try:
        rest, raw = split_infer_request(data)
        known = known_request(rest, raw, max_elements) if raw else None
        if known is not None:
            return known
        message = _messages().ModelInferRequest.FromString(rest)
    except Exception as exc:  # google.protobuf.message.DecodeError, or split_infer_request's RequestError
        log.debug("a ModelInferRequest of %d bytes does not parse: %s", len(data), exc)
        raise UnparsableRequestError(UNPARSABLE) from None
    request = decode_grpc_request(message, max_elements, raw=raw, memory=memory)
    if raw:
        remember_request(rest, message, request, max_elements)
    return request


def decode_grpc_request(
    message: Any, max_elements: int, *, raw: Sequence[bytes | memoryview] | None = None,
    memory: RegionSource | None = None,
) -> InferRequest:
    """``ModelInferRequest`` -> :class:`InferRequest`.

    ``raw`` replaces the message's ``raw_input_contents`` (views from :func:`split_infer_request`);
    inputs and outputs may name shared-memory regions of ``memory`` (their ``shared_memory_*``
    parameters; they are leased by the request until the server answers it).
    """
    leases: list[Any] = []
    try:
        return _decode(message, max_elements, raw, memory, leases)
    except BaseException:
        SharedMemoryRegistry.release(leases)
        raise


def _decode(message: Any, max_elements: int, raw: Sequence[bytes | memoryview] | None,
            memory: RegionSource | None, leases: list[Any]) -> InferRequest:
    params = {k: _param(v) for k, v in message.parameters.items()}
    if raw is None:
        raw = list(message.raw_input_contents)
    for tensor in message.inputs if raw else ():  # Triton's check and words, before the count's
        if tensor.HasField("contents"):
            raise RequestError(f"contents field must not be specified when using raw_input_contents for "
                               f"'{tensor.name}' for model '{message.model_name}'")
    # tritonclient sends raw contents only for the inputs that are not in shared memory, in order.
    in_tensors = [t for t in message.inputs if "shared_memory_region" not in t.parameters]
    if raw and len(raw) != len(in_tensors):
        raise RequestError(f"{len(raw)} raw_input_contents for {len(in_tensors)} inputs not in shared memory; "
                           "send one per input")
    inputs: dict[str, Any] = {}
    index = -1
    for tensor in message.inputs:
        where = f"input '{tensor.name}'"
        shape = tuple(int(d) for d in tensor.shape)
        if any(d < 0 for d in shape):
            raise RequestError(f"{where}: shape dimensions must be >= 0, got {list(shape)}")
        dtype = numpy_dtype(tensor.datatype)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count > max_elements:
            from streamrt.errors import PayloadTooLargeError

            raise PayloadTooLargeError(f"{where}: {count} elements exceed the server limit of {max_elements}")
        tparams = {k: _param(v) for k, v in tensor.parameters.items()}
        if "shared_memory_region" in tparams:
            target = region_ref(tparams, where)
            if memory is None:
                raise UnsupportedRequestError(f"{where}: shared memory is not enabled on this server "
                                              "(parameter shared_memory_region)")
            inputs[tensor.name] = memory.read_input(target, dtype, shape, where, leases)
            continue
        index += 1
        if raw and tensor.datatype == "BYTES":
            inputs[tensor.name] = deserialize_bytes(raw[index], count, where).reshape(shape)
            continue
        if raw:
            data = raw[index]
            if len(data) != count * dtype.itemsize:
                raise RequestError(f"{where}: raw_input_contents has {len(data)} bytes but shape {list(shape)} "
                                   f"of {tensor.datatype} needs {count * dtype.itemsize}")
            inputs[tensor.name] = np.frombuffer(data, dtype=dtype).reshape(shape)
            continue
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
            raise UnsupportedRequestError(f"{where}: {tensor.datatype} must be sent in raw_input_contents")
        values = getattr(tensor.contents, field)
        if len(values) != count:
            raise RequestError(f"{where}: contents has {len(values)} values but shape {list(shape)} needs {count}")
        if tensor.datatype == "BYTES":
            array = np.empty(count, dtype=object)
            array[:] = list(values)
            inputs[tensor.name] = array.reshape(shape)
            continue
        inputs[tensor.name] = np.asarray(values, dtype=dtype).reshape(shape)
    priority, timeout = params.get("priority", 0) or 0, params.get("timeout", 0) or 0
    if not isinstance(priority, int) or not isinstance(timeout, int) or priority < 0 or timeout < 0:
        raise RequestError("parameters 'priority' and 'timeout' must be integers >= 0")
    return InferRequest(
        model=message.model_name,
        version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=tuple(_requested_output(o, memory, leases) for o in message.outputs),
        priority=priority,
        timeout_us=timeout,
        leases=leases,
        sequence=sequence_flags(params),
    )


def _requested_output(output: Any, memory: RegionSource | None, leases: list[Any]) -> RequestedOutput:
    oparams = {k: _param(v) for k, v in output.parameters.items()}
    where = f"output '{output.name}'"
    classes = oparams.get("classification", 0) or 0
    if not isinstance(classes, int) or classes < 0:
        raise RequestError(f"{where}: class_count must be an integer >= 0, got {classes!r}")
    if "shared_memory_region" not in oparams:
        return RequestedOutput(output.name, class_count=classes)
    if memory is None:
        raise UnsupportedRequestError(f"{where}: shared memory is not enabled on this server "
                                      "(parameter shared_memory_region)")
    region = region_ref(oparams, where)
    memory.lease_output(region, where, leases)
    return RequestedOutput(output.name, class_count=classes, region=region)


def encode_grpc_response(response: InferResponse) -> Any:
    """:class:`InferResponse` -> ``ModelInferResponse`` with ``raw_output_contents`` in output order."""
    from streamrt.serve.wire.proto import messages

    return messages.ModelInferResponse.FromString(serialize_grpc_response(response))


def serialize_grpc_response(response: InferResponse) -> bytes:
    """The serialized ``ModelInferResponse``: raw_output_contents in output order, one copy of each.

    Outputs written to shared memory carry their region parameters and an empty raw entry (so the
    entries of the other outputs keep their index, as tritonclient's ``as_numpy`` expects).
    """
    parts = reply_header(response, _messages)
    if parts is not None:  # the same bytes as below: fields 1-2, the id (field 3), the outputs (field 5)
        head = [parts[0], encode_length_delimited(3, response.id.encode()), parts[1]] if response.id else parts
        return encode_infer_response(b"".join(head), [raw_bytes(a) for a in response.outputs.values()])
    message = _messages().ModelInferResponse(model_name=response.model, model_version=response.version, id=response.id)
    blobs: list[memoryview | bytes] = []
    for name, array in response.outputs.items():
        out = message.outputs.add(name=name, datatype=kserve_dtype(array), shape=list(array.shape))
        target = response.in_shared_memory.get(name)
        if target is not None:
            out.parameters["shared_memory_region"].string_param = target.name
            out.parameters["shared_memory_byte_size"].int64_param = target.byte_size
            if target.offset:
                out.parameters["shared_memory_offset"].int64_param = target.offset
            blobs.append(b"")
            continue
        blobs.append(raw_bytes(array))
    return encode_infer_response(message.SerializeToString(), blobs)


UNARY_RPCS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
              "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
              "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
              "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister")
"""The service's RPCs other than inference (a front-end worker forwards these to the engine process)."""

_REQUEST_TYPES = {"RepositoryIndex": "RepositoryIndexRequest", "RepositoryModelLoad": "RepositoryModelLoadRequest",
                  "RepositoryModelUnload": "RepositoryModelUnloadRequest"}


class InferenceRpcs:
    """``ModelInfer`` and ``ModelStreamInfer`` over an :class:`~streamrt.serve.port.InferencePort`.

    A front-end worker serves these over its engine link with the :data:`UNARY_RPCS` forwarded;
    :class:`GrpcService` adds those over a core.
    """

    def __init__(self, port: InferencePort) -> None:
        from streamrt.serve.wire.proto import messages

        self.port = port
        self.messages = messages
        self.grpc = import_grpc()

    async def _abort(self, context: Any, exc: StreamRTError) -> None:
        """End the call with ``exc``'s message and the status table's code."""
        await context.abort(self.grpc.StatusCode[status_for(exc).grpc], str(exc))

    async def _guard(self, context: Any, call: Callable[[], Awaitable[Any]],
                     metadata: Mapping[str, Any] | None = None) -> Any:
        """Auth (from ``metadata``, the call's when not given), then ``call``; a StreamRT error aborts
        the call with the status table's code."""
        try:
            self.port.check_auth((_metadata(context) if metadata is None else metadata).get("authorization"))
            return await call()
        except StreamRTError as exc:
            await self._abort(context, exc)

    async def _now(self, context: Any, compute: Callable[[], Any]) -> Any:
        """:meth:`_guard` of a call that does not wait: ``compute()`` is the response."""
        async def call() -> Any:
            return compute()
        return await self._guard(context, call)

    async def _infer(self, data: bytes, traceparent: str | None) -> bytes:
        request = parse_infer_request(data, self.port.config.max_tensor_elements, self.port.regions)
        request.trace_parent = traceparent
        return await self.port.answer(request, serialize_grpc_response)

    async def ModelInfer(self, request: bytes, context: Any) -> Any:
        # :meth:`_guard` around :meth:`_infer`, written out: the two coroutine layers cost every request
        metadata = _metadata(context)
        try:
            self.port.check_auth(metadata.get("authorization"))
            return await self._infer(request, metadata.get("traceparent"))
        except StreamRTError as exc:
            await self._abort(context, exc)

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        metadata = _metadata(context)
        try:
            self.port.check_auth(metadata.get("authorization"))
        except StreamRTError as exc:
            await self._abort(context, exc)
        traceparent = metadata.get("traceparent")
        async for request in requests:
            try:
                # ModelStreamInferResponse.infer_response is field 2: tag, length, the response bytes.
                yield encode_length_delimited(2, await self._infer(request, traceparent))
            except StreamRTError as exc:
                yield self.messages.ModelStreamInferResponse(error_message=str(exc)).SerializeToString()

    def method_handlers(self, unary: Mapping[str, Any]) -> dict[str, Any]:
        """Every RPC's gRPC method handler: ``unary`` (RPC name -> handler, for each of :data:`UNARY_RPCS`)
        and inference here, on serialized bytes (no (de)serializer: see :mod:`streamrt.serve.wire.grpc_wire`).
        grpcio serves them through :meth:`handler`, h2corn directly (:mod:`.grpc_h2corn`)."""
        grpc = self.grpc
        handlers = dict(unary)
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(self.ModelInfer)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(self.ModelStreamInfer)
        return handlers

    def handler(self, unary: Mapping[str, Any]) -> Any:
        """The generic handler of the service for grpcio: :meth:`method_handlers` under the service name."""
        return self.grpc.method_handlers_generic_handler(SERVICE, self.method_handlers(unary))


class GrpcService(InferenceRpcs):
    """Every RPC of the one-process server over a :class:`~streamrt.serve.core.ServerCore`; each
    returns a response message or aborts with the mapped status."""

    def __init__(self, server: ServerCore) -> None:
        from google.protobuf import json_format

        super().__init__(server)
        self.server = server
        self.json_format = json_format

    def unary_handlers(self) -> dict[str, Any]:
        """The gRPC method handlers of :data:`UNARY_RPCS` (messages parsed and serialized by protobuf;
        bytes that do not parse get INTERNAL :data:`UNPARSABLE`, as in Triton, not grpcio's UNKNOWN
        with a traceback in the log)."""
        return {name: self.grpc.unary_unary_rpc_method_handler(
                    self._parsed(getattr(self, name)),
                    request_deserializer=_lenient(
                        getattr(self.messages, _REQUEST_TYPES.get(name, f"{name}Request")).FromString),
                    response_serializer=lambda message: message.SerializeToString())
                for name in UNARY_RPCS}

    def _parsed(self, behaviour: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        """``behaviour``, unless :func:`_lenient` could not parse the request: then INTERNAL :data:`UNPARSABLE`."""
        async def call(request: Any, context: Any) -> Any:
            if request is _UNPARSED:
                await self._abort(context, UnparsableRequestError(UNPARSABLE))
            return await behaviour(request, context)
        return call

    @property
    def repo(self) -> Any:
        return self.server.repository

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return self.messages.ServerLiveResponse(live=self.server.live)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return self.messages.ServerReadyResponse(ready=self.server.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return await self._now(context, lambda: self.messages.ModelReadyResponse(
            ready=self.server.accepting and self.repo.is_ready(request.name, request.version)))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return await self._now(context, lambda: self.messages.ServerMetadataResponse(**self.server.metadata()))

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            meta = self.repo.get(request.name, request.version).metadata(self.repo.versions(request.name))
            return self.json_format.ParseDict(meta, self.messages.ModelMetadataResponse())
        return await self._guard(context, call)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            config = self.repo.get(request.name, request.version).triton_config()
            return self.messages.ModelConfigResponse(config=config)
        return await self._guard(context, call)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            stats = self.server.statistics(request.name, request.version)
            response = self.messages.ModelStatisticsResponse()
            return self.json_format.ParseDict(stats, response, ignore_unknown_fields=True)
        return await self._guard(context, call)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            return self.json_format.ParseDict({"models": self.repo.index(ready_only=request.ready)},
                                              self.messages.RepositoryIndexResponse())
        return await self._guard(context, call)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self.server.check_model_control()
            params = {k: _param(v) for k, v in request.parameters.items()}
            files = {k: bytes(v) for k, v in params.items() if k.startswith("file:") and isinstance(v, bytes)}
            if any(k.startswith("file:") and k not in files for k in params):
                raise RequestError("file: load parameters must be bytes_param")
            await self.server.load_model(request.model_name, params.get("config") or None, files or None)
            return self.messages.RepositoryModelLoadResponse()
        return await self._guard(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self.server.check_model_control()
            await self.repo.unload(request.model_name)
            return self.messages.RepositoryModelUnloadResponse()
        return await self._guard(context, call)

    # --- shared-memory extensions -------------------------------------------------------------

    def _shm_status(self, kind: str, name: str, response: Any) -> Any:
        for entry in self.server.shared_memory.status(kind, name):
            response.regions[entry["name"]].CopyFrom(type(response.regions[entry["name"]])(**entry))
        return response

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return await self._now(context, lambda: self._shm_status(
            "system", request.name, self.messages.SystemSharedMemoryStatusResponse()))

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        def register() -> Any:
            self.server.shared_memory.register_system(request.name, request.key, request.offset, request.byte_size)
            return self.messages.SystemSharedMemoryRegisterResponse()
        return await self._now(context, register)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return await self._now(context, lambda: self._shm_unregister(
            "system", request.name, self.messages.SystemSharedMemoryUnregisterResponse()))

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return await self._now(context, lambda: self._shm_status(
            "CUDA", request.name, self.messages.CudaSharedMemoryStatusResponse()))

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        def register() -> Any:
            self.server.shared_memory.register_cuda(request.name, request.raw_handle, request.device_id,
                                                    request.byte_size)
            return self.messages.CudaSharedMemoryRegisterResponse()
        return await self._now(context, register)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return await self._now(context, lambda: self._shm_unregister(
            "CUDA", request.name, self.messages.CudaSharedMemoryUnregisterResponse()))

    def _shm_unregister(self, kind: str, name: str, response: Any) -> Any:
        self.server.shared_memory.unregister(kind, name)
        return response


def service_handler(server: ServerCore) -> Any:
    """The generic gRPC handler of every RPC over ``server`` (its public port, or the private
    socket front-end workers forward to)."""
    service = GrpcService(server)
    return service.handler(service.unary_handlers())


_UNPARSED = object()


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse`` that returns :data:`_UNPARSED` instead of raising: grpcio would answer UNKNOWN with the
    exception's class name and log a traceback; the handler answers INTERNAL :data:`UNPARSABLE` instead."""
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # google.protobuf.message.DecodeError
            return _UNPARSED
    return deserialize


def grpc_server(max_receive_bytes: int, *, reuse_port: bool = False) -> Any:
    """A ``grpc.aio`` server taking messages up to ``max_receive_bytes`` and sending any size."""
    return import_grpc().aio.server(options=[
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.so_reuseport", int(reuse_port)),
    ])


async def start_grpc(server: ServerCore, host: str, port: int) -> tuple[Callable[[], Awaitable[Any]], int]:
    """Start the gRPC listener of the one-process server; returns how to stop it and the bound port."""
    if port:
        _check_free(host, port)
    service = GrpcService(server)
    return await listen_grpc(service.method_handlers(service.unary_handlers()), server.config.grpc_server, host, port,
                             server.config.grpc_max_message_bytes, threads=server.config.grpc_threads)


async def listen_grpc(handlers: Mapping[str, Any], kind: str, host: str, port: int, max_receive_bytes: int, *,
                      reuse_port: bool = False, threads: int = 0) -> tuple[Callable[[], Awaitable[Any]], int]:
    """Serve ``handlers`` (:meth:`InferenceRpcs.method_handlers`) on ``host:port`` with ``kind`` (``grpcio`` or
    ``h2corn``, ``ServerConfig.grpc_server``) in this event loop; (how to stop it, the bound port). A port that
    cannot be bound is :func:`~streamrt.serve.port.port_in_use`'s one-line error. The one-process server and
    each front-end worker listen through it. ``threads``: h2corn's Tokio threads (0: its default)."""
    if kind == "h2corn":
        from streamrt.serve.listeners.grpc_h2corn import start_grpc_h2corn

        return await start_grpc_h2corn(handlers, SERVICE, host, port, max_receive_bytes, reuse_port=reuse_port,
                                       threads=threads)
    grpc_aio = grpc_server(max_receive_bytes, reuse_port=reuse_port)
    grpc_aio.add_generic_rpc_handlers((import_grpc().method_handlers_generic_handler(SERVICE, dict(handlers)),))
    bound = bind_grpc(grpc_aio, f"{host}:{port}")
    if bound == 0:
        raise port_in_use("gRPC", host, port, "--grpc-port")
    await grpc_aio.start()
    return lambda: grpc_aio.stop(grace=1.0), bound


def bind_grpc(server: Any, address: str) -> int:
    """``server.add_insecure_port(address)``: the bound port, 0 when it cannot be bound (grpcio >= 1.6x
    raises ``RuntimeError("Failed to bind to address ...")`` where older versions returned 0)."""
    try:
        return int(server.add_insecure_port(address))
    except RuntimeError as exc:
        if "bind" not in str(exc).lower():
            raise
        return 0


def _check_free(host: str, port: int) -> None:
    """Refuse a busy ``host:port`` before gRPC tries it (gRPC's core would log its own error line first)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return  # gRPC reports a host it cannot resolve itself
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a TIME_WAIT port is free
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise port_in_use("gRPC", host, port, "--grpc-port") from None
