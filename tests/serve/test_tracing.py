"""Request tracing (--trace-file, Triton's trace timestamps as JSON lines) and structured logs
with request ids (--log-format json), against a running server."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrt.cli.args import ServerArgs
from streamrt.cli.serve import JsonFormatter
from streamrt.errors import ConfigError, InferenceError, UnknownInputError
from streamrt.serve.wire.protocol import InferRequest

ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
         "COMPUTE_END", "REQUEST_END"]


def infer(running: Any, model: str, request_id: str, rows: int = 1) -> Any:
    x = np.random.default_rng(0).standard_normal((rows, 3, 32, 32), dtype=np.float32)
    return running.call(running.server.infer(InferRequest(model, id=request_id, inputs={"x": x})), timeout=30)


def read_traces(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def traced(make_server: Any, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    path = tmp_path / "trace.jsonl"
    with make_server(trace_file=str(path), startup_models=("cnn", "flaky"), grpc_port=None,
                     metrics_port=None) as running:
        yield running, path


def test_every_request_is_traced_with_ordered_timestamps(traced: tuple[Any, Path]) -> None:
    running, path = traced
    for i in range(3):
        infer(running, "cnn", f"req-{i}", rows=2)
    traces = read_traces(path)
    assert [t["request_id"] for t in traces] == ["req-0", "req-1", "req-2"]
    assert len({t["id"] for t in traces}) == 3
    for trace in traces:
        assert (trace["model_name"], trace["model_version"]) == ("cnn", "1") and "error" not in trace
        names = [s["name"] for s in trace["timestamps"]]
        assert names == ORDER
        times = [s["ns"] for s in trace["timestamps"]]
        assert times == sorted(times), trace
        assert 0 < times[-1] - times[0] < 30e9


def test_a_failed_request_is_traced_with_its_error(traced: tuple[Any, Path], behaviours: Any) -> None:
    running, path = traced
    behaviours["flaky"].fail = True
    with pytest.raises(InferenceError):
        infer(running, "flaky", "doomed")
    with pytest.raises(UnknownInputError):
        running.call(running.server.infer(InferRequest("cnn", id="bad", inputs={"nope": np.zeros(1)})), timeout=30)
    doomed, bad = read_traces(path)
    assert doomed["request_id"] == "doomed" and doomed["error"].startswith("BACKEND: ")
    assert [s["name"] for s in doomed["timestamps"]] == ["REQUEST_START", "QUEUE_START", "COMPUTE_START",
                                                         "REQUEST_END"]
    assert bad["error"].startswith("OTHER: unknown input")
    assert [s["name"] for s in bad["timestamps"]] == ["REQUEST_START", "REQUEST_END"]


def test_trace_rate_samples_one_request_in_n(make_server: Any, tmp_path: Path) -> None:
    path = tmp_path / "sampled.jsonl"
    with make_server(trace_file=str(path), trace_rate=3, startup_models=("cnn",), grpc_port=None,
                     metrics_port=None) as running:
        for i in range(7):
            infer(running, "cnn", f"r{i}")
    assert [t["request_id"] for t in read_traces(path)] == ["r0", "r3", "r6"]


def test_trace_flags_and_their_errors(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    ServerArgs().add_to(parser)
    config = ServerArgs().config(parser.parse_args(["--trace-file", str(tmp_path / "t.jsonl"), "--trace-rate", "5"]))
    assert (config.trace_file, config.trace_rate) == (str(tmp_path / "t.jsonl"), 5)
    assert ServerArgs().config(parser.parse_args([])).trace_file is None
    with pytest.raises(ConfigError, match="trace_rate"):
        ServerArgs().config(parser.parse_args(["--trace-rate", "0"]))


def test_json_logs_carry_the_request_id_model_and_version(make_server: Any, behaviours: Any) -> None:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(level=logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    core_log = logging.getLogger("streamrt.serve.core")
    old_level = core_log.level
    core_log.addHandler(handler)
    core_log.setLevel(logging.DEBUG)
    try:
        with make_server(startup_models=("cnn", "flaky"), grpc_port=None, metrics_port=None) as running:
            assert running.server.tracer is None  # no --trace-file: no tracing
            infer(running, "cnn", "ok-1")
            behaviours["flaky"].fail = True
            with pytest.raises(InferenceError):
                infer(running, "flaky", "fails-1")
    finally:
        core_log.removeHandler(handler)
        core_log.setLevel(old_level)
    entries = [json.loads(line) for line in lines]
    by_id = {e["request_id"]: e for e in entries if "request_id" in e}
    assert by_id["ok-1"]["model"] == "cnn" and by_id["ok-1"]["version"] == "1"
    assert by_id["ok-1"]["message"].startswith("request done in")
    failed = by_id["fails-1"]
    assert (failed["model"], failed["level"]) == ("flaky", "WARNING") and "BACKEND" in failed["message"]
    start_line = next(e for e in entries if e["message"].startswith("streamrt server"))
    assert "request_id" not in start_line
