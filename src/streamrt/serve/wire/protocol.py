"""KServe v2 requests and responses: the internal form, and its HTTP JSON / binary-data codec.

Both front ends turn what arrives into an :class:`InferRequest` (NumPy arrays by input name,
zero-copy views of the request body where the data is binary) and turn an
:class:`InferResponse` back into their wire form. The HTTP form is JSON, optionally followed by
raw tensors (the binary tensor data extension): ``Inference-Header-Content-Length`` gives the JSON
size; each binary input carries ``parameters.binary_data_size``; outputs are binary when asked
per output (``binary_data``) or per request (``binary_data_output``, what tritonclient sends).

Example:
    >>> body = b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'
    >>> req = decode_http_request(body, None, model="m", version="", max_elements=100)
    >>> req.inputs["x"].tolist()
    [[1.0, 2.0]]
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrt.errors import ConfigError, PayloadTooLargeError, RequestError, UnsupportedRequestError
from streamrt.serve.wire.bytes_tensor import deserialize_bytes, serialize_bytes
from streamrt.serve.wire.http_headers import (
    MAX_HEADER_BYTES,
    BinaryInput,
    BoundedTable,
    RequestLayout,
    without_request_id,
)
from streamrt.serve.wire.shared_memory import RegionRef, RegionSource, SharedMemoryRegistry, region_ref
from streamrt.types import DType

__all__ = [
    "InferRequest",
    "InferResponse",
    "RequestedOutput",
    "SequenceFlags",
    "decode_http_request",
    "deserialize_bytes",
    "encode_http_response",
    "json_values",
    "kserve_dtype",
    "numpy_dtype",
    "raw_bytes",
    "sequence_flags",
    "serialize_bytes",
    "tensor_from_bytes",
]

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class RequestedOutput:
    """An output the client asked for; ``binary`` None means "as the request says";
    ``class_count`` > 0 asks for the classification extension's top-k strings instead of the tensor;
    ``region``: write it to this shared-memory region instead of sending it."""

    name: str
    binary: bool | None = None
    class_count: int = 0
    region: RegionRef | None = None


@dataclass(frozen=True)
class SequenceFlags:
    """The sequence extension's request parameters: which sequence a request belongs to
    (``sequence_id``, uint64 or string) and whether it starts or ends it."""

    id: int | str
    start: bool = False
    end: bool = False


_MAX_STRING_ID = 128  # bytes, Triton's STRING_CORRELATION_ID_MAX_LENGTH_BYTES


def sequence_flags(params: dict[str, Any], where: str = "request") -> SequenceFlags | None:
    """The request's :class:`SequenceFlags` from its parameters; None when it names no sequence
    (no ``sequence_id``, or 0 / ``""``, which the extension reads as "not in a sequence").

    Raises:
        RequestError: an id that is not a uint64 or a string of at most 128 bytes, flags that are
            not booleans, or START/END without an id.
    """
    value = params.get("sequence_id", 0)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RequestError(f"{where}: parameter 'sequence_id' must be an unsigned integer or a string, got {value!r}")
    if isinstance(value, int) and not 0 <= value < 2**64:
        raise RequestError(f"{where}: parameter 'sequence_id' must be in 0..2**64-1, got {value}")
    if isinstance(value, str) and len(value.encode()) > _MAX_STRING_ID:
        raise RequestError(f"{where}: parameter 'sequence_id' has {len(value.encode())} bytes; "
                           f"string ids may have at most {_MAX_STRING_ID}")
    flags = {}
    for key in ("sequence_start", "sequence_end"):
        flag = params.get(key, False)
        if not isinstance(flag, bool):
            raise RequestError(f"{where}: parameter '{key}' must be a boolean, got {flag!r}")
        flags[key] = flag
    if value in (0, ""):
        if flags["sequence_start"] or flags["sequence_end"]:
            raise RequestError(f"{where}: sequence_start and sequence_end need a non-zero or non-empty sequence_id")
        return None
    return SequenceFlags(value, flags["sequence_start"], flags["sequence_end"])


@dataclass(eq=False)
class InferRequest:
    """One inference request, protocol-independent.

    Attributes:
        model / version: target ("" = the default version).
        id: the client's request id, echoed in the response.
        inputs: arrays by input name, shapes as sent (batch dim included when the model batches).
        outputs: requested outputs (empty: all, in the model's order).
        binary_output: request-level ``binary_data_output``.
        priority: 0 = the model's default level, 1 = highest.
        timeout_us: queue timeout asked by the client (0: the model's default).
        received_ns: ``time.perf_counter_ns()`` when the front end received it.
        leases: shared-memory regions this request reads or writes (released once it is answered).
        outputs_on_device: return outputs a CUDA instance computed as device tensors
            (:class:`~streamrt.serve.wire.shared_memory.DeviceTensor`) instead of host arrays; set by
            ensembles for steps that feed only other steps, never by the front ends.
        sequence: the sequence it belongs to (the sequence extension); None: not in a sequence.
        trace_parent: the caller's W3C ``traceparent`` (HTTP header or gRPC metadata), for
            OpenTelemetry tracing; None when it sent none.
    """

    model: str
    version: str = ""
    id: str = ""
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: tuple[RequestedOutput, ...] = ()
    binary_output: bool = False
    priority: int = 0
    timeout_us: int = 0
    received_ns: int = field(default_factory=time.perf_counter_ns)
    leases: list[Any] = field(default_factory=list)
    outputs_on_device: bool = False
    sequence: SequenceFlags | None = None
    trace_parent: str | None = None


@dataclass(eq=False)
class InferResponse:
    """Outputs of one request, in the order they go on the wire; ``in_shared_memory``: the outputs
    already written to shared memory (only their description goes on the wire)."""

    model: str
    version: str
    id: str
    outputs: dict[str, np.ndarray]
    in_shared_memory: dict[str, RegionRef] = field(default_factory=dict)


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """KServe datatype name (``"FP32"``) -> little-endian NumPy dtype (looked up once per name).

    BYTES maps to NumPy ``object`` (arrays of ``bytes``), as tritonclient's ``np.object_``.

    Raises:
        RequestError: unknown names.
    """
    known = _NUMPY_OF.get(datatype)
    if known is not None:
        return known
    if datatype == "BYTES":
        return np.dtype(object)
    try:
        dtype = DType.from_any(datatype).numpy.newbyteorder("<")
    except ConfigError:
        raise RequestError(f"unknown datatype {datatype!r}; known: {', '.join(d.kserve for d in DType)}") from None
    if isinstance(datatype, str) and len(_NUMPY_OF) < 64:
        _NUMPY_OF[datatype] = dtype
    return dtype


def kserve_dtype(array: Any) -> str:
    """NumPy array (or anything with a NumPy ``dtype``) -> KServe datatype name (object and string
    arrays are BYTES)."""
    name = _KSERVE_OF.get(array.dtype)
    if name is None:
        name = DType.from_any(array.dtype).kserve
        if len(_KSERVE_OF) < 64:
            _KSERVE_OF[array.dtype] = name
    return name


# Per-request lookups of the dtype tables (DType.from_any walks them) cost ~5% of a small request.
_NUMPY_OF: dict[str, np.dtype[Any]] = {}
_KSERVE_OF: dict[np.dtype[Any], str] = {}


def json_values(array: np.ndarray) -> list[Any]:
    """A tensor's values for JSON ``data``: BYTES elements as strings (UTF-8), numbers as numbers."""
    if array.dtype == object or array.dtype.kind in "SU":
        return [item.decode("utf-8", "replace") if isinstance(item, (bytes, np.bytes_)) else str(item)
                for item in array.reshape(-1)]
    if array.dtype.kind == "V" or array.dtype.name in ("float16", "bfloat16"):
        return array.astype(np.float32).ravel().tolist()
    return array.ravel().tolist()


def raw_bytes(array: np.ndarray) -> bytes | memoryview:
    """A tensor's binary wire form: BYTES length-prefixed, everything else its little-endian memory."""
    if array.dtype.kind in "OSU":  # (``dtype == object`` builds a dtype per call)
        return serialize_bytes(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.kind in "biufc" and array.size:  # the buffer protocol knows these: the cheapest byte view
        return array.data.cast("B")  # (memoryview refuses to cast a view with a 0 in its shape)
    return array.reshape(-1).view(np.uint8).data  # (bfloat16 and other ml_dtypes have no buffer format)


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise RequestError(f"{where}: 'shape' must be a list of integers, got {value!r}")
    if any(d < 0 for d in value):
        raise RequestError(f"{where}: shape dimensions must be >= 0, got {value}")
    return tuple(value)


def _elements(shape: tuple[int, ...], where: str, max_elements: int) -> int:
    count = math.prod(shape)
    if count > max_elements:
        raise PayloadTooLargeError(
            f"{where}: {count} elements exceed the server limit of {max_elements}",
            hint="send smaller batches, or start the server with a larger --max-tensor-elements",
        )
    return count


def tensor_from_bytes(
    data: bytes | memoryview, offset: int, datatype: str, shape: tuple[int, ...], where: str, max_elements: int
) -> np.ndarray:
    """A zero-copy array over ``data[offset:]`` of exactly ``shape`` (size already checked by the caller).

    BYTES is the exception: its elements are copied out of ``data[offset:]`` (all of it)."""
    dtype = numpy_dtype(datatype)
    count = _elements(shape, where, max_elements)
    if datatype == "BYTES":
        return deserialize_bytes(memoryview(data)[offset:], count, where).reshape(shape)
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)


def _tensor_from_json(value: Any, datatype: str, shape: tuple[int, ...], where: str, max_elements: int) -> np.ndarray:
    dtype = numpy_dtype(datatype)
    count = _elements(shape, where, max_elements)
    if datatype == "BYTES":
        flat = _flatten(value)
        if not all(isinstance(v, str) for v in flat):
            raise RequestError(f"{where}: BYTES 'data' must hold strings")
        array = np.empty(len(flat), dtype=object)
        array[:] = [v.encode() for v in flat]
        if array.size != count:
            raise RequestError(f"{where}: 'data' has {array.size} elements but shape {list(shape)} needs {count}")
        return array.reshape(shape)
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise RequestError(f"{where}: 'data' does not hold {datatype} values: {exc}") from None
    if array.size != count:
        raise RequestError(f"{where}: 'data' has {array.size} elements but shape {list(shape)} needs {count}")
    return array.reshape(shape)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for item in value for x in _flatten(item)]
    return [value]


def _params(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"{where}: 'parameters' must be an object, got {type(value).__name__}")
    return value


def _int_param(params: dict[str, Any], key: str, where: str) -> int:
    value = params.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RequestError(f"{where}: parameter '{key}' must be an integer >= 0, got {value!r}")
    return value


def decode_http_request(
    body: bytes | bytearray | memoryview, header_length: int | None, *, model: str, version: str, max_elements: int,
    memory: RegionSource | None = None,
) -> InferRequest:
    """Parse an HTTP infer body (JSON, or JSON + binary tensors) into an :class:`InferRequest`.

    Inputs and outputs may name regions of ``memory`` (the shared-memory extensions); the regions
    are leased by the request (``request.leases``) and released by the server once it is answered.

    Raises:
        RequestError: malformed JSON, missing fields, binary sizes that disagree with the body.
        PayloadTooLargeError: a tensor over ``max_elements``.
        SharedMemoryError: unknown regions, ranges out of bounds, sizes that disagree.
        UnsupportedRequestError: shared memory without a registry, raw binary bodies.
    """
    if header_length is not None and 0 < header_length <= min(len(body), MAX_HEADER_BYTES):
        known = without_request_id(body[:header_length] if isinstance(body, bytes) else bytes(body[:header_length]))
        layout = None if known is None else _LAYOUTS.get((known[0], max_elements))
        if layout is not None:
            assert known is not None
            shift = header_length - layout.header_length  # another id's length moves the tensors
            if layout.body_length + shift == len(body):
                return _from_layout(layout, body, model, version, known[1], shift)
    leases: list[Any] = []
    try:
        return _decode_http(body, header_length, model, version, max_elements, memory, leases)
    except BaseException:
        SharedMemoryRegistry.release(leases)
        raise


_LAYOUTS: BoundedTable[RequestLayout] = BoundedTable()
"""Checked headers of binary requests by (header bytes without a leading id, max_elements): see :mod:`.http_headers`."""


def _from_layout(layout: RequestLayout, body: bytes | bytearray | memoryview, model: str, version: str,
                 request_id: str, shift: int) -> InferRequest:
    """The request of a body whose header was checked before (the same bytes but its id, the same tensor bytes)."""
    view = memoryview(body)
    return InferRequest(
        model=model, version=version, id=request_id, inputs={i.name: i.view(view, shift) for i in layout.inputs},
        outputs=layout.outputs, binary_output=layout.binary_output, priority=layout.priority,
        timeout_us=layout.timeout_us, sequence=layout.sequence,
    )


def _decode_http(
    body: bytes | bytearray | memoryview, header_length: int | None, model: str, version: str, max_elements: int,
    memory: RegionSource | None, leases: list[Any],
) -> InferRequest:
    if header_length is not None and (header_length < 0 or header_length > len(body)):
        raise RequestError(
            f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes"
        )
    if header_length == 0:
        raise UnsupportedRequestError(
            f"{HEADER_LENGTH}: 0 (a raw binary body) is not supported; send a JSON header with the tensor"
        )
    json_end = len(body) if header_length is None else header_length
    try:
        header = json.loads(body[:json_end] if isinstance(body, bytes) else bytes(body[:json_end]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"malformed JSON in the request: {exc}") from None
    if not isinstance(header, dict):
        raise RequestError("the request body must be a JSON object")
    params = _params(header.get("parameters"), "request")
    inputs_json = header.get("inputs")
    if not isinstance(inputs_json, list) or not inputs_json:
        raise RequestError("the request needs a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = json_end
    view = memoryview(body)
    kept: list[BinaryInput] | None = []  # the inputs of the layout to remember; None: not a header to keep
    for index, item in enumerate(inputs_json):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"input {index}: needs a 'name' string")
        name = item["name"]
        where = f"input '{name}'"
        if name in inputs:
            raise RequestError(f"{where} is given twice")
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise RequestError(f"{where}: needs a 'datatype' string such as \"FP32\"")
        shape = _shape(item.get("shape"), where)
        iparams = _params(item.get("parameters"), where)
        if "shared_memory_region" in iparams:
            if memory is None:
                raise UnsupportedRequestError(f"{where}: shared memory is not enabled on this server "
                                              "(parameter shared_memory_region)")
            ref = region_ref(iparams, where)
            _elements(shape, where, max_elements)
            inputs[name] = memory.read_input(ref, numpy_dtype(datatype), shape, where, leases)
            kept = None
        elif "binary_data_size" in iparams:
            size = _int_param(iparams, "binary_data_size", where)
            if header_length is None:
                raise RequestError(f"{where} has binary_data_size but the request has no {HEADER_LENGTH} header")
            expected = _elements(shape, where, max_elements) * numpy_dtype(datatype).itemsize
            if size != expected and datatype != "BYTES":
                raise RequestError(
                    f"{where}: binary_data_size is {size} bytes but shape {list(shape)} of {datatype} needs {expected}"
                )
            if offset + size > len(body):
                raise RequestError(
                    f"{where}: binary data ends at byte {offset + size} but the body has {len(body)} bytes"
                )
            inputs[name] = tensor_from_bytes(view[: offset + size], offset, datatype, shape, where, max_elements)
            if kept is not None and datatype != "BYTES":
                kept.append(BinaryInput(name, numpy_dtype(datatype), shape, inputs[name].size, offset))
            else:
                kept = None
            offset += size
        elif "data" in item:
            inputs[name] = _tensor_from_json(item["data"], datatype, shape, where, max_elements)
            kept = None
        else:
            raise RequestError(f"{where}: needs 'data' or parameters.binary_data_size")
    if offset != len(body):
        raise RequestError(
            f"the body has {len(body) - offset} bytes after the last tensor; the binary_data_size values "
            f"and {HEADER_LENGTH} ({header_length}) do not add up to the body length {len(body)}"
        )
    outputs = []
    for index, item in enumerate(header.get("outputs") or ()):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"output {index}: needs a 'name' string")
        oparams = _params(item.get("parameters"), f"output '{item['name']}'")
        region = None
        if "shared_memory_region" in oparams:
            if memory is None:
                raise UnsupportedRequestError(f"output '{item['name']}': shared memory is not enabled on this "
                                              "server (parameter shared_memory_region)")
            region = region_ref(oparams, f"output '{item['name']}'")
            memory.lease_output(region, f"output '{item['name']}'", leases)
            kept = None
        binary = oparams.get("binary_data")
        classes = _int_param(oparams, "classification", f"output '{item['name']}'")
        outputs.append(RequestedOutput(item["name"], None if binary is None else bool(binary), classes, region))
    request_id = header.get("id", "")
    request = InferRequest(
        model=model,
        version=version,
        id=str(request_id) if request_id is not None else "",
        inputs=inputs,
        outputs=tuple(outputs),
        binary_output=bool(params.get("binary_data_output", False)),
        priority=_int_param(params, "priority", "request"),
        timeout_us=_int_param(params, "timeout", "request"),
        leases=leases,
        sequence=sequence_flags(params),
    )
    known = (without_request_id(bytes(body[:header_length]))
             if kept is not None and header_length is not None and header_length <= MAX_HEADER_BYTES else None)
    if known is not None and known[1] == request.id:  # an id elsewhere (or twice) stays part of the key
        assert kept is not None and header_length is not None
        _LAYOUTS.put((known[0], max_elements), RequestLayout(
            tuple(kept), len(body), header_length, request.outputs, request.binary_output, request.priority,
            request.timeout_us, request.sequence))
    return request


def encode_http_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """The HTTP body of ``response`` and its JSON header length (None when all data is JSON)."""
    if response.outputs and not response.in_shared_memory and _all_plain_binary(response, request):
        return _encode_binary(response)
    binary_of = {o.name: o.binary for o in request.outputs}
    entries = []
    blobs: list[memoryview] = []
    for name, array in response.outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": kserve_dtype(array), "shape": list(array.shape)}
        flag = binary_of.get(name)
        target = response.in_shared_memory.get(name)
        if target is not None:
            entry["parameters"] = {"shared_memory_region": target.name, "shared_memory_byte_size": target.byte_size}
            if target.offset:
                entry["parameters"]["shared_memory_offset"] = target.offset
        elif flag if flag is not None else request.binary_output:
            blob = raw_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob) if isinstance(blob, bytes) else blob.nbytes}
            blobs.append(memoryview(blob))
        else:
            entry["data"] = json_values(array)
        entries.append(entry)
    header: dict[str, Any] = {"model_name": response.model, "model_version": response.version, "outputs": entries}
    if response.id:
        header["id"] = response.id
    text = json.dumps(header, separators=(",", ":")).encode()
    if not blobs:
        return text, None
    return b"".join([text, *blobs]), len(text)


