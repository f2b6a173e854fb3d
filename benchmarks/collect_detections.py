"""The detector's last step per engine call, side by side: each frame's detections mapped to frame pixels one frame
at a time (a copy and a mapping per frame, the way until 2026-12-06) against the whole batch at once
(:func:`streamrt.video.workload.split_detections`).

Issue 27: in the seventh session's profile of ``streamrt detect --hybrid`` at 161 streams on an H100, the consumer's
run loop held the GIL in 20% of the run's samples, a third of that in ``LetterboxGeometry.to_source`` called per
frame. Both ways run on the same random detections (1080p frames, a 640x640 model, 300 rows per frame of which a
random 0-39 are kept); their outputs are checked equal before timing. Rounds alternate the two ways.

Usage (from the repository root)::

    python benchmarks/collect_detections.py [--batches 1,8,32,128] [--rounds 400] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from streamrt.ops.letterbox import LetterboxGeometry  # noqa: E402
from streamrt.video.workload import Detections, split_detections  # noqa: E402

MAX_DET = 300


def per_frame(frames: list[Any], dets: np.ndarray, counts: np.ndarray, geometry: LetterboxGeometry) -> list[Any]:
    """The way before: each frame's rows copied, mapped and typed on their own."""
    out = []
    for b, frame in enumerate(frames):
        kept = dets[b, : int(counts[b])].copy()
        geometry.to_source(kept[:, :4])
        out.append(Detections(frame.source, frame.index, kept[:, :4], kept[:, 4], kept[:, 5].astype(np.int64),
                              frame.captured))
    return out


WAYS: dict[str, Callable[..., list[Any]]] = {"per frame": per_frame, "whole batch": split_detections}


def batch_of(size: int, rng: np.random.Generator) -> tuple[list[Any], np.ndarray, np.ndarray]:
    dets = (rng.random((size, MAX_DET, 6)) * 660 - 10).astype(np.float32)
    dets[..., 5] = rng.integers(0, 80, (size, MAX_DET))
    counts = rng.integers(0, 40, size).astype(np.int32)
    frames = [SimpleNamespace(source=b, index=b, captured=0.0) for b in range(size)]
    return frames, dets, counts


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x.boxes, y.boxes) and np.array_equal(x.scores, y.scores) and np.array_equal(x.classes, y.classes)
        for x, y in zip(a, b, strict=True))


def time_way(way: Callable[..., list[Any]], batch: tuple[list[Any], np.ndarray, np.ndarray],
             geometry: LetterboxGeometry, calls: int) -> float:
    """Microseconds per frame over ``calls`` calls."""
    frames, dets, counts = batch
    started = time.perf_counter()
    for _ in range(calls):
        way(frames, dets, counts, geometry)
    return (time.perf_counter() - started) / calls / len(frames) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,8,32,128", help="engine batch sizes (frames per call)")
    parser.add_argument("--rounds", type=int, default=400, help="timed rounds per way and batch (20 calls each)")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    geometry = LetterboxGeometry.fit((1080, 1920), (640, 640))
    table = ["| batch | way | us per frame (median) | p90 | speed-up |", "|---:|---|---:|---:|---:|"]
    for size in (int(b) for b in args.batches.split(",")):
        batch = batch_of(size, rng)
        outputs = [way(*batch, geometry) for way in WAYS.values()]
        if not same(*outputs):
            print(f"batch {size}: the two ways disagree", file=sys.stderr)
            return 1
        runs: dict[str, list[float]] = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, way in WAYS.items():
                runs[name].append(time_way(way, batch, geometry, 20))
        base = statistics.median(runs["per frame"])
        for name, times in runs.items():
            median = statistics.median(times)
            p90 = sorted(times)[int(0.9 * (len(times) - 1))]
            ratio = "" if name == "per frame" else f"{base / median:.2f}x"
            table.append(f"| {size} | {name} | {median:.2f} | {p90:.2f} | {ratio} |")
    text = "\n".join(table)
    print(text)
    if args.out:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/collect_detections.py", *(argv or sys.argv[1:])], ROOT)
        args.out.write_text("\n".join([
            "# A batch's detections to frame pixels: per frame vs the whole batch at once", "", *header,
            f"- rounds: {args.rounds} per way and batch, 20 calls each, the two ways alternating; {MAX_DET} rows per "
            "frame, 0-39 kept; outputs checked equal first", "", text, ""]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
