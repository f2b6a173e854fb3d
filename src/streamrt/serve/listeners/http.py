"""KServe v2 HTTP/REST front end on aiohttp.

Why aiohttp: one well-kept package gives an asyncio HTTP/1.1 server with a C parser (llhttp), a
request body limit, and the async client that ``streamrt perf`` uses; it runs on the same event
loop as ``grpc.aio``, so both front ends share the schedulers without threads in between, and
tritonclient's own ``http.aio`` client already depends on it.

Routes follow Triton's (``/v2/health/{live,ready}``, ``/v2``, ``/v2/models/{m}[/versions/{v}]``
with ``/ready``, ``/config``, ``/stats``, ``/infer``, ``/v2/models/stats``,
``/v2/repository/index``, ``/v2/repository/models/{m}/{load,unload}`` and the shared-memory
extensions ``/v2/{system,cuda}sharedmemory/[region/{name}/]{status,register,unregister}``).
Errors are ``{"error": "<message>"}`` with the status of :mod:`streamrt.serve.wire.status`.
Extensions StreamRT does not implement (trace, logging) answer 501 with a message naming them.
Request bodies may be gzip or deflate compressed (``Content-Encoding``, decoded by aiohttp);
responses of 1 KiB or more are compressed when ``Accept-Encoding`` asks for it, as tritonclient's
``request/response_compression_algorithm`` do (shorter ones go identity: :data:`COMPRESS_MIN_BYTES`).

Uncompressed request bodies are read into one buffer of ``Content-Length`` bytes as they arrive
(aiohttp's ``read()`` would copy them twice more); binary tensors are views of that buffer.

:class:`InferenceRoutes` is the inference path over an :class:`~streamrt.serve.port.InferencePort`
(the buffer comes from the port: a front-end worker's is its shared arena); :class:`ServerRoutes`
adds the other routes over a :class:`~streamrt.serve.core.ServerCore`. A front-end worker serves
``InferenceRoutes`` over its engine link and forwards the rest to the engine process.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt._optional import require
from streamrt.errors import (
    PayloadTooLargeError,
    RequestError,
    ServeError,
    SharedMemoryError,
    StreamRTError,
    UnsupportedRequestError,
)
from streamrt.serve.configs.model_files import FILE_PREFIX
from streamrt.serve.configs.triton_config import message_json
from streamrt.serve.port import InferencePort
from streamrt.serve.wire.protocol import HEADER_LENGTH, decode_http_request, encode_http_response
from streamrt.serve.wire.status import status_for

if TYPE_CHECKING:
    from aiohttp import web

    from streamrt.serve.core import ServerCore

__all__ = ["BadRequestLogFilter", "InferenceRoutes", "ServerRoutes", "answer_infer", "build_app", "error_reply",
           "fill_body", "quiet_bad_requests", "read_body", "reply_coding", "start_http"]

log = logging.getLogger(__name__)

Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]


def _error(status: int, message: str) -> web.Response:
    from aiohttp import web

    return web.json_response({"error": message}, status=status)


async def read_body(request: web.Request, into: np.ndarray | None = None) -> bytes | memoryview:
    """The request body in one buffer, copied once from the chunks aiohttp's parser hands over
    (:func:`fill_body`); without ``Content-Length``, aiohttp's ``read()``."""
    length = request.content_length
    if length is None:
        return await request.read()
    return await fill_body(request.content.readany, length, into)


