"""CUDA shared memory with tritonclient's ``cuda_shared_memory`` against a server in another process
(a CUDA IPC handle cannot be opened by the process that made it): an ONNX Runtime CPU model (the
region is read to the host) and a torch_inductor GPU model (gathered on the device), over HTTP and
gRPC, plus the refusals."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.timeout(900)]

try:  # it raises RuntimeError, not ImportError, without cuda-python
    import tritonclient.utils.cuda_shared_memory as cudashm
except (ImportError, RuntimeError) as exc:
    pytest.skip(f"tritonclient's cuda_shared_memory is unusable here: {exc}", allow_module_level=True)
import tritonclient.grpc as tgrpc  # noqa: E402
import tritonclient.http as thttp  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "2-frontend-processes"])
def gpu_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               plans: dict[str, Path]) -> Iterator[dict[str, int]]:
    """The server in one process, then with 2 front-end processes (regions resolved by the engine process)."""
    work = tmp_path_factory.mktemp("cudashm")
    repo = work / "repo"
    (repo / "cpu_cnn" / "1").mkdir(parents=True)
    (repo / "cpu_cnn" / "1" / "model.plan").write_bytes(plans["small_cnn"].read_bytes())
    (repo / "cpu_cnn" / "config.yaml").write_text("max_batch_size: 8\n")
    model = CATALOGUE["small_cnn"]
    onnx.save(model.make(), str(work / "m.onnx"))
    (repo / "gpu_cnn" / "1").mkdir(parents=True)
    streamrt.build(work / "m.onnx", streamrt.BuildConfig(backend="torch_inductor", profiles=model.profiles),
                   repo / "gpu_cnn" / "1" / "model.plan", cache_dir=work / "cache")
    (repo / "gpu_cnn" / "config.yaml").write_text(
        "max_batch_size: 16\ndynamic_batching: {max_queue_delay_microseconds: 500}\n"
        "instance_group: [{count: 2, kind: KIND_GPU}]\n")
    http, grpc = _port(), _port()
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))  # keep carried packages
    env = {**os.environ, "PYTHONPATH": path}
    server = subprocess.Popen([sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http),
                               "--grpc-port", str(grpc), "--metrics-port", "-1", "--log-level", "WARNING",
                               "--frontend-processes", str(request.param)], env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"the server exited with status {server.returncode} before it was ready")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield {"http": http, "grpc": grpc}
    finally:
        server.terminate()
        server.wait(60)


def _client(ports: dict[str, int], protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return thttp.InferenceServerClient(f"127.0.0.1:{ports['http']}", network_timeout=60), thttp
    return tgrpc.InferenceServerClient(f"127.0.0.1:{ports['grpc']}"), tgrpc


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["cpu_cnn", "gpu_cnn"])
def test_cuda_regions_in_and_out(gpu_server: dict[str, int], reference: Any, protocol: str, model: str) -> None:
    client, mod = _client(gpu_server, protocol)
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    x_region = cudashm.create_shared_memory_region("x", x.nbytes, 0)
    y_region = cudashm.create_shared_memory_region("y", 4 * 10 * 4, 0)
    try:
        client.unregister_cuda_shared_memory()
        cudashm.set_shared_memory_region(x_region, [x])
        cudashm.set_shared_memory_region(y_region, [np.full((4, 10), np.nan, np.float32)])
        client.register_cuda_shared_memory("x", cudashm.get_raw_handle(x_region), 0, x.nbytes)
        client.register_cuda_shared_memory("y", cudashm.get_raw_handle(y_region), 0, 160)
        inp = mod.InferInput("x", list(x.shape), "FP32")
        inp.set_shared_memory("x", x.nbytes)
        out = mod.InferRequestedOutput("logits")
        out.set_shared_memory("y", 160)
        for _ in range(3):
            client.infer(model, [inp], outputs=[out])
            y = cudashm.get_contents_as_numpy(y_region, np.float32, [4, 10])
            tol = 1e-4 if model == "cpu_cnn" else 2e-3
            np.testing.assert_allclose(y, reference("small_cnn", {"x": x})["logits"], rtol=tol, atol=tol)
        status = client.get_cuda_shared_memory_status()
        names = sorted(r["name"] for r in status) if protocol == "http" else sorted(status.regions)
        assert names == ["x", "y"]
        # Too small for the output: refused, the region keeps what it had.
        cudashm.set_shared_memory_region(y_region, [np.full((4, 10), 7.0, np.float32)])
        small = mod.InferRequestedOutput("logits")
        small.set_shared_memory("y", 80)
        with pytest.raises(InferenceServerException, match="nothing was written"):
            client.infer(model, [inp], outputs=[small])
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(y_region, np.float32, [4, 10]), 7.0)
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_cuda_shared_memory("x", cudashm.get_raw_handle(x_region), 0, x.nbytes)
        client.unregister_cuda_shared_memory()
        assert not (client.get_cuda_shared_memory_status() if protocol == "http"
                    else client.get_cuda_shared_memory_status().regions)
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
        cudashm.destroy_shared_memory_region(x_region)
        cudashm.destroy_shared_memory_region(y_region)


def test_bad_cuda_handle_is_refused(gpu_server: dict[str, int]) -> None:
    import base64

    client, _ = _client(gpu_server, "http")
    try:
        with pytest.raises(InferenceServerException, match=r"CUDA IPC handle|CUDA error"):
            client.register_cuda_shared_memory("bad", base64.b64encode(os.urandom(64)), 0, 1024)
        with pytest.raises(InferenceServerException, match="64"):
            client.register_cuda_shared_memory("short", base64.b64encode(b"123"), 0, 1024)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_binary_requests_to_the_gpu_model_alone_and_batched(gpu_server: dict[str, int], reference: Any,
                                                            protocol: str) -> None:
    """Binary tensors (no region) to the CUDA instances: through front-end processes they are copied
    to the device straight from the page-locked arena, alone and several to a batch (concurrent
    clients), instead of through a pinned staging slot; the answers must not change."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng()
    xs = [rng.standard_normal((n, 3, 32, 32)).astype(np.float32) for n in (1, 4, 2, 8, 3, 4, 1, 6)]

    def one(x: np.ndarray) -> np.ndarray:
        client, mod = _client(gpu_server, protocol)
        try:
            inp = mod.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return np.asarray(client.infer("gpu_cnn", [inp]).as_numpy("logits"))
        finally:
            client.close()

    for rounds in range(3):  # alone first, then concurrent (several requests to a batch)
        with ThreadPoolExecutor(1 if rounds == 0 else len(xs)) as pool:
            answers = list(pool.map(one, xs))
        for x, y in zip(xs, answers, strict=True):
            np.testing.assert_allclose(y, reference("small_cnn", {"x": x})["logits"], rtol=2e-3, atol=2e-3)
