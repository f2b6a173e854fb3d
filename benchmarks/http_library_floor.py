"""What an HTTP server library costs per request before any StreamRT code runs: a fixed KServe reply.

Each variant serves ``POST /v2/models/null_small/infer`` by reading the body and answering one
fixed 64 B-model reply (header + 4 bytes), plus the metadata and statistics routes ``streamrt perf``
reads; the client is ``streamrt perf`` (the same as ``benchmarks/vs_triton.py``), one server at a
time, rounds alternating. Server CPU per request is the server process's (and its children's)
user + system time over the run, divided by the requests it counted.

Variants:

* ``aiohttp``: aiohttp's web server on uvloop, what ``streamrt serve`` uses;
* ``granian-embedded``: granian 2.x (Rust HTTP core, RSGI) inside the same uvloop event loop
  (``granian.server.embed``), the only way it could share the process with StreamRT's schedulers
  and gRPC server;
* ``granian-process``: granian as its own server (one worker process), for reference: StreamRT
  could use it only as a separate front-end process.

Usage (repository root)::

    python benchmarks/http_library_floor.py --rounds 3 --seconds 4 [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from library_floor import add_arguments

META = json.dumps({"name": "null_small", "versions": ["1"], "platform": "python",
                   "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}],
                   "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]}).encode()
HEADER = (b'{"model_name":"null_small","model_version":"1","outputs":[{"name":"y","datatype":"FP32",'
          b'"shape":[1,1],"parameters":{"binary_data_size":4}}]}')
REPLY = HEADER + b"\0\0\0\0"
REPLY_HEADERS = [("content-type", "application/octet-stream"), ("inference-header-content-length", str(len(HEADER)))]
_served = [0]


def _stats() -> bytes:
    return json.dumps({"model_stats": [{"name": "null_small", "version": "1", "inference_count": _served[0],
                                        "execution_count": _served[0],
                                        "inference_stats": {"success": {"count": _served[0], "ns": 0}}}]}).encode()


async def rsgi_app(scope: Any, proto: Any) -> None:
    """The fixed server as an RSGI application (granian)."""
    if scope.method == "POST":
        await proto()
        _served[0] += 1
        proto.response_bytes(200, REPLY_HEADERS, REPLY)
    elif scope.path.endswith("/stats"):
        proto.response_bytes(200, [("content-type", "application/json")], _stats())
    elif scope.path.startswith("/v2/health"):
        proto.response_empty(200, [])
    else:
        proto.response_bytes(200, [("content-type", "application/json")], META)


async def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        _served[0] += 1
        return web.Response(body=REPLY, headers=dict(REPLY_HEADERS))

    async def stats(request: web.Request) -> web.Response:
        return web.Response(body=_stats(), content_type="application/json")

    async def metadata(request: web.Request) -> web.Response:
        return web.Response(body=META, content_type="application/json")

    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_get("/v2/models/{model}/stats", stats)
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_get("/v2/health/ready", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def serve_granian_embedded(port: int) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    await Server(rsgi_app, address="127.0.0.1", port=port, interface=Interfaces.RSGI, log_enabled=False,
                 websockets=False).serve()


def start(variant: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    if variant == "granian-process":
        cmd = [sys.executable, "-m", "granian", "--interface", "rsgi", "--workers", "1", "--no-ws", "--host",
               "127.0.0.1", "--port", str(port), "--log-level", "warning", "http_library_floor:rsgi_app"]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", variant, "--port", str(port)]
    return subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="aiohttp,granian-embedded,granian-process")
    add_arguments(parser)
    args = parser.parse_args()
    if args.serve is not None:
        import uvloop

        uvloop.run(serve_aiohttp(args.port) if args.serve == "aiohttp" else serve_granian_embedded(args.port))
        return 0
    from library_floor import measure_rounds, report
    from serving_frontend import served, wait_ready

    rows = measure_rounds(args.variants.split(","), args, "http", "null_small", start,
                          lambda port, server: wait_ready(port, 60, server), lambda port: served(port, "null_small"))
    report(rows, "http_library_floor.py", args.out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
