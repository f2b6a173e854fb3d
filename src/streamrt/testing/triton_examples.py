"""The models NVIDIA's Triton client examples expect, written as a StreamRT model repository.

The examples in ``triton-inference-server/client`` (``src/python/examples``) talk to models of
Triton's example and QA repositories. This module writes ONNX models that answer as those do, each
with a Triton-style ``config.json``, so ``streamrt serve`` can stand where ``tritonserver`` stands:

- ``simple`` / ``simple_int8``: INT32 / INT8 ``INPUT0``, ``INPUT1`` ``[-1, 16]`` -> ``OUTPUT0`` (sum),
  ``OUTPUT1`` (difference); ``simple_string``: the same on BYTES holding decimal numbers.
- ``simple_identity`` (BYTES) and ``custom_identity_int32`` (INT32): identities.
- ``simple_sequence`` (direct, START/READY controls): ``OUTPUT = INPUT + START`` on a ready row.
- ``simple_dyna_sequence`` (oldest, START/END/READY/CORRID uint64): ``OUTPUT = INPUT + START`` and,
  on the END request, plus the correlation id (the examples' "dyna" expectations).
- ``simple_string_dyna_sequence`` (oldest, CORRID as a string): a running sum kept as implicit state,
  the correlation id (decimal text) added on the END request.
- the image examples' models, with Triton's names, tensors, formats and label files but not trained
  (each channel's mean over the picture, a fixed random map to the classes, softmax):
  ``densenet_onnx`` (``data_0`` NCHW 3x224x224 -> ``fc6_1`` [1000]), ``inception_graphdef`` (``input``
  NHWC 299x299x3 -> ``InceptionV3/Predictions/Softmax`` [1001]) and ``preprocess_inception_ensemble``
  (the picture file's bytes -> ``image_preprocess_model``, a Python model decoding, resizing and scaling it
  with Pillow -> ``inception_graphdef``).

Example:
    >>> from pathlib import Path
    >>> import tempfile
    >>> names = write_repository(Path(tempfile.mkdtemp()) / "repo")
    >>> names[:2]
    ['simple', 'simple_string']
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MODEL_NAMES", "write_repository"]

_OPSET = 17


def _info(name: str, kind: int, dims: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, kind, list(dims))


def _model(name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], opset: int = _OPSET,
           initializers: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", opset)], producer_name="streamrt")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _io(prefix: str, data_type: str, dims: list[int], count: int) -> list[dict[str, Any]]:
    return [{"name": f"{prefix}{i}", "data_type": data_type, "dims": dims} for i in range(count)]


def _add_sub(name: str, elem: int, data_type: str) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 - INPUT1``; BYTES in and out for strings."""
    io = [_info(f"INPUT{i}", elem, ["batch", 16]) for i in range(2)]
    outs = [_info(f"OUTPUT{i}", elem, ["batch", 16]) for i in range(2)]
    if elem == TensorProto.STRING:
        nodes = [helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
                 helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
                 helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Sub", ["a", "b"], ["d"]),
                 helper.make_node("Cast", ["s"], ["OUTPUT0"], to=TensorProto.STRING),
                 helper.make_node("Cast", ["d"], ["OUTPUT1"], to=TensorProto.STRING)]
    else:
        nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                 helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    config = {"max_batch_size": 8, "input": _io("INPUT", data_type, [16], 2),
              "output": _io("OUTPUT", data_type, [16], 2)}
    return _model(name, nodes, io, outs), config


