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
from pathlib import Path

from streamrt.cli.args import ServerArgs
from streamrt.errors import ConfigError, StreamRTError
from streamrt.serve.config import ServerConfig

__all__ = ["JsonFormatter", "config_from_args", "register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model repository over KServe v2 / Triton HTTP and gRPC with dynamic batching",
        description="Serve every model of REPO (REPO/<model>/<version>/model.plan or model.onnx, optional "
        "REPO/<model>/config.yaml) with the KServe v2 / Triton inference protocol.",
    )
    parser.add_argument("repository", type=Path, metavar="REPO", help="model repository directory")
    ServerArgs().add_to(parser)
    logs = parser.add_argument_group("logging")
    logs.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    logs.add_argument("--log-format", default="text", choices=["text", "json"],
                      help="json: one JSON object per line (time, level, logger, message)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe."""
    return ServerArgs().config(args)


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


def run(args: argparse.Namespace) -> int:

    if not args.repository.is_dir():
        raise ConfigError(f"model repository {args.repository} is not a directory")
    config = config_from_args(args)
    _setup_logging(args.log_level, args.log_format, getattr(args, "verbose", False))
    try:
        asyncio.run(_serve(args.repository, config))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise _port_in_use(exc, config) from None
    return 0


def _port_in_use(exc: OSError, config: ServerConfig) -> StreamRTError:
    """One line naming the busy port and the flag that moves it."""

    found = re.search(r"(\d+)\)?: address already in use", str(exc)) or re.search(r", (\d+)\)", str(exc))
    port = int(found.group(1)) if found else None
    flags = {config.http_port: "--http-port", config.grpc_port: "--grpc-port", config.metrics_port: "--metrics-port"}
    flag = flags.get(port, "--http-port")
    where = f"port {port}" if port is not None else "a port"
    return ConfigError(f"{where} on {config.host} is already in use (another server running?)",
                       hint=f"{flag} N with a free port, or {flag} 0 to pick any")
