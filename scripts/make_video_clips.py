"""Make the compressed test clips the GPU machine decodes: synthetic scenes encoded with libx264 (or x265).

Run on the CPU machine before a GPU session; the clips are a pure function of the seeds, so the
same command makes the same clips anywhere. Defaults: 3 clips of 10 s, 1920x1080 at 30 FPS, H.264
CRF 28 (about 4 Mbit/s on these scenes: 4.3, 5.1 and 5.4 MB, ~15 MB in all), one keyframe per second,
no B-frames.

It cannot run on the GPU machine: encoding needs PyAV (libx264), which is not installed there, and
an H200 has no NVENC for PyNvVideoCodec to encode with. Carrying PyAV's wheel (36 MB) next to
PyNvVideoCodec's (27 MB) would fill the 64 MiB carry to make clips that weigh 15 MB, so the clips
are made here (seconds) and carried in ``build/video-clips``.

Usage::

    python scripts/make_video_clips.py build/video-clips          # ~10 s on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from streamrt.video.clips import encode_clip
from streamrt.video.synthetic import SyntheticClip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", default=Path("build/video-clips"))
    parser.add_argument("--clips", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--size", default="1920x1080")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--codec", default="h264", choices=("h264", "h265"))
    parser.add_argument("--crf", type=int, default=28)
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    for i in range(args.clips):
        started = time.perf_counter()
        clip = SyntheticClip(width=width, height=height, frames=round(args.seconds * args.fps), fps=args.fps,
                             seed=100 + i)
        path = encode_clip(clip, args.out / f"clip{i}-{args.codec}-{width}x{height}.mp4", codec=args.codec,
                           crf=args.crf)
        print(f"{path}: {clip.frames} frames, {path.stat().st_size / 1e6:.1f} MB, "
              f"{time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
