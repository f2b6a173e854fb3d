"""Tensor descriptions shared by every layer: dtypes, tensor specs and shape profiles.

The dtype table is the single place that maps names between ONNX, NumPy, torch, TensorRT and
the KServe v2 protocol; nothing else in StreamRT branches on dtype names.

Example:
    >>> spec = TensorSpec("images", DType.FLOAT32, (-1, 3, 224, 224))
    >>> profile = ShapeProfile({"images": ShapeRange((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))})
    >>> profile.accepts({"images": (4, 3, 224, 224)})
    True
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrt._optional import require
from streamrt.errors import ConfigError

__all__ = ["DType", "Shape", "ShapeProfile", "ShapeRange", "TensorSpec", "format_shape", "parse_shape"]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class _DTypeInfo:
    numpy: str
    onnx: int  # onnx.TensorProto enum value
    torch: str
    tensorrt: str
    kserve: str


class DType(enum.Enum):
    """Element types StreamRT moves between frameworks.

    Each member's value is its canonical lower-case name; the conversion tables hang off it.
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    BOOL = "bool"
    BYTES = "bytes"

    @property
    def info(self) -> _DTypeInfo:
        return _TABLE[self]

    @property
    def numpy(self) -> np.dtype[Any]:
        """The NumPy dtype (bfloat16 maps to ml_dtypes' bfloat16 when that package is present)."""
        if self is DType.BFLOAT16:
            # ml_dtypes ships with onnx, a core dependency
            return np.dtype(require("ml_dtypes", extra="core", purpose="bfloat16 arrays").bfloat16)
        return np.dtype(self.info.numpy)

    @property
    def itemsize(self) -> int:
        return 2 if self is DType.BFLOAT16 else self.numpy.itemsize

    @property
    def onnx(self) -> int:
        return self.info.onnx

    @property
    def torch(self) -> Any:
        """The torch dtype (imports torch)."""
        import torch

        return getattr(torch, self.info.torch)

    @property
    def kserve(self) -> str:
        return self.info.kserve

    @classmethod
    def from_any(cls, value: Any) -> DType:
        """Convert a NumPy/torch dtype, an ONNX element type, a KServe name or a plain name.

        NumPy dtypes are looked up once each: serving converts an output's dtype per request
        (the Python backend's response check), and the walk over the tables costs ~3.6 us."""
        if isinstance(value, DType):
            return value
        if isinstance(value, np.dtype):
            known = _OF_NUMPY.get(value)
            if known is None:
                known = cls._lookup(value)
                if len(_OF_NUMPY) < 64:
                    _OF_NUMPY[value] = known
            return known
        return cls._lookup(value)

    @classmethod
    def _lookup(cls, value: Any) -> DType:
        if isinstance(value, int) and not isinstance(value, bool):
            for dtype, info in _TABLE.items():
                if info.onnx == value:
                    return dtype
            raise ConfigError(f"unsupported ONNX element type {value}")
        text = str(value)
        if text.startswith("torch."):
            text = text[len("torch.") :]
        key = text.lower()
        for dtype, info in _TABLE.items():
            names = (dtype.value, info.kserve.lower(), info.torch, info.tensorrt.lower())
            if key in (n for n in names if n):
                return dtype
        try:
            np_name = np.dtype(value).name
        except TypeError:
            np_name = ""
        for dtype, info in _TABLE.items():
            if np_name and np_name == info.numpy:
                return dtype
        if np_name == "bfloat16":
            return DType.BFLOAT16
        if key in ("string", "str") or (np_name and np.dtype(value).kind in "SU"):
            return DType.BYTES
        raise ConfigError(f"unsupported dtype {value!r}; known: {', '.join(d.value for d in cls)}")


_OF_NUMPY: dict[np.dtype[Any], DType] = {}
"""NumPy dtypes :meth:`DType.from_any` converted (at most 64: a few are ever in use)."""

_TABLE: dict[DType, _DTypeInfo] = {
    DType.FLOAT32: _DTypeInfo("float32", 1, "float32", "FLOAT", "FP32"),
    DType.FLOAT16: _DTypeInfo("float16", 10, "float16", "HALF", "FP16"),
    DType.BFLOAT16: _DTypeInfo("bfloat16", 16, "bfloat16", "BF16", "BF16"),
    DType.FLOAT64: _DTypeInfo("float64", 11, "float64", "DOUBLE", "FP64"),
    DType.INT8: _DTypeInfo("int8", 3, "int8", "INT8", "INT8"),
    DType.UINT8: _DTypeInfo("uint8", 2, "uint8", "UINT8", "UINT8"),
    DType.INT16: _DTypeInfo("int16", 5, "int16", "INT16", "INT16"),
    DType.INT32: _DTypeInfo("int32", 6, "int32", "INT32", "INT32"),
    DType.INT64: _DTypeInfo("int64", 7, "int64", "INT64", "INT64"),
    DType.UINT16: _DTypeInfo("uint16", 4, "uint16", "UINT16", "UINT16"),
    DType.UINT32: _DTypeInfo("uint32", 12, "uint32", "UINT32", "UINT32"),
    DType.UINT64: _DTypeInfo("uint64", 13, "uint64", "UINT64", "UINT64"),
    DType.BOOL: _DTypeInfo("bool", 9, "bool", "BOOL", "BOOL"),
    # Variable-length byte strings (ONNX STRING, Triton TYPE_STRING): NumPy object arrays of bytes.
    DType.BYTES: _DTypeInfo("object", 8, "", "", "BYTES"),
}


