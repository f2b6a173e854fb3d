"""Frozen configuration of the model server: one dataclass per concern, loaded from YAML/JSON.

A model's config is Triton's ``ModelConfig``: every format (``config.pbtxt``, YAML, JSON, a load
request's override) is read through Triton's own schema in :mod:`.triton_config` and mapped onto
these dataclasses by :mod:`.config_message`; a field StreamRT does not implement refuses the
load. Every value is checked on load; messages name the model, the field, the bad value and
what is allowed.

Example:
    >>> from streamrt.serve.configs.config_message import from_mapping
    >>> cfg = from_mapping({"max_batch_size": 8, "dynamic_batching": {
    ...     "max_queue_delay_microseconds": 500}}, name="cnn")
    >>> cfg.dynamic_batching.max_queue_delay_microseconds
    500
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.serve.configs.ensemble_config import EnsembleConfig
from streamrt.types import DType

__all__ = [
    "CONFIG_FILES",
    "BatchingConfig",
    "InstanceGroupConfig",
    "ModelConfig",
    "QueuePolicy",
    "RateLimiterConfig",
    "RateLimiterResource",
    "SequenceBatchingConfig",
    "SequenceControl",
    "SequenceState",
    "ServerConfig",
    "TensorConfig",
    "VersionPolicy",
    "WarmupConfig",
    "parse_rate_limit_resource",
]

CONFIG_FILES = ("config.yaml", "config.yml", "config.json", "config.pbtxt")
"""File names a model directory's config may have, in the order they are looked for."""

INSTANCE_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU")

RATE_LIMIT_MODES = ("off", "execution_count")
"""Values of ``--rate-limit`` (Triton's)."""


def _at_least(value: int, name: str, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def datatype(value: Any, where: str = "") -> DType:
    """``TYPE_FP32``, ``FP32``, ``float32`` or a DType -> DType (Triton's config names accepted)."""
    text = value if isinstance(value, DType) else str(value)
    if isinstance(text, str) and text.upper().startswith("TYPE_"):
        text = text[5:]
    if isinstance(text, str) and text.upper() == "STRING":
        text = "BYTES"
    try:
        return DType.from_any(text)
    except ConfigError:
        supported = ", ".join("TYPE_STRING" if d is DType.BYTES else f"TYPE_{d.kserve}" for d in DType)
        raise ConfigError(f"{where + ': ' if where else ''}unsupported data_type {value!r}; supported: {supported}") \
            from None


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: name, element type and dims *without* the batch dimension (-1 = any).

    ``reshape`` is the shape inside the model when it differs from ``dims`` (Triton's
    ``reshape``: batch dim excluded; ``()`` for one scalar per batch row); ``format`` is an
    input's image layout (``FORMAT_NCHW``/``FORMAT_NHWC``), reported to clients; an output's
    ``label_filename`` names the file of class labels the classification extension uses.
    """

    name: str
    data_type: DType
    dims: tuple[int, ...]
    format: str = "FORMAT_NONE"
    reshape: tuple[int, ...] | None = None
    label_filename: str = ""

    def __post_init__(self) -> None:
        if not all(d == -1 or d >= 1 for d in self.dims):
            raise ConfigError(f"dims of '{self.name}' must be >= 1 or -1, got {self.dims}")
        if self.format != "FORMAT_NONE" and len(self.dims) != 3:
            raise ConfigError(f"'{self.name}' has {self.format}, which needs 3 dims (CHW or HWC), got {self.dims}")
        if self.reshape is not None:
            if not all(d == -1 or d >= 1 for d in self.reshape):
                raise ConfigError(f"reshape of '{self.name}' must be >= 1 or -1, got {self.reshape}")
            fixed = -1 not in self.dims and -1 not in self.reshape
            if fixed and _count(self.dims) != _count(self.reshape):
                raise ConfigError(f"reshape {list(self.reshape)} of '{self.name}' has {_count(self.reshape)} "
                                  f"elements but dims {list(self.dims)} have {_count(self.dims)}")

    @property
    def model_dims(self) -> tuple[int, ...]:
        """The dims the engine sees (``reshape`` when given)."""
        return self.dims if self.reshape is None else self.reshape


def _count(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy``: queue bound and per-request timeout (0 = none).

    ``allow_timeout_override`` lets a request's ``timeout`` parameter replace the default.
    """

    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        _at_least(self.default_timeout_microseconds, "default_timeout_microseconds", 0)
        _at_least(self.max_queue_size, "max_queue_size", 0)


@dataclass(frozen=True)
class BatchingConfig:
    """Triton's ``dynamic_batching``: how requests are combined into one engine execution.

    Attributes:
        max_queue_delay_microseconds: how long the oldest request of a batch that is neither full
            nor a preferred size may wait for more (0: run what is there as soon as an instance
            is free).
        preferred_batch_size: sizes that run at once when they can be formed.
        preserve_ordering: accepted for compatibility; every request gets its own response anyway.
        priority_levels: number of priority levels (0 or 1: one level); 1 is the highest.
        default_priority_level: level of requests that give none (0: the lowest level).
        default_queue_policy: queue bound and timeouts.
    """

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)

    def __post_init__(self) -> None:
        _at_least(self.max_queue_delay_microseconds, "max_queue_delay_microseconds", 0)
        for size in self.preferred_batch_size:
            _at_least(size, "preferred_batch_size", 1)
        _at_least(self.priority_levels, "priority_levels", 0)
        _at_least(self.default_priority_level, "default_priority_level", 0)
        levels, default = self.priority_levels, self.default_priority_level
        if levels and not 1 <= default <= levels:
            raise ConfigError(f"default_priority_level must be in 1..{levels}, got {default}")


