"""Where a model's instances run: Triton's ``instance_group`` rules as a pure function.

Triton's rules (``docs/user_guide/model_configuration.md``, "Multiple Model Instances"), kept:

* ``count`` of a GPU group is the number of instances **on each GPU** it lists:
  ``{count: 2, kind: KIND_GPU, gpus: [0, 1]}`` makes 4 instances, 2 on GPU 0 and 2 on GPU 1.
* A GPU group without ``gpus`` lists every visible GPU: ``{count: 2, kind: KIND_GPU}`` makes 2
  instances on each GPU of the machine (the default group, ``count: 1``, one per GPU).
* ``KIND_AUTO`` runs where the engine runs (a CUDA plan: a GPU group, so on every visible GPU
  unless ``gpus`` says otherwise; a CPU plan: ``count`` CPU instances).
* A CPU group makes ``count`` instances and may not list GPUs.

Behaviour changed from StreamRT before issue 17 (documented in ``docs/scaling.md``): ``gpus`` took
only ``[0]`` and a GPU group put ``count`` instances on GPU 0 whatever the machine had. On a machine
with one GPU nothing changes. StreamRT refuses (where Triton would not say) a ``gpus`` list that
names a GPU twice: raise ``count`` instead.

Instances are ordered round-robin over the GPUs (GPU 0, GPU 1, GPU 0, GPU 1...), so the first
batches of an idle model already spread over the devices.

Example:
    >>> from streamrt.serve.configs.config import InstanceGroupConfig
    >>> [(p.device, p.gpu) for p in place_instances(
    ...     [InstanceGroupConfig(count=2, kind="KIND_GPU", gpus=(0, 1))], engine_kind="cuda", gpus=["H200", "H200"])]
    [('cuda', 0), ('cuda', 1), ('cuda', 0), ('cuda', 1)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import InstanceGroupConfig

__all__ = ["Placement", "describe_gpus", "gpu_indices", "place_instances", "resolved_groups", "visible_gpus"]

_KIND_DEVICE = {"KIND_GPU": "cuda", "KIND_CPU": "cpu"}


@dataclass(frozen=True)
class Placement:
    """One instance: its group (index in ``instance_group``), device kind and GPU index (None on the CPU)."""

    group: int
    device: str
    gpu: int | None


def visible_gpus() -> list[str]:
    """The names of the GPUs torch sees, by device index (empty without CUDA)."""
    from streamrt._features import cuda_available

    if not cuda_available():
        return []
    import torch

    return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]


def describe_gpus(gpus: Sequence[str]) -> str:
    """``"GPU 0 (NVIDIA H200), GPU 1 (NVIDIA H200)"``, or ``"none"``."""
    return ", ".join(f"GPU {i} ({name})" for i, name in enumerate(gpus)) or "none"


def _group_gpus(group: InstanceGroupConfig, index: int, gpus: Sequence[str], model: str) -> list[int]:
    if len(set(group.gpus)) != len(group.gpus):
        raise ConfigError(f"model '{model}': instance_group[{index}] lists a GPU twice in gpus {list(group.gpus)}",
                          hint="list each GPU once; count is the number of instances per listed GPU")
    missing = [g for g in group.gpus if g >= len(gpus)]
    if missing:
        raise ConfigError(
            f"model '{model}': instance_group[{index}] gpus {list(group.gpus)} names GPU {missing[0]}, which does "
            f"not exist; visible GPUs: {describe_gpus(gpus)}",
            hint="list visible GPU indices (CUDA_VISIBLE_DEVICES renumbers them from 0), or leave gpus out for all",
        )
    if not gpus:
        raise ConfigError(f"model '{model}': instance_group[{index}] needs a GPU and none is visible",
                          hint="use KIND_CPU with a CPU plan, or run where torch sees a CUDA GPU")
    return list(group.gpus) if group.gpus else list(range(len(gpus)))


def place_instances(
    groups: Sequence[InstanceGroupConfig], *, engine_kind: str, gpus: Sequence[str], model: str = "model"
) -> list[Placement]:
    """Every instance the groups ask for, with its device (see the module docstring for the rules).

    Args:
        groups: the config's ``instance_group``.
        engine_kind: ``"cuda"`` or ``"cpu"``: where the model's plan runs (resolves ``KIND_AUTO``).
        gpus: the names of the visible GPUs, by index (:func:`visible_gpus`).
        model: for messages.

    Raises:
        ConfigError: a group's kind contradicts the engine, a CPU group lists GPUs, or ``gpus`` names a
            GPU that does not exist (the message lists the visible ones) or names one twice.
    """
    placed: list[Placement] = []
    for index, group in enumerate(groups):
        device = _KIND_DEVICE.get(group.kind, engine_kind)
        if device != engine_kind:
            raise ConfigError(
                f"model '{model}': instance_group kind {group.kind} but the engine runs on {engine_kind}",
                hint="use KIND_AUTO, or build the plan for the device you want",
            )
        if device == "cpu":
            if group.gpus:
                raise ConfigError(f"model '{model}': instance_group[{index}] runs on the CPU but lists gpus "
                                  f"{list(group.gpus)}", hint="leave gpus out of a CPU group")
            placed.extend(Placement(index, "cpu", None) for _ in range(group.count))
            continue
        on = _group_gpus(group, index, gpus, model)
        placed.extend(Placement(index, "cuda", gpu) for _ in range(group.count) for gpu in on)
    return placed


def resolved_groups(groups: Sequence[InstanceGroupConfig], placements: Sequence[Placement]
                    ) -> tuple[InstanceGroupConfig, ...]:
    """The groups as Triton reports a loaded model's config: each group's ``kind`` as it ran
    (``KIND_GPU`` or ``KIND_CPU``, never ``KIND_AUTO``) and, for a GPU group, the GPUs it uses
    (every visible GPU when it listed none); ``count`` stays per GPU.

    Example:
        >>> from streamrt.serve.configs.config import InstanceGroupConfig
        >>> groups = [InstanceGroupConfig(count=2)]
        >>> g, = resolved_groups(groups, place_instances(groups, engine_kind="cuda", gpus=["H200", "H200"]))
        >>> g.kind, g.gpus, g.count
        ('KIND_GPU', (0, 1), 2)
    """
    resolved = []
    for index, group in enumerate(groups):
        mine = [p for p in placements if p.group == index]
        if mine and mine[0].device == "cuda":
            used = tuple(dict.fromkeys(p.gpu for p in mine if p.gpu is not None))
            resolved.append(replace(group, kind="KIND_GPU", gpus=used))
        else:
            resolved.append(replace(group, kind="KIND_CPU"))
    return tuple(resolved)


def gpu_indices(groups: Sequence[InstanceGroupConfig], gpus: Sequence[str], model: str = "model") -> list[int]:
    """The GPUs a model's instances would use if its plan runs on CUDA, in first-use order (checked as
    :func:`place_instances` checks them); empty when no GPU is visible or every group is KIND_CPU."""
    if not gpus:
        return []
    groups = [g for g in groups if g.kind != "KIND_CPU"]
    used = [p.gpu for p in place_instances(groups, engine_kind="cuda", gpus=gpus, model=model)]
    return list(dict.fromkeys(g for g in used if g is not None))