def format_shape(shape: Iterable[int]) -> str:
    """``(1, 3, -1)`` -> ``'1x3x?'``, the notation the CLI and messages use."""
    return "x".join("?" if d < 0 else str(d) for d in shape)


def parse_shape(text: str) -> Shape:
    """``'1x3x224x224'`` -> ``(1, 3, 224, 224)``; ``?`` or ``-1`` mark a dynamic dimension."""
    try:
        return tuple(-1 if part in ("?", "-1") else int(part) for part in text.strip().split("x"))
    except ValueError as exc:
        raise ConfigError(f"bad shape {text!r}: expected dimensions joined by 'x', e.g. 1x3x224x224") from exc


@dataclass(frozen=True)
class ShapeRange:
    """min/opt/max shape of one input. ``opt`` is the shape kernels are tuned for.

    ``multiple`` optionally constrains each dimension to a multiple of a number (``()`` or all
    ones: no constraint), for models that only run at some sizes, e.g. a stride-32 detector
    whose skip connections need heights and widths divisible by 32:
    ``ShapeRange((1, 3, 320, 320), (1, 3, 640, 640), (1, 3, 1280, 1280), multiple=(1, 1, 32, 32))``.
    """

    min: Shape
    opt: Shape
    max: Shape
    multiple: Shape = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "min", tuple(int(d) for d in self.min))
        object.__setattr__(self, "opt", tuple(int(d) for d in self.opt))
        object.__setattr__(self, "max", tuple(int(d) for d in self.max))
        multiple = tuple(int(d) for d in self.multiple)
        # All ones says nothing: store it as () so equal constraints compare (and hash) equal.
        object.__setattr__(self, "multiple", multiple if any(m != 1 for m in multiple) else ())

    @classmethod
    def fixed(cls, shape: Iterable[int]) -> ShapeRange:
        s = tuple(shape)
        return cls(s, s, s)

    @property
    def multiples(self) -> Shape:
        """The multiple-of constraint of each dimension (1 where there is none)."""
        return self.multiple or (1,) * len(self.min)

    def contains(self, shape: Iterable[int]) -> bool:
        """Whether ``shape`` is within min..max and meets the multiple-of constraint."""
        s = tuple(shape)
        return (
            len(s) == len(self.min)
            and all(lo <= d <= hi for d, lo, hi in zip(s, self.min, self.max, strict=True))
            and self.violation(s) is None
        )

    def violation(self, shape: Iterable[int]) -> tuple[int, int] | None:
        """``(dimension, multiple)`` of the first dimension of ``shape`` that breaks the multiple-of rule."""
        for dim, (d, m) in enumerate(zip(tuple(shape), self.multiples, strict=False)):
            if d % m:
                return dim, m
        return None

    def describe(self) -> str:
        text = f"min {format_shape(self.min)}, opt {format_shape(self.opt)}, max {format_shape(self.max)}"
        return text + (f", multiple of {format_shape(self.multiple)}" if self.multiple else "")

    def to_dict(self) -> dict[str, list[int]]:
        data = {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}
        if self.multiple:
            data["multiple"] = list(self.multiple)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Iterable[int]]) -> ShapeRange:
        unknown = sorted(set(data) - {"min", "opt", "max", "multiple"})
        if unknown:
            raise ConfigError(f"unknown shape range keys {unknown}; known: max, min, multiple, opt")
        return cls(tuple(data["min"]), tuple(data["opt"]), tuple(data["max"]), tuple(data.get("multiple", ())))


@dataclass(frozen=True)
class ShapeProfile:
    """One optimization profile: a :class:`ShapeRange` per dynamic input."""

    ranges: Mapping[str, ShapeRange] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.ranges.items())))

    def accepts(self, shapes: Mapping[str, Iterable[int]]) -> bool:
        return all(name not in shapes or r.contains(shapes[name]) for name, r in self.ranges.items())

    def to_dict(self) -> dict[str, dict[str, list[int]]]:
        return {name: r.to_dict() for name, r in self.ranges.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Iterable[int]]]) -> ShapeProfile:
        return cls({name: ShapeRange.from_dict(r) for name, r in data.items()})


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one engine input or output; ``-1`` marks a dynamic dimension."""

    name: str
    dtype: DType
    shape: Shape

    @property
    def is_dynamic(self) -> bool:
        return any(d < 0 for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.value, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(str(data["name"]), DType.from_any(data["dtype"]), tuple(int(d) for d in data["shape"]))