def parse_rate_limit_resource(spec: str) -> tuple[str, int, int | None]:
    """``NAME:COUNT[:DEVICE]`` (tritonserver's ``--rate-limit-resource``) as ``(name, count, device)``.

    Raises:
        ConfigError: not of that form, or a negative count or device.
    """
    parts = spec.split(":")
    hint = "--rate-limit-resource NAME:COUNT or NAME:COUNT:DEVICE, e.g. R1:4 or R1:4:0"
    if len(parts) not in (2, 3) or not parts[0]:
        raise ConfigError(f"rate limit resource must be NAME:COUNT[:DEVICE], got {spec!r}", hint=hint)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ConfigError(f"rate limit resource {spec!r}: COUNT and DEVICE must be integers", hint=hint) from None
    if count < 0 or (device is not None and device < 0):
        raise ConfigError(f"rate limit resource {spec!r}: COUNT and DEVICE must be >= 0", hint=hint)
    return parts[0], count, device


@dataclass(frozen=True)
class RateLimiterResource:
    """One resource an instance needs to execute (Triton's ``rate_limiter.resources[]``).

    ``is_global`` is Triton's ``global``: one pool for the whole server instead of one per device.
    """

    name: str
    count: int = 1
    is_global: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("rate_limiter resources need a name")
        _at_least(self.count, f"rate_limiter resource '{self.name}' count", 0)


@dataclass(frozen=True)
class RateLimiterConfig:
    """Triton's ``instance_group.rate_limiter``: resources held while executing, and a priority weight.

    ``priority`` weights scheduling chances across instances when several wait: an instance of
    priority 2 gets half the chances of one of priority 1 (0 counts as 1). Used only when the
    server runs with ``--rate-limit execution_count``.
    """

    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 0

    def __post_init__(self) -> None:
        _at_least(self.priority, "rate_limiter priority", 0)
        names = [r.name for r in self.resources]
        if len(set(names)) != len(names):
            raise ConfigError(f"rate_limiter lists a resource twice: {names}")
# --- sequence batching (stateful models) -----------------------------------------------------

CONTROL_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END",
                 "CONTROL_SEQUENCE_CORRID")
"""Triton's control kinds: the tensor the sequence batcher fills per batch row."""

_CORRID_TYPES = (DType.INT32, DType.INT64, DType.UINT32, DType.UINT64, DType.BYTES)


