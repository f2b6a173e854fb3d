"""GPU memory checked when a model loads: a model that does not fit is refused, not run into an OOM.

What a load needs is not known exactly before it happens (kernels, workspaces, the allocator's
cache and warm-up activations come on top of the weights), so the check is made twice, with the
best number available each time:

* **Before loading**: the model file's size (plan payload or ONNX file), a lower bound of what
  its weights take on the device, against the model's own ``memory_budget_mb`` parameter and,
  for a CUDA model, the server's remaining ``--gpu-memory-budget-mb`` and the GPU's free memory
  (``torch.cuda.mem_get_info``), on every GPU its instances use (:mod:`streamrt.serve.execution.placement`),
  each on its own: the budget is per GPU. A model refused here never touched the GPU.
* **After loading and warming up**: the device memory the load actually took, measured as the
  drop of the GPU's free memory across the load (CUDA loads are serialised so that each one is
  measured alone; other processes allocating at the same time are counted too, which errs on the
  side of refusing). A model over its budget now is released again and refused. What it took is
  then counted against the server's budget until it is unloaded.
* An out-of-memory failure during load or warm-up becomes the same kind of refusal
  (:class:`~streamrt.errors.OutOfMemoryError` saying what was free), after the model's memory has
  been given back (:func:`release_device_memory`); the server keeps serving the other models.

On the CPU there is no device memory to measure reliably in a shared process (allocator caches,
other threads), so a CPU model is checked against its ``memory_budget_mb`` with the file size
only, and the server's GPU budget does not apply to it.

Example:
    >>> budget = MemoryBudget(gpu_budget_mb=100, free_memory=lambda gpu: (2**40, 2**40))
    >>> budget.account("a:1", 80 * MIB)
    >>> try:
    ...     budget.admit("b:1", 30 * MIB, device="cuda", model_limit=None, basis="model file")
    ... except ConfigError as exc:
    ...     print(exc.message.split(" but ")[1])
    the server's GPU memory budget of 100.0 MiB leaves 20.0 MiB on GPU 0
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from streamrt._features import cuda_available
from streamrt.errors import ConfigError

__all__ = ["MIB", "MODEL_PARAMETER", "LoadMeasure", "MemoryBudget", "free_device_memory", "model_limit",
           "release_device_memory"]

log = logging.getLogger(__name__)

MIB = 2**20
MODEL_PARAMETER = "memory_budget_mb"
"""The config ``parameters`` key with a model's own memory budget in MiB (on its device)."""

_HINT = ("unload other models, raise the budget (--gpu-memory-budget-mb, or the model's parameters "
         "memory_budget_mb), use fewer instances or smaller max shapes, or serve it on another GPU or the CPU")


def free_device_memory(gpu: int = 0) -> tuple[int, int] | None:
    """``(free, total)`` bytes of CUDA device ``gpu``, or None without CUDA."""
    if not cuda_available():
        return None
    import torch

    free, total = torch.cuda.mem_get_info(gpu)
    return int(free), int(total)


