"""Model configs through Triton's own schema: ``inference.ModelConfig`` is the one schema.

Every config format is read into the protobuf message of ``proto/model_config.proto``:
``config.pbtxt`` with ``google.protobuf.text_format`` (so a valid Triton config parses exactly as
Triton parses it), ``config.yaml``/``.json`` and load-request overrides with
``json_format.ParseDict`` (after a few friendly spellings: ``FP32`` for ``TYPE_FP32``, ``cpu`` for
``KIND_CPU``, plain strings as parameter values). The message is then checked field by field
against :data:`HONOURED` and :data:`HINTS`: a field that is set but that StreamRT does not
implement refuses the load, naming the field (a model must never run with semantics its config
did not ask for). Finally it maps to the frozen :class:`~streamrt.serve.configs.config.ModelConfig`; the
model-config reply is that config written back into the message (:func:`to_message`), printed by
protobuf itself (:func:`message_json`).

StreamRT's own settings ride in two places Triton leaves open: a YAML/JSON config's ``build:``
section (a :class:`~streamrt.config.BuildConfig`), and ``parameters`` (``min_shapes``,
``opt_shapes``, ``max_shapes`` in ``streamrt build``'s syntax give the shape profile of inputs
with dynamic dims).

Example:
    >>> msg = parse_text('name: "m" max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]')
    >>> list(msg.input[0].dims), unsupported_fields(parse_text("response_cache { enable: true }"))[0][0]
    ([3], 'response_cache.enable')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamrt.errors import ConfigError
from streamrt.types import DType

__all__ = [
    "HINTS",
    "HONOURED",
    "PLATFORMS",
    "message_json",
    "parse_mapping",
    "parse_text",
    "unsupported_fields",
]

# Triton platform / backend names -> StreamRT backend (the plan names its own when there is one).
PLATFORMS = {
    "": "onnxruntime", "onnxruntime": "onnxruntime", "onnxruntime_onnx": "onnxruntime",
    "tensorrt": "tensorrt", "tensorrt_plan": "tensorrt",
    "pytorch": "torch_inductor", "pytorch_libtorch": "torch_inductor", "torch_inductor": "torch_inductor",
    "python": "python",  # a model.py served by streamrt.serve.models.python_backend, not an engine
}

# Field paths StreamRT implements ("[]" marks a repeated field, "{}" a map value).
HONOURED = frozenset({
    "name", "platform", "backend", "max_batch_size", "default_model_filename",
    "version_policy.latest.num_versions", "version_policy.all", "version_policy.specific.versions",
    "input[].name", "input[].data_type", "input[].format", "input[].dims", "input[].reshape.shape",
    "output[].name", "output[].data_type", "output[].dims", "output[].reshape.shape",
    "output[].label_filename",
    "dynamic_batching.preferred_batch_size", "dynamic_batching.max_queue_delay_microseconds",
    "dynamic_batching.preserve_ordering", "dynamic_batching.priority_levels",
    "dynamic_batching.default_priority_level",
    "dynamic_batching.default_queue_policy.timeout_action",
    "dynamic_batching.default_queue_policy.default_timeout_microseconds",
    "dynamic_batching.default_queue_policy.allow_timeout_override",
    "dynamic_batching.default_queue_policy.max_queue_size",
    "instance_group[].name", "instance_group[].kind", "instance_group[].count", "instance_group[].gpus",
    "instance_group[].rate_limiter.resources[].name", "instance_group[].rate_limiter.resources[].global",
    "instance_group[].rate_limiter.resources[].count", "instance_group[].rate_limiter.priority",
    "parameters{}.string_value",
    "model_warmup[].name", "model_warmup[].batch_size", "model_warmup[].count",
    "model_warmup[].inputs{}.data_type", "model_warmup[].inputs{}.dims",
    "model_warmup[].inputs{}.zero_data", "model_warmup[].inputs{}.random_data",
    "ensemble_scheduling.step[].model_name", "ensemble_scheduling.step[].model_version",
    "ensemble_scheduling.step[].input_map{}", "ensemble_scheduling.step[].output_map{}",
}) | frozenset({  # the sequence batcher (streamrt.serve.scheduling.sequence)
    "sequence_batching.max_sequence_idle_microseconds",
    "sequence_batching.direct.max_queue_delay_microseconds", "sequence_batching.direct.minimum_slot_utilization",
    "sequence_batching.oldest.max_candidate_sequences", "sequence_batching.oldest.preferred_batch_size",
    "sequence_batching.oldest.max_queue_delay_microseconds", "sequence_batching.oldest.preserve_ordering",
    "sequence_batching.control_input[].name", "sequence_batching.control_input[].control[].kind",
    "sequence_batching.control_input[].control[].int32_false_true",
    "sequence_batching.control_input[].control[].fp32_false_true",
    "sequence_batching.control_input[].control[].bool_false_true",
    "sequence_batching.control_input[].control[].data_type",
    "sequence_batching.state[].input_name", "sequence_batching.state[].output_name",
    "sequence_batching.state[].data_type", "sequence_batching.state[].dims",
    "sequence_batching.state[].initial_state[].data_type", "sequence_batching.state[].initial_state[].dims",
    "sequence_batching.state[].initial_state[].zero_data", "sequence_batching.state[].initial_state[].name",
})

# Performance hints: accepted, they cannot change a result, and StreamRT decides these itself.
HINTS = frozenset({
    "optimization.input_pinned_memory.enable", "optimization.output_pinned_memory.enable",
    "optimization.gather_kernel_buffer_threshold", "optimization.eager_batching",
    "optimization.priority", "optimization.graph.level",
    "optimization.cuda.busy_wait_events", "optimization.cuda.output_copy_stream",
    "sequence_batching.state[].use_same_buffer_for_input_output", "sequence_batching.state[].use_growable_memory",
})

# Messages whose mere presence changes semantics (proto3 cannot say "set but empty" otherwise).
_PRESENCE: set[str] = set()

_WHY = {
    "iterative_sequence": "iterative sequences (continuous batching) are not implemented",
    "data_file": "initial state data files are not implemented; use zero_data",
    "model_namespace": "model namespaces are not implemented",
    "max_inflight_responses": "bounding an ensemble's in-flight responses is not implemented",
    "batch_input": "batch inputs are not implemented",
    "batch_output": "batch outputs are not implemented",
    "model_transaction_policy": "decoupled models are not implemented",
    "response_cache": "the response cache is not implemented",
    "optional": "optional inputs are not implemented",
    "allow_ragged_batch": "ragged batching is not implemented",
    "is_shape_tensor": "shape tensors are not implemented",
    "priority_queue_policy": "per-priority queue policies are not implemented",
    "input_data_file": "warm-up data files are not implemented",
    "execution_accelerators": "backend execution accelerators are not configurable here; use build settings",
}


def _where(name: str) -> str:
    return f"model '{name}'" if name else "model config"


def parse_text(text: str, name: str = "") -> Any:
    """A ``config.pbtxt`` as an ``inference.ModelConfig`` message (Triton's parser rules)."""
    from google.protobuf import text_format

    from streamrt.serve.wire.proto import messages

    message = messages.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigError(f"{_where(name)}: config.pbtxt does not follow Triton's schema: {exc}") from None
    return message


def parse_mapping(data: Mapping[str, Any], name: str = "") -> Any:
    """A YAML/JSON config (or a load request's override) as an ``inference.ModelConfig`` message."""
    from google.protobuf import json_format

    from streamrt.serve.wire.proto import messages

    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(name)}: expected a mapping, got {type(data).__name__}")
    message = messages.ModelConfig()
    try:
        json_format.ParseDict(_friendly(dict(data)), message)
    except json_format.ParseError as exc:
        text = str(exc).splitlines()[0]
        raise ConfigError(f"{_where(name)}: {text}", hint="field names and values are Triton's ModelConfig") \
            from None
    return message