@dataclass(frozen=True)
class SequenceControl:
    """One control input: the model input ``name`` that the batcher fills with ``kind``'s value.

    START, READY and END carry ``false_true`` (the values for false and true, in ``data_type``:
    Triton's ``int32_false_true`` / ``fp32_false_true`` / ``bool_false_true``); CORRID carries the
    sequence id in ``data_type`` (INT32, INT64, UINT32, UINT64 or BYTES for string ids). Each
    control tensor has one element per batch row (shape ``[rows, 1]``, or ``[1]`` unbatched).
    """

    name: str
    kind: str
    data_type: DType
    false_true: tuple[Any, Any] = (0, 1)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("control_input needs a name")
        if self.kind not in CONTROL_KINDS:
            raise ConfigError(f"control '{self.name}': kind must be one of {', '.join(CONTROL_KINDS)}, "
                              f"got {self.kind!r}")
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if self.data_type not in _CORRID_TYPES:
                raise ConfigError(f"control '{self.name}': CONTROL_SEQUENCE_CORRID needs data_type TYPE_INT32, "
                                  "TYPE_INT64, TYPE_UINT32, TYPE_UINT64 or TYPE_STRING, "
                                  f"got TYPE_{self.data_type.kserve}")
        elif len(self.false_true) != 2:
            raise ConfigError(f"control '{self.name}': {self.kind} needs exactly two false_true values "
                              f"(false, true), got {list(self.false_true)}")


@dataclass(frozen=True)
class SequenceState:
    """An implicit state: fed to the model as ``input_name``, replaced by its ``output_name``
    after each step of a sequence, started from zeros of ``initial_dims`` (Triton's
    ``initial_state { zero_data: true dims: [...] }``; ``dims`` when not given) at START.

    ``dims`` exclude the batch dimension; -1 needs ``initial_dims``.
    """

    input_name: str
    output_name: str
    data_type: DType
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.input_name or not self.output_name:
            raise ConfigError("a state needs input_name and output_name")
        if not all(d == -1 or d >= 1 for d in self.dims):
            raise ConfigError(f"state '{self.input_name}': dims must be >= 1 or -1, got {list(self.dims)}")
        start = self.start_dims
        if any(d < 1 for d in start):
            raise ConfigError(f"state '{self.input_name}': dims {list(self.dims)} have a variable size; give "
                              "initial_state { zero_data: true dims: [...] } with concrete dims")
        if len(start) != len(self.dims) or any(d not in (-1, s) for s, d in zip(start, self.dims, strict=True)):
            raise ConfigError(f"state '{self.input_name}': initial_state dims {list(start)} do not match "
                              f"the state dims {list(self.dims)}")

    @property
    def start_dims(self) -> tuple[int, ...]:
        """The dims of the state a sequence starts from (batch dimension excluded)."""
        return self.initial_dims if self.initial_dims is not None else self.dims


