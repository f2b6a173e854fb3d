"""Instance placement over GPUs (Triton's instance_group rules, with explicit GPU lists: no GPU needed),
the per-GPU memory budget's accounting, and how a CPU model's instance groups are checked at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import InstanceGroupConfig, ModelConfig
from streamrt.serve.configs.config_message import from_mapping
from streamrt.serve.execution.memory_budget import MIB, MemoryBudget
from streamrt.serve.execution.placement import describe_gpus, gpu_indices, place_instances, resolved_groups
from streamrt.serve.models.model import ServedModel

GIB = 2**30
H200 = "NVIDIA H200"


def _where(
    groups: list[InstanceGroupConfig], gpus: list[str], engine_kind: str = "cuda"
) -> list[tuple[int | None, int]]:
    return [(p.gpu, p.group) for p in place_instances(groups, engine_kind=engine_kind, gpus=gpus, model="m")]


def test_count_is_per_listed_gpu() -> None:
    # Triton: instance_group [{count: 2, kind: KIND_GPU, gpus: [0, 1]}] -> 2 instances on each listed GPU.
    placed = _where([InstanceGroupConfig(count=2, kind="KIND_GPU", gpus=(0, 1))], [H200, H200])
    assert sorted(placed) == [(0, 0), (0, 0), (1, 0), (1, 0)]
    assert [g for g, _ in placed] == [0, 1, 0, 1]  # round-robin: the first batches already spread


def test_no_gpus_means_every_visible_gpu() -> None:
    # Triton's first example: {count: 2, kind: KIND_GPU} places two instances on each system GPU.
    assert sorted(_where([InstanceGroupConfig(count=2, kind="KIND_GPU")], [H200] * 3)) == \
        [(0, 0), (0, 0), (1, 0), (1, 0), (2, 0), (2, 0)]
    # The default group (count 1, KIND_AUTO) with a CUDA plan: one instance per GPU.
    assert _where([InstanceGroupConfig()], [H200, H200]) == [(0, 0), (1, 0)]
    # One GPU: what StreamRT always did (count instances on GPU 0).
    assert _where([InstanceGroupConfig(count=2, kind="KIND_GPU")], [H200]) == [(0, 0), (0, 0)]


def test_triton_second_example_groups_on_chosen_gpus() -> None:
    # One instance on GPU 0 and two on GPUs 1 and 2.
    groups = [InstanceGroupConfig(count=1, kind="KIND_GPU", gpus=(0,)),
              InstanceGroupConfig(count=2, kind="KIND_GPU", gpus=(1, 2))]
    placed = _where(groups, [H200] * 4)
    assert sorted(placed) == [(0, 0), (1, 1), (1, 1), (2, 1), (2, 1)]
    assert gpu_indices(groups, [H200] * 4) == [0, 1, 2]


def test_loaded_config_reports_kinds_and_gpus_as_placed() -> None:
    """What GET .../config shows once loaded, as Triton: KIND_AUTO resolved, a GPU group's GPUs
    filled in (every visible one when it listed none), count still per GPU."""
    groups = [InstanceGroupConfig(count=2), InstanceGroupConfig(count=1, kind="KIND_GPU", gpus=(2,))]
    resolved = resolved_groups(groups, place_instances(groups, engine_kind="cuda", gpus=[H200] * 3))
    assert [(g.kind, g.gpus, g.count) for g in resolved] == [("KIND_GPU", (0, 1, 2), 2), ("KIND_GPU", (2,), 1)]
    cpu = [InstanceGroupConfig(count=3)]
    assert [(g.kind, g.gpus, g.count) for g in resolved_groups(cpu, place_instances(cpu, engine_kind="cpu", gpus=[]))] \
        == [("KIND_CPU", (), 3)]


def test_cpu_groups_and_cpu_plans() -> None:
    assert _where([InstanceGroupConfig(count=3, kind="KIND_CPU")], [H200, H200], "cpu") == [(None, 0)] * 3
    assert _where([InstanceGroupConfig(count=2)], [], "cpu") == [(None, 0)] * 2  # KIND_AUTO follows the plan
    mixed = [InstanceGroupConfig(count=2, kind="KIND_CPU"), InstanceGroupConfig(count=1, kind="KIND_GPU")]
    assert gpu_indices(mixed, [H200, H200]) == [0, 1]  # the CPU group does not count
    assert gpu_indices([InstanceGroupConfig(kind="KIND_CPU")], [H200]) == []
    assert gpu_indices([InstanceGroupConfig()], []) == []  # nothing visible: nothing to check yet
    with pytest.raises(ConfigError, match=r"runs on the CPU but lists gpus \[0\]"):
        _where([InstanceGroupConfig(kind="KIND_CPU", gpus=(0,))], [H200], "cpu")
    with pytest.raises(ConfigError, match="instance_group kind KIND_GPU but the engine runs on cpu"):
        _where([InstanceGroupConfig(kind="KIND_GPU")], [H200], "cpu")
    with pytest.raises(ConfigError, match="instance_group kind KIND_CPU but the engine runs on cuda"):
        _where([InstanceGroupConfig(kind="KIND_CPU")], [H200], "cuda")


def test_a_gpu_that_does_not_exist_is_refused_naming_the_visible_ones() -> None:
    with pytest.raises(ConfigError, match=r"gpus \[0, 2\] names GPU 2, which does not exist; visible GPUs: "
                                          r"GPU 0 \(NVIDIA H200\), GPU 1 \(NVIDIA H200\)") as info:
        _where([InstanceGroupConfig(count=1, kind="KIND_GPU", gpus=(0, 2))], [H200, H200])
    assert "CUDA_VISIBLE_DEVICES" in (info.value.hint or "")
    with pytest.raises(ConfigError, match="visible GPUs: none"):
        _where([InstanceGroupConfig(kind="KIND_GPU", gpus=(1,))], [])
    with pytest.raises(ConfigError, match="needs a GPU and none is visible"):
        _where([InstanceGroupConfig(kind="KIND_GPU")], [])
    with pytest.raises(ConfigError, match=r"lists a GPU twice in gpus \[1, 1\]"):
        _where([InstanceGroupConfig(kind="KIND_GPU", gpus=(1, 1))], [H200, H200])
    with pytest.raises(ConfigError, match="does not exist"):
        gpu_indices([InstanceGroupConfig(gpus=(3,))], [H200])
    assert describe_gpus([]) == "none"


def test_config_files_carry_gpu_lists() -> None:
    cfg = from_mapping({"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]}, "m")
    assert cfg.instance_group == (InstanceGroupConfig(count=2, kind="KIND_GPU", gpus=(0, 1)),)
    with pytest.raises(ConfigError, match="gpus must be an integer >= 0, got -1"):
        from_mapping({"instance_group": [{"gpus": [-1]}]}, "m")


def test_memory_budget_is_per_gpu_and_names_the_gpu() -> None:
    free = {0: (10 * GIB, 80 * GIB), 1: (600 * MIB, 80 * GIB)}
    budget = MemoryBudget(gpu_budget_mb=1024, free_memory=lambda gpu: free[gpu])
    budget.account("a:1", 900 * MIB, gpu=0)
    # GPU 1's budget is whole: what the model took on GPU 0 does not count there.
    budget.admit("b:1", 500 * MIB, device="cuda", model_limit=None, basis="model file", gpu=1)
    with pytest.raises(ConfigError, match=r"budget of 1024\.0 MiB leaves 124\.0 MiB on GPU 0"):
        budget.admit("b:1", 500 * MIB, device="cuda", model_limit=None, basis="model file", gpu=0)
    free[1] = (200 * MIB, 80 * GIB)
    with pytest.raises(ConfigError, match=r"but GPU 1 has 200\.0 MiB free of 81920\.0 MiB"):
        budget.admit("b:1", 300 * MIB, device="cuda", model_limit=None, basis="model file", gpu=1)
    budget.account("a:1", 100 * MIB, gpu=1)
    assert (budget.taken_on(0), budget.taken_on(1), budget.taken) == (900 * MIB, 100 * MIB, 1000 * MIB)
    assert budget.describe_free([0, 1]) == \
        "GPU 0: 10240.0 MiB free of 81920.0 MiB; GPU 1: 200.0 MiB free of 81920.0 MiB"
    budget.forget("a:1")  # every GPU of the model
    assert budget.taken == 0


def test_memory_measure_is_per_gpu() -> None:
    free = {0: [10 * GIB], 1: [10 * GIB]}
    budget = MemoryBudget(free_memory=lambda gpu: (free[gpu][0], 80 * GIB))
    with budget.measuring("cuda", [0, 1]) as measure:
        free[0][0] -= 300 * MIB
        free[1][0] -= 100 * MIB
    assert measure.by_gpu == {0: 300 * MIB, 1: 100 * MIB} and measure.taken == 400 * MIB
    with budget.measuring("cpu", [0]) as cpu:
        pass
    assert cpu.taken is None


def test_cpu_model_with_gpus_listed_is_refused_at_load(tmp_path: Path, plans: dict[str, Path]) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.plan").write_bytes(plans["small_cnn"].read_bytes())
    groups = (InstanceGroupConfig(count=2, kind="KIND_CPU", gpus=(0,)),)
    with pytest.raises(ConfigError, match=r"runs on the CPU but lists gpus \[0\]"):
        ServedModel.load(tmp_path / "m", 1, ModelConfig(name="m", max_batch_size=4, instance_group=groups))
    served = ServedModel.load(tmp_path / "m", 1, ModelConfig(
        name="m", max_batch_size=4, instance_group=(InstanceGroupConfig(count=3, kind="KIND_CPU"),)))
    try:
        assert [(i.gpu, i.device.kind) for i in served.instances.instances] == [(None, "cpu")] * 3
        assert served.engines.gpus == [] and served.engines.on(None) is served.engine
        assert len({id(i.context) for i in served.instances.instances}) == 3
    finally:
        served.release()
