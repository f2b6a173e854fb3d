"""Shapes, random inputs and .npz inputs for an engine's specs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamrt.errors import (
    ConfigError,
    DTypeMismatchError,
    InputError,
    MissingInputError,
    ShapeError,
    UnknownInputError,
)
from streamrt.running.inputs import (
    batch_size,
    cast_inputs,
    default_shapes,
    load_inputs,
    random_inputs,
    resolve_shapes,
)
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

IMAGES = TensorSpec("images", DType.FLOAT32, (-1, 3, 32, 32))
TOKENS = TensorSpec("tokens", DType.INT64, (-1, 16))
SCALE = TensorSpec("scale", DType.FLOAT16, (4,))
SPECS = (IMAGES, TOKENS, SCALE)
PROFILES = (
    ShapeProfile(
        {
            "images": ShapeRange((1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32)),
            "tokens": ShapeRange((1, 16), (4, 16), (8, 16)),
        }
    ),
    ShapeProfile(
        {
            "images": ShapeRange((16, 3, 32, 32), (32, 3, 32, 32), (64, 3, 32, 32)),
            "tokens": ShapeRange((16, 16), (32, 16), (64, 16)),
        }
    ),
)


def test_default_shapes_are_opt_shapes_of_the_first_profile() -> None:
    assert default_shapes(SPECS, PROFILES) == {"images": (4, 3, 32, 32), "tokens": (4, 16), "scale": (4,)}
    assert default_shapes(SPECS, PROFILES, 1)["images"] == (32, 3, 32, 32)


def test_batch_sets_every_dynamic_leading_dim() -> None:
    shapes = resolve_shapes(SPECS, PROFILES, batch=6)
    assert shapes == {"images": (6, 3, 32, 32), "tokens": (6, 16), "scale": (4,)}
    assert batch_size(SPECS, shapes) == 6


def test_batch_in_the_second_profile() -> None:
    assert resolve_shapes(SPECS, PROFILES, batch=40)["images"] == (40, 3, 32, 32)


def test_explicit_shapes_win_and_pick_their_profile() -> None:
    shapes = resolve_shapes(SPECS, PROFILES, shapes={"images": (20, 3, 32, 32)})
    assert shapes["images"] == (20, 3, 32, 32) and shapes["tokens"] == (32, 16)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shapes": {"nope": (1, 2)}}, UnknownInputError, "nope"),
        ({"batch": 12}, ShapeError, "outside every profile"),
        ({"batch": 0}, ConfigError, ">= 1"),
        ({"shapes": {"images": (4, 3, 32)}}, ShapeError, "rank 4"),
        ({"shapes": {"images": (4, 1, 32, 32)}}, ShapeError, "static"),
    ],
)
def test_bad_shapes(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        resolve_shapes(SPECS, PROFILES, **kwargs)


def test_batch_on_a_static_engine_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no dynamic batch"):
        resolve_shapes((SCALE,), (), batch=2)
    assert batch_size((TensorSpec("x", DType.FLOAT32, (8, 3, 4, 4)),), {"x": (8, 3, 4, 4)}) == 8
    assert batch_size((SCALE,), {"scale": (4,)}) == 1


def test_random_inputs_are_fresh_typed_and_reproducible() -> None:
    shapes = resolve_shapes(SPECS, PROFILES)
    a = random_inputs(SPECS, shapes, np.random.default_rng(1))
    b = random_inputs(SPECS, shapes, np.random.default_rng(1))
    c = random_inputs(SPECS, shapes, np.random.default_rng(2))
    assert {n: v.dtype for n, v in a.items()} == {"images": np.float32, "tokens": np.int64, "scale": np.float16}
    assert {n: v.shape for n, v in a.items()} == {n: tuple(s) for n, s in shapes.items()}
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["images"], c["images"])
    assert np.count_nonzero(a["images"]) == a["images"].size  # never zeros
    assert a["images"].min() < 0 < a["images"].max()  # standard normal
    assert a["tokens"].min() >= 0 and a["tokens"].max() < 8 and len(np.unique(a["tokens"])) > 1
    u = random_inputs(SPECS, shapes, np.random.default_rng(1), distribution="uniform")["images"]
    assert u.min() >= 0 and u.max() < 1
    with pytest.raises(ConfigError, match="distribution"):
        random_inputs(SPECS, shapes, np.random.default_rng(1), distribution="zeros")


def _arrays() -> dict[str, np.ndarray]:
    return random_inputs(SPECS, resolve_shapes(SPECS, PROFILES), np.random.default_rng(0))


def test_load_inputs_round_trip(tmp_path: Path) -> None:
    arrays = _arrays()
    np.savez(tmp_path / "in.npz", **arrays)
    loaded = load_inputs(tmp_path / "in.npz", SPECS)
    assert list(loaded) == ["images", "tokens", "scale"]
    for name in arrays:
        np.testing.assert_array_equal(loaded[name], arrays[name])


def test_load_inputs_checks_names_dtypes_and_ranks(tmp_path: Path) -> None:
    arrays = _arrays()
    cases: list[tuple[dict[str, np.ndarray], type[Exception], str]] = [
        ({**arrays, "extra": arrays["scale"]}, UnknownInputError, "extra"),
        ({k: v for k, v in arrays.items() if k != "tokens"}, MissingInputError, "tokens"),
        ({**arrays, "images": arrays["images"].astype(np.float64)}, DTypeMismatchError, "float64"),
        ({**arrays, "tokens": arrays["tokens"][0]}, ShapeError, "rank 2"),
    ]
    for i, (bad, error, match) in enumerate(cases):
        np.savez(tmp_path / f"bad{i}.npz", **bad)
        with pytest.raises(error, match=match):
            load_inputs(tmp_path / f"bad{i}.npz", SPECS)


def test_load_inputs_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_inputs(tmp_path / "missing.npz", SPECS)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(InputError, match="cannot read"):
        load_inputs(tmp_path / "junk.npz", SPECS)


def test_cast_inputs_converts_floats_only() -> None:
    arrays = _arrays()
    specs16 = (TensorSpec("images", DType.FLOAT16, IMAGES.shape), TOKENS, SCALE)
    cast = cast_inputs(arrays, specs16)
    assert cast["images"].dtype == np.float16 and cast["tokens"] is arrays["tokens"]
    assert cast["scale"] is arrays["scale"]
