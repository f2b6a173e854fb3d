"""The engine process's cost per request behind the front-end processes, measured alone.

With ``--frontend-processes N`` the HTTP/gRPC parsing runs in N workers and scales with cores;
what does not scale is the one engine process that receives every request over the tensor
channel, batches it and answers it. Its CPU per request bounds the server: a front end that
spends ``c`` microseconds of one core per request cannot pass ``1e6 / c`` requests/s, however many
workers parse for it.

This benchmark measures that cost without the workers' and clients' CPU in the way: the real
:class:`~streamrt.serve.listeners.frontends.supervisor.FrontendSupervisor` and :class:`~streamrt.serve.core.ServerCore`
run here, unchanged, and in each worker's place a load driver (this file, ``--driver``) sends
INFER messages through the real worker-side :class:`~streamrt.serve.listeners.frontends.worker.EngineLink`
(arena, channel, replies, FREE) at a fixed concurrency, with fresh random tensors written into the
arena for every request. The engine's event-loop thread and its whole process are timed with the
kernel's exact per-thread CPU clocks (``/proc/.../schedstat``) over the drivers' measured window.

Models: the null models of ``benchmarks/serving_frontend.py`` (ONNX Runtime CPU ReduceMean,
dynamic batching, max batch 64, 2 instances): ``small`` (64 B per request) and ``image``
(602 KB per item).

Usage (repository root)::

    python benchmarks/engine_request_path.py --cases small:1,image:1,image:8 --concurrency 64 \\
        --drivers 2 --seconds 5 [--src OTHER/src ...] [--out docs/benchmarks/x.md]

``--src`` runs every case again with another source tree (for example a worktree of an older
commit), alternating, so variants are compared in one run on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ITEM = {"small": (16,), "image": (3, 224, 224)}


# --- the driver (runs in each worker's place) -------------------------------------------------------


async def _drive(spec: dict[str, Any], load: dict[str, Any]) -> dict[str, Any]:
    from streamrt.serve.listeners.frontends.arena import Arena
    from streamrt.serve.listeners.frontends.channel import HELLO
    from streamrt.serve.listeners.frontends.worker import EngineLink
    from streamrt.serve.wire.protocol import InferRequest

    arena = Arena(spec["arena_fd"], spec["arena_bytes"])
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=spec["channel_fd"]))
    link = EngineLink(reader, writer, arena)
    reading = asyncio.get_running_loop().create_task(link.run())
    link.writer.send((HELLO, os.getpid()))
    item, batch = tuple(load["item"]), load["batch"]
    rng = np.random.default_rng(os.getpid())
    pool = [rng.standard_normal((batch, *item), dtype=np.float32) for _ in range(8)]
    window = {"start": 0.0, "stop": 0.0}
    done = [0, 0]  # in the window, errors
    latencies: list[float] = []
    warm_until = time.monotonic() + load["warmup"]
    stop_at = warm_until + load["seconds"]

    async def client(index: int) -> None:
        n = index
        while True:
            now = time.monotonic()
            if now >= stop_at:
                return
            x = pool[n % len(pool)]
            n += 1
            taken: list[int] = []
            block = arena.inputs.alloc(x.nbytes)  # the worker's parser writes the body here
            if block is not None:
                taken.append(block)
                view = arena.view(block, x.nbytes)
                view[:] = x.reshape(-1).view(np.uint8)
                x = view.view(np.float32).reshape(x.shape)
            request = InferRequest(load["model"], inputs={"x": x}, received_ns=time.perf_counter_ns())
            sent = time.perf_counter()
            try:
                response, blocks = await link.infer(request, taken)
                link.free_outputs(blocks)
                ok = response.outputs["y"].shape == (batch,)
            except Exception:
                ok = False
            if now >= warm_until:
                done[0 if ok else 1] += 1
                latencies.append(time.perf_counter() - sent)

    await asyncio.sleep(0.2)  # every driver connected (HELLO) before the load starts
    tasks = [asyncio.ensure_future(client(i)) for i in range(load["concurrency"])]
    await asyncio.sleep(max(0.0, warm_until - time.monotonic()))
    window["start"] = time.monotonic()
    await asyncio.gather(*tasks)
    window["stop"] = time.monotonic()
    result = {**window, "requests": done[0], "errors": done[1], "latencies_ms": [t * 1e3 for t in latencies]}
    report = Path(load["report"]).with_suffix(f".{spec['index']}.json")
    report.with_suffix(".part").write_text(json.dumps(result))
    report.with_suffix(".part").replace(report)
    await reading  # until the engine says STOP (exiting earlier would make the supervisor restart us)
    writer.close()
    return result


def driver_main() -> None:
    spec = pickle.loads(sys.stdin.buffer.read())
    load = json.loads(os.environ["STREAMRT_DRIVER_LOAD"])
    asyncio.run(_drive(spec, load))


# --- the engine process ------------------------------------------------------------------------------


def _thread_ns(tid: int) -> int:
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])


def _process_ns() -> int:
    total = 0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


class CpuClock:
    """Samples the event-loop thread's and the process's exact CPU time every 20 ms."""

    def __init__(self, loop_tid: int) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self._tid, self._stop = loop_tid, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append((time.monotonic(), _thread_ns(self._tid), _process_ns()))

    def over(self, start: float, stop: float) -> tuple[float, float]:
        """CPU seconds of (loop thread, process) between ``start`` and ``stop`` (nearest samples)."""
        self._stop.set()
        self._thread.join()
        inside = [s for s in self.samples if start <= s[0] <= stop]
        first, last = inside[0], inside[-1]
        scale = (stop - start) / max(last[0] - first[0], 1e-9)
        return (last[1] - first[1]) * scale / 1e9, (last[2] - first[2]) * scale / 1e9


async def _engine(case: dict[str, Any], drivers: int, report: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serving_frontend import write_repository
    from streamrt.serve.configs.config import ServerConfig
    from streamrt.serve.core import ServerCore
    from streamrt.serve.listeners.frontends.supervisor import FrontendSupervisor

    options = {"spinning": False} if case.get("spinning") == "off" else None
    repo = write_repository(report.parent / "repo", instances=case["instances"], backend_options=options)
    core = ServerCore(repo, ServerConfig(startup_models=(case["model"],), http_port=None, grpc_port=None))
    await core.start(wait_ready=True)
    supervisor = FrontendSupervisor(core, drivers, 1 << 30)
    supervisor.worker_command = (sys.executable, str(Path(__file__).resolve()), "--driver")
    clock = CpuClock(threading.get_native_id())
    try:
        await supervisor.start()
        files = [report.with_suffix(f".{i}.json") for i in range(drivers)]
        deadline = time.monotonic() + case["warmup"] + case["seconds"] + 120
        while not all(f.exists() for f in files):
            if time.monotonic() > deadline or supervisor.restarts:
                raise SystemExit("a load driver failed (see its output above)")
            await asyncio.sleep(0.05)
        results = [json.loads(f.read_text()) for f in files]
    finally:
        await supervisor.stop()
        stats = core.statistics(case["model"])["model_stats"][0]
        await core.stop()
    start, stop = max(r["start"] for r in results), min(r["stop"] for r in results)
    requests = sum(r["requests"] for r in results) * (stop - start) / np.mean([r["stop"] - r["start"] for r in results])
    loop_s, process_s = clock.over(start, stop)
    latencies = np.concatenate([r["latencies_ms"] for r in results])
    return {"p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "max_ms": float(latencies.max()), "requests_per_s": requests / (stop - start),
            "loop_us": loop_s / requests * 1e6,
            "process_us": process_s / requests * 1e6, "loop_busy": loop_s / (stop - start),
            "errors": sum(r["errors"] for r in results),
            "rows_per_batch": stats["inference_count"] / max(stats["execution_count"], 1)}


def _pythonpath(src: Path) -> str:
    """The case's PYTHONPATH: its source tree first, then the caller's own entries (where a GPU host's
    wheels were installed with ``--target``), less this tree's ``src`` when another tree is measured."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != (ROOT / "src").resolve()]
    return os.pathsep.join([str(src), *kept])