async def fill_body(next_chunk: Callable[[], Awaitable[bytes]], length: int,
                    into: np.ndarray | None = None) -> memoryview:
    """A body of ``length`` bytes (its ``Content-Length``) in one buffer, from the chunks ``next_chunk``
    returns (b"" at the end), copied once.

    The buffer is uninitialised NumPy memory (``bytearray(n)`` would zero it first: one more pass),
    or ``into`` (a uint8 array of ``length`` bytes: a front-end worker's shared arena).

    Raises:
        RequestError: the body is longer or shorter than ``length``.
    """
    view = (np.empty(length, np.uint8) if into is None else into).data.cast("B")
    filled = 0
    while filled < length:
        chunk = await next_chunk()
        if not chunk:
            break
        if filled + len(chunk) > length:
            raise RequestError(f"the body is longer than its Content-Length of {length} bytes")
        view[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    if filled != length:
        raise RequestError(f"the body ended after {filled} of its {length} bytes (Content-Length)")
    return view


def json_header_length(raw: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` of a binary inference request (None: all JSON).

    Raises:
        RequestError: it is not an integer.
    """
    try:
        return None if raw is None else int(raw)
    except ValueError:
        raise RequestError(f"{HEADER_LENGTH} must be an integer, got {raw!r}") from None


COMPRESS_MIN_BYTES = 1024
"""Replies shorter than this go uncompressed whatever ``Accept-Encoding`` allows: a deflate stream's
own header and trailer (~20 bytes) outweigh what it saves on ~100 bytes of JSON, and setting up zlib
for each reply cost ~8% of a 64 B request's server CPU (py-spy; aiohttp's client asks for gzip by
default). HTTP lets a server answer identity to any ``Accept-Encoding``; nginx's ``gzip_min_length``
is the same rule."""


def reply_coding(nbytes: int, accepted: str) -> str | None:
    """The content coding of a reply of ``nbytes`` to a request that sent ``Accept-Encoding: accepted``:
    deflate or gzip (aiohttp's order of preference) from :data:`COMPRESS_MIN_BYTES` on, else None (identity)."""
    if nbytes < COMPRESS_MIN_BYTES:
        return None
    accepted = accepted.lower()
    return "deflate" if "deflate" in accepted else "gzip" if "gzip" in accepted else None


def infer_reply(request: web.Request, payload: bytes, json_length: int | None) -> web.Response:
    """The inference response: binary (with its JSON header's length) or JSON, compressed as
    :func:`reply_coding` says."""
    from aiohttp import web

    if json_length is None:
        reply = web.Response(body=payload, headers=_JSON_HEADERS)
    else:
        reply = web.Response(body=payload, headers={"Content-Type": "application/octet-stream",
                                                    HEADER_LENGTH: str(json_length)})
    if reply_coding(len(payload), request.headers.get("Accept-Encoding", "")) is not None:
        reply.enable_compression()
    return reply


_JSON_HEADERS = {"Content-Type": "application/json"}


_MODEL_PATHS = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")


def model_and_version(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


def _status(code: int) -> web.Response:
    from aiohttp import web

    return web.Response(status=code)


def _json(data: Any) -> web.Response:
    from aiohttp import web

    return web.json_response(data)


async def json_body(request: web.Request) -> dict[str, Any]:
    """A control request's JSON object body ({} when empty)."""
    text = await request.read()
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RequestError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("the body must be a JSON object")
    return data


def _field(body: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = body.get(key, default)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise SharedMemoryError(f"'{key}' must be {kind.__name__}, got {value!r}")
    return value


class InferenceRoutes:
    """The HTTP listener's inference path over an :class:`~streamrt.serve.port.InferencePort`: auth
    and the error table (a middleware for every route but health) and ``POST .../infer``.

    A front-end worker serves these over its engine link, with every other route forwarded to the
    engine process (``app(fallback=...)``); :class:`ServerRoutes` adds the rest over a core.
    """

    def __init__(self, port: InferencePort) -> None:
        self.port = port
        self.limit = port.config.max_request_bytes

    def app(self, fallback: Handler | None = None) -> web.Application:
        """The aiohttp application: these routes, and ``fallback`` for any other path and method."""
        require("aiohttp", extra="serve", purpose="the HTTP front end")
        from aiohttp import web

        @web.middleware
        async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await self.guard(request, handler)

        app = web.Application(client_max_size=self.limit, middlewares=[errors])
        self.add_routes(app)
        if fallback is not None:
            app.router.add_route("*", "/{tail:.*}", fallback)
        return app

    def add_routes(self, app: web.Application) -> None:
        for base in _MODEL_PATHS:
            app.router.add_route("POST", f"{base}/infer", self.infer)

    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Auth (health probes need none), then ``handler``; errors become ``{"error": ...}`` with
        the status table's code."""
        from aiohttp import web

        try:
            if not request.path.startswith("/v2/health/"):
                self.port.check_auth(request.headers.get("Authorization"))
            return await handler(request)
        except StreamRTError as exc:
            return _error(*error_reply(exc, request.method, request.path))
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body exceeds the server limit of {self.limit} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(exc.status, exc.reason)
            raise

    async def infer(self, request: web.Request) -> web.Response:
        name, version = model_and_version(request)

        async def read(into: np.ndarray | None, identity: bool) -> bytes | memoryview:
            if identity:
                return await read_body(request, into)
            # aiohttp undoes gzip/deflate; Content-Length is then the compressed size, so read() it.
            from aiohttp.web_protocol import RequestPayloadError

            try:
                return await request.read()
            except RequestPayloadError as exc:  # a body that does not decode: the client's error, not a 500
                raise RequestError(f"cannot decode the request body: {' '.join(str(exc).split())}") from None

        headers = request.headers
        payload, json_length = await answer_infer(
            self.port, name, version, read, length=request.content_length,
            encoding=headers.get("Content-Encoding", "identity"), header_length=headers.get(HEADER_LENGTH),
            trace_parent=headers.get("traceparent"))
        return infer_reply(request, payload, json_length)


BodyReader = Callable[["np.ndarray | None", bool], Awaitable["bytes | memoryview"]]
"""``read(into, identity)``: an inference request's body, into ``into`` (the port's buffer of
``Content-Length`` bytes, or None), decoded from its Content-Encoding unless ``identity``."""


async def answer_infer(port: InferencePort, name: str, version: str, read: BodyReader, *, length: int | None,
                       encoding: str, header_length: str | None, trace_parent: str | None,
                       ) -> tuple[bytes, int | None]:
    """``POST .../infer`` whoever parses the HTTP (aiohttp, h2corn): the size limit, the content
    coding, the body read into the port's buffer (a front-end worker's arena), decoded and answered;
    (the reply's bytes, its JSON header's length or None for all JSON).

    Raises:
        StreamRTError: what :func:`error_reply` turns into the answer (413 over the limit, 400 for a
            malformed body, the model's errors).
    """
    limit = port.config.max_request_bytes
    if length is not None and length > limit:
        raise PayloadTooLargeError(f"request body of {length} bytes exceeds the limit of {limit}")
    encoding = encoding.lower()
    if encoding not in ("identity", "", "gzip", "deflate"):
        raise UnsupportedRequestError(
            f"Content-Encoding '{encoding}' is not supported; use gzip, deflate or identity")
    identity = encoding in ("identity", "")
    buffer = port.request_buffer(length) if identity and length else None
    try:
        body = await read(None if buffer is None else buffer.array, identity)
        request = decode_http_request(body, json_header_length(header_length), model=name, version=version,
                                      max_elements=port.config.max_tensor_elements, memory=port.regions)
    except BaseException:
        if buffer is not None:
            buffer.release()
        raise
    request.trace_parent = trace_parent
    return await port.answer(request, lambda response: encode_http_response(response, request), buffer)


def error_reply(exc: StreamRTError, method: str, path: str) -> tuple[int, str]:
    """The HTTP status and ``{"error": ...}`` message of a failed request (the status table's code);
    a server-side failure that is not the server's own state is logged."""
    status = status_for(exc)
    if status.http >= 500 and not isinstance(exc, ServeError):
        log.warning("%s %s failed: %s", method, path, exc)
    return status.http, str(exc)


class ServerRoutes(InferenceRoutes):
    """Every route of the one-process server over a :class:`~streamrt.serve.core.ServerCore`:
    health, metadata, config, statistics, repository, shared memory, and 501 for the extensions
    StreamRT does not implement."""

    def __init__(self, server: ServerCore) -> None:
        super().__init__(server)
        self.server = server

    def add_routes(self, app: web.Application) -> None:
        # Inference first: aiohttp tries the dynamic routes under one prefix (/v2/models) in the
        # order they were added, so the request that comes thousands of times a second matches
        # at once (resolving a 64 B request's path: 6.0 -> 2.1 us).
        super().add_routes(app)
        add = app.router.add_route
        add("GET", "/v2/health/live", self.live)
        add("GET", "/v2/health/ready", self.ready)
        add("GET", "/v2", self.server_metadata)
        add("GET", "/v2/models/stats", self.all_stats)
        for base in _MODEL_PATHS:
            add("GET", base, self.model_metadata)
            add("GET", f"{base}/ready", self.model_ready)
            add("GET", f"{base}/config", self.model_config)
            add("GET", f"{base}/stats", self.model_stats)
        add("POST", "/v2/repository/index", self.repository_index)
        add("POST", "/v2/repository/models/{model}/load", self.load)
        add("POST", "/v2/repository/models/{model}/unload", self.unload)
        shm = "/v2/{kind:system|cuda}sharedmemory"
        add("GET", f"{shm}/status", self.shm_status)
        add("GET", f"{shm}/region/{{name}}/status", self.shm_status)
        add("POST", f"{shm}/region/{{name}}/register", self.shm_register)
        add("POST", f"{shm}/unregister", self.shm_unregister)
        add("POST", f"{shm}/region/{{name}}/unregister", self.shm_unregister)
        add_unimplemented(app)

    @property
    def repo(self) -> Any:
        assert self.server.repository is not None
        return self.server.repository

    async def live(self, request: web.Request) -> web.Response:
        return _status(200 if self.server.live else 400)

    async def ready(self, request: web.Request) -> web.Response:
        return _status(200 if self.server.ready else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(self.server.metadata())

    async def model_metadata(self, request: web.Request) -> web.Response:
        name, version = model_and_version(request)
        return _json(self.repo.get(name, version).metadata(self.repo.versions(name)))

    async def model_ready(self, request: web.Request) -> web.Response:
        name, version = model_and_version(request)
        if self.server.accepting and self.repo.is_ready(name, version):
            return _status(200)
        return _error(400, "Model version not ready")  # Triton's body for an unknown or unready model

    async def model_config(self, request: web.Request) -> web.Response:
        name, version = model_and_version(request)
        return _json(message_json(self.repo.get(name, version).triton_config()))

    async def model_stats(self, request: web.Request) -> web.Response:
        return _json(self.server.statistics(*model_and_version(request)))

    async def all_stats(self, request: web.Request) -> web.Response:
        return _json(self.server.statistics())

    async def repository_index(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        return _json(self.repo.index(ready_only=bool(body.get("ready", False))))

    async def load(self, request: web.Request) -> web.Response:
        self.server.check_model_control()
        body = await json_body(request)
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise RequestError("'parameters' must be an object")
        files = {}
        for key, value in params.items():
            if key.startswith(FILE_PREFIX):
                try:
                    files[key] = base64.b64decode(value, validate=True)
                except (ValueError, TypeError):
                    raise RequestError(f"load parameter '{key}' must be base64, as tritonclient sends it") from None
        await self.server.load_model(request.match_info["model"], params.get("config"), files or None)
        return _status(200)

    async def unload(self, request: web.Request) -> web.Response:
        self.server.check_model_control()
        await json_body(request)
        await self.repo.unload(request.match_info["model"])
        return _status(200)

    async def shm_status(self, request: web.Request) -> web.Response:
        kind = "system" if request.match_info["kind"] == "system" else "CUDA"
        return _json(self.server.shared_memory.status(kind, request.match_info.get("name", "")))

    async def shm_register(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        name, memory = request.match_info["name"], self.server.shared_memory
        if request.match_info["kind"] == "system":
            memory.register_system(name, _field(body, "key", str), _field(body, "offset", int, 0),
                                   _field(body, "byte_size", int))
            return _status(200)
        handle = _field(body, "raw_handle", dict)
        try:
            raw = base64.b64decode(_field(handle, "b64", str), validate=True)
        except (binascii.Error, ValueError):
            raise SharedMemoryError("'raw_handle.b64' is not valid base64") from None
        memory.register_cuda(name, raw, _field(body, "device_id", int), _field(body, "byte_size", int))
        return _status(200)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        kind = "system" if request.match_info["kind"] == "system" else "CUDA"
        self.server.shared_memory.unregister(kind, request.match_info.get("name", ""))
        return _status(200)


def build_app(server: ServerCore) -> web.Application:
    """The aiohttp application serving ``server`` (exposed for tests with aiohttp's test client)."""
    return ServerRoutes(server).app()


# Triton endpoints of extensions StreamRT does not implement -> 501 naming the extension. Dynamic
# routes added last: a real handler registered before them wins.
_UNIMPLEMENTED = (
    ("/v2/{ext:trace}{rest:.*}", "trace"),
    ("/v2/models/{model}/{ext:trace}{rest:.*}", "trace"),
    ("/v2/models/{model}/versions/{version}/{ext:trace}{rest:.*}", "trace"),
    ("/v2/{ext:logging}{rest:.*}", "logging"),
)


def add_unimplemented(app: web.Application) -> None:
    """501 routes for the extensions in :data:`_UNIMPLEMENTED` (GET and POST)."""
    for path, extension in _UNIMPLEMENTED:
        async def refuse(request: web.Request, extension: str = extension) -> web.Response:
            raise UnsupportedRequestError(f"the {extension} extension is not supported by this server")

        for method in ("GET", "POST"):
            app.router.add_route(method, path, refuse)


class BadRequestLogFilter(logging.Filter):
    """aiohttp logs a malformed request (a gRPC client at the HTTP port, a port scanner) as an ERROR
    with a traceback; the server did nothing wrong, so it becomes one WARNING line saying what came."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not any(c.__name__ == "HttpProcessingError" for c in type(exc).__mro__):
            return True
        what = " ".join(str(getattr(exc, "message", "") or exc).split(" b'")[0].split()).rstrip(":")  # not the bytes
        guess = " (an HTTP/2 or gRPC client at the HTTP port?)" if "PRI" in what else ""
        record.msg, record.args = f"{record.getMessage()}: malformed HTTP request: {what[:120]}{guess}", ()
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests() -> None:
    """Install :class:`BadRequestLogFilter` on aiohttp's server logger (once per process)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, BadRequestLogFilter) for f in logger.filters):
        logger.addFilter(BadRequestLogFilter())


async def start_http(server: ServerCore, host: str, port: int) -> tuple[Any, int]:
    """Start the HTTP site; returns the runner (``await runner.cleanup()`` stops it) and the bound port."""
    require("aiohttp", extra="serve", purpose="the HTTP front end")
    quiet_bad_requests()
    from aiohttp import web

    runner = web.AppRunner(build_app(server), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    return runner, int(runner.addresses[0][1])
