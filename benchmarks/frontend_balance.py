"""How a load's gRPC connections spread over front-end processes that share one port, and what it costs.

``streamrt serve --frontend-processes N`` starts N workers that listen on the same port with
``SO_REUSEPORT``: the kernel picks a worker per *connection* (a hash of its addresses), never per request.
A client that opens few connections (``streamrt perf --processes P`` used to open one per process) lands on
few workers, several on one, and leaves others idle. This script serves ``serving_frontend.py``'s null
models with N front ends and runs ``streamrt perf`` with each ``--grpc-channel-share`` (0: one connection
per client process; 6: tritonclient's C++ rule, a connection per 6 concurrent requests), in alternating
rounds, and reports for each run:

- the connections each front-end process holds while the load runs (read from ``/proc``: the sockets of
  each worker whose local port is the gRPC port), as counts sorted from the busiest;
- requests/s, images/s and p50 / p99 latency from ``streamrt perf``.

Usage (from the repository root)::

    python benchmarks/frontend_balance.py --frontend-processes 8 --processes 8 --concurrency 8 \
        --shares 0,6 --rounds 3 --case image:8 [--out docs/benchmarks/x.md]
    python benchmarks/frontend_balance.py --quick    # the CPU smoke run (CI): 2 front ends, seconds
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from serving_frontend import ITEM, run_perf, wait_ready, write_repository
from streamrt.profiling.provenance import report_header
from streamrt.testing import server_process
from streamrt.testing.server_process import free_port

ROOT = Path(__file__).resolve().parents[1]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with os.scandir(f"/proc/{pid}/fd") as entries:
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


ESTABLISHED, LISTEN = "01", "0A"
"""TCP states as /proc/net/tcp writes them."""


def _port_sockets(port: int, state: str) -> set[str]:
    """The socket inodes on local ``port`` in ``state`` (/proc/net/tcp and tcp6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def connections_per_process(pids: list[int], port: int) -> list[int]:
    """Established TCP connections each of ``pids`` holds on local ``port``, sorted from the most."""
    established = _port_sockets(port, ESTABLISHED)
    counts = []
    for pid in pids:
        try:
            counts.append(len(_socket_inodes(pid) & established))
        except OSError:  # the worker is gone
            counts.append(0)
    return sorted(counts, reverse=True)


class Sampler(threading.Thread):
    """Samples the spread every 0.2 s while a run lasts; keeps the sample with the most connections."""

    def __init__(self, pids: list[int], port: int) -> None:
        super().__init__(daemon=True)
        self.pids, self.port = pids, port
        self.best: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            counts = connections_per_process(self.pids, self.port)
            if sum(counts) >= sum(self.best):
                self.best = counts


def start_server(repo: Path, frontends: int, log: Path) -> tuple[subprocess.Popen[bytes], int, list[int]]:
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http),
           "--grpc-port", str(grpc), "--metrics-port", "-1", "--grpc-server", "h2corn",
           "--frontend-processes", str(frontends)]
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    wait_ready(http, 180, process)
    deadline = time.monotonic() + 60
    while True:  # the workers: the server's children that hold the gRPC port
        workers = [pid for pid in server_process.child_pids(process.pid) if _holds_listener(pid, grpc)]
        if len(workers) >= frontends or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if len(workers) < frontends:
        raise SystemExit(f"found {len(workers)} of {frontends} front-end workers on port {grpc}")
    return process, grpc, workers


def _holds_listener(pid: int, port: int) -> bool:
    try:
        return bool(_socket_inodes(pid) & _port_sockets(port, LISTEN))
    except OSError:
        return False


def one_run(port: int, workers: list[int], args: argparse.Namespace, share: int) -> dict[str, Any]:
    kind, batch = args.case.split(":")
    sampler = Sampler(workers, port)
    sampler.start()
    try:
        result = run_perf("grpc", port, f"null_{kind}", int(batch), args.concurrency, args.processes, args.seconds,
                          ["--grpc-channel-share", str(share)])
    finally:
        sampler.stop.set()
        sampler.join()
    lat = result.get("latency_ms") or {}
    return {"share": share, "spread": sampler.best, "throughput": float(result["throughput"]),
            "requests": float(result["throughput"]) / int(batch), "p50": lat.get("median", float("nan")),
            "p99": lat.get("p99", float("nan")), "errors": result["errors"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--frontend-processes", type=int, default=8)
    parser.add_argument("--processes", type=int, default=8, help="client processes (streamrt perf --processes)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--shares", default="0,6", help="comma list of --grpc-channel-share values")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of every share")
    parser.add_argument("--case", default="image:8", help=f"MODEL:BATCH, MODEL one of {sorted(ITEM)}")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true", help="the CPU smoke run: 2 front ends, 1 round, short")
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    args = parser.parse_args(argv)
    if args.quick:
        args.frontend_processes, args.processes, args.concurrency, args.rounds = 2, 2, 4, 1
        args.seconds, args.case = 1.0, "small:1"
    model, _, batch = args.case.partition(":")
    if model not in ITEM or not batch.isdigit() or int(batch) < 1:
        parser.error(f"--case {args.case!r}: expected MODEL:BATCH, MODEL one of {sorted(ITEM)}, BATCH >= 1")
    shares = [int(s) for s in args.shares.split(",")]
    lines = [
        "# gRPC connections over front-end processes sharing one port (SO_REUSEPORT)", "",
        *report_header(["python", "benchmarks/frontend_balance.py", *(argv if argv is not None else sys.argv[1:])],
                       ROOT),
        f"- server: `streamrt serve --grpc-server h2corn --frontend-processes {args.frontend_processes}`, "
        f"null_{args.case.split(':')[0]} (ONNX Runtime CPU, 2 instances, dynamic batching)",
        f"- client: `streamrt perf --processes {args.processes} --concurrency-range {args.concurrency} "
        f"-b {args.case.split(':')[1]}`, {args.seconds:g} s windows, `--grpc-channel-share` as in each row",
        "- spread: the connections each front-end process held during the run, from the busiest", "",
        "| round | --grpc-channel-share | connections | spread | images/s | requests/s | p50 / p99 ms | errors |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="frontend-balance-") as tmp:
        repo = write_repository(Path(tmp) / "repo")
        process, port, workers = start_server(repo, args.frontend_processes, Path(tmp) / "server.log")
        try:
            for round_ in range(1, args.rounds + 1):
                for share in shares:
                    r = one_run(port, workers, args, share)
                    row = (f"| {round_} | {share} | {sum(r['spread'])} | {' '.join(map(str, r['spread']))} | "
                           f"{r['throughput']:,.0f} | {r['requests']:,.0f} | {r['p50']:.1f} / {r['p99']:.1f} | "
                           f"{r['errors']} |")
                    lines.append(row)
                    print(row, flush=True)
        finally:
            server_process.stop(process)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
