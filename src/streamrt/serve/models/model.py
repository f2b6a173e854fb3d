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
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamrt._features import cuda_available
from streamrt._oom import LOAD_HINT, as_out_of_memory
from streamrt.backends.base import Engine
from streamrt.device import device_scope
from streamrt.errors import (
    ConfigError,
    ModelNotFoundError,
    ModelNotReadyError,
    OutOfMemoryError,
    RequestError,
    ShapeError,
)
from streamrt.onnx.profiles import check_shapes
from streamrt.running.inputs import random_inputs
from streamrt.serve.configs.config import ModelConfig, TensorConfig, WarmupConfig
from streamrt.serve.execution.instances import DeviceEngines, DeviceOutputs, InstanceGroup
from streamrt.serve.execution.integrity import OutputCheck, batch_refusal, probe_batch_outputs, probe_sizes
from streamrt.serve.execution.memory_budget import MemoryBudget, model_limit, release_device_memory
from streamrt.serve.execution.placement import gpu_indices, visible_gpus
from streamrt.serve.execution.rate_limiter import RateLimiter
from streamrt.serve.models.classification import read_labels, top_k_classes
from streamrt.serve.models.servable import (
    EngineLoader,
    LoadContext,
    Servable,
    check_model_shape,
    checked_inputs,
    model_metadata,
)
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.scheduler import ModelScheduler
from streamrt.serve.scheduling.sequence import SequenceScheduler, check_sequence_io, sequence_warmup_inputs
from streamrt.serve.wire.protocol import InferRequest, InferResponse, RequestedOutput
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.types import DType, ShapeProfile, TensorSpec, format_shape

__all__ = ["EngineLoader", "ServedModel", "load_engine", "load_served_model", "resolve_config"]

log = logging.getLogger(__name__)


def load_engine(model_dir: Path, version: int, config: ModelConfig) -> Engine:
    """Open ``<model_dir>/<version>/<file>`` with :func:`streamrt.open`: a plan, or an ONNX model built
    through the cache with a batch profile of 1..``max_batch_size`` when the config gives no profiles.

    Raises:
        ModelNotFoundError: the version directory holds no model file.
    """
    from streamrt.building.opening import open as open_engine

    folder = model_dir / str(version)
    names = [config.default_model_filename] if config.default_model_filename else ["model.plan", "model.onnx"]
    path = next((folder / n for n in names if (folder / n).is_file()), None)
    if path is None:
        raise ModelNotFoundError(
            f"model '{config.name}' version {version}: no {' or '.join(names)} in {folder}",
            hint="put a plan (streamrt build) or an ONNX model there, or set default_model_filename",
        )
    started = time.perf_counter()
    build = config.build
    source: Any = path
    if path.suffix == ".onnx" and not build.profiles:
        from streamrt.onnx.model import load_model
        from streamrt.serve.configs.derived_profiles import derive_profile

        source = load_model(path)  # read once: its inputs decide the profile, then it is built
        profile = derive_profile(config, source.inputs)
        build = build.replace(profiles=(profile,)) if profile is not None else build
    engine = open_engine(source, build, max_batch=config.max_batch_size or None, cache=True)
    log.info("model '%s' version %d: opened %s in %.1f s", config.name, version, path.name,
             time.perf_counter() - started)
    return engine


def _tensors_from_engine(
    given: tuple[TensorConfig, ...], derived: list[TensorConfig], kind: str, model: str
) -> tuple[TensorConfig, ...]:
    """The engine's tensors when the config names none; else the config's, checked against the engine."""
    if not given:
        return tuple(derived)
    by_name = {t.name: t for t in derived}
    for t in given:
        engine_t = by_name.get(t.name)
        if engine_t is None:
            raise ConfigError(f"model '{model}': {kind} '{t.name}' is not in the engine; it has {', '.join(by_name)}")
        if t.data_type is not engine_t.data_type:
            raise ConfigError(f"model '{model}': {kind} '{t.name}' is TYPE_{t.data_type.kserve} in the config "
                              f"but TYPE_{engine_t.data_type.kserve} in the engine")
        dims = t.model_dims
        pairs = zip(dims, engine_t.dims, strict=False)
        if len(dims) != len(engine_t.dims) or any(e not in (-1, c) and c != -1 for c, e in pairs):
            what = "reshape" if t.reshape is not None else "dims"
            raise ConfigError(f"model '{model}': {kind} '{t.name}' has {what} {list(dims)} in the config but "
                              f"{list(engine_t.dims)} in the engine (batch dimension excluded)",
                              hint="give the model's shape in 'reshape' when the served dims differ")
    missing = [n for n in by_name if n not in {t.name for t in given}]
    if missing and kind == "input":
        raise ConfigError(f"model '{model}': the config leaves out engine inputs {missing}")
    return given


