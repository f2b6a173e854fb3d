"""The rate limiter: resource counts as Triton derives them, accounting under real threads, grants in
priority order, the config round trip, and two served models sharing one resource."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from streamrt.backends.base import Engine, ExecutionContext
from streamrt.errors import ConfigError
from streamrt.serve.configs.config import RateLimiterConfig, RateLimiterResource, ServerConfig
from streamrt.serve.configs.config_message import from_mapping, to_message
from streamrt.serve.configs.triton_config import message_json, parse_text
from streamrt.serve.execution.rate_limiter import GLOBAL, RateLimiter
from streamrt.serve.models.model import load_engine
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)


def needs(*resources: tuple[str, int] | tuple[str, int, bool], priority: int = 0) -> RateLimiterConfig:
    return RateLimiterConfig(tuple(RateLimiterResource(*r) for r in resources), priority)


def test_default_copies_are_the_largest_count_any_instance_asks_for() -> None:
    limiter = RateLimiter()  # the example of Triton's rate_limiter.md
    limiter.register("A", needs(("R1", 4), ("R2", 4)))
    limiter.register("B", needs(("R2", 5), ("R3", 10), ("R4", 5)))
    c = limiter.register("C", needs(("R1", 1), ("R3", 7), ("R4", 2)))
    assert [limiter.available(r) for r in ("R1", "R2", "R3", "R4")] == [4, 5, 10, 5]
    c.close()
    assert [limiter.available(r) for r in ("R1", "R3", "R4")] == [4, 10, 5]


def test_explicit_resources_per_device_and_global() -> None:
    limiter = RateLimiter(["R1:10", "R2:5:0", "R2:8:1", "R3:2"])
    limiter.register("a", needs(("R1", 3), ("R2", 5)), device=0)
    limiter.register("b", needs(("R2", 6)), device=1)
    limiter.register("g", needs(("R3", 2, True)))
    assert limiter.available("R1", 0) == 10 and limiter.available("R2", 0) == 5 and limiter.available("R2", 1) == 8
    assert limiter.available("R3", GLOBAL) == 2 and limiter.available("R3") == 2
    with pytest.raises(ConfigError, match=r'"R2" is limited to 5 .* minimum required count is 6'):
        limiter.register("c", needs(("R2", 6)), device=0)
    with pytest.raises(ConfigError, match=r'"R9" is limited to 0'):
        limiter.register("d", needs(("R9", 1)))
    with pytest.raises(ConfigError, match='"R1" is present as both global and device-specific'):
        limiter.register("e", needs(("R1", 1, True)))
    assert limiter.available("R2", 0) == 5  # refused registrations left nothing behind
    with pytest.raises(ConfigError, match="NAME:COUNT"):
        RateLimiter(["R1"])
    with pytest.raises(ConfigError, match="integers"):
        RateLimiter(["R1:many"])


def test_resources_are_never_overcommitted_under_threads() -> None:
    limiter = RateLimiter()
    tickets = [limiter.register(f"i{k}", needs(("gpu", 2 if k % 3 == 0 else 1))) for k in range(6)]
    limiter.register("max", needs(("gpu", 3)))  # 3 copies in all
    held = Counter[str]()
    lock = threading.Lock()
    peak = [0]
    errors: list[str] = []

    def work(ticket: Any) -> None:
        for _ in range(25):
            if not ticket.acquire(timeout=10):
                errors.append(f"{ticket.name} starved")
                return
            with lock:
                held["gpu"] += ticket.needs[(0, "gpu")]
                peak[0] = max(peak[0], held["gpu"])
            time.sleep(0.0005)
            with lock:
                held["gpu"] -= ticket.needs[(0, "gpu")]
            ticket.release()

    threads = [threading.Thread(target=work, args=(t,)) for t in tickets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert peak[0] == 3  # the pool was used fully and never beyond
    assert limiter.available("gpu") == 3 and limiter.waiting == 0
    assert [t.executions for t in tickets] == [25] * 6


def test_waiting_instances_are_granted_by_executions_times_priority() -> None:
    """Two instances always waiting for one copy: priority 1 runs three times as often as priority 3."""
    limiter = RateLimiter()
    fast = limiter.register("fast", needs(("slot", 1), priority=1))
    slow = limiter.register("slow", needs(("slot", 1), priority=3))
    order: list[str] = []
    total = 80
    lock = threading.Lock()

    def loop(ticket: Any) -> None:
        granted = threading.Event()
        ticket.stage(granted.set)
        while True:
            assert granted.wait(10), f"{ticket.name} was never granted"
            with lock:
                order.append(ticket.name)
                more = len(order) < total
            time.sleep(0.001)
            if not more:
                ticket.release()
                return
            granted = threading.Event()
            ticket.release(then=granted.set)

    threads = [threading.Thread(target=loop, args=(t,)) for t in (fast, slow)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    counts = Counter(order[:total])
    assert abs(counts["fast"] - 3 * counts["slow"]) <= 4, counts  # 60:20 give or take the start
    assert limiter.available("slot") == 1


def test_strict_order_head_waits_and_blocks_those_behind() -> None:
    limiter = RateLimiter(["big:2"])
    holder = limiter.register("holder", needs(("big", 1)))
    wide = limiter.register("wide", needs(("big", 2)))
    narrow = limiter.register("narrow", needs(("big", 1), priority=5))
    assert holder.acquire(timeout=1)
    got: list[str] = []
    wide.stage(lambda: got.append("wide"))
    narrow.stage(lambda: got.append("narrow"))
    assert got == []  # one copy is free, but the head (wide) needs two: narrow waits behind it
    holder.release()
    assert got == ["wide"]
    wide.release()
    assert got == ["wide", "narrow"]
    narrow.release()
    assert not narrow.acquire(timeout=0.0) or narrow.release() is None  # an immediate grant still works
    wide.close()  # closing gives back what is held and leaves the order
    assert limiter.available("big") == 2


def test_rate_limiter_config_round_trip() -> None:
    text = ('name: "m" max_batch_size: 4 instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ '
            '{ name: "gpu_slot" count: 1 }, { name: "memory" global: true count: 3 } ] priority: 2 } } ]')
    from streamrt.serve.configs.config_message import from_message

    cfg = from_message(parse_text(text, "m"), "m")
    group = cfg.instance_group[0]
    assert group.rate_limiter == needs(("gpu_slot", 1), ("memory", 3, True), priority=2)
    reply = message_json(to_message(cfg, "onnxruntime"))
    assert reply["instance_group"][0]["rate_limiter"] == {
        "resources": [{"name": "gpu_slot", "count": 1, "global": False},
                      {"name": "memory", "global": True, "count": 3}],
        "priority": 2,
    }
    again = from_mapping({"max_batch_size": 4, "instance_group": reply["instance_group"]}, "m")
    assert again.instance_group[0].rate_limiter == group.rate_limiter
    assert from_mapping({"instance_group": [{"count": 1}]}, "m").instance_group[0].rate_limiter is None
    with pytest.raises(ConfigError, match="twice"):
        from_mapping({"instance_group": [{"rate_limiter": {"resources": [{"name": "a"}, {"name": "a"}]}}]}, "m")


def test_server_config_checks_rate_limit_flags() -> None:
    assert ServerConfig(rate_limit="execution_count", rate_limit_resources=["R:2:0"]).rate_limit_resources == ("R:2:0",)
    with pytest.raises(ConfigError, match="rate_limit must be one of off, execution_count"):
        ServerConfig(rate_limit="on")
    with pytest.raises(ConfigError, match="NAME:COUNT"):
        ServerConfig(rate_limit_resources=("R:-1",))


# --- two served models sharing one resource -------------------------------------------------------


class _Shared:
    """Executions per model and how many run at once across both models."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.active = 0
        self.peak = 0


