"""Shape profiles are checked against the model before any build."""

from __future__ import annotations

import pytest

from streamrt.errors import ProfileError, ShapeError
from streamrt.onnx.profiles import check_shapes, parse_profiles, parse_shape_list, resolve_profiles
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

INPUTS = (TensorSpec("x", DType.FLOAT32, (-1, 3, -1)), TensorSpec("k", DType.INT64, (2,)))


def _profile(lo: tuple[int, ...], opt: tuple[int, ...], hi: tuple[int, ...], name: str = "x") -> ShapeProfile:
    return ShapeProfile({name: ShapeRange(lo, opt, hi)})


def test_parse_trtexec_syntax() -> None:
    assert parse_shape_list("x:1x3x224x224, y:4") == {"x": (1, 3, 224, 224), "y": (4,)}
    (p,) = parse_profiles(["x:1x3x8"], [], ["x:4x3x16"])
    assert p.ranges["x"] == ShapeRange((1, 3, 8), (1, 3, 8), (4, 3, 16))


def test_static_inputs_are_filled_in() -> None:
    (p,) = resolve_profiles(INPUTS, [_profile((1, 3, 8), (2, 3, 8), (4, 3, 16))])
    assert p.ranges["k"] == ShapeRange((2,), (2,), (2,))


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (
            _profile((1, 3), (1, 3), (1, 3)),
            "input 'x': min shape 1x3 has rank 2, the model's input has rank 3",
        ),
        (_profile((4, 3, 8), (2, 3, 8), (8, 3, 8)), r"dimension 0: need min <= opt <= max, got 4, 2, 8"),
        (_profile((1, 3, 8), (9, 3, 8), (8, 3, 8)), r"dimension 0: need min <= opt <= max, got 1, 9, 8"),
        (_profile((1, 4, 8), (1, 4, 8), (2, 4, 8)), r"dimension 1 is static \(3\) in the model"),
        (_profile((1,), (1,), (1,), name="nope"), "names input 'nope', which the model does not have"),
        (_profile((0, 3, 8), (1, 3, 8), (2, 3, 8)), "dimension 0: min must be >= 1"),
    ],
)
def test_contradicting_profiles_are_rejected(profile: ShapeProfile, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        resolve_profiles(INPUTS, [profile])


def test_dynamic_input_without_profile_asks_for_one() -> None:
    with pytest.raises(ProfileError, match=r"'x' \(\?x3x\?\) has dynamic dimensions \[0, 2\]"):
        resolve_profiles(INPUTS, [])


def test_batch_only_dynamic_gets_default_range() -> None:
    (p,) = resolve_profiles((TensorSpec("x", DType.FLOAT32, (-1, 4)),), [])
    assert p.ranges["x"] == ShapeRange((1, 4), (1, 4), (64, 4))


def test_check_shapes_picks_profile_and_explains_misses() -> None:
    profiles = resolve_profiles(
        INPUTS, [_profile((1, 3, 8), (2, 3, 8), (4, 3, 8)), _profile((5, 3, 8), (6, 3, 16), (8, 3, 16))]
    )
    assert check_shapes(profiles, {"x": (2, 3, 8), "k": (2,)}) == 0
    assert check_shapes(profiles, {"x": (7, 3, 12), "k": (2,)}) == 1
    with pytest.raises(
        ShapeError, match=r"input 'x' has shape 9x3x8, outside every profile \(profile 0: min"
    ):
        check_shapes(profiles, {"x": (9, 3, 8), "k": (2,)})
