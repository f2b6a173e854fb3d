"""Where ``streamrt serve`` spends its CPU per request, thread by thread, over HTTP and gRPC.

Serves ``vs_triton.py``'s repository (``null_small``: a Python-backend model, dynamic batching with a
500 us delay, 2 instances), drives it with ``streamrt perf`` (concurrency 16, 2 client processes) once
per protocol, and reads every thread's user + system time from ``/proc/PID/task/*/stat`` before and
after the run, divided by the requests the server counted. The event-loop thread (the process's
first) is named; other threads by their kernel name and id (Python threads all read ``python``).

Usage (repository root)::

    python benchmarks/server_threads.py --protocols grpc,http --seconds 5 [--out docs/benchmarks/x.txt]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--server-args", default="", help="extra `streamrt serve` arguments (--grpc-server h2corn)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from serving_frontend import free_port, run_perf, served, wait_ready
    from vs_triton import start_streamrt, stop, write_repository

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
            result = run_perf(protocol, http if protocol == "http" else grpc, "null_small", 1, args.concurrency,
                              args.processes, args.seconds, [])
            after, count1 = thread_cpu(server.pid), served(http, "null_small")
        finally:
            stop(server)
        requests = max(count1 - count0, 1)
        per_thread = {}
        for tid, (name, cpu) in after.items():
            label = "event loop (main thread)" if int(tid) == server.pid else f"{name} {tid}"
            per_thread[label] = cpu - before.get(tid, (name, 0.0))[1]
        lines.append(f"{protocol}: {result['throughput']:,.0f} requests/s, {requests} requests counted")
        lines += [f"    {label:28} {cpu / requests * 1e6:7.1f} us/request"
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
