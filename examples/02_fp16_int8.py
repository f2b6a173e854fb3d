"""02: fp16 and int8, and what they cost in accuracy.

Lower precision makes an engine faster and smaller, and changes its answers a little. StreamRT
decides precision in the ONNX graph before any backend builds: fp16 casts the weights and
activations (keeping numerically sensitive ops in fp32), int8 inserts quantize/dequantize nodes
whose scales come from *calibration*: running the model on representative inputs and recording
the range of every activation. Calibrate on data that looks like what the model will see; here,
generated pictures (``streamrt.testing.calib``), and measure on pictures the calibration never saw.

    python examples/02_fp16_int8.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import _common
import matplotlib.pyplot as plt
import onnx

import streamrt
from streamrt.config import CalibrationConfig
from streamrt.running.compare import compare_outputs
from streamrt.running.inputs import to_device, to_numpy
from streamrt.testing.calib import synthetic_images, write_calibration_data
from streamrt.testing.models import CATALOGUE, small_cnn

args = _common.parse_args("02", __doc__)
onnx_path = args.out / "cnn.onnx"
onnx.save(small_cnn(), onnx_path)
profiles = CATALOGUE["small_cnn"].profiles  # batch 1..16, tuned for 4

# Calibration data: a folder of .npy pictures (64 here; a few hundred real images in practice).
calib_dir = write_calibration_data(onnx_path, args.out / "calib", count=64)
# Held-out test pictures: another seed, so accuracy is measured on unseen data.
test = {"x": synthetic_images(16, 3, 32, 32, seed=1)}

backend = _common.backend_for(args.device)
configs = {
    "fp32": streamrt.BuildConfig(backend=backend, profiles=profiles),
    "fp16": streamrt.BuildConfig(backend=backend, profiles=profiles, precision="fp16"),
    # minmax keeps every calibrated value in range; entropy (the default) clips outliers, which
    # suits real networks with long-tailed activations better. Try both on your model.
    "int8": streamrt.BuildConfig(backend=backend, profiles=profiles, precision="int8",
                                 calibration=CalibrationConfig(data=calib_dir, method="minmax")),
}
outputs, latency = {}, {}
for name, config in configs.items():
    result = streamrt.build(onnx_path, config, args.out / f"cnn-{name}.plan")
    engine = streamrt.load(result.path)
    context = engine.create_context()
    feeds = to_device(test, args.device)
    outputs[name] = {k: to_numpy(v) for k, v in context.infer(feeds).items()}
    latency[name] = _common.median_ms(lambda c=context, f=feeds: c.infer(f), args.device,
                                      repeat=5 if args.small else 50)
    print(f"{name}: {result.path.stat().st_size / 1024:6.1f} KiB, {latency[name]:.3f} ms per batch of 16")

# Accuracy against the fp32 plan: element-wise error, cosine similarity, and whether the predicted
# class (arg-max) stayed the same: for a classifier the last one is what users notice.
print(f"\n{'precision':<9}  {'max abs':>9}  {'cosine':>8}  {'top-1 agreement':>15}")
rows = {}
for name in ("fp16", "int8"):
    (diff,) = compare_outputs(outputs["fp32"], outputs[name], atol=1e-2, rtol=1e-2)
    rows[name] = diff
    print(f"{name:<9}  {diff.max_abs:9.2e}  {diff.cosine:8.5f}  {100 * (diff.top1 or 0):14.1f}%")
    # fp16 keeps the classes; int8 may move a few logits far but keeps their direction.
    assert diff.cosine > (0.999 if name == "fp16" else 0.98), f"{name} lost too much accuracy"

fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
a.bar(list(latency), list(latency.values()), color=["C0", "C1", "C2"])
a.set(ylabel="ms per batch of 16", title=f"latency ({backend}, {args.device})")
b.bar(list(rows), [1 - d.cosine for d in rows.values()], color=["C1", "C2"])
b.set(yscale="log", ylabel="1 - cosine vs fp32", title="accuracy cost (lower is better)")
_common.save(fig, args.out / "precision.png")
