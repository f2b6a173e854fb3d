"""Triton-style Python models (``backend: "python"``, ``model.py`` with ``TritonPythonModel``) served by the
real server and queried with tritonclient over HTTP and gRPC: results, dynamic batching, errors that
reach only their request, load failures, and finalize at unload."""

from __future__ import annotations

import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(180)

# Triton's add_sub example (python_backend/examples/add_sub), batched, plus an output telling how many
# requests the execute() call that answered had, and a finalize that leaves a file behind.
ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 300000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "greeting" value: { string_value: "hello" } }
"""

ADD_SUB_MODEL = '''
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        assert model_config["parameters"]["greeting"]["string_value"] == "hello"
        assert args["model_name"] == "add_sub" and args["model_version"] == "1"
        assert args["model_instance_kind"] in ("CPU", "GPU") and args["model_instance_device_id"] == "0"
        self.folder = Path(args["model_repository"])
        self.instance = args["model_instance_name"]
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])
        pb_utils.Logger.log_info(f"add_sub {self.instance} initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            rows = in_0.as_numpy().shape[0]
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0.as_numpy() + in_1.as_numpy()).astype(self.output0_dtype))
            out_1 = pb_utils.Tensor("OUTPUT1", (in_0.as_numpy() - in_1.as_numpy()).astype(self.output1_dtype))
            seen = pb_utils.Tensor("REQUESTS", np.full((rows, 1), len(requests), np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1, seen]))
        return responses

    def finalize(self):
        (self.folder / f"finalized_{self.instance}").write_text("bye")
'''

# Markers in X: 666 raises inside execute(), 777 answers with TritonError(INVALID_ARG), 555 returns float64,
# 444 leaves the output out. Every other request gets Y = 2 X and SEEN = the size of its execute() call.
PICKY_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "SEEN" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 300000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

PICKY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        if any(666 in pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests):
            raise ValueError("marker 666 found")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            seen = pb_utils.Tensor("SEEN", np.full((x.shape[0], 1), len(requests), np.int32))
            if 777 in x:
                error = pb_utils.TritonError("value 777 is not allowed", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif 555 in x:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float64) * 2), seen]))
            elif 444 in x:
                responses.append(pb_utils.InferenceResponse([seen]))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2), seen]))
        return responses
'''

STRINGS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }, { name: "LENGTH" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""

STRINGS_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            assert request.requested_output_names() in (["UPPER"], ["UPPER", "LENGTH"], ["LENGTH"])
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text], dtype=np.object_)
            length = np.array([len(t) for t in text], dtype=np.int64)
            tensors = [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''

BROKEN_INIT_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("cannot find the weights file")

    def execute(self, requests):
        return []
'''

WRONG_COUNT_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return []  # one response per request is missing
'''

AUTO_COMPLETE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

LOADED = []  # module state: auto_complete_config's import is dropped, so initialize sees a fresh module


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        LOADED.append("auto_complete")
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.add_output({"name": "SQUARE", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        assert LOADED == [], LOADED

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SQUARE", x * x)]))
        return out
'''

SIMPLE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

# Two Python steps in a Triton ensemble: QUAD = 2 (2 X).
PY_CHAIN = """
name: "py_chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "QUAD" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "picky" input_map { key: "X" value: "X" }
      output_map [ { key: "Y" value: "DOUBLED" }, { key: "SEEN" value: "SEEN1" } ] },
    { model_name: "picky_strict" input_map { key: "X" value: "DOUBLED" }
      output_map [ { key: "Y" value: "QUAD" }, { key: "SEEN" value: "SEEN2" } ] }
  ]
}
"""

STARTUP = ("add_sub", "picky", "picky_strict", "strings", "autocomplete", "py_chain")


def write_model(repo: Path, name: str, config: str, model: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(model))
    return repo / name


def make_repo(root: Path) -> Path:
    write_model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB_MODEL)
    write_model(root, "picky", PICKY_CONFIG, PICKY_MODEL)
    strict = PICKY_CONFIG + 'parameters { key: "ISOLATE_FAILED_BATCHES" value: { string_value: "no" } }\n'
    write_model(root, "picky_strict", strict, PICKY_MODEL)
    write_model(root, "strings", STRINGS_CONFIG, STRINGS_MODEL)
    write_model(root, "broken_init", SIMPLE_CONFIG, BROKEN_INIT_MODEL)
    write_model(root, "autocomplete", 'backend: "python"', AUTO_COMPLETE_MODEL)
    (root / "py_chain" / "1").mkdir(parents=True)
    (root / "py_chain" / "config.pbtxt").write_text(PY_CHAIN)
    write_model(root, "wrong_count", SIMPLE_CONFIG, WRONG_COUNT_MODEL)
    return root


def config(**changes: Any) -> ServerConfig:
    return ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0,
                        startup_models=STARTUP).replace(**changes)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("pyrepo"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerThread]:
    with ServerThread(repo, config(), start_timeout=60) as running:
        yield running




def add_sub_inputs(module: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def x_input(module: Any, x: np.ndarray) -> list[Any]:
    item = module.InferInput("X", list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    return [item]


def test_add_sub_http_and_grpc(http: Any, grpc: Any) -> None:
    rng = np.random.default_rng()
    for client, module in ((http, thttp), (grpc, tgrpc)):
        a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
        result = client.infer("add_sub", add_sub_inputs(module, a, b), request_id="r-1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        assert result.as_numpy("REQUESTS").shape == (3, 1)
        assert result.get_response(as_json=True)["id"] == "r-1" if module is tgrpc else \
            result.get_response()["id"] == "r-1"


def test_metadata_and_config(http: Any, grpc: Any) -> None:
    meta = http.get_model_metadata("add_sub")
    assert meta["platform"] == "python"
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    cfg = http.get_model_config("add_sub")
    assert cfg["backend"] == "python" and cfg["max_batch_size"] == 8 and cfg["instance_group"][0]["count"] == 2
    assert grpc.get_model_config("picky", as_json=True)["config"]["backend"] == "python"
    assert http.is_model_ready("add_sub") and http.is_model_ready("strings")


def test_requested_outputs_only(http: Any) -> None:
    a, b = np.ones((1, 4), np.float32), np.full((1, 4), 2, np.float32)
    result = http.infer("add_sub", add_sub_inputs(thttp, a, b), outputs=[thttp.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_dynamic_batching_gives_execute_several_requests(server: ServerThread, http: Any) -> None:
    before = http.get_inference_statistics("add_sub")["model_stats"][0]
    rng = np.random.default_rng()
    pairs = [(rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((1, 4)).astype(np.float32))
             for _ in range(6)]
    pending = [http.async_infer("add_sub", add_sub_inputs(thttp, *p)) for p in pairs]  # gevent: no threads
    results = [p.get_result() for p in pending]
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    seen = [int(r.as_numpy("REQUESTS")[0, 0]) for r in results]
    assert max(seen) > 1, seen  # requests that arrived within the queue delay shared an execute() call
    after = http.get_inference_statistics("add_sub")["model_stats"][0]
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert int(after["inference_count"]) - int(before["inference_count"]) == 6
    assert executions < 6


def _infer_concurrently(http: Any, xs: list[np.ndarray], model: str = "picky") -> list[Any]:
    """Send all of ``xs`` at once (they arrive within the 300 ms queue delay); results or errors, in order."""
    pending = [http.async_infer(model, x_input(thttp, x)) for x in xs]
    results = []
    for p in pending:
        try:
            results.append(p.get_result())
        except InferenceServerException as exc:
            results.append(exc)
    return results


def _good(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 100, (1, 5)).astype(np.float32)


def test_triton_error_reaches_only_its_request(http: Any) -> None:
    rng = np.random.default_rng()
    xs = [_good(rng), _good(rng), np.array([[1, 777, 3, 4, 5]], np.float32), _good(rng)]
    results = _infer_concurrently(http, xs)
    bad = results[2]
    assert isinstance(bad, InferenceServerException) and bad.status() == "400"
    assert "value 777 is not allowed" in bad.message()
    for x, result in zip(xs, results, strict=True):
        if x is not xs[2]:
            np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
            assert int(result.as_numpy("SEEN")[0, 0]) == 4  # one execute() call answered all four


def test_exception_in_execute_reaches_only_its_request(server: ServerThread, http: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng()
    before = http.get_inference_statistics("picky")["model_stats"][0]
    xs = [_good(rng), np.array([[666, 1, 2, 3, 4]], np.float32), _good(rng)]
    with caplog.at_level("ERROR", logger="streamrt.serve.models.python_backend.runner"):
        results = _infer_concurrently(http, xs)
    bad = results[1]
    assert isinstance(bad, InferenceServerException) and bad.status() == "500"
    assert "Failed to process the request(s) for model instance 'picky_0_0'" in bad.message()
    assert "ValueError: marker 666 found" in bad.message()
    np.testing.assert_array_equal(results[0].as_numpy("Y"), xs[0] * 2)
    np.testing.assert_array_equal(results[2].as_numpy("Y"), xs[2] * 2)
    after = http.get_inference_statistics("picky")["model_stats"][0]
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1  # one batch of three
    assert int(after["inference_stats"]["fail"]["count"]) - int(before["inference_stats"]["fail"]["count"]) == 1
    traces = [r for r in caplog.records if r.exc_info and "marker 666" in str(r.exc_info[1])]
    assert traces, "the traceback of the user's exception belongs in the server log"
    assert http.is_server_live() and http.is_model_ready("picky")


def test_without_isolation_an_exception_fails_the_whole_batch_as_in_triton(http: Any) -> None:
    rng = np.random.default_rng()
    results = _infer_concurrently(http, [_good(rng), np.array([[666, 1, 2, 3, 4]], np.float32), _good(rng)],
                                  "picky_strict")
    assert all(isinstance(r, InferenceServerException) and "marker 666 found" in r.message() for r in results)


@pytest.mark.parametrize("marker, words", [(555, "has datatype FP64, the config says TYPE_FP32"),
                                           (444, "the response has no output 'Y'")])
def test_output_checked_against_config_grpc(grpc: Any, marker: int, words: str) -> None:
    x = np.array([[marker, 2.0]], np.float32)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("picky", x_input(tgrpc, x))
    assert info.value.status() == "StatusCode.INTERNAL" and words in info.value.message()
    good = np.array([[1.5, 2.5]], np.float32)
    np.testing.assert_array_equal(grpc.infer("picky", x_input(tgrpc, good)).as_numpy("Y"), good * 2)


def test_strings_grpc_and_requested_outputs(grpc: Any) -> None:
    text = np.array([b"abc", b"hello world", b""], dtype=np.object_)
    item = tgrpc.InferInput("TEXT", [3], "BYTES")
    item.set_data_from_numpy(text)
    result = grpc.infer("strings", [item], outputs=[tgrpc.InferRequestedOutput("UPPER")])
    assert result.as_numpy("UPPER").tolist() == [b"ABC", b"HELLO WORLD", b""]
    assert result.as_numpy("LENGTH") is None


def test_input_validation_is_the_servers(http: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        http.infer("add_sub", add_sub_inputs(thttp, np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)))
    assert info.value.status() == "400" and "expects [-1, 4]" in info.value.message()


def test_wrong_response_count_fails_the_batch_not_the_server(http: Any) -> None:
    http.load_model("wrong_count")
    x = np.ones((1, 2), np.float32)
    for _ in range(2):  # the instance keeps serving after the bad return
        with pytest.raises(InferenceServerException) as info:
            http.infer("wrong_count", x_input(thttp, x))
        assert info.value.status() == "500"
        assert "execute() returned 0 responses for 1 requests" in info.value.message()
    http.unload_model("wrong_count")


def test_initialize_error_makes_model_unavailable(http: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        http.load_model("broken_init")
    assert "cannot find the weights file" in info.value.message()
    row = next(r for r in http.get_model_repository_index() if r["name"] == "broken_init")
    assert row["state"] == "UNAVAILABLE" and "initialize() of instance broken_init_0_0 raised" in row["reason"]
    assert http.is_server_live() and not http.is_model_ready("broken_init")


def test_auto_complete_config_fills_in_the_config(http: Any) -> None:
    cfg = http.get_model_config("autocomplete")
    assert cfg["max_batch_size"] == 4 and "dynamic_batching" in cfg
    assert [t["name"] for t in cfg["input"]] == ["X"] and cfg["output"][0]["data_type"] == "TYPE_INT64"
    x = np.random.default_rng().integers(-1000, 1000, (3, 2), dtype=np.int64)
    item = thttp.InferInput("X", [3, 2], "INT64")
    item.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("autocomplete", [item]).as_numpy("SQUARE"), x * x)


def test_python_steps_in_an_ensemble_and_an_error_in_a_step(http: Any, grpc: Any) -> None:
    rng = np.random.default_rng()
    xs = [_good(rng), np.array([[1, 777, 3, 4, 5]], np.float32), _good(rng)]
    results = _infer_concurrently(http, xs, "py_chain")
    assert isinstance(results[1], InferenceServerException) and results[1].status() == "400"
    assert "value 777 is not allowed" in results[1].message()
    for i in (0, 2):
        np.testing.assert_allclose(results[i].as_numpy("QUAD"), xs[i] * 4, rtol=1e-6)
    x = _good(rng)
    np.testing.assert_allclose(grpc.infer("py_chain", x_input(tgrpc, x)).as_numpy("QUAD"), x * 4, rtol=1e-6)


def test_import_error_is_the_load_error(http: Any, repo: Path) -> None:
    write_model(repo, "syntax_error", SIMPLE_CONFIG, "def execute(self, requests)\n    return []\n")
    with pytest.raises(InferenceServerException) as info:
        http.load_model("syntax_error")
    assert "importing model.py raised SyntaxError" in info.value.message()
    assert http.is_server_live() and http.is_model_ready("add_sub")


def test_reload_while_serving_swaps_instances(http: Any) -> None:
    a = np.random.default_rng().standard_normal((2, 4)).astype(np.float32)
    http.load_model("add_sub")  # READY: the new instances load beside the old, which finalize after the swap
    np.testing.assert_array_equal(http.infer("add_sub", add_sub_inputs(thttp, a, a)).as_numpy("OUTPUT0"), 2 * a)
    assert http.is_model_ready("add_sub")


def test_unload_calls_finalize_on_every_instance(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    with ServerThread(repo, config(startup_models=("add_sub",), metrics_port=0), start_timeout=60) as running:
        client = thttp.InferenceServerClient(f"127.0.0.1:{running.http_port}")
        a = np.ones((2, 4), np.float32)
        assert client.infer("add_sub", add_sub_inputs(thttp, a, a)).as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
        with urllib.request.urlopen(f"http://127.0.0.1:{running.metrics_port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
        assert 'nv_inference_count{model="add_sub",version="1"} 2' in metrics  # rows, as for engine models
        assert not list((repo / "add_sub").glob("finalized_*"))
        client.unload_model("add_sub")
        finalized = sorted(p.name for p in (repo / "add_sub").glob("finalized_*"))
        assert finalized == ["finalized_add_sub_0_0", "finalized_add_sub_0_1"]
        assert not client.is_model_ready("add_sub")
        client.load_model("add_sub")  # model.py imports afresh: no state left from the unloaded instances
        assert client.infer("add_sub", add_sub_inputs(thttp, a, a)).as_numpy("OUTPUT1").tolist() == [[0.0] * 4] * 2
        client.close()


def _top_k(rows: np.ndarray, k: int) -> list[list[bytes]]:
    """Triton's classification strings ("<value>:<index>") of each row, highest first."""
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    return [[f"{row[i]:f}:{i}".encode() for i in idx] for row, idx in zip(rows.astype(np.float64), order, strict=True)]


def test_classification_of_a_python_model_and_an_ensemble_output(http: Any, grpc: Any) -> None:
    """Triton applies the classification extension to any model's output: Python models and
    ensembles included (both were refused with 400 before the kinds shared one request path)."""
    rng = np.random.default_rng()
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    for client, module in ((http, thttp), (grpc, tgrpc)):
        wanted = [module.InferRequestedOutput("OUTPUT0", class_count=2)]
        top = client.infer("add_sub", add_sub_inputs(module, a, b), outputs=wanted).as_numpy("OUTPUT0")
        assert top.shape == (3, 2)
        assert [list(row) for row in top] == _top_k(a + b, 2)
    x = _good(rng)
    quad = http.infer("py_chain", x_input(thttp, x), outputs=[thttp.InferRequestedOutput("QUAD", class_count=3)])
    assert [list(row) for row in quad.as_numpy("QUAD")] == _top_k(x * 4, 3)
