"""Loading a plan and running it imports no build code (STYLE.md 2, issue 25 item 5).

A fresh interpreter loads a plan with ``streamrt.load``, runs one batch of fresh random data and
lists the modules it imported. None of the build side may be among them: no backend's
``builder`` (nor torch_inductor's compile child), no StreamRT build step (``streamrt.build`` and
``build_module``, plan verification, the accuracy gate, the int8 speed check), no ONNX transform
(precision, quantization, calibration, the ONNX-to-torch importer). The engine's outputs are
checked against the catalogue's NumPy reference, so the run really ran.

Before, the registry loaded each ``Backend`` class from the backend's ``builder`` module, so every
load imported it. import-linter's contracts see only static imports; this test sees what a load
really pulls in, the lazy imports included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.config import BuildConfig
from streamrt.testing.models import CATALOGUE

MODEL = CATALOGUE["matmul"]
SRC = Path(__file__).resolve().parents[2] / "src"

# What loading may never import: StreamRT's build rooms by their last name (wherever they live in
# the package) and the ONNX transforms by package.
BUILD_NAMES = {"builder", "module_builder", "_compile_child", "verify", "accuracy_gate", "speed_check"}
BUILD_PACKAGES = ("streamrt.building", "streamrt.building.verify", "streamrt.onnx.precision", "streamrt.onnx.quantize",
                  "streamrt.onnx.calibration", "streamrt.onnx.importer")

# Load, run one batch of random inputs (shapes from the engine's first profile's opt), save the
# inputs and outputs, and print the imported module names.
_SCRIPT = """
import json, sys
import numpy as np
import streamrt
engine = streamrt.load(sys.argv[1])
rng = np.random.default_rng()
feed = {s.name: rng.standard_normal(engine.profiles[0].ranges[s.name].opt).astype(s.dtype.numpy)
        for s in engine.inputs}
with engine.create_context() as ctx:
    out = {k: np.asarray(v) for k, v in ctx.infer(feed).items()}
np.savez(sys.argv[2], **{"in_" + k: v for k, v in feed.items()}, **{"out_" + k: v for k, v in out.items()})
print(json.dumps(sorted(sys.modules)))
"""

BACKENDS = [
    pytest.param(("onnxruntime", {"threads": 1}), id="onnxruntime"),
    # One CPU AOTInductor build of a 32x16 MatMul: about 20 s on 2 cores.
    pytest.param(("torch_inductor", {"device": "cpu", "threads": 1}), id="torch_inductor",
                 marks=[pytest.mark.torch, pytest.mark.slow]),
]


def build_side(modules: list[str]) -> list[str]:
    """The build-side StreamRT modules among ``modules``."""
    return [m for m in modules if m.startswith("streamrt.") and (
        m.rsplit(".", 1)[-1] in BUILD_NAMES or any(m == p or m.startswith(p + ".") for p in BUILD_PACKAGES))]


def test_build_side_names_what_a_build_imports() -> None:
    # The filter must recognise the build side it guards against (else the load test cannot fail).
    names = ["streamrt.backends.onnxruntime.builder", "streamrt.onnx.precision", "streamrt.onnx.importer.ops_quant",
             "streamrt.backends.onnxruntime.engine", "streamrt.onnx.model", "streamrt.plan"]
    assert build_side(names) == names[:3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_loading_and_running_a_plan_imports_no_build_code(backend: tuple[str, dict[str, object]],
                                                          tmp_path: Path) -> None:
    name, options = backend
    config = BuildConfig(backend=name, profiles=MODEL.profiles, backend_options=options)
    plan = streamrt.build(catalogue_file("matmul", tmp_path), config, tmp_path / "m.plan", cache=False).path
    saved = tmp_path / "run.npz"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(plan), str(saved)], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    modules = json.loads(run.stdout.strip().splitlines()[-1])
    assert build_side(modules) == [], f"loading a {name} plan imported build code"
    if name == "onnxruntime":
        assert "torch" not in modules, "loading an onnxruntime plan imported torch"
    data = np.load(saved)
    inputs = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
    want = MODEL.reference(MODEL.make(), inputs)
    for out, ref in want.items():
        np.testing.assert_allclose(data["out_" + out], ref, rtol=MODEL.rtol, atol=MODEL.atol)
