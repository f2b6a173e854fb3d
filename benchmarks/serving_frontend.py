"""Front-end ceiling: a null model (ReduceMean of each item, ONNX Runtime CPU) served and loaded.

The model does almost nothing, so what ``streamrt perf`` measures is the server's front end
(transport, protobuf / HTTP parsing, event loop, batching) and the client. Two models share one
repository: ``null_small`` takes ``[-1, 16]`` fp32 (64 B per item) and ``null_image`` takes
``[-1, 3, 224, 224]`` fp32 (602 KB per item); the request sizes of the issue are 64 B
(``null_small``, batch 1), 600 KB (``null_image``, batch 1) and 4.8 MB (``null_image``, batch 8).

Each case starts nothing new: one server process serves every case; each case runs ``streamrt perf``
as a child (``--processes`` client processes, one merged report). ``--profile`` wraps the server in
``py-spy record`` for the first case and prints the functions with the most samples.

Usage (from the repository root)::

    python benchmarks/serving_frontend.py --seconds 5 --cases grpc:image:8,http:image:8 \
        --concurrency 16 --processes 1 [--profile OUT.txt] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from streamrt.testing import server_process
from streamrt.testing.server_process import free_port

ROOT = Path(__file__).resolve().parents[1]
ITEM = {"small": (16,), "image": (3, 224, 224)}


def null_model(item: tuple[int, ...]) -> onnx.ModelProto:
    """``y[n] = mean(x[n])``: one ReduceMean over every non-batch axis."""
    axes = list(range(1, len(item) + 1))
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=0)
    graph = helper.make_graph(
        [node], "null",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", *item])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write_repository(repo: Path, max_batch: int = 64, instances: int = 2, delay_us: int = 500,
                     backend_options: dict[str, Any] | None = None) -> Path:
    """A repository with ``null_small`` and ``null_image`` (dynamic batching, ``instances`` CPU instances);
    ``backend_options`` go to the ONNX Runtime build of each (e.g. ``{"spinning": False}``)."""
    for kind, item in ITEM.items():
        folder = repo / f"null_{kind}" / "1"
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(null_model(item), str(folder / "model.onnx"))
        (repo / f"null_{kind}" / "config.yaml").write_text(json.dumps({
            "max_batch_size": max_batch,
            "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
            "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
            **({"build": {"backend_options": backend_options}} if backend_options else {}),
        }))
    return repo


def wait_ready(port: int, timeout: float, process: subprocess.Popen[bytes]) -> None:
    """:func:`streamrt.testing.server_process.wait_ready`, failing as SystemExit (the callers' convention)."""
    try:
        server_process.wait_ready(port, timeout, process, poll_s=0.5)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from exc


def run_perf(protocol: str, port: int, model: str, batch: int, concurrency: int, processes: int,
             seconds: float, extra: list[str]) -> dict[str, Any]:
    """One ``streamrt perf`` run (its JSON report, first level) plus the command."""
    levels, status, stderr, command = run_perf_levels(protocol, port, model, batch, str(concurrency), processes,
                                                      seconds, extra, timeout=seconds * 4 + 120)
    if status not in (0, 1) or not levels:
        raise SystemExit(f"perf failed ({status}): {stderr[-2000:]}")
    result = levels[0]
    result["command"] = command
    result["stderr"] = stderr.strip()[-500:]
    return dict(result)


def run_perf_levels(protocol: str, port: int, model: str, batch: int, concurrency_range: str, processes: int,
                    seconds: float, extra: list[str], timeout: float) -> tuple[list[dict[str, Any]], int, str, str]:
    """``streamrt perf --json`` as a child: (every level's JSON, exit status, stderr, the command).

    The levels are empty when perf printed no JSON (it failed before measuring). A latency-bound search
    (``extra`` with ``--latency-bound-ms``) prints its levels and then fails with status 2 when no level
    meets the bound, so the caller decides what a status means.
    """
    cmd = [sys.executable, "-m", "streamrt.cli.main", "perf", "-m", model, "-i", protocol,
           "-u", f"127.0.0.1:{port}", "--concurrency-range", concurrency_range, "-b", str(batch),
           "--processes", str(processes), "--measurement-interval", str(int(seconds * 1000)),
           "--warmup-ms", "1500", "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    try:
        levels = json.loads(out.stdout) if out.stdout.strip() else []
    except ValueError:
        levels = []
    return [dict(level) for level in levels], out.returncode, out.stderr, shlex.join(["streamrt", *cmd[3:]])


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU time of process ``pid``, its threads and (``children``) its live children
    (the front-end processes of ``--frontend-processes N``; Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if not children:
        return total
    for child in server_process.child_pids(pid):
        with contextlib.suppress(OSError):  # exited meanwhile
            total += cpu_seconds(child)
    return total


def served(http_port: int, model: str) -> int:
    """Requests the server answered successfully for ``model`` so far (statistics extension)."""
    return model_counts(http_port, model)[0]


def model_counts(http_port: int, model: str) -> tuple[int, int, int, int]:
    """``model``'s counters so far (statistics extension, the same fields on Triton and StreamRT): requests
    answered, rows inferred, executions (batches) and nanoseconds its requests spent queued."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.loads(r.read())["model_stats"][0]
    inference = stats["inference_stats"]
    # the library-floor benchmarks' bare servers answer only the success count: the rest reads 0 there
    return (int(inference["success"]["count"]), int(stats.get("inference_count", 0)),
            int(stats.get("execution_count", 0)), int(inference.get("queue", {}).get("ns", 0)))


def top_frames(raw: Path, limit: int = 25) -> list[tuple[str, float]]:
    """Self-time share of the leaf frames of a py-spy ``--format raw`` (collapsed stacks) profile."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        leaf = stack.split(";")[-1]
        counts[leaf] += int(n)
        total += int(n)
    return [(frame, count / max(total, 1)) for frame, count in counts.most_common(limit)]


def parse_case(text: str) -> tuple[str, str, int]:
    protocol, kind, batch = text.split(":")
    if protocol not in ("http", "grpc") or kind not in ITEM:
        raise SystemExit(f"bad case {text!r}: PROTOCOL:small|image:BATCH")
    return protocol, kind, int(batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="grpc:small:1,grpc:image:1,grpc:image:8,http:small:1,http:image:1,"
                        "http:image:8", help="PROTOCOL:small|image:BATCH,...")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1, help="client processes (streamrt perf --processes)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--server-args", default="", help="extra `streamrt serve` arguments")
    parser.add_argument("--server-src", type=Path, default=None,
                        help="run the server from this source tree (e.g. an older commit's src/), same client")
    parser.add_argument("--perf-args", default="", help="extra `streamrt perf` arguments")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the server during the first case")
    parser.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    args = parser.parse_args()
    cases = [parse_case(c) for c in args.cases.split(",")]
    work = Path(tempfile.mkdtemp(prefix="streamrt-frontend-"))
    repo = write_repository(work / "repo", instances=args.instances)
    http, grpc = free_port(), free_port()
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed after the server stops
    server = subprocess.Popen(
        [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http), "--grpc-port",
         str(grpc), "--metrics-port", "-1", "--log-level", "WARNING", *shlex.split(args.server_args)],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1",
             **({"PYTHONPATH": str(args.server_src.resolve())} if args.server_src else {})})
    rows = []
    try:
        wait_ready(http, 300, server)
        for index, (protocol, kind, batch) in enumerate(cases):
            spy = None
            if args.profile is not None and index == 0:
                raw = args.profile.with_suffix(".raw")
                spy = subprocess.Popen(
                    ["py-spy", "record", "--pid", str(server.pid), "--gil", "--format", "raw", "--rate", "200",
                     "--output", str(raw), "--duration", str(int(args.seconds + 1.5))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cpu0, engine0 = cpu_seconds(server.pid), cpu_seconds(server.pid, children=False)
            count0 = served(http, f"null_{kind}")
            result = run_perf(protocol, http if protocol == "http" else grpc, f"null_{kind}", batch,
                              args.concurrency, args.processes, args.seconds, shlex.split(args.perf_args))
            cpu = cpu_seconds(server.pid) - cpu0
            engine_cpu = cpu_seconds(server.pid, children=False) - engine0
            count = served(http, f"null_{kind}") - count0
            server_cores = cpu / (args.seconds + 1.5)  # busy cores over warm-up + window (it idles otherwise)
            if spy is not None:
                spy.wait(60)
                lines = [f"{share:6.1%}  {frame}" for frame, share in top_frames(raw)]
                args.profile.write_text("\n".join(lines) + "\n")
                print("\n".join(lines[:15]))
            nbytes = batch * 4 * int(__import__("math").prod(ITEM[kind]))
            lat = result["latency_ms"] or {}
            reqs = result["throughput"] / batch
            rows.append((protocol, kind, batch, nbytes, reqs, reqs * nbytes / 1e9, lat.get("median", float("nan")),
                         lat.get("p99", float("nan")), result["errors"], result["server_us"].get("success", 0.0),
                         result.get("client_cpu_us", float("nan")), server_cores, cpu / max(count, 1) * 1e6,
                         engine_cpu / max(count, 1) * 1e6))
            print(f"{protocol:5} {kind:6} b{batch:<3} {nbytes / 1e3:9.1f} KB  {reqs:9.1f} req/s  "
                  f"{rows[-1][5]:6.3f} GB/s  p50 {rows[-1][6]:7.2f} ms  p99 {rows[-1][7]:7.2f} ms  "
                  f"server {rows[-1][9]:8.0f} us  client cpu {rows[-1][10]:7.0f} us/req  "
                  f"server cores {server_cores:4.2f} ({rows[-1][12]:6.0f} us CPU/req, "
                  f"engine process {rows[-1][13]:6.0f})  "
                  f"errors {result['errors']}",
                  flush=True)
            if result.get("stderr"):
                print("   ", result["stderr"].replace("\n", "\n    "), flush=True)
    finally:
        server.terminate()
        server.wait(60)
        log.close()
    table = ["| protocol | request | bytes | requests/s | GB/s | p50 ms | p99 ms | server us/req (stats) | "
             "server CPU us/req | engine process CPU us/req | server cores busy | client CPU us/req | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p, k, b, n, r, g, p50, p99, e, s, c, cores, cpu_req, engine_req in rows:
        table.append(f"| {p} | null_{k} x{b} | {n:,} | {r:,.0f} | {g:.3f} | {p50:.2f} | {p99:.2f} | {s:.0f} | "
                     f"{cpu_req:.0f} | {engine_req:.0f} | {cores:.2f} | {c:.0f} | {e} |")
    text = "\n".join(table)
    print(text)
    if args.out:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/serving_frontend.py", *sys.argv[1:]], ROOT)
        args.out.write_text("\n".join([*header, "", text, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
