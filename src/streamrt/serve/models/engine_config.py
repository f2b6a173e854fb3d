"""An engine model's config resolved against its engine (what Triton calls auto-complete, plus checks).

:func:`resolve_config` fills in ``max_batch_size``, inputs and outputs from the engine's specs and
shape profiles when the config leaves them out, and refuses a config that contradicts the engine
(names, datatypes, dims, a batch size beyond the profiles, batching settings, sequence controls).
"""

from __future__ import annotations

from streamrt.backends.base import Engine
from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ModelConfig, TensorConfig
from streamrt.serve.scheduling.sequence import check_sequence_io
from streamrt.types import TensorSpec, format_shape

__all__ = ["resolve_config"]


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