def engine_main(args: argparse.Namespace) -> None:
    kind, batch = args.case.split(":")
    work = Path(tempfile.mkdtemp(prefix="streamrt-engine-path-"))
    report = work / "driver"
    case = {"model": f"null_{kind}", "item": ITEM[kind], "batch": int(batch), "concurrency": args.concurrency,
            "seconds": args.seconds, "warmup": args.warmup, "report": str(report), "instances": args.instances,
            "spinning": args.spinning}
    os.environ["STREAMRT_DRIVER_LOAD"] = json.dumps(case)
    try:  # as `streamrt serve` of the source tree under test
        from streamrt.serve.process import configure_serving_process

        configure_serving_process()
    except ImportError:  # older trees: the switch interval only
        sys.setswitchinterval(0.0005)
    try:
        import uvloop

        result = uvloop.run(_engine(case, args.drivers, report))
    except ImportError:
        result = asyncio.run(_engine(case, args.drivers, report))
    print(json.dumps(result))


# --- the comparison ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="small:1,image:1,image:8", help="small|image:ROWS,...")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per driver")
    parser.add_argument("--drivers", type=int, default=2, help="driver processes (in the workers' places)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of every variant")
    parser.add_argument("--src", action="append", default=[], help="another source tree to compare (its src/)")
    parser.add_argument("--spinning", choices=("default", "off", "both"), default="default",
                        help="the null models' ONNX Runtime pool threads: its default (spinning), "
                             "--option spinning=false, or both in alternating rounds")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case in this process
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver_main()
        return 0
    if args.case:
        engine_main(args)
        return 0
    spins = ["default", "off"] if args.spinning == "both" else [args.spinning]
    variants = [(f"{label}{'' if spin == 'default' else ', spinning off'}", src, spin)
                for label, src in [("this tree", ROOT / "src"), *((str(Path(s)), Path(s).resolve()) for s in args.src)]
                for spin in spins]
    rows = []
    for case in args.cases.split(","):
        for round_ in range(args.rounds):
            for label, src, spin in variants:
                cmd = [sys.executable, __file__, "--case", case, "--concurrency", str(args.concurrency),
                       "--drivers", str(args.drivers), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                       "--instances", str(args.instances), "--spinning", spin]
                env = {**os.environ, "PYTHONPATH": _pythonpath(src), "OMP_NUM_THREADS": "1"}
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.seconds * 4 + 180)
                if out.returncode != 0:
                    raise SystemExit(f"{case} with {label} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append((case, label, round_ + 1, r))
                print(f"{case:8} {label:30} round {round_ + 1}: {r['requests_per_s']:9.0f} req/s  loop thread "
                      f"{r['loop_us']:6.1f} us/req ({r['loop_busy']:.0%} busy)  process {r['process_us']:7.1f} us/req  "
                      f"rows/batch {r['rows_per_batch']:5.1f}  p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} "
                      f"max {r['max_ms']:.1f} ms  "
                      f"errors {r['errors']}", flush=True)
    table = ["| request | source | round | requests/s | event-loop thread CPU us/req | loop thread busy | "
             "engine process CPU us/req | rows per batch | p50 ms | p99 ms | max ms | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case, label, round_, r in rows:
        kind, batch = case.split(":")
        table.append(f"| {kind} x{batch} | {label} | {round_} | {r['requests_per_s']:,.0f} | {r['loop_us']:.1f} | "
                     f"{r['loop_busy']:.0%} | {r['process_us']:.1f} | {r['rows_per_batch']:.1f} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['max_ms']:.1f} | {r['errors']} |")
    text = "\n".join(table)
    print(text)
    if args.out is not None:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/engine_request_path.py", *sys.argv[1:]], ROOT,
                               f"load average {os.getloadavg()[0]:.1f} at the end")
        args.out.write_text("\n".join([*header, "", text, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
