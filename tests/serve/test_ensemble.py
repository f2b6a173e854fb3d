"""Ensembles served to the real tritonclient (HTTP and gRPC): a 2-step chain and a diamond DAG over
ONNX Runtime models, compared with the same models chained in-process; a step failing for one
request only; bad configs refused by name; metadata, config, statistics and metrics."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamrt.errors import ConfigError, ShapeError
from streamrt.serve.configs.config import ModelConfig, ServerConfig, TensorConfig
from streamrt.serve.configs.config_message import from_mapping, read_config_file
from streamrt.serve.configs.ensemble_config import EnsembleConfig, EnsembleStep
from streamrt.serve.models.ensemble import EnsembleModel
from streamrt.serve.models.model import load_engine
from streamrt.serve.models.repository import ModelRepository
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.server import ServerThread
from streamrt.serve.wire.protocol import InferRequest, InferResponse
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.testing.models import CATALOGUE
from streamrt.types import DType

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.timeout(180)

RTOL, ATOL = 1e-5, 1e-5
"""Served vs in-process ONNX Runtime, both fp32: only batching may reorder the float sums."""


def affine(seed: int) -> onnx.ModelProto:
    """y = tanh(x @ W + b), x and y [N, 10]."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
             helper.make_node("Tanh", ["z"], ["y"])]
    graph = helper.make_graph(
        nodes, f"affine{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(rng.standard_normal((10, 10)).astype(np.float32) / 3, "w"),
         numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


MODELS = {"cnn": CATALOGUE["small_cnn"].make(), "pair": CATALOGUE["two_io"].make(),
          "affine_a": affine(1), "affine_b": affine(2)}

ENGINE_CONFIG = 'max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 1000 }\n'

CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 10 ] },
         { name: "PROBS" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    { model_name: "cnn" model_version: -1
      input_map { key: "x" value: "IMAGE" } output_map { key: "logits" value: "LOGITS" } },
    { model_name: "pair" model_version: 1
      input_map [ { key: "a" value: "LOGITS" }, { key: "b" value: "B" } ]
      output_map [ { key: "sum" value: "SUM" }, { key: "probs" value: "PROBS" } ] }
  ]
}
"""

# Steps listed out of order on purpose: the scheduler follows the tensors, not the list.
DIAMOND = """
name: "diamond"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 10 ] }, { name: "PROBS" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    { model_name: "pair" input_map [ { key: "a" value: "LEFT" }, { key: "b" value: "RIGHT" } ]
      output_map [ { key: "sum" value: "SUM" }, { key: "probs" value: "PROBS" } ] },
    { model_name: "affine_b" input_map { key: "x" value: "LOGITS" } output_map { key: "y" value: "RIGHT" } },
    { model_name: "cnn" input_map { key: "x" value: "IMAGE" } output_map { key: "logits" value: "LOGITS" } },
    { model_name: "affine_a" input_map { key: "x" value: "LOGITS" } output_map { key: "y" value: "LEFT" } }
  ]
}
"""


def write_repo(root: Path) -> Path:
    for name, model in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
        (root / name / "config.pbtxt").write_text(ENGINE_CONFIG)
    for name, text in (("chain", CHAIN), ("diamond", DIAMOND)):
        (root / name / "1").mkdir(parents=True)  # Triton's layout: an ensemble has an empty version folder
        (root / name / "config.pbtxt").write_text(text)
    return root


class Reference:
    """The same models chained in-process with ONNX Runtime."""

    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.sessions = {n: ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
                         for n, m in MODELS.items()}
        self.lock = threading.Lock()

    def run(self, name: str, **inputs: np.ndarray) -> list[np.ndarray]:
        with self.lock:
            return list(self.sessions[name].run(None, inputs))

    def chain(self, image: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (logits,) = self.run("cnn", x=image)
        total, probs = self.run("pair", a=logits, b=b)
        return total, probs

    def diamond(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (logits,) = self.run("cnn", x=image)
        (left,) = self.run("affine_a", x=logits)
        (right,) = self.run("affine_b", x=logits)
        total, probs = self.run("pair", a=left, b=right)
        return total, probs


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = write_repo(tmp_path_factory.mktemp("ensemble-repo"))
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=5.0,
                          startup_models=("chain", "diamond"))  # the steps' models load because of them
    with ServerThread(repo, config, start_timeout=150) as running:
        yield running




def _inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    out = []
    for name, array in arrays.items():
        item = module.InferInput(name, list(array.shape), "FP32")
        item.set_data_from_numpy(array)
        out.append(item)
    return out


def _image(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((n, 3, 32, 32)).astype(np.float32)


# --- serving --------------------------------------------------------------------------------


def test_step_models_are_loaded_by_the_ensembles(server: ServerThread, http: Any) -> None:
    index = {row["name"]: row.get("state") for row in http.get_model_repository_index()}
    assert all(index[n] == "READY" for n in ("chain", "diamond", "cnn", "pair", "affine_a", "affine_b"))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_chain_matches_the_models_run_in_process(protocol: str, http: Any, grpc: Any, reference: Reference) -> None:
    client, module = (http, thttp) if protocol == "http" else (grpc, tgrpc)
    rng = np.random.default_rng()
    image, b = _image(rng, 3), rng.standard_normal((3, 10)).astype(np.float32)
    result = client.infer("chain", _inputs(module, {"IMAGE": image, "B": b}), request_id="req-9")
    total, probs = reference.chain(image, b)
    np.testing.assert_allclose(result.as_numpy("SUM"), total, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(result.as_numpy("PROBS"), probs, rtol=RTOL, atol=ATOL)
    response = result.get_response() if protocol == "http" else result.get_response(as_json=True)
    assert response["id"] == "req-9" and response["model_name"] == "chain"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_diamond_matches_the_models_run_in_process(protocol: str, http: Any, grpc: Any,
                                                   reference: Reference) -> None:
    client, module = (http, thttp) if protocol == "http" else (grpc, tgrpc)
    image = _image(np.random.default_rng(), 4)
    result = client.infer("diamond", _inputs(module, {"IMAGE": image}),
                          outputs=[module.InferRequestedOutput("PROBS")])
    _, probs = reference.diamond(image)
    np.testing.assert_allclose(result.as_numpy("PROBS"), probs, rtol=RTOL, atol=ATOL)
    assert result.as_numpy("SUM") is None  # only what was asked for


def test_a_failing_step_fails_only_its_request(http: Any, reference: Reference) -> None:
    """B has dims [-1] in the ensemble, so width 7 passes the ensemble's check and fails in 'pair'."""
    rng = np.random.default_rng()
    jobs = [(_image(rng, 2), rng.standard_normal((2, 7 if i % 4 == 0 else 10)).astype(np.float32))
            for i in range(16)]

    def result(handle: Any) -> Any:
        try:
            return handle.get_result()
        except InferenceServerException as exc:
            return exc

    handles = [http.async_infer("chain", _inputs(thttp, {"IMAGE": image, "B": b})) for image, b in jobs]
    results = [result(h) for h in handles]  # sent together: they meet in the step models' batches
    for (image, b), result in zip(jobs, results, strict=True):
        if b.shape[1] == 7:
            assert isinstance(result, InferenceServerException)
            assert result.status() == "400"
            assert "ensemble 'chain' step 1 (model 'pair')" in result.message()
            assert "input 'b' of model 'pair' has shape [2, 7]" in result.message()
        else:
            assert not isinstance(result, Exception), result
            np.testing.assert_allclose(result.as_numpy("SUM"), reference.chain(image, b)[0], rtol=RTOL, atol=ATOL)
    assert http.is_model_ready("chain")  # and it keeps serving


