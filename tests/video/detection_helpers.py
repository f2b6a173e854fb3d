"""Helpers of the detection tests: hand-made models and accuracy against the generator's ground truth.

Imported as ``video.detection_helpers`` (``tests`` is on the test path).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from fake_cuda import FakeCudaDevice, FakeCudaStream  # noqa: F401 - re-exported to the detection tests


def yolov5_from_bundled(path: Path) -> Path:
    """The bundled YOLOv8-layout model re-exported as YOLOv5 layout: (1, anchors, 5 + C), objectness 1."""
    from streamrt.video.model import bundled_model

    model = onnx.load(str(bundled_model()))
    graph = model.graph
    out = graph.output[0].name
    graph.initializer.extend([
        helper.make_tensor("split_sizes", TensorProto.INT64, [2], [4, 5]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
    ])
    graph.node.extend([
        helper.make_node("Split", [out, "split_sizes"], ["v5_boxes", "v5_scores"], axis=1),
        helper.make_node("ReduceMax", ["v5_scores"], ["v5_max"], axes=[1], keepdims=1),
        helper.make_node("Mul", ["v5_max", "zero"], ["v5_zeros"]),
        helper.make_node("Add", ["v5_zeros", "one"], ["v5_obj"]),
        helper.make_node("Concat", ["v5_boxes", "v5_obj", "v5_scores"], ["v5_cat"], axis=1),
        helper.make_node("Transpose", ["v5_cat"], ["output_v5"], perm=[0, 2, 1]),
    ])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("output_v5", TensorProto.FLOAT, ["batch", "anchors", 10]))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def not_a_detector(path: Path) -> Path:
    """An image model whose output is (batch, 3): no YOLO layout fits it."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images", "axes"], ["pooled"], keepdims=0)],
        "classifier",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def recall_precision(detections: list[Any], clip: Any, iou: float = 0.5, conf: float = 0.5) -> tuple[float, float]:
    """Share of ground-truth boxes found (same class, IoU >= iou) and share of confident detections that are right."""
    from streamrt.video.metrics import match_detections

    found = truths = right = confident = 0
    for det in detections:
        truth = clip.ground_truth(det.index)
        keep = det.scores >= conf
        tp = match_detections((det.boxes[keep], det.scores[keep], det.classes[keep]), (truth.boxes, truth.classes),
                              iou)
        found += int(tp.sum())
        truths += len(truth)
        right += int(tp.sum())
        confident += int(keep.sum())
    return found / max(truths, 1), right / max(confident, 1)


class ImportedEngine:
    """The bundled ONNX model through StreamRT's ONNX importer as a torch module, with the engine contract.

    Runs on ``device``; on a CUDA stream the forward pass is enqueued there. ``tf32=True`` (CPU) emulates
    TF32 convolutions: each convolution's input and weights rounded to TF32 (10 mantissa bits), the
    products summed in float64: what cuDNN computes with TF32 on, up to the summation order.
    """

    def __init__(self, device: str = "cpu", batch: int = 4, *, tf32: bool = False) -> None:
        import torch

        from streamrt.onnx.importer import import_onnx
        from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec
        from streamrt.video.model import bundled_model

        self.torch = torch
        self.tf32 = tf32
        self.module = import_onnx(onnx.load(str(bundled_model()))).to(device).eval()
        self.device_kind = device
        self.inputs = (TensorSpec("images", DType.FLOAT32, (-1, 3, 320, 320)),)
        self.outputs = (TensorSpec("output0", DType.FLOAT32, (-1, 9, 2100)),)
        self.profiles = (ShapeProfile({"images": ShapeRange((1, 3, 320, 320), (1, 3, 320, 320),
                                                            (batch, 3, 320, 320))}),)

    def create_context(self) -> Any:
        return _ImportedContext(self)


class _ImportedContext:
    def __init__(self, engine: ImportedEngine) -> None:
        self.engine = engine

    def infer(self, inputs: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        torch = self.engine.torch
        with torch.no_grad(), (_tf32_mode() if self.engine.tf32 else contextlib.nullcontext()):
            cuda_stream = getattr(stream, "torch", None)
            if cuda_stream is not None:
                with torch.cuda.stream(cuda_stream):
                    (out,) = self.engine.module(inputs["images"])
            else:
                (out,) = self.engine.module(inputs["images"])
        return {"output0": out}





def _round_to_tf32(t: Any) -> Any:
    """``t`` (float32) rounded to TF32: 10 explicit mantissa bits, round to nearest (ties away from zero)."""
    import torch

    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(t.dtype)


def _tf32_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    class Tf32Convolutions(TorchFunctionMode):
        """2-D convolutions with TF32 operands (see ImportedEngine's ``tf32``)."""

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.nn.functional.conv2d and args[0].dtype == torch.float32:
                x, w, *rest = args
                rest = [r.double() if isinstance(r, torch.Tensor) else r for r in rest]
                bias = kwargs.pop("bias", None)
                if bias is not None:
                    kwargs["bias"] = bias.double()
                out = func(_round_to_tf32(x).double(), _round_to_tf32(w).double(), *rest, **kwargs)
                return out.to(torch.float32)
            return func(*args, **kwargs)

    return Tf32Convolutions()


def decoded_nv12(path: Path) -> list[np.ndarray]:
    """Every frame of ``path`` as the CPU decoder gives it (NV12): what a pool's pictures are compared with."""
    from streamrt.video.decoding import open_nv12

    source = open_nv12(path)
    frames = []
    while (frame := source.read()) is not None:
        frames.append(frame)
    source.close()
    return frames

