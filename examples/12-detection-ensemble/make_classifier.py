"""Write the two-stage chain's classifier: ``models/classifier/1/model.onnx`` (or the path given).

streamrt.testing's small CNN (:func:`streamrt.testing.models.small_cnn`, 32x32 input, 5 classes, fixed
random weights: a stand-in for a trained crop classifier) wrapped so that one batch row is one frame's
crops: ``crops`` [N, 100, 3, 32, 32] and ``valid`` [N, 100] in, ``scores`` [N, 100, 5] out
(100: the post-processing step's ``max_det``) (softmax, times
``valid``: the padded rows past a frame's COUNT score 0).

    python examples/12-detection-ensemble/make_classifier.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

CLASSES, SIZE, MAX_DET = 5, 32, 100  # MAX_DET: postprocess's max_det, the crops per frame
HERE = Path(__file__).resolve().parent


def crop_classifier(classes: int = CLASSES, size: int = SIZE, max_det: int = MAX_DET) -> onnx.ModelProto:
    """The per-frame crop classifier (see the module docstring)."""
    from streamrt.testing.models import small_cnn

    inner = small_cnn(classes=classes, size=size)
    graph = inner.graph
    consts = {"flat": np.array([-1, 3, size, size], np.int64), "nm_start": np.array([0], np.int64),
              "nm_end": np.array([2], np.int64), "classes": np.array([classes], np.int64),
              "last": np.array([2], np.int64)}
    nodes = [
        helper.make_node("Reshape", ["crops", "flat"], ["x"]),  # small_cnn's input
        *graph.node,
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Shape", ["crops"], ["crops_shape"]),
        helper.make_node("Slice", ["crops_shape", "nm_start", "nm_end"], ["nm"]),
        helper.make_node("Concat", ["nm", "classes"], ["scores_shape"], axis=0),
        helper.make_node("Reshape", ["probs", "scores_shape"], ["probs_nm"]),
        helper.make_node("Unsqueeze", ["valid", "last"], ["valid_3d"]),
        helper.make_node("Mul", ["probs_nm", "valid_3d"], ["scores"]),
    ]
    inits = [*graph.initializer, *(onnx.numpy_helper.from_array(v, k) for k, v in consts.items())]
    wrapped = helper.make_graph(
        nodes, "crop_classifier",
        [helper.make_tensor_value_info("crops", TensorProto.FLOAT, ["N", max_det, 3, size, size]),
         helper.make_tensor_value_info("valid", TensorProto.FLOAT, ["N", max_det])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", max_det, classes])], inits)
    model = helper.make_model(wrapped, opset_imports=list(inner.opset_import), producer_name="streamrt")
    model.ir_version = inner.ir_version
    onnx.checker.check_model(model)
    return model


def main(argv: list[str] | None = None) -> Path:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else HERE / "models" / "classifier" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(crop_classifier(), str(path))
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