def _friendly(data: dict[str, Any]) -> dict[str, Any]:
    """StreamRT's short spellings as Triton's: ``FP32`` -> ``TYPE_FP32``, ``cpu`` -> ``KIND_CPU``,
    ``{key: "v"}`` parameters -> ``{key: {string_value: "v"}}``; ``null`` values as absent."""
    out = {k: v for k, v in data.items() if v is not None}
    for key in ("input", "output"):
        for tensor in out.get(key) or ():
            if isinstance(tensor, dict):
                if "datatype" in tensor and "data_type" not in tensor:
                    tensor["data_type"] = tensor.pop("datatype")
                _prefix(tensor, "data_type", "TYPE_")
    for group in out.get("instance_group") or ():
        if isinstance(group, dict):
            _prefix(group, "kind", "KIND_")
    for warmup in out.get("model_warmup") or ():
        for value in (warmup.get("inputs") or {}).values() if isinstance(warmup, dict) else ():
            if isinstance(value, dict):
                _prefix(value, "data_type", "TYPE_")
    params = out.get("parameters")
    if isinstance(params, Mapping):
        out["parameters"] = {k: v if isinstance(v, Mapping) else {"string_value": str(v)} for k, v in params.items()}
    return out


def _prefix(d: dict[str, Any], key: str, prefix: str) -> None:
    value = d.get(key)
    if not isinstance(value, str):
        return
    upper = value.upper()
    if upper.startswith(prefix):
        return
    if prefix == "TYPE_":
        try:  # any name StreamRT knows for a type: FP32, float32, BYTES, ...
            kserve = DType.from_any(value).kserve
        except ConfigError:
            kserve = upper
        upper = "STRING" if kserve == "BYTES" else kserve
    d[key] = prefix + upper


