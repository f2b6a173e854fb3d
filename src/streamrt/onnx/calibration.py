"""int8 calibration data: a folder of arrays or images turned into model input feeds.

A calibration folder holds one *sample* per entry, read in sorted name order:

- ``name.npz``: one array per model input, keyed by input name (``np.savez(f, images=x)``).
  A single-input model also accepts the default key ``arr_0``.
- ``name.npy``: the array of the only input of a single-input model.
- ``name/`` (a sub-folder): ``<input>.npy`` for every input, the layout for multi-input models
  whose arrays are saved one by one.
- ``name.jpg|.jpeg|.png|.bmp``: an RGB image for a model with one image input, resized and
  normalised by :class:`~streamrt.config.ImagePreprocess` (decoding needs Pillow, extra ``vision``).

Array files and images cannot be mixed in one folder; other files are ignored with a warning.
An array may hold one item (the model's rank without the batch dimension: a batch of one is
added) or a batch (the model's full rank). Dtypes must equal the model's input dtypes, ranks
must match, and every static dimension must agree; each mismatch raises
:class:`~streamrt.errors.CalibrationError` naming the file, the input, what was expected and
what was found.

The folder also has a content hash (file names and bytes of the selected samples, plus the
image pre-processing) that keys the calibration cache, so changing one calibration file
invalidates the cached ranges. The cache itself lives here too (:func:`read_calibration_cache`,
:func:`write_calibration_cache`); it is a JSON file written atomically.

Example:
    >>> specs = tensor_specs(model, "input")  # streamrt.onnx.model
    >>> data = CalibrationDataset(Path("calib/"), specs, max_samples=256)
    >>> for feed in data:
    ...     session.run(None, feed)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from streamrt._optional import require
from streamrt.config import CalibrationConfig, ImagePreprocess
from streamrt.errors import CalibrationError
from streamrt.types import DType, TensorSpec, format_shape

__all__ = [
    "ARRAY_SUFFIXES",
    "IMAGE_SUFFIXES",
    "CalibrationDataset",
    "CalibrationKey",
    "model_digest",
    "read_calibration_cache",
    "write_calibration_cache",
]

logger = logging.getLogger(__name__)

ARRAY_SUFFIXES = (".npy", ".npz")
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png")
CACHE_FORMAT = "streamrt-calibration-cache/1"
_CHUNK = 1 << 20
_FORMATS_HINT = "use .npz files keyed by input name, .npy files (single-input models) or images"


def model_digest(model: onnx.ModelProto) -> str:
    """SHA-256 of a model, message by message so models above protobuf's 2 GB limit hash too."""
    h = hashlib.sha256()
    h.update(model.ir_version.to_bytes(8, "little"))
    for opset in model.opset_import:
        h.update(opset.SerializeToString(deterministic=True))
    graph = model.graph
    for part in (graph.input, graph.output, graph.node, graph.initializer, graph.sparse_initializer):
        for message in part:
            h.update(message.SerializeToString(deterministic=True))
    return h.hexdigest()


def _sample_kind(path: Path) -> str | None:
    if path.is_dir():
        return "dir"
    suffix = path.suffix.lower()
    if suffix in ARRAY_SUFFIXES:
        return suffix[1:]
    if suffix in IMAGE_SUFFIXES:
        return "image"
    return None


def _unreadable(path: Path, exc: BaseException) -> CalibrationError:
    return CalibrationError(
        f"cannot read calibration file {path}: {type(exc).__name__}: {exc}",
        hint="re-save it with np.save/np.savez (or a valid image), or remove it from the folder",
    )


