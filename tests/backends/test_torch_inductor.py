"""torch_inductor backend on the CPU (Inductor's C++ path): build, save, load, run, errors.

Each AOTInductor build compiles C++ (tens of seconds on 2 cores), so this file builds few plans
and checks several things on each.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.building.builder import BuildResult
from streamrt.config import BuildConfig
from streamrt.errors import PlanMismatchError, ShapeError
from streamrt.plan import read_plan, write_plan
from streamrt.testing.models import CATALOGUE
from streamrt.types import ShapeProfile, ShapeRange

pytestmark = [pytest.mark.torch, pytest.mark.slow]

CPU = {"device": "cpu"}


@pytest.fixture(scope="module")
def two_profile_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ti")
    profiles = (
        ShapeProfile({"x": ShapeRange((1, 4, 6), (2, 4, 6), (4, 4, 6))}),
        ShapeProfile({"x": ShapeRange((5, 4, 6), (8, 4, 6), (16, 4, 6))}),
    )
    config = BuildConfig(backend="torch_inductor", profiles=profiles, backend_options=CPU)
    return streamrt.build(catalogue_file("dynamic_batch", tmp), config, tmp / "m.plan", cache=False).path


def test_runs_across_both_profiles_against_reference(two_profile_plan: Path) -> None:
    model = CATALOGUE["dynamic_batch"]
    engine = streamrt.load(two_profile_plan)
    assert engine.device_kind == "cpu" and len(engine.profiles) == 2
    ctx = engine.create_context()
    rng = np.random.default_rng()
    for batch in (1, 3, 4, 5, 11, 16):
        inputs = model.inputs(rng, batch)
        got = ctx.infer(inputs)
        want = model.reference(model.make(), inputs)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)


def test_shape_outside_every_profile(two_profile_plan: Path) -> None:
    ctx = streamrt.load(two_profile_plan).create_context()
    x = np.random.default_rng().standard_normal((17, 4, 6)).astype(np.float32)
    with pytest.raises(ShapeError, match=r"input 'x' has shape 17x4x6, outside every profile"):
        ctx.infer({"x": x})


@pytest.mark.parametrize("field", ["backend_version", "device"])
def test_plan_from_another_torch_or_cpu_is_refused(
    two_profile_plan: Path, tmp_path: Path, field: str
) -> None:
    plan = read_plan(two_profile_plan)
    value = "1.0.0" if field == "backend_version" else {**plan.manifest.device, "isa": "sse2"}
    foreign = tmp_path / "foreign.plan"
    write_plan(foreign, dataclasses.replace(plan.manifest, **{field: value}), plan.payload)
    with pytest.raises(PlanMismatchError, match="rebuild it here: streamrt build"):
        streamrt.load(foreign)


def test_build_from_pytorch_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    import torch

    from streamrt.building.module_builder import build_module

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    profile = ShapeProfile({"features": ShapeRange((1, 12), (4, 12), (32, 12))})
    result = build_module(
        net,
        [torch.randn(4, 12)],
        tmp_path / "net.plan",
        BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options=CPU),
        input_names=["features"],
        output_names=["scores"],
        cache_dir=tmp_path / "cache",
    )
    # The same result type as streamrt.build (issue 20 item 9: it was a bare Path).
    assert isinstance(result, BuildResult) and not result.cached and result.manifest.backend == "torch_inductor"
    # Verified at the profile's corners against the eager module before it was written (issue 24, 2a):
    record = result.manifest.extra["shape_verification"]
    assert record["reference"] == "eager PyTorch fp32 (the module)"
    assert [(c["label"], c["inputs"]["features"]) for c in record["checks"]] == [
        ("min", "1x12"), ("opt", "4x12"), ("max", "32x12"), ("odd", "15x12"),
    ]
    path = result.path
    # Inductor compiled into the cache the caller named, and the process environment is as before.
    assert any((tmp_path / "cache" / "inductor").iterdir()) and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    engine = streamrt.load(path)
    assert [s.name for s in engine.inputs] == ["features"] and engine.inputs[0].shape == (-1, 12)
    x = torch.randn(9, 12)
    got = engine.create_context().infer({"features": x})["scores"]
    with torch.no_grad():
        want = net.double()(x.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dynamic", [False, True])
def test_half_precision_wrapper_exports_static_and_dynamic(dynamic: bool) -> None:
    # fp16/bf16 module builds wrap the net in a forward(*args) cast; torch.export needs the
    # dynamic shapes nested for varargs and none at all for static profiles.
    import torch

    from streamrt.backends.torch_inductor.builder import export_profiles
    from streamrt.building.module_builder import _CastIO

    net = _CastIO(torch.nn.Linear(4, 2), torch.bfloat16)
    rng = ShapeRange((1, 4), (4, 4), (8, 4)) if dynamic else ShapeRange.fixed((3, 4))
    ep = export_profiles(net, ["x"], [torch.float32], ShapeProfile({"x": rng}), "cpu")
    assert bool(ep.range_constraints) == dynamic
