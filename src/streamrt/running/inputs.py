"""Inputs for an engine: shapes to run at, fresh random data, or data loaded from an ``.npz`` file.

Benchmarks and comparisons never run on zeros (kernels can take fast paths on them and
mismatches hide behind them): floats come from a normal or uniform distribution, integers are
small non-negative values (safe as indices), booleans are random.

Shapes default to the opt shapes of the first profile, which is what the engine's kernels
were tuned for; ``batch`` overrides the leading dimension of every dynamic-batch input and
``shapes`` override whole inputs (``--shapes name:1x3x224x224`` on the CLI).

Example:
    >>> shapes = resolve_shapes(engine.inputs, engine.profiles, batch=8)       # doctest: +SKIP
    >>> feeds = random_inputs(engine.inputs, shapes, np.random.default_rng(0))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.errors import (
    ConfigError,
    DTypeMismatchError,
    InputError,
    MissingInputError,
    ShapeError,
    UnknownInputError,
)
from streamrt.onnx.profiles import check_shapes
from streamrt.types import DType, Shape, ShapeProfile, TensorSpec, format_shape

__all__ = [
    "DISTRIBUTIONS",
    "batch_size",
    "cast_inputs",
    "default_shapes",
    "load_inputs",
    "random_inputs",
    "resolve_shapes",
    "shapes_of",
    "to_device",
    "to_numpy",
]

log = logging.getLogger(__name__)

DISTRIBUTIONS = ("normal", "uniform")
_SMALL_INT = 8  # integers are drawn from [0, _SMALL_INT): valid indices for almost any table
_FLOATS = frozenset({DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64})


def default_shapes(specs: Sequence[TensorSpec], profiles: Sequence[ShapeProfile], profile: int = 0) -> dict[str, Shape]:
    """Opt shapes of profile ``profile`` for dynamic inputs, the model's shape for static ones.

    Raises:
        ShapeError: a dynamic input has no range in that profile (or there is no such profile).
    """
    if profiles and not 0 <= profile < len(profiles):
        raise ShapeError(f"profile index {profile} out of range; the engine has {len(profiles)} profiles")
    ranges = profiles[profile].ranges if profiles else {}
    shapes: dict[str, Shape] = {}
    for spec in specs:
        rng = ranges.get(spec.name)
        if rng is not None:
            shapes[spec.name] = tuple(rng.opt)
        elif spec.is_dynamic:
            raise ShapeError(
                f"input '{spec.name}' ({format_shape(spec.shape)}) is dynamic and profile {profile} gives no "
                "shape for it",
                hint=f"pass --shapes {spec.name}:...",
            )
        else:
            shapes[spec.name] = tuple(spec.shape)
    return shapes


def resolve_shapes(
    specs: Sequence[TensorSpec],
    profiles: Sequence[ShapeProfile],
    *,
    shapes: Mapping[str, Shape] | None = None,
    batch: int | None = None,
) -> dict[str, Shape]:
    """The shapes to run at: defaults, then ``batch``, then explicit ``shapes``; checked against the profiles.

    Args:
        specs: the engine's inputs.
        profiles: the engine's shape profiles.
        shapes: whole shapes for some inputs (they win over ``batch``).
        batch: leading dimension for every input whose leading dimension is dynamic.

    Raises:
        UnknownInputError: ``shapes`` names an input the engine does not have.
        ConfigError: ``batch`` < 1, or the engine has no dynamic batch dimension to set.
        ShapeError: a shape has the wrong rank, leaves a dimension unknown, contradicts a static
            dimension or lies outside every profile.
    """
    by_name = {s.name: s for s in specs}
    given = dict(shapes or {})
    for name in given:
        if name not in by_name:
            raise UnknownInputError(f"--shapes names input '{name}'; the engine's inputs are: {', '.join(by_name)}")
    profile = 0
    if given and profiles:
        # Pick the first profile that holds the explicit shapes, so defaults come from it.
        profile = next((i for i, p in enumerate(profiles) if p.accepts(given)), 0)
    try:
        out = default_shapes(specs, profiles, profile)
    except ShapeError:
        if any(s.is_dynamic and s.name not in given for s in specs):
            raise
        out = {s.name: tuple(s.shape) for s in specs}
    if batch is not None:
        if batch < 1:
            raise ConfigError(f"batch must be an integer >= 1, got {batch}")
        batched = [s.name for s in specs if s.shape and s.shape[0] < 0]
        if not batched:
            raise ConfigError(
                f"--batch {batch}: the engine has no dynamic batch dimension "
                f"(inputs: {', '.join(f'{s.name} {format_shape(s.shape)}' for s in specs)})",
                hint="use --shapes to set shapes of a static engine's inputs",
            )
        for name in batched:
            if name not in given:
                out[name] = (batch, *out[name][1:])
    out.update(given)
    for name, shape in out.items():
        spec = by_name[name]
        if len(shape) != len(spec.shape):
            raise ShapeError(
                f"input '{name}' needs rank {len(spec.shape)} ({format_shape(spec.shape)}), got {format_shape(shape)}"
            )
        for dim, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if got < 1:
                raise ShapeError(f"input '{name}' dimension {dim} must be given (>= 1), got {format_shape(shape)}")
            if want >= 0 and got != want:
                raise ShapeError(
                    f"input '{name}' dimension {dim} is static ({want}) in the engine, got {format_shape(shape)}"
                )
    if profiles:
        check_shapes(profiles, out)
    return out


def batch_size(specs: Sequence[TensorSpec], shapes: Mapping[str, Shape]) -> int:
    """Items per query: the leading dimension of the first dynamic-batch input.

    An engine without a dynamic batch dimension counts the leading dimension of its first
    input of rank >= 2 (a static ``8x3x224x224`` engine processes 8 items per query), else 1.
    """
    for spec in specs:
        if spec.shape and spec.shape[0] < 0:
            return int(shapes[spec.name][0])
    for spec in specs:
        if len(spec.shape) >= 2:
            return int(shapes[spec.name][0])
    return 1


def _random_float(rng: np.random.Generator, shape: Shape, distribution: str) -> np.ndarray:
    if distribution == "uniform":
        return rng.random(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32)


_GENERATORS: dict[DType, Callable[[np.random.Generator, Shape, str], np.ndarray]] = {
    DType.FLOAT32: _random_float,
    DType.FLOAT16: _random_float,
    DType.BFLOAT16: _random_float,
    DType.FLOAT64: lambda r, s, d: _random_float(r, s, d).astype(np.float64),
    DType.BOOL: lambda r, s, d: r.random(s) < 0.5,
    **{
        t: (lambda r, s, d: r.integers(0, _SMALL_INT, size=s))
        for t in (DType.INT8, DType.UINT8, DType.INT16, DType.INT32, DType.INT64, DType.UINT16, DType.UINT32,
                  DType.UINT64)
    },
    # strings of small decimal integers: what string-taking models (tokenizer ids, casts) accept
    DType.BYTES: lambda r, s, d: np.vectorize(lambda v: str(v).encode(), otypes=[object])(
        r.integers(0, _SMALL_INT, size=s)),
}


def random_inputs(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Shape],
    rng: np.random.Generator,
    *,
    distribution: str = "normal",
) -> dict[str, np.ndarray]:
    """Fresh random arrays for every input, in the engine's dtypes (never zeros).

    Args:
        specs: the engine's inputs.
        shapes: concrete shape per input (see :func:`resolve_shapes`).
        rng: the generator; a fixed seed reproduces the data.
        distribution: floats from ``"normal"`` (standard normal) or ``"uniform"`` ([0, 1)).
    """
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(shapes[spec.name])
        make = _GENERATORS[spec.dtype]
        out[spec.name] = np.ascontiguousarray(make(rng, shape, distribution).astype(spec.dtype.numpy))
    return out


def load_inputs(path: str | Path, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Read an ``.npz`` file whose keys are the engine's input names; check names, dtypes and ranks.

    Raises:
        InputError: the file is missing or is not an ``.npz`` archive.
        UnknownInputError / MissingInputError: the names do not match the engine's inputs.
        DTypeMismatchError: an array has another dtype than its input.
        ShapeError: an array has another rank than its input.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"inputs file not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as data:
            arrays = {name: np.ascontiguousarray(data[name]) for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(
            f"cannot read inputs from {p}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            hint="save inputs with numpy.savez(path, name=array, ...)",
        ) from exc
    if not arrays:
        raise InputError(f"{p} holds no arrays", hint="save inputs with numpy.savez(path, name=array, ...)")
    expected = {s.name: s for s in specs}
    for name in arrays:
        if name not in expected:
            raise UnknownInputError(
                f"{p} holds array '{name}', which is not an input; inputs are: {', '.join(expected)}"
            )
    for name, spec in expected.items():
        if name not in arrays:
            raise MissingInputError(
                f"{p} has no array for input '{name}' ({spec.dtype.value}, {format_shape(spec.shape)})"
            )
        got = DType.from_any(arrays[name].dtype)
        if got is not spec.dtype:
            raise DTypeMismatchError(
                f"{p}: array '{name}' has dtype {got.value}, the engine expects {spec.dtype.value}",
                hint=f"save it as {spec.dtype.value}",
            )
        if arrays[name].ndim != len(spec.shape):
            raise ShapeError(
                f"{p}: array '{name}' has shape {format_shape(arrays[name].shape)}, the engine expects rank "
                f"{len(spec.shape)} ({format_shape(spec.shape)})"
            )
    return {s.name: arrays[s.name] for s in specs}


def cast_inputs(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Cast float arrays to the float dtype each input expects (others pass through unchanged).

    Lets one set of inputs feed two engines whose float inputs differ (fp32 and an fp16 engine
    built without kept I/O types); integer and boolean inputs are never converted.
    """
    want = {s.name: s.dtype for s in specs}
    out: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        dtype = want.get(name)
        is_float = array.dtype.kind == "f" or array.dtype.name == "bfloat16"
        if dtype is not None and is_float and dtype in _FLOATS and DType.from_any(array.dtype) is not dtype:
            out[name] = array.astype(dtype.numpy)
        else:
            out[name] = array
    return out


def shapes_of(arrays: Mapping[str, Any]) -> dict[str, Shape]:
    """Shape of every array (NumPy arrays or torch tensors)."""
    return {name: tuple(int(d) for d in value.shape) for name, value in arrays.items()}


def to_device(arrays: Mapping[str, np.ndarray], device: str) -> dict[str, Any]:
    """Host arrays as the engine wants them: unchanged for ``"cpu"``, torch CUDA tensors for ``"cuda"``."""
    if device == "cpu":
        return dict(arrays)
    import torch

    return {name: torch.from_numpy(np.ascontiguousarray(a)).to(device) for name, a in arrays.items()}


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy array from an engine output (NumPy array, or torch tensor on any device)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):
        return np.asarray(value.detach().cpu().numpy())
    return np.asarray(value)
