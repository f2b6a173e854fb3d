"""The real tritonclient (HTTP and gRPC) against StreamRT: every call it makes for inference,
metadata, health, configuration, repository and statistics."""

from __future__ import annotations

import json
import queue
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def http(server: Any) -> Any:
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", connection_timeout=10,
                                         network_timeout=30, concurrency=4)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: Any) -> Any:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()


def _x(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((n, 3, 32, 32)).astype(np.float32)


def test_health_and_metadata_http(http: Any) -> None:
    assert http.is_server_live() and http.is_server_ready()
    assert http.is_model_ready("cnn") and http.is_model_ready("cnn", "1")
    assert not http.is_model_ready("cnn", "7") and not http.is_model_ready("nope")
    meta = http.get_server_metadata()
    assert meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"]
    model = http.get_model_metadata("cnn")
    assert model["versions"] == ["1"] and model["platform"] == "streamrt_onnxruntime"
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert model["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    config = http.get_model_config("cnn")
    assert config["max_batch_size"] == 8 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert config["instance_group"][0]["count"] == 2 and config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"  # resolved from KIND_AUTO, as Triton reports it
    assert http.get_model_config("nobatch")["max_batch_size"] == 0


def test_health_and_metadata_grpc(grpc: Any) -> None:
    assert grpc.is_server_live() and grpc.is_server_ready()
    assert grpc.is_model_ready("cnn") and not grpc.is_model_ready("nope")
    assert "statistics" in grpc.get_server_metadata(as_json=True)["extensions"]
    meta = grpc.get_model_metadata("cnn", as_json=True)
    assert meta["inputs"][0]["shape"] == ["-1", "3", "32", "32"]
    config = grpc.get_model_config("cnn", as_json=True)["config"]
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == ["3", "32", "32"]


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_matches_engine(http: Any, reference: Any, binary: bool) -> None:
    x = _x(3, np.random.default_rng())
    inp = thttp.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = thttp.InferRequestedOutput("logits", binary_data=binary)
    result = http.infer("cnn", [inp], outputs=[out], request_id="r-7")
    np.testing.assert_allclose(result.as_numpy("logits"), reference("small_cnn", {"x": x})["logits"], rtol=1e-5)
    assert result.get_response()["id"] == "r-7" and result.get_response()["model_version"] == "1"


def test_http_infer_defaults_version_and_two_inputs(http: Any, reference: Any) -> None:
    rng = np.random.default_rng()
    a, b = (rng.standard_normal((2, 10)).astype(np.float32) for _ in range(2))
    inputs = [thttp.InferInput("a", [2, 10], "FP32"), thttp.InferInput("b", [2, 10], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = http.infer("pair", inputs, model_version="1")  # no outputs given: binary_data_output
    expected = reference("two_io", {"a": a, "b": b})
    for name, value in expected.items():
        np.testing.assert_allclose(result.as_numpy(name), value, rtol=1e-5)


def test_http_async_infer_and_output_subset(http: Any, reference: Any) -> None:
    rng = np.random.default_rng()
    pending = []
    for n in (1, 2, 3, 4):
        x = _x(n, rng)
        inp = thttp.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        pending.append((x, http.async_infer("cnn", [inp], outputs=[thttp.InferRequestedOutput("logits")])))
    for x, handle in pending:
        np.testing.assert_allclose(handle.get_result().as_numpy("logits"),
                                   reference("small_cnn", {"x": x})["logits"], rtol=1e-5)


def test_grpc_infer_sync_async_and_stream(grpc: Any, reference: Any) -> None:
    rng = np.random.default_rng()
    x = _x(2, rng)
    inp = tgrpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    expected = reference("small_cnn", {"x": x})["logits"]
    result = grpc.infer("cnn", [inp], outputs=[tgrpc.InferRequestedOutput("logits")], request_id="g1")
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5)
    assert result.get_response().id == "g1"

    done: queue.Queue[Any] = queue.Queue()
    grpc.async_infer("cnn", [inp], callback=lambda result, error: done.put((result, error)))
    r, e = done.get(timeout=30)
    assert e is None
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5)

    grpc.start_stream(callback=lambda result, error: done.put((result, error)))
    try:
        for _ in range(3):
            grpc.async_stream_infer("cnn", [inp])
        for _ in range(3):
            r, e = done.get(timeout=30)
            assert e is None
            np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5)
    finally:
        grpc.stop_stream()


def test_grpc_typed_contents_request(server: Any, reference: Any) -> None:
    """A plain gRPC client sending typed fp32_contents instead of raw bytes."""
    import grpc as grpclib
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    x = _x(1, np.random.default_rng())
    request = service_pb2.ModelInferRequest(model_name="cnn")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    with grpclib.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    out = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(1, 10)
    np.testing.assert_allclose(out, reference("small_cnn", {"x": x})["logits"], rtol=1e-5)


def test_statistics_http_and_grpc(http: Any, grpc: Any) -> None:
    x = _x(2, np.random.default_rng())
    inp = thttp.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    before = http.get_inference_statistics("cnn")["model_stats"][0]
    http.infer("cnn", [inp])
    after = http.get_inference_statistics("cnn", "1")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert after["inference_count"] >= before["inference_count"] + 2
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert after["inference_stats"][key]["ns"] > 0
    every = http.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in every} >= {"cnn", "pair", "nobatch"}
    stats = grpc.get_inference_statistics("cnn", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) >= 1 and stats["batch_stats"]