def test_metadata_and_config(http: Any, grpc: Any) -> None:
    meta = http.get_model_metadata("chain")
    assert meta["platform"] == "ensemble" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "IMAGE", "datatype": "FP32", "shape": [-1, 3, 32, 32]},
                              {"name": "B", "datatype": "FP32", "shape": [-1, -1]}]
    assert [o["name"] for o in meta["outputs"]] == ["SUM", "PROBS"]
    config = http.get_model_config("diamond")
    assert config["platform"] == "ensemble" and config["max_batch_size"] == 4 and config["instance_group"] == []
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["pair", "affine_b", "cnn", "affine_a"]
    assert steps[0]["input_map"] == {"a": "LEFT", "b": "RIGHT"} and steps[2]["model_version"] == -1
    grpc_config = grpc.get_model_config("chain", as_json=True)["config"]
    assert grpc_config["ensemble_scheduling"]["step"][1]["output_map"] == {"sum": "SUM", "probs": "PROBS"}
    assert grpc.get_model_metadata("chain", as_json=True)["platform"] == "ensemble"


def test_statistics_and_metrics_per_step(server: ServerThread, http: Any, grpc: Any) -> None:
    before = http.get_inference_statistics("diamond")["model_stats"][0]
    pair_before = http.get_inference_statistics("pair")["model_stats"][0]["inference_stats"]["success"]["count"]
    for _ in range(3):
        http.infer("diamond", _inputs(thttp, {"IMAGE": _image(np.random.default_rng(), 2)}))
    stats = http.get_inference_statistics("diamond")["model_stats"][0]
    runs = stats["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert runs == 3 and stats["inference_count"] - before["inference_count"] == 6
    assert stats["execution_count"] - before["execution_count"] == 3
    assert stats["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert stats["inference_stats"]["queue"]["count"] - before["inference_stats"]["queue"]["count"] == 3
    pair_after = http.get_inference_statistics("pair")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert pair_after - pair_before == 3  # the composing model counts the step requests
    assert grpc.get_inference_statistics("diamond", as_json=True)["model_stats"][0]["name"] == "diamond"

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for index, model in ((0, "pair"), (1, "affine_b"), (2, "cnn"), (3, "affine_a")):
        labels = f'model="diamond",version="1",step="{index}",step_model="{model}"'
        line = next(x for x in text.splitlines() if x.startswith(f"streamrt_ensemble_step_success{{{labels}}}"))
        assert float(line.split()[-1]) >= 3
        assert f'streamrt_ensemble_step_duration_us_bucket{{{labels},le="+Inf"}}' in text
    failures = [x for x in text.splitlines() if x.startswith('streamrt_ensemble_step_failure{model="diamond"')]
    assert failures and 'nv_inference_request_success{model="diamond",version="1"}' in text


def test_unloading_an_ensemble_leaves_its_step_models(server: ServerThread, http: Any) -> None:
    http.unload_model("chain")
    try:
        assert not http.is_model_ready("chain") and http.is_model_ready("cnn") and http.is_model_ready("pair")
    finally:
        http.load_model("chain")
    assert http.is_model_ready("chain")


# --- bad configs ----------------------------------------------------------------------------


def _ensemble(steps: list[dict[str, Any]], inputs: list[str] | None = None, outputs: list[str] | None = None,
              **extra: Any) -> dict[str, Any]:
    tensor = {"data_type": "TYPE_FP32", "dims": [10]}
    return {"platform": "ensemble", "max_batch_size": 4,
            "input": [{"name": n, **tensor} for n in inputs or ["IN"]],
            "output": [{"name": n, **tensor} for n in outputs or ["OUT"]],
            "ensemble_scheduling": {"step": steps}, **extra}


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> dict[str, Any]:
    return {"model_name": model, "model_version": -1, "input_map": inputs, "output_map": outputs}


GRAPH_ERRORS = [
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "MID"})]), "output 'OUT' is not produced by any step"),
    (_ensemble([_step("affine_a", {"x": "NOPE"}, {"y": "OUT"})]),
     "step 0 (model 'affine_a') input 'x' reads tensor 'NOPE', which no step produces"),
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"}), _step("affine_b", {"x": "IN"}, {"y": "OUT"})]),
     "tensor 'OUT' is produced by both step 0 (model 'affine_a') and step 1 (model 'affine_b')"),
    (_ensemble([_step("pair", {"a": "IN", "b": "BACK"}, {"sum": "MID", "probs": "OUT"}),
                _step("affine_a", {"x": "MID"}, {"y": "BACK"})]), "the steps form a cycle"),
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})], inputs=["IN", "EXTRA"]),
     "input 'EXTRA' is not read by any step"),
    (_ensemble([]), "ensemble_scheduling needs at least one step"),
    (_ensemble([_step("affine_a", {"x": "IN"}, {})]), "input_map and output_map must each map at least one"),
    ({**_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})]), "platform": "onnxruntime_onnx"},
     "ensemble_scheduling is set but platform is 'onnxruntime_onnx'"),
    ({"platform": "ensemble", "input": [{"name": "IN", "data_type": "FP32", "dims": [1]}]},
     "platform \"ensemble\" needs ensemble_scheduling"),
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})], dynamic_batching={}),
     'multiple "scheduling_choice" oneof fields'),  # Triton's schema: one scheduler per model
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})], instance_group=[{"count": 2}]),
     "an ensemble cannot have instance_group"),
    (_ensemble([{**_step("affine_a", {"x": "IN"}, {"y": "OUT"}), "model_namespace": "ns"}]),
     "config field 'ensemble_scheduling.step[0].model_namespace' is not supported"),
]


