"""Triton's ``inference.ModelConfig`` message <-> StreamRT's frozen :class:`ModelConfig`.

:func:`read_config_file` and :func:`from_mapping` read any config format into the message
(:mod:`.triton_config`), refuse fields StreamRT does not implement, and build the dataclasses;
:func:`to_message` writes a resolved config back into the message for the model-config reply,
so the schema, the names and the defaults live in the proto only.

Example:
    >>> cfg = from_mapping({"max_batch_size": 8, "input": [{"name": "x", "data_type": "FP32", "dims": [3]}]}, "m")
    >>> to_message(cfg, "onnxruntime_onnx").input[0].data_type == 11
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamrt import _configio
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.serve.configs.config import (
    BatchingConfig,
    InstanceGroupConfig,
    ModelConfig,
    QueuePolicy,
    RateLimiterConfig,
    RateLimiterResource,
    SequenceBatchingConfig,
    SequenceControl,
    SequenceState,
    TensorConfig,
    VersionPolicy,
    WarmupConfig,
    datatype,
)
from streamrt.serve.configs.ensemble_config import EnsembleConfig, EnsembleStep
from streamrt.serve.configs.triton_config import PLATFORMS, parse_mapping, parse_text, unsupported_fields
from streamrt.types import DType

__all__ = ["PROFILE_PARAMETERS", "from_mapping", "from_message", "read_config_file", "to_message"]

PROFILE_PARAMETERS = ("min_shapes", "opt_shapes", "max_shapes")
"""``parameters`` keys that give the shape profile, in ``streamrt build --min-shapes`` syntax."""


def read_config_file(path: Path, name: str | None = None) -> ModelConfig:
    """A model config file (``config.pbtxt``, ``.yaml``/``.yml``, ``.json``) as a :class:`ModelConfig`."""
    model = name or path.parent.name
    if not path.is_file():
        raise ConfigError(f"model config not found: {path}")
    text = path.read_text()
    if path.suffix == ".pbtxt":
        return from_message(parse_text(text, model), model)
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise ConfigError(f"cannot parse {path}: {exc}") from None
    return from_mapping(data if data is not None else {}, model)


def from_mapping(data: Mapping[str, Any], name: str | None = None) -> ModelConfig:
    """A YAML/JSON mapping through Triton's schema; ``build:`` is StreamRT's own section."""
    model = str(name or (data.get("name") if isinstance(data, Mapping) else "") or "")
    if not model:
        raise ConfigError("model config: a model needs a name")
    if not isinstance(data, Mapping):
        raise ConfigError(f"model '{model}': expected a mapping, got {type(data).__name__}")
    rest = {k: v for k, v in data.items() if k != "build"}
    message = parse_mapping(rest, model)
    warmup_given = "model_warmup" in data and data["model_warmup"] is not None
    return from_message(message, model, build=data.get("build"), warmup_given=warmup_given)


def from_message(
    message: Any, name: str, *, build: Mapping[str, Any] | None = None, warmup_given: bool = False
) -> ModelConfig:
    """Check ``message`` (an ``inference.ModelConfig``) and map it onto :class:`ModelConfig`.

    Raises:
        ConfigError: a field StreamRT does not implement is set (named), or a value is invalid.
    """
    where = f"model '{name}'"
    if message.name and message.name != name:
        raise ConfigError(f"{where}: config name '{message.name}' differs from its directory '{name}'")
    refused = unsupported_fields(message)
    if refused:
        path, why = refused[0]
        more = f" (also: {', '.join(p for p, _ in refused[1:])})" if len(refused) > 1 else ""
        raise ConfigError(f"{where}: config field '{path}' is not supported: {why}{more}",
                          hint="remove it from the config, or serve this model with Triton")
    backend = _backend(message, build, where)
    ensemble = _ensemble(message, name, where)
    try:
        return ModelConfig(
            name=name,
            backend=backend,
            platform=message.platform,
            max_batch_size=message.max_batch_size if message.HasField("max_batch_size") else None,
            input=tuple(_tensor(t, f"{where} input[{i}]", True) for i, t in enumerate(message.input)),
            output=tuple(_tensor(t, f"{where} output[{i}]", False) for i, t in enumerate(message.output)),
            dynamic_batching=_batching(message, where),
            sequence_batching=_sequence_batching(message, where),
            instance_group=tuple(_group(g, f"{where} instance_group[{i}]")
                                 for i, g in enumerate(message.instance_group)) or (InstanceGroupConfig(),),
            version_policy=_version_policy(message, where),
            model_warmup=_warmups(message, where, warmup_given),
            default_model_filename=message.default_model_filename,
            build=_build(build, backend, message, where),
            parameters={k: v.string_value for k, v in message.parameters.items()},
            ensemble_scheduling=ensemble,
        )
    except ConfigError as exc:
        if exc.message.startswith("model '"):
            raise
        raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None


def _located(where: str, make: Any) -> Any:
    try:
        return make()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None


def _ensemble(message: Any, name: str, where: str) -> EnsembleConfig | None:
    """``ensemble_scheduling`` (only with ``platform: "ensemble"``, and then required), checked as a DAG."""
    is_ensemble = message.platform == "ensemble"
    if not message.HasField("ensemble_scheduling"):
        if is_ensemble:
            raise ConfigError(f"{where}: platform \"ensemble\" needs ensemble_scheduling {{ step [...] }}")
        return None
    if not is_ensemble:
        raise ConfigError(f"{where}: ensemble_scheduling is set but platform is '{message.platform}'",
                          hint='set platform: "ensemble"')
    if message.instance_group or message.backend or message.model_warmup:
        raise ConfigError(f"{where}: an ensemble cannot have instance_group, backend or model_warmup; "
                          "its steps' models have their own")
    if not message.input or not message.output:
        raise ConfigError(f"{where}: an ensemble declares its inputs and outputs (name, data_type, dims)")
    steps = tuple(_located(f"{where} ensemble_scheduling.step[{i}]", lambda s=s: EnsembleStep(
        s.model_name, int(s.model_version) or -1, dict(s.input_map), dict(s.output_map)))
        for i, s in enumerate(message.ensemble_scheduling.step))
    config = _located(f"{where}", lambda: EnsembleConfig(steps))
    config.order(name, [t.name for t in message.input], [t.name for t in message.output])
    return config


def _backend(message: Any, build: Mapping[str, Any] | None, where: str) -> str:
    names = [n for n in (message.backend, message.platform) if n and n != "ensemble"]
    for n in names:
        if n not in PLATFORMS and not n.startswith("streamrt_"):
            known = ", ".join(sorted(k for k in PLATFORMS if k))
            raise ConfigError(f"{where}: platform/backend '{n}' is not supported; StreamRT serves {known}",
                              hint="convert the model to ONNX and set platform: \"onnxruntime_onnx\"")
    mapped = {PLATFORMS.get(n, n.removeprefix("streamrt_")) for n in names}
    if len(mapped) > 1:
        raise ConfigError(f"{where}: platform '{message.platform}' and backend '{message.backend}' disagree")
    from_build = build.get("backend") if isinstance(build, Mapping) else None
    return str(from_build or (mapped.pop() if mapped else "onnxruntime"))


def _tensor(t: Any, where: str, is_input: bool) -> TensorConfig:
    if not t.name:
        raise ConfigError(f"{where}: every input/output needs a name")
    if t.data_type == 0:
        raise ConfigError(f"{where}: '{t.name}' needs a data_type, e.g. TYPE_FP32")
    from streamrt.serve.wire.proto import messages

    type_name = messages.DataType.values_by_number[t.data_type].name
    fmt = messages.ModelInput.Format.Name(t.format) if is_input else "FORMAT_NONE"
    return _located(where, lambda: TensorConfig(
        t.name, datatype(type_name, where), tuple(int(d) for d in t.dims), format=fmt,
        reshape=tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else None,
        label_filename="" if is_input else t.label_filename,
    ))


def _batching(message: Any, where: str) -> BatchingConfig | None:
    if not message.HasField("dynamic_batching"):
        return None
    db = message.dynamic_batching
    qp = db.default_queue_policy
    if qp.timeout_action != 0:
        raise ConfigError(f"{where} dynamic_batching.default_queue_policy: timeout_action must be REJECT "
                          "(DELAY is not supported)")
    return _located(f"{where} dynamic_batching", lambda: BatchingConfig(
        max_queue_delay_microseconds=db.max_queue_delay_microseconds,
        preferred_batch_size=tuple(db.preferred_batch_size),
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_queue_policy=QueuePolicy(qp.default_timeout_microseconds, qp.allow_timeout_override,
                                         qp.max_queue_size),
    ))


# --- sequence batching -------------------------------------------------------------------------

_FALSE_TRUE = (("int32_false_true", DType.INT32), ("fp32_false_true", DType.FLOAT32), ("bool_false_true", DType.BOOL))


def _sequence_batching(message: Any, where: str) -> SequenceBatchingConfig | None:
    """``sequence_batching`` as a :class:`SequenceBatchingConfig` (Triton's defaults filled in)."""
    if not message.HasField("sequence_batching"):
        return None
    sb = message.sequence_batching
    where = f"{where} sequence_batching"
    controls = []
    for i, item in enumerate(sb.control_input):
        if len(item.control) != 1:
            raise ConfigError(f"{where} control_input[{i}] '{item.name}': needs exactly one control, "
                              f"got {len(item.control)}")
        controls.append(_control(item.name, item.control[0], f"{where} control_input[{i}]"))
    states = [_state(s, f"{where} state[{i}]") for i, s in enumerate(sb.state)]
    strategy = sb.WhichOneof("strategy_choice") or "direct"
    direct, oldest = sb.direct, sb.oldest
    return _located(where, lambda: SequenceBatchingConfig(
        strategy=strategy,
        max_sequence_idle_microseconds=sb.max_sequence_idle_microseconds or 1_000_000,
        max_queue_delay_microseconds=(oldest if strategy == "oldest" else direct).max_queue_delay_microseconds,
        minimum_slot_utilization=float(direct.minimum_slot_utilization) if strategy == "direct" else 0.0,
        max_candidate_sequences=oldest.max_candidate_sequences if strategy == "oldest" else 0,
        preferred_batch_size=tuple(oldest.preferred_batch_size) if strategy == "oldest" else (),
        preserve_ordering=oldest.preserve_ordering if strategy == "oldest" else False,
        controls=tuple(controls), states=tuple(states),
    ))


def _control(name: str, control: Any, where: str) -> SequenceControl:
    from streamrt.serve.wire.proto import messages

    kind = messages.ModelSequenceBatching.Control.Kind.Name(control.kind)
    if kind == "CONTROL_SEQUENCE_CORRID":
        if control.data_type == 0:
            raise ConfigError(f"{where} '{name}': CONTROL_SEQUENCE_CORRID needs a data_type, e.g. TYPE_UINT64")
        type_name = messages.DataType.values_by_number[control.data_type].name
        return _located(where, lambda: SequenceControl(name, kind, datatype(type_name, where)))
    given = [(field, dtype) for field, dtype in _FALSE_TRUE if len(getattr(control, field))]
    if len(given) != 1:
        raise ConfigError(f"{where} '{name}': {kind} needs exactly one of int32_false_true, fp32_false_true "
                          f"or bool_false_true, got {[f for f, _ in given] or 'none'}")
    field, dtype = given[0]
    values = tuple(getattr(control, field))
    return _located(where, lambda: SequenceControl(name, kind, dtype, values))


def _state(state: Any, where: str) -> SequenceState:
    if state.data_type == 0:
        raise ConfigError(f"{where} '{state.input_name}': needs a data_type, e.g. TYPE_FP32")
    from streamrt.serve.wire.proto import messages

    type_name = messages.DataType.values_by_number[state.data_type].name
    dtype = datatype(type_name, where)
    if len(state.initial_state) > 1:
        raise ConfigError(f"{where} '{state.input_name}': initial_state must contain one element or none, "
                          f"got {len(state.initial_state)}")
    initial = None
    if state.initial_state:
        init = state.initial_state[0]
        if init.WhichOneof("state_data") != "zero_data" or not init.zero_data:
            raise ConfigError(f"{where} '{state.input_name}': initial_state supports zero_data: true only "
                              "(data_file is not implemented)")
        if init.data_type != state.data_type:
            raise ConfigError(f"{where} '{state.input_name}': initial_state data_type differs from the state's")
        initial = tuple(int(d) for d in init.dims)
    return _located(where, lambda: SequenceState(state.input_name, state.output_name, dtype,
                                                 tuple(int(d) for d in state.dims), initial))


def _write_sequence_batching(m: Any, config: SequenceBatchingConfig) -> None:
    """``config`` into ``m.sequence_batching`` (the config reply)."""
    from streamrt.serve.wire.proto import messages

    sb = m.sequence_batching
    sb.SetInParent()
    sb.max_sequence_idle_microseconds = config.max_sequence_idle_microseconds
    if config.strategy == "oldest":
        sb.oldest.max_candidate_sequences = config.max_candidate_sequences
        sb.oldest.preferred_batch_size.extend(config.preferred_batch_size)
        sb.oldest.max_queue_delay_microseconds = config.max_queue_delay_microseconds
        sb.oldest.preserve_ordering = config.preserve_ordering
    else:
        sb.direct.max_queue_delay_microseconds = config.max_queue_delay_microseconds
        sb.direct.minimum_slot_utilization = config.minimum_slot_utilization
    kinds = messages.ModelSequenceBatching.Control.Kind
    for c in config.controls:
        control = sb.control_input.add(name=c.name).control.add(kind=kinds.Value(c.kind))
        if c.kind == "CONTROL_SEQUENCE_CORRID":
            control.data_type = _type_number(c.data_type)
        else:
            field = next(f for f, d in _FALSE_TRUE if d is c.data_type)
            getattr(control, field).extend(c.false_true)
    for s in config.states:
        state = sb.state.add(input_name=s.input_name, output_name=s.output_name,
                             data_type=_type_number(s.data_type), dims=s.dims)
        if s.initial_dims is not None:
            state.initial_state.add(data_type=_type_number(s.data_type), dims=s.initial_dims, zero_data=True,
                                    name=f"{s.input_name}_initial")


def _group(g: Any, where: str) -> InstanceGroupConfig:
    from streamrt.serve.wire.proto import messages

    if g.count < 0:
        raise ConfigError(f"{where}: count must be an integer >= 1, got {g.count}")
    kind = messages.ModelInstanceGroup.Kind.Name(g.kind)
    limiter = _rate_limiter(g, where)
    return _located(where, lambda: InstanceGroupConfig(count=g.count or 1, kind=kind, gpus=tuple(g.gpus),
                                                       rate_limiter=limiter))


def _rate_limiter(g: Any, where: str) -> RateLimiterConfig | None:
    """An instance group's ``rate_limiter`` (None when the group has none)."""
    if not g.HasField("rate_limiter"):
        return None
    rl = g.rate_limiter
    return _located(f"{where} rate_limiter", lambda: RateLimiterConfig(
        resources=tuple(RateLimiterResource(r.name, r.count, getattr(r, "global")) for r in rl.resources),
        priority=rl.priority,
    ))


def _rate_limiter_message(group: Any, config: RateLimiterConfig | None) -> None:
    """Write an instance group's ``rate_limiter`` back into its message."""
    if config is None:
        return
    group.rate_limiter.SetInParent()
    group.rate_limiter.priority = config.priority
    for r in config.resources:
        item = group.rate_limiter.resources.add(name=r.name, count=r.count)
        setattr(item, "global", r.is_global)


def _version_policy(message: Any, where: str) -> VersionPolicy:
    if not message.HasField("version_policy"):
        return VersionPolicy()
    policy = message.version_policy
    kind = policy.WhichOneof("policy_choice")
    if kind == "latest":
        return _located(f"{where} version_policy", lambda: VersionPolicy("latest", policy.latest.num_versions))
    if kind == "specific":
        return _located(f"{where} version_policy",
                        lambda: VersionPolicy("specific", versions=tuple(policy.specific.versions)))
    return VersionPolicy("all") if kind == "all" else VersionPolicy()


def _warmups(message: Any, where: str, given: bool) -> tuple[WarmupConfig, ...] | None:
    if not message.model_warmup:
        return () if given else None
    out = []
    for i, w in enumerate(message.model_warmup):
        inputs = {k: {"dims": [int(d) for d in v.dims], "zero_data": v.WhichOneof("input_data_type") == "zero_data"}
                  for k, v in w.inputs.items()}
        out.append(_located(f"{where} model_warmup[{i}]", lambda w=w, inputs=inputs: WarmupConfig(
            name=w.name or "warmup", batch_size=w.batch_size or 1, count=w.count or 1, inputs=inputs)))
    return tuple(out)


def _build(build: Mapping[str, Any] | None, backend: str, message: Any, where: str) -> BuildConfig:
    data = dict(build) if isinstance(build, Mapping) else {}
    if build is not None and not isinstance(build, Mapping):
        raise ConfigError(f"{where} build: expected a mapping, got {type(build).__name__}")
    shapes = {k: message.parameters[k].string_value for k in PROFILE_PARAMETERS if k in message.parameters}
    if shapes:
        from streamrt.onnx.profiles import parse_profiles

        if data.get("profiles"):
            raise ConfigError(f"{where}: shape profiles are given twice (parameters and build.profiles)")
        if "min_shapes" not in shapes or "max_shapes" not in shapes:
            raise ConfigError(f"{where}: parameters min_shapes and max_shapes go together (opt_shapes optional)")
        profiles = _located(f"{where} parameters", lambda: parse_profiles(
            [shapes["min_shapes"]], [shapes["opt_shapes"]] if "opt_shapes" in shapes else [], [shapes["max_shapes"]]))
        data["profiles"] = [p.to_dict() for p in profiles]
    return _configio.structure({**data, "backend": backend}, BuildConfig, f"{where} build")


# --- the reply ---------------------------------------------------------------------------------


def to_message(config: ModelConfig, platform: str) -> Any:
    """``config`` (resolved against its engine) as the ``inference.ModelConfig`` of the config reply."""
    from streamrt.serve.wire.proto import messages

    m = messages.ModelConfig(name=config.name, platform=config.platform or platform, backend=config.backend,
                             max_batch_size=config.max_batch_size or 0,
                             default_model_filename=config.default_model_filename)
    policy = config.version_policy
    if policy.kind == "latest":
        m.version_policy.latest.num_versions = policy.num_versions
    elif policy.kind == "specific":
        m.version_policy.specific.versions.extend(policy.versions)
    else:
        m.version_policy.all.SetInParent()
    for t in config.input:
        item = m.input.add(name=t.name, data_type=_type_number(t.data_type), dims=t.dims,
                           format=messages.ModelInput.Format.Value(t.format))
        if t.reshape is not None:
            item.reshape.shape.extend(t.reshape)
    for t in config.output:
        item = m.output.add(name=t.name, data_type=_type_number(t.data_type), dims=t.dims,
                            label_filename=t.label_filename)
        if t.reshape is not None:
            item.reshape.shape.extend(t.reshape)
    if config.dynamic_batching is not None:
        b = config.dynamic_batching
        db = m.dynamic_batching
        db.preferred_batch_size.extend(b.preferred_batch_size)
        db.max_queue_delay_microseconds = b.max_queue_delay_microseconds
        db.preserve_ordering = b.preserve_ordering
        db.priority_levels = b.priority_levels
        db.default_priority_level = b.default_priority_level
        q = b.default_queue_policy
        db.default_queue_policy.default_timeout_microseconds = q.default_timeout_microseconds
        db.default_queue_policy.allow_timeout_override = q.allow_timeout_override
        db.default_queue_policy.max_queue_size = q.max_queue_size
    if config.sequence_batching is not None:
        _write_sequence_batching(m, config.sequence_batching)
    if config.ensemble_scheduling is not None:
        m.backend = ""
        for step in config.ensemble_scheduling.steps:
            item = m.ensemble_scheduling.step.add(model_name=step.model_name, model_version=step.model_version)
            item.input_map.update(step.input_map)
            item.output_map.update(step.output_map)
    for i, g in enumerate(() if config.ensemble_scheduling else config.instance_group):
        group = m.instance_group.add(name=f"{config.name}_{i}", count=g.count, gpus=g.gpus,
                                     kind=messages.ModelInstanceGroup.Kind.Value(g.kind))
        _rate_limiter_message(group, g.rate_limiter)
    for key, value in config.parameters.items():
        m.parameters[key].string_value = value
    types = {t.name: t.data_type for t in config.input}
    for w in config.model_warmup or ():
        item = m.model_warmup.add(name=w.name, batch_size=w.batch_size, count=w.count)
        for key, spec in w.inputs.items():
            entry = item.inputs[key]
            entry.dims.extend(int(d) for d in spec.get("dims", ()))
            if key in types:
                entry.data_type = _type_number(types[key])
            if spec.get("zero_data"):
                entry.zero_data = True
            else:
                entry.random_data = True
    return m


def _type_number(dtype: DType) -> int:
    from streamrt.serve.wire.proto import messages

    name = "TYPE_STRING" if dtype is DType.BYTES else f"TYPE_{dtype.kserve}"
    return int(messages.DataType.values_by_name[name].number)
