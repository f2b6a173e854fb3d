"""Tensors across the channel: requests packed by the worker into its arena, unpacked by the engine
as zero-copy views; responses the other way.

Copies of one input on the way in: a binary HTTP body is read straight into the arena (the
protocol parser's tensors are then views of it: nothing more to copy); a gRPC message arrives in a
``bytes`` object (gRPC's copy) and each tensor is copied once into the arena; JSON and BYTES
tensors are small and encoded into it. The engine process views the arena: its batch gather is
the next copy, as in the one-process server. Outputs: one copy into the output half by the engine,
one out of it into the response by the worker (outputs up to 64 KiB travel in the reply instead).

A client's own shared-memory regions stay the engine's business: the worker's parser records the
region named by each input and output (:class:`DeferredRegions`) and the engine looks it up in its
registry, with the same checks and leases as the one-process server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt.serve.listeners.frontends.arena import Arena
from streamrt.serve.wire import protocol
from streamrt.serve.wire.protocol import InferRequest, InferResponse, RequestedOutput
from streamrt.serve.wire.shared_memory import RegionRef, SharedMemoryRegistry

__all__ = ["DeferredRegions", "RegionInput", "pack_outputs", "pack_request_tensors", "unpack_outputs",
           "unpack_request"]

INLINE_OUTPUT_BYTES = 64 * 1024
"""Outputs up to this size travel in the reply message (one copy either way, and no FREE message)."""

Where = tuple[Any, ...]
Entry = tuple[str, str, tuple[int, ...], Where]


@dataclass(frozen=True)
class RegionInput:
    """An input the client put in one of its registered shared-memory regions (resolved by the engine)."""

    ref: RegionRef
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


class DeferredRegions:
    """The worker's stand-in for :class:`SharedMemoryRegistry` while parsing: records region names
    (the engine process holds the regions, checks them and leases them)."""

    def read_input(self, ref: RegionRef, dtype: np.dtype[Any], shape: tuple[int, ...], where: str,
                   leases: list[Any]) -> RegionInput:
        return RegionInput(ref, dtype, shape)

    def lease_output(self, ref: RegionRef, where: str, leases: list[Any]) -> None:
        return None

    @staticmethod
    def release(leases: list[Any]) -> None:
        leases.clear()


def _place(array: np.ndarray, arena: Arena, blocks: Any, taken: list[int]) -> Where:
    """Where ``array`` (numeric) goes: already in the arena, copied into a new block, or inline."""
    offset = arena.offset_of(array)
    if offset is not None:
        return ("a", offset, array.nbytes)
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    offset = blocks.alloc(flat.nbytes) if flat.nbytes else None
    if offset is None:  # arena full (or nothing to copy): the bytes travel in the message
        return ("b", flat.tobytes())
    taken.append(offset)
    arena.array[offset : offset + flat.nbytes] = flat
    return ("a", offset, flat.nbytes)


def _place_bytes(data: bytes, arena: Arena, blocks: Any, taken: list[int]) -> Where:
    return _place(np.frombuffer(data, np.uint8), arena, blocks, taken) if data else ("b", b"")


def pack_request_tensors(request: InferRequest, arena: Arena, taken: list[int]) -> tuple[list[Entry], list[Any]]:
    """The INFER message's inputs and outputs; input blocks allocated go to ``taken`` (free them on reply)."""
    inputs: list[Entry] = []
    for name, value in request.inputs.items():
        if isinstance(value, RegionInput):
            ref = value.ref
            inputs.append((name, protocol.kserve_dtype(value), value.shape, ("r", ref.name, ref.offset, ref.byte_size)))
            continue
        datatype = protocol.kserve_dtype(value)
        if datatype == "BYTES":
            where = _place_bytes(protocol.serialize_bytes(value), arena, arena.inputs, taken)
        else:
            where = _place(value, arena, arena.inputs, taken)
        inputs.append((name, datatype, tuple(value.shape), where))
    outputs = [(o.name, o.binary, o.class_count,
                None if o.region is None else (o.region.name, o.region.offset, o.region.byte_size))
               for o in request.outputs]
    return inputs, outputs


