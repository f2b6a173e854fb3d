"""StreamRT inside Ray Serve: each replica serves a model repository, Ray spreads the replicas.

A replica owns one in-process server core (no listeners) on its own event-loop thread: the
repository's models with their instance groups, dynamic batcher and streams stay inside the
replica, exactly as in ``streamrt serve``. Ray Serve provides the replicas, autoscaling, the HTTP
proxy and the restarts; the edge speaks the KServe v2 protocol (``/v2/health/{live,ready}``,
``/v2/models/{m}[/versions/{v}]`` metadata, ``.../ready``, ``.../infer`` with JSON or JSON + binary
tensors, and ``.../stats`` of the replica that answers), so the same clients (tritonclient,
``streamrt perf``) work against it.

Every replica opens the repository path itself: on a multi-node cluster it must be on a shared
file system (or the same path on every node). Needs the ``ray`` extra (``pip install 'streamrt[ray]'``).

Example:
    >>> from ray import serve                                               # doctest: +SKIP
    >>> app = streamrt_app("models", num_replicas=4)                         # doctest: +SKIP
    >>> serve.run(app, route_prefix="/")                                     # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamrt._optional import require
from streamrt.errors import ConfigError, ServerShuttingDownError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread
from streamrt.serve.wire.protocol import HEADER_LENGTH, decode_http_request, encode_http_response
from streamrt.serve.wire.status import status_for

__all__ = ["StreamRTReplica", "streamrt_app"]

_MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(infer|ready|stats))?$")


class StreamRTReplica:
    """One Ray Serve replica: a StreamRT server core over ``repository``, answering KServe v2 over HTTP.

    Args:
        repository: model repository directory (the layout ``streamrt serve`` reads).
        server: :class:`ServerConfig` fields (``startup_models``, ``max_tensor_elements``,
            ``exit_timeout_s``, ...); ports are ignored (the replica opens no listener).
    """

    def __init__(self, repository: str, server: Mapping[str, Any] | None = None) -> None:
        if not Path(repository).is_dir():
            raise ConfigError(f"model repository {repository} is not a directory on this node",
                              hint="put it on a file system every Ray node mounts at the same path")
        fields = {**(server or {}), "http_port": None, "grpc_port": None, "metrics_port": None}
        self._server = ServerThread(repository, ServerConfig(**fields)).start()

    async def _call(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._server._loop))

    async def __call__(self, request: Any) -> Any:
        """Answer one HTTP request (a Starlette ``Request``) with the KServe v2 protocol."""
        responses = require("starlette.responses", extra="ray", purpose="the Ray Serve integration")
        try:
            status, body, headers = await self._route(request)
        except BaseException as exc:  # every failure leaves as the status streamrt serve gives it
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            status, body, headers = status_for(exc).http, _json({"error": str(exc)}), {}
        return responses.Response(body, status_code=status, headers=headers,
                                  media_type="application/json" if HEADER_LENGTH not in headers
                                  else "application/octet-stream")

    async def _route(self, request: Any) -> tuple[int, bytes, dict[str, str]]:
        core = self._server.server
        path, method = request.url.path.rstrip("/"), request.method
        if method == "GET" and path == "/v2/health/live":
            return (200 if core.live else 503), _json({"live": core.live}), {}
        if method == "GET" and path == "/v2/health/ready":
            return (200 if core.ready else 503), _json({"ready": core.ready}), {}
        if method == "GET" and path == "/v2":
            return 200, _json(core.metadata()), {}
        found = _MODEL_ROUTE.match(path)
        if found is None:
            return 404, _json({"error": f"no route {method} {path} (KServe v2: health, metadata, ready, infer)"}), {}
        model, version, action = found.group(1), found.group(2) or "", found.group(3) or ""
        repository = core.repository
        assert repository is not None  # set by start()
        if method == "GET" and action != "infer":
            served = repository.get(model, version)  # raises the server's not-found / not-ready error
            if action == "ready":
                return 200, _json({"ready": True}), {}
            if action == "stats":
                return 200, _json(core.statistics(model, version)), {}
            return 200, _json(served.metadata(repository.versions(model))), {}
        if action != "infer" or method != "POST":
            return 405, _json({"error": f"{method} not allowed on {path}"}), {}
        if not core.accepting:
            raise ServerShuttingDownError("the replica is shutting down and accepts no new requests")
        length = request.headers.get(HEADER_LENGTH)
        infer = decode_http_request(await request.body(), int(length) if length is not None else None,
                                    model=model, version=version, max_elements=core.config.max_tensor_elements)
        response = await self._call(core.infer(infer))
        payload, json_length = encode_http_response(response, infer)
        return 200, payload, ({HEADER_LENGTH: str(json_length)} if json_length is not None else {})

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose core is no longer live is restarted."""
        if not self._server.server.live:
            raise ServerShuttingDownError("the StreamRT server core of this replica is not live")


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def streamrt_app(
    repository: str | Path, *, name: str = "streamrt", num_replicas: int | None = 1,
    autoscaling_config: Mapping[str, Any] | None = None, ray_actor_options: Mapping[str, Any] | None = None,
    max_ongoing_requests: int = 64, server: Mapping[str, Any] | None = None,
) -> Any:
    """A Ray Serve application serving ``repository`` from ``num_replicas`` replicas (or autoscaled).

    ``autoscaling_config`` (Ray Serve's: ``min_replicas``, ``max_replicas``,
    ``target_ongoing_requests``, ...) replaces ``num_replicas``; ``ray_actor_options`` sets each
    replica's resources (``{"num_cpus": 2}``, ``{"num_gpus": 1}``); ``max_ongoing_requests``
    bounds the requests one replica holds, so its batcher sees a queue and not the whole load.
    """
    serve = require("ray.serve", extra="ray", purpose="the Ray Serve integration")
    if autoscaling_config is not None and num_replicas not in (None, 1):
        raise ConfigError("give num_replicas or autoscaling_config, not both",
                          hint="autoscaling_config={'min_replicas': 1, 'max_replicas': N}")
    options: dict[str, Any] = {"name": name, "max_ongoing_requests": max_ongoing_requests,
                               "ray_actor_options": dict(ray_actor_options or {"num_cpus": 1})}
    if autoscaling_config is not None:
        options["autoscaling_config"] = dict(autoscaling_config)
    else:
        options["num_replicas"] = num_replicas
    deployment = serve.deployment(StreamRTReplica).options(**options)
    return deployment.bind(str(Path(repository).resolve()), dict(server or {}))
