"""Issue 18: no request may receive another request's data.

The batch-reducing model (ReduceMean without axes: output declared ``[N, 1, 1, 1]``, always
``[1, 1, 1, 1]``) is refused at load when the config asks for batching, and loaded with batching
off when the config leaves ``max_batch_size`` out; over HTTP and gRPC no client ever gets a value
computed from other clients' rows.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

import streamrt
from streamrt.serve import ServerConfig, ServerThread
from streamrt.testing.batch_models import reducing_model, reducing_profiles

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(180)

REFUSED = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 100_000}}


@pytest.fixture(scope="module")
def reducing_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reducing")
    onnx.save(reducing_model(), str(folder / "m.onnx"))
    config = streamrt.BuildConfig(profiles=reducing_profiles(8), backend_options={"threads": 1})
    return streamrt.build(folder / "m.onnx", config, folder / "m.plan", cache_dir=folder / "cache").path


def _add(repo: Path, name: str, plan: Path, config: dict[str, Any] | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.plan").write_bytes(plan.read_bytes())
    if config is not None:
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, reducing_plan: Path) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("repo")
    _add(repo, "reduce", reducing_plan, REFUSED)        # batching asked for: refused at load
    _add(repo, "reduce_auto", reducing_plan, None)      # max_batch_size left out: batching turned off
    _add(repo, "reduce_dims", reducing_plan, {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 4, 4]}]})
    cfg = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0, strict_readiness=False)
    with ServerThread(repo, cfg, start_timeout=120) as running:
        yield running


def _x(rng: np.random.Generator, rows: int) -> np.ndarray:
    return rng.standard_normal((rows, 3, 4, 4)).astype(np.float32)


def _fan_out_http(port: int, model: str, xs: list[np.ndarray]) -> list[Any]:
    """All requests in flight at once (they share one batching window): outputs or errors, in order."""
    client = thttp.InferenceServerClient(f"127.0.0.1:{port}", concurrency=len(xs), network_timeout=60)
    try:
        handles = []
        for x in xs:
            inp = thttp.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            handles.append(client.async_infer(model, [inp]))
        out: list[Any] = []
        for handle in handles:
            try:
                out.append(handle.get_result().as_numpy("y"))
            except InferenceServerException as exc:
                out.append(exc)
        return out
    finally:
        client.close()


def _fan_out_grpc(port: int, model: str, xs: list[np.ndarray]) -> list[Any]:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
    results: list[queue.Queue[Any]] = [queue.Queue() for _ in xs]
    try:
        for x, box in zip(xs, results, strict=True):
            inp = tgrpc.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            client.async_infer(model, [inp], callback=lambda result, error, box=box: box.put(error or result))
        answers = [box.get(timeout=60) for box in results]
        return [a if isinstance(a, BaseException) else a.as_numpy("y") for a in answers]
    finally:
        client.close()


def _assert_no_foreign_data(xs: list[np.ndarray], answers: list[Any]) -> None:
    """Every answer is an error or the request's own mean: never a mean over other requests' rows."""
    for x, answer in zip(xs, answers, strict=True):
        if isinstance(answer, BaseException):
            continue
        own = np.mean(x, dtype=np.float64)
        assert answer.shape == (1, 1, 1, 1), f"got shape {answer.shape} for a request of {x.shape[0]} rows"
        np.testing.assert_allclose(float(answer.ravel()[0]), own, rtol=1e-5, atol=1e-6)


def test_reducing_model_with_batching_is_refused_at_load_naming_output_and_shapes(server: ServerThread) -> None:
    rows = {r["name"]: r for r in server.repository.index()}
    row = rows["reduce"]
    assert row["state"] == "UNAVAILABLE", row
    reason = row["reason"]
    for words in ("output 'y'", "[1, 1, 1, 1]", "batch of 1", "batch of 8", "max_batch_size: 0"):
        assert words in reason, reason


def test_reducing_model_is_refused_when_batching_off_does_not_fit_its_config(server: ServerThread) -> None:
    row = {r["name"]: r for r in server.repository.index()}["reduce_dims"]
    assert row["state"] == "UNAVAILABLE", row
    assert "output 'y' has shape [1, 1, 1, 1]" in row["reason"], row["reason"]
    assert "refused because batching off does not fit the config either" in row["reason"], row["reason"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_reducing_model_requests_fail_clearly_and_never_see_other_rows(server: ServerThread, protocol: str) -> None:
    rng = np.random.default_rng()
    xs = [_x(rng, rows) for rows in (1, 2, 3, 2)]
    if protocol == "http":
        answers = _fan_out_http(server.http_port, "reduce", xs)
    else:
        answers = _fan_out_grpc(server.grpc_port, "reduce", xs)
    _assert_no_foreign_data(xs, answers)
    assert all(isinstance(a, InferenceServerException) for a in answers), answers
    for error in answers:
        assert "output 'y'" in str(error) and "max_batch_size" in str(error), str(error)
        status = str(error.status())
        assert status in ("503", "StatusCode.UNAVAILABLE"), status


def test_reducing_model_without_max_batch_size_is_served_unbatched(server: ServerThread) -> None:
    http = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        config = http.get_model_config("reduce_auto")
        assert config["max_batch_size"] == 0
        assert http.get_model_metadata("reduce_auto")["inputs"][0]["shape"] == [-1, 3, 4, 4]
    finally:
        http.close()
    rng = np.random.default_rng()
    xs = [_x(rng, rows) for rows in (1, 3, 2, 5)]
    for answers in (_fan_out_http(server.http_port, "reduce_auto", xs),
                    _fan_out_grpc(server.grpc_port, "reduce_auto", xs)):
        assert not any(isinstance(a, BaseException) for a in answers), answers
        _assert_no_foreign_data(xs, answers)