class CalibrationDataset:
    """The samples of one calibration folder, checked against a model's inputs.

    Construction scans the folder (and fails on a missing, non-folder or empty path); samples are
    read lazily, one per iteration step, so a large folder never sits in memory at once.

    Args:
        folder: the calibration folder.
        inputs: the model's inputs (``streamrt.onnx.model.tensor_specs(model, "input")``).
        preprocess: how images become tensors; ``None`` uses :class:`ImagePreprocess` defaults
            with the size taken from the model's static spatial dimensions.
        max_samples: read only the first ``max_samples`` entries (in sorted order).

    Example:
        >>> data = CalibrationDataset(Path("calib"), tensor_specs(model, "input"))
        >>> len(data), data.content_hash()[:12]
        (128, '3f1c0e9a7b22')
    """

    def __init__(
        self,
        folder: Path,
        inputs: Sequence[TensorSpec],
        *,
        preprocess: ImagePreprocess | None = None,
        max_samples: int | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.inputs = tuple(inputs)
        self._preprocess = preprocess
        self._digest: str | None = None
        if not self.inputs:
            raise CalibrationError("the model has no inputs to calibrate")
        if not self.folder.exists():
            raise CalibrationError(
                f"calibration folder not found: {self.folder}",
                hint="pass an existing folder of .npy/.npz files or images with --calib",
            )
        if not self.folder.is_dir():
            raise CalibrationError(f"calibration data must be a folder, got the file {self.folder}", hint=_FORMATS_HINT)
        samples, ignored = [], []
        for entry in sorted(self.folder.iterdir(), key=lambda p: p.name):
            if entry.name.startswith("."):
                continue
            kind = _sample_kind(entry)
            if kind is None:
                ignored.append(entry.name)
            else:
                samples.append((entry, kind))
        if ignored:
            logger.warning("ignoring %d unsupported file(s) in %s: %s", len(ignored), self.folder, ignored[:5])
        if not samples:
            raise CalibrationError(f"calibration folder {self.folder} holds no samples", hint=_FORMATS_HINT)
        kinds = {kind for _, kind in samples}
        if "image" in kinds and kinds != {"image"}:
            raise CalibrationError(
                f"calibration folder {self.folder} mixes images and array files",
                hint="keep images and .npy/.npz samples in separate folders",
            )
        if max_samples is not None:
            samples = samples[:max_samples]
        self._samples: tuple[tuple[Path, str], ...] = tuple(samples)
        self.is_images = kinds == {"image"}
        if self.is_images:
            self._check_image_model()

    @classmethod
    def from_config(cls, config: CalibrationConfig, inputs: Sequence[TensorSpec]) -> CalibrationDataset:
        """The dataset a :class:`~streamrt.config.CalibrationConfig` describes."""
        return cls(config.data, inputs, preprocess=config.preprocess, max_samples=config.max_samples)

    @property
    def paths(self) -> tuple[Path, ...]:
        """The selected sample paths (files or sub-folders), in reading order."""
        return tuple(path for path, _ in self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for index in range(len(self._samples)):
            yield self.load(index)

    def load(self, index: int) -> dict[str, np.ndarray]:
        """Read, check and batch sample ``index``: a feed ``{input name: array}`` for the model."""
        path, kind = self._samples[index]
        if kind == "image":
            raw = {self.inputs[0].name: self._read_image(path)}
        elif kind == "npy":
            raw = self._read_npy(path)
        elif kind == "npz":
            raw = self._read_npz(path)
        else:
            raw = self._read_dir(path)
        return {spec.name: _fit(path, spec, raw[spec.name]) for spec in self.inputs}

    def content_hash(self) -> str:
        """SHA-256 over the selected samples' relative names and bytes (and the image pre-processing)."""
        if self._digest is None:
            h = hashlib.sha256(b"streamrt-calibration-data/1\0")
            if self.is_images:
                h.update(json.dumps(dataclasses.asdict(self.image_preprocess), sort_keys=True).encode())
            for path, kind in self._samples:
                files = sorted(p for p in path.iterdir() if p.suffix == ".npy") if kind == "dir" else [path]
                for file in files:
                    h.update(file.relative_to(self.folder).as_posix().encode() + b"\0")
                    try:
                        with file.open("rb") as fh:
                            while chunk := fh.read(_CHUNK):
                                h.update(chunk)
                    except OSError as exc:
                        raise _unreadable(file, exc) from exc
            self._digest = h.hexdigest()
        return self._digest

    # --- readers -----------------------------------------------------------------------------

    def _names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def _read_npy(self, path: Path) -> dict[str, np.ndarray]:
        if len(self.inputs) != 1:
            raise CalibrationError(
                f"{path.name}: a .npy sample feeds one input, but the model has inputs {self._names()}",
                hint="use .npz files keyed by input name, or sub-folders holding <input>.npy per input",
            )
        return {self.inputs[0].name: _load_array(path)}

    def _read_npz(self, path: Path) -> dict[str, np.ndarray]:
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise _unreadable(path, exc) from exc
        if len(self.inputs) == 1 and list(arrays) == ["arr_0"]:
            return {self.inputs[0].name: arrays["arr_0"]}
        return self._check_names(path, arrays)

    def _read_dir(self, path: Path) -> dict[str, np.ndarray]:
        arrays = {p.stem: p for p in path.iterdir() if p.suffix == ".npy"}
        checked = self._check_names(path, arrays)
        return {name: _load_array(file) for name, file in checked.items()}

    def _check_names(self, path: Path, arrays: Mapping[str, Any]) -> dict[str, Any]:
        expected = self._names()
        missing = [n for n in expected if n not in arrays]
        unknown = sorted(set(arrays) - set(expected))
        if missing or unknown:
            raise CalibrationError(
                f"{path.name}: calibration arrays {sorted(arrays)} do not match the model inputs {expected}"
                f" (missing {missing}, unknown {unknown})",
                hint="name each array after the model input it feeds",
            )
        return {name: arrays[name] for name in expected}

    @property
    def image_preprocess(self) -> ImagePreprocess:
        """The image pre-processing in effect (explicit, or defaults sized from the model)."""
        if self._preprocess is not None:
            return self._preprocess
        shape = self.inputs[0].shape
        if len(shape) == 4 and shape[2] > 0 and shape[3] > 0:
            return ImagePreprocess(size=(shape[2], shape[3]))
        raise CalibrationError(
            f"model input '{self.inputs[0].name}' has shape {format_shape(shape)}: cannot infer the image size",
            hint="give calibration.preprocess with size, mean, std and layout",
        )

    def _check_image_model(self) -> None:
        spec = self.inputs[0]
        if len(self.inputs) != 1 or len(spec.shape) not in (3, 4):
            raise CalibrationError(
                f"image calibration data needs a model with one image input, got inputs "
                f"{[f'{s.name}:{format_shape(s.shape)}' for s in self.inputs]}",
                hint="save the inputs as .npz files keyed by input name instead",
            )
        if spec.dtype is not DType.FLOAT32:
            raise CalibrationError(
                f"image calibration data produces float32, but input '{spec.name}' is {spec.dtype.value}",
                hint="save pre-processed arrays as .npy/.npz files instead",
            )
        self.image_preprocess  # noqa: B018 - fail at construction when the size cannot be inferred

    def _read_image(self, path: Path) -> np.ndarray:
        require("PIL", extra="vision", purpose="image calibration data")
        from PIL import Image
        pre = self.image_preprocess
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((pre.size[1], pre.size[0]), Image.Resampling.BILINEAR)
                pixels = np.asarray(rgb, dtype=np.float32)
        except (OSError, ValueError, SyntaxError) as exc:  # PIL.UnidentifiedImageError is an OSError
            raise _unreadable(path, exc) from exc
        mean = np.asarray(pre.mean, dtype=np.float32)
        std = np.asarray(pre.std, dtype=np.float32)
        hwc = (pixels / np.float32(255.0) - mean) / std
        return np.ascontiguousarray(hwc.transpose(2, 0, 1) if pre.layout == "NCHW" else hwc)


def _load_array(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise _unreadable(path, exc) from exc
    if not isinstance(array, np.ndarray):
        raise _unreadable(path, TypeError(f"expected one array, got {type(array).__name__}"))
    return array


def _fit(path: Path, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """Check ``array`` against ``spec`` and give it the batch dimension the model expects."""
    rank = len(spec.shape)
    what = f"{path.name}: input '{spec.name}'"
    if array.dtype != spec.dtype.numpy:
        raise CalibrationError(
            f"{what} expects dtype {spec.dtype.value}, got {array.dtype}",
            hint=f"save the array with .astype(np.{spec.dtype.numpy.name})",
        )
    if rank >= 1 and array.ndim == rank - 1 and spec.shape[0] in (-1, 1):
        array = array[np.newaxis]
    if array.ndim != rank:
        one_item = f" or {format_shape(spec.shape[1:])} for one item" if rank >= 1 else ""
        raise CalibrationError(
            f"{what} expects rank {rank} (shape {format_shape(spec.shape)}{one_item}), "
            f"got rank {array.ndim} (shape {format_shape(array.shape)})"
        )
    bad = [i for i, (want, got) in enumerate(zip(spec.shape, array.shape, strict=True)) if want >= 0 and want != got]
    if bad:
        raise CalibrationError(
            f"{what} expects shape {format_shape(spec.shape)}, got {format_shape(array.shape)} (dimension {bad[0]})"
        )
    if array.size == 0:
        raise CalibrationError(f"{what} holds no values (shape {format_shape(array.shape)})")
    return np.ascontiguousarray(array)


# --- the calibration cache ---------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationKey:
    """What computed ranges depend on: the model, the data and the calibration settings.

    ``data`` is ``None`` when the data folder is absent and an explicit cache is being reused
    without it; such a key matches any cache with the same model and settings.
    """

    model: str
    data: str | None
    settings: Mapping[str, Any]

    @property
    def digest(self) -> str:
        text = json.dumps({"model": self.model, "data": self.data, "settings": dict(self.settings)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "model": self.model,
            "data": self.data,
            "settings": dict(self.settings),
        }


def read_calibration_cache(path: Path, key: CalibrationKey) -> dict[str, Any] | None:
    """The cached ranges payload for ``key``, or ``None`` when ``path`` is absent, stale or corrupt."""
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
        stored = content["key"]
        ranges = content["ranges"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring unreadable calibration cache %s (%s); recalibrating", path, exc)
        return None
    if content.get("format") != CACHE_FORMAT:
        logger.warning("ignoring calibration cache %s of format %r", path, content.get("format"))
        return None
    if key.data is None:
        matches = stored.get("model") == key.model and stored.get("settings") == json.loads(
            json.dumps(dict(key.settings))
        )
    else:
        matches = stored.get("digest") == key.digest
    if not matches:
        logger.warning("calibration cache %s was computed for another model, data or settings; recalibrating", path)
        return None
    if not isinstance(ranges, dict):
        logger.warning("ignoring calibration cache %s without ranges", path)
        return None
    return ranges


def write_calibration_cache(path: Path, key: CalibrationKey, ranges: Mapping[str, Any]) -> None:
    """Write the cache atomically: a crashed write never leaves a partial file under ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": CACHE_FORMAT, "key": key.to_dict(), "ranges": dict(ranges)}
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