def _identity(name: str, elem: int, data_type: str) -> tuple[onnx.ModelProto, dict[str, Any]]:
    model = _model(name, [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                   [_info("INPUT0", elem, ["batch", "n"])], [_info("OUTPUT0", elem, ["batch", "n"])])
    config = {"max_batch_size": 8, "input": _io("INPUT", data_type, [-1], 1),
              "output": _io("OUTPUT", data_type, [-1], 1)}
    return model, config


def _control(name: str, kind: str, data_type: str | None = None) -> dict[str, Any]:
    control: dict[str, Any] = {"kind": f"CONTROL_SEQUENCE_{kind}"}
    if data_type is None:
        control["int32_false_true"] = [0, 1]
    else:
        control["data_type"] = data_type
    return {"name": name, "control": [control]}


def _sequence_io() -> dict[str, Any]:
    return {"max_batch_size": 8, "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}


def _int_row(name: str) -> onnx.ValueInfoProto:
    return _info(name, TensorProto.INT32, ["batch", 1])


def _simple_sequence() -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Triton's ONNX ``simple_sequence``: ``OUTPUT = (INPUT + START) * READY``."""
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]
    model = _model("simple_sequence", nodes, [_int_row("INPUT"), _int_row("START"), _int_row("READY")],
                   [_int_row("OUTPUT")])
    config = {**_sequence_io(), "sequence_batching": {
        "direct": {}, "control_input": [_control("START", "START"), _control("READY", "READY")]}}
    return model, config


def _dyna_batching(corrid_type: str) -> dict[str, Any]:
    return {"max_sequence_idle_microseconds": 10_000_000,
            "oldest": {"max_candidate_sequences": 1024, "max_queue_delay_microseconds": 10_000},
            "control_input": [_control("START", "START"), _control("END", "END"), _control("READY", "READY"),
                              _control("CORRID", "CORRID", corrid_type)]}


def _simple_dyna_sequence() -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``OUTPUT = (INPUT + START + END * CORRID) * READY`` (Triton's dyna_sequence, as the examples check)."""
    nodes = [helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
             helper.make_node("Mul", ["END", "corrid"], ["end_id"]),
             helper.make_node("Add", ["INPUT", "START"], ["started"]),
             helper.make_node("Add", ["started", "end_id"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]
    inputs = [_int_row("INPUT"), _int_row("START"), _int_row("END"), _int_row("READY"),
              _info("CORRID", TensorProto.UINT64, ["batch", 1])]
    model = _model("simple_dyna_sequence", nodes, inputs, [_int_row("OUTPUT")])
    return model, {**_sequence_io(), "sequence_batching": _dyna_batching("TYPE_UINT64")}


def _simple_string_dyna_sequence() -> tuple[onnx.ModelProto, dict[str, Any]]:
    """A running sum in implicit state; the END request adds the (decimal string) correlation id."""
    one = helper.make_tensor("one", TensorProto.INT32, [], [1])
    zero_text = helper.make_tensor("zero_text", TensorProto.STRING, [], [b"0"])  # type: ignore[list-item]
    nodes = [helper.make_node("Constant", [], ["one"], value=one),
             # "0" + id: the empty id of the load probe and of filler rows reads as 0, "1002" as 1002
             helper.make_node("Constant", [], ["zero_text"], value=zero_text),
             helper.make_node("StringConcat", ["zero_text", "CORRID"], ["corrid_text"]),
             helper.make_node("Sub", ["one", "START"], ["keep"]),
             helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
             helper.make_node("Mul", ["INPUT", "READY"], ["added"]),
             helper.make_node("Add", ["kept", "added"], ["STATE_OUT"]),
             helper.make_node("Cast", ["corrid_text"], ["corrid"], to=TensorProto.INT32),
             helper.make_node("Mul", ["END", "corrid"], ["end_id"]),
             helper.make_node("Add", ["STATE_OUT", "end_id"], ["OUTPUT"])]
    inputs = [_int_row("INPUT"), _int_row("STATE_IN"), _int_row("START"), _int_row("END"), _int_row("READY"),
              _info("CORRID", TensorProto.STRING, ["batch", 1])]
    model = _model("simple_string_dyna_sequence", nodes, inputs, [_int_row("OUTPUT"), _int_row("STATE_OUT")],
                   opset=20)
    batching = _dyna_batching("TYPE_STRING")
    batching["state"] = [{"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_INT32",
                          "dims": [1], "initial_state": [{"data_type": "TYPE_INT32", "dims": [1],
                                                          "zero_data": True, "name": "zero"}]}]
    return model, {**_sequence_io(), "sequence_batching": batching}


Files = dict[str, str]
"""Extra files of a model folder (label files, a Python model), by path relative to it."""


def _labels(count: int, offset: int = 0) -> str:
    return "".join(f"class_{i - offset:04d}\n" if i >= offset else "background\n" for i in range(count))


def _classifier(name: str, input_name: str, nchw: bool, size: int, output_name: str, classes: int,
                seed: int) -> onnx.ModelProto:
    """An image classifier of Triton's example shapes, not a trained one: each channel's mean over the picture,
    a fixed random linear map to ``classes`` scores, softmax (so the examples print a ranking, the same for
    the same picture)."""
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array((rng.standard_normal((3, classes)) * 4).astype(np.float32), "weights")
    bias = numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "bias")
    nodes = [helper.make_node("ReduceMean", [input_name], ["channels"], axes=[2, 3] if nchw else [1, 2], keepdims=0),
             helper.make_node("MatMul", ["channels", "weights"], ["mapped"]),
             helper.make_node("Add", ["mapped", "bias"], ["scores"]),
             helper.make_node("Softmax", ["scores"], [output_name], axis=1)]
    dims: list[int | str] = ["batch", 3, size, size] if nchw else ["batch", size, size, 3]
    return _model(name, nodes, [_info(input_name, TensorProto.FLOAT, dims)],
                  [_info(output_name, TensorProto.FLOAT, ["batch", classes])], initializers=[weights, bias])


def _densenet_onnx() -> tuple[onnx.ModelProto, dict[str, Any], Files]:
    """Triton's ``densenet_onnx`` as ``image_client.py`` and ``grpc_image_client.py`` read it."""
    config = {"max_batch_size": 1,
              "input": [{"name": "data_0", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, 224, 224]}],
              "output": [{"name": "fc6_1", "data_type": "TYPE_FP32", "dims": [1000],
                          "label_filename": "densenet_labels.txt"}]}
    return (_classifier("densenet_onnx", "data_0", True, 224, "fc6_1", 1000, seed=1), config,
            {"densenet_labels.txt": _labels(1000)})


_INCEPTION_OUTPUT = "InceptionV3/Predictions/Softmax"


def _inception_graphdef() -> tuple[onnx.ModelProto, dict[str, Any], Files]:
    """Triton's ``inception_graphdef`` tensors (an ONNX model under its name): NHWC 299x299x3 -> 1001 classes."""
    config = {"max_batch_size": 128,
              "input": [{"name": "input", "data_type": "TYPE_FP32", "format": "FORMAT_NHWC", "dims": [299, 299, 3]}],
              "output": [{"name": _INCEPTION_OUTPUT, "data_type": "TYPE_FP32", "dims": [1001],
                          "label_filename": "inception_labels.txt"}]}
    return (_classifier("inception_graphdef", "input", False, 299, _INCEPTION_OUTPUT, 1001, seed=2), config,
            {"inception_labels.txt": _labels(1001, offset=1)})


_PREPROCESS_MODEL = '''"""Triton's image_preprocess_model as a Python model: each request's picture files, decoded, RGB,
299x299, scaled to [-1, 1] as Inception expects."""
import io

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        from PIL import Image  # here, not at load: a server without Pillow still loads the repository

        responses = []
        for request in requests:
            files = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)
            pictures = [np.asarray(Image.open(io.BytesIO(bytes(f))).convert("RGB").resize((299, 299), Image.BILINEAR),
                                   np.float32) / 127.5 - 1 for f in files]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.stack(pictures))]))
        return responses
'''


def _image_preprocess_model() -> tuple[None, dict[str, Any], Files]:
    config = {"backend": "python", "max_batch_size": 128,
              "input": [{"name": "INPUT", "data_type": "TYPE_STRING", "dims": [1]}],
              "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [299, 299, 3]}],
              "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    return None, config, {"1/model.py": _PREPROCESS_MODEL}


def _preprocess_inception_ensemble() -> tuple[None, dict[str, Any], Files]:
    """Triton's example ensemble: the picture file's bytes -> image_preprocess_model -> inception_graphdef."""
    config = {"platform": "ensemble", "max_batch_size": 128,
              "input": [{"name": "INPUT", "data_type": "TYPE_STRING", "dims": [1]}],
              "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [1001],
                          "label_filename": "inception_labels.txt"}],
              "ensemble_scheduling": {"step": [
                  {"model_name": "image_preprocess_model", "model_version": -1,
                   "input_map": {"INPUT": "INPUT"}, "output_map": {"OUTPUT": "preprocessed_image"}},
                  {"model_name": "inception_graphdef", "model_version": -1,
                   "input_map": {"input": "preprocessed_image"}, "output_map": {_INCEPTION_OUTPUT: "OUTPUT"}}]}}
    return None, config, {"inception_labels.txt": _labels(1001, offset=1), "1/.keep": ""}


_BUILDERS: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, Any]]]] = {
    "simple": lambda: _add_sub("simple", TensorProto.INT32, "TYPE_INT32"),
    "simple_string": lambda: _add_sub("simple_string", TensorProto.STRING, "TYPE_STRING"),
    "simple_int8": lambda: _add_sub("simple_int8", TensorProto.INT8, "TYPE_INT8"),
    "simple_identity": lambda: _identity("simple_identity", TensorProto.STRING, "TYPE_STRING"),
    "simple_sequence": _simple_sequence,
    "simple_dyna_sequence": _simple_dyna_sequence,
    "simple_string_dyna_sequence": _simple_string_dyna_sequence,
    "custom_identity_int32": lambda: _identity("custom_identity_int32", TensorProto.INT32, "TYPE_INT32"),
}