def resolve_config(config: ModelConfig, engine: Engine) -> ModelConfig:
    """Fill in and check ``max_batch_size``, inputs and outputs against the engine.

    Raises:
        ConfigError: the config contradicts the engine (names, types, dims, batch size vs profiles).
    """
    specs: list[TensorSpec] = [*engine.inputs, *engine.outputs]
    dynamic_batch = all(s.shape and s.shape[0] < 0 for s in specs)
    profile_max = min(
        (p.ranges[s.name].max[0] for p in engine.profiles for s in engine.inputs if s.name in p.ranges),
        default=0,
    ) if dynamic_batch else 0
    mbs = config.max_batch_size
    if mbs is None:
        mbs = profile_max if dynamic_batch else 0
    elif mbs > 0:
        fixed = next((s for s in specs if not s.shape or s.shape[0] >= 0), None)
        if fixed is not None:
            raise ConfigError(
                f"model '{config.name}': max_batch_size {mbs} but '{fixed.name}' has no dynamic batch "
                f"dimension (shape {format_shape(fixed.shape)})",
                hint="set max_batch_size: 0, or build the model with a dynamic first dimension",
            )
        if mbs > profile_max:
            raise ConfigError(
                f"model '{config.name}': max_batch_size {mbs} exceeds the engine's largest profile batch {profile_max}",
                hint=f"set max_batch_size <= {profile_max}, or rebuild with --max-shapes for batch {mbs}",
            )
    if config.dynamic_batching is not None and mbs == 0:
        raise ConfigError(f"model '{config.name}': dynamic_batching needs max_batch_size >= 1")
    for size in config.dynamic_batching.preferred_batch_size if config.dynamic_batching else ():
        if size > mbs:
            raise ConfigError(f"model '{config.name}': preferred_batch_size {size} exceeds max_batch_size {mbs}")

    sequence = config.sequence_batching
    hidden = set(sequence.hidden_inputs + sequence.hidden_outputs) if sequence else set()
    if sequence is not None:
        check_sequence_io(config.replace(max_batch_size=mbs), engine.inputs, engine.outputs)

    def derived(items: tuple[TensorSpec, ...]) -> list[TensorConfig]:  # the batcher's controls and states left out
        return [TensorConfig(s.name, s.dtype, tuple(s.shape[1:] if mbs else s.shape)) for s in items
                if s.name not in hidden]

    inputs = _tensors_from_engine(config.input, derived(engine.inputs), "input", config.name)
    outputs = _tensors_from_engine(config.output, derived(engine.outputs), "output", config.name)
    return config.replace(max_batch_size=mbs, input=inputs, output=outputs, backend=engine.manifest.backend)


_ACCEPTED_SIGNATURES = 1024
"""Input signatures a model remembers as valid (forgotten all at once past this many)."""