@dataclass(frozen=True)
class SequenceBatchingConfig:
    """Triton's ``sequence_batching``: requests of one sequence (``sequence_id``) go, in order,
    to the same batch slot of one instance, with control inputs and implicit state per slot.

    Attributes:
        strategy: ``direct`` (a sequence owns one slot = one batch row of one instance until its
            END) or ``oldest`` (dynamic batching among up to ``max_candidate_sequences`` sequences
            per instance, oldest request first, one request per sequence per batch).
        max_sequence_idle_microseconds: a sequence that receives nothing for this long is ended
            and its slot and state released (Triton's default: 1 s).
        max_queue_delay_microseconds: how long a batch that is not full (direct: below
            ``minimum_slot_utilization``; oldest: not a preferred size) waits for more requests.
        minimum_slot_utilization: direct: the fraction of an instance's slots with a request that
            runs a batch without waiting for the delay.
        max_candidate_sequences: oldest: sequences bound to each instance (0: max_batch_size).
        preferred_batch_size: oldest: sizes that run at once (empty: max_batch_size).
        preserve_ordering: oldest: accepted; every request gets its own response anyway.
        controls: the control inputs.
        states: the implicit states.
    """

    strategy: str = "direct"
    max_sequence_idle_microseconds: int = 1_000_000
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    controls: tuple[SequenceControl, ...] = ()
    states: tuple[SequenceState, ...] = ()

    def __post_init__(self) -> None:
        if self.strategy not in ("direct", "oldest"):
            raise ConfigError(f"sequence_batching strategy must be direct or oldest, got {self.strategy!r}")
        _at_least(self.max_sequence_idle_microseconds, "max_sequence_idle_microseconds", 1)
        _at_least(self.max_queue_delay_microseconds, "max_queue_delay_microseconds", 0)
        _at_least(self.max_candidate_sequences, "max_candidate_sequences", 0)
        for size in self.preferred_batch_size:
            _at_least(size, "preferred_batch_size", 1)
        if not 0.0 <= self.minimum_slot_utilization <= 1.0:
            raise ConfigError(f"minimum_slot_utilization must be in 0..1, got {self.minimum_slot_utilization}")
        names = [c.name for c in self.controls] + [s.input_name for s in self.states]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"sequence_batching: inputs {twice} are given more than one control or state")
        kinds = [c.kind for c in self.controls]
        again = sorted({k for k in kinds if kinds.count(k) > 1})
        if again:
            raise ConfigError(f"sequence_batching: control kind {again[0]} is given twice")
        outs = [s.output_name for s in self.states]
        if len(set(outs)) != len(outs):
            raise ConfigError(f"sequence_batching: state outputs {outs} repeat a name")

    @property
    def hidden_inputs(self) -> tuple[str, ...]:
        """Model inputs the batcher fills (controls and states): clients never send them."""
        return tuple(c.name for c in self.controls) + tuple(s.input_name for s in self.states)

    @property
    def hidden_outputs(self) -> tuple[str, ...]:
        """Model outputs the batcher keeps as the next state: clients never receive them."""
        return tuple(s.output_name for s in self.states)


