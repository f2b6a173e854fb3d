"""StreamRT beside a real Triton: the same malformed and edge-case requests, the same status class.

The reference is the ``tritonserver`` bundled in nvidia-pytriton 0.7.0 (Triton 2.51, python backend,
CPU), from its own venv (it needs numpy<2): ``$STREAMRT_PYTRITON_PYTHON`` or
``/work/venvs/pytriton/bin/python``, made by ``scripts/setup_triton_reference.sh``. Without it the
module is skipped. ``triton_reference.py`` serves there the functions StreamRT serves here as ONNX:
``pair`` (sum and product of two FP32 [-1, 10] inputs) and ``reduce`` (the batch-reducing mean).

Each case is sent to both over HTTP (raw bodies) and, where the protocol can carry it, gRPC; the
status classes (2xx, 4xx client error, 5xx server error; gRPC codes mapped the same way) must match,
except the deliberate differences listed in :data:`DELIBERATE`, each explained in docs/serving.md
("Where StreamRT answers differently from Triton"). Those are asserted exactly, so a change on
either side shows up here.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from streamrt.backends.base import Engine, ExecutionContext
from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.models.model import load_engine
from streamrt.testing.batch_models import reducing_model

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DEFAULT_PYTHON = Path("/work/venvs/pytriton/bin/python")
REFERENCE_SCRIPT = Path(__file__).with_name("triton_reference.py")
BATCHING = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 100_000}}

# (case, protocol) -> (StreamRT's class, Triton's class) where StreamRT answers differently on purpose.
DELIBERATE: dict[tuple[str, str], tuple[str, str]] = {
    ("data count does not match the shape", "http"): ("4xx", "5xx"),
    ("malformed JSON", "http"): ("4xx", "5xx"),
    ("batch-reducing model, one row", "http"): ("5xx", "2xx"),
    ("batch-reducing model, one row", "grpc"): ("5xx", "2xx"),
}


def _pytriton_python() -> Path | None:
    given = os.environ.get("STREAMRT_PYTRITON_PYTHON")
    path = Path(given) if given else DEFAULT_PYTHON
    if not path.is_file():
        return None
    probe = subprocess.run([str(path), "-c", "import pytriton.triton"], capture_output=True, timeout=120)
    return path if probe.returncode == 0 else None


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    python = _pytriton_python()
    if python is None:
        pytest.skip("no nvidia-pytriton venv: run scripts/setup_triton_reference.sh "
                    "(or set STREAMRT_PYTRITON_PYTHON to its python)")
    http_port, grpc_port, metrics_port = _free_ports(3)
    ready_file = tmp_path_factory.mktemp("triton_reference") / "ready"
    # A session of its own: tritonserver starts python-backend stubs that can outlive it if it dies;
    # teardown ends whatever is left of that group.
    process = subprocess.Popen([str(python), str(REFERENCE_SCRIPT), str(http_port), str(grpc_port), str(metrics_port),
                                str(ready_file)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not ready_file.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not ready_file.exists() or process.poll() is not None:
            pytest.fail("the reference Triton did not start:\n" + "".join(lines[-40:]))
        yield Ports(http_port, grpc_port)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        reader.join(10)


def _pair_model() -> onnx.ModelProto:
    a, b, total, prod = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 10])
                         for n in ("a", "b", "sum", "prod"))
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])]
    graph = helper.make_graph(nodes, "pair", [a, b], [total, prod])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class _Loaded:
    done = False


class LateReducingEngine(Engine):
    """The reducing model, honest (a mean per row) while the server loads it, then reducing the whole
    batch as the real one does: what the per-batch check must stop, since the load probe passed."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.manifest)
        self.inner, self.device_kind = inner, inner.device_kind

    def create_context(self) -> ExecutionContext:
        return LateReducingContext(self)

    def close(self) -> None:
        self.inner.close()
        super().close()


class LateReducingContext(ExecutionContext):
    engine: LateReducingEngine

    def __init__(self, engine: LateReducingEngine) -> None:
        super().__init__(engine)
        self.inner = engine.inner.create_context()

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        if _Loaded.done:
            return self.inner.infer(inputs, stream)
        x = np.asarray(inputs["x"])
        return {"y": x.mean(axis=(1, 2, 3), keepdims=True, dtype=np.float32)}


def _loader(model_dir: Path, version: int, config: ModelConfig) -> Engine:
    engine = load_engine(model_dir, version, config)
    return LateReducingEngine(engine) if config.name == "reduce_late" else engine


@pytest.fixture(scope="module")
def streamrt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    repo = tmp_path_factory.mktemp("repo")
    for name, model in (("pair", _pair_model()), ("reduce", reducing_model()), ("reduce_late", reducing_model())):
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.yaml").write_text(yaml.safe_dump(BATCHING))
    cfg = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0, strict_readiness=False)
    _Loaded.done = False
    with ServerThread(repo, cfg, engine_loader=_loader, start_timeout=300) as running:
        _Loaded.done = True
        assert running.http_port is not None and running.grpc_port is not None
        yield Ports(running.http_port, running.grpc_port)
    _Loaded.done = False


# --- the cases ----------------------------------------------------------------------------------


def _tensor(name: str, array: np.ndarray, datatype: str = "FP32", count: int | None = None) -> dict[str, Any]:
    data = array.ravel().tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "data": data if count is None else data[:count]}


def _body(*tensors: dict[str, Any]) -> bytes:
    return json.dumps({"inputs": list(tensors)}).encode()


