"""Stateful ONNX models for the sequence batcher: running-sum accumulators with implicit state.

Each model adds its ``INPUT`` row to the state it is fed (``STATE_IN``) and returns the new sum
both as ``OUTPUT`` (for the client) and as ``STATE_OUT`` (the batcher's next state), so the
answer to the k-th request of a sequence is the sum of its first k inputs: a NumPy running sum
per sequence is the reference. :func:`controlled_accumulator` also takes Triton's control inputs
and echoes them, so a test sees what the batcher put in each row.

Example:
    >>> model = accumulator(width=4)
    >>> [i.name for i in model.graph.input]
    ['INPUT', 'STATE_IN']
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

__all__ = ["accumulator", "accumulator_config", "controlled_accumulator", "controlled_config"]

_OPSET = 17


def _tensor(name: str, kind: int, width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, kind, ["batch", width])


def _finish(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
            name: str) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs),
                              opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="streamrt")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def accumulator(width: int = 4) -> onnx.ModelProto:
    """``OUTPUT = STATE_OUT = STATE_IN + INPUT`` (FP32 ``[batch, width]``)."""
    nodes = [helper.make_node("Add", ["STATE_IN", "INPUT"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])]
    return _finish(nodes, [_tensor("INPUT", TensorProto.FLOAT, width), _tensor("STATE_IN", TensorProto.FLOAT, width)],
                   [_tensor("OUTPUT", TensorProto.FLOAT, width), _tensor("STATE_OUT", TensorProto.FLOAT, width)],
                   "accumulator")


def controlled_accumulator(width: int = 4) -> onnx.ModelProto:
    """An accumulator driven by control inputs: ``STATE_OUT = STATE_IN * (1 - START) + INPUT * READY``.

    Controls: ``START`` FP32, ``END`` INT32, ``READY`` BOOL, ``CORRID`` UINT64 (each ``[batch, 1]``).
    Outputs: ``OUTPUT`` (the new sum), ``FLAGS`` = ``[START, END, READY]`` as FP32 and ``CORRID_OUT``.
    """
    nodes = [
        helper.make_node("Cast", ["READY"], ["ready_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["END"], ["end_f"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])),
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
        helper.make_node("Mul", ["INPUT", "ready_f"], ["added"]),
        helper.make_node("Add", ["kept", "added"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Concat", ["START", "end_f", "ready_f"], ["FLAGS"], axis=1),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    inputs = [_tensor("INPUT", TensorProto.FLOAT, width), _tensor("STATE_IN", TensorProto.FLOAT, width),
              _tensor("START", TensorProto.FLOAT, 1), _tensor("END", TensorProto.INT32, 1),
              _tensor("READY", TensorProto.BOOL, 1), _tensor("CORRID", TensorProto.UINT64, 1)]
    outputs = [_tensor("OUTPUT", TensorProto.FLOAT, width), _tensor("STATE_OUT", TensorProto.FLOAT, width),
               _tensor("FLAGS", TensorProto.FLOAT, 3), _tensor("CORRID_OUT", TensorProto.UINT64, 1)]
    return _finish(nodes, inputs, outputs, "controlled_accumulator")


def _state(width: int) -> dict[str, Any]:
    return {"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_FP32", "dims": [width],
            "initial_state": [{"data_type": "TYPE_FP32", "dims": [width], "zero_data": True, "name": "zeros"}]}


def accumulator_config(width: int = 4, *, max_batch_size: int = 4, strategy: dict[str, Any] | None = None,
                       idle_us: int = 0, instances: int = 1) -> dict[str, Any]:
    """A config (YAML/JSON form) serving :func:`accumulator` with implicit state."""
    sequence: dict[str, Any] = {"state": [_state(width)], **(strategy or {"direct": {}})}
    if idle_us:
        sequence["max_sequence_idle_microseconds"] = idle_us
    return {"max_batch_size": max_batch_size, "sequence_batching": sequence,
            "instance_group": [{"count": instances, "kind": "KIND_CPU"}]}


def controlled_config(width: int = 4, *, max_batch_size: int = 4, instances: int = 1) -> dict[str, Any]:
    """A config serving :func:`controlled_accumulator`: all four controls, implicit state, direct."""
    controls = [
        {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}]},
        {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0, 1]}]},
        {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "bool_false_true": [False, True]}]},
        {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
    ]
    return {"max_batch_size": max_batch_size,
            "sequence_batching": {"direct": {}, "control_input": controls, "state": [_state(width)]},
            "instance_group": [{"count": instances, "kind": "KIND_CPU"}]}
