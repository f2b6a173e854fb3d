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


def _check(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {message}")


def _int(value: Any, where: str, name: str, minimum: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}") from None
    if isinstance(value, bool) or number < minimum or (isinstance(value, float) and value != number):
        raise ConfigError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}")
    return number


def _kwargs(cls: type, data: Mapping[str, Any], where: str, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known - set(ignore))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    return {k: v for k, v in data.items() if k in known}


def datatype(value: Any, where: str) -> DType:
    """``TYPE_FP32``, ``FP32``, ``float32`` or a DType -> DType (Triton's config names accepted)."""
    text = value if isinstance(value, DType) else str(value)
    if isinstance(text, str) and text.upper().startswith("TYPE_"):
        text = text[5:]
    try:
        return DType.from_any(text)
    except ConfigError:
        raise ConfigError(
            f"{where}: unsupported data_type {value!r}; supported: "
            + ", ".join(f"TYPE_{d.kserve}" for d in DType)
        ) from None


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: name, element type and dims *without* the batch dimension (-1 = any)."""

    name: str
    data_type: DType
    dims: tuple[int, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> TensorConfig:
        kw = _kwargs(cls, data, where, ignore=("format", "reshape", "optional", "label_filename", "datatype"))
        _check("name" in kw, where, "every input/output needs a name")
        dtype = kw.get("data_type", data.get("datatype"))
        _check(dtype is not None, where, f"'{kw['name']}' needs a data_type, e.g. TYPE_FP32")
        dims = tuple(int(d) for d in kw.get("dims", ()))
        _check(all(d == -1 or d >= 1 for d in dims), where, f"dims of '{kw['name']}' must be >= 1 or -1, got {dims}")
        return cls(str(kw["name"]), datatype(dtype, where), dims)

    def to_triton(self, output: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "data_type": f"TYPE_{self.data_type.kserve}", "dims": list(self.dims)}
        if not output:
            d.update(format="FORMAT_NONE", optional=False)
        return d


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy``: queue bound and per-request timeout (0 = none).

    ``allow_timeout_override`` lets a request's ``timeout`` parameter replace the default.
    """

    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> QueuePolicy:
        kw = _kwargs(cls, data, where, ignore=("timeout_action",))
        if str(data.get("timeout_action", "REJECT")).upper() != "REJECT":
            raise ConfigError(f"{where}: timeout_action must be REJECT (DELAY is not supported)")
        return cls(
            _int(kw.get("default_timeout_microseconds", 0), where, "default_timeout_microseconds"),
            bool(kw.get("allow_timeout_override", False)),
            _int(kw.get("max_queue_size", 0), where, "max_queue_size"),
        )


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, where: str) -> BatchingConfig:
        kw = _kwargs(cls, data or {}, where, ignore=("priority_queue_policy",))
        levels = _int(kw.get("priority_levels", 0), where, "priority_levels")
        default_level = _int(kw.get("default_priority_level", 0), where, "default_priority_level")
        if levels and not 1 <= default_level <= levels:
            raise ConfigError(f"{where}: default_priority_level must be in 1..{levels}, got {default_level}")
        return cls(
            _int(kw.get("max_queue_delay_microseconds", 0), where, "max_queue_delay_microseconds"),
            tuple(_int(b, where, "preferred_batch_size", 1) for b in kw.get("preferred_batch_size", ())),
            bool(kw.get("preserve_ordering", False)),
            levels,
            default_level,
            QueuePolicy.from_dict(kw.get("default_queue_policy") or {}, f"{where}.default_queue_policy"),
        )

    def to_triton(self) -> dict[str, Any]:
        q = self.default_queue_policy
        return {
            "preferred_batch_size": list(self.preferred_batch_size),
            "max_queue_delay_microseconds": self.max_queue_delay_microseconds,
            "preserve_ordering": self.preserve_ordering,
            "priority_levels": self.priority_levels,
            "default_priority_level": self.default_priority_level,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": q.default_timeout_microseconds,
                "allow_timeout_override": q.allow_timeout_override,
                "max_queue_size": q.max_queue_size,
            },
        }


@dataclass(frozen=True)
class InstanceGroupConfig:
    """``count`` instances, each with its own execution context, stream and worker thread."""

    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> InstanceGroupConfig:
        kw = _kwargs(cls, data, where, ignore=("name", "profile", "passive", "host_policy", "rate_limiter"))
        kind = str(kw.get("kind", "KIND_AUTO")).upper()
        kind = kind if kind.startswith("KIND_") else f"KIND_{kind}"
        allowed = ", ".join(INSTANCE_KINDS)
        _check(kind in INSTANCE_KINDS, where, f"kind must be one of {allowed}, got {kw.get('kind')!r}")
        gpus = tuple(_int(g, where, "gpus") for g in kw.get("gpus", ()))
        return cls(_int(kw.get("count", 1), where, "count", 1), kind, gpus)


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> WarmupConfig:
        kw = _kwargs(cls, data, where)
        return cls(
            str(kw.get("name", "warmup")),
            _int(kw.get("batch_size", 1), where, "batch_size", 1),
            _int(kw.get("count", 1), where, "count", 1),
            dict(kw.get("inputs") or {}),
        )