def test_repository_index_load_unload(http: Any, grpc: Any) -> None:
    index = {(m["name"], m.get("version", "")): m for m in http.get_model_repository_index()}
    assert index[("cnn", "1")]["state"] == "READY"
    assert index[("broken", "")]["state"] == "UNAVAILABLE"
    grpc_index = grpc.get_model_repository_index(as_json=True)["models"]
    assert any(m["name"] == "cnn" and m["state"] == "READY" for m in grpc_index)

    http.unload_model("pair")
    assert not http.is_model_ready("pair")
    states = {m["name"]: m for m in http.get_model_repository_index()}
    assert states["pair"]["state"] == "UNAVAILABLE" and states["pair"]["reason"] == "unloaded"
    with pytest.raises(InferenceServerException) as err:
        http.get_model_metadata("pair")
    assert err.value.status() == "503"
    http.load_model("pair")
    assert http.is_model_ready("pair")

    grpc.unload_model("pair")
    assert not grpc.is_model_ready("pair")
    grpc.load_model("pair")
    assert grpc.is_model_ready("pair")


def test_load_with_config_override(http: Any) -> None:
    override = {"max_batch_size": 2, "dynamic_batching": {"max_queue_delay_microseconds": 100}}
    http.load_model("pair", config=json.dumps(override))
    try:
        assert http.get_model_config("pair")["max_batch_size"] == 2
    finally:
        http.load_model("pair")
    assert http.get_model_config("pair")["max_batch_size"] == 16


def test_failed_load_is_unavailable_with_reason(http: Any, grpc: Any) -> None:
    with pytest.raises(InferenceServerException) as err:
        http.load_model("broken")
    assert "no version directory" in str(err.value) or "no model.plan" in str(err.value)
    row = next(m for m in http.get_model_repository_index() if m["name"] == "broken")
    assert row["state"] == "UNAVAILABLE" and "model" in row["reason"]
    with pytest.raises(InferenceServerException):
        grpc.load_model("broken")
    assert http.is_server_ready() and http.is_model_ready("cnn")  # the others are unaffected


def test_errors_reach_the_client(http: Any, grpc: Any) -> None:
    x = np.zeros((1, 3, 32, 32), np.float64)
    inp = thttp.InferInput("x", list(x.shape), "FP64")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as err:
        http.infer("cnn", [inp])
    assert err.value.status() == "400" and "FP64" in str(err.value) and "FP32" in str(err.value)
    with pytest.raises(InferenceServerException) as err:
        http.infer("nope", [inp])
    assert err.value.status() == "404"
    ginp = tgrpc.InferInput("x", list(x.shape), "FP64")
    ginp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("cnn", [ginp])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("cnn", [ginp], model_version="9")
    assert err.value.status() == "StatusCode.NOT_FOUND"
