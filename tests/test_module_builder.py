"""``streamrt.build_module`` plans record the outputs the compiled program returns, and serve batched.

Issue 24 item 2b: the output specs came from one eager run at the example input, so a 1..8 batch
profile recorded ``logits`` as 8x10 and the model server refused ``max_batch_size 8`` ("'logits' has
no dynamic batch dimension"). One CPU AOTInductor build (tens of seconds) serves every test here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import streamrt
from streamrt.config import BuildConfig
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(600)]

SIZE = 12  # input height and width: tiny, so the C++ build stays short


class TinyCNN(torch.nn.Module):
    """Conv-ReLU-MaxPool-Conv-ReLU-GlobalAvgPool-Linear: a classifier whose logits follow the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


@pytest.fixture(scope="module")
def cnn_plan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TinyCNN]]:
    from streamrt.building.module_builder import build_module

    tmp = tmp_path_factory.mktemp("module-plan")
    torch.manual_seed(0)
    net = TinyCNN().eval()
    profile = ShapeProfile({"images": ShapeRange((1, 3, SIZE, SIZE), (4, 3, SIZE, SIZE), (8, 3, SIZE, SIZE))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options={"device": "cpu", "threads": 1})
    result = build_module(net, [torch.randn(8, 3, SIZE, SIZE)], tmp / "cnn.plan", config,
                          input_names=["images"], output_names=["logits"], cache_dir=tmp / "cache")
    yield result.path, net


def _reference(net: TinyCNN, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(net.double()(torch.from_numpy(x).double()).numpy())


def test_outputs_that_follow_the_batch_are_recorded_dynamic(cnn_plan: tuple[Path, TinyCNN]) -> None:
    path, net = cnn_plan
    engine = streamrt.load(path)
    assert engine.inputs == (TensorSpec("images", DType.FLOAT32, (-1, 3, SIZE, SIZE)),)
    # Before: (8, 10), the shape of one eager run at the example input.
    assert engine.outputs == (TensorSpec("logits", DType.FLOAT32, (-1, 10)),)
    ctx = engine.create_context()
    rng = np.random.default_rng()
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32)
        got = ctx.infer({"images": x})["logits"]
        assert got.shape == (batch, 10)
        # fp32 plan against a float64 eager reference: 1e-4 relative covers fp32 conv/GEMM rounding.
        np.testing.assert_allclose(got, _reference(net, x), rtol=1e-4, atol=1e-5)


def test_the_server_batches_a_module_plan(cnn_plan: tuple[Path, TinyCNN], tmp_path: Path) -> None:
    tritonclient_http = pytest.importorskip("tritonclient.http")
    from streamrt.serve.configs.config import ServerConfig
    from streamrt.serve.server import ServerThread

    path, net = cnn_plan
    (tmp_path / "cnn" / "1").mkdir(parents=True)
    (tmp_path / "cnn" / "1" / "model.plan").write_bytes(path.read_bytes())
    (tmp_path / "cnn" / "config.pbtxt").write_text(
        'name: "cnn"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n'
    )
    config = ServerConfig(http_port=0, grpc_port=None, metrics_port=None, exit_timeout_s=5.0, startup_models=("cnn",))
    # Before: loading failed with "max_batch_size 8 but 'logits' has no dynamic batch dimension (shape 8x10)".
    with ServerThread(tmp_path, config, start_timeout=120) as server:
        client = tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=60)
        try:
            assert client.is_model_ready("cnn")
            served = client.get_model_config("cnn")
            assert served["max_batch_size"] == 8 and served["output"][0]["dims"] == [10]
            x = np.random.default_rng().standard_normal((5, 3, SIZE, SIZE)).astype(np.float32)
            item = tritonclient_http.InferInput("images", list(x.shape), "FP32")
            item.set_data_from_numpy(x)
            got = client.infer("cnn", [item]).as_numpy("logits")
        finally:
            client.close()
    assert got.shape == (5, 10)
    np.testing.assert_allclose(got, _reference(net, x), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_a_cuda_fp16_module_plan_records_dynamic_outputs(tmp_path: Path) -> None:
    """The GPU path of the serving check (fp16 weights behind fp32 I/O): logits follow the batch there too."""
    from streamrt.building.module_builder import build_module

    torch.manual_seed(0)
    net = TinyCNN().eval()
    profile = ShapeProfile({"images": ShapeRange((1, 3, SIZE, SIZE), (8, 3, SIZE, SIZE), (8, 3, SIZE, SIZE))})
    config = BuildConfig(backend="torch_inductor", precision="fp16", profiles=(profile,),
                         backend_options={"device": "cuda"})
    result = build_module(net, [torch.randn(8, 3, SIZE, SIZE, device="cuda")], tmp_path / "cnn.plan", config,
                          input_names=["images"], output_names=["logits"], cache_dir=tmp_path / "cache")
    assert result.manifest.outputs == (TensorSpec("logits", DType.FLOAT32, (-1, 10)),)
    with streamrt.load(result.path) as engine, engine.create_context() as ctx:
        rng = np.random.default_rng()
        for batch in (1, 3, 8):
            x = rng.standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32)
            got = ctx.infer({"images": torch.from_numpy(x).cuda()})["logits"].cpu().numpy()
            want = _reference(net, x)
            assert got.shape == (batch, 10)
            # fp16 weights and activations (unit roundoff 4.9e-4) through two 3x3 convs and a GEMM:
            # within 1% of the logits' scale.
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * float(np.abs(want).max()))
