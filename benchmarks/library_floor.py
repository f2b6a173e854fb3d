"""The measuring loop shared by ``http_library_floor.py`` and ``grpc_library_floor.py``: each variant's
server started afresh per round, driven by ``streamrt perf``, its CPU per counted request, one table."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Row = tuple[str, int, float, float, int]
"""(variant, round, requests/s, server CPU us per request, errors)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The client and round flags, and the hidden ones a server child is started with."""
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # the child: one server
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)


def measure_rounds(variants: list[str], args: Any, protocol: str, model: str,
                   start: Callable[[str, int, Path], subprocess.Popen[bytes]],
                   ready: Callable[[int, subprocess.Popen[bytes]], None], served: Callable[[int], int]) -> list[Row]:
    """``args.rounds`` rounds of every variant, alternating: start it on a free port, wait until ``ready``,
    run ``streamrt perf`` (``args.concurrency``, ``args.processes``, ``args.seconds``), stop it."""
    from serving_frontend import cpu_seconds, free_port, run_perf
    from vs_triton import stop

    work = Path(tempfile.mkdtemp(prefix=f"streamrt-{protocol}-floor-"))
    rows: list[Row] = []
    for round_ in range(1, args.rounds + 1):
        for variant in variants:
            port = free_port()
            server = start(variant, port, work / f"{variant}-{round_}.log")
            try:
                ready(port, server)
                time.sleep(0.5)
                cpu0, count0 = cpu_seconds(server.pid), served(port)
                result = run_perf(protocol, port, model, 1, args.concurrency, args.processes, args.seconds, [])
                cpu, count = cpu_seconds(server.pid) - cpu0, served(port) - count0
            finally:
                stop(server)
            rows.append((variant, round_, result["throughput"], cpu / max(count, 1) * 1e6, result["errors"]))
            print(f"{variant:17} round {round_}: {rows[-1][2]:8.0f} req/s  server CPU {rows[-1][3]:5.0f} us/req  "
                  f"errors {rows[-1][4]}", flush=True)
    return sorted(rows)


def report(rows: list[Row], script: str, out: Path | None, notes: Sequence[str] = ()) -> None:
    """Print the table and ``notes`` (one line each: variants skipped and why); with ``out``, write them under the
    provenance header (date, commit, machine, command)."""
    table = ["| library | round | requests/s | server CPU us/req | errors |", "|---|---:|---:|---:|---:|"]
    table += [f"| {v} | {r} | {t:,.0f} | {c:.0f} | {e} |" for v, r, t, c, e in rows]
    if notes:
        table += ["", *(f"- {note}" for note in notes)]
    print("\n".join(table))
    if out is not None:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", f"benchmarks/{script}", *sys.argv[1:]], ROOT)
        out.write_text("\n".join([*header, "", *table, ""]))
