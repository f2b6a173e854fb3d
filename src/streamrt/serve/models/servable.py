"""What the server serves: the :class:`Servable` contract and how a model's config picks its kind.

Every loaded model version the repository holds is a :class:`Servable`: an engine model
(:class:`streamrt.serve.models.model.ServedModel`: a plan or ONNX file run by a backend), an ensemble
(:mod:`streamrt.serve.models.ensemble`: a DAG of other models' steps) or a Python model
(:mod:`streamrt.serve.models.python_backend`: a ``model.py`` in the shape of Triton's
``TritonPythonModel``). The core, the front ends, statistics and metrics see only this contract.

A config picks its kind as Triton's does: ``platform: "ensemble"`` is an ensemble,
``backend: "python"`` a Python model, anything else an engine model. Each kind's loader takes a
:class:`LoadContext`; ``lookup`` lets an ensemble reach the models it composes at request time
(so a reloaded step is picked up without reloading the ensemble).

Example:
    >>> kind_of(ModelConfig(name="m", platform="ensemble"))
    'ensemble'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamrt.errors import DTypeMismatchError, MissingInputError, ShapeError, UnknownInputError
from streamrt.serve.configs.config import ModelConfig, TensorConfig
from streamrt.types import DType

if TYPE_CHECKING:
    from streamrt.backends.base import Engine
    from streamrt.serve.execution.memory_budget import MemoryBudget
    from streamrt.serve.execution.rate_limiter import RateLimiter
    from streamrt.serve.observability.stats import ModelStats
    from streamrt.serve.observability.tracing import RequestTrace
    from streamrt.serve.wire.protocol import InferRequest, InferResponse

__all__ = [
    "KINDS", "EngineLoader", "LoadContext", "Servable", "check_model_shape", "checked_inputs", "kind_of",
    "load_servable", "model_metadata",
]


EngineLoader = Callable[[Path, int, ModelConfig], "Engine"]
"""Loads an engine model's engine: ``(model_dir, version, config) -> Engine`` (tests replace it)."""


class Servable(Protocol):
    """A loaded model version as the server core, front ends, statistics and metrics use it."""

    version: int
    config: ModelConfig
    stats: ModelStats
    platform: str
    load_seconds: float
    labels: dict[str, list[str]]

    @property
    def name(self) -> str: ...

    @property
    def pending(self) -> int:
        """Requests queued and not yet running."""
        ...

    def start(self) -> None:
        """Begin serving (called on the event loop once every version of the load is warm)."""

    async def infer(self, request: InferRequest, trace: RequestTrace | None = None) -> InferResponse: ...

    async def stop(self, timeout: float) -> None:
        """Finish in-flight work (bounded by ``timeout``) and release everything."""

    def release(self) -> None:
        """Release what a load took when the load failed after this version was created."""

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The KServe model metadata response."""
        ...

    def triton_config(self) -> Any:
        """The resolved config as Triton's ``inference.ModelConfig`` message."""
        ...


@dataclass(frozen=True)
class LoadContext:
    """What a kind's loader gets: the version to load and the repository's services.

    Attributes:
        model_dir: the model's directory (``<repo>/<name>``, or a load request's files).
        version: the version directory to load.
        config: the model's config as read (each kind resolves it further).
        engine_loader: replaces how engine models load their engine (tests).
        lookup: ``lookup(name, version)`` returns the served version of another model (for
            ensembles; raises as :meth:`ModelRepository.get` does).
        rate_limiter: the server's rate limiter, when ``--rate-limit`` is on (instances register with it).
        memory_budget: the server's GPU memory ledger (None: free memory only).
    """

    model_dir: Path
    version: int
    config: ModelConfig
    engine_loader: EngineLoader | None = None
    lookup: Callable[[str, str], Servable] | None = None
    rate_limiter: RateLimiter | None = None
    memory_budget: MemoryBudget | None = None


