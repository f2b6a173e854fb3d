"""Shape profiles: validating them against a model before anything is built.

A profile gives min/opt/max shapes for dynamic inputs. Static inputs take their shape from the
model. A profile that contradicts the model is rejected here, naming input and dimension, so
no backend ever starts a long build on a bad profile.

Example:
    >>> profiles = parse_profiles(["x:1x4"], ["x:8x4"], ["x:32x4"])
    >>> resolve_profiles(model.inputs, profiles)                # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from streamrt.errors import ProfileError, ShapeError
from streamrt.types import Shape, ShapeProfile, ShapeRange, TensorSpec, format_shape, parse_shape

__all__ = [
    "DEFAULT_MAX_BATCH",
    "check_shapes",
    "parse_profiles",
    "parse_shape_list",
    "resolve_profiles",
]

DEFAULT_MAX_BATCH = 64


def parse_shape_list(text: str) -> dict[str, Shape]:
    """``'x:1x3x224x224,y:1x10'`` -> ``{'x': (1, 3, 224, 224), 'y': (1, 10)}`` (trtexec syntax)."""
    shapes: dict[str, Shape] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise ProfileError(f"bad shape spec {item!r}: expected NAME:DIMS, e.g. images:1x3x640x640")
        shapes[name] = parse_shape(dims)
    return shapes


def parse_profiles(
    mins: Sequence[str], opts: Sequence[str], maxs: Sequence[str], multiples: Sequence[str] = ()
) -> tuple[ShapeProfile, ...]:
    """Turn repeated ``--min-shapes/--opt-shapes/--max-shapes/--shape-multiple`` flags into profiles.

    The n-th occurrence of each flag belongs to profile n. A missing ``opt`` defaults to ``min``
    (like trtexec); ``min`` and ``max`` must be given together. ``--shape-multiple
    x:1x1x32x32`` makes every dimension of ``x`` a multiple of the given number; one
    occurrence applies to every profile, otherwise give one per profile.
    """
    if len(mins) != len(maxs) or len(opts) > len(mins):
        raise ProfileError(
            f"got {len(mins)} --min-shapes, {len(opts)} --opt-shapes and {len(maxs)} --max-shapes; "
            "each profile needs one --min-shapes and one --max-shapes (--opt-shapes defaults to min)"
        )
    if (len(multiples) > 1 and len(multiples) != len(mins)) or (multiples and not mins):
        raise ProfileError(
            f"got {len(multiples)} --shape-multiple for {len(mins)} profiles; "
            "give one for every profile, or one that applies to all"
        )
    profiles = []
    for i, (lo_text, hi_text) in enumerate(zip(mins, maxs, strict=True)):
        lo, hi = parse_shape_list(lo_text), parse_shape_list(hi_text)
        opt = parse_shape_list(opts[i]) if i < len(opts) else lo
        step = parse_shape_list(multiples[min(i, len(multiples) - 1)]) if multiples else {}
        names = set(lo) | set(hi) | set(opt)
        for name in sorted(names):
            for label, table in (("min", lo), ("opt", opt), ("max", hi)):
                if name not in table:
                    raise ProfileError(f"profile {i}: input '{name}' has no {label} shape")
        for name in sorted(set(step) - names):
            raise ProfileError(f"profile {i}: --shape-multiple names input '{name}', which has no min/max shapes")
        profiles.append(
            ShapeProfile({n: ShapeRange(lo[n], opt[n], hi[n], step.get(n, ())) for n in sorted(names)})
        )
    return tuple(profiles)


def _validate_range(index: int, spec: TensorSpec, rng: ShapeRange) -> None:
    where = f"profile {index}, input '{spec.name}'"
    for label, shape in (("min", rng.min), ("opt", rng.opt), ("max", rng.max), ("multiple", rng.multiples)):
        if len(shape) != len(spec.shape):
            raise ProfileError(
                f"{where}: {label} shape {format_shape(shape)} has rank {len(shape)}, "
                f"the model's input has rank {len(spec.shape)} ({format_shape(spec.shape)})"
            )
    for dim, (model_dim, lo, opt, hi) in enumerate(zip(spec.shape, rng.min, rng.opt, rng.max, strict=True)):
        if lo < 1:
            raise ProfileError(f"{where}, dimension {dim}: min must be >= 1, got {lo}")
        if not lo <= opt <= hi:
            raise ProfileError(f"{where}, dimension {dim}: need min <= opt <= max, got {lo}, {opt}, {hi}")
        step = rng.multiples[dim] if dim < len(rng.multiples) else 1
        if step < 1:
            raise ProfileError(f"{where}, dimension {dim}: the multiple must be >= 1, got {step}")
        off = [(label, v) for label, v in (("min", lo), ("opt", opt), ("max", hi)) if v % step]
        if off:
            label, v = off[0]
            raise ProfileError(
                f"{where}, dimension {dim}: {label} {v} is not a multiple of {step}",
                hint=f"use {-(-v // step) * step} or {v // step * step}" if v >= step else f"use {step}",
            )
        if model_dim >= 0 and not lo == opt == hi == model_dim:
            raise ProfileError(
                f"{where}, dimension {dim} is static ({model_dim}) in the model but the profile "
                f"asks for {lo}..{hi}",
                hint="leave static dimensions at the model's value",
            )


def _default_range(spec: TensorSpec) -> ShapeRange:
    dynamic = [i for i, d in enumerate(spec.shape) if d < 0]
    if dynamic != [0]:
        raise ProfileError(
            f"input '{spec.name}' ({format_shape(spec.shape)}) has dynamic dimensions {dynamic} "
            "and no profile",
            hint=(
                f"give its range, e.g. --min-shapes {spec.name}:... --opt-shapes {spec.name}:... "
                f"--max-shapes {spec.name}:..."
            ),
        )
    rest = spec.shape[1:]
    return ShapeRange((1, *rest), (1, *rest), (DEFAULT_MAX_BATCH, *rest))


def resolve_profiles(
    inputs: Sequence[TensorSpec], profiles: Iterable[ShapeProfile]
) -> tuple[ShapeProfile, ...]:
    """Validate profiles against the model's inputs and complete them.

    Every profile ends up with a range for every input: static inputs get their fixed shape,
    and when no profile is given at all, a dynamic leading (batch) dimension gets 1..64 with
    opt 1. Raises :class:`ProfileError` naming input and dimension on any contradiction.
    """
    by_name = {s.name: s for s in inputs}
    given = tuple(profiles)
    if not given:
        defaults = {s.name: _default_range(s) for s in inputs if s.is_dynamic}
        given = (ShapeProfile(defaults),)
    resolved = []
    for index, profile in enumerate(given):
        for name in profile.ranges:
            if name not in by_name:
                raise ProfileError(
                    f"profile {index} names input '{name}', which the model does not have; "
                    f"inputs are: {', '.join(by_name)}"
                )
        ranges: dict[str, ShapeRange] = {}
        for spec in inputs:
            rng = profile.ranges.get(spec.name)
            if rng is None:
                if spec.is_dynamic:
                    raise ProfileError(
                        f"profile {index} has no range for dynamic input '{spec.name}' "
                        f"({format_shape(spec.shape)})",
                        hint="every profile must cover every dynamic input",
                    )
                rng = ShapeRange.fixed(spec.shape)
            _validate_range(index, spec, rng)
            ranges[spec.name] = rng
        resolved.append(ShapeProfile(ranges))
    return tuple(resolved)


def check_shapes(profiles: Sequence[ShapeProfile], shapes: Mapping[str, Shape]) -> int:
    """Index of the first profile accepting ``shapes``; :class:`ShapeError` when none does.

    The message gives each input's shape and the allowed ranges, e.g.
    ``input 'x' has shape 65x4, outside every profile: profile 0: min 1x4, opt 8x4, max 64x4``.
    """
    for index, profile in enumerate(profiles):
        if profile.accepts(shapes):
            return index
    for name, shape in shapes.items():
        # Within some profile's bounds but off its multiple-of grid: say which dimension.
        for p in profiles:
            rng = p.ranges.get(name)
            if rng is None or not ShapeRange(rng.min, rng.opt, rng.max).contains(shape):
                continue
            broken = rng.violation(shape)
            if broken is not None:
                dim, step = broken
                raise ShapeError(
                    f"dimension {dim} of '{name}' is {shape[dim]}, must be a multiple of {step} "
                    f"(input shape {format_shape(shape)}; {rng.describe()})",
                    hint=f"pad or resize it to {shape[dim] // step * step or step} or {-(-shape[dim] // step) * step}",
                )
    bad = [
        name
        for name, shape in shapes.items()
        if not any(p.ranges.get(name) is None or p.ranges[name].contains(shape) for p in profiles)
    ] or list(shapes)
    name = bad[0]
    allowed = "; ".join(
        f"profile {i}: {p.ranges[name].describe()}" for i, p in enumerate(profiles) if name in p.ranges
    )
    raise ShapeError(
        f"input '{name}' has shape {format_shape(shapes[name])}, outside every profile ({allowed})",
        hint="pass a shape inside a profile, or rebuild with a wider --min-shapes/--max-shapes",
    )