SHARED = _Shared()


class _Counting(ExecutionContext):
    def __init__(self, engine: Any, name: str) -> None:
        super().__init__(engine)
        self.inner = engine.inner.create_context()
        self.model = name

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        with SHARED.lock:
            SHARED.calls[self.model] += 1
            SHARED.active += 1
            SHARED.peak = max(SHARED.peak, SHARED.active)
        try:
            time.sleep(0.004)  # an execution long enough for the other model's requests to queue up
            return self.inner.infer(inputs, stream)
        finally:
            with SHARED.lock:
                SHARED.active -= 1


class _CountingEngine(Engine):
    def __init__(self, inner: Engine, name: str) -> None:
        super().__init__(inner.manifest)
        self.inner, self.model, self.device_kind = inner, name, inner.device_kind

    def create_context(self) -> ExecutionContext:
        return _Counting(self, self.model)

    def close(self) -> None:
        self.inner.close()
        super().close()


def _counting_loader(model_dir: Path, version: int, config: Any) -> Engine:
    return _CountingEngine(load_engine(model_dir, version, config), config.name)


def _infer(port: int, model: str, x: np.ndarray) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]})
        conn.request("POST", f"/v2/models/{model}/infer", body=body)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _write(repo: Path, name: str, config: dict[str, Any], plan: Path) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.plan").write_bytes(plan.read_bytes())
    (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


def test_two_models_sharing_a_resource_higher_priority_runs_more(tmp_path: Path, plans: dict[str, Path]) -> None:
    for name, priority in (("high", 1), ("low", 4)):
        _write(tmp_path, name, {"max_batch_size": 8, "instance_group": [{"count": 2, "rate_limiter": {
            "resources": [{"name": "gpu", "count": 1}], "priority": priority}}]}, plans["small_cnn"])
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0,
                          startup_models=("high", "low"), rate_limit="execution_count")
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    stop = threading.Event()
    statuses: Counter[int] = Counter()

    def client(model: str) -> None:
        while not stop.is_set():
            statuses[_infer(port, model, x)] += 1

    with ServerThread(tmp_path, config, engine_loader=_counting_loader, start_timeout=120) as server:
        port = server.http_port
        SHARED.calls.clear()
        SHARED.peak = 0
        threads = [threading.Thread(target=client, args=(m,)) for m in ("high", "low") for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
    assert set(statuses) == {200}
    high, low = SHARED.calls["high"], SHARED.calls["low"]
    assert SHARED.peak == 1  # one copy of "gpu": never two executions at once, across both models
    print(f"executions: high {high}, low {low}")
    assert low > 10 and high >= 2.5 * low, (high, low)  # priority 4 vs 1 while both wait: ~4x


def test_a_model_asking_more_than_the_explicit_count_is_refused_at_load(tmp_path: Path, plans: dict[str, Path]) -> None:
    from streamrt.serve.models.model import ServedModel

    greedy = {"max_batch_size": 8, "instance_group": [
        {"count": 1, "rate_limiter": {"resources": [{"name": "gpu", "count": 1}]}},
        {"count": 1, "rate_limiter": {"resources": [{"name": "gpu", "count": 2}]}}]}
    _write(tmp_path, "greedy", greedy, plans["small_cnn"])
    limiter = RateLimiter(["gpu:1"])
    config = from_mapping(greedy, "greedy")
    with pytest.raises(ConfigError, match=r"model 'greedy_1': rate limiter resource count for \"gpu\" is limited "
                                          r"to 1 .* minimum required count is 2 \(hint: --rate-limit-resource gpu:2\)"):
        ServedModel.load(tmp_path / "greedy", 1, config, limiter=limiter)
    assert limiter.available("gpu") == 0  # the first group's instance was unregistered again: no resource left
    served = ServedModel.load(tmp_path / "greedy", 1, config, limiter=RateLimiter(["gpu:2"]))
    try:
        assert [i.rate_limit.needs for i in served.instances.instances if i.rate_limit] == [
            {(0, "gpu"): 1}, {(0, "gpu"): 2}]
    finally:
        served.release()


_PROBE_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils

import _rate_limit_probe as probe


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        with probe.lock:
            probe.calls[self.name] += 1
            probe.active[0] += 1
            probe.peak[0] = max(probe.peak[0], probe.active[0])
        try:
            time.sleep(0.004)
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)]) for r in requests]
        finally:
            with probe.lock:
                probe.active[0] -= 1