KINDS = {
    "engine": "streamrt.serve.models.model:load_served_model",
    "ensemble": "streamrt.serve.models.ensemble:load_ensemble",
    "python": "streamrt.serve.models.python_backend:load_python_model",
}
"""Each kind's loader as ``module:function`` (imported when a model of that kind loads)."""


def kind_of(config: ModelConfig) -> str:
    """``"ensemble"``, ``"python"`` or ``"engine"``, from the config's platform and backend."""
    if config.platform == "ensemble":
        return "ensemble"
    if config.backend == "python":
        return "python"
    return "engine"


def load_servable(context: LoadContext) -> Servable:
    """Load one model version of whatever kind its config names (blocking: call from a thread)."""
    module, function = KINDS[kind_of(context.config)].split(":")
    loader: Callable[[LoadContext], Servable] = getattr(importlib.import_module(module), function)
    return loader(context)


def model_metadata(config: ModelConfig, platform: str, versions: list[str]) -> dict[str, Any]:
    """The KServe model metadata response of any kind: its config's tensors, with the batch
    dimension (-1) in front when the model batches."""
    lead = [-1] if config.max_batch_size else []

    def tensors(items: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.data_type.kserve, "shape": lead + list(t.dims)} for t in items]

    return {"name": config.name, "versions": versions, "platform": platform,
            "inputs": tensors(config.input), "outputs": tensors(config.output)}


def checked_inputs(
    inputs: Mapping[str, Any], specs: Mapping[str, TensorConfig], kind: str, name: str
) -> Iterator[tuple[str, TensorConfig, Any]]:
    """A request's inputs against a config's, for any kind (``kind``: "model" or "ensemble"):
    refuse unknown names, then yield ``(name, config, array)`` for each config input, refusing a
    missing one or a datatype other than the config's. Shapes are each kind's own check.

    Raises:
        UnknownInputError / MissingInputError / DTypeMismatchError.
    """
    for given in inputs:
        if given not in specs:
            raise UnknownInputError(f"unknown input '{given}' for {kind} '{name}'; "
                                    f"its inputs are: {', '.join(specs)}")
    for input_name, tensor in specs.items():
        array = inputs.get(input_name)
        if array is None:
            raise MissingInputError(f"{kind} '{name}' needs input '{input_name}' "
                                    f"(TYPE_{tensor.data_type.kserve}, dims {list(tensor.dims)})")
        if array.dtype.str.lstrip("<>=|") != tensor.data_type.numpy.str.lstrip("<>=|"):
            got = DType.from_any(array.dtype).kserve
            raise DTypeMismatchError(f"input '{input_name}' of {kind} '{name}' has datatype {got}, "
                                     f"the {kind} expects {tensor.data_type.kserve}")
        yield input_name, tensor, array


def check_model_shape(
    name: str, tensor: TensorConfig, shape: tuple[int, ...], config: ModelConfig, kind: str = "model"
) -> None:
    """Refuse (ShapeError) an input shape that does not fit the config of a model (or, with ``kind``
    "ensemble", an ensemble): the config's dims (-1: any size) after the batch dimension when it
    batches, a batch size in 1..max_batch_size."""
    batched = bool(config.max_batch_size)
    rest = shape[1:] if batched else shape
    if len(rest) != len(tensor.dims) or any(d not in (-1, s) for s, d in zip(rest, tensor.dims, strict=False)):
        expected = ([-1] if batched else []) + list(tensor.dims)
        raise ShapeError(f"input '{name}' of {kind} '{config.name}' has shape {list(shape)}, "
                         f"the {kind} expects {expected} (-1: any size)")
    mbs = config.max_batch_size or 1
    if batched and not 1 <= shape[0] <= mbs:
        raise ShapeError(f"input '{name}' of {kind} '{config.name}' has batch size {shape[0]}; "
                         f"it must be in 1..{mbs} (max_batch_size)")
