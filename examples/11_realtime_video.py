"""11: real-time detection at 30 FPS on a video file.

A camera delivers a frame every 33 ms. Real time means two things: the pipeline keeps up (no
frame dropped) and each frame's result arrives soon enough (p99 latency under a budget, 100 ms
here). ``paced=True`` replays a file the way a camera would: frames become available at 30 FPS,
and a frame that cannot be taken in time is dropped, as a live source would drop it.

The script writes a 30 FPS clip of moving shapes, measures how fast the detector can run on it
free-running (the capacity), then runs it camera-paced and reports drops and latency, writes the
annotated video, and plots each frame's latency against the 33 ms frame interval and the budget.
The pipeline is the one ``streamrt detect`` picks for this machine.

    python examples/11_realtime_video.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import time

import _common
import cv2
import matplotlib.pyplot as plt

from streamrt.video import (
    DetectConfig,
    SyntheticClip,
    VideoFileSource,
    VideoSink,
    bundled_model,
    open_detector,
    run_detection,
)
from streamrt.video.tuning import default_pipeline, lane_options

args = _common.parse_args("11", __doc__)
cuda = args.device == "cuda"
width, height, seconds = (640, 360, 2) if args.small else ((1920, 1080, 10) if cuda else (1280, 720, 5))

# A video file: what a camera recorded. (mp4v here; `streamrt detect --out x.mp4` writes H.264.)
clip = SyntheticClip(width=width, height=height, frames=30 * seconds, fps=30.0, seed=3)
video = args.out / f"camera_{width}x{height}.mp4"
writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 30.0, (width, height))
for frame in clip:
    writer.write(frame)
writer.release()
print(f"wrote {video}: {clip.frames} frames {width}x{height} at 30 FPS")

pipeline = default_pipeline(cuda)
backend = _common.backend_for(args.device)
detector = open_detector(bundled_model(), backend=backend, options=lane_options(backend, pipeline, cuda))

# 1. Capacity: as fast as it goes (decoding included).
free = run_detection(detector, [VideoFileSource(video)], DetectConfig(pipeline=pipeline.replace(trace=False),
                                                                      warmup_frames=10))
print(f"capacity: {free.fps:.0f} FPS free-running ({free.label}); 30 FPS needs {100 * 30 / free.fps:.0f}% of it")

# 2. Camera-paced at 30 FPS: frames arrive on the clock; late frames drop.
latency_ms: list[tuple[int, float]] = []
sink = VideoSink(args.out / "annotated.mp4", fps=30.0, size=(width, height), names=detector.names)


def on_result(frame, detections) -> None:
    latency_ms.append((frame.index, (time.perf_counter() - frame.captured) * 1e3))
    sink(frame, detections)


paced = run_detection(detector, [VideoFileSource(video)],
                      DetectConfig(pipeline=pipeline.replace(trace=False), paced=True, fps=30.0), on_result=on_result)
sink.close()
print(paced.format_text())
print(f"wrote {args.out / 'annotated.mp4'}")
verdict = "real time" if paced.sustained else "NOT real time: see the capacity above"
print(f"=> {verdict} ({paced.dropped} dropped, p99 {paced.latency_ms.get('p99', float('nan')):.1f} ms)")

fig, ax = plt.subplots(figsize=(9, 3.5))
ax.plot(*zip(*latency_ms, strict=True), ".", ms=3, label="frame latency")
ax.axhline(1000 / 30, c="C1", ls="--", label="frame interval (33 ms)")
ax.axhline(100, c="C3", ls="--", label="latency budget (100 ms)")
ax.set(xlabel="frame", ylabel="ms", title=f"camera-paced 30 FPS on {detector.device}: {paced.dropped} dropped")
ax.legend()
_common.save(fig, args.out / "realtime.png")
