"""03: save, load, and the compatibility checks.

A plan file is self-describing: a JSON manifest (backend and its version, runtime versions, the
device it was built for, precision, profiles, inputs and outputs, the source model's hash, the
build settings), the backend's payload, and a SHA-256 over both. Loading checks the checksum
first, then every field that must match this machine, and refuses with a message naming the
field, both values and the command that rebuilds the plan here. A plan for another GPU or another
library version would otherwise load and crash, or worse, give wrong answers.

This script builds a plan, loads it, prints its manifest, then forges the two plans you will meet
in practice (one from another device, one from another library version) and a corrupted copy,
and shows what loading each of them says. It writes the messages to compat.txt.

    python examples/03_save_load_compat.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import dataclasses
import json
import time

import _common
import onnx

import streamrt
from streamrt.plan import read_plan, write_plan
from streamrt.testing.models import CATALOGUE, small_cnn

args = _common.parse_args("03", __doc__)
onnx_path = args.out / "cnn.onnx"
onnx.save(small_cnn(), onnx_path)
config = streamrt.BuildConfig(backend=_common.backend_for(args.device), profiles=CATALOGUE["small_cnn"].profiles)
plan_path = streamrt.build(onnx_path, config, args.out / "cnn.plan").path

# Loading is fast: no graph optimisation, no kernel tuning, just checks and deserialisation.
start = time.perf_counter()
engine = streamrt.load(plan_path)
print(f"loaded {plan_path} in {(time.perf_counter() - start) * 1e3:.0f} ms")
manifest = engine.manifest
print("the manifest says:")
for key in ("backend", "backend_version", "precision", "device", "runtime_versions"):
    print(f"  {key:<16} {json.dumps(getattr(manifest, key))}")

# Forge the plans a user meets: the same payload under a manifest from elsewhere. (write_plan
# computes a fresh checksum, as a real build elsewhere would.)
plan = read_plan(plan_path)
device = dict(manifest.device)
field = "compute_capability" if "compute_capability" in device else "arch"
device[field] = "8.0" if field == "compute_capability" else "aarch64"
versions = dict(manifest.runtime_versions)
versions[manifest.backend] = "0.0.1"
forged = {
    "another device": dataclasses.replace(manifest, device=device),
    "another library version": dataclasses.replace(manifest, backend_version="0.0.1", runtime_versions=versions),
}
report = []
for what, other in forged.items():
    path = write_plan(args.out / f"cnn-{what.replace(' ', '-')}.plan", other, plan.payload)
    try:
        streamrt.load(path)
        raise SystemExit(f"a plan from {what} loaded: the check is missing")
    except streamrt.StreamRTError as exc:  # PlanMismatchError
        report.append(f"plan from {what}:\n  {type(exc).__name__}: {exc}")

# A corrupted copy (a flipped bit, a truncated download) fails its checksum before anything is parsed.
data = bytearray(plan_path.read_bytes())
data[len(data) // 2] ^= 0x01
corrupted = args.out / "cnn-corrupted.plan"
corrupted.write_bytes(bytes(data))
try:
    streamrt.load(corrupted)
    raise SystemExit("a corrupted plan loaded: the checksum is not checked")
except streamrt.StreamRTError as exc:  # PlanFormatError
    report.append(f"corrupted plan:\n  {type(exc).__name__}: {exc}")

text = "\n\n".join(report)
print("\n" + text)
(args.out / "compat.txt").write_text(text + "\n")
print(f"wrote {args.out / 'compat.txt'}")