@pytest.mark.parametrize(("config", "message"), GRAPH_ERRORS, ids=[m[:30] for _, m in GRAPH_ERRORS])
def test_bad_graphs_are_refused_when_read(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"ensemble|model 'bad'") as info:
        from_mapping(config, "bad")
    assert message in str(info.value)


def test_pbtxt_and_yaml_read_the_same(tmp_path: Path) -> None:
    write_repo(tmp_path)
    from_text = read_config_file(tmp_path / "chain" / "config.pbtxt")
    as_mapping = from_mapping({
        "platform": "ensemble", "max_batch_size": 8,
        "input": [{"name": "IMAGE", "data_type": "FP32", "dims": [3, 32, 32]},
                  {"name": "B", "data_type": "FP32", "dims": [-1]}],
        "output": [{"name": "SUM", "data_type": "FP32", "dims": [10]},
                   {"name": "PROBS", "data_type": "FP32", "dims": [10]}],
        "ensemble_scheduling": {"step": [
            _step("cnn", {"x": "IMAGE"}, {"logits": "LOGITS"}),
            {**_step("pair", {"a": "LOGITS", "b": "B"}, {"sum": "SUM", "probs": "PROBS"}), "model_version": 1}]},
    }, "chain")
    assert from_text.ensemble_scheduling == as_mapping.ensemble_scheduling
    assert from_text.input == as_mapping.input and from_text.output == as_mapping.output


