"""Build-time shape verification (streamrt.building.verify): corners, refusals with a suggested constraint, the record.

Real engines throughout: ONNX Runtime plans of models that disagree with the reference, and
torch_inductor CPU plans (marked slow: each compiles C++ for tens of seconds): a stride-4 network
with a skip connection that, built without a multiple-of constraint, returns 68x68 maps for a 66x66
input that differ between two identical calls (issue 11, item 5: the same failure as a text
detector's 352x352 map at 336x336), a detector head whose map is ~0 on random noise (issue 24:
refused by the relative L2 measure) and a ceil-mode MTCNN P-Net built with ``build_module``
(issue 24, item 2a: 43x60 maps at 97x131 where eager PyTorch gives 44x61).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import streamrt
from streamrt.building.verify import (
    TOLERANCE,
    corner_shapes,
    scaled_error,
    user_inputs,
    verify_engine,
    wants_verification,
)
from streamrt.building.verify.shapes import probes
from streamrt.cli.main import main
from streamrt.config import BuildConfig
from streamrt.device.threads import usable_cores
from streamrt.errors import BuildError, ShapeError
from streamrt.onnx.model import load_model
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec, parse_shape

FREE = ShapeRange((1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 128, 128))
ON_GRID = ShapeRange((1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 128, 128), (1, 1, 4, 4))


def _stride4_skip(path: Path, seed: int = 0) -> Path:
    """conv s2 -> relu -> conv s2 -> 1x1 conv -> Resize x4 -> Add(input): runs only at multiples of 4."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [
        w("w1", 4, 3, 3, 3),
        w("w2", 4, 4, 3, 3),
        w("w3", 3, 4, 1, 1),
        numpy_helper.from_array(np.array([1, 1, 4, 4], np.float32), "scales"),
        numpy_helper.from_array(np.array([], np.float32), "roi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["ar", "w2"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "w3"], ["c"]),
        helper.make_node("Resize", ["c", "roi", "scales"], ["u"], mode="nearest"),
        helper.make_node("Add", ["u", "x"], ["y"], name="skip_add"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _pool(path: Path, ceil_mode: int) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, None, None])
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=ceil_mode)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def _ort_engine(model: Path, rng: ShapeRange, tmp: Path) -> Any:
    config = BuildConfig(profiles=(ShapeProfile({"x": rng}),))
    return streamrt.load(streamrt.build(model, config, tmp / f"{model.stem}.plan", cache=False).path)


