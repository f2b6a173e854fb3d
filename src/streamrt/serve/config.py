"""Frozen configuration of the model server: one dataclass per concern, loaded from YAML/JSON.

A model's config uses Triton's field names (``max_batch_size``, ``input``, ``dynamic_batching``,
``instance_group``, ``model_warmup``, ``version_policy``), so a ``config.pbtxt`` written for
Triton also loads (fields StreamRT has no use for are ignored with a warning). Every value is
checked on load; messages name the model, the field, the bad value and what is allowed.

Example:
    >>> cfg = ModelConfig.from_dict({"max_batch_size": 8, "dynamic_batching": {
    ...     "max_queue_delay_microseconds": 500}}, name="cnn")
    >>> cfg.dynamic_batching.max_queue_delay_microseconds
    500
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt import _configio
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.types import DType

__all__ = [
    "CONFIG_FILES",
    "BatchingConfig",
    "InstanceGroupConfig",
    "ModelConfig",
    "QueuePolicy",
    "ServerConfig",
    "TensorConfig",
    "VersionPolicy",
    "WarmupConfig",
]

log = logging.getLogger(__name__)

CONFIG_FILES = ("config.yaml", "config.yml", "config.json", "config.pbtxt")
"""File names a model directory's config may have, in the order they are looked for."""

INSTANCE_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU")


