"""torch_inductor on the GPU: catalogue vs NumPy reference, profiles, CUDA graphs, fresh-process load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.config import BuildConfig
from streamrt.errors import ShapeError
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


class _Plans(dict[str, Path]):
    """Builds each catalogue plan on first use, so parallel test workers build only what they run."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str) -> Path:
        model = CATALOGUE[name]
        config = BuildConfig(backend="torch_inductor", profiles=model.profiles, backend_options={"device": "cuda"})
        path = streamrt.build(catalogue_file(name, self.folder), config, self.folder / f"{name}.plan", cache=False).path
        self[name] = path
        return path


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Plans(tmp_path_factory.mktemp("gpu"))


def _to_cuda(inputs: dict[str, np.ndarray]) -> dict[str, object]:
    import torch

    return {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue_on_gpu(plans: dict[str, Path], name: str) -> None:
    import torch

    model = CATALOGUE[name]
    engine = streamrt.load(plans[name])
    assert engine.device_kind == "cuda"
    ctx = engine.create_context()
    rng = np.random.default_rng()
    lo, hi = (1, 16) if model.profiles else (1, 1)
    for batch in sorted({lo, 3, hi} if model.profiles else {1}):
        inputs = model.inputs(rng, batch)
        got = ctx.infer(_to_cuda(inputs))
        want = model.reference(model.make(), inputs)
        for key, ref in want.items():
            assert isinstance(got[key], torch.Tensor) and got[key].is_cuda
            # cuDNN/cuBLAS fp32 (no TF32): same tolerance as the CPU backends, a little looser for convs
            np.testing.assert_allclose(got[key].cpu().numpy(), ref, rtol=1e-3, atol=1e-3)


def test_outside_profile_fails_before_running(plans: dict[str, Path]) -> None:
    import torch

    ctx = streamrt.load(plans["matmul"]).create_context()
    with pytest.raises(ShapeError, match="outside every profile"):
        ctx.infer({"x": torch.randn(17, 32, device="cuda")})


def test_cuda_graph_replay_matches_plain_runs_on_a_side_stream(plans: dict[str, Path]) -> None:
    import torch

    from streamrt.device import get_device

    engine = streamrt.load(plans["small_cnn"])
    plain = engine.create_context()
    graphed = engine.create_context(cuda_graph=True, graph_buffers=2)
    stream = get_device("cuda").stream("engine")
    results = []
    for _ in range(6):
        x = torch.randn(4, 3, 32, 32, device="cuda")
        want = plain.infer({"x": x})["logits"].clone()
        # x is written on the current stream: the side stream must wait for it (the context does not;
        # a race here failed this test on an H100 on 2026-12-07 with every element wrong)
        stream.torch_stream.wait_stream(torch.cuda.current_stream())
        got = graphed.infer({"x": x}, stream)["logits"]
        stream.synchronize()
        results.append((got.clone(), want))
    for got, want in results:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_steady_state_has_no_host_sync(plans: dict[str, Path]) -> None:
    import torch

    engine = streamrt.load(plans["small_cnn"])
    ctx = engine.create_context(cuda_graph=True)
    stream = torch.cuda.Stream()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    ctx.infer({"x": x}, stream)  # warm-up and capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            ctx.infer({"x": x}, stream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_plan_loads_in_a_fresh_process(plans: dict[str, Path]) -> None:
    # torch 2.11's aoti_load_package crashed in fresh processes on the H200 image unless
    # onnxruntime was imported first; the backend must not depend on import order.
    code = (
        "import sys, torch, streamrt\n"
        "e = streamrt.load(sys.argv[1])\n"
        "y = e.create_context().infer({'x': torch.randn(2, 32, device='cuda')})['y']\n"
        "torch.cuda.synchronize(); print('ok', tuple(y.shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(plans["matmul"])], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok (2, 16)" in out.stdout


def test_gpu_plans_run_on_the_runner_without_the_gil_with_torchs_answers(plans: dict[str, Path],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA package opens in nogil_runner.py (not a silent fall back to torch's runner), launches on the
    caller's stream, and answers exactly like torch's runner, plain and as a CUDA graph."""
    import torch

    from streamrt.backends.torch_inductor.nogil_runner import RUNNER_ENV, NoGilRunner
    from streamrt.device import get_device

    stream = get_device("cuda").stream("engine")
    x = torch.randn(4, 3, 32, 32, device="cuda")
    stream.torch_stream.wait_stream(torch.cuda.current_stream())  # x is written on the current stream
    answers = {}
    for kind in ("nogil", "torch"):
        monkeypatch.setenv(RUNNER_ENV, kind)
        engine = streamrt.load(plans["small_cnn"])
        for graph in (False, True):
            ctx = engine.create_context(cuda_graph=graph)
            for _ in range(3):  # the third call of a graphed context replays its capture
                got = ctx.infer({"x": x}, stream)["logits"]
            stream.synchronize()
            answers[kind, graph] = got.clone()
            assert isinstance(ctx._runner(0), NoGilRunner) == (kind == "nogil"), kind
    assert torch.isfinite(answers["nogil", False]).all()
    for key, got in answers.items():  # graph vs plain: the tolerance of the replay test above
        torch.testing.assert_close(got, answers["torch", False], rtol=1e-5, atol=1e-5, msg=str(key))