@dataclass(frozen=True)
class InstanceGroupConfig:
    """``count`` instances, each with its own execution context, stream and worker thread.

    ``kind`` takes Triton's ``KIND_CPU`` or the short ``cpu``. ``rate_limiter`` is what the
    group's instances need from the server's rate limiter (None: no resources, priority 1).
    """

    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()
    rate_limiter: RateLimiterConfig | None = None

    def __post_init__(self) -> None:
        _at_least(self.count, "count", 1)
        kind = self.kind.upper() if self.kind.upper().startswith("KIND_") else f"KIND_{self.kind.upper()}"
        kind = "KIND_AUTO" if kind == "KIND_MODEL" else kind  # the backend decides: StreamRT's auto
        if kind not in INSTANCE_KINDS:
            raise ConfigError(f"kind must be one of {', '.join(INSTANCE_KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "kind", kind)
        for gpu in self.gpus:
            _at_least(gpu, "gpus", 0)


@dataclass(frozen=True)
class WarmupConfig:
    """Triton's ``model_warmup``: ``count`` runs of ``batch_size`` samples on every instance.

    ``inputs`` maps an input name to ``{"dims": [...], "zero_data": true}`` or ``random_data``;
    inputs not named use the model's dims (a -1 dim takes the engine profile's opt value).
    """

    name: str = "warmup"
    batch_size: int = 1
    count: int = 1
    inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _at_least(self.batch_size, "batch_size", 1)
        _at_least(self.count, "count", 1)


@dataclass(frozen=True)
class VersionPolicy:
    """Which numeric version directories are served: ``latest`` N, ``all``, or ``specific``.

    In a config file it is Triton's one-key form: ``{latest: {num_versions: 2}}``, ``{all: {}}``
    or ``{specific: {versions: [1, 3]}}``.
    """

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _at_least(self.num_versions, "num_versions", 1)
        for version in self.versions:
            _at_least(version, "versions", 1)
        if self.kind == "specific" and not self.versions:
            raise ConfigError("specific needs at least one version")

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of ``available`` (ascending)."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :]


@dataclass(frozen=True)
class ModelConfig:
    """One model of the repository: the part of Triton's ``ModelConfig`` StreamRT implements.

    Read from any config format through Triton's own schema with
    :func:`streamrt.serve.configs.config_message.read_config_file` or ``from_mapping``; fields StreamRT
    does not implement refuse the load there, so what is here is what runs.

    Attributes:
        name: model name (defaults to the directory name).
        backend: backend that builds an ONNX ``model.onnx`` on load; a plan names its own.
        platform: Triton's ``platform`` as the config gave it (echoed in the config reply).
        max_batch_size: > 0: the first dim of every tensor is the batch dim; 0: no batching;
            None: derived from the engine's shape profiles.
        input: expected inputs (dims without batch); empty: taken from the engine.
        output: outputs; empty: taken from the engine.
        dynamic_batching: the dynamic batcher; None: every request runs on its own.
        sequence_batching: the sequence batcher (stateful models); excludes dynamic_batching.
        instance_group: instances that run the model concurrently.
        version_policy: which version directories are served.
        model_warmup: warm-up runs before READY; None: one run at batch 1 and one at
            max_batch_size on every instance; ``[]``: none.
        default_model_filename: file inside a version directory (default model.plan, else model.onnx).
        build: BuildConfig fields used to build an ONNX model on load (through the build cache).
        parameters: free-form string parameters, reported back in the config.
        ensemble_scheduling: the steps of an ensemble (``platform: "ensemble"``); None otherwise.
    """

    name: str
    backend: str = "onnxruntime"
    platform: str = ""
    max_batch_size: int | None = None
    input: tuple[TensorConfig, ...] = ()
    output: tuple[TensorConfig, ...] = ()
    dynamic_batching: BatchingConfig | None = None
    sequence_batching: SequenceBatchingConfig | None = None
    instance_group: tuple[InstanceGroupConfig, ...] = (InstanceGroupConfig(),)
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    model_warmup: tuple[WarmupConfig, ...] | None = None
    default_model_filename: str = ""
    build: BuildConfig = field(default_factory=BuildConfig)
    parameters: Mapping[str, str] = field(default_factory=dict)
    ensemble_scheduling: EnsembleConfig | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size is not None:
            _at_least(self.max_batch_size, "max_batch_size", 0)
        if self.dynamic_batching is not None and self.sequence_batching is not None:
            raise ConfigError(f"model '{self.name}': dynamic_batching and sequence_batching exclude each other",
                              hint="a stateful model takes sequence_batching only")

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.instance_group)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


#: What ``--grpc-server`` takes: grpcio's asyncio server (the default) or h2corn (listeners/grpc_h2corn.py).
GRPC_SERVERS = ("grpcio", "h2corn")
#: What ``--http-server`` takes: aiohttp (the default) or h2corn (listeners/http_h2corn.py).
HTTP_SERVERS = ("aiohttp", "h2corn")