def release_device_memory() -> None:
    """Give what the process no longer references back to the device (after a failed load)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        for gpu in range(torch.cuda.device_count()):  # a model's instances may span GPUs
            torch.cuda.synchronize(gpu)
        torch.cuda.empty_cache()  # every device's cache


def model_limit(parameters: Mapping[str, str], model: str) -> int | None:
    """The model's ``memory_budget_mb`` parameter in bytes (None when not set).

    Raises:
        ConfigError: not a positive number.
    """
    text = parameters.get(MODEL_PARAMETER)
    if text is None:
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb > 0:
        raise ConfigError(f"model '{model}': parameters {MODEL_PARAMETER} must be a number of MiB > 0, got {text!r}")
    return int(mb * MIB)


def _mib(value: int) -> str:
    return f"{value / MIB:.1f} MiB"


@dataclass
class LoadMeasure:
    """The device memory one load took on each GPU it used (empty: not measured, e.g. a CPU model)."""

    by_gpu: dict[int, int] = field(default_factory=dict)

    @property
    def taken(self) -> int | None:
        """Bytes taken on all its GPUs together (None: not measured)."""
        return sum(self.by_gpu.values()) if self.by_gpu else None


class MemoryBudget:
    """The server's GPU memory ledger: what each loaded CUDA model took on each GPU, against the budget.

    The budget (``--gpu-memory-budget-mb``) applies to each GPU on its own: a model with instances on
    GPUs 0 and 1 is counted on both, and a refusal names the GPU that has no room.

    Args:
        gpu_budget_mb: GPU memory all models may take together on one GPU (None: only its free memory).
        free_memory: returns ``(free, total)`` bytes of a GPU given its index, or None without one (tests of
            the accounting rules pass fixed numbers).
    """

    def __init__(
        self, gpu_budget_mb: float | None = None,
        free_memory: Callable[[int], tuple[int, int] | None] = free_device_memory,
    ) -> None:
        self.budget = int(gpu_budget_mb * MIB) if gpu_budget_mb is not None else None
        self._free_memory = free_memory
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._taken: dict[tuple[str, int], int] = {}

    @property
    def taken(self) -> int:
        """Bytes counted against the budget by the loaded models, on all GPUs."""
        with self._lock:
            return sum(self._taken.values())

    def taken_on(self, gpu: int) -> int:
        """Bytes counted on GPU ``gpu``."""
        with self._lock:
            return sum(v for (_, g), v in self._taken.items() if g == gpu)

    def free(self, gpu: int = 0) -> tuple[int, int] | None:
        """``(free, total)`` bytes of GPU ``gpu`` now (None without CUDA)."""
        return self._free_memory(gpu)

    def admit(
        self, key: str, need: int, *, device: str, model_limit: int | None, basis: str, gpu: int = 0
    ) -> None:
        """Refuse (ConfigError) when ``need`` bytes do not fit the model's limit, or for a CUDA model the
        server's remaining budget on GPU ``gpu`` or that GPU's free memory; ``basis`` says how ``need`` was found."""
        where = "GPU memory" if device == "cuda" else f"{device} memory"
        head = f"model {key} needs at least {_mib(need)} of {where} ({basis})"
        if model_limit is not None and need > model_limit:
            raise ConfigError(f"{head} but its {MODEL_PARAMETER} parameter allows {_mib(model_limit)}", hint=_HINT)
        if device != "cuda":
            return
        if self.budget is not None:
            with self._lock:
                others = sum(v for (k, g), v in self._taken.items() if k != key and g == gpu)
            left = self.budget - others
            if need > left:
                raise ConfigError(f"{head} but the server's GPU memory budget of {_mib(self.budget)} leaves "
                                  f"{_mib(max(left, 0))} on GPU {gpu}", hint=_HINT)
        free = self.free(gpu)
        if free is not None and need > free[0]:
            raise ConfigError(f"{head} but GPU {gpu} has {_mib(free[0])} free of {_mib(free[1])}", hint=_HINT)

    @contextlib.contextmanager
    def measuring(self, device: str, gpus: Sequence[int] = (0,)) -> Iterator[LoadMeasure]:
        """Measure the device memory taken inside the block on each of ``gpus`` (CUDA: one measured load
        at a time)."""
        measure = LoadMeasure()
        if device != "cuda" or not gpus or self.free(gpus[0]) is None:
            yield measure
            return
        with self._load_lock:
            before = {g: self.free(g) for g in gpus}
            yield measure
            for gpu, was in before.items():
                now = self.free(gpu)
                if was is not None and now is not None:
                    measure.by_gpu[gpu] = max(0, was[0] - now[0])

    def account(self, key: str, taken: int, gpu: int = 0) -> None:
        """Count ``taken`` bytes of a loaded model (``<name>:<version>``) on GPU ``gpu`` against the budget."""
        with self._lock:
            self._taken[(key, gpu)] = taken
        log.info("model %s took %s of GPU %d memory (%s counted there for all models)", key, _mib(taken), gpu,
                 _mib(self.taken_on(gpu)))

    def forget(self, key: str) -> None:
        """The model was unloaded (or its load failed): its memory no longer counts, on any GPU."""
        with self._lock:
            for item in [k for k in self._taken if k[0] == key]:
                del self._taken[item]

    def describe_free(self, gpus: Sequence[int] = (0,)) -> str:
        """``"12.0 GiB free of 140.0 GiB"``-style text for messages, per GPU when several ("" without CUDA)."""
        parts = []
        for gpu in gpus:
            free = self.free(gpu)
            if free is not None:
                text = f"{_mib(free[0])} free of {_mib(free[1])}"
                parts.append(text if len(gpus) == 1 else f"GPU {gpu}: {text}")
        return "; ".join(parts)
