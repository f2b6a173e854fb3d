"""A serving process's malloc thresholds against glibc's defaults: the same server, the same clients, side by side.

Issue 26: binary 4.8 MB gRPC requests through ``--grpc-server h2corn`` spent most of their latency outside the
server's own timing (on an H100 host: p50 15.5 ms at concurrency 1, 2.4 ms of it in the server). Part of it was
glibc giving freed memory back to the kernel after every request, so that each request's body touched fresh
pages. ``streamrt.serve.process.keep_freed_memory`` sets the mmap and trim thresholds of every serving process;
``STREAMRT_MALLOC_TUNING=0`` leaves glibc's defaults (its dynamic mmap threshold included), which is how the
``glibc defaults`` variant here runs.

Each round starts a real ``streamrt serve`` per variant (``benchmarks/serving_frontend.py``'s null models,
ONNX Runtime CPU, 2 instances, max batch 64, 500 us delay) and runs ``streamrt perf`` for every case; rounds
interleave the variants. The table gives each case's median over the rounds, the serving variant's ratio to the
defaults, the server's CPU per request and its resident memory after the run.

Usage (from the repository root)::

    python benchmarks/malloc_thresholds.py [--cases grpc:image:8@1,grpc:image:8@4,grpc:small:1@16] \\
        [--rounds 3] [--seconds 3] [--server-args "--grpc-server h2corn"] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving_frontend import cpu_seconds, run_perf, served, wait_ready, write_repository  # noqa: E402
from streamrt.testing.server_process import child_pids, free_port, stop  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "glibc defaults": {"STREAMRT_MALLOC_TUNING": "0"},
    "serving (mallopt)": {},
}
"""Variant name -> environment of the server process (on top of this one's, less any malloc setting)."""


def parse_case(text: str) -> tuple[str, str, int, int]:
    """``PROTOCOL:small|image:BATCH@CONCURRENCY``."""
    head, _, concurrency = text.partition("@")
    protocol, kind, batch = head.split(":")
    return protocol, kind, int(batch), int(concurrency or 1)


def resident_mib(pid: int) -> float:
    """The process's and its children's resident memory (Linux /proc)."""
    total = 0
    for each in [pid, *child_pids(pid)]:
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def measure(variant: str, cases: list[tuple[str, str, int, int]], args: argparse.Namespace,
            work: Path) -> list[dict[str, float]]:
    """One server of ``variant``; every case once."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("GLIBC_TUNABLES", "LD_PRELOAD") and not k.startswith("MALLOC_")}
    repo = write_repository(work / "repo", instances=2) if not (work / "repo").exists() else work / "repo"
    http, grpc = free_port(), free_port()
    with (work / f"server-{variant.split()[0]}.log").open("ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", "-1", "--log-level", "WARNING",
             *shlex.split(args.server_args)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**base, "OMP_NUM_THREADS": "1", **VARIANTS[variant]})
    rows = []
    try:
        wait_ready(http, 300, server)
        for protocol, kind, batch, concurrency in cases:
            cpu0, count0 = cpu_seconds(server.pid), served(http, f"null_{kind}")
            result = run_perf(protocol, http if protocol == "http" else grpc, f"null_{kind}", batch, concurrency,
                              1, args.seconds, [])
            count = served(http, f"null_{kind}") - count0
            latency = result["latency_ms"] or {}
            rows.append({"items/s": float(result["throughput"]), "p50": float(latency.get("median", "nan")),
                         "p99": float(latency.get("p99", "nan")), "errors": float(result["errors"]),
                         "cpu_us": (cpu_seconds(server.pid) - cpu0) / max(count, 1) * 1e6,
                         "rss": resident_mib(server.pid)})
            print(f"  {variant:18} {protocol}:{kind}:{batch}@{concurrency}: {rows[-1]['items/s']:9.1f} items/s, "
                  f"p50 {rows[-1]['p50']:.2f} ms, p99 {rows[-1]['p99']:.2f} ms, "
                  f"{rows[-1]['cpu_us']:.0f} us CPU/request, {rows[-1]['rss']:.0f} MiB", flush=True)
    finally:
        stop(server)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="grpc:image:8@1,grpc:image:8@4,http:image:8@1,grpc:small:1@16",
                        help="PROTOCOL:small|image:BATCH@CONCURRENCY,...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--server-args", default="--grpc-server h2corn", help="extra `streamrt serve` arguments")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args()
    cases = [parse_case(c) for c in args.cases.split(",")]
    work = Path(tempfile.mkdtemp(prefix="streamrt-malloc-"))
    runs: dict[str, list[list[dict[str, float]]]] = {v: [] for v in VARIANTS}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", flush=True)
        for variant in VARIANTS:
            runs[variant].append(measure(variant, cases, args, work))
    base, tuned = VARIANTS
    table = ["| case | variant | items/s (median) | x defaults | p50 ms | p99 ms | server CPU us/request | "
             "resident MiB | errors |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for index, (protocol, kind, batch, concurrency) in enumerate(cases):
        median = {v: {key: statistics.median(run[index][key] for run in runs[v]) for key in runs[v][0][index]}
                  for v in VARIANTS}
        for variant in VARIANTS:
            m = median[variant]
            ratio = f"{m['items/s'] / median[base]['items/s']:.2f}x" if variant == tuned else ""
            table.append(f"| {protocol} null_{kind} x{batch}, concurrency {concurrency} | {variant} | "
                         f"{m['items/s']:,.0f} | {ratio} | {m['p50']:.2f} | {m['p99']:.2f} | {m['cpu_us']:,.0f} | "
                         f"{m['rss']:.0f} | {m['errors']:.0f} |")
    text = "\n".join(table)
    print(text)
    if args.out:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/malloc_thresholds.py", *sys.argv[1:]], ROOT)
        args.out.write_text("\n".join([*header, f"- rounds: {args.rounds} (variants interleaved), "
                                                f"{args.seconds:g} s windows; medians over the rounds", "", text, ""]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
