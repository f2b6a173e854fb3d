"""NVDEC scaling (issue 27): why NVDEC alone falls past 4 sessions and 150 sessions fail to open, and the fix.

One GPU call compares the ways of making sessions (:class:`~streamrt.video.decode_nvdec.NvdecOptions`)
side by side, each variant a row per session count:

- frames/s in aggregate and per session (threads, or worker processes: no shared GIL);
- decoders created per second (a looping 10 s clip at ~630 frames/s ends a pass every 0.5 s: the
  old way made a new decoder, and a new CUDA context, at each);
- host milliseconds per frame in ``Decode`` (demux + decode), the copy out, the stream sync;
- a GIL probe: how late a 1 ms sleeper wakes (a decoder call holding the GIL shows here);
- streams whose pictures came in order (presentation time stamps).

``primary+reuse+ipc4`` is the process split as the detector gets it: the sessions in 4 decoder
processes (:class:`~streamrt.video.decode_processes.ProcessDecodePool`), every picture handed over
by CUDA IPC and copied out, one reader thread per stream, in this process: set beside
``primary+reuse+p4`` (the same split, frames counted in the workers) it shows what the hand-over
costs. Its pool opens once and grows with the session counts.

Then, for ``--open-variants``, sessions are opened one at a time up to ``--open`` with the free device
memory read before and after each (MiB per session), a few frames decoded from every open stream.

Parts run in this order: the scaling of every variant (the old way and the fix first), then the
open test, the fix before the old way: on the H200 (2026-12-02) the old way's 182 closed sessions
kept their device memory, so every part after them failed to create a decoder. Each part catches its own failure (a
``FAILED`` row, then the next); ``OUT/nvdec_scaling.md`` and ``.json`` are rewritten after every part;
a part that would not fit in what is left of ``--budget`` is skipped and says so.

``--device cpu`` runs every part with OpenCV decoders standing in for NVDEC (the CI smoke run, seconds
with ``--quick``); without ``--clips`` it makes two tiny clips.

Usage::

    python scripts/make_video_clips.py build/video-clips                     # where PyAV is (CPU machine)
    pip install .whl/pynvvideocodec-*.whl                                    # GPU machine
    python scripts/gpu_nvdec_scaling.py OUT --clips build/video-clips --budget 360
    python scripts/gpu_nvdec_scaling.py OUT --device cpu --quick             # the CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from streamrt.video.clips import smoke_clips as _smoke_clips
from streamrt.video.decode_nvdec import NvdecOptions
from streamrt.video.decode_scaling import PoolSpec, drain, drain_in_processes, open_sessions, start_processes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_parts import Budget

ROOT = Path(__file__).resolve().parents[1]
FPS = 30.0


@dataclass(frozen=True)
class Variant:
    """One way of running sessions: how they are made, how many driver threads, how many processes."""

    options: NvdecOptions
    what: str
    workers: int = 0  # 0: a thread per session
    processes: int = 0  # 0: all in this process
    handover: int = 0  # decoder processes handing every picture to this process (ProcessDecodePool); 0: none


_TIMED = NvdecOptions(context="own", reuse=False, timing=True)  # the old way; the others vary it
VARIANTS = {
    "legacy": Variant(_TIMED, "a context per decoder, a new decoder every pass, a thread per session (the old way)"),
    "primary+reuse": Variant(replace(_TIMED, context="primary", reuse=True),
                             "primary context + torch stream, decoder kept across passes"),
    "own+reuse": Variant(replace(_TIMED, reuse=True), "a context per decoder, decoder kept across passes"),
    "primary": Variant(replace(_TIMED, context="primary"), "primary context + torch stream, new decoder every pass"),
    "primary+reuse+async": Variant(replace(_TIMED, context="primary", reuse=True, async_alloc=True),
                                   "as primary+reuse, enableasyncallocations"),
    "primary+reuse+w8": Variant(replace(_TIMED, context="primary", reuse=True),
                                "as primary+reuse, 8 driver threads for all sessions", workers=8),
    "primary+reuse+p4": Variant(replace(_TIMED, context="primary", reuse=True),
                                "as primary+reuse, sessions split over 4 processes", processes=4),
    "primary+reuse+p8": Variant(replace(_TIMED, context="primary", reuse=True),
                                "as primary+reuse, sessions split over 8 processes", processes=8),
    "primary+reuse+ipc4": Variant(replace(_TIMED, context="primary", reuse=True),
                                  "as primary+reuse+p4, every picture handed to this process by CUDA IPC and "
                                  "copied out here (ProcessDecodePool: what the detector gets)", handover=4),
}
DEFAULT_VARIANTS = "legacy,primary+reuse,own+reuse,primary,primary+reuse+p4,primary+reuse+ipc4,primary+reuse+w8"

SCALING_HEADER = ["| sessions | frames/s | per session | x one session | slowest stream | NVDEC busy | "
                  "decoders made/s | host ms/frame decode / copy / sync | GIL probe p99 / max ms | in order |",
                  "|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "/")[:300]


def _row(r: dict[str, Any], one: float | None) -> str:
    host = r["host_ms_per_frame"]
    gil = r.get("gil") or {}
    gil_text = f"{gil['p99_ms']:.1f} / {gil['max_ms']:.1f}" if gil else "- (processes)"
    order = f"{r['in_order']}/{r['sessions']}" if r["order_known"] else f"{r['in_order']}/{r['sessions']} (no pts)"
    ratio = f"{r['fps'] / one:.2f}" if one else "-"
    extra = f" (windows overlap {100 * r['overlap']:.0f}%)" if "overlap" in r else ""
    busy = "n/a" if r.get("nvdec_busy") is None else f"{100 * r['nvdec_busy']:.0f}%"
    return (f"| {r['sessions']} | {r['fps']:.0f}{extra} | {r['fps_per_session']:.0f} | {ratio} | "
            f"{r['min_stream_fps']:.0f} | {busy} | {r['decoders_opened_per_s']:.1f} | {host['decode']:.2f} / "
            f"{host['copy']:.2f} / {host['sync']:.2f} | {gil_text} | {order} |")


class Run:
    """The report as it stands, rewritten (markdown and JSON) after every part."""

    def __init__(self, out: Path, env: dict[str, str]) -> None:
        self.out, self.env = out, env
        self.sections: list[str] = []
        self.data: dict[str, Any] = {"environment": env, "scaling": {}, "open": {}, "failed": []}
        out.mkdir(parents=True, exist_ok=True)

    def part(self, title: str, needs: float, budget: Budget, fn: Callable[[], list[str]]) -> None:
        print(f"\n== {title}", flush=True)
        started = time.perf_counter()
        if budget.left < needs:
            lines = [f"skipped: {budget.left:.0f} s left of the budget, the part needs ~{needs:.0f} s"]
        else:
            try:
                lines = fn()
            except Exception as exc:  # this part fails alone: the next one runs
                traceback.print_exc()
                self.data["failed"].append(f"{title}: {type(exc).__name__}: {exc}")
                lines = [f"**FAILED**: {_cell(f'{type(exc).__name__}: {exc}')}"]
        lines.append(f"\n({time.perf_counter() - started:.0f} s)")
        print("\n".join(lines), flush=True)
        self.sections.append("\n".join([f"## {title}", "", *lines, ""]))
        self.write()

    def write(self) -> None:
        head = ["# NVDEC scaling (issue 27)", "", *(f"- {k}: {v}" for k, v in self.env.items()), ""]
        (self.out / "nvdec_scaling.md").write_text("\n".join([*head, *self.sections]) + "\n")
        (self.out / "nvdec_scaling.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def _spec(args: argparse.Namespace, variant: Variant) -> PoolSpec:
    return PoolSpec(args.device_kind, variant.options, workers=variant.workers)


def _grown(args: argparse.Namespace, variant: Variant, n: int, held: list[Any]) -> Any:
    """The variant's ProcessDecodePool with ``n`` sessions: opened once (its workers started once), grown
    by the sessions the next point adds; reopened when a point asks for fewer."""
    from streamrt.video.decode_processes import ProcessDecodePool

    if held and len(held[0].sources()) > n:
        held.pop().close()
    if not held:
        processes = min(variant.handover, max(args.session_counts))  # the CPU smoke run: no idle workers
        held.append(ProcessDecodePool([], processes=processes, kind=args.device_kind, slots=4, loop=True,
                                      options=variant.options))
    pool = held[0]
    have = len(pool.sources())
    pool.add_many([(args.paths[i % len(args.paths)], 0) for i in range(have, n)])
    return pool


def part_scaling(args: argparse.Namespace, name: str, budget: Budget, run: Run,
                 executors: dict[int, ProcessPoolExecutor]) -> list[str]:
    variant = VARIANTS[name]
    handover: list[Any] = []  # the variant's ProcessDecodePool, closed with the variant
    try:
        return _scaling(args, name, variant, budget, run, executors, handover)
    finally:
        for pool in handover:
            pool.close()


def _scaling(args: argparse.Namespace, name: str, variant: Variant, budget: Budget, run: Run,
             executors: dict[int, ProcessPoolExecutor], handover: list[Any]) -> list[str]:
    spec = _spec(args, variant)
    lines = [f"{variant.what}.", "", *SCALING_HEADER]
    rows: list[dict[str, Any]] = run.data["scaling"].setdefault(name, [])
    one: float | None = None
    for n in args.session_counts:
        needs = args.seconds + args.warmup + args.open_cost * n + 2
        if budget.left < needs:
            lines.append(f"| {n} | skipped: {budget.left:.0f} s left, the point needs ~{needs:.0f} s |" + " |" * 8)
            continue
        try:
            if variant.handover:
                r = drain(_grown(args, variant, n, handover), args.seconds, args.warmup)
            elif variant.processes:
                if variant.processes not in executors:
                    executors[variant.processes] = ProcessPoolExecutor(
                        variant.processes, mp_context=multiprocessing.get_context("spawn"))
                    started = start_processes(executors[variant.processes], variant.processes, spec.kind)
                    lines.insert(1, f"({started} worker processes started and warmed before the first point.)")
                r = drain_in_processes(executors[variant.processes], min(variant.processes, n), spec, args.paths,
                                       n, args.seconds, args.warmup, args.open_cost)
            else:
                with spec.open(args.paths, sessions=n) as pool:
                    r = drain(pool, args.seconds, args.warmup)
        except Exception as exc:  # e.g. sessions that cannot open: this point fails, the next count runs
            traceback.print_exc()
            run.data["failed"].append(f"scaling {name} {n}: {type(exc).__name__}: {exc}")
            lines.append(f"| {n} | FAILED: {_cell(f'{type(exc).__name__}: {exc}')} |" + " |" * 8)
            continue
        one = one or (r["fps"] if n == 1 else None)
        rows.append(r)
        lines.append(_row(r, one))
        print(lines[-1], flush=True)
        run.write()
    if variant.processes and variant.processes in executors:
        # the workers' CUDA contexts and decoders go with the variant: on the H200 (2026-12-02) the
        # p4 and p8 workers left alive made every later part fail to create a decoder
        executors.pop(variant.processes).shutdown(wait=True, cancel_futures=True)
    if rows:
        best = max(rows, key=lambda r: r["fps"])
        lines += ["", f"- best: {best['fps']:.0f} frames/s at {best['sessions']} sessions "
                      f"(= {best['fps'] / FPS:.0f} streams at 30 FPS)."]
    return lines


def part_open(args: argparse.Namespace, names: list[str], budget: Budget, run: Run) -> list[str]:
    lines = [f"Sessions opened one at a time (up to {args.open}), free device memory (cudaMemGetInfo) read before "
             f"and after each (a session's count includes the ~3 pictures of 3 MiB its queue holds, in torch's "
             f"allocator), then {args.open_frames} frames read from every open stream in turn.", "",
             "| variant | opened | stopped by | MiB per session (median / max) | MiB in all | open s | frames read | "
             "in order | first error |", "|---|---:|---|---|---:|---:|---:|---|---|"]
    for name in names:
        share = budget.left / max(1, len(names) - names.index(name)) - 5
        try:
            r = open_sessions(_spec(args, VARIANTS[name]), args.paths, args.open,
                              deadline=time.perf_counter() + share, frames=args.open_frames,
                              log=lambda text: print(text, flush=True))
        except Exception as exc:  # the variant fails alone
            traceback.print_exc()
            run.data["failed"].append(f"open {name}: {type(exc).__name__}: {exc}")
            lines.append(f"| {name} | FAILED: {_cell(f'{type(exc).__name__}: {exc}')} |" + " |" * 7)
            continue
        run.data["open"][name] = r
        mib = ("-" if r["mib_per_session_median"] is None
               else f"{r['mib_per_session_median']:.0f} / {r['mib_per_session_max']:.0f}")
        total = "-" if r["mib_total"] is None else f"{r['mib_total']:.0f}"
        order = f"{r['in_order']}/{r['opened']}" + ("" if r["order_known"] else " (no pts)")
        lines.append(f"| {name} | {r['opened']} | {r['stopped']} | {mib} | {total} | {r['open_s']:.1f} | "
                     f"{r['frames_read']} | {order} | {_cell(r['error']) or '-'} |")
        print(lines[-1], flush=True)
        run.write()
    return lines


def part_summary(args: argparse.Namespace, run: Run) -> list[str]:
    """Each variant against the targets: >= 4,000 frames/s, flat (never falling) from 7 sessions on, 200 open."""
    lines = ["| variant | best frames/s (sessions) | from 7 sessions on: lowest / highest | falls past its best | "
             "opened | MiB per session |", "|---|---|---|---|---:|---:|"]
    for name in {**run.data["scaling"], **run.data["open"]}:  # a variant of the open test alone has a row too
        rows = run.data["scaling"].get(name) or []
        opened = run.data["open"].get(name, {})
        if not rows and not opened:
            continue
        measured = "- | - | -"
        if rows:
            best = max(rows, key=lambda r: r["fps"])
            late = [r["fps"] for r in rows if r["sessions"] >= 7]
            flat = f"{min(late):.0f} / {max(late):.0f}" if late else "-"
            after = [r["fps"] for r in rows if r["sessions"] > best["sessions"]]
            falls = f"yes, to {min(after):.0f}" if after and min(after) < 0.9 * best["fps"] else "no"
            measured = f"{best['fps']:.0f} ({best['sessions']}) | {flat} | {falls}"
        mib = opened.get("mib_per_session_median")
        lines.append(f"| {name} | {measured} | {opened.get('opened', '-')} | {'-' if mib is None else f'{mib:.0f}'} |")
    lines += ["", f"Targets (issue 27): >= 4,000 frames/s, flat from 7 to 56 sessions, {args.open} sessions open."]
    return lines


def _environment(args: argparse.Namespace, argv: list[str] | None) -> dict[str, str]:
    from streamrt.profiling.provenance import git_commit

    env = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": os.environ.get("STREAMRT_COMMIT") or git_commit(),
           "command": " ".join(["python", *(sys.argv if argv is None else ["gpu_nvdec_scaling.py", *argv])]),
           "python": platform.python_version(), "cores": str(os.cpu_count()),
           "clips": ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in args.paths)}
    if args.device_kind == "cpu":
        env["device"] = "CPU; OpenCV decoders stand in for NVDEC"
        return env
    import PyNvVideoCodec as nvc
    import torch

    env["device"] = f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    env["pynvvideocodec"] = str(getattr(nvc, "__version__", "?"))
    try:
        demuxer = nvc.CreateDemuxer(filename=str(args.paths[0]))
        caps = nvc.GetDecoderCaps(gpuid=0, codec=demuxer.GetNvCodecId(), chromaformat=demuxer.ChromaFormat(),
                                  bitdepth=demuxer.BitDepth())
        env["decoder engines"] = str(caps.get("num_decoder_engines", "?"))
    except Exception as exc:  # an older build without GetDecoderCaps: the report says so
        env["decoder engines"] = f"unknown ({type(exc).__name__})"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--clips", type=Path, default=ROOT / "build" / "video-clips")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the smoke run, OpenCV decoders standing in for NVDEC")
    parser.add_argument("--quick", action="store_true", help="few, short points (with --device cpu: seconds)")
    parser.add_argument("--sessions", default="1,2,4,7,8,14,28,56")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of: {', '.join(VARIANTS)}")
    parser.add_argument("--open", type=int, default=200, help="sessions to open at once in the open test")
    parser.add_argument("--open-variants", default="primary+reuse,legacy")
    parser.add_argument("--open-frames", type=int, default=10, help="frames read per stream once all are open")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--open-cost", type=float, default=0.15, help="seconds assumed per session opened (budget)")
    parser.add_argument("--budget", type=float, default=360.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    budget = Budget(args.budget)
    args.device_kind = "nvdec" if args.device == "cuda" else "cpu"
    unknown = [v for v in [*args.variants.split(","), *args.open_variants.split(",")] if v and v not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; variants are {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    if args.quick:
        args.sessions, args.seconds, args.warmup, args.open = "1,2", 0.3, 0.1, min(args.open, 3)
        args.open_frames = min(args.open_frames, 3)
    if args.device == "cuda":
        from streamrt.video.decode_nvdec import nvdec_available

        if not nvdec_available():
            print("needs a CUDA GPU and PyNvVideoCodec (pip install the pynvvideocodec wheel); "
                  "--device cpu --quick is the CPU smoke run", file=sys.stderr)
            return 2
    args.paths = sorted(args.clips.glob("*.mp4"))
    if not args.paths and args.device == "cpu":
        args.paths = _smoke_clips(args.out / "clips")
    if not args.paths:
        print(f"no clips in {args.clips}: run scripts/make_video_clips.py where PyAV is", file=sys.stderr)
        return 2
    args.session_counts = [int(v) for v in args.sessions.split(",") if v.strip()]
    variants = [v for v in args.variants.split(",") if v]
    opens = [v for v in args.open_variants.split(",") if v]
    run = Run(args.out, _environment(args, argv))
    executors: dict[int, ProcessPoolExecutor] = {}
    try:
        for name in variants:
            run.part(f"Scaling: {name}", args.seconds + 3, budget,
                     lambda name=name: part_scaling(args, name, budget, run, executors))  # type: ignore[misc]
        if opens and args.open:  # last: a variant whose closed sessions keep their contexts starves what follows
            run.part(f"Open {args.open} sessions at once", 10, budget, lambda: part_open(args, opens, budget, run))
        run.part("Summary", 0, budget, lambda: part_summary(args, run))
    finally:
        for executor in executors.values():
            executor.shutdown(wait=False, cancel_futures=True)
    run.data["variants"] = {k: {"what": v.what, **asdict(v)} for k, v in VARIANTS.items() if k in variants + opens}
    run.write()
    print(f"\nwrote {args.out}/nvdec_scaling.md")
    return 1 if run.data["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
