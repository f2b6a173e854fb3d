"""01: export a PyTorch model to ONNX and build a plan with shape profiles.

A plan is compiled for a *range* of input shapes: the profile says the smallest (min), the most
common (opt: kernels are tuned for it) and the largest (max) shape each dynamic input may take.
This script exports a small CNN with a dynamic batch dimension, builds a plan for batches 1..32
tuned for 8, runs it at every batch size in the range, and plots latency and throughput.

    python examples/01_export_and_build.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import warnings

import _common
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

import streamrt
from streamrt.running.inputs import to_device

args = _common.parse_args("01", __doc__)

# 1. A PyTorch model: what you trained. Any nn.Module with tensor inputs works the same way.
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
).eval()

# 2. Export to ONNX with a *dynamic* batch dimension ("N"); without dynamic_axes the batch size of
#    the example input would be frozen into the graph. (The TorchScript exporter needs no extra
#    package; torch >= 2.9 prefers the torch.export one, which needs onnxscript.)
onnx_path = args.out / "cnn.onnx"
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.onnx.export(model, (torch.randn(2, 3, 32, 32),), str(onnx_path), input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, dynamo=False)
print(f"exported {onnx_path}")

# 3. Build a plan: one profile for batches 1..32, tuned for 8. The build is cached by content, so
#    running this script again reuses it.
profile = streamrt.ShapeProfile({"x": streamrt.ShapeRange(min=(1, 3, 32, 32), opt=(8, 3, 32, 32),
                                                          max=(32, 3, 32, 32))})
config = streamrt.BuildConfig(backend=_common.backend_for(args.device), profiles=(profile,))
result = streamrt.build(onnx_path, config, args.out / "cnn.plan")
print(f"built {result.path} with {config.backend} in {result.seconds:.1f} s (cached: {result.cached})")

# 4. Load it and run at every batch size the profile allows. The plan checks every input against
#    the profile; a shape outside it is refused (example 09 shows the error).
engine = streamrt.load(result.path)
context = engine.create_context()
batches = [1, 2, 4, 8, 16, 32]
latency = []
rng = np.random.default_rng(0)
for n in batches:
    feeds = to_device({"x": rng.standard_normal((n, 3, 32, 32), dtype=np.float32)}, args.device)
    latency.append(_common.median_ms(lambda feeds=feeds: context.infer(feeds), args.device,
                                     repeat=5 if args.small else 30))
    print(f"batch {n:3d}: {latency[-1]:7.3f} ms, {n / latency[-1] * 1e3:9.0f} images/s")

# 5. The check every build deserves: the plan computes what PyTorch computes.
x = rng.standard_normal((4, 3, 32, 32), dtype=np.float32)
with torch.no_grad():
    expected = model(torch.from_numpy(x)).numpy()
got = context.infer(to_device({"x": x}, args.device))["logits"]
got = got.detach().cpu().numpy() if hasattr(got, "detach") else got
print(f"max abs difference to PyTorch: {np.abs(got - expected).max():.2e}")
assert np.allclose(got, expected, atol=1e-3, rtol=1e-3), "the plan disagrees with PyTorch"

fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
a.plot(batches, latency, "o-")
a.set(xscale="log", xlabel="batch", ylabel="latency ms", title="latency per call")
b.plot(batches, [n / t * 1e3 for n, t in zip(batches, latency, strict=True)], "o-")
b.axvline(8, ls="--", c="gray", label="opt shape")
b.set(xscale="log", xlabel="batch", ylabel="images/s", title="throughput")
b.legend()
_common.save(fig, args.out / "batch_sweep.png")