_REPLY_HEADERS: BoundedTable[bytes] = BoundedTable()
"""JSON headers of all-binary replies, without the id and the closing brace, by (model, version,
each output's name, dtype and shape): see :mod:`.http_headers`."""


def _all_plain_binary(response: InferResponse, request: InferRequest) -> bool:
    """Every output goes binary and has a fixed byte size (not BYTES): its header is one to keep."""
    binary_of = {o.name: o.binary for o in request.outputs} if request.outputs else {}
    for name, array in response.outputs.items():
        flag = binary_of.get(name)
        if not (flag if flag is not None else request.binary_output):
            return False
        if array.dtype == object or array.dtype.kind in "SU":
            return False
    return True


def _encode_binary(response: InferResponse) -> tuple[bytes, int]:
    """:func:`encode_http_response` of an all-binary reply: the same bytes, the header written once
    per output signature."""
    outputs = response.outputs
    key = (response.model, response.version, tuple((n, a.dtype, a.shape) for n, a in outputs.items()))
    prefix = _REPLY_HEADERS.get(key)
    if prefix is None:
        entries = [{"name": n, "datatype": kserve_dtype(a), "shape": list(a.shape),
                    "parameters": {"binary_data_size": a.nbytes}} for n, a in outputs.items()]
        header = {"model_name": response.model, "model_version": response.version, "outputs": entries}
        prefix = json.dumps(header, separators=(",", ":")).encode()[:-1]
        _REPLY_HEADERS.put(key, prefix)
    text = prefix + b',"id":' + json.dumps(response.id).encode() + b"}" if response.id else prefix + b"}"
    return b"".join([text, *(memoryview(raw_bytes(a)) for a in outputs.values())]), len(text)
