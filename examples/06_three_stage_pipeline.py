"""06: the three-stage pipeline: pre-processing, inference and NMS on their own streams.

Detection per frame is three steps: letterbox + normalise (pre), the network (engine), decode +
NMS (post). The synchronous loop runs them one after another, so the engine idles while a frame
is prepared and NMS'd. The pipeline gives each stage its own stream and chains them per frame by
events: pre of frame k+1, engine of frame k and post of frame k-1 run at the same time, over a
ring of pre-allocated slots (no allocation, no host synchronisation in the steady state).

``DetectionWorkload`` is that stage table for StreamRT's bundled detector (its ``stages()`` are
printed below); ``Pipeline.from_workload`` runs it with any topology. The traces show each stage
on its stream: the synchronous loop as one row, the pipeline as overlapping rows.

    python examples/06_three_stage_pipeline.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import _common
import matplotlib.pyplot as plt

from streamrt.device import get_device
from streamrt.pipeline import Pipeline, PipelineConfig
from streamrt.video import DetectionWorkload, Frame, SyntheticClip, bundled_model, open_detector

args = _common.parse_args("06", __doc__)
device = get_device(args.device)
detector = open_detector(bundled_model(), backend=_common.backend_for(args.device))
clip = SyntheticClip(width=640, height=360, frames=24 if args.small else 120, seed=0)
frames = [[Frame(0, i, image)] for i, image in enumerate(clip)]  # one item = the frames of one engine call
workload = DetectionWorkload(detector, (clip.height, clip.width))

print(f"{'stage':<8} {'kind':<8} stream")
for stage in workload.stages():
    print(f"{stage.name:<8} {stage.kind.value:<8} {stage.group}")

configs = {
    "synchronous loop": PipelineConfig(topology="sync", trace=True),
    # one stream per stage, 4 frames in flight (CUDA graphs replay pre/engine/post on a GPU)
    "pipeline": PipelineConfig(topology="streams", ring_size=4, cuda_graphs=device.is_cuda, trace=True),
}
traces = {}
for name, config in configs.items():
    with Pipeline.from_workload(workload, config, device=device) as pipe:
        for result in pipe.map(frames[:4]):  # warm-up: first calls pay one-time costs
            result.unwrap()
        pipe.reset_trace()
        detections = [result.unwrap() for result in pipe.map(frames)]
        traces[name] = pipe.trace()
    boxes = sum(len(d) for per_item in detections for d in per_item)
    print(f"{name:<17} {traces[name].items_per_s:7.1f} frames/s, {boxes} boxes in {len(frames)} frames")

fig, axes = plt.subplots(2, 1, figsize=(10, 5.5))
for ax, (name, trace) in zip(axes, traces.items(), strict=True):
    origin = trace.start_ms or 0.0
    last = origin + (trace.wall_ms if len(frames) <= 24 else trace.wall_ms * 24 / len(frames))
    spans = [(s.track.removeprefix("streamrt:"), s.start_ms - origin, s.end_ms - origin, s.stage)
             for s in trace.spans if s.kind != "enqueue" and s.start_ms <= last]
    _common.plot_timeline(ax, spans, f"{name}: {trace.items_per_s:.0f} frames/s (first frames)")
print(f"speed-up of the pipeline: {traces['pipeline'].items_per_s / traces['synchronous loop'].items_per_s:.2f}x "
      "(one run; `streamrt demo` repeats and reports the spread)")
_common.save(fig, args.out / "pipeline_timeline.png")
