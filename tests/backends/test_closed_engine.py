"""A closed engine runs nothing (issue 24 item 7): on every CPU backend, the engine, the contexts made
before ``close()`` and ``create_context`` after it raise InferenceError naming the plan, with a hint.

Before, ``Engine._closed`` was set and never read: an ONNX Runtime context kept running on the
released session's last reference, and a torch_inductor context kept running its loaded runner.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.config import BuildConfig
from streamrt.errors import InferenceError
from streamrt.testing.models import CATALOGUE

MODEL = CATALOGUE["matmul"]
BACKENDS = [
    pytest.param(("onnxruntime", {"threads": 1}), id="onnxruntime"),
    # One CPU AOTInductor build of a 32x16 MatMul: about 20 s on 2 cores.
    pytest.param(("torch_inductor", {"device": "cpu", "threads": 1}), id="torch_inductor",
                 marks=[pytest.mark.torch, pytest.mark.slow]),
]
CLOSED = r"the \w+ engine of plan 'matmul\.onnx' \(fp32\) was closed.*hint: load the plan again"


@pytest.fixture(scope="module", params=BACKENDS)
def plan(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    backend, options = request.param
    tmp = tmp_path_factory.mktemp(f"closed-{backend}")
    config = BuildConfig(backend=backend, profiles=MODEL.profiles, backend_options=options)
    return streamrt.build(catalogue_file("matmul", tmp), config, tmp / "m.plan", cache=False).path


def _check_runs(ctx: streamrt.ExecutionContext, rng: np.random.Generator) -> dict[str, np.ndarray]:
    inputs = MODEL.inputs(rng, 3)
    got = ctx.infer(inputs)
    np.testing.assert_allclose(np.asarray(got["y"]), MODEL.reference(MODEL.make(), inputs)["y"],
                               rtol=MODEL.rtol, atol=MODEL.atol)
    return inputs


def test_a_closed_engine_and_its_contexts_refuse_to_run(plan: Path) -> None:
    rng = np.random.default_rng()
    engine = streamrt.load(plan)
    before = engine.create_context()
    inputs = _check_runs(before, rng)
    assert not engine.closed
    engine.close()
    assert engine.closed
    for check_inputs in (True, False):
        with pytest.raises(InferenceError, match=CLOSED):
            before.infer(inputs, check_inputs=check_inputs)
    with pytest.raises(InferenceError, match=CLOSED):
        engine.create_context()
    with pytest.raises(InferenceError, match=CLOSED):
        engine.validate(inputs)
    with pytest.raises(InferenceError, match=CLOSED):
        engine.profile_layers(inputs, iterations=1)


def test_the_context_manager_closes_and_a_fresh_load_runs_again(plan: Path) -> None:
    rng = np.random.default_rng()
    with streamrt.load(plan) as engine:
        ctx = engine.create_context()
        inputs = _check_runs(ctx, rng)
    with pytest.raises(InferenceError, match=CLOSED):
        ctx.infer(inputs)
    # What the hint says: the plan loads again and runs.
    with streamrt.load(plan) as again:
        _check_runs(again.create_context(), rng)
