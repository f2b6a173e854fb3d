"""h2corn (a Rust HTTP/2 + HTTP/1.1 ASGI server) embedded in the server's own event loop: what the gRPC
listener (:mod:`.grpc_h2corn`) and the HTTP listener (:mod:`.http_h2corn`) share.

:func:`serve_asgi` starts an ``h2corn.Server`` for one ASGI application on one address as a task of the
running loop (so the application, the scheduler and the other listeners stay one loop), waits until it
listens, and turns a failure to bind into one :class:`~streamrt.errors.ConfigError`. h2corn's Tokio runtime
is process-global: every h2corn server of a process must ask for the same number of threads (both
listeners take ``--grpc-threads``).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

from streamrt.errors import ConfigError

__all__ = ["LARGE_FRAMES", "SMALL_MACHINE_CPUS", "default_threads", "lifespan", "serve_asgi"]

LARGE_FRAMES = {"h2_max_inbound_frame_size": 2**24 - 1,  # HTTP/2's largest DATA frame
                "h2_initial_stream_window_size": 2**31 - 1,  # and its largest flow-control windows
                "h2_initial_connection_window_size": 2**31 - 1}
"""HTTP/2 settings for large bodies: a 4.8 MB request arrives in a few ASGI events instead of 75 (64 KiB
frames), and 16 concurrent ones on a connection do not wait for window updates (8 MiB defaults)."""

SMALL_MACHINE_CPUS = 2
"""On this many CPUs or fewer, h2corn gets one Tokio thread instead of its default two."""


def default_threads() -> int:
    """h2corn's Tokio threads when ``--grpc-threads`` is not given: 1 on a process with at most
    :data:`SMALL_MACHINE_CPUS` CPUs, else 0 (h2corn's default, 2).

    On the 2-core CPU machine (2026-12-04, after the request path lost ~25% of its Python) one thread cost
    153-162 us of server CPU per 64 B gRPC request against 178-192 with two, and served 0.89-0.95x a real
    tritonserver's requests/s against 0.85-0.90x; with two threads the second competes with the event loop
    and the clients for the same cores (docs/benchmarks/2026-12-04-grpc-path-cpu.md). With more cores, two
    threads move large requests faster."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return 1 if cpus <= SMALL_MACHINE_CPUS else 0


async def lifespan(receive: Any, send: Any) -> None:
    """ASGI's lifespan protocol, answered at once (the server starts and stops the listeners itself)."""
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def serve_asgi(app: Any, host: str, port: int, *, what: str, port_flag: str, reuse_port: bool = False,
                     threads: int = 0, **options: Any) -> tuple[Callable[[], Awaitable[None]], int]:
    """Serve the ASGI ``app`` on ``host:port`` with h2corn in this event loop; (stop, the bound port).

    ``what`` names the listener in errors ("gRPC", "HTTP"), ``port_flag`` the option that picks its port;
    ``reuse_port``: front-end worker processes share the port (SO_REUSEPORT); ``threads``: Tokio threads
    (0: :func:`default_threads`); ``options``: more ``h2corn.Config`` fields (the protocols, limits)."""
    h2corn: Any = importlib.import_module("h2corn")  # optional, untyped here (its Config is built dynamically)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    threads = threads or default_threads()
    config = h2corn.Config(bind=(address,), access_log=False, lifespan="off", workers=1,
                           timeout_graceful_shutdown=1.0, reuse_port=reuse_port,
                           **({"runtime_threads": threads} if threads else {}), **options)
    server = h2corn.Server(app, config)
    serving = asyncio.create_task(server.serve(), name=f"streamrt-{what.lower()}-h2corn")
    started = asyncio.ensure_future(server.wait_started())
    await asyncio.wait({serving, started}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done() or started.exception() is not None:
        started.cancel()
        error = serving.exception() if serving.done() else started.exception()
        if "runtime_threads is process-global" in str(error):  # h2corn's Tokio runtime: one per process
            raise ConfigError(f"cannot start h2corn on {address}: {error}",
                              hint="give every h2corn server of one process the same --grpc-threads") from error
        raise ConfigError(f"cannot listen for {what} (h2corn) on {address}: {error}",
                          hint=f"{port_flag} N with a free port, or {port_flag} 0 to pick any") from error
    bound = int(server.addresses[0].rsplit(":", 1)[1])

    async def stop() -> None:
        server.shutdown()
        await asyncio.wait({serving}, timeout=5.0)

    return stop, bound