LOAD_ERRORS = [
    (_ensemble([_step("missing_model", {"x": "IN"}, {"y": "OUT"})]),
     "step model 'missing_model' is not in the repository"),
    (_ensemble([_step("affine_a", {"wrong": "IN"}, {"y": "OUT"})]),
     "step 0 (model 'affine_a'): input_map names 'wrong', which is not an input of the model; its inputs are: x"),
    (_ensemble([_step("pair", {"a": "IN"}, {"sum": "OUT"})]),
     "step 0 (model 'pair'): model input 'b' is not in the step's input_map"),
    ({**_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})]),
      "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [10]}]},
     "tensor 'IN' is TYPE_INT32 as ensemble input 'IN' but TYPE_FP32 as input 'x' of step 0 (model 'affine_a')"),
    ({**_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})]),
      "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [12]}]},
     "tensor 'OUT' has shape [-1, 12] as ensemble output 'OUT' but [-1, 10] as output 'y' of step 0"),
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "OUT"})], max_batch_size=16),
     "the ensemble's max_batch_size 16 exceeds the model's 8"),
    (_ensemble([_step("affine_a", {"x": "IN"}, {"y": "MID"}), _step("bad_self", {"x": "MID"}, {"y": "OUT"})]),
     "step model 'bad_self' contains the ensemble again (bad_self -> bad_self)"),
    (_ensemble([{**_step("affine_a", {"x": "IN"}, {"y": "OUT"}), "model_version": 3}]),
     "step 0 (model 'affine_a'): Request for unknown model: 'affine_a' version 3 is not found"),
]


