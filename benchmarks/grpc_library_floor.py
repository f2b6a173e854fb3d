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

Usage (repository root)::

    python benchmarks/grpc_library_floor.py --rounds 3 --seconds 4 [--out docs/benchmarks/x.md]
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

from library_floor import add_arguments

ROOT = Path(__file__).resolve().parents[1]
MODEL = "null_small"
_served = [0]


def _replies() -> tuple[bytes, bytes]:
    """The fixed ModelInfer and ModelMetadata replies (KServe v2 protobuf, StreamRT's own descriptors)."""
    from streamrt.serve.wire.proto import messages

    infer = messages.ModelInferResponse(model_name=MODEL, model_version="1")
    infer.outputs.add(name="y", datatype="FP32", shape=[1, 1])
    infer.raw_output_contents.append(b"\0\0\0\0")
    meta = messages.ModelMetadataResponse(name=MODEL, versions=["1"], platform="python")
    meta.inputs.add(name="x", datatype="FP32", shape=[-1, 16])
    meta.outputs.add(name="y", datatype="FP32", shape=[-1, 1])
    return infer.SerializeToString(), meta.SerializeToString()


def _stats() -> bytes:
    from streamrt.serve.wire.proto import messages

    reply = messages.ModelStatisticsResponse()
    model = reply.model_stats.add(name=MODEL, version="1", inference_count=_served[0], execution_count=_served[0])
    model.inference_stats.success.count = _served[0]
    return reply.SerializeToString()  # type: ignore[no-any-return]


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

    infer_reply, meta_reply = _replies()

    def infer(request: bytes, context: Any) -> bytes:
        _served[0] += 1
        return infer_reply

    def metadata(request: bytes, context: Any) -> bytes:
        return meta_reply

    def stats(request: bytes, context: Any) -> bytes:
        return _stats()

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
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", variant, "--port", str(port),
           "--threads", str(threads)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
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
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    from library_floor import measure_rounds, report

    rows = measure_rounds(args.variants.split(","), args, "grpc", MODEL,
                          lambda variant, port, log: start(variant, port, args.threads, log),
                          lambda port, server: wait_listening(port, 60, server), served)
    report(rows, "grpc_library_floor.py", args.out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