class ServedModel:
    """A loaded, warmed-up model version. Create with :meth:`load`, then :meth:`start` on the loop."""

    def __init__(
        self, version: int, config: ModelConfig, engine: Engine, instances: InstanceGroup,
        engines: DeviceEngines | None = None,
    ) -> None:
        self.version = version
        self.config = config
        self.engine = engine
        self.engines = engines or DeviceEngines(engine)
        """The engine on each GPU the instances use (``engine`` is the first of them)."""
        self.instances = instances
        self.stats = ModelStats()
        self.load_seconds = 0.0
        self.platform = f"streamrt_{engine.manifest.backend}"
        self.batched = bool(config.max_batch_size)
        self._inputs = {t.name: t for t in config.input}
        self._outputs = [t.name for t in config.output]
        self._all_outputs = tuple(RequestedOutput(n) for n in self._outputs)
        self._reshaped_in = {t.name: t.reshape for t in config.input if t.reshape is not None}
        self._reshaped_out = {t.name: t.dims for t in config.output if t.reshape is not None}
        self.labels: dict[str, list[str]] = {}
        self._scheduler: ModelScheduler | SequenceScheduler | None = None
        self._limiter: RateLimiter | None = None
        self._budget: tuple[MemoryBudget, str] | None = None
        self._accepted: dict[tuple[tuple[str, str, tuple[int, ...]], ...], int] = {}
        """Input signatures (name, dtype, shape of each input, in order) validate accepted, with
        their rows: the checks depend on nothing else, so a signature seen before skips them."""

    @property
    def name(self) -> str:
        return self.config.name

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
        need, device = _load_estimate(model_dir, version, config)
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
        offenders = probe_batch_outputs(run, self._outputs + states, probe_sizes(mbs))
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
        """Close instances and engine (after the scheduler stopped, or when loading failed)."""
        self.instances.close(timeout=5.0)
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

    # --- serving ------------------------------------------------------------------------------

    def start(self) -> None:
        """Put the scheduler in front of the instances (call on the event loop): the sequence
        batcher when the config has ``sequence_batching``, else the dynamic batcher."""
        if self.config.sequence_batching is not None:
            self._scheduler = SequenceScheduler(f"{self.name}:{self.version}", self.instances, self.config,
                                                self.stats)
            return
        self._scheduler = ModelScheduler(
            f"{self.name}:{self.version}", self.instances,
            max_batch_size=self.config.max_batch_size or 1,
            batching=self.config.dynamic_batching, stats=self.stats,
        )

    @property
    def pending(self) -> int:
        return self._scheduler.pending if self._scheduler else 0

    def validate(self, inputs: Mapping[str, np.ndarray]) -> int:
        """Check a request's inputs against the model (once: the engine does not check them again);
        return its batch rows.

        Raises:
            UnknownInputError / MissingInputError / DTypeMismatchError / ShapeError: with the model's view.
        """
        signature = tuple((name, array.dtype.str, tuple(array.shape)) for name, array in inputs.items())
        rows = self._accepted.get(signature)
        if rows is not None:
            return rows
        rows = self._validate(inputs)
        if len(self._accepted) >= _ACCEPTED_SIGNATURES:
            self._accepted.clear()
        self._accepted[signature] = rows
        return rows

    def _validate(self, inputs: Mapping[str, np.ndarray]) -> int:
        rows = 1
        shapes = {}
        for name, tensor, array in checked_inputs(inputs, self._inputs, "model", self.name):
            shape = tuple(array.shape)
            check_model_shape(name, tensor, shape, self.config)
            if self.batched:
                rows = shape[0]
            shapes[name] = self._engine_shape(name, shape)
        if self.batched and len({s[0] for s in shapes.values()}) > 1:
            raise ShapeError(f"the inputs of model '{self.name}' disagree on the batch size: "
                             + ", ".join(f"{n} {s[0]}" for n, s in shapes.items()))
        if self.engine.profiles:
            check_shapes(self.engine.profiles, shapes)
        return rows

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

    def _from_engine(self, name: str, array: np.ndarray) -> np.ndarray:
        dims = self._reshaped_out.get(name)
        if dims is None:
            return array
        return array.reshape((array.shape[0], *dims) if self.batched else dims)

    def batching_key(self, inputs: Mapping[str, np.ndarray]) -> Hashable:
        """Requests with equal keys may share a batch: same datatypes and non-batch dims, input by input."""
        return tuple(
            (n, inputs[n].dtype.str, inputs[n].shape[1:] if self.batched else inputs[n].shape) for n in self._inputs
        )

    async def infer(self, request: InferRequest, trace: RequestTrace | None = None) -> InferResponse:
        """Validate, queue, wait for the batch, and shape the response (outputs as requested);
        ``trace`` gets the queue and compute timestamps."""
        if self._scheduler is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not started")
        for out in request.outputs:
            if out.name not in self._outputs:
                raise RequestError(f"unknown output '{out.name}' for model '{self.name}'; "
                                   f"its outputs are: {', '.join(self._outputs)}")
        rows = self.validate(request.inputs)
        if isinstance(self._scheduler, SequenceScheduler):
            outputs = await self._submit_sequence(self._scheduler, request, rows, trace)
        else:
            if request.sequence is not None:
                raise RequestError(
                    f"model '{self.name}' has no sequence_batching, so it keeps no state between requests; "
                    f"the request names sequence {request.sequence.id}",
                    hint="drop sequence_id/sequence_start/sequence_end, or add sequence_batching to the config")
            inputs = self.to_engine(request.inputs)
            if request.outputs_on_device and not self._reshaped_out and not any(o.class_count for o in request.outputs):
                inputs = DeviceOutputs(inputs)
            outputs = await self._scheduler.submit(
                inputs, rows=rows, key=self.batching_key(request.inputs),
                priority=request.priority, timeout_us=request.timeout_us, trace=trace,
            )
        result = {}
        for out in request.outputs or self._all_outputs:
            array = self._from_engine(out.name, outputs[out.name])
            if out.class_count:
                array = top_k_classes(array, out.class_count, self.labels.get(out.name, ()), batched=self.batched)
            result[out.name] = array
        return InferResponse(self.name, str(self.version), request.id, result)

    async def _submit_sequence(
        self, scheduler: SequenceScheduler, request: InferRequest, rows: int, trace: RequestTrace | None
    ) -> dict[str, np.ndarray]:
        """Triton's checks for a stateful model's request, then the sequence batcher."""
        if request.sequence is None:
            raise RequestError(f"inference request to model '{self.name}' must specify a non-zero or non-empty "
                               "correlation ID (it has sequence_batching)",
                               hint="send the request parameter sequence_id (and sequence_start on the first one)")
        if rows != 1:
            raise RequestError(f"inference request to model '{self.name}' must specify batch-size 1 due to "
                               f"requirements of sequence batcher, got {rows}",
                               hint="send one row per request; the batcher batches the sequences")
        return await scheduler.submit(self.to_engine(request.inputs), flags=request.sequence,
                                      key=self.batching_key(request.inputs), trace=trace)

    async def stop(self, timeout: float) -> None:
        """Drain the scheduler (bounded by ``timeout``), then release instances and engine."""
        if self._scheduler is not None:
            await self._scheduler.close(timeout)
        self.engines.close()
        self._forget_memory()

    # --- descriptions -------------------------------------------------------------------------

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The model metadata response (KServe ``$metadata_model_response``)."""
        return model_metadata(self.config, self.platform, versions)

    def triton_config(self) -> Any:
        """The resolved config as Triton's ``inference.ModelConfig`` message."""
        from streamrt.serve.configs.config_message import to_message

        return to_message(self.config, self.platform)


