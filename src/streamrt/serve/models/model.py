"""One served model version: engine, resolved config, instances, scheduler and statistics.

Loading (:meth:`ServedModel.load`, run in a worker thread) finds the version's file, builds an
ONNX model through the build cache when there is no plan, loads the engine, resolves the config
against the engine (inputs, outputs and ``max_batch_size`` come from the engine's specs and shape
profiles when the config leaves them out, and must agree with them when it does not), creates
the instances, probes that every output follows the batch (:mod:`streamrt.serve.execution.integrity`: a
model whose outputs do not is refused, or loaded with batching off when the config leaves
``max_batch_size`` out) and warms every instance up. Only then can :meth:`ServedModel.start` put a
scheduler in front of it on the event loop and the model report READY.

Example:
    >>> served = ServedModel.load(Path("repo/cnn"), 1, ModelConfig(name="cnn"))   # doctest: +SKIP
    >>> served.start(); await served.infer(request)                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamrt._oom import LOAD_HINT, as_out_of_memory
from streamrt.backends.base import Engine
from streamrt.device import device_scope
from streamrt.errors import ConfigError, OutOfMemoryError
from streamrt.onnx.profiles import check_shapes
from streamrt.running.inputs import random_inputs
from streamrt.serve.configs.config import ModelConfig, WarmupConfig
from streamrt.serve.execution.instances import DeviceEngines, DeviceOutputs, InstanceGroup
from streamrt.serve.execution.integrity import OutputCheck, batch_refusal, probe_batch_outputs, probe_sizes
from streamrt.serve.execution.memory_budget import MemoryBudget, model_limit, release_device_memory
from streamrt.serve.execution.placement import gpu_indices, visible_gpus
from streamrt.serve.execution.rate_limiter import RateLimiter
from streamrt.serve.models.classification import read_labels
from streamrt.serve.models.engine_config import resolve_config
from streamrt.serve.models.engine_files import load_engine, load_estimate
from streamrt.serve.models.scheduled import ScheduledModel
from streamrt.serve.models.servable import EngineLoader, LoadContext, Servable
from streamrt.serve.scheduling.sequence import sequence_warmup_inputs
from streamrt.serve.wire.protocol import InferRequest
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.types import DType, ShapeProfile, TensorSpec

__all__ = ["EngineLoader", "ServedModel", "load_engine", "load_served_model", "resolve_config"]
# load_engine and resolve_config live in .engine_files and .engine_config; named here as the engine kind's surface

log = logging.getLogger(__name__)


class ServedModel(ScheduledModel):
    """A loaded, warmed-up engine model version. Create with :meth:`load`, then :meth:`start` on the loop.

    Scheduling, validation against the config, output selection and stop are
    :class:`~streamrt.serve.models.scheduled.ScheduledModel`'s; this kind supplies its loading (engine,
    config resolution, memory budget, batch probe, warm-up), its instances, the shape profiles'
    check and Triton's ``reshape`` both ways.
    """

    def __init__(
        self, version: int, config: ModelConfig, engine: Engine, instances: InstanceGroup,
        engines: DeviceEngines | None = None,
    ) -> None:
        super().__init__(version, config, f"streamrt_{engine.manifest.backend}")
        self.engine = engine
        self.engines = engines or DeviceEngines(engine)
        """The engine on each GPU the instances use (``engine`` is the first of them)."""
        self.instances = instances
        self._reshaped_in = {t.name: t.reshape for t in config.input if t.reshape is not None}
        self._reshaped_out = {t.name: t.dims for t in config.output if t.reshape is not None}
        self._limiter: RateLimiter | None = None
        self._budget: tuple[MemoryBudget, str] | None = None

    @classmethod
    def load(
        cls, model_dir: Path, version: int, config: ModelConfig, loader: EngineLoader | None = None, *,
        limiter: RateLimiter | None = None, budget: MemoryBudget | None = None,
    ) -> ServedModel:
        """Load engine, resolve config, create and warm up instances (blocking; call from a thread).

        ``loader`` replaces :func:`load_engine` (tests inject engines that fail or stall on purpose).
        ``limiter`` registers the instances with the server's rate limiter; ``budget`` is the
        server's GPU memory ledger (:mod:`streamrt.serve.execution.memory_budget`; default: free memory only).

        Raises:
            ConfigError: the model does not fit its memory budget or the free GPU memory.
            OutOfMemoryError: memory ran out while loading or warming up (what it took is released).
        """
        budget = budget or MemoryBudget()
        key = f"{config.name}:{version}"
        need, device = load_estimate(model_dir, version, config)
        limit = model_limit(config.parameters, config.name)
        gpus = visible_gpus()
        used = gpu_indices(config.instance_group, gpus, config.name) or [0]  # a GPU that does not exist: refused here
        for gpu in used:  # the engine is loaded once per GPU: each one must hold it
            budget.admit(key, need, device=device, model_limit=limit, basis="its model file", gpu=gpu)
        started = time.perf_counter()
        try:
            with budget.measuring(device, used) as measure:
                served = cls._load(model_dir, version, config, loader, limiter, gpus)
        except Exception as exc:
            oom = as_out_of_memory(exc, f"loading model {key}", LOAD_HINT)
            if oom is None:
                raise
            traceback.clear_frames(exc.__traceback__)  # the failed load's locals (tensors, engine) go now
            release_device_memory()
            free = budget.describe_free(used)
            raise OutOfMemoryError(f"loading model {key}" + (f" ({free} after releasing it)" if free else ""),
                                   memory=oom.memory, requested=oom.requested, hint=LOAD_HINT) from exc
        if served.engine.device_kind == "cuda" and measure.taken is not None:
            try:
                for gpu in served.engines.gpus:
                    taken = max(measure.by_gpu.get(gpu, 0), need)
                    budget.admit(key, taken, device="cuda", model_limit=limit, basis="measured while loading", gpu=gpu)
                    budget.account(key, taken, gpu)
                    served.stats.memory_usage.append({"type": "GPU", "id": gpu, "byte_size": taken})
            except ConfigError:
                budget.forget(key)
                served.release()
                release_device_memory()
                raise
        served._budget = (budget, key)
        served.load_seconds = time.perf_counter() - started
        return served

    @classmethod
    def _load(
        cls, model_dir: Path, version: int, config: ModelConfig, loader: EngineLoader | None,
        limiter: RateLimiter | None, gpus: list[str] | None = None,
    ) -> ServedModel:
        gpus = visible_gpus() if gpus is None else gpus

        def load() -> Engine:
            return (loader or load_engine)(model_dir, version, config)

        # With several GPUs the first engine goes on the first GPU the instances use, the others on theirs
        # (DeviceEngines); with one GPU nothing is scoped, so that path is what it always was.
        first = (gpu_indices(config.instance_group, gpus, config.name) or [0])[0]
        with device_scope(first if len(gpus) > 1 else None):
            engine = load()
        engines = DeviceEngines(engine, first if engine.device_kind == "cuda" else None, load)
        try:
            served = cls._create(version, resolve_config(config, engine), engines, limiter, gpus)
        except BaseException:
            engines.close()
            raise
        try:
            served = served._probe_batch_outputs(config)
            served.labels = read_labels(model_dir, served.config)
            served.warm_up()
        except BaseException:
            served.release()
            raise
        return served

    @classmethod
    def _create(
        cls, version: int, resolved: ModelConfig, engines: DeviceEngines, limiter: RateLimiter | None = None,
        gpus: list[str] | None = None,
    ) -> ServedModel:
        batched = bool(resolved.max_batch_size)
        instances = InstanceGroup.create(
            f"{resolved.name}_{version}", engines, resolved.instance_group,
            batched=batched, max_batch_size=resolved.max_batch_size or 1,
            check=OutputCheck(resolved.name, resolved.output, batched=batched), limiter=limiter, gpus=gpus,
        )
        if instances.groups:  # the config as Triton reports a loaded model's: kinds and GPUs as placed
            resolved = resolved.replace(instance_group=instances.groups)
        served = cls(version, resolved, engines.primary, instances, engines)
        served._limiter = limiter
        return served

    def _probe_batch_outputs(self, given: ModelConfig) -> ServedModel:
        """Run batches of 1 and max_batch_size rows; refuse the model (ConfigError) if an output's first
        dimension does not follow, or return it re-created with batching off when the config allows."""
        if not self.batched:
            return self
        rng = np.random.default_rng(0)

        def run(size: int) -> dict[str, np.ndarray] | None:
            inputs = self._warmup_inputs(WarmupConfig(name=f"batch_probe_{size}", batch_size=size), rng)
            return None if inputs is None else self.instances.instances[0].execute([self.to_engine(inputs)])

        mbs = self.config.max_batch_size or 1
        states = list(self.config.sequence_batching.hidden_outputs) if self.config.sequence_batching else []
        offenders = probe_batch_outputs(run, [*self._outputs, *states], probe_sizes(mbs))
        if not offenders:
            return self
        hint = "set max_batch_size: 0 (and drop dynamic_batching) to serve it unbatched, " \
               "or export the model so that its outputs keep the batch dimension"
        unbatched, why = None, None
        if given.max_batch_size is None and given.dynamic_batching is None:
            try:
                unbatched = resolve_config(given.replace(max_batch_size=0), self.engine)
            except ConfigError as exc:  # e.g. input dims written for a batched model
                why = f"batching off does not fit the config either ({exc.message})"
        message = batch_refusal(self.name, offenders, max_batch_size=mbs, fallback=unbatched is not None, why=why)
        if unbatched is None:
            raise ConfigError(message, hint=hint)
        log.warning("%s", message)
        self.instances.close(timeout=5.0)
        self.instances = InstanceGroup([])  # a failure below releases the engine, not these twice
        return self._create(self.version, unbatched, self.engines, self._limiter)

    def release(self) -> None:
        """Close instances and engine (a load that failed, or a version stopped before it started)."""
        self.instances.close(timeout=5.0)
        self._release_after_scheduler()

    def _release_after_scheduler(self) -> None:
        self.engines.close()
        self._forget_memory()

    def _forget_memory(self) -> None:
        if self._budget is not None:
            budget, key = self._budget
            budget.forget(key)
            self._budget = None

    # --- warm-up ------------------------------------------------------------------------------

    def _warmup_runs(self) -> list[WarmupConfig]:
        if self.config.model_warmup is not None:
            return list(self.config.model_warmup)
        sizes = sorted({1, self.config.max_batch_size or 1})
        return [WarmupConfig(name=f"default_batch_{b}", batch_size=b) for b in sizes]

    def _warmup_inputs(self, warmup: WarmupConfig, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
        """Random inputs (zeros where ``zero_data`` asks) at the warm-up's shapes; None when a dim is unknown."""
        profile = self.engine.profiles[0] if self.engine.profiles else ShapeProfile()
        specs, zeros = [], set()
        for name, tensor in self._inputs.items():
            given = warmup.inputs.get(name, {})
            dims = tuple(int(d) for d in given.get("dims", tensor.dims))
            if tensor.data_type is DType.BYTES and not given:
                return None  # what a string means is the model's business: only configured warm-ups
            if any(d < 0 for d in dims):
                opt = profile.ranges.get(name)
                if opt is None or tensor.reshape is not None:
                    return None
                offset = 1 if self.batched else 0
                dims = tuple(opt.opt[i + offset] if d < 0 else d for i, d in enumerate(dims))
            specs.append(TensorSpec(name, tensor.data_type, (warmup.batch_size, *dims) if self.batched else dims))
            if given.get("zero_data"):
                zeros.add(name)
        arrays = random_inputs(specs, {s.name: s.shape for s in specs}, rng)
        for spec in specs:
            if spec.name in zeros:
                arrays[spec.name] = np.zeros(spec.shape, spec.dtype.numpy)
        return {**arrays, **sequence_warmup_inputs(self.config, warmup.batch_size)}

    def warm_up(self) -> None:
        """Run the warm-up requests on every instance (Triton: not READY before this succeeds)."""
        rng = np.random.default_rng(0)
        for warmup in self._warmup_runs():
            inputs = self._warmup_inputs(warmup, rng)
            if inputs is None:
                log.info("model '%s': skipping warm-up '%s' (dynamic dims without a profile)", self.name, warmup.name)
                continue
            self.validate({k: v for k, v in inputs.items() if k in self._inputs})
            inputs = self.to_engine(inputs)
            for instance in self.instances.instances:
                for _ in range(warmup.count):
                    instance.run([inputs])
        log.debug("model '%s' version %d warmed up", self.name, self.version)

    # --- what runs: the instances, inputs and outputs in the engine's shapes -------------------

    def _executors(self) -> InstanceGroup:
        return self.instances

    def _payload(self, request: InferRequest) -> dict[str, Any]:
        inputs = self.to_engine(request.inputs)
        if request.outputs_on_device and not self._reshaped_out and not any(o.class_count for o in request.outputs):
            return DeviceOutputs(inputs)  # a CUDA instance may hand back device views (an ensemble step)
        return inputs

    def _check_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """The engine's shape profiles, on the shapes the engine will see (after ``reshape``)."""
        if self.engine.profiles:
            check_shapes(self.engine.profiles, {n: self._engine_shape(n, s) for n, s in shapes.items()})

    def _engine_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        reshape = self._reshaped_in.get(name)
        if reshape is None:
            return shape
        lead = shape[:1] if self.batched else ()
        return tuple(np.empty(shape, dtype=np.bool_).reshape(*lead, *reshape).shape)

    def to_engine(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs in the engine's shapes (Triton's ``reshape``); ``inputs`` itself when none is set."""
        if not self._reshaped_in:
            return inputs
        return {n: _reshaped(a, self._engine_shape(n, a.shape)) if n in self._reshaped_in else a
                for n, a in inputs.items()}

    def _from_engine(self, name: str, array: Any) -> Any:
        dims = self._reshaped_out.get(name)
        if dims is None:
            return array
        return array.reshape((array.shape[0], *dims) if self.batched else dims)


def _reshaped(array: Any, shape: tuple[int, ...]) -> Any:
    """``array`` in ``shape``: a NumPy view, or a view of a device tensor (an ensemble step's input)."""
    if isinstance(array, DeviceTensor):
        return DeviceTensor(array.tensor.reshape(shape), array.dtype, shape)
    return array.reshape(shape)


def load_served_model(context: LoadContext) -> Servable:
    """The engine kind's loader (:data:`streamrt.serve.models.servable.KINDS`); mypy checks here that
    :class:`ServedModel` keeps the :class:`~streamrt.serve.models.servable.Servable` contract."""
    served: Servable = ServedModel.load(context.model_dir, context.version, context.config, context.engine_loader,
                                        limiter=context.rate_limiter, budget=context.memory_budget)
    return served
