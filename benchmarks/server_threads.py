"""Where ``streamrt serve`` spends its CPU per request, thread by thread, over HTTP and gRPC.

Serves ``vs_triton.py``'s repository (``null_small``: a Python-backend model, dynamic batching with a
500 us delay, 2 instances), drives it with ``streamrt perf`` (concurrency 16, 2 client processes) once
per protocol (or NVIDIA's perf_analyzer with ``--client perf_analyzer``), and reads every thread's user +
system time from ``/proc/PID/task/*/stat`` before and after the run, divided by the requests the server
counted. The event-loop thread (the process's first) is named; other threads by their kernel name and id
(Python threads all read ``python``).

Each thread's share of the run's wall time is given twice, from ``/proc/PID/task/*/schedstat``: *on a CPU*
(running) and *waiting for a CPU* (runnable, but both cores taken). A thread whose two shares add up to
near 100% is the serial bound of the server: the event loop's, for a one-process server, since all of its
Python runs there under one GIL.

Usage (repository root)::

    python benchmarks/server_threads.py --protocols grpc,http --seconds 5 [--client perf_analyzer] \
        [--server-args "--grpc-server h2corn --http-server h2corn"] [--out docs/benchmarks/x.txt]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """Thread id -> (kernel name, CPU seconds) of every live thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        out[task.name] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def thread_schedule(pid: int) -> dict[str, tuple[int, int]]:
    """Thread id -> (ns on a CPU, ns runnable waiting for one) so far, from ``schedstat``; {} where the
    kernel keeps no such counts."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            running, waiting = (task / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):  # ended meanwhile, or no schedstat
            continue
        out[task.name] = (int(running), int(waiting))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--server-args", default="", help="extra `streamrt serve` arguments (--grpc-server h2corn)")
    parser.add_argument("--client", choices=("streamrt", "perf_analyzer"), default="streamrt")
    parser.add_argument("--perf-analyzer", default=None, help="perf_analyzer binary (default: build/perf_analyzer)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from serving_frontend import free_port, served, wait_ready
    from vs_triton import measure, start_streamrt, stop, write_repository

    binary = None
    if args.client == "perf_analyzer":
        import perf_analyzer_client

        binary = perf_analyzer_client.find(args.perf_analyzer)
        if binary is None:
            parser.error("--client perf_analyzer: no perf_analyzer found (run scripts/setup_perf_analyzer.sh, or "
                         "pass --perf-analyzer PATH)")

    work = Path(tempfile.mkdtemp(prefix="streamrt-threads-"))
    repo = write_repository(work / "repo")
    lines = []
    for protocol in args.protocols.split(","):
        http, grpc = free_port(), free_port()
        server = start_streamrt(repo, http, grpc, work / f"{protocol}.log", shlex.split(args.server_args))
        try:
            wait_ready(http, 60, server)
            time.sleep(0.5)
            before, count0 = thread_cpu(server.pid), served(http, "null_small")
            sched0, start = thread_schedule(server.pid), time.perf_counter()
            throughput = measure(args.client, binary, protocol, http if protocol == "http" else grpc, "null_small", 1,
                                 args.concurrency, args.processes, args.seconds)["throughput"]
            sched1, wall = thread_schedule(server.pid), time.perf_counter() - start
            after, count1 = thread_cpu(server.pid), served(http, "null_small")
        finally:
            stop(server)
        requests = max(count1 - count0, 1)
        per_thread, shares = {}, {}
        for tid, (name, cpu) in after.items():
            label = "event loop (main thread)" if int(tid) == server.pid else f"{name} {tid}"
            per_thread[label] = cpu - before.get(tid, (name, 0.0))[1]
            if tid in sched1:
                running0, waiting0 = sched0.get(tid, (0, 0))
                shares[label] = (f"  on a CPU {(sched1[tid][0] - running0) / 1e9 / wall:6.1%}  waiting for a CPU "
                                 f"{(sched1[tid][1] - waiting0) / 1e9 / wall:6.1%}")
        lines.append(f"{protocol}: {throughput:,.0f} requests/s ({args.client}), {requests} requests counted")
        lines += [f"    {label:28} {cpu / requests * 1e6:7.1f} us/request{shares.get(label, '')}"
                  for label, cpu in sorted(per_thread.items(), key=lambda kv: -kv[1]) if cpu > 0]
        lines.append(f"    {'whole process':28} {sum(per_thread.values()) / requests * 1e6:7.1f} us/request")
    print("\n".join(lines))
    if args.out is not None:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/server_threads.py", *sys.argv[1:]], Path(__file__).parents[1])
        args.out.write_text("\n".join([*header, "", "```", *lines, "```", ""]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
