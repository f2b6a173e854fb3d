"""A model repository with real ONNX Runtime plans, a fake engine that stalls or fails on demand,
and a running server per test module (loopback, free ports, bounded timeouts)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

import streamrt
from streamrt.backends.base import Engine, ExecutionContext
from streamrt.errors import InferenceError
from streamrt.serve.configs.config import ModelConfig, ServerConfig
from streamrt.serve.models.model import load_engine
from streamrt.serve.server import ServerThread
from streamrt.testing.models import CATALOGUE


@dataclass
class Behaviour:
    """What the fake engine does on each execution; tests change it and read its counters."""

    sleep: float = 0.0
    fail: bool = False
    gate: threading.Semaphore | None = None  # when set, each execution waits for one release
    calls: int = 0
    rows: list[int] = field(default_factory=list)
    first_values: list[float] = field(default_factory=list)  # x.flat[0] of each execution, in start order
    active: int = 0
    max_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.sleep, self.fail, self.gate, self.calls, self.max_active = 0.0, False, None, 0, 0
            self.rows, self.first_values = [], []


class FakeEngine(Engine):
    """A real engine behind a context that can sleep, fail, and counts concurrent executions."""

    def __init__(self, inner: Engine, behaviour: Behaviour) -> None:
        super().__init__(inner.manifest)
        self.inner, self.behaviour, self.device_kind = inner, behaviour, inner.device_kind

    def create_context(self) -> ExecutionContext:
        return FakeContext(self)

    def close(self) -> None:
        self.inner.close()
        super().close()


class FakeContext(ExecutionContext):
    engine: FakeEngine

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__(engine)
        self.inner = engine.inner.create_context()

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        b = self.engine.behaviour
        with b.lock:
            b.calls += 1
            b.active += 1
            b.max_active = max(b.max_active, b.active)
            first = next(iter(inputs.values()))
            b.rows.append(int(first.shape[0]))
            b.first_values.append(float(np.asarray(first).flat[0]))
            sleep, fail, gate = b.sleep, b.fail, b.gate
        try:
            if gate is not None and not gate.acquire(timeout=30):
                raise InferenceError("test gate was never released")
            time.sleep(sleep)
            if fail:
                raise InferenceError("injected engine failure")
            return self.inner.infer(inputs, stream)
        finally:
            with b.lock:
                b.active -= 1


BEHAVIOURS: dict[str, Behaviour] = {"flaky": Behaviour(), "slow": Behaviour()}


def fake_loader(model_dir: Path, version: int, config: ModelConfig) -> Engine:
    engine = load_engine(model_dir, version, config)
    behaviour = BEHAVIOURS.get(config.name)
    return FakeEngine(engine, behaviour) if behaviour else engine


def _write(repo: Path, name: str, config: Mapping[str, Any] | None, *, plan: Path | None = None,
           onnx_model: onnx.ModelProto | None = None, version: int = 1) -> None:
    folder = repo / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    if plan is not None:
        (folder / "model.plan").write_bytes(plan.read_bytes())
    if onnx_model is not None:
        onnx.save(onnx_model, str(folder / "model.onnx"))
    if config is not None:
        (repo / name / "config.yaml").write_text(yaml.safe_dump(dict(config)))


BATCHING = {"max_queue_delay_microseconds": 2000}


@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ONNX Runtime plans of catalogue models, built once per session (1 intra-op thread)."""
    folder = tmp_path_factory.mktemp("plans")
    out = {}
    for name in ("small_cnn", "two_io", "elementwise"):
        model = folder / f"{name}.onnx"
        onnx.save(CATALOGUE[name].make(), str(model))
        config = streamrt.BuildConfig(profiles=CATALOGUE[name].profiles, backend_options={"threads": 1})
        out[name] = streamrt.build(model, config, folder / f"{name}.plan", cache_dir=folder / "cache").path
    return out


@pytest.fixture(scope="session", autouse=True)
def _build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ONNX models built on load go to a private cache, not ~/.cache/streamrt."""
    mp = pytest.MonkeyPatch()
    mp.setenv("STREAMRT_CACHE", str(tmp_path_factory.mktemp("serve-cache")))
    yield
    mp.undo()


def make_repo(root: Path, plans: dict[str, Path]) -> Path:
    """cnn (batching, 2 instances), flaky/slow (fake engine), nobatch, pair (2 inputs), onnx_cnn, broken."""
    _write(root, "cnn", {"max_batch_size": 8, "dynamic_batching": BATCHING, "instance_group": [{"count": 2}]},
           plan=plans["small_cnn"])
    _write(root, "flaky", {"max_batch_size": 8, "dynamic_batching": {
        **BATCHING, "default_queue_policy": {"max_queue_size": 6, "allow_timeout_override": True}}},
        plan=plans["small_cnn"])
    _write(root, "slow", {"max_batch_size": 4, "instance_group": [{"count": 2}],
                          "dynamic_batching": {"priority_levels": 2, "default_priority_level": 2}},
           plan=plans["small_cnn"])
    _write(root, "nobatch", {"max_batch_size": 0}, plan=plans["elementwise"])
    _write(root, "pair", None, plan=plans["two_io"])
    _write(root, "onnx_cnn", {"max_batch_size": 4, "model_warmup": [{"batch_size": 2, "count": 2}]},
           onnx_model=CATALOGUE["small_cnn"].make())
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.yaml").write_text("max_batch_size: 4\n")
    return root


STARTUP = ("cnn", "flaky", "slow", "nobatch", "pair", "onnx_cnn")


def server_config(**changes: Any) -> ServerConfig:
    base = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=5.0, startup_models=STARTUP)
    return base.replace(**changes)


@pytest.fixture
def make_server(tmp_path: Path, plans: dict[str, Path]) -> Any:
    """``make_server(**ServerConfig changes)``: a fresh repository and a ServerThread (not started)."""

    def make(**changes: Any) -> ServerThread:
        repo = make_repo(tmp_path / f"repo{len(list(tmp_path.iterdir()))}", plans)
        return ServerThread(repo, server_config(**changes), engine_loader=fake_loader, start_timeout=120)

    return make


def serving(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path], **changes: Any) -> Iterator[ServerThread]:
    """A module's ``server`` fixture: a fresh repository served with ``server_config(**changes)``."""
    repo = make_repo(tmp_path_factory.mktemp("repo"), plans)
    with ServerThread(repo, server_config(**changes), engine_loader=fake_loader, start_timeout=120) as running:
        yield running
    for b in BEHAVIOURS.values():
        b.reset()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    yield from serving(tmp_path_factory, plans)


@pytest.fixture
def behaviours() -> Iterator[dict[str, Behaviour]]:
    for b in BEHAVIOURS.values():
        b.reset()
    yield BEHAVIOURS
    for b in BEHAVIOURS.values():
        b.reset()


@pytest.fixture(scope="session")
def reference(plans: dict[str, Path]) -> Any:
    """``reference(name, inputs)``: the plan's outputs computed in-process, for comparisons."""
    engines = {name: streamrt.load(path) for name, path in plans.items()}
    lock = threading.Lock()

    def run(name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with lock:
            return engines[name].create_context().infer(inputs)

    return run


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[Any]:
    """A tritonclient HTTP client of the module's ``server`` fixture (a :class:`ServerThread`)."""
    import tritonclient.http as thttp

    client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=8, network_timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: Any) -> Iterator[Any]:
    """A tritonclient gRPC client of the module's ``server`` fixture."""
    import tritonclient.grpc as tgrpc

    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()
