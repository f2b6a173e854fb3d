"""Reading calibration folders (arrays, sub-folders, images), their errors, hashes and the cache file."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamrt.config import CalibrationConfig, ImagePreprocess
from streamrt.errors import CalibrationError, MissingDependencyError
from streamrt.onnx.calibration import (
    CalibrationDataset,
    CalibrationKey,
    model_digest,
    read_calibration_cache,
    write_calibration_cache,
)
from streamrt.types import DType, TensorSpec

IMAGE = TensorSpec("images", DType.FLOAT32, (-1, 3, 8, 8))
MULTI = (TensorSpec("a", DType.FLOAT32, (-1, 4)), TensorSpec("b", DType.INT64, (-1, 2)))


def rand(*shape: int) -> np.ndarray:
    return np.random.default_rng().standard_normal(shape).astype(np.float32)


def folder(tmp_path: Path, name: str = "calib") -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


# --- formats ------------------------------------------------------------------------------------


def test_npy_items_and_batches_in_sorted_order(tmp_path: Path) -> None:
    data = folder(tmp_path)
    one, batch = rand(3, 8, 8), rand(5, 3, 8, 8)
    np.save(data / "b.npy", batch)
    np.save(data / "a.npy", one)
    (data / "notes.txt").write_text("ignored")
    (data / ".hidden.npy").write_bytes(b"ignored too")
    ds = CalibrationDataset(data, [IMAGE])
    assert [p.name for p in ds.paths] == ["a.npy", "b.npy"]
    feeds = list(ds)
    np.testing.assert_array_equal(feeds[0]["images"], one[None])  # one item gains a batch of 1
    np.testing.assert_array_equal(feeds[1]["images"], batch)


def test_max_samples_takes_the_first_entries(tmp_path: Path) -> None:
    data = folder(tmp_path)
    for i in range(5):
        np.save(data / f"s{i}.npy", rand(3, 8, 8))
    ds = CalibrationDataset.from_config(CalibrationConfig(data=data, max_samples=2), [IMAGE])
    assert [p.name for p in ds.paths] == ["s0.npy", "s1.npy"] and len(ds) == 2


def test_npz_keyed_by_input_name_and_arr_0_for_one_input(tmp_path: Path) -> None:
    data = folder(tmp_path)
    a, b = rand(2, 4), np.arange(4, dtype=np.int64).reshape(2, 2)
    np.savez(data / "s.npz", a=a, b=b)
    (feed,) = CalibrationDataset(data, MULTI)
    np.testing.assert_array_equal(feed["a"], a)
    np.testing.assert_array_equal(feed["b"], b)

    single = folder(tmp_path, "single")
    x = rand(3, 8, 8)
    np.savez(single / "s.npz", x)
    (feed,) = CalibrationDataset(single, [IMAGE])
    np.testing.assert_array_equal(feed["images"], x[None])


def test_subfolders_hold_one_npy_per_input(tmp_path: Path) -> None:
    data = folder(tmp_path)
    for i in range(2):
        sample = data / f"sample{i}"
        sample.mkdir()
        np.save(sample / "a.npy", rand(4))
        np.save(sample / "b.npy", np.ones(2, np.int64))
    feeds = list(CalibrationDataset(data, MULTI))
    assert len(feeds) == 2
    assert feeds[0]["a"].shape == (1, 4) and feeds[0]["b"].dtype == np.int64


def test_images_are_resized_normalised_and_laid_out(tmp_path: Path) -> None:
    image_mod = pytest.importorskip("PIL.Image")
    data = folder(tmp_path)
    image_mod.new("RGB", (20, 12), (255, 0, 51)).save(data / "red.png")
    image_mod.new("RGB", (5, 5), (0, 255, 0)).save(data / "green.bmp")
    pre = ImagePreprocess(size=(8, 8), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    feeds = list(CalibrationDataset(data, [IMAGE], preprocess=pre))
    green, red = feeds[0]["images"], feeds[1]["images"]  # sorted: green.bmp, red.png
    assert red.shape == (1, 3, 8, 8) and red.dtype == np.float32
    np.testing.assert_allclose(red[0, :, 4, 4], [1.0, -1.0, 51 / 255 * 2 - 1], atol=1e-5)
    np.testing.assert_allclose(green[0, :, 0, 0], [-1.0, 1.0, -1.0], atol=1e-5)

    nhwc = TensorSpec("images", DType.FLOAT32, (1, 8, 8, 3))
    (feed,) = list(CalibrationDataset(data, [nhwc], preprocess=ImagePreprocess(size=(8, 8), layout="NHWC")))[:1]
    assert feed["images"].shape == (1, 8, 8, 3)

    default = CalibrationDataset(data, [IMAGE])  # size taken from the model: 8x8
    assert default.image_preprocess.size == (8, 8)


def test_images_without_pillow_name_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = folder(tmp_path)
    (data / "a.png").write_bytes(b"not decoded")
    monkeypatch.setitem(sys.modules, "PIL", None)
    ds = CalibrationDataset(data, [IMAGE])
    with pytest.raises(MissingDependencyError, match=r"pillow.*streamrt\[vision\]"):
        ds.load(0)


# --- errors -------------------------------------------------------------------------------------


def test_missing_folder_and_file_instead_of_folder(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="calibration folder not found"):
        CalibrationDataset(tmp_path / "nope", [IMAGE])
    file = tmp_path / "one.npy"
    np.save(file, rand(3, 8, 8))
    with pytest.raises(CalibrationError, match="must be a folder"):
        CalibrationDataset(file, [IMAGE])


def test_empty_folder(tmp_path: Path) -> None:
    data = folder(tmp_path)
    with pytest.raises(CalibrationError, match="holds no samples"):
        CalibrationDataset(data, [IMAGE])
    (data / "readme.md").write_text("only unsupported files")
    with pytest.raises(CalibrationError, match="holds no samples"):
        CalibrationDataset(data, [IMAGE])


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("bad.npy", b"\x93NUMPY garbage that is not a header"),
        ("bad.npy", b""),
        ("bad.npz", b"PK\x03\x04 truncated zip"),
        ("bad.png", b"\x89PNG\r\n\x1a\n broken"),
    ],
)
def test_unreadable_file(tmp_path: Path, name: str, content: bytes) -> None:
    if name.endswith(".png"):
        pytest.importorskip("PIL")
    data = folder(tmp_path)
    (data / name).write_bytes(content)
    with pytest.raises(CalibrationError, match=f"cannot read calibration file .*{name}"):
        CalibrationDataset(data, [IMAGE]).load(0)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((3, 8, 8), np.float64), "a.npy: input 'images' expects dtype float32, got float64"),
        (np.zeros((8, 8), np.float32), r"expects rank 4 \(shape \?x3x8x8 or 3x8x8 for one item\), got rank 2"),
        (np.zeros((2, 3, 8, 9), np.float32), r"expects shape \?x3x8x8, got 2x3x8x9 \(dimension 3\)"),
        (np.zeros((0, 3, 8, 8), np.float32), "holds no values"),
    ],
)
def test_shape_and_dtype_mismatch(tmp_path: Path, array: np.ndarray, message: str) -> None:
    data = folder(tmp_path)
    np.save(data / "a.npy", array)
    with pytest.raises(CalibrationError, match=message):
        CalibrationDataset(data, [IMAGE]).load(0)


def test_static_batch_needs_a_full_batch(tmp_path: Path) -> None:
    data = folder(tmp_path)
    np.save(data / "a.npy", rand(3, 8, 8))
    spec = TensorSpec("images", DType.FLOAT32, (4, 3, 8, 8))
    with pytest.raises(CalibrationError, match=r"expects rank 4 \(shape 4x3x8x8"):
        CalibrationDataset(data, [spec]).load(0)


def test_name_mismatch(tmp_path: Path) -> None:
    data = folder(tmp_path)
    np.savez(data / "s.npz", a=rand(2, 4), c=rand(2, 2))
    with pytest.raises(CalibrationError, match=r"missing \['b'\], unknown \['c'\]"):
        CalibrationDataset(data, MULTI).load(0)

    sub = folder(tmp_path, "sub")
    (sub / "s0").mkdir()
    np.save(sub / "s0" / "a.npy", rand(4))
    with pytest.raises(CalibrationError, match=r"s0: calibration arrays \['a'\] .*\(missing \['b'\]"):
        CalibrationDataset(sub, MULTI).load(0)

    npy = folder(tmp_path, "npy")
    np.save(npy / "a.npy", rand(4))
    with pytest.raises(CalibrationError, match=r"a .npy sample feeds one input, but the model has inputs \['a', 'b'\]"):
        CalibrationDataset(npy, MULTI).load(0)


def test_images_need_one_float_image_input(tmp_path: Path) -> None:
    data = folder(tmp_path)
    (data / "a.jpg").write_bytes(b"x")
    with pytest.raises(CalibrationError, match="needs a model with one image input"):
        CalibrationDataset(data, MULTI)
    with pytest.raises(CalibrationError, match="produces float32, but input 'q' is uint8"):
        CalibrationDataset(data, [TensorSpec("q", DType.UINT8, (1, 3, 8, 8))])
    with pytest.raises(CalibrationError, match="cannot infer the image size"):
        CalibrationDataset(data, [TensorSpec("images", DType.FLOAT32, (-1, 3, -1, -1))])
    np.save(data / "b.npy", rand(3, 8, 8))
    with pytest.raises(CalibrationError, match="mixes images and array files"):
        CalibrationDataset(data, [IMAGE])


# --- hashing and the cache file -------------------------------------------------------------------


def test_content_hash_follows_the_data_not_the_location(tmp_path: Path) -> None:
    data = folder(tmp_path)
    for i in range(3):
        np.save(data / f"s{i}.npy", rand(3, 8, 8))
    digest = CalibrationDataset(data, [IMAGE]).content_hash()
    moved = data.rename(tmp_path / "elsewhere")
    assert CalibrationDataset(moved, [IMAGE]).content_hash() == digest
    assert CalibrationDataset(moved, [IMAGE], max_samples=2).content_hash() != digest
    np.save(moved / "s1.npy", rand(3, 8, 8))
    assert CalibrationDataset(moved, [IMAGE]).content_hash() != digest


def _model(weight: float) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.full(2, weight, np.float32), "w")],
    )
    return helper.make_model(graph, ir_version=10)


def test_model_digest() -> None:
    assert model_digest(_model(1.0)) == model_digest(_model(1.0))
    assert model_digest(_model(1.0)) != model_digest(_model(2.0))


def test_cache_round_trip_staleness_and_corruption(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = CalibrationKey("m" * 64, "d" * 64, {"method": "minmax"})
    path = tmp_path / "sub" / "cache.json"
    assert read_calibration_cache(path, key) is None
    write_calibration_cache(path, key, {"data": {"x": [0, 1]}})
    assert [p.name for p in path.parent.iterdir()] == ["cache.json"]  # no temporary left behind
    assert read_calibration_cache(path, key) == {"data": {"x": [0, 1]}}
    unverified = CalibrationKey("m" * 64, None, {"method": "minmax"})
    assert read_calibration_cache(path, unverified) == {"data": {"x": [0, 1]}}

    with caplog.at_level(logging.WARNING):
        other = CalibrationKey("m" * 64, "e" * 64, {"method": "minmax"})
        assert read_calibration_cache(path, other) is None
        assert "computed for another model, data or settings" in caplog.text
        path.write_text("{ not json")
        assert read_calibration_cache(path, key) is None
        assert "unreadable calibration cache" in caplog.text
    assert json.loads(json.dumps(key.to_dict()))["digest"] == key.digest
