"""Build-time shape verification: a fresh plan is run at the corners of each profile against the reference.

A dynamic-shape engine can be right at the size it was tuned for and wrong elsewhere: an
AOTInductor plan baked torch's ceil-mode choice in at the example size, and a stride-32
detector plan accepted 336x336 (the model only runs at multiples of 32) and returned a map read
out of bounds, different on every call. Neither raised an error. So before a plan is written,
:func:`verify_build` runs it at every profile's min, opt and max shapes and at one odd size
between them for every dynamic dimension (on the profile's multiple-of grid), each twice, and
compares it with the reference: ONNX Runtime fp32 on the *source* model (before any precision
transform). The build is refused when

- the reference itself fails at a corner (the model cannot run at that size),
- an output's shape differs, or an output is non-finite where the reference is finite,
- an output's relative L2 error ``||plan - ref|| / ||ref||`` exceeds the precision's tolerance
  (:data:`TOLERANCE`; fp16/bf16/int8 values are judged by the accuracy gate, here only gross
  errors count),
- two identical calls disagree (relative L2 above 1e-6).

The message names the profile, the input shapes and the output; when a multiple-of constraint
makes the failure go away (probed with odd multiples of 2, 4, ... 128) it suggests the
``--shape-multiple`` to rebuild with. The result (shapes, errors, seconds) is stored in the
manifest's ``extra["shape_verification"]`` and one progress line reports what it cost.

It is on by default for every backend except ONNX Runtime (whose plans are the reference run
on the same library); ``BuildConfig.verify_shapes`` / ``--[no-]verify-shapes`` decide otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt.config import BuildConfig
from streamrt.errors import BuildError
from streamrt.onnx.model import OnnxModel
from streamrt.plan import Plan, PlanManifest
from streamrt.running.inputs import cast_inputs, random_inputs, to_device, to_numpy
from streamrt.types import Shape, ShapeProfile, ShapeRange, format_shape

__all__ = ["TOLERANCE", "CornerCheck", "corner_shapes", "verify_build", "verify_engine", "wants_verification"]

log = logging.getLogger(__name__)

#: Relative L2 error allowed per precision. Reduced precisions have their own accuracy gate:
#: here only errors that no precision explains (garbage, out-of-bounds reads) refuse a build.
TOLERANCE: dict[str, float] = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 0.5, "bf16": 0.5, "int8": 0.5}
#: Two identical calls must agree this closely (relative L2; atomics may change the last bits).
DETERMINISM = 1e-6
_PROBE_MULTIPLES = (2, 4, 8, 16, 32, 64, 128)
_SEED = 0

Shapes = dict[str, Shape]
Arrays = dict[str, np.ndarray]
Runner = Callable[[Arrays], Arrays]


@dataclass(frozen=True)
class CornerCheck:
    """One verified (or failed) set of input shapes.

    Attributes:
        profile: profile index.
        label: ``min``, ``opt``, ``max`` or ``odd``.
        shapes: the input shapes.
        rel_l2: relative L2 error of each output against the reference.
        problem: why the shapes fail, ``None`` when they pass.
    """

    profile: int
    label: str
    shapes: Shapes
    rel_l2: Mapping[str, float]
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "label": self.label,
            "inputs": {n: format_shape(s) for n, s in self.shapes.items()},
            "rel_l2": {n: float(f"{v:.3g}") for n, v in self.rel_l2.items()},
        }


def wants_verification(config: BuildConfig) -> bool:
    """``config.verify_shapes``, defaulting to on for every backend but ONNX Runtime."""
    if config.verify_shapes is not None:
        return config.verify_shapes
    return config.backend != "onnxruntime"


def _odd_value(lo: int, opt: int, hi: int, step: int) -> int | None:
    """A value between lo and hi, an odd multiple of ``step``, near the middle, not lo/opt/hi if possible."""
    first, last = -(-lo // step), hi // step
    middle = (lo + hi) // (2 * step)
    candidates = sorted(range(first, last + 1), key=lambda q: (abs(q - middle), q))
    for accept in (lambda v: v not in (lo, opt, hi), lambda v: True):
        for q in candidates:
            if q % 2 == 1 and accept(q * step):
                return q * step
    return None


def _odd_range_shape(rng: ShapeRange) -> Shape:
    out = []
    for lo, opt, hi, step in zip(rng.min, rng.opt, rng.max, rng.multiples, strict=True):
        value = _odd_value(lo, opt, hi, step) if lo != hi else None
        out.append(value if value is not None else opt)
    return tuple(out)


def corner_shapes(profile: ShapeProfile) -> list[tuple[str, Shapes]]:
    """min, opt, max and (when it differs from those) an odd size between, as input shapes by name."""
    corners: list[tuple[str, Shapes]] = []
    for label in ("min", "opt", "max"):
        corners.append((label, {n: tuple(getattr(r, label)) for n, r in profile.ranges.items()}))
    corners.append(("odd", {n: _odd_range_shape(r) for n, r in profile.ranges.items()}))
    unique: list[tuple[str, Shapes]] = []
    for label, shapes in corners:
        if all(shapes != seen for _, seen in unique):
            unique.append((label, shapes))
    return unique


def _rel_l2(ref: np.ndarray, got: np.ndarray) -> float:
    a, b = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    scale = float(np.linalg.norm(a[finite]))
    diff = float(np.linalg.norm(a[finite] - b[finite]))
    return diff / scale if scale > 0 else diff


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(text[0] if text else '')[:300]}"


def _describe(shapes: Shapes) -> str:
    return ", ".join(f"{n}={format_shape(s)}" for n, s in shapes.items())


def _check(
    reference: Runner, plan: Runner, profile: int, label: str, shapes: Shapes, inputs: Arrays, tolerance: float
) -> CornerCheck:
    where = f"at {_describe(shapes)} (profile {profile}, {label})"
    try:
        want = reference(inputs)
    except Exception as exc:
        return CornerCheck(profile, label, shapes, {}, f"the reference fails {where}: {_first_line(exc)}")
    try:
        first, second = plan(inputs), plan(inputs)
    except Exception as exc:
        return CornerCheck(profile, label, shapes, {}, f"the plan fails {where}: {_first_line(exc)}")
    errors: dict[str, float] = {}
    for name, ref in want.items():
        got, again = first.get(name), second.get(name)
        if got is None or again is None:
            return CornerCheck(profile, label, shapes, errors, f"output '{name}' is missing {where}")
        if got.shape != ref.shape:
            problem = (
                f"output '{name}' has shape {format_shape(got.shape)} {where}, "
                f"the reference gives {format_shape(ref.shape)}"
            )
            return CornerCheck(profile, label, shapes, errors, problem)
        if np.any(~np.isfinite(got) & np.isfinite(ref.astype(np.float64))):
            return CornerCheck(profile, label, shapes, errors, f"output '{name}' has NaN/inf {where}")
        if again.shape != got.shape or _rel_l2(got, again) > DETERMINISM:
            problem = (
                f"two identical calls give different '{name}' {where} (relative L2 "
                f"{_rel_l2(got, again) if again.shape == got.shape else float('inf'):.2e}): "
                "the plan reads memory it does not own"
            )
            return CornerCheck(profile, label, shapes, errors, problem)
        errors[name] = _rel_l2(ref, got)
        if errors[name] > tolerance:
            problem = (
                f"output '{name}' differs from the reference {where}: relative L2 error "
                f"{errors[name]:.2e} > {tolerance:g}"
            )
            return CornerCheck(profile, label, shapes, errors, problem)
    return CornerCheck(profile, label, shapes, errors)


def _probe_dims(rng: ShapeRange) -> list[int]:
    """The dimensions a multiple-of constraint is probed on: dynamic ones, the batch only if alone."""
    dynamic = [d for d, (lo, hi) in enumerate(zip(rng.min, rng.max, strict=True)) if lo != hi]
    spatial = [d for d in dynamic if d > 0]
    return spatial if len(rng.min) >= 3 and spatial else dynamic


def _probe(profile: ShapeProfile, step: int) -> tuple[Shapes, dict[str, Shape]] | None:
    """Shapes whose probed dimensions are odd multiples of ``step`` (so not of ``2 * step``), and
    the multiple-of constraint that would admit them; ``None`` when the ranges hold no such size."""
    shapes: Shapes = {}
    multiples: dict[str, Shape] = {}
    for name, rng in profile.ranges.items():
        shape, multiple = list(rng.opt), list(rng.multiples)
        for d in _probe_dims(rng):
            if step % multiple[d]:
                continue
            value = _odd_value(rng.min[d], rng.opt[d], rng.max[d], step)
            if value is None:
                return None
            shape[d], multiple[d] = value, step
        shapes[name] = tuple(shape)
        if any(m > 1 for m in multiple):
            multiples[name] = tuple(multiple)
    return (shapes, multiples) if multiples else None


def _suggest(
    reference: Runner,
    plan: Runner,
    profile: ShapeProfile,
    index: int,
    make: Callable[[Shapes], Arrays],
    tolerance: float,
) -> str | None:
    """The ``--shape-multiple`` under which the plan passes at a probe size, if a small one does."""
    for step in _PROBE_MULTIPLES:
        probe = _probe(profile, step)
        if probe is None:
            return None
        shapes, multiples = probe
        if _check(reference, plan, index, "probe", shapes, make(shapes), tolerance).problem is None:
            return "--shape-multiple " + ",".join(f"{n}:{format_shape(m)}" for n, m in multiples.items())
    return None


def _reference_runner(model: OnnxModel) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures become exceptions here; ORT's own log would repeat them
    source = str(model.path) if model.path is not None else model.proto.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs: Arrays) -> Arrays:
        return dict(zip(names, (np.asarray(v) for v in session.run(names, inputs)), strict=True))

    return run


@dataclasses.dataclass
class _PlanRunner:
    engine: Any

    def __post_init__(self) -> None:
        self.ctx = self.engine.create_context()

    def __call__(self, inputs: Arrays) -> Arrays:
        feeds = to_device(cast_inputs(inputs, self.engine.inputs), self.engine.device_kind)
        outputs = self.ctx.infer(feeds)
        if self.engine.device_kind == "cuda":
            import torch

            torch.cuda.synchronize()
        return {name: np.array(to_numpy(v)) for name, v in outputs.items()}


def _inputs_for(model: OnnxModel) -> Callable[[Shapes], Arrays]:
    def make(shapes: Shapes) -> Arrays:
        return random_inputs(model.inputs, shapes, np.random.default_rng(_SEED))

    return make


def verify_engine(
    reference: OnnxModel, engine: Any, profiles: Sequence[ShapeProfile], precision: str = "fp32"
) -> Iterator[CornerCheck]:
    """Run ``engine`` at every corner of ``profiles`` against ONNX Runtime fp32 on ``reference``.

    Yields one :class:`CornerCheck` per corner; a failed one carries ``problem`` and, where a
    multiple-of constraint fixes it, the suggestion in its text. Stops at the first failure.
    """
    ref = _reference_runner(reference)
    plan = _PlanRunner(engine)
    make = _inputs_for(reference)
    tolerance = TOLERANCE.get(precision, TOLERANCE["fp32"])
    try:
        for index, profile in enumerate(profiles):
            for label, shapes in corner_shapes(profile):
                check = _check(ref, plan, index, label, shapes, make(shapes), tolerance)
                if check.problem is not None:
                    suggestion = _suggest(ref, plan, profile, index, make, tolerance)
                    if suggestion is not None:
                        check = dataclasses.replace(check, problem=f"{check.problem}; it passes with {suggestion}")
                    yield check
                    return
                yield check
    finally:
        plan.ctx.close()


def verify_build(
    source: OnnxModel, manifest: PlanManifest, payload: bytes, config: BuildConfig, progress: Callable[[str], None]
) -> PlanManifest:
    """Verify a fresh plan at its profiles' corners (see module docs); return the manifest with the record.

    Raises:
        BuildError: a corner fails; the message names profile, shapes and output, the hint the fix.
    """
    if not wants_verification(config):
        if manifest.backend != "onnxruntime":
            progress("shape verification skipped (--no-verify-shapes)")
        return manifest
    from streamrt.backends import get_backend

    started = time.perf_counter()
    n_corners = sum(len(corner_shapes(p)) for p in manifest.profiles)
    progress(f"verifying {n_corners} shapes against ONNX Runtime fp32 (skip with --no-verify-shapes)")
    engine = get_backend(manifest.backend).load(Plan(manifest, payload))
    try:
        checks = list(verify_engine(source, engine, manifest.profiles, manifest.precision))
    finally:
        engine.close()
    seconds = time.perf_counter() - started
    failed = [c for c in checks if c.problem is not None]
    if failed:
        problem = str(failed[0].problem)
        values_only = all("differs from the reference" in str(c.problem) for c in failed)
        if "it passes with --shape-multiple" in problem:
            hint = "rebuild with that constraint (min/opt/max on its grid)"
        elif values_only and len(failed) == len(checks) and manifest.precision not in ("fp32", "tf32"):
            # Every shape is wrong by value, none by shape: the precision, not the profile, is at fault.
            hint = (
                f"every verified shape differs, so {manifest.precision} itself loses this model (see the accuracy "
                "line above: values out of the type's range); build at --precision fp32, or keep the affected "
                "ops in fp32 with --fp32-ops"
            )
        else:
            hint = "narrow the profile to sizes the model supports, or add --shape-multiple NAME:1x1xNxN"
        raise BuildError(f"shape verification failed: {problem}", hint=f"{hint}; --no-verify-shapes skips this check")
    worst = max((v for c in checks for v in c.rel_l2.values()), default=0.0)
    progress(f"verified {len(checks)} shapes in {seconds:.1f} s (worst relative L2 error {worst:.1e})")
    record = {
        "reference": "onnxruntime fp32 (source model)",
        "seconds": round(seconds, 3),
        "checks": [c.to_json() for c in checks],
    }
    return dataclasses.replace(manifest, extra={**manifest.extra, "shape_verification": record})
