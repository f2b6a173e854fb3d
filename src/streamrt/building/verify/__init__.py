"""Build-time shape verification: a fresh plan is run at the corners of each profile against the reference.

A dynamic-shape engine can be right at the size it was tuned for and wrong elsewhere: an
AOTInductor plan baked torch's ceil-mode choice in at the example size, and a stride-32
detector plan accepted 336x336 (the model only runs at multiples of 32) and returned a map read
out of bounds, different on every call. Neither raised an error. So before a plan is written,
:func:`verify_build` (ONNX builds) and :func:`verify_module_build` (``streamrt.build_module``) run
it at every profile's min, opt and max shapes, at one odd size between them for every dynamic
dimension (an odd multiple of its ``--shape-multiple``, so off every coarser grid) and at the
shapes of the user's samples, and compare it with the reference: ONNX Runtime fp32 on the
*source* model (before any precision transform), or the eager module in fp32. Inputs are the
user's data where their shapes match (``--sample-inputs``, else the calibration samples), random
elsewhere; the progress line and the record say which. The build is refused when

- the reference itself fails at those shapes (the model cannot run at that size),
- an output's shape differs, or an output is non-finite where the reference is finite,
- an output's error ``max |plan - ref| / max(max |ref|, floor)`` exceeds the precision's
  tolerance (:data:`TOLERANCE`, the table in :mod:`streamrt.building.verify.measure`: relative to the
  output's scale, absolute below the floor, so outputs that are ~0 on random noise are judged
  fairly; fp16/bf16/int8 values are judged by the accuracy gate, here only gross errors count),
- two identical calls disagree; each is made after a run on a different poison feed, so a plan
  that reads memory nobody wrote gives two different answers.

The message names the profile, the input shapes and the output; when a multiple-of constraint
makes the failure go away (probed with odd multiples of 2, 4, ... 128, judged the same way, and
never one the failing shapes already meet) it suggests the ``--shape-multiple`` to rebuild with.
A plan built with it records the constraint in its profiles and refuses other sizes at run time
(``Engine.validate``). The result (shapes, inputs used, errors, seconds) is stored in the
manifest's ``extra["shape_verification"]`` and one progress line reports what it cost.

It is on by default for every backend except ONNX Runtime (whose plans are the reference run
on the same library); ``BuildConfig.verify_shapes`` / ``--[no-]verify-shapes`` decide otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from streamrt.building.verify.checks import CornerCheck, shape_sets, verify_engine
from streamrt.building.verify.measure import TOLERANCE, Tolerance, scaled_error, tolerance_for
from streamrt.building.verify.references import Inputs, Reference, module_reference, onnx_reference, user_inputs
from streamrt.building.verify.shapes import corner_shapes
from streamrt.config import BuildConfig
from streamrt.errors import BuildError
from streamrt.onnx.model import OnnxModel
from streamrt.plan import Plan, PlanManifest

__all__ = [
    "TOLERANCE",
    "CornerCheck",
    "Inputs",
    "Reference",
    "Tolerance",
    "corner_shapes",
    "module_reference",
    "onnx_reference",
    "scaled_error",
    "user_inputs",
    "verify_build",
    "verify_engine",
    "verify_module_build",
    "verify_plan",
    "wants_verification",
]

log = logging.getLogger(__name__)


def wants_verification(config: BuildConfig) -> bool:
    """``config.verify_shapes``, defaulting to on for every backend but ONNX Runtime."""
    if config.verify_shapes is not None:
        return config.verify_shapes
    return config.backend != "onnxruntime"


def _skipped(manifest: PlanManifest, config: BuildConfig, progress: Callable[[str], None]) -> bool:
    if wants_verification(config):
        return False
    if manifest.backend != "onnxruntime":
        progress("shape verification skipped (--no-verify-shapes)")
    return True


def _data_summary(checks: Sequence[tuple[str, str]]) -> str:
    """``random inputs at min, max, odd; sample inputs page.npz at opt`` from ``(label, data)`` pairs."""
    by_data: dict[str, list[str]] = {}
    for label, data in checks:
        by_data.setdefault(data, []).append(label)
    if list(by_data) == ["random"]:
        return "random inputs"
    return "; ".join(
        f"{'random inputs' if data == 'random' else data} at {', '.join(labels)}" for data, labels in by_data.items()
    )


def _hint(problem: str, failed: Sequence[CornerCheck], checks: Sequence[CornerCheck], precision: str) -> str:
    values_only = all("differs from the reference" in str(c.problem) for c in failed)
    if "it passes with --shape-multiple" in problem:
        return "rebuild with that constraint (min/opt/max on its grid); the plan then refuses other sizes at run time"
    if values_only and len(failed) == len(checks) and precision not in ("fp32", "tf32"):
        # Every shape is wrong by value, none by shape: the precision, not the profile, is at fault.
        return (
            f"every verified shape differs, so {precision} itself loses this model (see the accuracy "
            "line above: values out of the type's range); build at --precision fp32, or keep the affected "
            "ops in fp32 with --fp32-ops"
        )
    return "narrow the profile to sizes the model supports, or add --shape-multiple NAME:1x1xNxN"


def verify_plan(
    reference: Reference,
    manifest: PlanManifest,
    payload: bytes,
    config: BuildConfig,
    progress: Callable[[str], None],
) -> PlanManifest:
    """Verify a fresh plan against ``reference`` (see the module docs); return the manifest with the record.

    Raises:
        BuildError: a shape set fails; the message names profile, shapes and output, the hint the fix.
    """
    if _skipped(manifest, config, progress):
        return manifest
    from streamrt.backends import get_backend

    started = time.perf_counter()
    inputs = user_inputs(reference.inputs, config)
    planned = [(label, inputs.data_at(shapes)) for _, label, shapes in shape_sets(manifest.profiles, inputs)]
    progress(
        f"verifying {len(planned)} shapes against {reference.label} on {_data_summary(planned)} "
        "(skip with --no-verify-shapes)"
    )
    engine = get_backend(manifest.backend).load(Plan(manifest, payload))
    try:
        checks = list(verify_engine(reference, engine, manifest.profiles, manifest.precision, inputs))
    finally:
        engine.close()
    seconds = time.perf_counter() - started
    failed = [c for c in checks if c.problem is not None]
    if failed:
        problem = str(failed[0].problem)
        hint = _hint(problem, failed, checks, manifest.precision)
        raise BuildError(f"shape verification failed: {problem}", hint=f"{hint}; --no-verify-shapes skips this check")
    worst = max((v for c in checks for v in c.errors.values()), default=0.0)
    tol = tolerance_for(manifest.precision)
    progress(
        f"verified {len(checks)} shapes in {seconds:.1f} s on {_data_summary([(c.label, c.data) for c in checks])} "
        f"(worst error {worst:.1e}, allowed {tol.describe()})"
    )
    record: dict[str, Any] = {
        "reference": reference.label,
        "measure": "max|plan-ref| / max(max|ref|, floor)",
        "tolerance": dataclasses.asdict(tol),
        "inputs": _data_summary([(c.label, c.data) for c in checks]),
        "seconds": round(seconds, 3),
        "checks": [c.to_json() for c in checks],
    }
    return dataclasses.replace(manifest, extra={**manifest.extra, "shape_verification": record})


def verify_build(
    source: OnnxModel, manifest: PlanManifest, payload: bytes, config: BuildConfig, progress: Callable[[str], None]
) -> PlanManifest:
    """Verify an ONNX build's plan against ONNX Runtime fp32 on ``source`` (the un-transformed OnnxModel)."""
    if _skipped(manifest, config, progress):
        return manifest
    return verify_plan(onnx_reference(source), manifest, payload, config, progress)


def verify_module_build(
    module: Any, manifest: PlanManifest, payload: bytes, config: BuildConfig, progress: Callable[[str], None]
) -> PlanManifest:
    """Verify a ``build_module`` plan against the eager ``module`` in fp32, on the plan's device.

    The plan's inputs are ``forward``'s arguments in order and its outputs ``forward``'s results.
    """
    if _skipped(manifest, config, progress):
        return manifest
    device = str(manifest.device.get("kind", "cpu"))
    reference = module_reference(module, manifest.inputs, [o.name for o in manifest.outputs], device)
    return verify_plan(reference, manifest, payload, config, progress)
