"""The sequence batcher on CUDA instances: implicit states stay on the device between steps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.wire.protocol import InferRequest, SequenceFlags
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.testing.sequence_models import accumulator, accumulator_config

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.timeout(900)]

WIDTH = 16


@pytest.mark.parametrize("strategy", [{"direct": {}}, {"oldest": {"max_candidate_sequences": 8,
                                                                  "max_queue_delay_microseconds": 500}}])
def test_sequences_on_cuda_keep_device_states(tmp_path: Path, strategy: dict[str, Any]) -> None:
    (tmp_path / "repo" / "acc" / "1").mkdir(parents=True)
    onnx.save(accumulator(WIDTH), str(tmp_path / "repo" / "acc" / "1" / "model.onnx"))
    config = accumulator_config(WIDTH, strategy=strategy, instances=2)
    config["instance_group"] = [{"count": 2, "kind": "KIND_GPU"}]
    config["build"] = {"backend": "torch_inductor"}
    (tmp_path / "repo" / "acc" / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = ServerConfig(http_port=None, grpc_port=None, metrics_port=None, exit_timeout_s=10)
    rng = np.random.default_rng()
    ids = list(range(1, 13))  # 12 sequences over 8 slots: a backlog forms
    sums = {i: np.zeros((1, WIDTH)) for i in ids}
    with ServerThread(tmp_path / "repo", cfg) as server:

        async def step(sequence_id: int, k: int, steps: int) -> None:
            x = rng.standard_normal((1, WIDTH)).astype(np.float32)
            sums[sequence_id] += x
            flags = SequenceFlags(sequence_id, start=k == 0, end=k == steps - 1)
            out = await server.server.infer(InferRequest("acc", inputs={"INPUT": x}, sequence=flags))
            np.testing.assert_allclose(out.outputs["OUTPUT"], sums[sequence_id], rtol=1e-4, atol=1e-4)

        async def sequence(sequence_id: int, steps: int) -> None:
            for k in range(steps):
                await step(sequence_id, k, steps)

        async def run_all() -> None:
            await asyncio.gather(*(sequence(i, 6) for i in ids))

        server.call(run_all(), timeout=300)
        # one sequence left open: its state is a CUDA tensor held by the batcher
        sums[99] = np.zeros((1, WIDTH))
        server.call(step(99, 0, 2), timeout=60)
        served: Any = server.server.repository.get("acc", "")  # type: ignore[union-attr]
        states = [s.state for s in served._scheduler._held if s.id == 99]
        assert len(states) == 1 and states[0] is not None
        state = states[0]["STATE_IN"]
        assert isinstance(state, DeviceTensor) and state.tensor.is_cuda
        np.testing.assert_allclose(np.asarray(state), sums[99], rtol=1e-4, atol=1e-4)
        server.call(step(99, 1, 2), timeout=60)
