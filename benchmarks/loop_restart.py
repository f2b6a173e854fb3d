"""What a looped CPU-decoded stream pays at the end of its file: a new open against a rewind, side by side.

Issue 27: in the hybrid runs of 2026-12-06 on an H100 (``gpu_video_check.py --parts 5 --hybrid-starts
lockstep``), where every clip ends at the same moment, the few frames dropped were on CPU-decoded streams:
each of them closed its file and opened it again (PyAV probes the file and builds a decoder), while its
decoder process, planned at 85% of its core, had a few frames of slack. ``AvSource.rewind`` seeks the same
container back to its first keyframe instead (:func:`streamrt.video.decoding.start_over`).

For each clip, rounds alternate the two ways of starting over, each timed from the end of the file to the
first picture of the next pass in NV12 (what the decoder processes deliver); the table gives the medians
and the ratio.

Usage (from the repository root)::

    python benchmarks/loop_restart.py [--clips build/video-clips] [--rounds 20] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from streamrt.video.decoding import open_nv12, start_over  # noqa: E402


def reopen(source: Any, path: Path) -> Any:
    """The way before: close the decoder, open the file again."""
    source.close()
    return open_nv12(path)


WAYS: dict[str, Callable[[Any, Path], Any]] = {
    "reopen (close, open again)": reopen,
    "rewind (seek the same file)": lambda source, path: start_over(source, lambda: open_nv12(path)),
}


def time_restart(path: Path, way: Callable[[Any, Path], Any], rounds: int) -> list[float]:
    """Milliseconds from a drained file to the next pass's first picture, ``rounds`` times."""
    source = open_nv12(path)
    out = []
    try:
        for _ in range(rounds):
            while source.read() is not None:  # to the end of the file
                pass
            started = time.perf_counter()
            source = way(source, path)
            if source.read() is None:
                raise RuntimeError(f"{path.name}: no picture after starting over")
            out.append(1e3 * (time.perf_counter() - started))
    finally:
        source.close()
    return out


def smoke_clip(folder: Path) -> Path:
    """A short H.264 clip made here (the smoke run needs no clips from scripts/make_video_clips.py)."""
    from streamrt.video.clips import encode_clip
    from streamrt.video.synthetic import SyntheticClip

    return encode_clip(SyntheticClip(width=320, height=176, frames=8, fps=30.0, seed=3), folder / "smoke.mp4")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=Path, default=None,
                        help="folder of .mp4 clips (default: a small one made here)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="streamrt-loop-") as tmp:
        clips = sorted(args.clips.glob("*.mp4")) if args.clips else [smoke_clip(Path(tmp))]
        if not clips:
            print(f"no .mp4 clips in {args.clips}", file=sys.stderr)
            return 2
        table = ["| clip | way | restart ms (median) | p90 ms | x reopen |", "|---|---|---:|---:|---:|"]
        for path in clips:
            runs: dict[str, list[float]] = {name: [] for name in WAYS}
            for _ in range(2):  # interleaved halves: both ways see the same machine state
                for name, way in WAYS.items():
                    runs[name] += time_restart(path, way, max(1, args.rounds // 2))
            base = statistics.median(runs[next(iter(WAYS))])
            for name, times in runs.items():
                median = statistics.median(times)
                p90 = sorted(times)[int(0.9 * (len(times) - 1))]
                ratio = "" if name == next(iter(WAYS)) else f"{base / median:.1f}x faster"
                table.append(f"| {path.name} | {name} | {median:.2f} | {p90:.2f} | {ratio} |")
    text = "\n".join(table)
    print(text)
    if args.out:
        from streamrt.profiling.provenance import report_header

        header = report_header(["python", "benchmarks/loop_restart.py", *(argv or sys.argv[1:])], ROOT)
        args.out.write_text("\n".join(["# Starting a looped CPU-decoded file over: reopen vs rewind", "", *header,
                                       f"- rounds: {args.rounds} per way and clip (two interleaved halves); each "
                                       "timed from the drained file to the next pass's first NV12 picture", "",
                                       text, ""]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
