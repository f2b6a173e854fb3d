"""Benchmark: the host cost of the live consumer per frame at many camera-paced streams, no decoding, no GPU.

At 156 decode-included 1080p30 streams on an H100 (2026-12-06, ``streamrt detect --hybrid``) the GPU idled more than
20 ms between engine calls 34 times in 10 s (up to 63 ms) while the consumer thread was outside every traced stage,
and frames were dropped; GPU compute was 67% busy. What the consumer process does per frame besides the engine is
the :class:`~streamrt.video.live_group.LiveGroup` thread (pacing every stream, taking due pictures from the decoder
pool) and the round-robin consumer (:func:`streamrt.video.runner._live`: taking one frame per stream per turn,
submitting, handling results). This benchmark runs exactly those two with a pool whose pictures are always ready (a
small array each) and a stand-in pipeline whose calls finish ``--engine-ms`` after submission, and reports the
process's CPU time per frame (both threads), frames/s, drops and latency, at each ``--streams`` count, for the
current code. Its CPU ms per 1,000 frames is the figure to compare between commits.

Usage::

    python benchmarks/live_consumer.py --streams 40,160 --seconds 4 --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.profiling.provenance import git_commit
from streamrt.video.live_group import LiveGroup, ReadyPictures
from streamrt.video.runner import _live, _Tally
from streamrt.video.sources import SourceInfo


class ReadyPool:
    """A decoder pool whose every stream always has its next picture decoded (the consumer's cost alone)."""

    def __init__(self) -> None:
        self.picture = np.zeros((8, 8), np.uint8)
        self.taken = 0

    def take_ready(self, indices: Sequence[int]) -> ReadyPictures:
        self.taken += len(indices)
        return ReadyPictures([(i, self.picture, None) for i in indices], [], {})


class _Detections:
    """One frame's detections as the tally reads them: its source, index and box count (five a frame)."""

    def __init__(self, source: int, index: int) -> None:
        self.source, self.index = source, index

    def __len__(self) -> int:
        return 5


class _Result:
    def __init__(self, frames: list[Any]) -> None:
        self._dets = [_Detections(f.source, f.index) for f in frames]

    def unwrap(self) -> list[_Detections]:
        return self._dets


class StandInPipeline:
    """``submit``/``poll``/``in_flight`` of a pipeline whose calls finish ``engine_s`` after the previous one
    (one engine, calls in order), so ``calls_ahead`` and batching behave as on the GPU."""

    def __init__(self, engine_s: float) -> None:
        self.engine_s = engine_s
        self._pending: deque[tuple[float, list[Any]]] = deque()
        self._free_at = 0.0

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, frames: list[Any]) -> None:
        self._free_at = max(self._free_at, time.perf_counter()) + self.engine_s
        self._pending.append((self._free_at, list(frames)))

    def poll(self) -> list[_Result]:
        now, done = time.perf_counter(), []
        while self._pending and self._pending[0][0] <= now:
            done.append(_Result(self._pending.popleft()[1]))
        return done

    def get(self) -> _Result:
        due, frames = self._pending.popleft()
        time.sleep(max(0.0, due - time.perf_counter()))
        return _Result(frames)


class ScanningLiveGroup(LiveGroup):
    """The live group's loop before 2026-12-06 (``--groups scan``): every pass scanned all streams three times
    (due ones, live ones, the earliest next due) and passed every millisecond while a due picture was missing."""

    def _run(self) -> None:
        period = 1.0 / self.fps if self.fps > 0 else 0.0
        while not self._stop.is_set():
            with self.wake:
                now = time.perf_counter()
                due = [s.lane for s in self.streams if s.started and not s.finished and s.next_due(period) <= now]
            if due:
                self._take(due)
            with self.wake:
                live = [s for s in self.streams if s.started and not s.finished]
                if not live and all(s.started for s in self.streams):
                    return
                nxt = min((s.next_due(period) for s in live), default=None)
            delay = 0.001 if nxt is None else nxt - time.perf_counter()
            if due:
                delay = min(delay, 0.001)
            if delay > 0:
                self._stop.wait(delay)


GROUPS = {"heap": LiveGroup, "scan": ScanningLiveGroup}


def run_once(streams: int, fps: float, seconds: float, batch: int, engine_ms: float, pool: Any,
             group_kind: str = "heap") -> dict[str, Any]:
    """One run of ``streams`` paced streams of ``pool`` (a :class:`ReadyPool`, or a decoder pool already open),
    read by a live group of ``group_kind`` (:data:`GROUPS`)."""
    infos = [SourceInfo(f"cam{i}", 8, 8, fps, None) for i in range(streams)]
    frames = int(seconds * fps)
    group = GROUPS[group_kind](pool, list(range(streams)), infos, fps=fps, depth=4, wake=threading.Condition(),
                               max_frames=[frames] * streams)
    tally = _Tally(None, None, None)
    pipe = StandInPipeline(engine_ms / 1e3)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    _live(pipe, group.streams, tally, batch, list(range(streams)), [], ahead=2)  # type: ignore[arg-type]
    while pipe.in_flight:
        tally.handle(pipe.get())  # type: ignore[arg-type]
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    group.stop()
    dropped = sum(s.dropped for s in group.streams)
    lat = sorted(tally.latencies_ms)
    return {"streams": streams, "frames": tally.frames, "wall_s": wall, "fps": tally.frames / wall,
            "asked_fps": streams * fps, "dropped": dropped, "cpu_ms_per_1000": 1e6 * cpu / max(tally.frames, 1),
            "cpu_busy": cpu / wall, "calls": tally.calls, "frames_per_call": tally.frames / max(tally.calls, 1),
            "p99_ms": lat[int(0.99 * (len(lat) - 1))] if lat else float("nan")}