@pytest.mark.parametrize(("config", "message"), LOAD_ERRORS, ids=[m[:30] for _, m in LOAD_ERRORS])
def test_bad_steps_are_refused_at_load(server: ServerThread, http: Any, config: dict[str, Any],
                                       message: str) -> None:
    (server.repository_path / "bad_self" / "1").mkdir(parents=True, exist_ok=True)
    with pytest.raises(InferenceServerException) as info:
        http.load_model("bad_self", config=json.dumps(config))
    assert message in info.value.message()
    assert not http.is_model_ready("bad_self") and http.is_model_ready("affine_a")


# --- the scheduler on its own ---------------------------------------------------------------


class _Step:
    """A fake step model: waits until ``expected`` steps are running at once, then adds 1."""

    def __init__(self, name: str, running: list[str], expected: int) -> None:
        self.name, self.version, self.stats = name, 1, ModelStats()
        self.config = ModelConfig(name=name, max_batch_size=4, input=(TensorConfig("x", DType.FLOAT32, (2,)),),
                                  output=(TensorConfig("y", DType.FLOAT32, (2,)),))
        self.running, self.expected, self.requests = running, expected, []

    async def infer(self, request: InferRequest, trace: Any = None) -> InferResponse:
        self.requests.append(request)
        self.running.append(self.name)
        for _ in range(200):
            if len(self.running) >= self.expected:
                break
            await asyncio.sleep(0.005)
        if trace is not None:
            for mark in ("QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"):
                trace.mark(mark)
        x = request.inputs["x"]
        if x.shape[-1] != 2:
            raise ShapeError(f"input 'x' of model '{self.name}' has shape {list(x.shape)}")
        return InferResponse(self.name, "1", request.id, {"y": x + 1})


def test_independent_steps_of_one_request_run_concurrently() -> None:
    async def main() -> None:
        running: list[str] = []
        models = {"left": _Step("left", running, 2), "right": _Step("right", running, 2),
                  "join": _Step("join", running, 3)}
        tensor = TensorConfig("IN", DType.FLOAT32, (-1,))  # a wrong width reaches the steps
        config = ModelConfig(name="e", platform="ensemble", max_batch_size=4, input=(tensor,),
                             output=(TensorConfig("OUT", DType.FLOAT32, (2,)),))
        ensemble = EnsembleConfig((EnsembleStep("join", -1, {"x": "L"}, {"y": "OUT"}),
                                   EnsembleStep("left", -1, {"x": "IN"}, {"y": "L"}),
                                   EnsembleStep("right", -1, {"x": "IN"}, {"y": "R"})))
        model = EnsembleModel(1, config.replace(ensemble_scheduling=ensemble), ensemble,
                              lambda name, version: models[name])
        model.start()
        x = np.random.default_rng().standard_normal((3, 2)).astype(np.float32)
        trace = RequestTrace(1, "e", "1", "r1")
        response = await model.infer(InferRequest("e", id="r1", inputs={"IN": x}, priority=2, timeout_us=500), trace)
        names = [name for name, _ in trace.timestamps]
        assert {"STEP0_COMPUTE_END", "STEP1_QUEUE_START", "STEP2_COMPUTE_INPUT_END"} <= set(names)
        stats = model.stats.to_kserve("e", "1")
        assert stats["inference_count"] == 3 and stats["execution_count"] == 1
        assert stats["inference_stats"]["compute_infer"]["count"] == 1
        np.testing.assert_array_equal(response.outputs["OUT"], (x + 1) + 1)
        assert sorted(running[:2]) == ["left", "right"] and running[2] == "join"  # both before the join
        sent = models["left"].requests[0]
        assert (sent.id, sent.priority, sent.timeout_us) == ("r1", 2, 500)
        assert models["join"].requests[0].outputs_on_device is False  # it feeds an ensemble output
        assert models["left"].requests[0].outputs_on_device is True   # it feeds only a step
        with pytest.raises(ShapeError, match=r"ensemble 'e' step 1 \(model 'left'\): input 'x'"):
            await model.infer(InferRequest("e", inputs={"IN": np.zeros((1, 3), np.float32)}))
        steps = {s.model: (s.success.count, s.fail.count) for s in model.stats.steps()}
        assert steps["left"] == (1, 1) and steps["join"] == (1, 0)
        await model.stop(1.0)

    asyncio.run(main())


