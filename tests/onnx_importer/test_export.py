"""torch.export round trips with dynamic dims, compared with ONNX Runtime at several sizes.

The exported graphs must not read tensor contents on the host (``aten.item`` /
``_local_scalar_dense``): the ONNX shape arithmetic has to stay symbolic. Same tolerances as
test_models (measured error <= 1.5e-6).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch.export import Dim

from onnx_importer.importer_models import (
    conv_classifier,
    flatten_by_shape,
    resize_by_computed_sizes,
    transformer_block,
    yolo_head,
)
from onnx_importer.test_models import ATOL, RTOL, images, ort_run, tokens
from streamrt.onnx.importer import auto_dynamic_shapes, export_program, import_onnx, to_fx

pytestmark = pytest.mark.torch

_HOST_READS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default"}


def _targets(program: torch.export.ExportedProgram) -> set[str]:
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function"}


def _check(program: torch.export.ExportedProgram, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    module = program.module()
    got = module(*[torch.from_numpy(v) for v in feeds.values()])
    expected = ort_run(model, feeds)
    for g, e in zip(got, expected, strict=True):
        assert tuple(g.shape) == e.shape
        np.testing.assert_allclose(g.detach().numpy(), e, rtol=RTOL, atol=ATOL)


def test_dynamic_batch_classifier_runs_at_two_batch_sizes() -> None:
    rng = np.random.default_rng()
    model = conv_classifier(rng)
    batch = Dim("batch", min=1, max=64)
    program = export_program(model, [torch.randn(2, 3, 32, 32)], {"images": {0: batch}})
    assert not _targets(program) & _HOST_READS
    for n in (3, 7):
        _check(program, model, images(rng, n, 3, 32, 32))


def test_shape_gather_concat_reshape_stays_symbolic() -> None:
    rng = np.random.default_rng()
    model = flatten_by_shape(rng)
    program = export_program(model, [torch.randn(2, 4, 5, 6)], ({0: Dim("n")},))
    targets = _targets(program)
    assert not targets & _HOST_READS
    # The reshape target is built from the symbolic batch size, not from a tensor.
    reshape = next(n for n in program.graph.nodes if str(n.target) == "aten.reshape.default")
    assert any(isinstance(d, torch.fx.Node) and "sym_size" in str(d.target) for d in reshape.args[1])
    for n in (1, 9):
        _check(program, model, {"x": rng.standard_normal((n, 4, 5, 6)).astype(np.float32)})


def test_yolo_head_dynamic_batch_and_resolution() -> None:
    rng = np.random.default_rng()
    model = yolo_head(rng)
    batch, h32, w32 = Dim("batch", min=1, max=32), Dim("h32", min=1, max=40), Dim("w32", min=1, max=40)
    program = export_program(model, [torch.randn(2, 3, 64, 96)], {"images": {0: batch, 2: 32 * h32, 3: 32 * w32}})
    targets = _targets(program)
    assert not targets & _HOST_READS
    assert "aten.upsample_nearest2d.vec" in targets  # the YOLO Resize takes the F.interpolate path
    for shape in ((2, 3, 64, 96), (3, 3, 128, 64), (1, 3, 32, 32)):
        _check(program, model, images(rng, *shape))


def test_resize_sizes_computed_from_symbolic_shape() -> None:
    rng = np.random.default_rng()
    model = resize_by_computed_sizes(rng)
    dims = {0: Dim("n", min=1, max=8), 2: Dim("h", min=2, max=64), 3: Dim("w", min=2, max=64)}
    program = export_program(model, [torch.randn(2, 3, 8, 10)], (dims,))
    assert not _targets(program) & _HOST_READS
    for shape in ((2, 3, 8, 10), (1, 3, 5, 7), (3, 3, 17, 4)):
        _check(program, model, {"x": rng.standard_normal(shape).astype(np.float32)})


def test_transformer_dynamic_batch_and_sequence() -> None:
    rng = np.random.default_rng()
    model = transformer_block(rng)
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=2, max=256)
    example = tokens(rng, 2, 7)
    program = export_program(
        model,
        [torch.from_numpy(v) for v in example.values()],
        {"tokens": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}},
    )
    assert not _targets(program) & _HOST_READS
    for b, s in ((2, 7), (4, 13), (1, 30)):
        _check(program, model, tokens(rng, b, s))


def test_auto_dynamic_shapes_follow_onnx_dim_params() -> None:
    rng = np.random.default_rng()
    model = transformer_block(rng)
    module = import_onnx(model)
    specs = auto_dynamic_shapes(module)
    assert specs[0] is not None and specs[1] is not None
    assert specs[0][0] is specs[1][0]  # both inputs share the named "batch" dim
    example = tokens(rng, 3, 5)
    program = export_program(module, [torch.from_numpy(v) for v in example.values()], "auto")
    _check(program, model, tokens(rng, 5, 8))


def test_to_fx_returns_a_callable_graph_module() -> None:
    rng = np.random.default_rng()
    model = conv_classifier(rng)
    gm = to_fx(model, [torch.randn(2, 3, 32, 32)], ({0: Dim("batch")},))
    assert isinstance(gm, torch.fx.GraphModule)
    feeds = images(rng, 4, 3, 32, 32)
    (logits,) = gm(torch.from_numpy(feeds["images"]))
    np.testing.assert_allclose(logits.detach().numpy(), ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)
    # Initializers are weights of the exported program, not inputs.
    program = export_program(model, [torch.randn(2, 3, 32, 32)])
    assert list(program.graph_signature.user_inputs) == ["images"]
    assert program.graph_signature.inputs_to_buffers
