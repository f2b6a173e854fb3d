"""A served Python model version: config checks, instances, the dynamic batcher, request validation.

:class:`PythonModel` keeps the :class:`~streamrt.serve.models.servable.Servable` contract, so the core,
the front ends, statistics and metrics treat it as any other model. Loading (in a worker thread)
checks the config (a Python model has no engine to derive inputs and outputs from, so the config
names them, or the model's ``auto_complete_config`` adds them, as in Triton), finds ``model.py`` and starts
one instance per ``instance_group`` count, each running its ``initialize``; if one raises, the
ones started are finalized and the load fails with that message (the model is UNAVAILABLE).
:meth:`PythonModel.stop` drains the scheduler, then every instance runs ``finalize``.

Example:
    >>> model = PythonModel.load(LoadContext(Path("repo/add_sub"), 1, config))   # doctest: +SKIP
    >>> model.start(); await model.infer(request)                                  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Hashable, Mapping
from typing import Any

from streamrt.errors import (
    ConfigError,
    ModelNotReadyError,
    RequestError,
    ShapeError,
)
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.execution.placement import Placement, place_instances, resolved_groups, visible_gpus
from streamrt.serve.models.python_backend.loader import auto_complete, find_model_file
from streamrt.serve.models.python_backend.runner import ModelSpec, PythonInstance, PythonInstances, Submitted
from streamrt.serve.models.servable import LoadContext, Servable, check_model_shape, checked_inputs, model_metadata
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.scheduler import ModelScheduler
from streamrt.serve.wire.protocol import InferRequest, InferResponse

__all__ = ["PLATFORM", "PythonModel", "load_python_model", "resolve_python_config"]

log = logging.getLogger(__name__)

PLATFORM = "python"
"""What metadata reports as the model's platform (Triton reports the backend name for Python models)."""

_FALSE = ("no", "false", "0", "off")


