"""``streamrt serve REPO``: serve a model repository over KServe v2 HTTP and gRPC, with metrics.

Binds to 127.0.0.1 unless ``--host`` says otherwise. SIGINT/SIGTERM start the graceful shutdown
(readiness false, in-flight requests finish within ``--exit-timeout``, models unloaded).
See ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from streamrt.serve.config import ServerConfig

__all__ = ["JsonFormatter", "config_from_args", "register", "run"]


def _port(text: str) -> int | None:
    value = int(text)
    return None if value < 0 else value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = ServerConfig()
    parser = subparsers.add_parser(
        "serve",
        help="serve a model repository over KServe v2 / Triton HTTP and gRPC with dynamic batching",
        description="Serve every model of REPO (REPO/<model>/<version>/model.plan or model.onnx, optional "
        "REPO/<model>/config.yaml) with the KServe v2 / Triton inference protocol.",
    )
    parser.add_argument("repository", type=Path, metavar="REPO", help="model repository directory")
    net = parser.add_argument_group("listeners")
    net.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}: this machine only)")
    net.add_argument("--http-port", type=_port, default=d.http_port, help="HTTP port (default 8000; -1: off)")
    net.add_argument("--grpc-port", type=_port, default=d.grpc_port, help="gRPC port (default 8001; -1: off)")
    net.add_argument("--metrics-port", type=_port, default=d.metrics_port,
                     help="Prometheus /metrics port (default 8002; -1: off)")
    models = parser.add_argument_group("models")
    models.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="load only these models at start (repeatable; default: all)")
    models.add_argument("--no-model-control", action="store_true", help="refuse load/unload requests")
    models.add_argument("--no-strict-readiness", action="store_true",
                        help="ready as soon as the server is up, even while models load or failed")
    models.add_argument("--load-threads", type=int, default=d.load_threads, help="models loaded in parallel")
    limits = parser.add_argument_group("limits and security")
    limits.add_argument("--auth-token", default=None,
                        help="require 'Authorization: Bearer TOKEN' (default: $STREAMRT_SERVE_TOKEN when set)")
    limits.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes,
                        help=f"largest request body / gRPC message (default {d.max_request_bytes})")
    limits.add_argument("--grpc-max-message-mb", type=float, default=d.grpc_max_message_bytes / 2**20, metavar="MB",
                        help=f"largest gRPC message in MiB (default {d.grpc_max_message_bytes // 2**20}; "
                        "gRPC answers RESOURCE_EXHAUSTED above it)")
    limits.add_argument("--max-tensor-elements", type=int, default=d.max_tensor_elements,
                        help=f"largest element count of one input (default {d.max_tensor_elements})")
    limits.add_argument("--exit-timeout", type=float, default=d.exit_timeout_s, metavar="S",
                        help="shutdown waits this long for in-flight requests (default 30)")
    net.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                     help="auto: uvloop when it is installed (faster sockets and callbacks), else asyncio's")
    logs = parser.add_argument_group("logging")
    logs.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    logs.add_argument("--log-format", default="text", choices=["text", "json"],
                      help="json: one JSON object per line (time, level, logger, message)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe."""
    return ServerConfig(
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        auth_token=args.auth_token or os.environ.get("STREAMRT_SERVE_TOKEN") or None,
        max_request_bytes=args.max_request_bytes,
        grpc_max_message_bytes=int(args.grpc_max_message_mb * 2**20),
        max_tensor_elements=args.max_tensor_elements,
        exit_timeout_s=args.exit_timeout,
        strict_readiness=not args.no_strict_readiness,
        model_control=not args.no_model_control,
        startup_models=tuple(args.model) if args.model else None,
        load_threads=args.load_threads,
    )


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line with time, level, logger and message."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
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


async def _serve(repository: Path, config: ServerConfig) -> None:
    from streamrt.serve.server import InferenceServer

    server = InferenceServer(repository, config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # non-POSIX event loops
            loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        await stop.wait()
    finally:
        logging.getLogger("streamrt.serve").info("signal received: graceful shutdown")
        await server.stop()


SWITCH_INTERVAL_S = 0.0005
"""GIL switch interval of a ``streamrt serve`` process (Python's default: 5 ms).

The event loop thread parses request bodies in Python while instance threads need the GIL for the
few steps of each batch; at 5 ms a waiting instance thread lost up to 5 ms per step (HTTP 4.8 MB
requests: batch gather 47 ms -> 1.1 ms, gRPC p99 419 -> 192 ms on the 2-core CI machine, see
docs/benchmarks/serving-frontend-cpu.md)."""


def run(args: argparse.Namespace) -> int:
    from streamrt.errors import ConfigError

    if not args.repository.is_dir():
        raise ConfigError(f"model repository {args.repository} is not a directory")
    config = config_from_args(args)
    _setup_logging(args.log_level, args.log_format, getattr(args, "verbose", False))
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    factory = loop_factory(getattr(args, "event_loop", "auto"))
    if factory is None:
        asyncio.run(_serve(args.repository, config))
        return 0
    loop = factory()
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(_serve(args.repository, config))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return 0


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event-loop factory for ``--event-loop`` (None: asyncio's default loop)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            from streamrt.errors import MissingDependencyError

            raise MissingDependencyError("uvloop", "serve", purpose="--event-loop uvloop") from None
        return None
    return uvloop.new_event_loop
