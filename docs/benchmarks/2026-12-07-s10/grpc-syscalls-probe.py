"""Which wake-ups one 64 B gRPC request costs each server (StreamRT with h2corn, or tritonserver 2.51).

One server at a time, the null Python model of benchmarks/vs_triton.py, 200 sequential requests from tritonclient
(concurrency 1) under `strace -f` on every process of the server, counting the system calls that move a request
between threads (eventfd/pipe writes and reads, epoll waits, socket sends and receives) per thread and descriptor.

    python docs/benchmarks/2026-12-07-s10/grpc-syscalls-probe.py streamrt|triton     (repository root)

Prints the server's threads (names) and descriptors, and writes /tmp/stx/<server>/strace.txt; the report tallies
it with: grep -v "resumed\\|unfinished" strace.txt | awk '{split($2,a,"("); print $1, a[1], a[2]}' | sed 's/,.*//' |
sort | uniq -c | sort -rn
"""

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import numpy as np
import tritonclient.grpc as grpcclient
import vs_triton as vt
from serving_frontend import free_port, wait_ready

which = sys.argv[1]
work = Path(f"/tmp/stx/{which}")
work.mkdir(parents=True, exist_ok=True)
repo = vt.write_repository(work / "repo")
http, grpc = free_port(), free_port()
log = work / "server.log"
server = (vt.start_triton(repo, work, http, grpc, log) if which == "triton"
          else vt.start_streamrt(repo, http, grpc, log, ["--grpc-server", "h2corn"]))
wait_ready(http, 120, server)
client = grpcclient.InferenceServerClient(f"localhost:{grpc}")
tensor = grpcclient.InferInput("x", [1, 16], "FP32")
tensor.set_data_from_numpy(np.random.rand(1, 16).astype(np.float32))
for _ in range(50):
    client.infer("null_small", [tensor])
pids = subprocess.run(["pgrep", "-g", str(os.getpgid(server.pid))], capture_output=True, text=True).stdout.split()
tracer = subprocess.Popen(["strace", "-f", "-qq", "-e",
                           "trace=write,writev,sendto,sendmsg,epoll_wait,epoll_pwait,recvfrom,recvmsg,read",
                           "-o", str(work / "strace.txt"), *sum([["-p", pid] for pid in pids], [])])
time.sleep(1.5)
count = 200
started = time.perf_counter()
for _ in range(count):
    client.infer("null_small", [tensor])
elapsed = time.perf_counter() - started
time.sleep(0.5)
tracer.send_signal(signal.SIGINT)
tracer.wait()
threads = {t.name: (t / "comm").read_text().strip() for pid in pids for t in Path(f"/proc/{pid}/task").iterdir()}
descriptors = {}
for pid in pids:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            descriptors[f"{pid}:{fd.name}"] = os.readlink(fd)
        except OSError:
            pass
print("threads", threads)
print("descriptors", {k: v for k, v in descriptors.items() if any(s in v for s in ("event", "timer", "socket", "pipe"))})
vt.stop(server)
lines = (work / "strace.txt").read_text().splitlines()
calls = collections.Counter(line.split()[1].split("(")[0] for line in lines if len(line.split()) > 1)
print(which, f"{count} requests, {elapsed / count * 1e6:.0f} us each (under strace)", dict(calls))