def _model_file(model_dir: Path, version: int, config: ModelConfig) -> Path | None:
    folder = model_dir / str(version)
    names = [config.default_model_filename] if config.default_model_filename else ["model.plan", "model.onnx"]
    return next((folder / n for n in names if (folder / n).is_file()), None)


def _load_estimate(model_dir: Path, version: int, config: ModelConfig) -> tuple[int, str]:
    """``(bytes, device kind)`` a load needs at least, before loading: the model file's size and the
    device its plan (or the build settings of an ONNX model) targets."""
    path = _model_file(model_dir, version, config)
    if path is None:
        return 0, "cpu"  # nothing to estimate (an injected loader, or the load will say what is missing)
    device = "cuda" if cuda_available() else "cpu"  # when the file does not say: measure if there is a GPU
    try:
        if path.suffix == ".onnx":
            from streamrt.backends import get_backend

            device = str(get_backend(config.build.backend).target_device(config.build).get("kind", "cpu"))
        else:
            from streamrt.plan import read_manifest

            device = str(read_manifest(path).device.get("kind", "cpu"))
    except Exception:  # the load itself reports an unusable file; the measurement after it still applies
        log.debug("model '%s': no device known before loading %s", config.name, path, exc_info=True)
    return path.stat().st_size, device


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
