"""The server core: model lifecycle, health, inference, statistics and auth, with no listener.

:class:`ServerCore` is what every front end talks to. ``start`` opens the repository and loads
the start-up models in the background (liveness is true at once, readiness only once they are
READY); ``stop`` is the graceful shutdown: readiness goes false and new inference requests get
503, in-flight requests finish (bounded by ``exit_timeout_s``), then the models are unloaded
(GPU memory released).

All front ends call :meth:`ServerCore.infer`, which also keeps the per-model success and failure
counters, so HTTP, gRPC and in-process calls are counted the same way. The listeners reach it
through the :class:`~streamrt.serve.port.InferencePort` it implements (``check_auth``,
``request_buffer``, ``answer``), the same port a front-end worker's engine link implements. The
core imports no front end: :mod:`streamrt.serve.server` binds the HTTP, gRPC and metrics
listeners over it through the :meth:`ServerCore._open_listeners` / :meth:`ServerCore._close_listeners`
hooks.

Example:
    >>> core = ServerCore("models", ServerConfig())              # doctest: +SKIP
    >>> await core.start(wait_ready=True)                         # doctest: +SKIP
    >>> await core.infer(InferRequest("cnn", inputs={"x": x}))    # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from streamrt._version import __version__
from streamrt.device.cpus import format_cpu_list, pin_process, split_cpus, usable_cpus
from streamrt.errors import (
    ModelLoadError,
    RequestError,
    ServerShuttingDownError,
    SharedMemoryError,
    StreamRTError,
    UnknownModelError,
    UnsupportedRequestError,
)
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.execution.memory_budget import MemoryBudget
from streamrt.serve.execution.rate_limiter import RateLimiter
from streamrt.serve.models.model import EngineLoader
from streamrt.serve.models.repository import ModelRepository
from streamrt.serve.models.servable import Servable
from streamrt.serve.observability.tracing import REQUEST_CONTEXT, RequestContext, Tracer
from streamrt.serve.port import RequestBuffer, check_bearer
from streamrt.serve.wire.protocol import InferRequest, InferResponse
from streamrt.serve.wire.shared_memory import RegionRef, SharedMemoryRegistry
from streamrt.serve.wire.status import status_for

__all__ = ["EXTENSIONS", "ServerCore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

EXTENSIONS = ["binary_tensor_data", "classification", "model_repository", "model_configuration", "schedule_policy",
              "statistics", "parameters", "system_shared_memory", "cuda_shared_memory", "sequence",
              "sequence(string_id)"]
"""KServe/Triton extensions this server implements (listed in the server metadata)."""


class ServerCore:
    """A model repository with health, inference, statistics and auth; front ends sit on top.

    Args:
        repository: the model repository directory.
        config: limits, auth, start-up models, shutdown timeout (the ports are the listeners').
        engine_loader: replaces how model versions load their engine (tests, custom engines).
    """

    def __init__(
        self, repository: str | Path, config: ServerConfig | None = None, *, engine_loader: EngineLoader | None = None
    ) -> None:
        self.config = config or ServerConfig()
        self.engine_loader = engine_loader
        self.repository_path = Path(repository)
        self.repository: ModelRepository | None = None
        self.started_at = 0.0
        self._accepting = False
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._startup: list[str] = []
        self._loading: asyncio.Task[Any] | None = None
        self._open = False  # from start until stop finished: what stop has to undo
        self.shared_memory = SharedMemoryRegistry()
        self.tracer: Tracer | None = None
        self.frontend_cpus: frozenset[int] | None = None  # engine_cpus's rest: where front ends run
        self._cpus_before: frozenset[int] | None = None  # the process's CPUs before engine_cpus pinned it

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self, *, wait_ready: bool = False) -> None:
        """Place the process (``engine_cpus``), open the repository, bind the listeners, start loading the
        start-up models (optionally wait)."""
        cfg = self.config
        if cfg.engine_cpus is not None:  # first: every pool started later inherits the mask
            self.frontend_cpus = split_cpus(cfg.engine_cpus, need_rest=cfg.frontend_processes > 1)
            self._cpus_before = usable_cpus()  # given back at stop (a server in a thread of a longer process)
            pin_process(os.getpid(), cfg.engine_cpus)
            log.info("engine process on CPUs %s%s", format_cpu_list(cfg.engine_cpus),
                     f", front-end processes on {format_cpu_list(self.frontend_cpus)}"
                     if cfg.frontend_processes > 1 else "")
        self.repository = ModelRepository(
            self.repository_path, load_threads=cfg.load_threads, drain_timeout_s=cfg.exit_timeout_s,
            engine_loader=self.engine_loader, **_sharing(cfg),
        )
        if cfg.trace_file is not None or cfg.trace_otlp_url is not None:
            self.tracer = Tracer(cfg.trace_file, cfg.trace_rate, otlp_url=cfg.trace_otlp_url)
        self._open = True
        self._idle = asyncio.Event()
        self._idle.set()
        self._startup = list(cfg.startup_models) if cfg.startup_models is not None else self.repository.model_names()
        await self._open_listeners()
        self._accepting = True
        self.started_at = time.time()
        log.info("streamrt server %s%s; loading %d models", __version__, self._describe_listeners(),
                 len(self._startup))
        if not self._startup:
            log.warning(
                "model repository %s has no models: expected %s/NAME/1/model.onnx (or model.plan), "
                "e.g. mkdir -p %s/cnn/1 && python -m streamrt.testing.models small_cnn %s/cnn/1/model.onnx; "
                "serving with no models until one is loaded",
                self.repository_path, self.repository_path, self.repository_path, self.repository_path,
            )
        self._loading = asyncio.get_running_loop().create_task(self._load_startup())
        if wait_ready:
            await self._loading

    async def _open_listeners(self) -> None:
        """Hook: bind front ends before the core accepts work (the core alone has none)."""

    async def _close_listeners(self) -> None:
        """Hook: close the front ends after the models are unloaded."""

    def _describe_listeners(self) -> str:
        """Hook: the listeners for the start-up log line (``": http 8000, ..."``)."""
        return ""

    async def _load_startup(self) -> None:
        assert self.repository is not None
        results = await asyncio.gather(*(self.repository.load(n, reload=False) for n in self._startup),
                                       return_exceptions=True)
        for name, result in zip(self._startup, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("model '%s' is UNAVAILABLE: %s", name, result)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: refuse new work, finish in-flight requests, unload, close listeners."""
        if not self._open:
            return
        limit = self.config.exit_timeout_s if timeout is None else timeout
        self._accepting = False
        log.info("shutting down: waiting up to %.1f s for %d in-flight requests", limit, self._inflight)
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._idle is not None and self._inflight:
            try:
                await asyncio.wait_for(self._idle.wait(), limit)
            except asyncio.TimeoutError:
                log.warning("%d requests still in flight after %.1f s", self._inflight, limit)
        if self.repository is not None:
            self.repository.drain_timeout_s = min(self.repository.drain_timeout_s, max(limit, 0.1))
            await self.repository.close()
        await self._close_listeners()
        self.shared_memory.close()
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None
        self._open = False
        _release_gpu_memory()
        if self._cpus_before is not None:  # --engine-cpus: the process's threads back where they were
            pin_process(os.getpid(), self._cpus_before)
            self._cpus_before = None
        log.info("server stopped")

    # --- health -------------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.repository is not None

    @property
    def ready(self) -> bool:
        """Readiness: accepting work and (strict readiness) every start-up model READY."""
        if not self._accepting or self.repository is None:
            return False
        return self.repository.all_ready(self._startup) if self.config.strict_readiness else True

    @property
    def accepting(self) -> bool:
        return self._accepting

    def metadata(self) -> dict[str, Any]:
        # "triton", as Triton answers: clients check the name (NVIDIA's health-metadata examples do);
        # the version is StreamRT's own
        return {"name": "triton", "version": __version__, "extensions": EXTENSIONS}

    # --- model control ------------------------------------------------------------------------

    def check_model_control(self) -> None:
        """Raise :class:`UnsupportedRequestError` when load/unload is off (``--no-model-control``)."""
        if not self.config.model_control:
            raise UnsupportedRequestError("model load/unload is disabled on this server (--no-model-control)")

    async def load_model(self, name: str, config: str | Mapping[str, Any] | None = None,
                         files: Mapping[str, bytes] | None = None) -> None:
        """The repository API's load: ``config`` is the request's override (JSON text or an object).

        Raises:
            RequestError: files without a config (the request itself is incomplete).
            ModelLoadError: anything else that stops the load, as Triton says it (``failed to load
                '<model>', <why>``, INTERNAL): an unknown model, a config that is not JSON or is
                refused, an engine that does not build or load.
        """
        assert self.repository is not None
        try:
            override = json.loads(config) if isinstance(config, str) else config
        except ValueError as exc:
            raise ModelLoadError(f"failed to load '{name}', parameters.config is not valid JSON: {exc}") from None
        try:
            await self.repository.load(name, override, files)
        except RequestError:  # the request itself is incomplete (files without a config): 400
            raise
        except UnknownModelError as exc:
            raise ModelLoadError(f"failed to load '{name}', failed to poll from model repository: {exc.message}",
                                 hint=exc.hint) from None
        except StreamRTError as exc:
            said = exc.message if exc.message.startswith(f"failed to load '{name}'") else \
                f"failed to load '{name}', {exc.message}"
            raise ModelLoadError(said, hint=exc.hint) from None

    def check_auth(self, header: str | None) -> None:
        """Raise :class:`UnauthorizedError` unless ``header`` is ``Bearer <token>`` (when a token is set)."""
        check_bearer(self.config.auth_token, header)

    # --- inference ----------------------------------------------------------------------------

    @property
    def regions(self) -> SharedMemoryRegistry:
        """The clients' registered shared-memory regions (what request parsers look names up in)."""
        return self.shared_memory

    def request_buffer(self, nbytes: int) -> RequestBuffer:
        """Plain memory for a request body (uninitialised: ``bytearray(n)`` would zero it first)."""
        return RequestBuffer(np.empty(nbytes, np.uint8))

    async def answer(self, request: InferRequest, encode: Callable[[InferResponse], T],
                     buffer: RequestBuffer | None = None) -> T:
        """The listeners' :meth:`infer`: ``encode`` of the response (the port of one process)."""
        return encode(await self.infer(request))

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request through its model's scheduler; count success or failure by reason.

        Outputs the request asked for in shared memory are written there (and the request's
        shared-memory leases end) before this returns.
        """
        try:
            if not self._accepting or self.repository is None:
                raise ServerShuttingDownError("the server is shutting down and accepts no new requests")
            model = self.repository.get(request.model, request.version)
            context = REQUEST_CONTEXT.set(RequestContext(request.id, model.name, str(model.version)))
            try:
                return await self._infer_model(model, request)
            finally:
                REQUEST_CONTEXT.reset(context)
        finally:
            self.shared_memory.release(request.leases)

    async def _infer_model(self, model: Servable, request: InferRequest) -> InferResponse:
        assert self._idle is not None
        version = str(model.version)
        trace = self.tracer.start(model.name, version, request.id, request.received_ns,
                                  request.trace_parent) if self.tracer else None
        self._inflight += 1
        self._idle.clear()
        try:
            classified = [o.name for o in request.outputs if o.region is not None and o.class_count]
            if classified:  # top-k strings for a tensor's region: refused before any work, as before
                raise SharedMemoryError(f"output '{classified[0]}': classification results cannot be written to "
                                        "shared memory; nothing was written", hint="ask for this output inline")
            response = await model.infer(request, trace)
            placed = [(o.name, o.region) for o in request.outputs
                      if o.region is not None and o.name in response.outputs]
            if placed:
                written = self.shared_memory.write_outputs(
                    [(region, response.outputs[name], f"output '{name}'") for name, region in placed])
                response.in_shared_memory.update(
                    (name, RegionRef(region.name, region.offset, size))
                    for (name, region), size in zip(placed, written, strict=True))
        except BaseException as exc:
            reason = status_for(exc).reason
            model.stats.record_failure(reason, time.perf_counter_ns() - request.received_ns)
            if trace is not None:
                trace.error = f"{reason}: {exc}"
            if not isinstance(exc, (StreamRTError, asyncio.CancelledError)):
                log.exception("model '%s': unexpected error", request.model)
            else:
                log.log(logging.WARNING if reason == "BACKEND" else logging.DEBUG,
                        "request failed (%s): %s", reason, exc)
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
            if trace is not None and self.tracer is not None:
                self.tracer.finish(trace)
        elapsed_ns = time.perf_counter_ns() - request.received_ns
        model.stats.record_success(elapsed_ns)
        log.debug("request done in %.0f us", elapsed_ns / 1e3)
        return response

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """The statistics extension's response for one model (or all when ``name`` is empty)."""
        assert self.repository is not None
        models = [self.repository.get(name, version)] if name else self.repository.served()
        return {"model_stats": [m.stats.to_kserve(m.name, str(m.version)) for m in models]}


def _sharing(cfg: ServerConfig) -> dict[str, Any]:
    """The rate limiter and GPU memory ledger every model of this server shares."""
    limiter = RateLimiter(cfg.rate_limit_resources) if cfg.rate_limit == "execution_count" else None
    return {"rate_limiter": limiter, "memory_budget": MemoryBudget(cfg.gpu_memory_budget_mb)}


def _release_gpu_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
