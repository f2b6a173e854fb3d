"""Which input shapes verification runs at: profile corners, an off-grid odd size, multiple-of probes.

The odd size is an odd multiple of each dynamic dimension's ``--shape-multiple`` (an odd number
without one), so it lies off every coarser grid: a stride-32 model built without a constraint is
run at e.g. 79x79, one built with ``x:1x1x16x16`` at an odd multiple of 16. Probes then look for
the constraint that makes a failure go away: shapes whose dimensions are odd multiples of 2, 4,
... 128 (so not multiples of twice that), never a constraint the failing shape already meets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from streamrt.types import Shape, ShapeProfile, ShapeRange, format_shape

__all__ = ["PROBE_MULTIPLES", "Shapes", "constraint_flag", "corner_shapes", "describe", "probes"]

PROBE_MULTIPLES = (2, 4, 8, 16, 32, 64, 128)

Shapes = dict[str, Shape]


def describe(shapes: Mapping[str, Shape]) -> str:
    """``x=1x3x79x79, y=...`` as messages write input shapes."""
    return ", ".join(f"{n}={format_shape(s)}" for n, s in shapes.items())


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


def _admits(multiples: Mapping[str, Shape], shapes: Mapping[str, Shape]) -> bool:
    return all(
        name not in shapes or all(d % m == 0 for d, m in zip(shapes[name], step, strict=False))
        for name, step in multiples.items()
    )


def probes(profile: ShapeProfile, failing: Mapping[str, Shape]) -> Iterator[tuple[Shapes, dict[str, Shape]]]:
    """``(probe shapes, the multiple-of constraint they stand for)``, smallest multiple first.

    Constraints that ``failing`` (the shapes that failed) already meets are left out: they would
    not exclude it, so suggesting one could never be the fix (a refusal at 320x320 once suggested
    ``x:1x1x2x2``).
    """
    for step in PROBE_MULTIPLES:
        probe = _probe(profile, step)
        if probe is None:
            return
        if not _admits(probe[1], failing):
            yield probe


def constraint_flag(multiples: Mapping[str, Shape]) -> str:
    """``--shape-multiple x:1x1x4x4`` for a constraint."""
    return "--shape-multiple " + ",".join(f"{n}:{format_shape(m)}" for n, m in multiples.items())