'''


def test_python_models_take_part_in_the_rate_limiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    probe = types.ModuleType("_rate_limit_probe")
    probe.lock, probe.calls, probe.active, probe.peak = threading.Lock(), Counter(), [0], [0]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_rate_limit_probe", probe)
    for name, priority in (("high", 1), ("low", 4)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(_PROBE_MODEL)
        (tmp_path / name / "config.pbtxt").write_text(
            f'backend: "python"\nmax_batch_size: 8\n'
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "gpu" count: 1 } ] '
            f'priority: {priority} }} }} ]\n')
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0,
                          startup_models=("high", "low"), rate_limit="execution_count")
    x = np.arange(4, dtype=np.float32)[None]
    stop = threading.Event()
    statuses: Counter[int] = Counter()

    def client(model: str) -> None:
        while not stop.is_set():
            statuses[_infer(port, model, x)] += 1

    with ServerThread(tmp_path, config, start_timeout=60) as server:
        port = server.http_port
        threads = [threading.Thread(target=client, args=(m,)) for m in ("high", "low") for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
    assert set(statuses) == {200}
    high, low = probe.calls["high"], probe.calls["low"]  # type: ignore[attr-defined]
    assert probe.peak[0] == 1  # type: ignore[attr-defined]  # one "gpu": never two executions at once
    assert low > 10 and high >= 2.5 * low, (high, low)



def _sequence_step(port: int, model: str, x: np.ndarray, sequence_id: int, *, start: bool, end: bool
                   ) -> tuple[int, np.ndarray | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"parameters": {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end},
                           "inputs": [{"name": "INPUT", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]})
        conn.request("POST", f"/v2/models/{model}/infer", body=body)
        response = conn.getresponse()
        payload = json.loads(response.read())
        if response.status != 200:
            return response.status, None
        output = next(o for o in payload["outputs"] if o["name"] == "OUTPUT")
        return 200, np.asarray(output["data"], np.float32).reshape(output["shape"])
    finally:
        conn.close()


def test_a_stateful_model_takes_part_in_the_rate_limiter(tmp_path: Path, plans: dict[str, Path]) -> None:
    """A sequence-batching model and a stateless one share one copy of "gpu": never two executions
    at once across them, both progress, and every sequence keeps its own running sum."""
    import onnx

    from streamrt.testing.sequence_models import accumulator, accumulator_config

    limited = {"resources": [{"name": "gpu", "count": 1}], "priority": 1}
    config = accumulator_config(4, instances=2)
    config["instance_group"][0]["rate_limiter"] = limited
    (tmp_path / "stateful" / "1").mkdir(parents=True)
    onnx.save(accumulator(4), str(tmp_path / "stateful" / "1" / "model.onnx"))
    (tmp_path / "stateful" / "config.yaml").write_text(yaml.safe_dump(config))
    _write(tmp_path, "stateless", {"max_batch_size": 8, "instance_group": [{"count": 2, "rate_limiter": {
        **limited, "priority": 2}}]}, plans["small_cnn"])
    server_config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0,
                                 startup_models=("stateful", "stateless"), rate_limit="execution_count")
    image = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    stop = threading.Event()
    statuses: Counter[int] = Counter()
    wrong: list[str] = []

    def sequences(first_id: int) -> None:
        rng = np.random.default_rng(first_id)
        sequence_id = first_id
        while not stop.is_set():
            total = np.zeros((1, 4), np.float32)
            for k in range(5):
                x = rng.standard_normal((1, 4)).astype(np.float32)
                total += x
                status, out = _sequence_step(port, "stateful", x, sequence_id, start=k == 0, end=k == 4)
                statuses[status] += 1
                if out is not None and not np.allclose(out, total, atol=1e-5):
                    wrong.append(f"sequence {sequence_id} step {k}: {out} != {total}")
            sequence_id += 1000

    def stateless() -> None:
        while not stop.is_set():
            statuses[_infer(port, "stateless", image)] += 1

    with ServerThread(tmp_path, server_config, engine_loader=_counting_loader, start_timeout=120) as server:
        port = server.http_port
        SHARED.calls.clear()
        SHARED.peak = 0
        threads = [threading.Thread(target=sequences, args=(i + 1,)) for i in range(6)]
        threads += [threading.Thread(target=stateless) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
    assert set(statuses) == {200} and not wrong, (statuses, wrong[:3])
    assert SHARED.peak == 1  # one copy of "gpu": the stateful model's batches waited for their grants too
    assert SHARED.calls["stateful"] > 10 and SHARED.calls["stateless"] > 10, SHARED.calls
