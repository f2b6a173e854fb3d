"""The CUDA data path of instances (pinned slots, H2D/D2H on each instance's stream) on a GPU plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.wire.protocol import InferRequest
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.timeout(900)]


def test_torch_inductor_plan_served_on_cuda_matches_onnxruntime(tmp_path: Path, reference: Any) -> None:
    model = CATALOGUE["small_cnn"]
    onnx.save(model.make(), str(tmp_path / "m.onnx"))
    (tmp_path / "repo" / "cnn" / "1").mkdir(parents=True)
    config = streamrt.BuildConfig(backend="torch_inductor", profiles=model.profiles)
    streamrt.build(tmp_path / "m.onnx", config, tmp_path / "repo" / "cnn" / "1" / "model.plan",
                   cache_dir=tmp_path / "cache")
    (tmp_path / "repo" / "cnn" / "config.yaml").write_text(
        "max_batch_size: 16\ndynamic_batching: {max_queue_delay_microseconds: 500}\n"
        "instance_group: [{count: 2, kind: KIND_GPU}]\n")
    cfg = ServerConfig(http_port=None, grpc_port=None, metrics_port=0, exit_timeout_s=10)
    with ServerThread(tmp_path / "repo", cfg) as server:
        rng = np.random.default_rng()
        for n in (1, 3, 16):
            x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
            out = server.call(server.server.infer(InferRequest("cnn", inputs={"x": x})), timeout=60)
            np.testing.assert_allclose(out.outputs["logits"], reference("small_cnn", {"x": x})["logits"],
                                       rtol=1e-3, atol=1e-3)
        # the compute split comes from CUDA events on the instance's stream: each part measured, and together
        # within what the requests took in the server
        inference = server.statistics("cnn")["model_stats"][0]["inference_stats"]
        parts = [int(inference[k]["ns"]) for k in ("compute_input", "compute_infer", "compute_output")]
        assert all(ns > 0 for ns in parts) and sum(parts) <= int(inference["success"]["ns"]), inference
