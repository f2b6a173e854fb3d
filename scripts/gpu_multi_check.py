"""Two-GPU check (issue 17): one GPU vs two, for the server and for detection streams, side by side.

One call, under 9 minutes on two H200s, writes ``OUT/multigpu.md`` (date, commit, devices, command):

(a) **Server**: ResNet-50 fp16 (torch_inductor plan, batch 1..64, dynamic batching max 64) served by
    ``streamrt serve`` with ``instance_group [{count: I, kind: KIND_GPU, gpus: [0]}]`` and then
    ``gpus: [0, 1]`` (I instances on each GPU), driven by ``streamrt perf`` at concurrency 128 with
    ``--request-batch`` images per request, over binary gRPC and over system shared memory (the wire
    bytes out of the way). Target: two GPUs >= 1.8x one.
(b) **Detection streams**: ``streamrt detect`` with ``--streams`` sources (a video file per stream:
    decode included; default a generated clip), ``--gpus 0`` vs ``--gpus 0,1`` (sources dealt
    round-robin, one pipeline per GPU, threads of one process), and two ``streamrt detect`` processes
    side by side (``CUDA_VISIBLE_DEVICES=0`` / ``1``, half the streams each: no shared GIL).
    Target: two GPUs >= 1.8x one.

It refuses to run with fewer than two GPUs (exit status 2). Pass ``--plans DIR`` with a
``resnet50.plan`` from an earlier run (left in ``OUT/plans``) to skip the ~100 s build.

Usage (on the GPU machine, from the repository root)::

    python scripts/gpu_multi_check.py OUT [--plans DIR] [--parts serve,detect] [--source FILE.mp4]

``--device cpu --quick`` is the CPU smoke run (tests/video/test_multi_gpu.py): the same parts, with the
tiny conv net of ``gpu_serving_check.py`` served from 1 vs 2 CPU instance groups (standing in for one
GPU vs two) and short CPU detection runs without ``--gpus``; it exercises the builds, the row
formatting and the failure handling, not two GPUs. Each part handles its own failure and the report
is written after every part (``scripts/_gpu_parts.py``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from streamrt.profiling.provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
START = time.monotonic()
sys.path.insert(0, str(ROOT / "scripts"))
from _gpu_parts import Report  # noqa: E402 - the scripts folder is not a package


def _serving_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_serving_check", ROOT / "scripts" / "gpu_serving_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:5.0f} s] {text}", flush=True)


def gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def serve_rows(args: argparse.Namespace, sc: Any, report: Report) -> dict[str, float]:
    """Part (a): a row per placement and transport, written as it comes."""
    name = "resnet50" if args.device == "cuda" else "tiny"
    max_batch = 64 if args.device == "cuda" else 4
    plans = args.plans or args.out / "plans"
    plan = plans / f"{name}.plan"
    if not plan.is_file():
        (args.out / "plans").mkdir(parents=True, exist_ok=True)
        plan = sc.build_plan(name, args.out / "plans", max_batch, args.device)
    report.add(["| placement | transport | images/s | vs gpus [0] | p50 / p99 ms | avg engine batch | note |",
                "|---|---|---:|---:|---:|---:|---|"])
    results: dict[str, float] = {}
    for label, gpus in (("gpus [0]", [0]), ("gpus [0, 1]", [0, 1])):
        repo = args.out / "work" / f"repo-{len(gpus)}gpu"
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        target = repo / name / "1" / "model.plan"
        if not target.exists():
            target.symlink_to(plan.resolve())
        group = ({"count": args.instances, "kind": "KIND_GPU", "gpus": gpus} if args.device == "cuda"
                 else {"count": args.instances * len(gpus), "kind": "KIND_CPU"})  # CPU: a group per "GPU"
        (repo / name / "config.yaml").write_text(json.dumps({
            "max_batch_size": max_batch, "dynamic_batching": {"max_queue_delay_microseconds": 500},
            "instance_group": [group]}))
        started = time.monotonic()
        try:
            server = sc.Server(repo, args.out / f"server-{len(gpus)}gpu.log", args.frontend_processes)
        except (SystemExit, Exception) as exc:  # this placement's server: a row, then the next placement
            say(f"{label}: server FAILED {exc}")
            report.add([f"| {label} | | failed | | | | server: {sc._failure(exc, 300)} |"])
            continue
        say(f"server with {label} ready in {time.monotonic() - started:.0f} s")
        try:
            for transport, extra in (("gRPC binary", []), ("gRPC + system shm", ["--shared-memory", "system"])):
                try:
                    r = sc.perf(server, "grpc", name, args.request_batch, args, extra)
                    base = results.get(f"gpus [0] {transport}")
                    lat = r.get("latency_ms") or {}
                    row = (f"| {label} ({args.instances} per GPU) | {transport} | {r['throughput']:,.0f} | "
                           f"{r['throughput'] / base if base else 1.0:.2f}x | "
                           f"{lat.get('median', float('nan')):.1f} / {lat.get('p99', float('nan')):.1f} | "
                           f"{(r.get('server_us') or {}).get('avg_batch', 0):.1f} | {r['errors']} errors"
                           + (f"; {sc._cell(r['first_error'][:120])}" if r.get("first_error") else "") + " |")
                    results[f"{label} {transport}"] = r["throughput"]
                except (SystemExit, Exception) as exc:  # one failed variant must not lose the others' numbers
                    say(f"{label} {transport}: FAILED {exc}")
                    row = f"| {label} | {transport} | failed | | | | {sc._failure(exc, 300)} |"
                report.add([row])
        finally:
            server.stop()
    return results


def detect_once(args: argparse.Namespace, sources: list[str], gpus: str, report: Path,
                env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    placement = ["--gpus", gpus] if args.device == "cuda" else []  # CPU: the one-device path
    cmd = [sys.executable, "-m", "streamrt.cli.main", "detect", *sources, *placement, "--no-progress",
           "--max-frames", str(args.frames), "--report", str(report)]
    say("run: " + shlex.join(["streamrt", *cmd[3:]]))
    log = open(report.with_suffix(".log"), "wb")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def detect_fps(report: Path) -> dict[str, Any]:
    """FPS, frames and wall time from a ``streamrt detect --report`` folder (``--gpus`` runs or one device)."""
    name = "detect_gpus.json" if (report / "detect_gpus.json").is_file() else "detect.json"
    data = json.loads((report / name).read_text())
    return {"fps": float(data["fps"]), "frames": int(data["frames"]), "wall_s": float(data["wall_s"])}


def detect_rows(args: argparse.Namespace, report_md: Report) -> dict[str, float]:
    """Part (b): a row per placement, written as it comes."""
    sources = [args.source if args.source else f"synthetic:1280x720x{args.frames}:seed={k}"
               for k in range(args.streams)]
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    # Build the detector's plan once, alone (not timed, and not in parallel with timed work).
    warm = detect_once(args, sources[:1], "0", work / "det-warm")
    warm.wait(400)
    rows: list[str] = []
    report_md.add(["| run | streams | frames | FPS (all streams) | vs one GPU | note |",
                   "|---|---:|---:|---:|---:|---|"])
    fps: dict[str, float] = {}
    for label, gpus in (("one GPU (--gpus 0)", "0"), ("two GPUs, one process (--gpus 0,1)", "0,1")):
        report = work / f"det-{gpus.replace(',', '')}"
        process = detect_once(args, sources, gpus, report)
        if process.wait(300) != 0:
            report_md.add([f"| {label} | {len(sources)} | | failed (see {report.with_suffix('.log').name}) | | |"])
            continue
        result = detect_fps(report)
        fps[label] = result["fps"]
        base = fps.get("one GPU (--gpus 0)")
        report_md.add([f"| {label} | {len(sources)} | {result['frames']} | {result['fps']:,.1f} | "
                       f"{result['fps'] / base if base else 1.0:.2f}x | |"])
    # One process per GPU: what the GIL costs the threads of one process.
    halves = [sources[0::2], sources[1::2]]
    reports = [work / f"det-proc{k}" for k in range(2)]
    processes = [detect_once(args, half, "0", rep, {"CUDA_VISIBLE_DEVICES": str(k)})
                 for k, (half, rep) in enumerate(zip(halves, reports, strict=True))]
    codes = [p.wait(300) for p in processes]
    label = "two GPUs, a process each (CUDA_VISIBLE_DEVICES)"
    if any(codes):
        rows.append(f"| {label} | {len(sources)} | | failed (exit {codes}) | | |")
    else:
        results = [detect_fps(r) for r in reports]
        total = sum(r["fps"] for r in results)
        fps[label] = total
        base = fps.get("one GPU (--gpus 0)")
        rows.append(f"| {label} | {len(sources)} | {sum(r['frames'] for r in results)} | {total:,.1f} | "
                    f"{total / base if base else 1.0:.2f}x | sum of the two processes' rates (their windows "
                    f"overlap, not exactly) |")
    report_md.add(rows)
    return fps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the smoke run (CPU instance groups stand in for GPUs; see the module docs)")
    parser.add_argument("--quick", action="store_true", help="short perf warm-ups (the smoke run)")
    parser.add_argument("--plans", type=Path, default=None, help="folder with a prebuilt resnet50.plan")
    parser.add_argument("--parts", default="serve,detect", help="serve, detect or both (default both)")
    parser.add_argument("--instances", type=int, default=2, help="server instances per GPU (default 2)")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--request-batch", type=int, default=8, help="images per request (default 8)")
    parser.add_argument("--processes", type=int, default=8, help="client processes sharing the concurrency")
    parser.add_argument("--frontend-processes", type=int, default=4, help="streamrt serve --frontend-processes")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=8, help="detection streams (default 8)")
    parser.add_argument("--frames", type=int, default=300, help="frames per detection stream (default 300)")
    parser.add_argument("--source", default=None,
                        help="a video file every stream decodes (default: a generated 1280x720 clip per stream)")
    args = parser.parse_args(argv)
    names = gpu_names()
    if args.device == "cuda" and len(names) < 2:
        print(f"gpu_multi_check: needs 2 CUDA GPUs, torch sees {len(names)} ({', '.join(names) or 'none'}); "
              "run it on a two-GPU machine (nvidia-h200-x2)", file=sys.stderr)
        return 2
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    machine = ", ".join(f"GPU {i}: {n}" for i, n in enumerate(names)) if args.device == "cuda" else "CPU smoke run"
    report = Report(args.out / "multigpu.md", [
        "# Two GPUs: server throughput and detection streams, one GPU vs two", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {os.environ.get('STREAMRT_COMMIT') or git_commit(ROOT)}",
        f"- machine: {machine}; torch {torch.__version__}, {os.cpu_count()} CPUs",
        f"- command: `{shlex.join(['python', 'scripts/gpu_multi_check.py', *(argv or sys.argv[1:])])}`", ""])
    verdicts = []
    if "serve" in parts:
        report.add(["## (a) Server: ResNet-50 fp16, one GPU vs two", "",
                    f"`streamrt serve --frontend-processes {args.frontend_processes}`, dynamic batching (max 64, "
                    f"500 us), {args.instances} instances per GPU; `streamrt perf` over gRPC, {args.processes} "
                    f"client processes, concurrency {args.concurrency} x {args.request_batch} images, "
                    f"{args.seconds:g} s windows.", ""])
        results: dict[str, float] = {}
        with report.part("(a) server"):
            results = serve_rows(args, _serving_check(), report)
        report.add([""])
        for transport in ("gRPC binary", "gRPC + system shm"):
            one, two = results.get(f"gpus [0] {transport}"), results.get(f"gpus [0, 1] {transport}")
            if one and two:
                verdicts.append(f"- server, {transport}: {two / one:.2f}x **{'PASS' if two / one >= 1.8 else 'FAIL'}** "
                                "(target >= 1.8x)")
    if "detect" in parts:
        report.add(["## (b) Detection streams, one GPU vs two", "",
                    f"{args.streams} streams of {args.frames} frames "
                    f"({'decoding ' + args.source if args.source else 'generated 1280x720 clips'}), the bundled "
                    "detector on the best backend, `streamrt detect --gpus`.", ""])
        fps: dict[str, float] = {}
        with report.part("(b) detection"):
            fps = detect_rows(args, report)
        report.add([""])
        one = fps.get("one GPU (--gpus 0)")
        for label in ("two GPUs, one process (--gpus 0,1)", "two GPUs, a process each (CUDA_VISIBLE_DEVICES)"):
            if one and fps.get(label):
                ratio = fps[label] / one
                verdicts.append(f"- detection, {label}: {ratio:.2f}x **{'PASS' if ratio >= 1.8 else 'FAIL'}** "
                                "(target >= 1.8x)")
    report.add(["## Verdicts", "", *(verdicts or ["- nothing measured"]), "",
                f"({time.monotonic() - START:.0f} s in all)", ""])
    print("\n".join(report.lines))
    return report.exit_status()


if __name__ == "__main__":
    sys.exit(main())