def _check_server(what: str, flag: str, name: str, choices: tuple[str, ...]) -> None:
    """Refuse an unknown ``--grpc-server`` / ``--http-server``, or h2corn where it is not installed (one line
    with the pip command)."""
    if name not in choices:
        raise ConfigError(f"unknown {what} server {name!r}", hint=f"{flag} {' or '.join(choices)}")
    if name == "h2corn" and importlib.util.find_spec("h2corn") is None:
        raise ConfigError(f"{flag} h2corn needs the h2corn package, which is not installed",
                          hint="pip install 'streamrt[fast-grpc]' (or: pip install h2corn)")


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens, authenticates, limits requests and shuts down.

    Attributes:
        host: address every front end binds to (loopback by default).
        http_port / grpc_port / metrics_port: ports (0 picks a free one); None disables that front end.
        auth_token: when set, every request except health checks and metrics needs
            ``Authorization: Bearer <token>`` (HTTP header or gRPC metadata).
        max_request_bytes: largest accepted HTTP request body (default 2 GiB - 1, gRPC's limit:
            Triton 2.51 answers binary tensors of any size on HTTP; 413 above it).
        grpc_max_message_bytes: largest accepted gRPC message (default 2 GiB - 1, Triton's
            ``MAX_GRPC_MESSAGE_SIZE`` and gRPC's own ceiling; RESOURCE_EXHAUSTED above it).
        max_tensor_elements: largest element count of one input tensor (default 2^31 - 1: no
            tensor a message may carry is refused for its count, as in Triton).
        exit_timeout_s: how long shutdown waits for in-flight requests (Triton's default 30 s).
        strict_readiness: /v2/health/ready needs every model READY (else: the server is up).
        model_control: allow load/unload through the repository API.
        startup_models: models loaded at start (None: every model in the repository).
        load_threads: models loaded in parallel at start.
        trace_file: append a JSON line per traced request here (Triton's trace timestamps, see
            :mod:`streamrt.serve.observability.tracing`); None: no tracing.
        trace_rate: trace one request in this many (1: every request).
        trace_otlp_url: send each traced request as OpenTelemetry spans to this OTLP/HTTP endpoint
            (``http://collector:4318/v1/traces``, :mod:`streamrt.serve.observability.otel`); None: no spans.
        rate_limit: ``"off"`` (Triton's default) or ``"execution_count"``: instances acquire their
            ``rate_limiter`` resources before each execution, granted by priority
            (:mod:`streamrt.serve.execution.rate_limiter`).
        rate_limit_resources: ``--rate-limit-resource`` values, ``NAME:COUNT[:DEVICE]``.
        gpu_memory_budget_mb: GPU memory the loaded models may take together (MiB); a model that
            would exceed it, or the GPU's free memory, is refused at load (None: free memory only).
        frontend_processes: HTTP/gRPC front-end processes (1: the front ends run in the engine
            process; N > 1: N worker processes share the ports, see docs/serving-frontends.md).
        frontend_arena_bytes: shared memory per front-end process for tensors in flight (address
            space: the memory used is the peak of tensors in flight; beyond it requests still work,
            their tensors travelling through the channel: slower).
        grpc_server: who serves gRPC (the engine process, or each front-end process): ``grpcio`` (its
            asyncio server) or ``h2corn`` (a Rust HTTP/2 server, the ``fast-grpc`` extra: a quarter of
            grpcio's CPU per request; :mod:`streamrt.serve.listeners.grpc_h2corn`).
        http_server: who serves HTTP/REST: ``aiohttp`` (the default) or ``h2corn`` (the inference route
            served natively, every other route forwarded to the aiohttp app;
            :mod:`streamrt.serve.listeners.http_h2corn`).
        grpc_threads: h2corn's Tokio threads, shared by its gRPC and HTTP servers (0: one on a machine of
            2 CPUs or fewer, else h2corn's default, 2); only when ``grpc_server`` or ``http_server`` is
            ``h2corn`` (grpcio's core sizes its own pollers).
        engine_cpus: the CPUs the engine process runs on (every thread, those of its model pools
            included), the front-end processes on the other usable CPUs (:mod:`streamrt.device.cpus`;
            Triton's ``--host-policy cpu-cores``), from start to stop (a :class:`ServerThread` pins the
            whole process it runs in, and gives its threads their CPUs back at stop); None: the kernel places
            every process.
    """

    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    auth_token: str | None = None
    max_request_bytes: int = 2**31 - 1
    grpc_max_message_bytes: int = 2**31 - 1
    max_tensor_elements: int = 2**31 - 1
    exit_timeout_s: float = 30.0
    strict_readiness: bool = True
    model_control: bool = True
    startup_models: tuple[str, ...] | None = None
    load_threads: int = 2
    trace_file: str | None = None
    trace_rate: int = 1
    trace_otlp_url: str | None = None
    rate_limit: str = "off"
    rate_limit_resources: tuple[str, ...] = ()
    gpu_memory_budget_mb: float | None = None
    frontend_processes: int = 1
    frontend_arena_bytes: int = 2**30
    grpc_server: str = "grpcio"
    http_server: str = "aiohttp"
    grpc_threads: int = 0
    engine_cpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self._check_sharing()
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be in 0..65535 (0: any free port), got {port}")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"max_request_bytes must be an integer >= 1024, got {self.max_request_bytes}")
        if not 1024 <= self.grpc_max_message_bytes <= 2**31 - 1:
            raise ConfigError(f"grpc_max_message_bytes must be in 1024..{2**31 - 1} (gRPC's limit), "
                              f"got {self.grpc_max_message_bytes}")
        if self.max_tensor_elements < 1:
            raise ConfigError(f"max_tensor_elements must be an integer >= 1, got {self.max_tensor_elements}")
        if self.exit_timeout_s < 0:
            raise ConfigError(f"exit_timeout_s must be >= 0, got {self.exit_timeout_s}")
        if self.load_threads < 1:
            raise ConfigError(f"load_threads must be an integer >= 1, got {self.load_threads}")
        if self.trace_rate < 1:
            raise ConfigError(f"trace_rate must be an integer >= 1, got {self.trace_rate}",
                              hint="--trace-rate 1 traces every request")
        if self.trace_otlp_url is not None and not self.trace_otlp_url.startswith(("http://", "https://")):
            raise ConfigError(f"trace_otlp_url must be an http(s) URL, got {self.trace_otlp_url!r}",
                              hint="--trace-otlp-url http://localhost:4318/v1/traces (OTLP over HTTP)")
        if self.frontend_processes < 1:
            raise ConfigError(f"frontend_processes must be an integer >= 1, got {self.frontend_processes}")
        _check_server("gRPC", "--grpc-server", self.grpc_server, GRPC_SERVERS)
        _check_server("HTTP", "--http-server", self.http_server, HTTP_SERVERS)
        if self.grpc_threads < 0:
            raise ConfigError(f"grpc_threads must be an integer >= 0 (0: the server's default), "
                              f"got {self.grpc_threads}")
        if self.grpc_threads and "h2corn" not in (self.grpc_server, self.http_server):
            raise ConfigError(f"grpc_threads sets h2corn's Tokio threads; neither gRPC nor HTTP is served by h2corn "
                              f"({self.grpc_server}, {self.http_server})",
                              hint="add --grpc-server h2corn or --http-server h2corn, or drop --grpc-threads")
        if self.engine_cpus is not None:
            cpus = tuple(sorted(set(self.engine_cpus)))
            if not cpus or any(not isinstance(c, int) or c < 0 for c in cpus):
                raise ConfigError(f"engine_cpus must be CPU numbers >= 0, got {self.engine_cpus!r}",
                                  hint="--engine-cpus 0-1 (the kernel's CPU-list syntax)")
            object.__setattr__(self, "engine_cpus", cpus)
        if self.frontend_arena_bytes < 2**20:
            raise ConfigError(f"frontend_arena_bytes must be >= 1 MiB, got {self.frontend_arena_bytes}")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ConfigError("auth_token must not be empty", hint="omit it to disable authentication")
        if self.startup_models is not None:
            object.__setattr__(self, "startup_models", tuple(self.startup_models))

    def _check_sharing(self) -> None:
        """The GPU-sharing settings (rate limiter, memory budget)."""
        if self.rate_limit not in RATE_LIMIT_MODES:
            raise ConfigError(f"rate_limit must be one of {', '.join(RATE_LIMIT_MODES)}, got {self.rate_limit!r}",
                              hint="--rate-limit execution_count")
        object.__setattr__(self, "rate_limit_resources", tuple(self.rate_limit_resources))
        for spec in self.rate_limit_resources:
            parse_rate_limit_resource(spec)
        if self.gpu_memory_budget_mb is not None and not self.gpu_memory_budget_mb > 0:
            raise ConfigError(f"gpu_memory_budget_mb must be > 0, got {self.gpu_memory_budget_mb}",
                              hint="leave --gpu-memory-budget-mb out to check against free memory only")

    def replace(self, **changes: Any) -> ServerConfig:
        return dataclasses.replace(self, **changes)
