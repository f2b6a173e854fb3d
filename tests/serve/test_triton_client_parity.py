"""What NVIDIA's client examples showed StreamRT answering otherwise than Triton, now answered as Triton
does: BYTES tensors in system shared memory (in and out), the server metadata's name, and a load
whose ``file:`` path cannot be a file name (refused as a bad request; the server keeps serving)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils as tutils
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread
from streamrt.testing.triton_examples import write_repository

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "2-frontend-processes"])
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("parity") / "repo"
    write_repository(repo, ["simple", "simple_string", "simple_identity"])
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0,
                          frontend_processes=request.param)
    with ServerThread(repo, config, start_timeout=120) as running:
        yield running


def _client(server: ServerThread, mod: Any) -> Any:
    return mod.InferenceServerClient(f"127.0.0.1:{server.http_port if mod is thttp else server.grpc_port}")


def _text(values: np.ndarray) -> np.ndarray:
    return np.array([str(v).encode() for v in values.ravel()], dtype=object).reshape(values.shape)


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_bytes_inputs_and_outputs_in_system_shared_memory(server: ServerThread, mod: Any, tmp_path: Path) -> None:
    """Serialized BYTES (4-byte length + bytes per element) read from one region and written to another,
    as Triton does and tritonclient's ``get_contents_as_numpy`` reads; the output region's tail stays
    untouched and the response reports the serialized size."""
    client = _client(server, mod)
    rng = np.random.default_rng()
    a, b = (rng.integers(-(10**6), 10**6, (2, 16)).astype(np.int32) for _ in range(2))
    serialized = [tutils.serialize_byte_tensor(_text(x)).item() for x in (a, b)]
    expected = tutils.serialize_byte_tensor(_text(a + b)).item()
    key = f"/streamrt_parity_{mod.__name__.rsplit('.', 1)[-1]}_{server.http_port}"
    size = 8192
    handle = shm.create_shared_memory_region("bytes", key, size)
    try:
        shm.set_shared_memory_region(handle, [np.frombuffer(serialized[0] + serialized[1], np.uint8)])
        poison = np.full(size - 4096, 0xAB, np.uint8)
        shm.set_shared_memory_region(handle, [poison], offset=4096)
        client.register_system_shared_memory("bytes", key, size)
        inputs = []
        for i, data in enumerate(serialized):
            item = mod.InferInput(f"INPUT{i}", [2, 16], "BYTES")
            item.set_shared_memory("bytes", len(data), offset=0 if i == 0 else len(serialized[0]))
            inputs.append(item)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("bytes", 2048, offset=4096)
        result = client.infer("simple_string", inputs, outputs=[out])
        reported = result.get_output("OUTPUT0")
        params = reported["parameters"] if mod is thttp else {k: v.int64_param for k, v in reported.parameters.items()}
        assert params["shared_memory_byte_size"] == len(expected)
        got = shm.get_contents_as_numpy(handle, np.object_, [2, 16], offset=4096)
        np.testing.assert_array_equal(got, _text(a + b))
        tail = shm.get_contents_as_numpy(handle, np.uint8, [size - 4096 - len(expected)], offset=4096 + len(expected))
        assert (tail == 0xAB).all()
        # a byte size that cuts an element is the client's mistake, named as such
        short = mod.InferInput("INPUT0", [2, 16], "BYTES")
        short.set_shared_memory("bytes", len(serialized[0]) - 1)
        with pytest.raises(InferenceServerException, match="BYTES"):
            client.infer("simple_string", [short, inputs[1]])
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
        client.close()


def test_server_metadata_names_triton(server: ServerThread) -> None:
    http, grpc = _client(server, thttp), _client(server, tgrpc)
    assert http.get_server_metadata()["name"] == "triton"
    assert grpc.get_server_metadata().name == "triton"
    http.close()
    grpc.close()


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_file_path_longer_than_a_file_name_is_a_bad_request(server: ServerThread, mod: Any) -> None:
    client = _client(server, mod)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
    assert "Invalid file path" in err.value.message()
    assert err.value.status() == ("400" if mod is thttp else "StatusCode.INVALID_ARGUMENT")
    assert client.is_server_live() and client.is_model_ready("simple")
    client.close()