def test_corners_are_min_opt_max_and_an_odd_size_on_the_grid() -> None:
    corners = dict(corner_shapes(ShapeProfile({"x": FREE})))
    assert corners["min"]["x"] == (1, 3, 32, 32) and corners["max"]["x"] == (1, 3, 128, 128)
    assert all(d % 2 == 1 for d in corners["odd"]["x"][2:])
    on_grid = dict(corner_shapes(ShapeProfile({"x": ON_GRID})))["odd"]["x"]
    assert all(d % 4 == 0 and (d // 4) % 2 == 1 for d in on_grid[2:])
    fixed = corner_shapes(ShapeProfile({"x": ShapeRange.fixed((1, 3, 8, 8))}))
    assert [label for label, _ in fixed] == ["min"]


def test_default_is_on_for_every_backend_but_onnxruntime() -> None:
    assert wants_verification(BuildConfig(backend="torch_inductor"))
    assert not wants_verification(BuildConfig(backend="torch_inductor", verify_shapes=False))
    assert not wants_verification(BuildConfig())
    assert wants_verification(BuildConfig(verify_shapes=True))


def test_reference_failure_refuses_the_build_and_suggests_the_multiple(tmp_path: Path) -> None:
    model = _stride4_skip(tmp_path / "skip.onnx")
    config = BuildConfig(profiles=(ShapeProfile({"x": FREE}),), verify_shapes=True)
    with pytest.raises(BuildError, match=r"the reference fails at x=1x3x\d+x\d+ \(profile 0, odd\)") as info:
        streamrt.build(model, config, tmp_path / "skip.plan", cache=False)
    assert "running Add node. Name:'skip_add'" in str(info.value)  # ONNX Runtime names the node
    assert "it passes with --shape-multiple x:1x1x4x4" in str(info.value)
    assert "--no-verify-shapes" in str(info.value)
    assert not (tmp_path / "skip.plan").exists()
    lines: list[str] = []
    good = config.replace(profiles=(ShapeProfile({"x": ON_GRID}),))
    result = streamrt.build(model, good, tmp_path / "skip.plan", cache=False, progress=lines.append)
    record = result.manifest.extra["shape_verification"]
    assert [c["label"] for c in record["checks"]] == ["min", "opt", "max", "odd"]
    assert any(line.startswith("verified 4 shapes in") for line in lines)


def test_a_plan_with_wrong_shapes_at_odd_sizes_is_caught(tmp_path: Path) -> None:
    reference = load_model(_pool(tmp_path / "ceil.onnx", ceil_mode=1))
    floor_engine = _ort_engine(_pool(tmp_path / "floor.onnx", ceil_mode=0), FREE, tmp_path)
    checks = list(verify_engine(reference, floor_engine, floor_engine.profiles))
    assert [c.problem is None for c in checks] == [True, True, True, False]
    expected = "output 'y' has shape 1x3x39x39 at x=1x3x79x79 (profile 0, odd), the reference gives 1x3x40x40"
    assert expected in str(checks[-1].problem)


def test_a_plan_with_wrong_values_is_caught(tmp_path: Path) -> None:
    reference = load_model(_stride4_skip(tmp_path / "a.onnx", seed=0))
    other = _ort_engine(_stride4_skip(tmp_path / "b.onnx", seed=1), ON_GRID, tmp_path)
    (check,) = verify_engine(reference, other, other.profiles)
    assert check.label == "min" and "output 'y' differs from the reference" in str(check.problem)
    assert "max |plan - ref|" in str(check.problem) and "x max(max|ref|, 0.01), allowed 0.001" in str(check.problem)


class _NoisyContext:
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        return {"y": x + np.random.default_rng().standard_normal(x.shape).astype(np.float32) * 1e-3}

    def close(self) -> None:
        pass


class _NoisyEngine:
    """An engine whose two identical calls differ (as a plan reading memory it does not own)."""

    inputs = (TensorSpec("x", DType.FLOAT32, (1, 3, -1, -1)),)
    device_kind = "cpu"

    def create_context(self) -> _NoisyContext:
        return _NoisyContext()


def test_two_calls_that_disagree_are_caught(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "id.onnx")
    (check,) = verify_engine(load_model(tmp_path / "id.onnx"), _NoisyEngine(), (ShapeProfile({"x": FREE}),))
    assert "two identical calls give different 'y'" in str(check.problem)


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _stride4_skip(tmp_path / "skip.onnx")
    base = ["build", str(model), "-o", str(tmp_path / "p.plan"), "--no-cache"]
    base += ["--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:1x3x64x64", "--max-shapes", "x:1x3x128x128"]
    assert main([*base, "--verify-shapes"]) == 2
    err = capsys.readouterr().err
    assert "shape verification failed" in err and "--shape-multiple x:1x1x4x4" in err
    assert main(base) == 0  # onnxruntime plans are the reference: not verified by default
    capsys.readouterr()
    assert main([*base, "--backend", "torch_inductor", "--no-verify-shapes", "--option", "device=nope"]) == 2
    assert "device must be auto, cuda or cpu" in capsys.readouterr().err


@pytest.mark.torch
@pytest.mark.slow
def test_torch_inductor_plan_reading_out_of_bounds_is_refused_at_build_and_at_run_time(tmp_path: Path) -> None:
    """Issue 24, item 3: a plan built without verification answers at sizes off the model's grid
    with memory nobody wrote (two identical calls may differ); verification refuses it with the right
    constraint, and the plan rebuilt with that constraint refuses the off-grid size when it runs."""
    model = _stride4_skip(tmp_path / "skip.onnx")
    config = BuildConfig(
        backend="torch_inductor",
        profiles=(ShapeProfile({"x": FREE}),),
        backend_options={"device": "cpu"},
        verify_shapes=False,
    )
    engine = streamrt.load(streamrt.build(model, config, tmp_path / "skip.plan", cache=False).path)
    # Launch overhead and thread policy defaults (issue 11, items 6 and 7) recorded in the plan:
    settings = engine.manifest.build_settings["backend"]
    assert settings["threads"] == 0 and settings["cuda_graphs"] is True
    assert engine.create_context(threads=1).threads == 1
    assert 1 <= engine.create_context().threads <= max(1, usable_cores() - 1)
    ctx = engine.create_context()
    x = np.random.default_rng().standard_normal((1, 3, 66, 66)).astype(np.float32)
    first = np.array(ctx.infer({"x": x})["y"])
    ctx.infer({"x": np.full((1, 3, 68, 68), 1e3, np.float32)})  # another call between them
    second = ctx.infer({"x": x})["y"]
    # A map for a size the model cannot run at (ONNX Runtime refuses 66x66), computed partly from
    # memory nobody wrote. Whether two calls then differ is chance (4e21 apart in one run, equal in
    # others), so it is reported, not asserted: the refusal below rests on the reference failing.
    assert first.shape == second.shape == (1, 3, 68, 68)
    print("two identical calls at 66x66 differ:", not np.array_equal(first, second))
    checks = list(verify_engine(load_model(model), engine, engine.profiles))
    problem = str(checks[-1].problem)
    assert checks[-1].label == "odd", problem
    assert "the reference fails at x=1x3x79x79" in problem and "Add node" in problem
    # The refusal rests on the reference failing there; whether the plan's two answers also differ
    # depends on what the unwritten memory held (said when they do, not needed for the refusal).
    assert "the plan answers there anyway ('y' 1x3x80x80)" in problem
    multiple = re.search(r"it passes with --shape-multiple x:(\S+)$", problem)
    assert multiple is not None and multiple.group(1) == "1x1x4x4", problem
    # Rebuilt with the suggested constraint (verification on, the default): built, and the constraint
    # is in the plan, so the off-grid size is refused at run time instead of answered.
    on_grid = ShapeRange(FREE.min, FREE.opt, FREE.max, parse_shape(multiple.group(1)))
    good = config.replace(profiles=(ShapeProfile({"x": on_grid}),), verify_shapes=None)
    result = streamrt.build(model, good, tmp_path / "grid.plan", cache=False)
    assert [c["label"] for c in result.manifest.extra["shape_verification"]["checks"]] == ["min", "opt", "max", "odd"]
    ctx = streamrt.load(result.path).create_context()
    with pytest.raises(ShapeError, match=r"dimension 2 of 'x' is 66, must be a multiple of 4"):
        ctx.infer({"x": x})
    x68 = np.random.default_rng().standard_normal((1, 3, 68, 68)).astype(np.float32)
    np.testing.assert_allclose(ctx.infer({"x": x68})["y"], onnxruntime_run(load_model(model), x68), atol=1e-4)


def _detector(path: Path) -> Path:
    """A tiny text-detector head: conv3x3 -> ReLU -> conv1x1 with bias -12 -> sigmoid. On random
    noise its map is ~1e-5 everywhere; on a page's strokes it reaches 1."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((np.abs(rng.standard_normal((4, 3, 3, 3))) * 0.05).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((1, 4, 1, 1)) * 0.1 + 0.2).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([-12.0], np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["prob"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, "h", "w"])
    onnx.save(helper.make_model(helper.make_graph(nodes, "det", [x], [y], inits),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.torch
@pytest.mark.slow
def test_a_detector_near_zero_on_noise_builds_on_torch_inductor_and_matches_on_a_page(tmp_path: Path) -> None:
    """Issue 24, item 3: refused before (inductor's sigmoid vs ONNX Runtime's, 1e-7 apart on a ~1e-5
    map, read as 0.6 % relative L2); builds without flags now and matches ONNX Runtime on a page."""
    model = _detector(tmp_path / "det.onnx")
    profile = ShapeProfile({"x": ShapeRange((1, 3, 32, 32), (1, 3, 48, 48), (1, 3, 64, 64))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options={"device": "cpu"})
    result = streamrt.build(model, config, tmp_path / "det.plan", cache=False)
    record = result.manifest.extra["shape_verification"]
    assert record["inputs"] == "random inputs" and len(record["checks"]) == 4
    page = _page((1, 3, 48, 48))
    want = onnxruntime_run(load_model(model), page)
    got = streamrt.load(result.path).create_context().infer({"x": page})["prob"]
    assert want.max() > 0.9 and np.median(want) < 1e-4  # strokes found, background empty
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.torch
@pytest.mark.slow
def test_build_module_is_verified_against_the_eager_module(tmp_path: Path) -> None:
    """Issue 24, item 2a: a ceil-mode face net (MTCNN P-Net) built from its module with a dynamic
    profile answered at 97x131 with 43x60 maps where eager PyTorch gives 44x61. Now the plan is
    right there or the build is refused (naming the shape and the constraint that fixes it)."""
    import torch

    from streamrt.testing.zoo_nets import MTCNNPNet

    torch.manual_seed(0)
    net = MTCNNPNet().eval()
    profile = ShapeProfile({"image": ShapeRange((1, 3, 24, 24), (1, 3, 64, 64), (1, 3, 160, 160))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options={"device": "cpu"})
    x = torch.randn(1, 3, 97, 131)
    with torch.no_grad():
        want = [t.numpy() for t in net(x)]
    assert want[0].shape == (1, 2, 44, 61)
    try:
        result = streamrt.build_module(net, [torch.randn(1, 3, 64, 64)], tmp_path / "pnet.plan", config,
                                       input_names=["image"], output_names=["prob", "box"],
                                       cache_dir=tmp_path / "cache")
    except BuildError as exc:
        assert "output 'prob' has shape 1x2x40x40 at image=1x3x91x91 (profile 0, odd)" in str(exc)
        assert "the reference gives 1x2x41x41; it passes with --shape-multiple image:1x1x2x2" in str(exc)
        assert not (tmp_path / "pnet.plan").exists()
        return
    got = streamrt.load(result.path).create_context().infer({"image": x.numpy()})
    for name, ref in zip(("prob", "box"), want, strict=True):
        assert got[name].shape == ref.shape, f"'{name}' at 97x131: {got[name].shape}, eager {ref.shape}"
        np.testing.assert_allclose(got[name], ref, atol=1e-4)
    assert result.manifest.extra["shape_verification"]["reference"] == "eager PyTorch fp32 (the module)"


def test_a_precision_that_loses_every_shape_says_so(tmp_path: Path) -> None:
    """Outputs below fp16's range (seen on the H200 with random-weight MobileNetV3/EfficientNet, |y| ~ 1e-10):
    every corner differs by value, so the hint names the precision, not the profile."""
    scale = numpy_helper.from_array(np.full((1,), 1e-10, np.float32), "scale")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "tiny", [x], [y], [scale])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    config = BuildConfig(precision="fp16", verify_shapes=True,
                         profiles=(ShapeProfile({"x": ShapeRange((1, 4), (2, 4), (8, 4))}),))
    with pytest.raises(BuildError, match="every verified shape differs, so fp16 itself loses this model"):
        streamrt.build(path, config, tmp_path / "tiny.plan", cache=False)
    assert not (tmp_path / "tiny.plan").exists()


def _score_map(path: Path, *, sigmoid: str = "Sigmoid", bias: float = -12.0) -> Path:
    """A detector head ``sigmoid(0.1 * (r + g + b) + bias)``: ~1e-5 on random noise (no text there),
    up to ~0.5 on a page whose strokes are 40. ``sigmoid="exp"`` computes ``1 / (1 + exp(-z))``
    instead of ONNX Runtime's Sigmoid, whose approximation is good to ~1e-7 absolute: the same
    function, different rounding, like a plan of another backend."""
    inits = [
        numpy_helper.from_array(np.full((1, 3, 1, 1), 0.1, np.float32), "w"),
        numpy_helper.from_array(np.array([bias], np.float32), "b"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["z"])]
    if sigmoid == "Sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["z"], ["y"]))
    else:
        inits.append(numpy_helper.from_array(np.array([1.0], np.float32), "one"))
        nodes += [
            helper.make_node("Neg", ["z"], ["nz"]),
            helper.make_node("Exp", ["nz"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["d"]),
            helper.make_node("Div", ["one", "d"], ["y"]),
        ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _page(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A synthetic text page: background 0 with a little noise, strokes (short bars) at 40."""
    rng = np.random.default_rng(seed)
    page = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    h, w = shape[2], shape[3]
    for _ in range(6):
        top, left = int(rng.integers(0, h - 3)), int(rng.integers(0, w - 12))
        page[:, :, top : top + 2, left : left + int(rng.integers(4, 12))] = 40.0
    return page


def test_outputs_near_zero_on_noise_are_judged_on_their_scale(tmp_path: Path) -> None:
    """Issue 24, item 3: relative L2 read ONNX Runtime's 1e-7 sigmoid rounding on a ~1e-5 map as
    0.5 % error and refused the plan; relative to the output's scale with a floor, it passes."""
    reference = load_model(_score_map(tmp_path / "sigmoid.onnx"))
    plan = _ort_engine(_score_map(tmp_path / "exp.onnx", sigmoid="exp"), FREE, tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = onnxruntime_run(reference, x)
    got = plan.create_context().infer({"x": x})["y"]
    assert want.max() < 1e-4 and np.abs(got - want).max() < 1e-6  # tiny map, tiny absolute error
    assert np.linalg.norm(got - want) / np.linalg.norm(want) > 1e-3  # what the old measure refused
    checks = list(verify_engine(reference, plan, plan.profiles))
    assert [c.problem for c in checks] == [None] * 4
    assert max(c.errors["y"] for c in checks) < 0.1 * TOLERANCE["fp32"].rel  # 1.4e-5 here
    # A map that is wrong by more than the floor allows is still refused on the same noise:
    lost = _ort_engine(_score_map(tmp_path / "lost.onnx", bias=-9.0), FREE, tmp_path)
    (check,) = verify_engine(reference, lost, lost.profiles)
    assert "output 'y' differs from the reference at x=1x3x32x32 (profile 0, min)" in str(check.problem)


def onnxruntime_run(model: Any, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return np.asarray(ort.InferenceSession(model.proto.SerializeToString()).run(None, {"x": x})[0])


def test_sample_inputs_are_used_where_their_shapes_fit_and_recorded(tmp_path: Path) -> None:
    """Real data catches what noise cannot: a head whose bias is off by 0.5 gives ~1e-5 maps that
    agree to 1e-5 on noise, but 40 % lower scores on a page's strokes."""
    reference = _score_map(tmp_path / "ref.onnx")
    np.savez(tmp_path / "page.npz", x=_page((1, 3, 64, 64)))  # the opt shape
    np.savez(tmp_path / "odd_page.npz", x=_page((1, 3, 40, 40)))  # inside the profile, no corner
    config = BuildConfig(profiles=(ShapeProfile({"x": FREE}),), verify_shapes=True, sample_inputs=tmp_path / "page.npz")
    lines: list[str] = []
    result = streamrt.build(reference, config, tmp_path / "ok.plan", cache=False, progress=lines.append)
    record = result.manifest.extra["shape_verification"]
    assert [(c["label"], c["data"]) for c in record["checks"]] == [
        ("min", "random"), ("opt", "sample inputs page.npz"), ("max", "random"), ("odd", "random"),
    ]
    assert record["inputs"] == "random inputs at min, max, odd; sample inputs page.npz at opt"
    assert any(line.startswith("verifying 4 shapes against ONNX Runtime fp32 (source model) on random inputs at "
                               "min, max, odd; sample inputs page.npz at opt") for line in lines), lines
    off = _ort_engine(_score_map(tmp_path / "off.onnx", bias=-12.5), FREE, tmp_path)
    checks = list(verify_engine(load_model(reference), off, off.profiles, inputs=None))
    assert [c.problem for c in checks] == [None] * 4  # random noise alone cannot see it
    source = load_model(reference)
    checks = list(verify_engine(source, off, off.profiles, inputs=user_inputs(source.inputs, config)))
    assert [c.problem is None for c in checks] == [True, False]
    assert "at x=1x3x64x64 (profile 0, opt, sample inputs page.npz)" in str(checks[-1].problem)
    # A sample at shapes that are no corner is verified at its own shapes, in addition:
    odd = config.replace(sample_inputs=tmp_path / "odd_page.npz")
    record = streamrt.build(reference, odd, tmp_path / "odd.plan", cache=False).manifest.extra["shape_verification"]
    assert record["checks"][-1]["label"] == "sample" and record["checks"][-1]["inputs"] == {"x": "1x3x40x40"}


def _wrong_at_multiples_of_64(path: Path) -> Path:
    """``y = x + (height % 64 == 0)``: right at every height but multiples of 64 (e.g. the min corner)."""
    inits = [
        numpy_helper.from_array(np.array(2, np.int64), "axis"),
        numpy_helper.from_array(np.array(64, np.int64), "sixty_four"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "axis"], ["h"]),
        helper.make_node("Mod", ["h", "sixty_four"], ["rest"]),
        helper.make_node("Equal", ["rest", "zero"], ["on_grid"]),
        helper.make_node("Cast", ["on_grid"], ["wrong"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "wrong"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_hint_never_suggests_a_multiple_the_failing_shape_meets(tmp_path: Path) -> None:
    """Issue 24: a refusal at 320x320 suggested ``--shape-multiple x:1x1x2x2``, which 320 meets.
    Here the plan is wrong at heights that are multiples of 64 and right elsewhere: no multiple-of
    constraint excludes the failing 64x64 and still admits the probes that pass, so none is suggested."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "id.onnx")
    rng = ShapeRange((1, 3, 64, 64), (1, 3, 96, 96), (1, 3, 192, 192))
    plan = _ort_engine(_wrong_at_multiples_of_64(tmp_path / "grid.onnx"), rng, tmp_path)
    (check,) = verify_engine(load_model(tmp_path / "id.onnx"), plan, plan.profiles)
    assert "differs from the reference at x=1x3x64x64 (profile 0, min)" in str(check.problem)
    assert "it passes with" not in str(check.problem), check.problem


def test_the_error_is_relative_to_the_output_scale_with_an_absolute_floor() -> None:
    fp32, fp16 = TOLERANCE["fp32"], TOLERANCE["fp16"]
    tail = np.random.default_rng().uniform(1e-6, 4.1e-5, 64)  # a sigmoid map on noise
    assert scaled_error(tail, tail + 1.3e-7, fp32.floor) == pytest.approx(1.3e-5)  # 1.3e-7 absolute: passes
    logits = np.random.default_rng().uniform(-100, 100, 64)
    assert scaled_error(logits, logits + 0.5, fp32.floor) == pytest.approx(0.5 / np.abs(logits).max())
    assert scaled_error(logits, np.where(logits > 0, np.nan, logits), fp32.floor) == 0.0  # NaN is judged apart
    assert scaled_error(np.zeros(4), np.zeros(4), fp16.floor) == 0.0
    assert scaled_error(np.zeros(4), np.full(4, 1e-8), fp16.floor) == float("inf")
    # fp16 has no floor: logits of 1e-10 that underflow to 0 are lost, not "small"
    assert scaled_error(np.full(4, 1e-10), np.zeros(4), fp16.floor) == pytest.approx(1.0)  # > fp16.rel (0.5)


def test_probes_never_stand_for_a_constraint_the_failing_shape_meets() -> None:
    profile = ShapeProfile({"x": ShapeRange((1, 3, 320, 320), (1, 3, 640, 640), (1, 3, 960, 960))})
    steps = [multiples["x"][2] for _, multiples in probes(profile, {"x": (1, 3, 320, 320)})]
    assert steps == [128]  # 320 is a multiple of 2 .. 64
    steps = [multiples["x"][2] for _, multiples in probes(profile, {"x": (1, 3, 641, 641)})]
    assert steps == [2, 4, 8, 16, 32, 64, 128]
    shapes, _ = next(iter(probes(profile, {"x": (1, 3, 641, 641)})))
    assert all(d % 2 == 0 and d % 4 for d in shapes["x"][2:])  # odd multiples of 2: off the 4-grid
