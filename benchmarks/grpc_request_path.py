"""The Python of one gRPC ``ModelInfer`` inside ``streamrt serve``, without sockets: CPU per request.

The gRPC ASGI application of ``--grpc-server h2corn`` (:class:`~streamrt.serve.listeners.grpc_h2corn.GrpcAsgi`
over the server's real handlers, core, scheduler and Python-backend instances) is called directly by
``--concurrency`` tasks on one uvloop, each sending a 64 B request of ``vs_triton.py``'s null model as one ASGI
body event and checking the reply's ``grpc-status``. No HTTP/2, no client: what is left is StreamRT's own
per-request Python, the part a front-end change moves.

Variants, side by side in one run (one server each):

* ``scheduled``: the request as served: queued for the dynamic batcher (500 us delay), run by an instance thread;
* ``inline``: the model's answer computed in the handler (``ScheduledModel._execute`` replaced), so the
  difference is what the scheduler and the instance hand-over cost the event loop.

Reports, per request: the event loop thread's CPU (``time.thread_time``) and the process's (instance threads
included), medians of ``--rounds``.

    python benchmarks/grpc_request_path.py [--requests 20000] [--concurrency 16] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

VARIANTS = ("scheduled", "inline")


def _inline(enabled: bool) -> Callable[[], None]:
    """Replace ``ScheduledModel._execute`` with the null model's answer when ``enabled``; returns the undo."""
    from streamrt.serve.models import scheduled

    original = scheduled.ScheduledModel._execute
    if not enabled:
        return lambda: None

    async def answer(self: Any, request: Any, rows: int, trace: Any, key: Any = None) -> dict[str, np.ndarray]:
        x = request.inputs["x"]
        return {"y": x.reshape(x.shape[0], -1).mean(axis=1, dtype=np.float32).reshape(-1, 1)}

    scheduled.ScheduledModel._execute = answer  # type: ignore[method-assign,assignment]

    def undo() -> None:
        scheduled.ScheduledModel._execute = original  # type: ignore[method-assign]

    return undo


async def _measure(repo: Path, requests: int, concurrency: int) -> tuple[float, float]:
    """(event-loop CPU us, process CPU us) per request over ``requests`` after a warm-up."""
    from streamrt.serve.configs.config import ServerConfig
    from streamrt.serve.listeners.grpc_h2corn import GrpcAsgi, frame
    from streamrt.serve.listeners.grpc_service import SERVICE, GrpcService
    from streamrt.serve.server import InferenceServer
    from streamrt.serve.wire.proto import messages

    server = InferenceServer(repo, ServerConfig(http_port=None, grpc_port=None, metrics_port=None,
                                                startup_models=["null_small"]))
    await server.start()
    if await server.startup_failures():
        raise RuntimeError("null_small did not load")
    service = GrpcService(server)
    app = GrpcAsgi(service.method_handlers(service.unary_handlers()), SERVICE, 2**31 - 1)
    message = messages.ModelInferRequest(model_name="null_small")
    message.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    message.raw_input_contents.append(np.random.default_rng().standard_normal(16, dtype=np.float32).tobytes())
    body = frame(message.SerializeToString())
    scope = {"type": "http", "path": f"/{SERVICE}/ModelInfer",
             "headers": [(b"content-type", b"application/grpc"), (b"te", b"trailers")]}

    async def caller(count: int) -> None:
        for _ in range(count):
            events = [{"type": "http.request", "body": body, "more_body": False}]
            sent: list[dict[str, Any]] = []

            async def receive(events: list[dict[str, Any]] = events) -> dict[str, Any]:
                return events.pop() if events else {"type": "http.disconnect"}

            async def send(event: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
                sent.append(event)

            await app(scope, receive, send)
            if sent[-1].get("headers", [None])[0] != (b"grpc-status", b"0"):
                raise RuntimeError(f"the request failed: {sent[-1]}")

    try:
        await asyncio.gather(*(caller(max(1, requests // 10 // concurrency)) for _ in range(concurrency)))
        per_task = max(1, requests // concurrency)
        loop0, process0 = time.thread_time(), time.process_time()
        await asyncio.gather(*(caller(per_task) for _ in range(concurrency)))
        done = per_task * concurrency
        return (time.thread_time() - loop0) / done * 1e6, (time.process_time() - process0) / done * 1e6
    finally:
        await server.stop()


def measure(variant: str, repo: Path, requests: int, concurrency: int) -> tuple[float, float]:
    import uvloop

    undo = _inline(variant == "inline")
    try:
        return uvloop.run(_measure(repo, requests, concurrency))
    finally:
        undo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if any(v not in VARIANTS for v in variants):
        parser.error(f"--variants: some of {', '.join(VARIANTS)}, got {args.variants!r}")
    from serving_frontend import write_repository

    repo = write_repository(Path(tempfile.mkdtemp(prefix="streamrt-grpc-path-")) / "repo")
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for round_ in range(1, args.rounds + 1):
        for variant in variants:  # alternating, so a slow minute of the machine hits both
            results[variant].append(measure(variant, repo, args.requests, args.concurrency))
            loop_us, process_us = results[variant][-1]
            print(f"{variant:10} round {round_}: event loop {loop_us:6.1f} us/request, process {process_us:6.1f}",
                  flush=True)
    table = ["| variant | event-loop CPU us/request (median) | process CPU us/request (median) | rounds |",
             "|---|---:|---:|---:|"]
    for variant, rows in results.items():
        table.append(f"| {variant} | {statistics.median(r[0] for r in rows):.1f} | "
                     f"{statistics.median(r[1] for r in rows):.1f} | {len(rows)} |")
    print("\n".join(table))
    if args.out is not None:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/grpc_request_path.py", *sys.argv[1:]], ROOT)
        args.out.write_text("\n".join([*header, "", *table, ""]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
