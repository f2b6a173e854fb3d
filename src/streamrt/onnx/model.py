"""Loading, checking and describing ONNX models.

Example:
    >>> model = load_model("resnet.onnx")                    # doctest: +SKIP
    >>> [t.name for t in model.inputs], model.opset          # doctest: +SKIP
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from streamrt.errors import InvalidModelError, ModelNotFoundError
from streamrt.types import DType, TensorSpec

__all__ = ["OnnxModel", "load_model", "model_from_proto", "subgraphs", "tensor_specs"]

# Models above 2 GiB keep their weights in external files; the checker must then get a path.
_PROTOBUF_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class OnnxModel:
    """A checked ONNX model with the facts StreamRT needs about it.

    Attributes:
        proto: the parsed model.
        data: the serialized bytes (the source of ``sha256``).
        sha256: SHA-256 of ``data``; identifies the model in plans and caches.
        path: where it was read from (``None`` for in-memory models).
    """

    proto: onnx.ModelProto
    data: bytes
    sha256: str
    path: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name if self.path else (self.proto.graph.name or "model")

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return tensor_specs(self.proto, "input")

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tensor_specs(self.proto, "output")

    @property
    def opset(self) -> int:
        for imp in self.proto.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return int(imp.version)
        return 0

    def op_histogram(self) -> dict[str, int]:
        """Node count per op type (including subgraphs), most frequent first."""
        counts: collections.Counter[str] = collections.Counter()
        stack = [self.proto.graph]
        while stack:
            graph = stack.pop()
            for node in graph.node:
                counts[node.op_type if not node.domain else f"{node.domain}::{node.op_type}"] += 1
                stack.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
        return dict(counts.most_common())

    def metadata(self) -> dict[str, str]:
        return {p.key: p.value for p in self.proto.metadata_props}

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: what ``streamrt inspect MODEL.onnx --json`` prints."""
        return {
            "kind": "onnx",
            "path": str(self.path) if self.path else None,
            "sha256": self.sha256,
            "ir_version": int(self.proto.ir_version),
            "opset": self.opset,
            "producer": f"{self.proto.producer_name} {self.proto.producer_version}".strip(),
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "nodes": sum(self.op_histogram().values()),
            "op_histogram": self.op_histogram(),
            "metadata": self.metadata(),
        }


def _initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {init.name for init in graph.initializer}


def tensor_specs(model: onnx.ModelProto, which: str) -> tuple[TensorSpec, ...]:
    """Graph inputs (without initializers) or outputs as TensorSpecs; symbolic dims become -1."""
    graph = model.graph
    values = graph.input if which == "input" else graph.output
    skip = _initializer_names(graph) if which == "input" else set()
    specs = []
    for value in values:
        if value.name in skip:
            continue
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise InvalidModelError(
                f"{which} '{value.name}' is not a tensor; StreamRT supports tensor IO only"
            )
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim)
        specs.append(TensorSpec(value.name, DType.from_any(int(ttype.elem_type)), dims))
    return tuple(specs)


def model_from_proto(proto: onnx.ModelProto, path: Path | None = None, *, check: bool = True) -> OnnxModel:
    """Wrap an in-memory model (checking it) the same way :func:`load_model` wraps a file."""
    data = proto.SerializeToString()
    if check:
        _check(proto, path)
    return OnnxModel(proto=proto, data=data, sha256=hashlib.sha256(data).hexdigest(), path=path)


def _check(proto: onnx.ModelProto, path: Path | None) -> None:
    where = str(path) if path else "model"
    try:
        if proto.ByteSize() > _PROTOBUF_LIMIT and path is not None:
            onnx.checker.check_model(str(path))
        else:
            onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise InvalidModelError(
            f"{where} fails the ONNX checker: {first}",
            hint="re-export the model, or fix it with onnx.checker",
        ) from exc
    if not proto.graph.output:
        raise InvalidModelError(f"{where} has no graph outputs")


def load_model(path: str | Path, *, check: bool = True) -> OnnxModel:
    """Read and check an ONNX file.

    Raises:
        ModelNotFoundError: the file does not exist.
        InvalidModelError: the file is not ONNX, or fails the ONNX checker.
    """
    p = Path(path)
    if not p.is_file():
        raise ModelNotFoundError(f"model file not found: {p}", hint="check the path")
    data = p.read_bytes()
    try:
        proto = onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeWarning-like errors
        raise InvalidModelError(f"{p} is not an ONNX model ({type(exc).__name__}: {exc})") from exc
    if not proto.graph.node and not proto.graph.output:
        # protobuf parses many random byte strings as an empty message
        raise InvalidModelError(f"{p} is not an ONNX model (no graph found)")
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer):
        onnx.load_external_data_for_model(proto, str(p.parent))
    if check:
        _check(proto, p)
    return OnnxModel(proto=proto, data=data, sha256=hashlib.sha256(data).hexdigest(), path=p)


def subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in its nodes' attributes (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from subgraphs(attr.g)
            for sub in attr.graphs:
                yield from subgraphs(sub)
