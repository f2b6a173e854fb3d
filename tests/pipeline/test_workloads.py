"""The bundled frame workload on host streams: every topology matches the naive loop bit for bit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

torch = pytest.importorskip("torch")

from streamrt.pipeline import Pipeline, PipelineConfig  # noqa: E402
from streamrt.testing.workloads import (  # noqa: E402
    FrameSpec,
    FrameWorkload,
    TorchModuleEngine,
    make_frames,
    tiny_cnn,
)
from streamrt.types import DType, TensorSpec  # noqa: E402

SPEC = FrameSpec(height=36, width=64, size=32, classes=12, topk=4, channels=4)


@pytest.fixture(scope="module")
def engine() -> TorchModuleEngine:
    return TorchModuleEngine(tiny_cnn(SPEC, seed=3))


def run(engine, config: PipelineConfig, frames, *, poison: bool = True):
    with Pipeline.from_workload(FrameWorkload(engine, SPEC, poison=poison), config) as pipe:
        return [r.unwrap() for r in pipe.map(frames)]


def test_model_is_deterministic() -> None:
    a, b = tiny_cnn(SPEC, seed=1), tiny_cnn(SPEC, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(next(iter(tiny_cnn(SPEC, seed=2).parameters())), next(iter(a.parameters())))


@pytest.mark.parametrize(
    "config",
    [
        PipelineConfig(topology="streams", ring_size=2, device="cpu"),
        PipelineConfig(topology="single", ring_size=2, workers=2, device="cpu"),
        PipelineConfig(topology="streams", ring_size=2, workers=3, device="cpu", trace=True),
    ],
    ids=lambda c: c.describe(),
)
def test_topologies_match_the_synchronous_baseline(engine, config: PipelineConfig) -> None:
    frames = make_frames(10, SPEC, seed=int(np.random.default_rng().integers(1 << 30)))
    baseline = run(engine, PipelineConfig(topology="sync", device="cpu"), frames)
    got = run(engine, config, frames)
    assert all(a.equal(b) for a, b in zip(baseline, got, strict=True))
    assert len({r.classes.tobytes() for r in baseline}) > 1  # distinct frames, distinct outputs
    for r in got:
        assert r.scores.shape == (SPEC.topk,) and np.all(np.diff(r.scores) <= 0)
        assert not np.isnan(r.logits).any() and (r.classes >= 0).all()


def test_results_are_copies_and_host_buffers_are_repoisoned(engine) -> None:
    config = PipelineConfig(ring_size=2, device="cpu")
    with Pipeline.from_workload(FrameWorkload(engine, SPEC, poison=True), config) as pipe:
        results = [r.unwrap() for r in pipe.map(make_frames(4, SPEC))]
        for slot in pipe.slots:
            assert torch.isnan(slot["scores_host"]).all() and (slot["classes_host"] == -7).all()
    assert not any(np.isnan(r.scores).any() for r in results)


class _Context:
    def __init__(self, module) -> None:
        self.module = module

    def infer(self, inputs, stream):
        return {"probs": self.module(inputs["pixels"])}


@dataclass
class _PlanLikeEngine:
    """Shaped like a loaded plan: named, typed IO and create_context()."""

    module: object
    inputs: tuple = (TensorSpec("pixels", DType.FLOAT32, (1, 3, SPEC.size, SPEC.size)),)
    outputs: tuple = (TensorSpec("probs", DType.FLOAT32, (1, SPEC.classes)),)

    def create_context(self) -> _Context:
        return _Context(self.module)


def test_an_engine_with_io_specs_plugs_in(engine) -> None:
    frames = make_frames(3, SPEC)
    workload = FrameWorkload(_PlanLikeEngine(engine.module), SPEC)
    assert (workload.input_name, workload.output_name, workload.dtype) == ("pixels", "probs", torch.float32)
    with Pipeline.from_workload(workload, PipelineConfig(ring_size=2, device="cpu")) as pipe:
        got = [r.unwrap() for r in pipe.map(frames)]
    expected = run(engine, PipelineConfig(topology="sync", device="cpu"), frames)
    assert all(a.equal(b) for a, b in zip(expected, got, strict=True))
