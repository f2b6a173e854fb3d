"""StreamRT's server beside a real Triton, the same Python model in both, the same client.

Both servers serve one repository: ``null_small`` (FP32 ``[16]`` per item, 64 B) and ``null_image``
(FP32 ``[3, 224, 224]``, 602 KB), each a Triton Python-backend model (``model.py``:
``TritonPythonModel`` returning the mean of each row), ``max_batch_size`` 64, dynamic batching with
a 500 us delay, 2 CPU instances. Triton runs it in its Python backend (a stub process per instance,
tensors through shared memory); StreamRT in its own Python backend (``serve/python_backend``,
instances in the server process). So the two differ only in the server: protocol handling,
batching, the hand-over to the model, and its process design.

The Triton is the ``tritonserver`` 2.51 bundled in nvidia-pytriton 0.7.0 (its own venv, numpy<2:
``scripts/setup_triton_reference.sh``), started directly with its Python backend (the stub of
the venv's Python copied next to ``libtriton_python.so``, the venv's libpython and the wheel's
libraries on ``LD_LIBRARY_PATH``, the venv first on ``PATH``). It does not fit the 64 MB that can
be carried to the GPU machine (144 MB), so this comparison runs on the CPU machine.

The client is ``streamrt perf`` (``--processes`` processes, one merged report) or NVIDIA's C++
``perf_analyzer`` (``--client perf_analyzer``: one process with a thread per concurrent request, so
``--processes`` does not apply; ``benchmarks/perf_analyzer_client.py``), the same for both servers,
one server at a time, alternating rounds. ``--client streamrt,perf_analyzer`` measures every case
with both clients against each server start, so both clients' ratios come from the same hour.
perf_analyzer has no warm-up setting: it measures windows of ``--seconds`` until three agree (its
own stability rule) and reports those three; a case it could not stabilise is measured again with
``--stability-percentage 100`` and marked ``unstable``. Server CPU per request counts the server
process and its children (Triton's stubs, StreamRT's front-end workers) over the whole client run,
divided by the requests the server answered in it, so it is the same accounting with either client.

Usage (repository root)::

    python benchmarks/vs_triton.py --cases grpc:small:1,grpc:image:8,http:small:1,http:image:8 \\
        --concurrency 16 --processes 2 --seconds 4 --rounds 2 [--client streamrt,perf_analyzer] \\
        [--before-src /tmp/base/src] [--out docs/benchmarks/x.md]

``--before-src`` adds a third server, ``streamrt-before``: the same CLI (with the first ``--grpc-servers``
entry's gRPC server) from another source tree
(``git archive BASE src | tar -x -C /tmp/base``), so a change is measured beside its base and Triton
in one run, rounds alternating.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_analyzer_client
from serving_frontend import ITEM, cpu_seconds, free_port, model_counts, parse_case, run_perf, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PYTRITON = Path("/work/venvs/pytriton/bin/python")

MODEL_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """y[n] = mean(x[n]): the null model, the same file in both servers."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = x.reshape(x.shape[0], -1).mean(axis=1, dtype=np.float32).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
'''


def write_repository(root: Path, max_batch: int = 64, delay_us: int = 500, instances: int = 2) -> Path:
    for kind, item in ITEM.items():
        name = f"null_{kind}"
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
            f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
            f"instance_group [{{ count: {instances}, kind: KIND_CPU }}]\n"
            f'input [{{ name: "x", data_type: TYPE_FP32, dims: {list(item)} }}]\n'
            'output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]\n')
    return root


def pytriton_python() -> Path:
    path = Path(os.environ.get("STREAMRT_PYTRITON_PYTHON", DEFAULT_PYTRITON))
    if not path.is_file():
        raise SystemExit(f"no nvidia-pytriton venv at {path}: run scripts/setup_triton_reference.sh "
                         "(or set STREAMRT_PYTRITON_PYTHON)")
    return path


def start_triton(repo: Path, work: Path, http: int, grpc: int, log: Path) -> subprocess.Popen[bytes]:
    """tritonserver with its Python backend, started directly (see the module docstring)."""
    python = pytriton_python()
    probe = subprocess.run(
        [str(python), "-c", "import pathlib, pytriton, sys, sysconfig; "
         "print(pathlib.Path(pytriton.__file__).parent); print(sysconfig.get_config_var('LIBDIR')); "
         "print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, check=True, timeout=120)
    package, libdir, version = probe.stdout.split()
    triton = Path(package) / "tritonserver"
    backends = work / "backends"
    (backends / "python").mkdir(parents=True, exist_ok=True)
    for source in [*(triton / "backends" / "python").glob("*.*"),
                   triton / "python_backend_stubs" / version / "triton_python_backend_stub"]:
        if source.is_file():  # through a new name: the stub of a tritonserver still exiting may be running
            staged = backends / "python" / f".{source.name}.new"
            shutil.copy2(source, staged)
            os.replace(staged, backends / "python" / source.name)
    libs = Path(package).parent / "nvidia_pytriton.libs"
    env = {**os.environ, "PATH": f"{python.parent}:{os.environ.get('PATH', '')}",
           "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(libs), libdir, os.environ.get("LD_LIBRARY_PATH")]))}
    return subprocess.Popen(
        [str(triton / "bin" / "tritonserver"), "--model-repository", str(repo), "--backend-directory", str(backends),
         "--http-port", str(http), "--grpc-port", str(grpc), "--allow-metrics", "false", "--log-verbose", "0"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def start_streamrt(repo: Path, http: int, grpc: int, log: Path, extra: list[str],
                   src: Path | None = None) -> subprocess.Popen[bytes]:
    """``streamrt serve`` from this checkout, or from the source tree ``src`` (an older commit's
    ``src/``: the "before" of a change, served beside the "after" in the same run)."""
    env = {**os.environ, "PYTHONPATH": str(src.resolve())} if src is not None else None
    return subprocess.Popen(
        [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http), "--grpc-port",
         str(grpc), "--metrics-port", "-1", "--log-level", "WARNING", *extra],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env=env)


def cpu_times() -> tuple[int, int]:
    """The machine's (idle, total) CPU ticks so far (``/proc/stat``; (0, 0) where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


def perf_analyzer_version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1] if done.stdout or done.stderr else "?"


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait(10)


def measure(client: str, binary: Path | None, protocol: str, port: int, model: str, batch: int, concurrency: int,
            processes: int, seconds: float) -> dict[str, Any]:
    """One case with ``client``: the level's dict (``streamrt perf --json``'s keys) plus ``command``; a
    perf_analyzer run that measured nothing gives NaN figures and its output in ``stderr``."""
    if client == "streamrt":
        return run_perf(protocol, port, model, batch, concurrency, processes, seconds, [])
    assert binary is not None
    levels, status, tail, command = perf_analyzer_client.run(binary, protocol, port, model, batch, str(concurrency),
                                                             seconds, timeout=seconds * 30 + 120)
    if not levels:
        print(f"perf_analyzer measured nothing (exit {status}):\n{tail[-2000:]}", flush=True)
        return {"throughput": float("nan"), "latency_ms": {}, "errors": f"exit {status}", "command": command,
                "unstable": True}
    return {**levels[0], "command": command}


def ratios(rows: list[tuple[Any, ...]]) -> list[str]:
    """StreamRT / Triton requests/s (and server CPU per request) for each case, client and StreamRT
    server: the per-round ratios and the ratio of the round means."""
    table = ["| case | client | server | StreamRT req/s | Triton req/s | ratio per round | ratio | "
             "server CPU us/req StreamRT / Triton |", "|---|---|---|---:|---:|---|---:|---:|"]
    by_key: dict[tuple[Any, ...], dict[int, tuple[float, float]]] = {}
    for p, k, b, client, name, rnd, reqs, _gbs, _p50, _p99, cpu_req, *_ in rows:
        by_key.setdefault((p, k, b, client, name), {})[rnd] = (reqs, cpu_req)
    for (p, k, b, client, name), rounds in sorted(by_key.items()):
        if name == "triton" or (p, k, b, client, "triton") not in by_key:
            continue
        triton = by_key[(p, k, b, client, "triton")]
        common = sorted(set(rounds) & set(triton))
        if not common:
            continue
        per_round = ", ".join(f"{rounds[r][0] / triton[r][0]:.2f}" for r in common)
        ours, theirs = (sum(d[r][0] for r in common) / len(common) for d in (rounds, triton))
        cpu_ours, cpu_theirs = (sum(d[r][1] for r in common) / len(common) for d in (rounds, triton))
        table.append(f"| {p} null_{k} x{b} | {client} | {name} | {ours:,.0f} | {theirs:,.0f} | {per_round} | "
                     f"{ours / theirs:.2f}x | {cpu_ours:,.0f} / {cpu_theirs:,.0f} |")
    return table


def server_row(grpc_server: str, http_server: str) -> str:
    """The table's name of a StreamRT server: 'streamrt', '-h2corn' for gRPC on h2corn, '-http-h2corn' for HTTP."""
    return "streamrt" + ("" if grpc_server == "grpcio" else f"-{grpc_server}") + (
        "" if http_server == "aiohttp" else f"-http-{http_server}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="grpc:small:1,grpc:image:1,grpc:image:8,http:small:1,http:image:1,"
                        "http:image:8", help="PROTOCOL:small|image:BATCH,...")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2,
                        help="client processes (streamrt perf --processes; perf_analyzer is one process)")
    parser.add_argument("--client", default="streamrt",
                        help="load generator, comma list: streamrt (`streamrt perf`) and/or perf_analyzer "
                             "(NVIDIA's C++ one, scripts/setup_perf_analyzer.sh); each case runs with each")
    parser.add_argument("--perf-analyzer", default=None,
                        help="perf_analyzer binary (default: $STREAMRT_PERF_ANALYZER, else "
                             "build/perf_analyzer/perf_analyzer)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server-args", default="", help="extra `streamrt serve` arguments")
    parser.add_argument("--before-src", type=Path, default=None,
                        help="also serve from this source tree as 'streamrt-before' (e.g. `git archive BASE src`)")
    parser.add_argument("--grpc-servers", default="grpcio",
                        help="serve StreamRT once per gRPC server (`streamrt serve --grpc-server`), comma list: "
                             "grpcio (row 'streamrt') and/or h2corn (row 'streamrt-h2corn')")
    parser.add_argument("--http-servers", default="aiohttp",
                        help="serve StreamRT once per HTTP server too (`streamrt serve --http-server`), comma list: "
                             "aiohttp and/or h2corn (rows '...-http-h2corn'); each with each --grpc-servers entry")
    parser.add_argument("--delay-us", type=int, default=500,
                        help="both models' max_queue_delay_microseconds (0: a batch runs as soon as an instance "
                             "is free)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.delay_us < 0:
        parser.error(f"--delay-us: 0 or more microseconds, got {args.delay_us}")
    grpc_servers = [g for g in args.grpc_servers.split(",") if g]
    if not grpc_servers or any(g not in ("grpcio", "h2corn") for g in grpc_servers):
        parser.error(f"--grpc-servers: grpcio and/or h2corn, got {args.grpc_servers!r}")
    http_servers = [h for h in args.http_servers.split(",") if h]
    if not http_servers or any(h not in ("aiohttp", "h2corn") for h in http_servers):
        parser.error(f"--http-servers: aiohttp and/or h2corn, got {args.http_servers!r}")
    clients = [c for c in args.client.split(",") if c]
    if not clients or any(c not in ("streamrt", "perf_analyzer") for c in clients):
        parser.error(f"--client: streamrt and/or perf_analyzer, got {args.client!r}")
    binary = perf_analyzer_client.find(args.perf_analyzer) if "perf_analyzer" in clients else None
    if "perf_analyzer" in clients and binary is None:
        parser.error("--client perf_analyzer: no perf_analyzer found (run scripts/setup_perf_analyzer.sh, or pass "
                     "--perf-analyzer PATH)")
    streamrts = {server_row(g, h): ["--grpc-server", g, *(["--http-server", h] if h != "aiohttp" else [])]
                 for g in grpc_servers for h in http_servers}
    cases = [parse_case(c) for c in args.cases.split(",")]
    work = Path(tempfile.mkdtemp(prefix="streamrt-vs-triton-"))
    repo = write_repository(work / "repo", delay_us=args.delay_us)
    # the before tree serves with the first --grpc-servers entry's flags (it ran grpcio whatever was asked until
    # 2026-12-07)
    before = next(iter(streamrts.values()))
    rows = []
    commands: dict[tuple[str, str], str] = {}
    for round_ in range(1, args.rounds + 1):
        for server_name in ("triton", *streamrts, *(("streamrt-before",) if args.before_src else ())):
            http, grpc = free_port(), free_port()
            log = work / f"{server_name}-{round_}.log"
            server = (start_triton(repo, work, http, grpc, log) if server_name == "triton"
                      else start_streamrt(repo, http, grpc, log,
                                          [*shlex.split(args.server_args), *streamrts.get(server_name, before)],
                                          args.before_src if server_name == "streamrt-before" else None))
            try:
                wait_ready(http, 300, server)
                time.sleep(1.0)
                for (protocol, kind, batch), client in ((case, c) for case in cases for c in clients):
                    model = f"null_{kind}"
                    cpu0, counts0, ticks0 = cpu_seconds(server.pid), model_counts(http, model), cpu_times()
                    result = measure(client, binary, protocol, http if protocol == "http" else grpc, model, batch,
                                     args.concurrency, args.processes, args.seconds)
                    commands.setdefault((client, f"{protocol}:{kind}:{batch}"), result["command"])
                    cpu = cpu_seconds(server.pid) - cpu0
                    idle_ticks, all_ticks = (b - a for a, b in zip(ticks0, cpu_times(), strict=True))
                    count, rows_in, executions, queue_ns = (b - a for a, b in zip(counts0, model_counts(http, model),
                                                                                  strict=True))
                    nbytes = batch * 4 * math.prod(ITEM[kind])
                    lat = result["latency_ms"] or {}
                    reqs = result["throughput"] / batch
                    errors = f"{result['errors']}{' (unstable)' if result.get('unstable') else ''}"
                    row = (protocol, kind, batch, client, server_name, round_, reqs, reqs * nbytes / 1e9,
                           lat.get("median", float("nan")), lat.get("p99", float("nan")),
                           cpu / max(count, 1) * 1e6, errors, rows_in / max(executions, 1),
                           queue_ns / max(count, 1) / 1e3, 100 * idle_ticks / max(all_ticks, 1))
                    rows.append(row)
                    print(f"{protocol:5} {kind:6} x{batch:<2} {client:13} {server_name:15} round {round_}: "
                          f"{reqs:8.1f} req/s {row[7]:6.3f} GB/s  p50 {row[8]:7.2f} ms  p99 {row[9]:7.2f} ms  "
                          f"server CPU {row[10]:7.0f} us/req  errors {errors}  rows/batch {row[12]:5.2f}  "
                          f"queue {row[13]:6.0f} us/req  machine idle {row[14]:4.1f}%", flush=True)
            finally:
                stop(server)
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3], r[5], r[4]))
    table = ["| protocol | request | client | server | round | requests/s | GB/s | p50 ms | p99 ms | "
             "server CPU us/req | errors | rows per execution | queue us/req | machine idle |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p, k, b, client, name, rnd, reqs, gbs, p50, p99, cpu_req, errors, per_batch, queue_us, idle in rows:
        table.append(f"| {p} | null_{k} x{b} | {client} | {name} | {rnd} | {reqs:,.0f} | {gbs:.3f} | {p50:.2f} | "
                     f"{p99:.2f} | {cpu_req:,.0f} | {errors} | {per_batch:.2f} | {queue_us:,.0f} | {idle:.1f}% |")
    text = "\n".join([*ratios(rows), "", *table])
    print(text)
    if args.out is not None:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/vs_triton.py", *sys.argv[1:]], ROOT)
        header.append(f"- client: {', '.join(clients)}"
                      + (f" ({perf_analyzer_version(binary)}, {binary})" if binary is not None else "")
                      + "; each case's command (the ports are those of the first server started):")
        header += [f"  - {client} {case}: `{command}`" for (client, case), command in commands.items()]
        args.out.write_text("\n".join([*header, "", text, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
