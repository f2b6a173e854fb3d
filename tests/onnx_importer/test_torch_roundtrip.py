"""A real exporter's output: the YOLOv8-style torch detector -> torch.onnx -> importer -> torch.export.

``torch.onnx.export`` (TorchScript exporter, opset 17, dynamic batch/H/W) writes what users'
YOLO exports contain: Constant nodes, Shape/Gather/Slice/Concat/Reshape chains, Range and Expand
for the anchor grid, Resize with constant scales, MaxPool (SPPF), Softplus. Measured over 5 random
inputs: the importer matches torch exactly (0.0) and ONNX Runtime within 4e-6 on outputs up to
~90 (box pixels); bounds: 1e-4 absolute vs torch, rtol 1e-5 / atol 1e-3 vs ORT.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

from streamrt.onnx.importer import export_program, import_onnx
from streamrt.testing.yolo import yolo_like

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def exported() -> tuple[torch.nn.Module, onnx.ModelProto]:
    model = yolo_like(num_classes=8, width=0.125, seed=3).eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(2, 3, 64, 96),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["images"],
            output_names=["detections"],
            dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}},
        )
    return model, onnx.load_from_string(buffer.getvalue())


def test_imported_torch_export_matches_torch_and_onnxruntime(exported: tuple[torch.nn.Module, onnx.ModelProto]) -> None:
    model, proto = exported
    module = import_onnx(proto)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((2, 3, 64, 96), (1, 3, 96, 64)):
        x = torch.randn(*shape)
        with torch.no_grad():
            (got,) = module(x)
            expected = model(x)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
        (ort_out,) = session.run(None, {"images": x.numpy()})
        np.testing.assert_allclose(got.numpy(), ort_out, rtol=1e-5, atol=1e-3)


def test_imported_torch_export_exports_with_dynamic_batch_and_resolution(
    exported: tuple[torch.nn.Module, onnx.ModelProto],
) -> None:
    model, proto = exported
    batch, h, w = Dim("batch", min=1, max=16), Dim("h", min=2, max=40), Dim("w", min=2, max=40)
    program = export_program(proto, [torch.randn(2, 3, 64, 96)], {"images": {0: batch, 2: 32 * h, 3: 32 * w}})
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "aten.upsample_nearest2d.vec" in targets
    assert not {t for t in targets if "item" in t or "_local_scalar_dense" in t}
    for shape in ((1, 3, 64, 64), (3, 3, 128, 96)):
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x)[0], model(x), rtol=0, atol=1e-4)
