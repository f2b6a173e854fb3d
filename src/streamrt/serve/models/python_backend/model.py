"""A served Python model version: config checks, loading ``model.py``, its instances.

:class:`PythonModel` keeps the :class:`~streamrt.serve.models.servable.Servable` contract, so the core,
the front ends, statistics and metrics treat it as any other model. Loading (in a worker thread)
checks the config (a Python model has no engine to derive inputs and outputs from, so the config
names them, or the model's ``auto_complete_config`` adds them, as in Triton), finds ``model.py`` and starts
one instance per ``instance_group`` count, each running its ``initialize``; if one raises, the
ones started are finalized and the load fails with that message (the model is UNAVAILABLE).
:meth:`PythonModel.stop` drains the scheduler, then every instance runs ``finalize``. Serving itself
(validation, batching, classification, output selection) is :class:`~streamrt.serve.models.scheduled.ScheduledModel`'s.

Example:
    >>> model = PythonModel.load(LoadContext(Path("repo/add_sub"), 1, config))   # doctest: +SKIP
    >>> model.start(); await model.infer(request)                                  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import logging
import time

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.execution.placement import Placement, place_instances, resolved_groups, visible_gpus
from streamrt.serve.models.classification import read_labels
from streamrt.serve.models.python_backend.loader import auto_complete, find_model_file
from streamrt.serve.models.python_backend.runner import ModelSpec, PythonInstance, PythonInstances, Submitted
from streamrt.serve.models.scheduled import ScheduledModel
from streamrt.serve.models.servable import LoadContext, Servable
from streamrt.serve.wire.protocol import InferRequest

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


class PythonModel(ScheduledModel):
    """A loaded Python model version. Create with :meth:`load`, then :meth:`start` on the loop.

    Validation, the dynamic batcher, output selection (classification included) and stop are
    :class:`~streamrt.serve.models.scheduled.ScheduledModel`'s; this kind supplies its loading and
    its instances, and queues each request with what ``execute`` sees of it (id, requested outputs).
    """

    def __init__(self, version: int, config: ModelConfig, instances: PythonInstances) -> None:
        super().__init__(version, config, PLATFORM)
        self.instances = instances

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
        labels = read_labels(context.model_dir, config)  # before any instance starts: a missing file costs nothing
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
        model.labels = labels
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

    # --- what runs: the instances, each request with what execute() sees of it -------------------

    def _executors(self) -> PythonInstances:
        return self.instances

    def _payload(self, request: InferRequest) -> Submitted:
        requested = tuple(o.name for o in request.outputs) or self._outputs
        return Submitted(request.inputs, request.id, requested, on_device=request.outputs_on_device)

    def release(self) -> None:
        """Finalize the instances (a load that failed, or a version stopped before it started)."""
        self.instances.close(timeout=10.0)

    def _config_platform(self) -> str:
        return ""  # Triton: backend "python", no platform


def load_python_model(context: LoadContext) -> Servable:
    """The Python kind's loader (:data:`streamrt.serve.models.servable.KINDS`); mypy checks here that
    :class:`PythonModel` keeps the :class:`~streamrt.serve.models.servable.Servable` contract."""
    served: Servable = PythonModel.load(context)
    return served

