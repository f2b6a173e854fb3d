"""``streamrt serve REPO``: serve a model repository over KServe v2 HTTP and gRPC, with metrics.

Binds to 127.0.0.1 unless ``--host`` says otherwise. SIGINT/SIGTERM start the graceful shutdown
(readiness false, in-flight requests finish within ``--exit-timeout``, models unloaded).
See ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from streamrt._optional import available, require
from streamrt.cli.args import ServerArgs
from streamrt.errors import ConfigError, StreamRTError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.observability.tracing import REQUEST_CONTEXT
from streamrt.serve.process import configure_serving_process

__all__ = ["JsonFormatter", "config_from_args", "parse_truth", "register", "run"]

T = TypeVar("T")


def parse_truth(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (Triton's ``--exit-on-error=false``)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model repository over KServe v2 / Triton HTTP and gRPC with dynamic batching",
        description="Serve every model of REPO (REPO/<model>/<version>/model.plan or model.onnx, optional "
        "REPO/<model>/config.yaml) with the KServe v2 / Triton inference protocol.",
    )
    parser.add_argument("repository", type=Path, metavar="REPO", help="model repository directory")
    ServerArgs().add_to(parser)
    exits = parser.add_argument(
        "--exit-on-error", type=parse_truth, nargs="?", const=True, default=True, metavar="BOOL",
        help="exit with status 2 when a start-up model fails to load (default true, as Triton's); "
        "--exit-on-error=false or --no-exit-on-error keeps serving the models that loaded")
    parser.add_argument("--no-exit-on-error", dest=exits.dest, action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                        help="auto: uvloop when it is installed (faster sockets and callbacks), else asyncio's")
    logs = parser.add_argument_group("logging")
    logs.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    logs.add_argument("--log-format", default="text", choices=["text", "json"],
                      help="json: one JSON object per line (time, level, logger, message; request_id, model, "
                      "version while a request is handled)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe."""
    return ServerArgs().config(args)


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line with time, level, logger and message, plus
    ``request_id``, ``model`` and ``version`` for lines written while a request is handled."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = REQUEST_CONTEXT.get()
        if context is not None:
            entry.update(request_id=context.request_id, model=context.model, version=context.version)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(level: str, fmt: str, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else getattr(logging, level))
    for noisy in ("aiohttp.access", "grpc", "onnxruntime"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if available("aiohttp"):
        from streamrt.serve.listeners.http import quiet_bad_requests

        quiet_bad_requests()  # a gRPC client at the HTTP port: one warning line, not a traceback


async def _serve(repository: Path, config: ServerConfig, exit_on_error: bool) -> int:
    """Serve until SIGINT/SIGTERM and return the signal; a start-up model that failed to load raises
    StreamRTError instead when ``exit_on_error`` (Triton's --exit-on-error)."""
    from streamrt.serve.server import InferenceServer

    server = InferenceServer(repository, config)
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[int] = loop.create_future()

    def on_signal(signum: int) -> None:
        if not stop.done():
            stop.set_result(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # non-POSIX event loops
            loop.add_signal_handler(sig, on_signal, int(sig))
    await server.start()
    log = logging.getLogger("streamrt.serve")
    try:
        if exit_on_error:
            loaded: asyncio.Future[list[str]] = asyncio.ensure_future(server.startup_failures())
            either: list[asyncio.Future[Any]] = [loaded, stop]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            failed = loaded.result() if loaded.done() and not stop.done() else []
            loaded.cancel()
            if failed:
                raise StreamRTError(
                    f"{len(failed)} of {len(server.startup_models)} start-up models failed to load "
                    f"({', '.join(failed)}; the log above says why): exiting (--exit-on-error)",
                    hint="fix the models, or serve the others with --exit-on-error=false")
        signum = await stop
        log.info("signal received: graceful shutdown")
        return signum
    finally:
        await server.stop()


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted: 0 after SIGTERM, 130 after SIGINT (Ctrl-C), 2 on a start-up error."""
    if not args.repository.is_dir():
        raise ConfigError(f"model repository {args.repository} is not a directory")
    config = config_from_args(args)
    _setup_logging(args.log_level, args.log_format, getattr(args, "verbose", False))
    configure_serving_process()
    try:
        signum = _run_loop(_serve(args.repository, config, getattr(args, "exit_on_error", True)),
                           loop_factory(getattr(args, "event_loop", "auto")))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise _port_in_use(exc, config) from None
    return 128 + signal.SIGINT if signum == signal.SIGINT else 0  # a shell's status for Ctrl-C: 130


def _run_loop(main: Coroutine[Any, Any, T], factory: Callable[[], asyncio.AbstractEventLoop] | None) -> T:
    if factory is None:
        return asyncio.run(main)
    loop = factory()
    try:
        asyncio.set_event_loop(loop)
        result = loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        return result
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event-loop factory for ``--event-loop`` (None: asyncio's default loop)."""
    if choice == "asyncio":
        return None
    if choice != "uvloop" and not available("uvloop"):
        return None
    uvloop = require("uvloop", extra="serve", purpose="--event-loop uvloop")
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _port_in_use(exc: OSError, config: ServerConfig) -> StreamRTError:
    """One line naming the busy port and the flag that moves it."""

    found = re.search(r"(\d+)\)?: address already in use", str(exc)) or re.search(r", (\d+)\)", str(exc))
    port = int(found.group(1)) if found else None
    flags = {config.http_port: "--http-port", config.grpc_port: "--grpc-port", config.metrics_port: "--metrics-port"}
    flag = flags.get(port, "--http-port")
    where = f"port {port}" if port is not None else "a port"
    return ConfigError(f"{where} on {config.host} is already in use (another server running?)",
                       hint=f"{flag} N with a free port, or {flag} 0 to pick any")