def resolve_python_config(config: ModelConfig) -> ModelConfig:
    """Check a Python model's config and fill in its defaults (``max_batch_size`` 0 when unset).

    Raises:
        ConfigError: no inputs or outputs, ``reshape``, warm-up, ``sequence_batching``,
            ``EXECUTION_ENV_PATH``, or batching settings that contradict ``max_batch_size``.
    """
    where = f"Python model '{config.name}'"
    if not config.input or not config.output:
        raise ConfigError(f"{where}: the config must list its inputs and outputs (a Python model has no engine "
                          "to take them from)", hint="add input [...] and output [...] to config.pbtxt, or let "
                          "TritonPythonModel.auto_complete_config add them")
    reshaped = [t.name for t in (*config.input, *config.output) if t.reshape is not None]
    if reshaped:
        raise ConfigError(f"{where}: reshape is not supported for Python models ({', '.join(reshaped)})",
                          hint="give the shapes model.py uses in dims")
    if config.model_warmup:
        raise ConfigError(f"{where}: model_warmup is not supported for Python models",
                          hint="warm up inside initialize(), which runs before the model is READY")
    if config.sequence_batching is not None:
        raise ConfigError(f"{where}: sequence_batching is not supported for Python models",
                          hint="keep per-sequence state in an engine model, or serve this model with Triton")
    if "EXECUTION_ENV_PATH" in {k.upper() for k in config.parameters}:
        raise ConfigError(f"{where}: EXECUTION_ENV_PATH is not supported: StreamRT runs Python models in the "
                          "server's own interpreter", hint="install the model's packages into the server's "
                          "environment and remove the parameter")
    mbs = config.max_batch_size or 0
    if config.dynamic_batching is not None and mbs == 0:
        raise ConfigError(f"{where}: dynamic_batching needs max_batch_size >= 1")
    for size in config.dynamic_batching.preferred_batch_size if config.dynamic_batching else ():
        if size > mbs:
            raise ConfigError(f"{where}: preferred_batch_size {size} exceeds max_batch_size {mbs}")
    return config.replace(max_batch_size=mbs)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class PythonModel:
    """A loaded Python model version. Create with :meth:`load`, then :meth:`start` on the loop."""

    def __init__(self, version: int, config: ModelConfig, instances: PythonInstances) -> None:
        self.version = version
        self.config = config
        self.instances = instances
        self.stats = ModelStats()
        self.load_seconds = 0.0
        self.platform = PLATFORM
        self.labels: dict[str, list[str]] = {}
        self.batched = bool(config.max_batch_size)
        self._inputs = {t.name: t for t in config.input}
        self._outputs = tuple(t.name for t in config.output)
        self._scheduler: ModelScheduler | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @classmethod
    def load(cls, context: LoadContext) -> PythonModel:
        """Check the config, import ``model.py`` and initialize every instance (blocking; call from a thread).

        Raises:
            ConfigError: the config does not fit a Python model, or asks for a GPU that is not there.
            ModelNotFoundError: no ``model.py``.
            ModelError: importing ``model.py`` or an ``initialize`` raised.
        """
        started = time.perf_counter()
        path = find_model_file(context.model_dir, context.version, context.config.default_model_filename)
        config = resolve_python_config(auto_complete(path, context.config))
        # Triton's placement: count instances on each listed GPU (every visible GPU when none is listed);
        # the model reads its GPU from args["model_instance_device_id"].
        gpus = visible_gpus()
        placements: list[tuple[str, Placement]] = []  # (instance kind for args, where)
        for index, group in enumerate(config.instance_group):
            kind = cls._instance_kind(config.name, group.kind)
            placements += [(kind, Placement(index, where.device, where.gpu))
                           for where in place_instances([group], engine_kind="cuda" if kind == "GPU" else "cpu",
                                                        gpus=gpus, model=config.name)]
        config = config.replace(instance_group=resolved_groups(config.instance_group, [p for _, p in placements]))
        from streamrt.serve.configs.config_message import to_message
        from streamrt.serve.configs.triton_config import message_json

        params = {k.upper(): v.strip().lower() for k, v in config.parameters.items()}
        spec = ModelSpec(
            name=config.name, version=context.version, path=path, model_dir=context.model_dir,
            config_json=message_json(to_message(config, "")),
            outputs={t.name: t for t in config.output}, batched=bool(config.max_batch_size),
            cpu_inputs=params.get("FORCE_CPU_ONLY_INPUT_TENSORS", "yes") not in _FALSE,
            isolate=params.get("ISOLATE_FAILED_BATCHES", "yes") not in _FALSE,
        )
        instances: list[PythonInstance] = []
        in_group: collections.Counter[int] = collections.Counter()
        try:
            for kind, where in placements:
                group = config.instance_group[where.group]
                name = f"{config.name}_{where.group}_{in_group[where.group]}"
                in_group[where.group] += 1
                instances.append(PythonInstance.start(spec, name, kind, where.gpu or 0))
                if context.rate_limiter is not None:  # executions wait for the limiter's grant, as engines' do
                    instances[-1].rate_limit = context.rate_limiter.register(name, group.rate_limiter, where.gpu or 0)
        except BaseException:
            PythonInstances(instances).close(timeout=10.0)
            raise
        model = cls(context.version, config, PythonInstances(instances))
        model.load_seconds = time.perf_counter() - started
        log.info("Python model '%s' version %d: %d instance(s) initialized in %.2f s", config.name, context.version,
                 len(instances), model.load_seconds)
        return model

    @staticmethod
    def _instance_kind(model: str, kind: str) -> str:
        """``"GPU"`` or ``"CPU"`` for ``args["model_instance_kind"]`` (KIND_AUTO: GPU when there is one)."""
        if kind == "KIND_CPU":
            return "CPU"
        cuda = _cuda_available()
        if kind == "KIND_GPU" and not cuda:
            raise ConfigError(f"Python model '{model}': instance_group kind KIND_GPU but no CUDA device is available",
                              hint="use KIND_CPU (or KIND_AUTO) on machines without a GPU")
        return "GPU" if cuda else "CPU"

    def release(self) -> None:
        """Finalize the instances (a load that failed after this version was created)."""
        self.instances.close(timeout=10.0)

    # --- serving ------------------------------------------------------------------------------

    def start(self) -> None:
        """Put the dynamic batcher in front of the instances (call on the event loop)."""
        self._scheduler = ModelScheduler(
            f"{self.name}:{self.version}", self.instances,
            max_batch_size=self.config.max_batch_size or 1,
            batching=self.config.dynamic_batching, stats=self.stats,
        )

    @property
    def pending(self) -> int:
        return self._scheduler.pending if self._scheduler else 0

    def validate(self, inputs: Mapping[str, Any]) -> int:
        """Check a request's inputs against the config; return its batch rows.

        Raises:
            UnknownInputError / MissingInputError / DTypeMismatchError / ShapeError.
        """
        rows: set[int] = set()
        for name, tensor, array in checked_inputs(inputs, self._inputs, "model", self.name):
            check_model_shape(name, tensor, tuple(array.shape), self.config)
            if self.batched:
                rows.add(int(array.shape[0]))
        if len(rows) > 1:
            raise ShapeError(f"the inputs of model '{self.name}' disagree on the batch size: {sorted(rows)}")
        return rows.pop() if rows else 1

    def batching_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Requests with equal keys may share a batch: same datatypes and non-batch dims (Triton's rule)."""
        return tuple((n, inputs[n].dtype.str, tuple(inputs[n].shape[1:] if self.batched else inputs[n].shape))
                     for n in self._inputs)

    async def infer(self, request: InferRequest, trace: RequestTrace | None = None) -> InferResponse:
        """Validate, queue for the batcher, wait for this request's response; outputs on the host unless
        the request asks for device outputs (``outputs_on_device``: an ensemble step feeding other steps)."""
        return await self.infer_tensors(request, trace, on_device=request.outputs_on_device)

    async def infer_tensors(self, request: InferRequest, trace: RequestTrace | None = None, *,
                            on_device: bool = True) -> InferResponse:
        """As :meth:`infer`; with ``on_device`` the outputs the model returned on the device stay there
        (as :class:`~streamrt.serve.wire.shared_memory.DeviceTensor`), for a caller that passes them on."""
        if self._scheduler is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not started")
        for out in request.outputs:
            if out.name not in self._outputs:
                raise RequestError(f"unknown output '{out.name}' for model '{self.name}'; "
                                   f"its outputs are: {', '.join(self._outputs)}")
            if out.class_count:
                raise RequestError(f"model '{self.name}': the classification extension is not supported "
                                   "for Python models", hint="return the top classes from model.py")
        if request.sequence is not None:
            raise RequestError(
                f"model '{self.name}' has no sequence_batching, so it keeps no state between requests; "
                f"the request names sequence {request.sequence.id}",
                hint="drop sequence_id/sequence_start/sequence_end")
        rows = self.validate(request.inputs)
        requested = tuple(o.name for o in request.outputs) or self._outputs
        payload = Submitted(request.inputs, request.id, requested, on_device=on_device)
        outputs = await self._scheduler.submit(
            payload, rows=rows, key=self.batching_key(request.inputs),
            priority=request.priority, timeout_us=request.timeout_us, trace=trace,
        )
        return InferResponse(self.name, str(self.version), request.id, {n: outputs[n] for n in requested})

    async def stop(self, timeout: float) -> None:
        """Drain the scheduler (bounded by ``timeout``); every instance then runs ``finalize``."""
        if self._scheduler is not None:
            await self._scheduler.close(timeout)
        else:
            self.instances.close(timeout=timeout)

    # --- descriptions -------------------------------------------------------------------------

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The model metadata response (KServe ``$metadata_model_response``)."""
        return model_metadata(self.config, self.platform, versions)

    def triton_config(self) -> Any:
        """The resolved config as Triton's ``inference.ModelConfig`` message."""
        from streamrt.serve.configs.config_message import to_message

        return to_message(self.config, "")  # Triton: backend "python", no platform


def load_python_model(context: LoadContext) -> Servable:
    """The Python kind's loader (:data:`streamrt.serve.models.servable.KINDS`); mypy checks here that
    :class:`PythonModel` keeps the :class:`~streamrt.serve.models.servable.Servable` contract."""
    served: Servable = PythonModel.load(context)
    return served

