"""Instances on chosen GPUs: ``gpus: [0]`` on one GPU, and ``gpus: [0, 1]`` (2 per GPU) where two GPUs are
visible: an engine per device, each instance's stream and outputs on its own device, memory counted per GPU."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.errors import ConfigError
from streamrt.serve.configs.config import InstanceGroupConfig, ModelConfig
from streamrt.serve.execution.memory_budget import MemoryBudget
from streamrt.serve.models.model import ServedModel
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.timeout(900)]


def _gpu_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


two_gpus = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 CUDA GPUs (torch.cuda.device_count() < 2)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """small_cnn as a torch_inductor GPU plan (fp32, batch 1..16), in a repository folder."""
    root = tmp_path_factory.mktemp("multigpu")
    model = CATALOGUE["small_cnn"]
    onnx.save(model.make(), str(root / "m.onnx"))
    (root / "cnn" / "1").mkdir(parents=True)
    config = streamrt.BuildConfig(backend="torch_inductor", profiles=model.profiles, backend_options={"device": "cuda"})
    streamrt.build(root / "m.onnx", config, root / "cnn" / "1" / "model.plan", cache_dir=root / "cache")
    return root / "cnn"


def _load(model_dir: Path, groups: tuple[InstanceGroupConfig, ...], budget: MemoryBudget | None = None) -> ServedModel:
    return ServedModel.load(model_dir, 1, ModelConfig(name="cnn", max_batch_size=16, instance_group=groups),
                            budget=budget)


@pytest.fixture
def released() -> Iterator[list[ServedModel]]:
    models: list[ServedModel] = []
    yield models
    for m in models:
        m.release()


def _check_instances(served: ServedModel, reference: Any) -> None:
    """Every instance: stream on its GPU, outputs from fresh random data match ONNX Runtime's fp32 ones."""
    rng = np.random.default_rng()
    for instance in served.instances.instances:
        assert instance.stream.torch.device.index == instance.gpu  # type: ignore[attr-defined]
        assert instance.device.torch_device.index == instance.gpu
        x = rng.standard_normal((5, 3, 32, 32)).astype(np.float32)
        out = instance.run([{"x": x}]).outputs[0]["logits"]
        np.testing.assert_allclose(out, reference("small_cnn", {"x": x})["logits"], rtol=1e-3, atol=1e-3)


def test_gpus_zero_explicitly_on_one_gpu(model_dir: Path, reference: Any, released: list[ServedModel]) -> None:
    budget = MemoryBudget()
    served = _load(model_dir, (InstanceGroupConfig(count=2, kind="KIND_GPU", gpus=(0,)),), budget)
    released.append(served)
    assert [i.gpu for i in served.instances.instances] == [0, 0]
    assert served.engines.gpus == [0]
    assert budget.taken_on(0) > 0
    _check_instances(served, reference)


def test_a_gpu_that_does_not_exist_is_refused(model_dir: Path) -> None:
    missing = _gpu_count()
    with pytest.raises(ConfigError, match=rf"names GPU {missing}, which does not exist; visible GPUs: GPU 0 \("):
        _load(model_dir, (InstanceGroupConfig(count=1, kind="KIND_GPU", gpus=(0, missing)),))


@two_gpus
def test_two_instances_on_each_of_two_gpus(model_dir: Path, reference: Any, released: list[ServedModel]) -> None:
    budget = MemoryBudget()
    served = _load(model_dir, (InstanceGroupConfig(count=2, kind="KIND_GPU", gpus=(0, 1)),), budget)
    released.append(served)
    assert [i.gpu for i in served.instances.instances] == [0, 1, 0, 1]
    assert served.engines.gpus == [0, 1]
    assert served.engines.on(0) is not served.engines.on(1)  # loaded once per device, not shared
    assert served.instances.instances[0].engine is served.instances.instances[2].engine  # shared on one device
    assert budget.taken_on(0) > 0 and budget.taken_on(1) > 0
    _check_instances(served, reference)
    # All four at once, from their own threads (as the server's workers run them).
    rng = np.random.default_rng()
    batches = [rng.standard_normal((8, 3, 32, 32)).astype(np.float32) for _ in range(16)]
    instances = served.instances.instances
    with ThreadPoolExecutor(len(instances)) as pool:
        outs = list(pool.map(lambda k: instances[k % len(instances)].run([{"x": batches[k]}]).outputs[0]["logits"],
                             range(len(batches))))
    for x, out in zip(batches, outs, strict=True):
        np.testing.assert_allclose(out, reference("small_cnn", {"x": x})["logits"], rtol=1e-3, atol=1e-3)


@two_gpus
def test_default_group_puts_one_instance_on_every_gpu(model_dir: Path, released: list[ServedModel]) -> None:
    served = _load(model_dir, (InstanceGroupConfig(),))
    released.append(served)
    assert [i.gpu for i in served.instances.instances] == list(range(_gpu_count()))
