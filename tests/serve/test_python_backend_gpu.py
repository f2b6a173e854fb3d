"""Python models that return device tensors (torch on CUDA through DLPack), served on the GPU."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.wire.protocol import InferRequest
from streamrt.serve.wire.shared_memory import DeviceTensor

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_GPU } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
"""

MODEL = '''
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        assert args["model_instance_kind"] == "GPU"

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            on_gpu = not x.is_cpu()
            if on_gpu:
                try:
                    x.as_numpy()
                    raise AssertionError("as_numpy of a GPU tensor must raise")
                except pb_utils.TritonModelException:
                    pass
            xt = from_dlpack(x.to_dlpack()).cuda()
            y = pb_utils.Tensor.from_dlpack("Y", to_dlpack(xt * 3))
            assert not y.is_cpu()
            flag = pb_utils.Tensor.from_dlpack("ON_GPU", torch.full((xt.shape[0], 1), on_gpu, device="cuda"))
            responses.append(pb_utils.InferenceResponse([y, flag]))
        return responses
'''


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    (tmp_path / "repo" / "triple" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "triple" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "repo" / "triple" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    cfg = ServerConfig(http_port=0, grpc_port=None, metrics_port=None, exit_timeout_s=10)
    with ServerThread(tmp_path / "repo", cfg, start_timeout=120) as running:
        yield running


def test_device_outputs_reach_the_client_and_stay_on_device_for_callers(server: ServerThread) -> None:
    import torch
    import tritonclient.http as thttp

    rng = np.random.default_rng()
    x = rng.standard_normal((3, 7)).astype(np.float32)
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    item = thttp.InferInput("X", list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    result = client.infer("triple", [item])
    np.testing.assert_allclose(result.as_numpy("Y"), x * 3, rtol=1e-6)
    assert not result.as_numpy("ON_GPU").any()  # inputs from the wire arrive on the host
    client.close()

    model = server.server.repository.get("triple")
    device_x = torch.from_numpy(x).cuda()
    request = InferRequest("triple", inputs={"X": DeviceTensor(device_x, np.dtype(np.float32), x.shape)},
                           outputs_on_device=True)
    response = server.call(model.infer(request), timeout=60)
    y = response.outputs["Y"]
    assert isinstance(y, DeviceTensor) and y.tensor.is_cuda  # no host round trip
    np.testing.assert_allclose(np.asarray(y), x * 3, rtol=1e-6)
    assert np.asarray(response.outputs["ON_GPU"]).all()  # FORCE_CPU_ONLY_INPUT_TENSORS "no": device inputs stay
