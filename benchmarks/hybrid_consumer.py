"""Benchmark: what hybrid decoding's CPU streams cost the consumer process, threads vs decoder processes.

The same ``--streams`` looped clips, all planned on the CPU side of a
:class:`~streamrt.video.hybrid.HybridDecode`, read live at ``--fps`` each the way the detector reads them
(:func:`streamrt.video.runner._live_streams`, ``live_reader="auto"``), two ways:

- ``threads``: ``decode_processes=0``, each CPU stream a decoder on a thread of this process (a
  ``Prefetch``) and a ``LiveStream`` thread per stream (what the H200 run of 185 streams did);
- ``processes``: ``decode_processes=1``, the CPU streams in ``cpu_processes`` decoder processes and every
  stream read by one ``LiveGroup`` thread.

Meanwhile the main thread plays the consumer: it takes every queued frame round-robin and runs pure-Python
work between turns; its work rate is the share of the GIL the decoding leaves to the thread that would feed
the engine. Rounds interleaved, medians reported, with the ratio processes / threads.

Usage::

    python benchmarks/hybrid_consumer.py --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from streamrt.video import DetectConfig
from streamrt.video.clips import encode_clip
from streamrt.video.hybrid import HybridDecode
from streamrt.video.runner import _live_streams
from streamrt.video.synthetic import SyntheticClip

VARIANTS = ("threads", "processes")


def _clip(folder: Path, width: int, height: int) -> Path:
    path = folder / f"hybrid-bench-{width}x{height}.mp4"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        encode_clip(SyntheticClip(width=width, height=height, frames=90, seed=7), path)
    return path


def _round(variant: str, clip: Path, streams: int, fps: float, seconds: float) -> dict[str, float]:
    processes = 1 if variant == "processes" else 0
    capacity = {"nvdec": 0.0, "cpu": 1e6}  # every stream on the CPU side
    with HybridDecode([clip] * streams, capacity=capacity, loop=True, interval_s=0, decode_processes=processes,
                      cpu_processes=1, process_kind="cpu") as hybrid:
        config = DetectConfig(paced=True, live=True, fps=fps, queue_depth=2)
        wake = threading.Condition()
        live = _live_streams(hybrid.sources(), config, fps, wake, [0] * streams)
        for stream in live:
            stream.start()
        time.sleep(1.0)  # decoders started, queues filled once
        taken = work = 0
        threads = threading.active_count()
        before = sum(s.stats()["dropped"] for s in live)  # the warm-up's, nobody taking
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            for stream in live:
                if stream.take() is not None:
                    taken += 1
            x = 0
            for i in range(2000):  # the consumer's own Python work between turns
                x += i
            work += 1
        wall = time.perf_counter() - started
        dropped = sum(s.stats()["dropped"] for s in live) - before
        for stream in live:
            stream.stop()
    return {"work_per_s": work / wall, "frames_per_s": taken / wall, "dropped": float(dropped),
            "threads": float(threads)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--size", default="960x540")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="folder for the markdown result")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    clip = _clip(Path(os.environ.get("TMPDIR", "/tmp")) / "streamrt-bench", width, height)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS:  # interleaved: the machine's other load falls on both
            results[variant].append(_round(variant, clip, args.streams, args.fps, args.seconds))
            print(f"round {r} {variant}: {results[variant][-1]}", flush=True)
    med = {v: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for v, rows in results.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# Hybrid decode: the consumer beside CPU decoders, threads vs decoder processes ({args.size})", "",
             f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}", f"- commit: {commit}",
             f"- device: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores "
             "(CPU machine, shared)",
             f"- command: python benchmarks/hybrid_consumer.py --streams {args.streams} --fps {args.fps:g} --size "
             f"{args.size} --seconds {args.seconds:g} --rounds {args.rounds}",
             f"- {args.streams} streams of a {args.size} H.264 clip at {args.fps:g} FPS each, all on the CPU side; "
             f"medians of {args.rounds} interleaved rounds of {args.seconds:g} s", "",
             "| variant | consumer work/s | frames taken/s | dropped | consumer threads |", "|---|---:|---:|---:|---:|"]
    for v in VARIANTS:
        m = med[v]
        lines.append(f"| {v} | {m['work_per_s']:.0f} | {m['frames_per_s']:.1f} | {m['dropped']:.0f} | "
                     f"{m['threads']:.0f} |")
    ratio = med["processes"]["work_per_s"] / med["threads"]["work_per_s"]
    lines += ["", f"consumer work, processes / threads: **{ratio:.2f}x**"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / f"{datetime.now(timezone.utc):%Y-%m-%d}-hybrid-consumer-cpu.md"
        out.write_text(text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