@dataclass(frozen=True)
class VersionPolicy:
    """Which numeric version directories are served: ``latest`` N, ``all``, or ``specific``."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> VersionPolicy:
        if not isinstance(data, Mapping) or len(data) != 1 or next(iter(data)) not in ("latest", "all", "specific"):
            raise ConfigError(f"{where}: expected one of {{latest: {{num_versions: N}}}}, {{all: {{}}}}, "
                              f"{{specific: {{versions: [...]}}}}, got {data!r}")
        kind, body = next(iter(data.items()))
        body = body or {}
        if kind == "latest":
            return cls("latest", _int(body.get("num_versions", 1), where, "num_versions", 1))
        if kind == "specific":
            versions = tuple(_int(v, where, "versions", 1) for v in body.get("versions", ()))
            _check(bool(versions), where, "specific needs at least one version")
            return cls("specific", versions=versions)
        return cls("all")

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of ``available`` (ascending)."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :]

    def to_triton(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"all": {}}


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

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.instance_group)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
        """Validate a mapping (YAML/JSON/pbtxt) and build the config; ``name`` is the directory name."""
        model = str(name or data.get("name") or "")
        where = f"model '{model}'"
        _check(bool(model), "model config", "a model needs a name")
        kw = _kwargs(cls, data, where, ignore=_IGNORED_MODEL_FIELDS)
        ignored = [k for k in _IGNORED_MODEL_FIELDS if data.get(k) not in (None, "", {}, [])]
        if ignored:
            log.warning("%s: ignoring config fields StreamRT does not implement: %s", where, ", ".join(ignored))
        if name and data.get("name") and data["name"] != name:
            raise ConfigError(f"{where}: config name '{data['name']}' differs from its directory '{name}'")
        mbs = kw.get("max_batch_size")
        groups = kw.get("instance_group")
        warmup = kw.get("model_warmup")
        build = kw.get("build") or {}
        backend = str(kw.get("backend") or (build.get("backend") if isinstance(build, Mapping) else None)
                      or "onnxruntime")
        if isinstance(build, Mapping):
            build = BuildConfig.from_dict({**build, "backend": backend})
        batching = kw.get("dynamic_batching")
        return cls(
            name=model,
            backend=backend,
            max_batch_size=None if mbs is None else _int(mbs, where, "max_batch_size"),
            input=tuple(TensorConfig.from_dict(t, f"{where} input") for t in kw.get("input") or ()),
            output=tuple(TensorConfig.from_dict(t, f"{where} output") for t in kw.get("output") or ()),
            dynamic_batching=None
            if batching is None
            else BatchingConfig.from_dict(batching, f"{where} dynamic_batching"),
            instance_group=tuple(InstanceGroupConfig.from_dict(g, f"{where} instance_group") for g in groups)
            if groups
            else (InstanceGroupConfig(),),
            version_policy=VersionPolicy.from_dict(kw["version_policy"], f"{where} version_policy")
            if kw.get("version_policy")
            else VersionPolicy(),
            model_warmup=None
            if warmup is None
            else tuple(WarmupConfig.from_dict(w, f"{where} model_warmup") for w in warmup),
            default_model_filename=str(kw.get("default_model_filename") or ""),
            build=build,
            parameters={str(k): str(v.get("string_value", "") if isinstance(v, Mapping) else v)
                        for k, v in (kw.get("parameters") or {}).items()},
        )

    @classmethod
    def from_file(cls, path: str | Path, *, name: str | None = None) -> ModelConfig:
        """Read ``config.yaml``/``.yml``/``.json`` or a Triton ``config.pbtxt``."""
        return cls.from_dict(read_config_file(Path(path)), name=name)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_triton(self, platform: str) -> dict[str, Any]:
        """The config as Triton's JSON (proto field names, defaults printed), for ``/config``."""
        d: dict[str, Any] = {
            "name": self.name,
            "platform": platform,
            "backend": self.backend,
            "version_policy": self.version_policy.to_triton(),
            "max_batch_size": self.max_batch_size or 0,
            "input": [t.to_triton() for t in self.input],
            "output": [t.to_triton(output=True) for t in self.output],
            "instance_group": [
                {"name": f"{self.name}_{i}", "kind": g.kind, "count": g.count, "gpus": list(g.gpus)}
                for i, g in enumerate(self.instance_group)
            ],
            "default_model_filename": self.default_model_filename,
            "parameters": {k: {"string_value": v} for k, v in self.parameters.items()},
            "model_warmup": [
                {"name": w.name, "batch_size": w.batch_size, "count": w.count, "inputs": {}}
                for w in self.model_warmup or ()
            ],
        }
        if self.dynamic_batching is not None:
            d["dynamic_batching"] = self.dynamic_batching.to_triton()
        return d


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
        max_request_bytes: largest accepted HTTP request body (Triton's default 64 MiB).
        grpc_max_message_bytes: largest accepted gRPC message (default 512 MiB: 64 fp32 224x224
            images are 38.5 MB; gRPC answers RESOURCE_EXHAUSTED above it).
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
    grpc_max_message_bytes: int = 512 * 2**20
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
        if not 1024 <= self.grpc_max_message_bytes <= 2**31 - 1:
            raise ConfigError(f"grpc_max_message_bytes must be in 1024..{2**31 - 1} (gRPC's limit), "
                              f"got {self.grpc_max_message_bytes}")
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