def _at_least(value: int, name: str, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def datatype(value: Any, where: str = "") -> DType:
    """``TYPE_FP32``, ``FP32``, ``float32`` or a DType -> DType (Triton's config names accepted)."""
    text = value if isinstance(value, DType) else str(value)
    if isinstance(text, str) and text.upper().startswith("TYPE_"):
        text = text[5:]
    try:
        return DType.from_any(text)
    except ConfigError:
        supported = ", ".join(f"TYPE_{d.kserve}" for d in DType)
        raise ConfigError(f"{where + ': ' if where else ''}unsupported data_type {value!r}; supported: {supported}") \
            from None


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: name, element type and dims *without* the batch dimension (-1 = any)."""

    name: str
    data_type: DType
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        if not all(d == -1 or d >= 1 for d in self.dims):
            raise ConfigError(f"dims of '{self.name}' must be >= 1 or -1, got {self.dims}")


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


@dataclass(frozen=True)
class InstanceGroupConfig:
    """``count`` instances, each with its own execution context, stream and worker thread.

    ``kind`` takes Triton's ``KIND_CPU`` or the short ``cpu``.
    """

    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _at_least(self.count, "count", 1)
        kind = self.kind.upper() if self.kind.upper().startswith("KIND_") else f"KIND_{self.kind.upper()}"
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


# Triton fields StreamRT accepts in a config and ignores (with a warning when they are set).
_IGNORED_MODEL_FIELDS = (
    "platform", "runtime", "optimization", "batch_input", "batch_output", "cc_model_filenames",
    "metric_tags", "model_operations", "model_transaction_policy", "model_repository_agents",
    "response_cache", "model_metrics", "sequence_batching", "ensemble_scheduling",
)


@dataclass(frozen=True)
class ModelConfig:
    """One model of the repository (Triton's ``ModelConfig`` fields StreamRT implements).

    Attributes:
        name: model name (defaults to the directory name).
        backend: backend that builds an ONNX ``model.onnx`` on load; a plan names its own.
        max_batch_size: > 0: the first dim of every tensor is the batch dim; 0: no batching;
            None: derived from the engine's shape profiles.
        input: expected inputs (dims without batch); empty: taken from the engine.
        output: outputs; empty: taken from the engine.
        dynamic_batching: the dynamic batcher; None: every request runs on its own.
        instance_group: instances that run the model concurrently.
        version_policy: which version directories are served.
        model_warmup: warm-up runs before READY; None: one run at batch 1 and one at
            max_batch_size on every instance; ``[]``: none.
        default_model_filename: file inside a version directory (default model.plan, else model.onnx).
        build: BuildConfig fields used to build an ONNX model on load (through the build cache).
        parameters: free-form string parameters, reported back in the config.
    """

    name: str
    backend: str = "onnxruntime"
    max_batch_size: int | None = None
    input: tuple[TensorConfig, ...] = ()
    output: tuple[TensorConfig, ...] = ()
    dynamic_batching: BatchingConfig | None = None
    instance_group: tuple[InstanceGroupConfig, ...] = (InstanceGroupConfig(),)
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    model_warmup: tuple[WarmupConfig, ...] | None = None
    default_model_filename: str = ""
    build: BuildConfig = field(default_factory=BuildConfig)
    parameters: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_batch_size is not None:
            _at_least(self.max_batch_size, "max_batch_size", 0)

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.instance_group)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
        """Validate a mapping (YAML/JSON/pbtxt) and build the config; ``name`` is the directory name."""
        model = str(name or data.get("name") or "") if isinstance(data, Mapping) else ""
        if not model:
            raise ConfigError("model config: a model needs a name")
        where = f"model '{model}'"
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
        ignored = [k for k in _IGNORED_MODEL_FIELDS if data.get(k) not in (None, "", {}, [])]
        if ignored:
            log.warning("%s: ignoring config fields StreamRT does not implement: %s", where, ", ".join(ignored))
        if name and data.get("name") and data["name"] != name:
            raise ConfigError(f"{where}: config name '{data['name']}' differs from its directory '{name}'")
        return _configio.structure(_from_triton(data, model), cls, where)

    @classmethod
    def from_file(cls, path: str | Path, *, name: str | None = None) -> ModelConfig:
        """Read ``config.yaml``/``.yml``/``.json`` or a Triton ``config.pbtxt``."""
        return cls.from_dict(read_config_file(Path(path)), name=name)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_triton(self, platform: str) -> dict[str, Any]:
        """The config as Triton's JSON (proto field names, defaults printed), for ``/config``."""
        d = _triton.unstructure(self)
        del d["build"]
        if d["dynamic_batching"] is None:
            del d["dynamic_batching"]
        for t in d["input"]:
            t.update(format="FORMAT_NONE", optional=False)
        for i, group in enumerate(d["instance_group"]):
            group["name"] = f"{self.name}_{i}"
        d.update(
            platform=platform,
            max_batch_size=self.max_batch_size or 0,
            parameters={k: {"string_value": v} for k, v in self.parameters.items()},
            model_warmup=[{**w, "inputs": {}} for w in d["model_warmup"] or ()],
        )
        return d


# --- Triton's config layout <-> the dataclasses (registered on the shared converter) -----------


def _from_triton(data: Mapping[str, Any], model: str) -> dict[str, Any]:
    """Triton's top-level spellings as this module's fields: defaults for empty values, the
    backend shared with ``build``, ``parameters`` values unwrapped from ``{string_value: ...}``."""
    out = {k: v for k, v in data.items() if k not in _IGNORED_MODEL_FIELDS}
    out["name"] = model
    for key in ("instance_group", "version_policy", "default_model_filename", "parameters", "build"):
        if not out.get(key):
            out.pop(key, None)
    build = out.get("build")
    backend = out.get("backend") or (build.get("backend") if isinstance(build, Mapping) else None) or "onnxruntime"
    out["backend"] = backend
    if isinstance(build, Mapping):
        out["build"] = {**build, "backend": backend}
    else:
        out["build"] = {"backend": backend}
    if isinstance(out.get("parameters"), Mapping):
        out["parameters"] = {str(k): str(v.get("string_value", "") if isinstance(v, Mapping) else v)
                             for k, v in out["parameters"].items()}
    return out


def _tensor_fields(data: dict[str, Any]) -> dict[str, Any]:
    if "data_type" not in data and "datatype" in data:
        data["data_type"] = data.pop("datatype")
    if "name" not in data:
        raise ConfigError("every input/output needs a name")
    if data.get("data_type") is None:
        raise ConfigError(f"'{data['name']}' needs a data_type, e.g. TYPE_FP32")
    return data


def _queue_policy_fields(data: dict[str, Any]) -> dict[str, Any]:
    if str(data.pop("timeout_action", "REJECT")).upper() != "REJECT":
        raise ConfigError("timeout_action must be REJECT (DELAY is not supported)")
    return data


def _version_policy(value: Any, _: type) -> VersionPolicy:
    if isinstance(value, VersionPolicy):
        return value
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in ("latest", "all", "specific"):
        raise ConfigError("expected one of {latest: {num_versions: N}}, {all: {}}, "
                          f"{{specific: {{versions: [...]}}}}, got {value!r}")
    kind, body = next(iter(value.items()))
    fields = {"latest": ("num_versions",), "specific": ("versions",), "all": ()}[kind]
    return _plain_version_policy({**{k: v for k, v in (body or {}).items() if k in fields}, "kind": kind},
                                 VersionPolicy)


def _version_policy_to_triton(policy: VersionPolicy) -> dict[str, Any]:
    if policy.kind == "latest":
        return {"latest": {"num_versions": policy.num_versions}}
    if policy.kind == "specific":
        return {"specific": {"versions": list(policy.versions)}}
    return {"all": {}}


# Leaves first: a class's reader binds the hooks of its fields' types when it is registered.
_plain_version_policy = _configio.class_reader(VersionPolicy)
_configio.converter.register_structure_hook(VersionPolicy, _version_policy)
_configio.converter.register_structure_hook(DType, lambda v, _: datatype(v))
_configio.register_class(
    TensorConfig, ignore=("format", "reshape", "optional", "label_filename"), before=_tensor_fields
)
_configio.register_class(QueuePolicy, before=_queue_policy_fields)
_configio.register_class(BatchingConfig, ignore=("priority_queue_policy",))
_configio.register_class(InstanceGroupConfig, ignore=("name", "profile", "passive", "host_policy", "rate_limiter"))
_configio.register_class(WarmupConfig)
_configio.register_class(ModelConfig)

# Triton's JSON for /config: its type names, the one-key version policy, the queue's timeout_action.
_triton = _configio.converter.copy()
_triton.register_unstructure_hook(DType, lambda d: f"TYPE_{d.kserve}")
_triton.register_unstructure_hook(VersionPolicy, _version_policy_to_triton)
_triton.register_unstructure_hook(
    QueuePolicy, lambda q: {"timeout_action": "REJECT", **dict(dataclasses.asdict(q))}
)


def read_config_file(path: Path) -> Mapping[str, Any]:
    """A model config file as a mapping (YAML, JSON, or Triton protobuf text)."""
    if not path.is_file():
        raise ConfigError(f"model config not found: {path}")
    text = path.read_text()
    try:
        if path.suffix == ".pbtxt":
            return _read_pbtxt(text)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"cannot parse {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must hold a mapping, got {type(data).__name__}")
    return data


def _read_pbtxt(text: str) -> Mapping[str, Any]:
    from google.protobuf import json_format, text_format

    from streamrt.serve.proto import messages

    message = messages.ModelConfig()
    text_format.Parse(text, message, allow_unknown_field=True)
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens, authenticates, limits requests and shuts down.

    Attributes:
        host: address every front end binds to (loopback by default).
        http_port / grpc_port / metrics_port: ports (0 picks a free one); None disables that front end.
        auth_token: when set, every request except health checks and metrics needs
            ``Authorization: Bearer <token>`` (HTTP header or gRPC metadata).
        max_request_bytes: largest accepted request body / gRPC message (Triton's default 64 MiB).
        max_tensor_elements: largest element count of one input tensor.
        exit_timeout_s: how long shutdown waits for in-flight requests (Triton's default 30 s).
        strict_readiness: /v2/health/ready needs every model READY (else: the server is up).
        model_control: allow load/unload through the repository API.
        startup_models: models loaded at start (None: every model in the repository).
        load_threads: models loaded in parallel at start.
    """

    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    auth_token: str | None = None
    max_request_bytes: int = 64 * 2**20
    max_tensor_elements: int = 2**24
    exit_timeout_s: float = 30.0
    strict_readiness: bool = True
    model_control: bool = True
    startup_models: tuple[str, ...] | None = None
    load_threads: int = 2

    def __post_init__(self) -> None:
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be in 0..65535 (0: any free port), got {port}")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"max_request_bytes must be an integer >= 1024, got {self.max_request_bytes}")
        if self.max_tensor_elements < 1:
            raise ConfigError(f"max_tensor_elements must be an integer >= 1, got {self.max_tensor_elements}")
        if self.exit_timeout_s < 0:
            raise ConfigError(f"exit_timeout_s must be >= 0, got {self.exit_timeout_s}")
        if self.load_threads < 1:
            raise ConfigError(f"load_threads must be an integer >= 1, got {self.load_threads}")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ConfigError("auth_token must not be empty", hint="omit it to disable authentication")
        if self.startup_models is not None:
            object.__setattr__(self, "startup_models", tuple(self.startup_models))

    def replace(self, **changes: Any) -> ServerConfig:
        return dataclasses.replace(self, **changes)
