"""The shape profile of an ONNX model whose inputs have dynamic dims the config leaves open.

Triton's ONNX Runtime backend serves ``dims: [-1]`` without a profile; StreamRT builds every
model with profiles (the compiled backends need them). When a config gives none (``build:
profiles`` or the ``min_shapes``/``opt_shapes``/``max_shapes`` parameters) and an input has a
dynamic dimension other than the batch dimension, the profile is derived: the batch dimension
spans 1..``max_batch_size``, a dimension the config fixes takes that value, and every other
dynamic dimension spans 1..:data:`DYNAMIC_DIM_MAX` (opt 1). Requests outside it are refused
with the profile in the message; give ``max_shapes`` to serve larger ones.

Example:
    >>> from streamrt.types import DType, TensorSpec
    >>> from streamrt.serve.configs.config import ModelConfig
    >>> p = derive_profile(ModelConfig("m", max_batch_size=8), [TensorSpec("x", DType.BYTES, (-1, -1))])
    >>> p.ranges["x"].max
    (8, 4096)
"""

from __future__ import annotations

from collections.abc import Sequence

from streamrt.onnx.profiles import DEFAULT_MAX_BATCH
from streamrt.serve.configs.config import ModelConfig
from streamrt.types import ShapeProfile, ShapeRange, TensorSpec

__all__ = ["DYNAMIC_DIM_MAX", "derive_profile"]

DYNAMIC_DIM_MAX = 4096
"""Largest size of a derived dynamic (non-batch) dimension."""


def derive_profile(config: ModelConfig, inputs: Sequence[TensorSpec]) -> ShapeProfile | None:
    """A profile covering every dynamic input, or None when only batch dims are dynamic
    (the default batch profile handles those) or the config gives profiles."""
    if config.build.profiles:
        return None
    batched = config.max_batch_size is None or config.max_batch_size > 0
    lead = 1 if batched else 0

    def open_dims(spec: TensorSpec) -> list[int]:
        return [i for i, d in enumerate(spec.shape) if d < 0 and i >= lead]

    if not any(open_dims(s) for s in inputs):
        return None
    given = {t.name: t.model_dims for t in config.input}
    max_batch = config.max_batch_size or DEFAULT_MAX_BATCH
    ranges = {}
    for spec in inputs:
        if not spec.is_dynamic:
            continue
        dims: list[tuple[int, int, int]] = []
        for i, dim in enumerate(spec.shape):
            fixed = given.get(spec.name)
            configured = fixed[i - lead] if fixed is not None and 0 <= i - lead < len(fixed) else -1
            if dim >= 0 or configured >= 0:
                size = dim if dim >= 0 else configured
                dims.append((size, size, size))
            elif i < lead:
                dims.append((1, max_batch, max_batch))
            else:
                dims.append((1, 1, DYNAMIC_DIM_MAX))
        lo, opt, hi = (tuple(d[k] for d in dims) for k in range(3))
        ranges[spec.name] = ShapeRange(lo, opt, hi)
    return ShapeProfile(ranges)