def test_cpu_instances_ignore_the_device_output_flag(server: ServerThread) -> None:
    x = _image(np.random.default_rng(), 2)
    plain = server.call(server.server.infer(InferRequest("cnn", inputs={"x": x})), 60)
    flagged = server.call(server.server.infer(InferRequest("cnn", inputs={"x": x}, outputs_on_device=True)), 60)
    assert isinstance(flagged.outputs["logits"], np.ndarray)
    np.testing.assert_array_equal(flagged.outputs["logits"], plain.outputs["logits"])


def test_every_model_loads_once_when_the_repository_starts(tmp_path: Path) -> None:
    """At start-up the ensembles' loads and the step models' own loads meet; none loads twice."""
    repo = write_repo(tmp_path / "repo")
    loads: list[str] = []

    def counting(model_dir: Path, version: int, config: ModelConfig) -> Any:
        loads.append(config.name)
        return load_engine(model_dir, version, config)

    config = ServerConfig(http_port=None, grpc_port=None, metrics_port=None, exit_timeout_s=5.0)
    with ServerThread(repo, config, engine_loader=counting, start_timeout=150) as running:
        assert running.repository.all_ready()
    assert sorted(loads) == sorted(MODELS)


def test_ensembles_that_contain_each_other_are_refused_not_deadlocked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "affine_a" / "1").mkdir(parents=True)
    onnx.save(MODELS["affine_a"], str(repo / "affine_a" / "1" / "model.onnx"))
    (repo / "affine_a" / "config.pbtxt").write_text(ENGINE_CONFIG)
    e1 = _ensemble([_step("affine_a", {"x": "IN"}, {"y": "MID"}), _step("e2", {"IN": "MID"}, {"OUT": "OUT"})])
    e2 = _ensemble([_step("e1", {"IN": "IN"}, {"OUT": "OUT"})])
    for name, config in (("e1", e1), ("e2", e2)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.json").write_text(json.dumps(config))

    async def main() -> list[dict[str, str]]:
        repository = ModelRepository(repo)
        results = await asyncio.wait_for(asyncio.gather(
            *(repository.load(n, reload=False) for n in ("e1", "e2", "affine_a")), return_exceptions=True), 60)
        assert isinstance(results[0], ConfigError) and isinstance(results[1], ConfigError)
        index = repository.index()
        await repository.close()
        return index

    states = {row["name"]: row for row in asyncio.run(main())}
    assert "step model 'e2' contains the ensemble again (e1 -> e2 -> e1)" in states["e1"]["reason"]
    assert "(e2 -> e1 -> e2)" in states["e2"]["reason"] and states["affine_a"]["state"] == "READY"


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_device_tensors_come_to_the_host_with_their_values(dtype: Any) -> None:
    """What a mixed batch (device and host requests) and CPU steps do with a device output."""
    torch = pytest.importorskip("torch")
    array = (np.random.default_rng().standard_normal((4, 3)) * 50).astype(dtype)
    tensor = torch.from_numpy(array.copy())
    whole = DeviceTensor(tensor, array.dtype, array.shape)
    rows = DeviceTensor(tensor[1:3], array.dtype, (2, 3))
    np.testing.assert_array_equal(np.asarray(whole), array)
    np.testing.assert_array_equal(np.asarray(rows), array[1:3])
    np.testing.assert_array_equal(np.asarray(DeviceTensor(tensor.t(), array.dtype, (3, 4))), array.T)
