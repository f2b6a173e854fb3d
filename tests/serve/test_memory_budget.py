"""The GPU memory budget checked at load: the accounting rules, a model refused by its own budget on
the CPU, an out-of-memory load turned into a refusal, and (GPU) the server budget and a CUDA OOM."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from streamrt.errors import ConfigError, OutOfMemoryError
from streamrt.serve.configs.config import ModelConfig, ServerConfig
from streamrt.serve.execution.memory_budget import MIB, MemoryBudget, model_limit
from streamrt.serve.models.model import ServedModel, load_engine
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(180)

GIB = 2**30


def test_admit_checks_model_limit_server_budget_and_free_memory() -> None:
    free = [(10 * GIB, 80 * GIB)]
    budget = MemoryBudget(gpu_budget_mb=1024, free_memory=lambda gpu: free[0])
    budget.admit("a:1", 600 * MIB, device="cuda", model_limit=None, basis="model file")
    budget.account("a:1", 700 * MIB)
    with pytest.raises(ConfigError, match=r"model b:1 needs at least 400\.0 MiB of GPU memory \(model file\) but the "
                                          r"server's GPU memory budget of 1024\.0 MiB leaves 324\.0 MiB"):
        budget.admit("b:1", 400 * MIB, device="cuda", model_limit=None, basis="model file")
    budget.admit("a:1", 1000 * MIB, device="cuda", model_limit=None, basis="reload")  # its own share is not "other"
    with pytest.raises(ConfigError, match=r"but its memory_budget_mb parameter allows 100\.0 MiB"):
        budget.admit("c:1", 200 * MIB, device="cuda", model_limit=100 * MIB, basis="model file")
    budget.forget("a:1")
    assert budget.taken == 0
    budget.admit("b:1", 400 * MIB, device="cuda", model_limit=None, basis="model file")
    free[0] = (300 * MIB, 80 * GIB)
    with pytest.raises(ConfigError, match=r"but GPU 0 has 300\.0 MiB free of 81920\.0 MiB"):
        budget.admit("b:1", 400 * MIB, device="cuda", model_limit=None, basis="model file")
    # A CPU model: the server's GPU budget and the GPU's free memory do not apply, its own limit does.
    budget.admit("cpu:1", 400 * MIB, device="cpu", model_limit=None, basis="model file")
    with pytest.raises(ConfigError, match="of cpu memory"):
        budget.admit("cpu:1", 400 * MIB, device="cpu", model_limit=MIB, basis="model file")


def test_model_limit_parameter() -> None:
    assert model_limit({}, "m") is None
    assert model_limit({"memory_budget_mb": "1.5"}, "m") == int(1.5 * MIB)
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ConfigError, match="memory_budget_mb must be a number of MiB > 0"):
            model_limit({"memory_budget_mb": bad}, "m")
    with pytest.raises(ConfigError, match="gpu_memory_budget_mb must be > 0"):
        ServerConfig(gpu_memory_budget_mb=0)


def _repo(root: Path, plans: dict[str, Path], models: dict[str, dict[str, Any]]) -> Path:
    for name, config in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.plan").write_bytes(plans["small_cnn"].read_bytes())
        (root / name / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def _status(port: int, path: str, post: bool = False) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}" if post else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_model_over_its_budget_is_refused_and_the_others_serve(tmp_path: Path, plans: dict[str, Path]) -> None:
    size_mb = plans["small_cnn"].stat().st_size / MIB
    limited = {"max_batch_size": 4, "parameters": {"memory_budget_mb": str(size_mb / 2)}}
    repo = _repo(tmp_path, plans, {"fits": {"max_batch_size": 4}, "too_big": limited})
    config = ServerConfig(http_port=0, grpc_port=None, metrics_port=None, strict_readiness=False)
    with ServerThread(repo, config, start_timeout=120) as server:
        assert _status(server.http_port, "/v2/models/fits/ready")[0] == 200
        assert _status(server.http_port, "/v2/models/too_big/ready")[0] != 200
        _, body = _status(server.http_port, "/v2/repository/index", post=True)
        entry = next(e for e in json.loads(body) if e["name"] == "too_big")
        assert entry["state"] == "UNAVAILABLE"
        assert f"needs at least {size_mb:.1f} MiB of cpu memory (its model file)" in entry["reason"]
        assert f"allows {size_mb / 2:.1f} MiB" in entry["reason"]


def test_out_of_memory_while_loading_becomes_a_refusal(tmp_path: Path, plans: dict[str, Path]) -> None:
    repo = _repo(tmp_path, plans, {"greedy": {"max_batch_size": 4}})

    def greedy_loader(model_dir: Path, version: int, config: ModelConfig) -> Any:
        engine = load_engine(model_dir, version, config)
        try:
            np.ones(2**62, dtype=np.uint8)  # the host allocator's real MemoryError ("Unable to allocate 4.00 EiB")
        finally:
            engine.close()
        return engine

    with pytest.raises(OutOfMemoryError, match=r"out of host memory while loading model greedy:1") as info:
        ServedModel.load(repo / "greedy", 1, ModelConfig(name="greedy", max_batch_size=4), greedy_loader)
    assert "free memory" in (info.value.hint or "")


@pytest.mark.gpu
def test_gpu_budget_refuses_a_model_and_a_cuda_oom_releases_its_memory(tmp_path: Path) -> None:
    import onnx
    import torch

    import streamrt
    from streamrt.testing.models import resnet_like
    from streamrt.types import ShapeProfile, ShapeRange

    onnx_path = tmp_path / "resnet18.onnx"
    onnx.save(resnet_like(18), str(onnx_path))  # ~45 MB of fp32 weights: measurable on the GPU
    profile = ShapeProfile({"images": ShapeRange((1, 3, 224, 224), (8, 3, 224, 224), (8, 3, 224, 224))})
    config = streamrt.BuildConfig(backend="torch_inductor", precision="fp16", optimization_level=0,
                                  profiles=(profile,), backend_options={"device": "cuda"})
    plan = streamrt.build(onnx_path, config, tmp_path / "m.plan", cache_dir=tmp_path / "cache").path
    for name in ("first", "second"):
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
        (tmp_path / "repo" / name / "1" / "model.plan").write_bytes(plan.read_bytes())
    budget = MemoryBudget()
    first = ServedModel.load(tmp_path / "repo" / "first", 1, ModelConfig(name="first"), budget=budget)
    try:
        taken = budget.taken  # what the load measurably took (at least the file)
        assert taken > 0
        tight = MemoryBudget(gpu_budget_mb=(taken + plan.stat().st_size // 2) / MIB)
        tight.account("first:1", taken)
        with pytest.raises(ConfigError, match="server's GPU memory budget"):
            ServedModel.load(tmp_path / "repo" / "second", 1, ModelConfig(name="second"), budget=tight)
        torch.cuda.synchronize()
        # this process's allocator, not mem_get_info (device-wide: other test workers share the GPU)
        before = torch.cuda.memory_reserved()

        def hog(model_dir: Path, version: int, config: ModelConfig) -> Any:
            engine = load_engine(model_dir, version, config)
            try:
                torch.empty(torch.cuda.mem_get_info()[1] * 2, dtype=torch.uint8, device="cuda")
            finally:
                engine.close()
            return engine

        with pytest.raises(OutOfMemoryError, match=r"out of CUDA device memory while loading model second:1 .*free of"):
            ServedModel.load(tmp_path / "repo" / "second", 1, ModelConfig(name="second"), hog, budget=budget)
        after = torch.cuda.memory_reserved()
        assert after <= before + 64 * MIB, f"the failed load kept {(after - before) / MIB:.0f} MiB"
    finally:
        first.release()
    assert budget.taken == 0
