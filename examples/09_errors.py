"""09: the errors a user meets, and how to fix them.

StreamRT refuses early, in one line, with the value at fault and a hint you can type: a silent
wrong answer is the worst outcome of an inference engine. Every error derives from
``streamrt.StreamRTError`` (``.message`` and ``.hint``); the CLI prints it as one line and exits 2.
This script provokes the common ones and writes them with their fixes to errors.md:

- an input shape outside the plan's profile (rebuild with a wider profile, or split the batch);
- a wrong input name or dtype (read ``engine.inputs``);
- out of memory (smaller batch or max shape; fewer contexts or server instances);
- a plan from another machine or library version (rebuild it here: the hint has the command);
- int8 without calibration data (give a folder of samples).

    python examples/09_errors.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import _common
import numpy as np
import onnx
import torch

import streamrt
from streamrt.config import CalibrationConfig
from streamrt.device import get_device
from streamrt.plan import read_plan, write_plan
from streamrt.running.inputs import to_device
from streamrt.testing.models import CATALOGUE, small_cnn

args = _common.parse_args("09", __doc__)
onnx_path = args.out / "cnn.onnx"
onnx.save(small_cnn(), onnx_path)
config = streamrt.BuildConfig(backend=_common.backend_for(args.device), profiles=CATALOGUE["small_cnn"].profiles)
plan_path = streamrt.build(onnx_path, config, args.out / "cnn.plan").path
engine = streamrt.load(plan_path)
context = engine.create_context()
print("the plan accepts:", ", ".join(f"{s.name} {s.dtype.value} {s.shape}" for s in engine.inputs),
      "| profile 0:", engine.profiles[0].ranges["x"])


def images(n: int, size: int = 32, dtype: Any = np.float32) -> dict[str, Any]:
    return to_device({"x": np.random.default_rng(0).standard_normal((n, 3, size, size)).astype(dtype)}, args.device)


def oom() -> None:
    # 2**46 bytes = 64 TiB: more than any GPU or host has. Allocators refuse at once, and the device
    # says so as an OutOfMemoryError with the size (not torch's "[enforce fail at alloc_cpu.cpp]").
    get_device(args.device).empty((2**46,), torch.uint8)


def mismatched_plan() -> None:
    plan = read_plan(plan_path)
    old = dataclasses.replace(plan.manifest, backend_version="0.0.1")
    streamrt.load(write_plan(args.out / "cnn-old.plan", old, plan.payload))


def int8_without_data() -> None:
    streamrt.build(onnx_path, config.replace(precision="int8", calibration=CalibrationConfig(data=args.out / "nope")),
                   args.out / "cnn-int8.plan")


cases: dict[str, tuple[Callable[[], Any], str]] = {
    "batch larger than the profile": (lambda: context.infer(images(64)),
                                      "split the batch, or rebuild with a larger --max-shapes"),
    "image size the plan was not built for": (lambda: context.infer(images(2, size=64)),
                                              "resize the input, or rebuild with that shape in a profile"),
    "wrong input name": (lambda: context.infer({"images": images(2)["x"]}), "use the names in engine.inputs"),
    "wrong dtype": (lambda: context.infer(images(2, dtype=np.float64)), "cast to the dtype in engine.inputs"),
    "out of memory": (oom, "a smaller batch / --max-shapes, fewer contexts or server instances"),
    "plan from another library version": (mismatched_plan, "rebuild the plan on this machine (the hint's command)"),
    "int8 without calibration data": (int8_without_data, "give --calib a folder of .npy/.npz samples or images"),
}
rows = ["| situation | error | message | fix |", "|---|---|---|---|"]
for what, (provoke, fix) in cases.items():
    try:
        provoke()
        raise SystemExit(f"{what}: no error was raised")
    except streamrt.StreamRTError as exc:  # out of memory too: the allocator's own error is mapped
        name, message = type(exc).__name__, str(exc)
    print(f"\n{what}\n  {name}: {message}\n  fix: {fix}")
    rows.append(f"| {what} | `{name}` | {message.replace('|', '/')} | {fix} |")

(args.out / "errors.md").write_text("\n".join(rows) + "\n")
print(f"\nwrote {args.out / 'errors.md'}")
