"""07: CUDA graphs: replaying a whole forward pass with one launch.

Every kernel launch costs the host a few microseconds. A small model at batch 1 runs hundreds of
tiny kernels, each finishing faster than the CPU can launch the next: the GPU waits on Python.
Such a model is *launch-bound*. A CUDA graph records the launches once (capture) and replays them
with one call, so the host cost no longer grows with the number of kernels. The price: shapes and
buffer addresses are frozen at capture time (StreamRT captures per pipeline slot, whose buffers
are fixed, and plans capture per profile shape).

Part 1 times a stack of tiny layers at batch 1 as the stack grows: eager, and on a GPU replayed as
a graph. Part 2 (GPU) builds a StreamRT plan with and without ``backend_options={"cuda_graphs":
True}``. On the CPU, part 1 shows the per-layer host cost that graphs remove on a GPU, and part 2
is skipped: graphs are a CUDA feature.

    python examples/07_cuda_graphs.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import _common
import matplotlib.pyplot as plt
import onnx
import torch
from torch import nn

import streamrt
from streamrt.running.inputs import to_device
from streamrt.testing.calib import synthetic_images
from streamrt.testing.models import CATALOGUE, small_cnn

args = _common.parse_args("07", __doc__)
dev = torch.device(args.device)
depths = [4, 16, 64] if args.small else [4, 16, 64, 256]
eager, graphed = [], []
for depth in depths:
    layers = [m for _ in range(depth) for m in (nn.Linear(64, 64), nn.ReLU())]
    model = nn.Sequential(*layers).to(dev).eval()
    x = torch.randn(1, 64, device=dev)
    with torch.no_grad():
        eager.append(_common.median_ms(lambda m=model, x=x: m(x), args.device) * 1e3 / depth)
        if args.device == "cuda":
            side = torch.cuda.Stream()  # capture must not run on the default stream
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(x)  # warm up: kernels chosen and loaded before capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = model(x)  # recorded, not run; y is the graph's output buffer
            graph.replay()
            assert torch.allclose(y, model(x)), "replay must compute what eager computes"
            graphed.append(_common.median_ms(graph.replay, args.device) * 1e3 / depth)
    line = f"{depth:4d} layers: eager {eager[-1]:6.2f} us/layer"
    print(line + (f", graph replay {graphed[-1]:6.2f} us/layer" if graphed else ""))

# Part 2: the same switch on a StreamRT plan (the GPU backend captures each profile's shape).
plan_rows = {}
if args.device == "cuda":
    onnx_path = args.out / "cnn.onnx"
    onnx.save(small_cnn(), onnx_path)
    feeds = to_device({"x": synthetic_images(1, 3, 32, 32)}, "cuda")
    for graphs in (False, True):
        config = streamrt.BuildConfig(backend="torch_inductor", profiles=CATALOGUE["small_cnn"].profiles,
                                      backend_options={"cuda_graphs": graphs})
        engine = streamrt.load(streamrt.build(onnx_path, config, args.out / f"cnn-graphs-{graphs}.plan").path)
        ctx = engine.create_context()
        plan_rows["plan + CUDA graphs" if graphs else "plan"] = _common.median_ms(lambda c=ctx: c.infer(feeds), "cuda")
    for name, ms in plan_rows.items():
        print(f"{name:<20} {ms * 1e3:8.1f} us per batch-1 call")
else:
    print("part 2 skipped: CUDA graphs need a GPU (run with --device cuda there)")

fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(depths, eager, "o-", label=f"eager ({args.device})")
if graphed:
    ax.plot(depths, graphed, "o-", label="CUDA graph replay")
ax.set(xscale="log", xlabel="layers (Linear 64 + ReLU), batch 1", ylabel="us per layer",
       title="host cost per layer: what a graph removes")
ax.legend()
_common.save(fig, args.out / "graphs.png")
