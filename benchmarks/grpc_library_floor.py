"""What a Python gRPC server costs per request before any StreamRT code runs: a fixed KServe ModelInfer reply.

The gRPC twin of ``http_library_floor.py`` (issue 26: "if the Python gRPC stacks cannot get there,
choose ... a different gRPC serving mode, measured side by side"). Each variant serves the KServe v2
``ModelInfer`` by answering one fixed reply for the 64 B null model (bytes in, bytes out: no
protobuf parsing on the server), plus ``ModelMetadata`` and ``ModelStatistics``, which
``streamrt perf`` calls; the client is ``streamrt perf -i grpc`` (the same as ``vs_triton.py``), one
server at a time, rounds alternating. Server CPU per request is the server process's user + system
time over the run divided by the requests it counted.

Variants:

* ``grpc-aio``: grpcio's asyncio server on uvloop, the mode ``streamrt serve`` uses;
* ``grpc-sync``: grpcio's thread-pool server (``grpc.server(ThreadPoolExecutor(N))``, ``--threads``):
  handlers run on pool threads, completions come from grpc core's own threads, no event loop;
* ``grpc-aio-await``: ``grpc-aio`` whose handler suspends on a future the loop itself completes on its
  next pass (what awaiting any scheduler costs, without threads);
* ``grpc-aio-thread``: ``grpc-aio`` whose handler hands the request to a worker thread and awaits the
  answer (``call_soon_threadsafe``), the shape of ``streamrt serve``'s hand-over to a model instance.

Variants whose HTTP/2 and gRPC framing are not done in Python (``grpc_asgi_floor.py`` says what each runs,
its thread settings, and why granian is not one), each its own server process with one worker, serving a
hand-written ASGI gRPC handler:

* ``h2corn``, ``h2corn-1t``: h2corn (Rust) with its default 2 runtime threads and with 1;
* ``pyvoy``, ``pyvoy-1t``: pyvoy (Envoy, C++) with Envoy's default worker threads (one per core) and 1;
* ``h2corn-connect``: h2corn serving connectrpc's ASGI application (its gRPC protocol, a raw bytes codec)
  instead of the hand-written handler.

They need packages StreamRT does not depend on (``pip install h2corn pyvoy connectrpc``); a variant
whose package is missing is reported as skipped, with the pip command. The default ``--variants`` are
the grpcio ones.

Usage (repository root)::

    python benchmarks/grpc_library_floor.py --rounds 3 --seconds 4 [--out docs/benchmarks/x.md]
    python benchmarks/grpc_library_floor.py --variants grpc-aio,h2corn,h2corn-1t,pyvoy,pyvoy-1t,h2corn-connect
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpc_asgi_floor import MODEL, SERVERS, environment, replies, stats_reply
from library_floor import add_arguments

ROOT = Path(__file__).resolve().parents[1]
_served = [0]


VARIANTS = ("grpc-aio", "grpc-sync", "grpc-aio-await", "grpc-aio-thread")


def _handlers(asynchronous: bool, wait: str = "") -> Any:
    """The generic handler of the three methods; raw bytes in and out (no (de)serializers). ``wait``
    (asynchronous only): ``loop``, the infer handler awaits a future the loop completes; ``thread``, a
    future a worker thread completes."""
    import asyncio
    import queue
    import threading

    import grpc

    from streamrt.serve.wire.proto import SERVICE

    infer_reply, meta_reply = replies()

    def infer(request: bytes, context: Any) -> bytes:
        _served[0] += 1
        return infer_reply

    def metadata(request: bytes, context: Any) -> bytes:
        return meta_reply

    def stats(request: bytes, context: Any) -> bytes:
        return stats_reply(_served[0])

    def as_async(fn: Any) -> Any:
        async def call(request: bytes, context: Any) -> bytes:
            return fn(request, context)  # type: ignore[no-any-return]

        return call

    jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[bytes], bytes]] = queue.SimpleQueue()

    def worker() -> None:  # a model instance's thread: answers and wakes the loop, one request at a time
        while True:
            loop, future, request = jobs.get()
            loop.call_soon_threadsafe(future.set_result, infer(request, None))

    if wait == "thread":
        threading.Thread(target=worker, name="floor-instance", daemon=True).start()

    async def infer_awaiting(request: bytes, context: Any) -> bytes:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if wait == "thread":
            jobs.put((loop, future, request))
        else:
            loop.call_soon(future.set_result, infer(request, context))
        return await future

    wrap = as_async if asynchronous else (lambda fn: fn)
    infer_handler = infer_awaiting if wait else wrap(infer)
    return grpc.method_handlers_generic_handler(SERVICE, {
        name: grpc.unary_unary_rpc_method_handler(fn)
        for name, fn in (("ModelInfer", infer_handler), ("ModelMetadata", wrap(metadata)),
                         ("ModelStatistics", wrap(stats)))})


async def serve_aio(port: int, wait: str = "") -> None:
    import grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(asynchronous=True, wait=wait),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def serve_sync(port: int, threads: int) -> None:
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    server.add_generic_rpc_handlers((_handlers(asynchronous=False),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def served(port: int) -> int:
    """Requests the server has answered so far (its ModelStatistics)."""
    import grpc

    from streamrt.serve.wire.proto import SERVICE, messages

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/ModelStatistics", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=messages.ModelStatisticsResponse.FromString)
        reply = call(messages.ModelStatisticsRequest(name=MODEL), timeout=10)
    return int(reply.model_stats[0].inference_stats.success.count)


def wait_listening(port: int, timeout: float, process: subprocess.Popen[bytes]) -> None:
    """Until the server answers ModelStatistics (or exits, or ``timeout`` passes: SystemExit)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            served(port)
            return
        except Exception:  # not up yet
            time.sleep(0.2)
    raise SystemExit(f"the server did not answer on port {port} in {timeout:.0f} s")


def start(variant: str, port: int, threads: int, log: Path) -> subprocess.Popen[bytes]:
    """The server of ``variant`` on ``port``: this script as a grpcio server, or an ASGI server's own command."""
    if variant in SERVERS:
        cmd, env = SERVERS[variant].command(port), environment()
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", variant, "--port", str(port),
               "--threads", str(threads)]
        env = None
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join([*VARIANTS, *SERVERS])} (default: the grpcio ones)")
    parser.add_argument("--threads", type=int, default=8, help="grpc-sync's handler threads (default 8)")
    add_arguments(parser)
    args = parser.parse_args()
    if args.serve is not None:
        if args.serve == "grpc-sync":
            serve_sync(args.port, args.threads)
        else:
            import uvloop

            uvloop.run(serve_aio(args.port, wait=args.serve.removeprefix("grpc-aio").removeprefix("-")))
        return 0
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS) - set(SERVERS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; known: {', '.join([*VARIANTS, *SERVERS])}")
    skipped = {name: why for name in variants if name in SERVERS and (why := SERVERS[name].missing())}
    for name, why in skipped.items():
        print(f"{name:17} skipped: {why}", flush=True)
    from library_floor import measure_rounds, report

    rows = measure_rounds([name for name in variants if name not in skipped], args, "grpc", MODEL,
                          lambda variant, port, log: start(variant, port, args.threads, log),
                          lambda port, server: wait_listening(port, 60, server), served)
    report(rows, "grpc_library_floor.py", args.out, [f"skipped {name}: {why}" for name, why in skipped.items()])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