A = np.arange(10, dtype=np.float32).reshape(1, 10) / 7
X1 = np.linspace(-1, 1, 48, dtype=np.float32).reshape(1, 3, 4, 4)
X2 = np.concatenate([X1, X1 * 3])

# case -> (HTTP path, body); the model and version are in the path.
HTTP_CASES: dict[str, tuple[str, bytes]] = {
    "valid request": ("/v2/models/pair/infer", _body(_tensor("a", A), _tensor("b", A))),
    "data count does not match the shape": ("/v2/models/pair/infer", _body(_tensor("a", A, count=9), _tensor("b", A))),
    "malformed JSON": ("/v2/models/pair/infer", b'{"inputs": [ {"name": '),
    "wrong dtype": ("/v2/models/pair/infer", _body(_tensor("a", A.astype(np.int32), "INT32"), _tensor("b", A))),
    "missing input": ("/v2/models/pair/infer", _body(_tensor("a", A))),
    "unknown version": ("/v2/models/pair/versions/7/infer", _body(_tensor("a", A), _tensor("b", A))),
    "unknown model": ("/v2/models/nope/infer", _body(_tensor("a", A), _tensor("b", A))),
    "batch-reducing model, one row": ("/v2/models/reduce/infer", _body(_tensor("x", X1))),
    "batch-reducing model, two rows": ("/v2/models/reduce/infer", _body(_tensor("x", X2))),
}

RawInputs = list[tuple[str, str, list[int], bytes]]
# case -> (model, version, inputs as (name, datatype, shape, raw bytes))
GRPC_CASES: dict[str, tuple[str, str, RawInputs]] = {
    "valid request": ("pair", "", [("a", "FP32", [1, 10], A.tobytes()), ("b", "FP32", [1, 10], A.tobytes())]),
    "data count does not match the shape": (
        "pair", "", [("a", "FP32", [1, 10], A.tobytes()[:-4]), ("b", "FP32", [1, 10], A.tobytes())]),
    "wrong dtype": ("pair", "", [("a", "INT32", [1, 10], A.astype(np.int32).tobytes()),
                                 ("b", "FP32", [1, 10], A.tobytes())]),
    "missing input": ("pair", "", [("a", "FP32", [1, 10], A.tobytes())]),
    "unknown version": ("pair", "7", [("a", "FP32", [1, 10], A.tobytes()), ("b", "FP32", [1, 10], A.tobytes())]),
    "batch-reducing model, one row": ("reduce", "", [("x", "FP32", [1, 3, 4, 4], X1.tobytes())]),
    "batch-reducing model, two rows": ("reduce", "", [("x", "FP32", [2, 3, 4, 4], X2.tobytes())]),
}

_CLIENT_CODES = {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION", "UNAUTHENTICATED",
                 "PERMISSION_DENIED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"}


def _http_class(port: int, path: str, body: bytes) -> tuple[str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read()[:300].decode(errors="replace")
        return f"{response.status // 100}xx", f"{response.status} {text}"
    finally:
        conn.close()


def _grpc_class(port: int, model: str, version: str, inputs: RawInputs) -> tuple[str, str]:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            return "2xx", "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
            return ("4xx" if code in _CLIENT_CODES else "5xx"), f"{code} {exc.details()[:300]}"


def _compare(case: str, protocol: str, ours: tuple[str, str], theirs: tuple[str, str]) -> None:
    expected = DELIBERATE.get((case, protocol))
    detail = f"{case} over {protocol}: StreamRT {ours[1]!r} / Triton {theirs[1]!r}"
    if expected is None:
        assert ours[0] == theirs[0], detail
    else:
        assert (ours[0], theirs[0]) == expected, f"the documented difference changed: {detail}"


@pytest.mark.parametrize("case", list(HTTP_CASES))
def test_http_status_class_matches_triton(case: str, triton: Ports, streamrt_server: Ports) -> None:
    path, body = HTTP_CASES[case]
    _compare(case, "http", _http_class(streamrt_server.http, path, body), _http_class(triton.http, path, body))


@pytest.mark.parametrize("case", list(GRPC_CASES))
def test_grpc_status_class_matches_triton(case: str, triton: Ports, streamrt_server: Ports) -> None:
    args = GRPC_CASES[case]
    _compare(case, "grpc", _grpc_class(streamrt_server.grpc, *args), _grpc_class(triton.grpc, *args))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_whose_batch_does_not_follow_at_run_time_is_a_server_error_on_both(
    protocol: str, triton: Ports, streamrt_server: Ports
) -> None:
    """StreamRT's reduce_late passed the load probe and reduces batches afterwards: its per-batch check
    answers 5xx, as Triton does for the reducing python model (Triton has no load probe)."""
    if protocol == "http":
        ours = _http_class(streamrt_server.http, "/v2/models/reduce_late/infer", _body(_tensor("x", X2)))
        theirs = _http_class(triton.http, "/v2/models/reduce/infer", _body(_tensor("x", X2)))
    else:
        raw = [("x", "FP32", [2, 3, 4, 4], X2.tobytes())]
        ours = _grpc_class(streamrt_server.grpc, "reduce_late", "", raw)
        theirs = _grpc_class(triton.grpc, "reduce", "", raw)
    assert ours[0] == theirs[0] == "5xx", (ours, theirs)
    assert "output 'y'" in ours[1] and "[1, 1, 1, 1]" in ours[1], ours
