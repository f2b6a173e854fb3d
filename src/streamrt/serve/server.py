"""The inference server: the server core behind HTTP, gRPC and metrics listeners on one event loop.

This is the one module that starts the front ends. :class:`InferenceServer` is a
:class:`~streamrt.serve.core.ServerCore` (model lifecycle, health, inference, statistics, auth)
that binds the listeners the config asks for before it accepts work and closes them last on
shutdown. The listeners (:mod:`~streamrt.serve.listeners.http`, :mod:`~streamrt.serve.listeners.grpc_service`,
:mod:`~streamrt.serve.listeners.metrics`) import the core, never the reverse, and are imported here only
when their port is set, so a core without listeners needs neither aiohttp nor grpcio.

Example:
    >>> with ServerThread("models", ServerConfig(http_port=0, grpc_port=0)) as server:   # doctest: +SKIP
    ...     print(server.http_port)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.core import EXTENSIONS, ServerCore
from streamrt.serve.models.model import EngineLoader
from streamrt.serve.port import close_each, port_in_use  # port_in_use: re-exported (it was defined here)

if TYPE_CHECKING:
    from streamrt.serve.listeners.frontends.supervisor import FrontendSupervisor

__all__ = ["EXTENSIONS", "InferenceServer", "ServerThread", "port_in_use"]

log = logging.getLogger(__name__)


class InferenceServer(ServerCore):
    """Serves a model repository over KServe v2 HTTP and gRPC, with Prometheus metrics.

    Args:
        repository: the model repository directory.
        config: listeners, limits, auth, shutdown timeout.
        engine_loader: replaces how model versions load their engine (tests, custom engines).

    Attributes:
        http_port, grpc_port, metrics_port: the bound ports (None for a listener not started).
    """

    def __init__(
        self, repository: str | Path, config: ServerConfig | None = None, *, engine_loader: EngineLoader | None = None
    ) -> None:
        super().__init__(repository, config, engine_loader=engine_loader)
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.frontends: FrontendSupervisor | None = None

    async def _open_listeners(self) -> None:
        try:
            await self._bind_listeners()
        except BaseException:  # a port in use: the listeners already bound are closed, not leaked
            await self._close_listeners()
            raise

    async def _bind_listeners(self) -> None:
        cfg = self.config
        if cfg.frontend_processes > 1 and (cfg.http_port is not None or cfg.grpc_port is not None):
            from streamrt.serve.listeners.frontends.supervisor import FrontendSupervisor

            self.frontends = FrontendSupervisor(self, cfg.frontend_processes, cfg.frontend_arena_bytes)
            await self.frontends.start()
            self.http_port, self.grpc_port = self.frontends.http_port, self.frontends.grpc_port
            self._closers.append(self.frontends.stop)
        elif cfg.http_port is not None and cfg.http_server == "h2corn":
            from streamrt.serve.listeners.http_h2corn import start_http_h2corn

            stop_http, self.http_port = await start_http_h2corn(self, cfg.host, cfg.http_port, server=self,
                                                                threads=cfg.grpc_threads)
            self._closers.append(stop_http)
        elif cfg.http_port is not None:
            from streamrt.serve.listeners.http import start_http

            runner, self.http_port = await start_http(self, cfg.host, cfg.http_port)
            self._closers.append(runner.cleanup)
        if cfg.grpc_port is not None and self.frontends is None:
            from streamrt.serve.listeners.grpc_service import start_grpc

            stop_grpc, self.grpc_port = await start_grpc(self, cfg.host, cfg.grpc_port)  # busy: one ConfigError
            self._closers.append(stop_grpc)
        if cfg.metrics_port is not None:
            from streamrt.serve.listeners.metrics import start_metrics

            runner, self.metrics_port = await start_metrics(self, cfg.host, cfg.metrics_port)
            self._closers.append(runner.cleanup)

    @property
    def startup_models(self) -> list[str]:
        """The models loaded at start-up (``--model`` or every model of the repository)."""
        return list(self._startup)

    async def startup_failures(self) -> list[str]:
        """Wait until the start-up models finished loading; the names of those that are not READY."""
        if self._loading is not None:
            await asyncio.shield(self._loading)
        return self._not_ready()

    def _not_ready(self) -> list[str]:
        repository = self.repository
        return [n for n in self._startup if repository is None or not repository.is_ready(n)]

    async def _load_startup(self) -> None:
        await super()._load_startup()
        failed = self._not_ready()
        if failed and len(failed) == len(self._startup):
            # Each failure was logged as it happened; this last line says what the server is now.
            log.error("no model loaded: all %d start-up models failed (%s); the server is not ready and "
                      "serves nothing until a model loads", len(failed), ", ".join(failed))
        elif failed:
            log.warning("%d of %d start-up models failed to load (%s); serving the others", len(failed),
                        len(self._startup), ", ".join(failed))

    def _describe_listeners(self) -> str:
        processes = f" ({self.config.frontend_processes} front-end processes)" if self.frontends else ""
        return (f": http {self.http_port}, grpc {self.grpc_port}, metrics {self.metrics_port} on {self.config.host}"
                f"{processes}")

    async def _close_listeners(self) -> None:

        await close_each(self._closers, "a listener")


class ServerThread:
    """Run an :class:`InferenceServer` on its own event loop in a background thread.

    For tests, benchmarks and embedding: ``with ServerThread(repo, cfg) as server:`` starts it,
    waits until the start-up models finished loading, and stops it gracefully on exit.
    """

    def __init__(self, repository: str | Path, config: ServerConfig | None = None, *,
                 start_timeout: float = 300.0, engine_loader: EngineLoader | None = None) -> None:
        self.server = InferenceServer(repository, config, engine_loader=engine_loader)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamrt-server", daemon=True)
        self._start_timeout = start_timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)

    def call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> ServerThread:
        self._thread.start()
        self.call(self.server.start(wait_ready=True), timeout=self._start_timeout)
        return self

    def stop(self, timeout: float | None = None) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.call(self.server.stop(timeout), timeout=(timeout or self.server.config.exit_timeout_s) + 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