def unsupported_fields(message: Any) -> list[tuple[str, str]]:
    """``(field path, why)`` for every field set in ``message`` that StreamRT does not implement."""
    found: list[tuple[str, str]] = []
    _walk(message, "", "", found)
    return found


def _walk(message: Any, path: str, shown: str, found: list[tuple[str, str]]) -> None:
    for field, value in message.ListFields():
        key = f"{path}.{field.name}" if path else field.name
        label = f"{shown}.{field.name}" if shown else field.name
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        repeated = _is_repeated(field) and not is_map and field.message_type is not None
        pattern = f"{key}{{}}" if is_map else f"{key}[]" if repeated else key
        if field.message_type is None or (is_map and field.message_type.fields_by_name["value"].message_type is None):
            if pattern in HONOURED or pattern in HINTS or (pattern == "response_cache.enable" and not value):
                continue
            found.append((label, _why(field.name, key)))
            continue
        if field.name in _PRESENCE:
            found.append((label, _why(field.name, key)))
            continue
        items: list[tuple[str, Any]]
        if is_map:
            items = [(f"{label}[{k!r}]", v) for k, v in value.items()]
        elif repeated:
            items = [(f"{label}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(label, value)]
        known = pattern == "response_cache" or any(h.startswith(pattern + ".") for h in HONOURED | HINTS)
        for item_label, item in items:
            if not known:
                if item.ListFields() or field.name in _PRESENCE:
                    found.append((item_label, _why(field.name, key)))
                continue
            _walk(item, pattern, item_label, found)


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6.31; `label` is deprecated there
    return bool(flag) if flag is not None else bool(field.label == field.LABEL_REPEATED)


def _why(name: str, key: str) -> str:
    return _WHY.get(name) or _WHY.get(key.split(".")[0]) or "not supported by StreamRT"


def message_json(message: Any) -> dict[str, Any]:
    """Triton's JSON form of a message: proto field names, every field printed (defaults too),
    64-bit integers as numbers (protobuf's JSON writes them as strings; Triton does not)."""
    from google.protobuf import json_format

    try:
        data = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf < 5.26 spells the option differently
        data = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         including_default_value_fields=True)
    return _numbers(data, message.DESCRIPTOR)


_WIDE = {3, 4, 6, 16, 18}  # FieldDescriptor types int64, uint64, fixed64, sfixed64, sint64


def _numbers(data: Any, descriptor: Any) -> Any:
    if not isinstance(data, dict):
        return data
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            inner = field.message_type.fields_by_name["value"]
            if inner.message_type is not None:
                data[name] = {k: _numbers(v, inner.message_type) for k, v in value.items()}
        elif field.message_type is not None:
            data[name] = [_numbers(v, field.message_type) for v in value] if isinstance(value, list) \
                else _numbers(value, field.message_type)
        elif field.type in _WIDE:
            data[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return data