_WITH_FILES: dict[str, Callable[[], tuple[onnx.ModelProto | None, dict[str, Any], Files]]] = {
    "densenet_onnx": _densenet_onnx,
    "inception_graphdef": _inception_graphdef,
    "image_preprocess_model": _image_preprocess_model,
    "preprocess_inception_ensemble": _preprocess_inception_ensemble,
}

#: Every model :func:`write_repository` can write, in its order (``simple`` first, the image models last).
MODEL_NAMES: tuple[str, ...] = (*_BUILDERS, *_WITH_FILES)


def write_repository(root: Path, names: Sequence[str] = MODEL_NAMES) -> list[str]:
    """Write ``root/<name>/config.json`` and ``root/<name>/1/model.onnx`` for each name; return the names.

    ``root`` is emptied first. An unknown name raises ``KeyError`` naming the known ones.
    """
    unknown = [name for name in names if name not in MODEL_NAMES]
    if unknown:
        raise KeyError(f"no example model named {unknown}; known: {', '.join(MODEL_NAMES)}")
    if root.exists():
        shutil.rmtree(root)
    for name in names:
        model, config, files = _WITH_FILES[name]() if name in _WITH_FILES else (*_BUILDERS[name](), {})
        (root / name / "1").mkdir(parents=True)
        if model is not None:
            onnx.save(model, str(root / name / "1" / "model.onnx"))
            config = {"platform": "onnxruntime_onnx", **config}
        for relative, text in files.items():
            (root / name / relative).write_text(text)
        (root / name / "config.json").write_text(json.dumps({"name": name, **config}, indent=2) + "\n")
    return list(names)
