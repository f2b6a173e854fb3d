"""An ensemble of two CUDA plans: the tensor between the steps stays on the device (no host round trip)
and the results match the same models run by ONNX Runtime."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.execution.instances import Instance
from streamrt.serve.wire.protocol import InferRequest
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.timeout(900)]

CHAIN = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 10 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 10 ] }, { name: "PROBS" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling { step [
  { model_name: "cnn" model_version: -1 input_map { key: "x" value: "IMAGE" } output_map { key: "logits" value: "L" } },
  { model_name: "pair" model_version: -1 input_map [ { key: "a" value: "L" }, { key: "b" value: "B" } ]
    output_map [ { key: "sum" value: "SUM" }, { key: "probs" value: "PROBS" } ] }
] }
"""


def test_device_tensors_pass_between_cuda_steps(tmp_path: Path, reference: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    for name, catalogue in (("cnn", "small_cnn"), ("pair", "two_io")):
        model = CATALOGUE[catalogue]
        onnx.save(model.make(), str(tmp_path / f"{name}.onnx"))
        (repo / name / "1").mkdir(parents=True)
        build = streamrt.BuildConfig(backend="torch_inductor", profiles=model.profiles)
        streamrt.build(tmp_path / f"{name}.onnx", build, repo / name / "1" / "model.plan", cache_dir=tmp_path / "cache")
        (repo / name / "config.yaml").write_text(
            "max_batch_size: 8\ndynamic_batching: {max_queue_delay_microseconds: 200}\n"
            "instance_group: [{count: 2, kind: KIND_GPU}]\n")
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)

    gathered: list[int] = []
    original = Instance._gather_on_device

    def counting(self: Instance, arrays: Any, *more: Any) -> Any:
        gathered.append(len(arrays))
        return original(self, arrays, *more)

    def no_host_copy(self: DeviceTensor, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise AssertionError("a device tensor between ensemble steps was copied to the host")

    cfg = ServerConfig(http_port=None, grpc_port=None, metrics_port=None, exit_timeout_s=10,
                       startup_models=("chain",))
    with ServerThread(repo, cfg) as server:
        rng = np.random.default_rng()
        x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
        step = server.call(server.server.infer(InferRequest("cnn", inputs={"x": x}, outputs_on_device=True)), 60)
        logits = step.outputs["logits"]
        assert isinstance(logits, DeviceTensor) and logits.tensor.is_cuda and logits.shape == (2, 10)
        np.testing.assert_allclose(np.asarray(logits), reference("small_cnn", {"x": x})["logits"], rtol=1e-3,
                                   atol=1e-3)

        monkeypatch.setattr(Instance, "_gather_on_device", counting)
        monkeypatch.setattr(DeviceTensor, "__array__", no_host_copy)
        for n in (1, 3, 8):
            image = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
            b = rng.standard_normal((n, 10)).astype(np.float32)
            out = server.call(server.server.infer(InferRequest("chain", inputs={"IMAGE": image, "B": b})), 60)
            expected_logits = reference("small_cnn", {"x": image})["logits"]
            expected = reference("two_io", {"a": expected_logits, "b": b})
            assert isinstance(out.outputs["SUM"], np.ndarray)
            np.testing.assert_allclose(out.outputs["SUM"], expected["sum"], rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(out.outputs["PROBS"], expected["probs"], rtol=1e-3, atol=1e-3)
        assert len(gathered) == 3  # 'pair' gathered the cnn's device output on the device, every request

        # Many requests at once, batched together on both instances of each step: every request gets
        # its own answer (device outputs are copies, not the engine's buffers its next batch reuses).
        images = [rng.standard_normal((1 + i % 4, 3, 32, 32)).astype(np.float32) for i in range(48)]
        bs = [rng.standard_normal((len(im), 10)).astype(np.float32) for im in images]

        async def all_at_once() -> list[Any]:
            return await asyncio.gather(*(server.server.infer(InferRequest("chain", inputs={"IMAGE": im, "B": b}))
                                          for im, b in zip(images, bs, strict=True)))

        for out, image, b in zip(server.call(all_at_once(), 120), images, bs, strict=True):
            expected = reference("two_io", {"a": reference("small_cnn", {"x": image})["logits"], "b": b})
            np.testing.assert_allclose(out.outputs["SUM"], expected["sum"], rtol=1e-3, atol=1e-3)
