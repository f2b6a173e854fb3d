"""Values that flow between nodes of the interpreted ONNX graph.

A value is either a ``torch.Tensor`` or a :class:`ShapeValue`: a small 0-D or 1-D value whose
elements are known while tracing, as Python numbers or ``torch.SymInt``/``SymFloat``. Shape
values come from ``Shape``/``Size`` and from small constants, and stay Python values through the
usual shape arithmetic (``Gather``, ``Slice``, ``Concat``, ``Cast``, ``Add``...). That is what
keeps ``Shape -> Gather -> Concat -> Reshape`` chains free of data-dependent tensor ops under
``torch.export``: the reshape target is a tuple of SymInts, not the contents of a traced tensor.
A shape value becomes a tensor only when a real tensor op consumes it (:func:`to_tensor`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import onnx
import torch

from streamrt.errors import InvalidModelError
from streamrt.types import DType

__all__ = [
    "SHAPE_VALUE_MAX_ELEMENTS",
    "SUB_BYTE_CONTAINERS",
    "Scalar",
    "ShapeValue",
    "Value",
    "dtype_of",
    "is_float_dtype",
    "numpy_to_torch",
    "onnx_to_torch_dtype",
    "py_cast",
    "rank_of",
    "shape_of",
    "static_floats",
    "static_ints",
    "to_tensor",
    "torch_to_onnx_type",
    "widen_unsigned",
]

Scalar: TypeAlias = "int | float | bool | torch.SymInt | torch.SymFloat | torch.SymBool"

#: Constants with at most this many elements (and rank <= 1) are also kept as Python values.
SHAPE_VALUE_MAX_ELEMENTS = 64


@dataclass(frozen=True, eq=False)
class ShapeValue:
    """A 0-D or 1-D value whose elements are known at trace time.

    Attributes:
        items: The elements, Python numbers or symbolic sizes.
        dtype: The torch dtype the value has in the ONNX graph (``int64`` for shapes).
        scalar: ``True`` for a 0-D value (then ``items`` has exactly one element).
        backing: A buffer holding the same data, used instead of building a new tensor
            when a tensor op consumes the value (set for initializers and constants).
    """

    items: tuple[Any, ...]
    dtype: torch.dtype
    scalar: bool = False
    backing: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.scalar else (len(self.items),)

    @property
    def is_static(self) -> bool:
        """Whether every element is a plain Python number (no symbolic size)."""
        return all(isinstance(v, int | float | bool) for v in self.items)

    def with_items(self, items: Sequence[Any], dtype: torch.dtype | None = None, *, scalar: bool = False) -> ShapeValue:
        """A new shape value (without backing buffer) with other elements."""
        return ShapeValue(tuple(items), dtype or self.dtype, scalar)


Value: TypeAlias = "torch.Tensor | ShapeValue"

# ONNX element types torch has but StreamRT's DType table does not carry (it lists what engines
# exchange at their boundaries); only graph-internal values use these.
_EXTRA_ONNX_TO_TORCH: dict[int, torch.dtype] = {
    4: torch.uint16,
    12: torch.uint32,
    13: torch.uint64,
    14: torch.complex64,
    15: torch.complex128,
    17: torch.float8_e4m3fn,
    18: torch.float8_e4m3fnuz,
    19: torch.float8_e5m2,
    20: torch.float8_e5m2fnuz,
    24: torch.float8_e8m0fnu,
    # Sub-byte types have no torch dtype: they travel in a container holding the same values
    # (see narrow.py). UINT4, INT4, FLOAT4E2M1, UINT2, INT2:
    21: torch.uint8,
    22: torch.int8,
    23: torch.float32,
    25: torch.uint8,
    26: torch.int8,
}

# Same-width integer views for element types NumPy only knows through ml_dtypes.
_VIEW_AS: dict[str, np.dtype[Any]] = {
    "bfloat16": np.dtype(np.uint16),
    "float8_e4m3fn": np.dtype(np.uint8),
    "float8_e4m3fnuz": np.dtype(np.uint8),
    "float8_e5m2": np.dtype(np.uint8),
    "float8_e5m2fnuz": np.dtype(np.uint8),
    "float8_e8m0fnu": np.dtype(np.uint8),
}
_ML_TO_TORCH: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e4m3fnuz": torch.float8_e4m3fnuz,
    "float8_e5m2": torch.float8_e5m2,
    "float8_e5m2fnuz": torch.float8_e5m2fnuz,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
}
#: ml_dtypes sub-byte NumPy types -> the NumPy dtype of their torch container.
SUB_BYTE_CONTAINERS: dict[str, np.dtype[Any]] = {
    "int4": np.dtype(np.int8),
    "uint4": np.dtype(np.uint8),
    "int2": np.dtype(np.int8),
    "uint2": np.dtype(np.uint8),
    "float4_e2m1fn": np.dtype(np.float32),
}

_FLOAT_DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    | {torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz, torch.float8_e8m0fnu}
)


def onnx_to_torch_dtype(elem_type: int) -> torch.dtype:
    """Map an ONNX ``TensorProto`` element type to a torch dtype.

    Sub-byte types map to their container dtype (see :mod:`.narrow`).

    Raises:
        InvalidModelError: For element types torch cannot hold (strings, undefined...).
    """
    extra = _EXTRA_ONNX_TO_TORCH.get(elem_type)
    if extra is not None:
        return extra
    try:
        return DType.from_any(int(elem_type)).torch
    except Exception as exc:
        name = (
            onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type
        )
        raise InvalidModelError(f"ONNX element type {name} has no torch equivalent") from exc


def torch_to_onnx_type(dtype: torch.dtype) -> int:
    """The ONNX element type a torch dtype stands for (containers map to their own dtype)."""
    for elem_type, extra in _EXTRA_ONNX_TO_TORCH.items():
        if extra == dtype and elem_type not in _CONTAINER_TYPES:
            return elem_type
    return DType.from_any(dtype).onnx


_CONTAINER_TYPES = frozenset({21, 22, 23, 25, 26})


def numpy_to_torch(array: np.ndarray) -> torch.Tensor:
    """Copy a NumPy array into a new torch tensor (ml_dtypes bfloat16/float8 included, sub-byte
    types into their container dtype)."""
    name = array.dtype.name
    container = SUB_BYTE_CONTAINERS.get(name)
    if container is not None:
        return torch.from_numpy(np.asarray(array).astype(container))
    view = _VIEW_AS.get(name)
    if view is not None:
        raw = torch.from_numpy(np.ascontiguousarray(array).view(view).copy())
        return raw.view(_ML_TO_TORCH[name])
    if array.dtype.kind in "US" or array.dtype == object:
        raise InvalidModelError(f"tensors of dtype {array.dtype} (strings) are not supported by the torch importer")
    return torch.from_numpy(np.array(array, copy=True))


def is_float_dtype(dtype: torch.dtype) -> bool:
    return dtype in _FLOAT_DTYPES


_UNSIGNED_WIDE = frozenset({torch.uint16, torch.uint32, torch.uint64})


def _widen(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint64:
        return t.view(torch.int64)
    return t.to(torch.int64) if t.dtype in _UNSIGNED_WIDE else t


def widen_unsigned(fn: Any, *xs: torch.Tensor) -> torch.Tensor:
    """Run ``fn`` on uint16/32/64 tensors through int64 (torch has few kernels for them).

    uint64 travels bit-for-bit as int64, so wrapping add/sub/mul are exact; ordering, division
    and right shifts are only right below 2**63.
    """
    if not any(t.dtype in _UNSIGNED_WIDE for t in xs):
        return fn(*xs)
    wide = [_widen(t) for t in xs]
    out: torch.Tensor = fn(*wide)
    first = xs[0].dtype
    if first not in _UNSIGNED_WIDE or out.dtype == torch.bool or out.dtype.is_floating_point:
        return out
    return out.view(torch.uint64) if first == torch.uint64 else out.to(first)


def dtype_of(value: Value) -> torch.dtype:
    return value.dtype


def shape_of(value: Value) -> tuple[Any, ...]:
    """The shape (ints or SymInts) of a tensor or shape value."""
    if isinstance(value, ShapeValue):
        return value.shape
    return tuple(value.shape)


def rank_of(value: Value) -> int:
    return len(shape_of(value))


def py_cast(item: Any, dtype: torch.dtype) -> Any:
    """Convert one Python/symbolic element the way ONNX ``Cast`` converts it to ``dtype``."""
    if dtype == torch.bool:
        return item != 0 if not isinstance(item, bool) else item
    if is_float_dtype(dtype):
        if isinstance(item, torch.SymInt):
            return torch.sym_float(item)
        return float(item)
    if isinstance(item, torch.SymFloat):
        return torch.sym_int(item)
    if isinstance(item, float):
        if math.isnan(item) or math.isinf(item):
            return 0
        return int(item)  # truncation toward zero, as ONNX Cast does
    if isinstance(item, bool):
        return int(item)
    return item


def to_tensor(value: Value, device: torch.device | None = None) -> torch.Tensor:
    """Return ``value`` as a tensor, building one from a shape value if needed."""
    if isinstance(value, torch.Tensor):
        return value
    if value.backing is not None:
        return value.backing
    if value.scalar:
        item = value.items[0]
        if isinstance(item, int | float | bool):
            return torch.tensor(item, dtype=value.dtype, device=device)
        return torch.scalar_tensor(item, dtype=value.dtype, device=device)
    return torch.tensor(list(value.items), dtype=value.dtype, device=device)


def _static_items(value: Value) -> list[Any]:
    if isinstance(value, ShapeValue):
        return list(value.items)
    # Eager fallback: a computed tensor used where ONNX needs values (shape, pads, scales...).
    # Under torch.export this is a data-dependent read and fails there, by design.
    flat = value.detach().reshape(-1)
    return list(flat.tolist())


def static_ints(value: Value) -> list[Any]:
    """Elements of a 0-D/1-D integer value as Python ints or SymInts."""
    return [v if isinstance(v, torch.SymInt) else int(v) for v in _static_items(value)]


def static_floats(value: Value) -> list[Any]:
    """Elements of a 0-D/1-D numeric value as Python floats or SymFloats."""
    out: list[Any] = []
    for v in _static_items(value):
        if isinstance(v, torch.SymInt):
            out.append(torch.sym_float(v))
        elif isinstance(v, torch.SymFloat):
            out.append(v)
        else:
            out.append(float(v))
    return out
