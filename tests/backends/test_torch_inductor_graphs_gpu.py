"""torch_inductor GPU plans: CUDA graphs by default, fresh outputs, a bounded per-shape graph cache,
plain calls inside a caller's capture, and kernel launches per inference in ``bench``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.config import BuildConfig
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("graphs")
    model = CATALOGUE["small_cnn"]
    config = BuildConfig(backend="torch_inductor", profiles=model.profiles, backend_options={"device": "cuda"})
    return streamrt.build(catalogue_file("small_cnn", tmp), config, tmp / "cnn.plan", cache=False).path


def test_graphs_are_on_by_default_and_outputs_stay_valid(plan: Path) -> None:
    import torch

    engine = streamrt.load(plan)
    ctx, plain = engine.create_context(), engine.create_context(cuda_graph=False)
    assert ctx.cuda_graph
    xs = [torch.randn(4, 3, 32, 32, device="cuda") for _ in range(5)]
    outs = [ctx.infer({"x": x})["logits"] for x in xs]  # kept: later replays must not overwrite them
    torch.cuda.synchronize()
    for x, got in zip(xs, outs, strict=True):
        torch.testing.assert_close(got, plain.infer({"x": x})["logits"], rtol=1e-5, atol=1e-5)
    assert ctx.graph_shapes == [((4, 3, 32, 32),)]


def test_graph_cache_is_bounded_lru(plan: Path) -> None:
    import torch

    ctx = streamrt.load(plan).create_context(graph_cache=2)
    for batch in (1, 2, 3, 2):
        ctx.infer({"x": torch.randn(batch, 3, 32, 32, device="cuda")})
    assert ctx.graph_shapes == [((3, 3, 32, 32),), ((2, 3, 32, 32),)]


def test_call_inside_a_callers_capture_runs_plainly(plan: Path) -> None:
    import torch

    engine = streamrt.load(plan)
    ctx = engine.create_context()
    x = torch.randn(2, 3, 32, 32, device="cuda")
    want = engine.create_context(cuda_graph=False).infer({"x": x})["logits"]
    ctx.infer({"x": x})  # loads the runner outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ctx.infer({"x": x})  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = ctx.infer({"x": x})["logits"]
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_kernel_launches_are_counted_and_reported(plan: Path) -> None:
    from streamrt.profiling.bench import benchmark
    from streamrt.profiling.launches import count_kernel_launches

    engine = streamrt.load(plan)
    feeds = {"x": np.random.default_rng().standard_normal((4, 3, 32, 32)).astype(np.float32)}
    count = count_kernel_launches(engine, feeds)
    assert count is not None and 1 <= count < 200 and count == int(count)
    result = benchmark(engine, feeds, warmup_ms=50, duration_s=0.2)
    assert result.info["kernels"] == f"{count:.4g} kernels per inference, replayed as 1 CUDA graph launch"
    assert "Kernels: " in result.format()
