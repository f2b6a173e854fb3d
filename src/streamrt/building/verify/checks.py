"""One verified set of input shapes (:func:`check_shapes`), the probed constraint, :func:`verify_engine`."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt.building.verify.measure import Tolerance, scaled_error, tolerance_for
from streamrt.building.verify.references import Arrays, Inputs, PlanRunner, Reference, Runner, onnx_reference
from streamrt.building.verify.shapes import Shapes, constraint_flag, corner_shapes, describe, probes
from streamrt.onnx.model import OnnxModel
from streamrt.types import ShapeProfile, format_shape

__all__ = ["CornerCheck", "check_shapes", "suggest_multiple", "verify_engine"]


@dataclass(frozen=True)
class CornerCheck:
    """One verified (or failed) set of input shapes.

    Attributes:
        profile: profile index.
        label: ``min``, ``opt``, ``max``, ``odd``, ``sample`` (a user sample's own shapes) or ``probe``.
        shapes: the input shapes.
        errors: each output's error against the reference (:func:`~streamrt.building.verify.measure.scaled_error`).
        problem: why the shapes fail, ``None`` when they pass.
        data: what the inputs were: ``random`` or where the user's sample came from.
    """

    profile: int
    label: str
    shapes: Shapes
    errors: Mapping[str, float]
    problem: str | None = None
    data: str = "random"

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "label": self.label,
            "inputs": {n: format_shape(s) for n, s in self.shapes.items()},
            "data": self.data,
            "error": {n: float(f"{v:.3g}") for n, v in self.errors.items()},
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(text[0] if text else '')[:300]}"


def _poison(plan: Runner, inputs: Inputs, shapes: Shapes, turn: int) -> None:
    # A model may reject the poison's values (indices computed from floats): only its leftovers matter.
    with contextlib.suppress(Exception):
        plan(inputs.poison(shapes, turn))


def _run_twice(plan: Runner, feed: Arrays, inputs: Inputs, shapes: Shapes) -> tuple[Arrays, Arrays]:
    """Two calls on ``feed``, each after a run on a different poison feed (see ``references``)."""
    _poison(plan, inputs, shapes, 0)
    first = plan(feed)
    _poison(plan, inputs, shapes, 1)
    return first, plan(feed)


def _disagreement(first: Arrays, second: Arrays, tol: Tolerance) -> tuple[str, float] | None:
    """``(output, error)`` of the first output two calls disagree on beyond ``tol.repeat``, else ``None``."""
    for name, got in first.items():
        again = second.get(name)
        if again is None or again.shape != got.shape:
            return name, float("inf")
        if np.any(np.isfinite(got.astype(np.float64)) != np.isfinite(again.astype(np.float64))):
            return name, float("inf")
        error = scaled_error(got, again, tol.floor)
        if error > tol.repeat:
            return name, error
    return None


def _answers_anyway(plan: Runner, feed: Arrays, inputs: Inputs, shapes: Shapes, tol: Tolerance) -> str:
    """What the plan does where the reference fails: a sentence to append, or ``""``."""
    try:
        first, second = _run_twice(plan, feed, inputs, shapes)
    except Exception:
        return ""
    answer = ", ".join(f"'{n}' {format_shape(v.shape)}" for n, v in first.items())
    differ = _disagreement(first, second, tol)
    if differ is not None:
        return (
            f"; the plan answers there anyway ({answer}), and two identical calls differ (error {differ[1]:.2g} "
            f"in '{differ[0]}'): it reads memory nobody wrote"
        )
    return f"; the plan answers there anyway ({answer})"


def check_shapes(
    reference: Reference,
    plan: Runner,
    profile: int,
    label: str,
    shapes: Shapes,
    inputs: Inputs,
    tol: Tolerance,
    *,
    explain: bool = True,
) -> CornerCheck:
    """Run the reference once and the plan twice (after different poison runs) at ``shapes`` and judge it.

    Fails when the reference fails, the plan fails, an output is missing, has another shape, is
    NaN/inf where the reference is finite, differs between the two calls beyond ``tol.repeat``, or
    differs from the reference beyond ``tol.rel`` (both measured by ``scaled_error``). Where the
    reference fails, ``explain`` also runs the plan there to say whether it answers anyway.
    """
    feed, data = inputs.at(shapes)
    where = f"at {describe(shapes)} (profile {profile}, {label}{'' if data == 'random' else ', ' + data})"
    try:
        want = reference.run(feed)
    except Exception as exc:
        problem = f"the reference fails {where}: {_first_line(exc)}"
        if explain:
            problem += _answers_anyway(plan, feed, inputs, shapes, tol)
        return CornerCheck(profile, label, shapes, {}, problem, data)
    try:
        first, second = _run_twice(plan, feed, inputs, shapes)
    except Exception as exc:
        return CornerCheck(profile, label, shapes, {}, f"the plan fails {where}: {_first_line(exc)}", data)
    errors: dict[str, float] = {}

    def failed(problem: str) -> CornerCheck:
        return CornerCheck(profile, label, shapes, errors, problem, data)

    for name, ref in want.items():
        got, again = first.get(name), second.get(name)
        if got is None or again is None:
            return failed(f"output '{name}' is missing {where}")
        if got.shape != ref.shape:
            return failed(
                f"output '{name}' has shape {format_shape(got.shape)} {where}, "
                f"the reference gives {format_shape(ref.shape)}"
            )
        if np.any(~np.isfinite(got.astype(np.float64)) & np.isfinite(ref.astype(np.float64))):
            return failed(f"output '{name}' has NaN/inf {where}")
        differ = _disagreement({name: got}, {name: again}, tol)
        if differ is not None:
            return failed(
                f"two identical calls give different '{name}' {where} (error {differ[1]:.2e} > {tol.repeat:g}): "
                "the plan reads memory nobody wrote"
            )
        errors[name] = scaled_error(ref, got, tol.floor)
        if errors[name] > tol.rel:
            diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
            return failed(
                f"output '{name}' differs from the reference {where}: max |plan - ref| {diff:.2e} is "
                f"{errors[name]:.2e} x {tol.scale()}, allowed {tol.rel:g}"
            )
    return CornerCheck(profile, label, shapes, errors, None, data)


def suggest_multiple(
    reference: Reference, plan: Runner, profile: ShapeProfile, index: int, failing: Shapes, inputs: Inputs,
    tol: Tolerance,
) -> str | None:
    """The ``--shape-multiple`` under which the plan passes at a probe size, if a small one does.

    Only constraints that exclude ``failing`` are tried, and the probes are judged exactly as the
    corners are (same measure, same poison runs), so the suggestion is never one the failing
    shapes already meet.
    """
    for shapes, multiples in probes(profile, failing):
        if check_shapes(reference, plan, index, "probe", shapes, inputs, tol, explain=False).problem is None:
            return constraint_flag(multiples)
    return None


def _shape_sets(profile: ShapeProfile, inputs: Inputs) -> list[tuple[str, Shapes]]:
    corners = corner_shapes(profile)
    extra = [("sample", s) for s in inputs.sample_shapes(profile) if all(s != c for _, c in corners)]
    return corners + extra[:2]


def shape_sets(profiles: Sequence[ShapeProfile], inputs: Inputs) -> list[tuple[int, str, Shapes]]:
    """Every ``(profile, label, shapes)`` verification runs: the corners, plus the shapes of up to two
    user samples per profile that are no corner."""
    return [(i, label, shapes) for i, p in enumerate(profiles) for label, shapes in _shape_sets(p, inputs)]


def verify_engine(
    reference: Reference | OnnxModel,
    engine: Any,
    profiles: Sequence[ShapeProfile],
    precision: str = "fp32",
    inputs: Inputs | None = None,
) -> Iterator[CornerCheck]:
    """Run ``engine`` at every corner of ``profiles`` against ``reference``.

    Args:
        reference: a :class:`~streamrt.building.verify.references.Reference`, or an
            :class:`~streamrt.onnx.model.OnnxModel` (judged by ONNX Runtime fp32).
        engine: a loaded plan.
        profiles: the profiles whose corners to run.
        precision: picks the row of :data:`~streamrt.building.verify.measure.TOLERANCE`.
        inputs: the feeds (default: random data for the reference's inputs).

    Yields one :class:`CornerCheck` per shape set; a failed one carries ``problem`` and, where a
    multiple-of constraint fixes it, the suggestion in its text. Stops at the first failure.
    """
    ref = reference if isinstance(reference, Reference) else onnx_reference(reference)
    feeds = inputs if inputs is not None else Inputs(ref.inputs)
    tol = tolerance_for(precision)
    plan = PlanRunner(engine)
    try:
        for index, label, shapes in shape_sets(profiles, feeds):
            check = check_shapes(ref, plan, index, label, shapes, feeds, tol)
            if check.problem is not None:
                suggestion = suggest_multiple(ref, plan, profiles[index], index, shapes, feeds, tol)
                if suggestion is not None:
                    check = dataclasses.replace(check, problem=f"{check.problem}; it passes with {suggestion}")
                yield check
                return
            yield check
    finally:
        plan.close()