def _array(where: Where, datatype: str, shape: tuple[int, ...], arena: Arena, label: str) -> np.ndarray:
    data: Any = arena.view(where[1], where[2]) if where[0] == "a" else where[1]
    if datatype == "BYTES":
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        return protocol.deserialize_bytes(memoryview(data), count, label).reshape(shape)
    array = np.frombuffer(data, protocol.numpy_dtype(datatype)).reshape(shape)
    array.flags.writeable = False
    return array


def unpack_request(message: tuple[Any, ...], arena: Arena, registry: SharedMemoryRegistry) -> InferRequest:
    """The engine's :class:`InferRequest` of an INFER message: inputs are views of ``arena``, client
    regions are leased from ``registry`` (the request's ``leases``, released by ``core.infer``)."""
    (_, _, model, version, request_id, priority, timeout_us, binary_output, received_ns, inputs, outputs,
     sequence, trace_parent) = message
    leases: list[Any] = []
    try:
        arrays: dict[str, Any] = {}
        for name, datatype, shape, where in inputs:
            label = f"input '{name}'"
            if where[0] == "r":
                arrays[name] = registry.read_input(RegionRef(*where[1:]), protocol.numpy_dtype(datatype), tuple(shape),
                                                   label, leases)
            else:
                arrays[name] = _array(where, datatype, tuple(shape), arena, label)
        requested = []
        for name, binary, class_count, region in outputs:
            ref = None if region is None else RegionRef(*region)
            if ref is not None:
                registry.lease_output(ref, f"output '{name}'", leases)
            requested.append(RequestedOutput(name, binary, class_count, ref))
    except BaseException:
        SharedMemoryRegistry.release(leases)
        raise
    return InferRequest(model=model, version=version, id=request_id, inputs=arrays, outputs=tuple(requested),
                        binary_output=binary_output, priority=priority, timeout_us=timeout_us,
                        received_ns=received_ns, leases=leases, sequence=sequence, trace_parent=trace_parent)


def pack_outputs(response: InferResponse, arena: Arena, taken: list[int]) -> tuple[list[Entry], list[Any]]:
    """The OK message's outputs (written to the arena's output half) and shared-memory outputs."""
    outputs: list[Entry] = []
    for name, value in response.outputs.items():
        datatype = protocol.kserve_dtype(value)
        if name in response.in_shared_memory:
            where: Where = ("s",)
        elif datatype == "BYTES":
            where = _place_bytes(protocol.serialize_bytes(value), arena, arena.outputs, taken)
        else:
            array = np.asarray(value)
            if array.nbytes <= INLINE_OUTPUT_BYTES:  # in the reply itself: no block to give back later
                where = ("b", np.ascontiguousarray(array).tobytes())
            else:
                where = _place(array, arena, arena.outputs, taken)
        outputs.append((name, datatype, tuple(value.shape), where))
    in_memory = [(name, ref.name, ref.offset, ref.byte_size) for name, ref in response.in_shared_memory.items()]
    return outputs, in_memory


def unpack_outputs(message: tuple[Any, ...], arena: Arena) -> InferResponse:
    """The worker's :class:`InferResponse` of an OK message (numeric outputs are views of ``arena``)."""
    _, _, model, version, request_id, outputs, in_memory = message
    arrays = {}
    for name, datatype, shape, where in outputs:
        if where[0] == "s":  # written to the client's region: only dtype and shape go on the wire
            arrays[name] = np.broadcast_to(np.zeros((), protocol.numpy_dtype(datatype)), tuple(shape))
        else:
            arrays[name] = _array(where, datatype, tuple(shape), arena, f"output '{name}'")
    regions = {name: RegionRef(region, offset, size) for name, region, offset, size in in_memory}
    return InferResponse(model, version, request_id, arrays, regions)