def _decoder_pool(streams: int, folder: Path) -> Any:
    """``streams`` looped 64x64 H.264 clips in one CPU decoder process (the decoder processes' hand-over: announce
    messages to the consumer's event thread, shared-memory slots, ``take_ready``, ``free_many``), decoding far
    faster than it is read, so the consumer's side is what is measured."""
    from streamrt.video.clips import encode_clip
    from streamrt.video.decode_processes import ProcessDecodePool
    from streamrt.video.synthetic import SyntheticClip

    clip = encode_clip(SyntheticClip(width=64, height=64, frames=60, fps=30.0), folder / "tiny.mp4")
    return ProcessDecodePool([clip] * streams, processes=1, kind="cpu", slots=4, loop=True)


def measure(pool_kind: str, streams: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per live group of ``args.groups``, medians of ``args.rounds`` runs at ``streams`` over a pool of ``pool_kind``
    (ready or processes); the groups' runs interleaved over one pool."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        pool: Any = ReadyPool() if pool_kind == "ready" else _decoder_pool(streams, Path(folder))
        try:
            runs = [(g, run_once(streams, args.fps, args.seconds, args.batch, args.engine_ms, pool, g))
                    for _ in range(args.rounds) for g in args.groups]
        finally:
            if pool_kind != "ready":
                pool.close()
    rows = []
    for group in args.groups:
        mine = [r for g, r in runs if g == group]
        rows.append({**{k: statistics.median(r[k] for r in mine) for k in mine[0]}, "pool": pool_kind,
                     "group": group})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="40,160", help="comma-separated stream counts")
    parser.add_argument("--fps", type=float, default=30.0, help="frames per second per stream")
    parser.add_argument("--seconds", type=float, default=4.0, help="each run's length")
    parser.add_argument("--rounds", type=int, default=3, help="runs per stream count (medians reported)")
    parser.add_argument("--batch", type=int, default=128, help="largest engine call")
    parser.add_argument("--engine-ms", type=float, default=7.0, help="the stand-in engine's time per call")
    parser.add_argument("--pools", default="ready", metavar="KIND,..",
                        help="ready: pictures always there (the live group and consumer alone); processes: a CPU "
                             "decoder process of tiny clips (its hand-over too; needs PyAV)")
    parser.add_argument("--groups", default="heap", metavar="KIND,..",
                        help="live group loops side by side: heap (the current one), scan (before 2026-12-06)")
    parser.add_argument("--out", type=Path, default=None, help="write the table as a markdown file here")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.streams.split(",")]
    pools = [p.strip() for p in args.pools.split(",") if p.strip()]
    if not pools or any(p not in ("ready", "processes") for p in pools):
        parser.error(f"--pools takes ready and/or processes, got {args.pools!r}")
    args.groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    if not args.groups or any(g not in GROUPS for g in args.groups):
        parser.error(f"--groups takes {' and/or '.join(GROUPS)}")
    rows = []
    for n, pool_kind in [(n, p) for n in counts for p in pools]:
        for row in measure(pool_kind, n, args):
            rows.append(row)
            print(f"{n} streams, {pool_kind} pool, {row['group']} group: {row['fps']:.0f} of {row['asked_fps']:.0f} "
                  f"frames/s, {row['dropped']:.0f} dropped, CPU {row['cpu_ms_per_1000']:.1f} ms per 1,000 frames "
                  f"({100 * row['cpu_busy']:.0f}% of a core), {row['frames_per_call']:.1f} frames per call, "
                  f"p99 {row['p99_ms']:.1f} ms", flush=True)
    table = ["| streams | pool | live group | frames/s (asked) | dropped | CPU ms per 1,000 frames | CPU busy "
             "| frames per call | p99 ms |", "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    table += [f"| {r['streams']:.0f} | {r['pool']} | {r['group']} | {r['fps']:.0f} ({r['asked_fps']:.0f}) "
              f"| {r['dropped']:.0f} | {r['cpu_ms_per_1000']:.1f} | {100 * r['cpu_busy']:.0f}% "
              f"| {r['frames_per_call']:.1f} | {r['p99_ms']:.1f} |" for r in rows]
    if len(args.groups) > 1:  # the consumer process's CPU per frame, each group against the first
        table.append("")
        base = args.groups[0]
        for n, pool_kind in [(n, p) for n in counts for p in pools]:
            same = {r["group"]: r for r in rows if r["streams"] == n and r["pool"] == pool_kind}
            ratios = ", ".join(f"{g} {same[g]['cpu_ms_per_1000'] / same[base]['cpu_ms_per_1000']:.2f}x"
                               for g in args.groups[1:])
            table.append(f"- {n} streams, {pool_kind} pool: CPU per frame against {base}: {ratios}")
    print("\n".join(table))
    if args.out is not None:
        stamp = datetime.now(timezone.utc)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{stamp:%Y-%m-%d}-live-consumer-cpu.md"
        path.write_text("\n".join([
            "# The live consumer's host cost per frame (LiveGroup + round-robin consumer, no decoding, no GPU)", "",
            f"- date: {stamp:%Y-%m-%d %H:%M} UTC", f"- commit: {git_commit()}",
            f"- device: {platform.machine()}, {os.cpu_count()} cores (CPU machine)",
            "- command: python benchmarks/live_consumer.py " + " ".join(sys.argv[1:] if argv is None else argv),
            f"- {args.fps:g} FPS per stream, stand-in engine {args.engine_ms:g} ms per call, batch <= {args.batch}, "
            f"medians of {args.rounds} runs of {args.seconds:g} s", "", *table, ""]))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
