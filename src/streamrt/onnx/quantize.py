"""int8 by explicit quantization: Q/DQ nodes from calibration ranges, with a calibration cache.

ONNX Runtime's quantization tooling does the math: ``quant_pre_process`` (shape inference and
constant folding), ``create_calibrator`` (min-max, entropy or percentile ranges over the
calibration folder), and ``quantize_static`` in QDQ format, symmetric int8 activations and
weights (optionally per-channel), which is what TensorRT's explicit quantization expects. The
ranges are stored in StreamRT's calibration cache (:mod:`streamrt.onnx.calibration`) and handed to
``quantize_static`` through its ``calibration_cache_path``, so a later build with the same model,
data and settings skips calibration entirely.

Callers use :func:`streamrt.onnx.precision.apply_precision`; this module is its int8 half.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from streamrt.config import CalibrationConfig, CalibrationMethod
from streamrt.errors import BuildError, CalibrationError, StreamRTError
from streamrt.onnx.calibration import (
    CalibrationDataset,
    CalibrationKey,
    model_digest,
    read_calibration_cache,
    write_calibration_cache,
)
from streamrt.onnx.model import tensor_specs

__all__ = ["quantize_int8"]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]

#: Histogram settings, part of the calibration cache key. ONNX Runtime's entropy default
#: (128 bins for 128 quantized bins) leaves a single candidate threshold, i.e. min-max; 2048 bins
#: give a search like TensorRT's entropy calibrator (thresholds from 64 to 1024 bins either side).
_HISTOGRAM_BINS = {CalibrationMethod.ENTROPY: 2048, CalibrationMethod.PERCENTILE: 2048}
_ENTROPY_QUANTIZED_BINS = 128
_METHOD_NAMES = {
    CalibrationMethod.ENTROPY: "Entropy",
    CalibrationMethod.MINMAX: "MinMax",
    CalibrationMethod.PERCENTILE: "Percentile",
}
_PROTOBUF_LIMIT = 2_000_000_000  # larger models must be saved with external data


def quantize_int8(
    model: onnx.ModelProto,
    calib: CalibrationConfig,
    op_types: Sequence[str],
    *,
    cache_dir: Path,
    progress: Progress,
    style: str = "tensorrt",
) -> onnx.ModelProto:
    """Insert Q/DQ nodes on the inputs and weights of ``op_types``, with ranges from ``calib``.

    ``style`` is the Q/DQ layout the target backend fuses into integer kernels:

    * ``"tensorrt"`` (GPU backends): symmetric int8 activations and weights, outputs of the
      quantized ops stay float (TensorRT fuses DQ -> op and emits float).
    * ``"onnxruntime"`` (ONNX Runtime's CPU provider): uint8 asymmetric activations, symmetric
      int8 weights, and the outputs quantized too, so each ``DQ -> Conv -> Q`` group becomes one
      ``QLinearConv`` (U8S8 is the x86 fast path); without output Q/DQ ONNX Runtime runs a float
      convolution behind a DequantizeLinear and int8 is slower than fp32.

    Both styles use the same calibration ranges (and cache).

    Args:
        model: the float32 model (not modified).
        calib: calibration data, method, per-channel flag and cache location.
        op_types: op types to quantize (their outputs stay float: TensorRT fuses Q/DQ into them).
        cache_dir: StreamRT's cache root; ranges go to ``<cache_dir>/calibration/<key>.json``
            unless ``calib.cache`` names a file or a folder.
        progress: called with one-line status messages.

    Returns:
        The QDQ model. All intermediate files live in a temporary folder removed on any exit.

    Raises:
        CalibrationError: missing, empty, unreadable or mismatched calibration data.
        BuildError: ONNX Runtime failed to calibrate or quantize.
    """
    if style not in ("tensorrt", "onnxruntime"):
        raise ValueError(f"int8 style must be 'tensorrt' or 'onnxruntime', got {style!r}")
    tensorrt_style = style == "tensorrt"
    op_types = list(op_types)
    ort_q = _Ort()
    settings = _settings(calib, op_types, ort_q.version)
    specs = tensor_specs(model, "input")
    explicit = calib.cache
    dataset: CalibrationDataset | None = None
    if explicit is not None and not calib.data.exists() and explicit.is_file():
        key = CalibrationKey(model_digest(model), None, settings)
        logger.warning("calibration folder %s is missing: reusing %s without checking its data", calib.data, explicit)
    else:
        dataset = CalibrationDataset.from_config(calib, specs)
        dataset.load(0)  # fail before any slow step when the data does not fit at all
        key = CalibrationKey(model_digest(model), dataset.content_hash(), settings)
    cache_path = _cache_path(calib, cache_dir, key)
    ranges = read_calibration_cache(cache_path, key)
    if ranges is None and dataset is None:
        raise CalibrationError(
            f"calibration folder not found: {calib.data}, and {cache_path} holds no usable ranges",
            hint="pass an existing calibration folder with --calib",
        )
    with tempfile.TemporaryDirectory(prefix="streamrt-int8-") as tmp_name:
        tmp = Path(tmp_name)
        prepared = _prepare(model, tmp, progress)
        ranges_path = tmp / "ranges.json"
        if ranges is not None:
            # One channel per message: ``progress`` is what the CLI shows; the log only records it.
            logger.debug("reusing calibration cache %s", cache_path)
            progress(f"int8: reusing calibration cache {cache_path}")
            ranges_path.write_text(json.dumps(ranges))
        else:
            assert dataset is not None
            _calibrate(ort_q, prepared, dataset, calib, op_types, tmp / "augmented.onnx", ranges_path, progress)
            write_calibration_cache(cache_path, key, json.loads(ranges_path.read_text()))
            _write_trt_table(ranges_path, cache_path, tmp)
            logger.debug("wrote calibration cache %s", cache_path)
            progress(f"int8: wrote calibration cache {cache_path}")
        progress(f"int8: inserting Q/DQ nodes into {', '.join(op_types)} (per_channel={calib.per_channel})")
        output = tmp / "quantized.onnx"
        with _guard("Q/DQ insertion"):
            ort_q.quantize_static(
                str(prepared),
                str(output),
                None,
                quant_format=ort_q.QuantFormat.QDQ,
                op_types_to_quantize=op_types,
                per_channel=calib.per_channel,
                activation_type=ort_q.QuantType.QInt8 if tensorrt_style else ort_q.QuantType.QUInt8,
                weight_type=ort_q.QuantType.QInt8,
                calibrate_method=ort_q.methods[calib.method],
                extra_options={
                    "ActivationSymmetric": tensorrt_style,
                    "WeightSymmetric": True,
                    # TensorRT fuses Q/DQ into the consumer: outputs of quantized ops stay float.
                    "OpTypesToExcludeOutputQuantization": op_types if tensorrt_style else [],
                },
                calibration_cache_path=str(ranges_path),
            )
            quantized = onnx.load(str(output))
    return quantized


class _Ort:
    """The onnxruntime.quantization pieces int8 uses, imported on first use."""

    def __init__(self) -> None:
        import onnxruntime
        from onnxruntime.quantization import QuantFormat, QuantType, calibrate, quantize_static

        if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
            raise BuildError(
                f"int8 needs onnxruntime's quantize_static(calibration_cache_path=...), missing in "
                f"onnxruntime {onnxruntime.__version__}",
                hint="pip install -U onnxruntime (1.32 is known to work)",
            )
        self.version = onnxruntime.__version__
        self.methods = {method: calibrate.CalibrationMethod[name] for method, name in _METHOD_NAMES.items()}
        self.quantize_static = quantize_static
        self.QuantFormat = QuantFormat
        self.QuantType = QuantType
        self.calibrate = calibrate


def _settings(calib: CalibrationConfig, op_types: list[str], ort_version: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "method": calib.method.value,
        "op_types": sorted(op_types),
        "onnxruntime": ort_version,
        "num_bins": _HISTOGRAM_BINS.get(calib.method),
    }
    if calib.method is CalibrationMethod.PERCENTILE:
        settings["percentile"] = calib.percentile
    if calib.method is CalibrationMethod.ENTROPY:
        settings["num_quantized_bins"] = _ENTROPY_QUANTIZED_BINS
    return settings


def _calibrator_options(calib: CalibrationConfig) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if calib.method in _HISTOGRAM_BINS:
        options["num_bins"] = _HISTOGRAM_BINS[calib.method]
    if calib.method is CalibrationMethod.ENTROPY:
        options["num_quantized_bins"] = _ENTROPY_QUANTIZED_BINS
    if calib.method is CalibrationMethod.PERCENTILE:
        options["percentile"] = calib.percentile
    return options


def _cache_path(calib: CalibrationConfig, cache_dir: Path, key: CalibrationKey) -> Path:
    if calib.cache is None:
        return Path(cache_dir) / "calibration" / f"{key.digest}.json"
    if calib.cache.is_dir():
        return calib.cache / f"{key.digest}.json"
    return calib.cache


def _prepare(model: onnx.ModelProto, tmp: Path, progress: Progress) -> Path:
    """Save the model and run ORT's quantization pre-processing (shape inference, folding)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = tmp / "model.onnx"
    large = model.ByteSize() > _PROTOBUF_LIMIT
    onnx.save_model(model, str(source), save_as_external_data=large)
    prepared = tmp / "prepared.onnx"
    progress("int8: pre-processing the model (shape inference, constant folding)")
    try:
        with _quiet():
            quant_pre_process(str(source), str(prepared), save_as_external_data=large)
    except Exception as exc:  # symbolic shape inference fails on some exotic graphs
        logger.warning("quantization pre-processing failed (%s: %s); quantizing the model as is",
                       type(exc).__name__, exc)  # fmt: skip
        return source
    return prepared


class _Feeds:
    """A CalibrationDataReader over a dataset that reports progress and remembers the sample."""

    def __init__(self, dataset: CalibrationDataset, progress: Progress) -> None:
        self._dataset = dataset
        self._progress = progress
        self.index = -1

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.index + 1 >= len(self._dataset):
            return None
        self.index += 1
        done, total = self.index + 1, len(self._dataset)
        if done == total or done % max(1, total // 10) == 0:  # about ten lines per calibration
            self._progress(f"int8: calibration sample {done}/{total}")
        return self._dataset.load(self.index)

    def __len__(self) -> int:
        return len(self._dataset)


def _calibrate(
    ort_q: _Ort,
    prepared: Path,
    dataset: CalibrationDataset,
    calib: CalibrationConfig,
    op_types: list[str],
    augmented: Path,
    ranges_path: Path,
    progress: Progress,
) -> None:
    """Run ORT's calibrator over the dataset and save the ranges (ORT's JSON) to ``ranges_path``."""
    logger.debug("calibrating with %s on %d samples from %s", calib.method.value, len(dataset), dataset.folder)
    progress(f"int8: calibrating ({calib.method.value}) on {len(dataset)} samples from {dataset.folder}")
    feeds = _Feeds(dataset, progress)
    with _guard("calibration"):
        with _quiet():
            calibrator = ort_q.calibrate.create_calibrator(
                prepared,
                op_types,
                augmented_model_path=str(augmented),
                calibrate_method=ort_q.methods[calib.method],
                providers=["CPUExecutionProvider"],
                extra_options=_calibrator_options(calib),
            )
        try:
            with _quiet():
                calibrator.collect_data(feeds)
                tensors = calibrator.compute_data()
        except StreamRTError:
            raise
        except Exception as exc:
            sample = dataset.paths[max(feeds.index, 0)]
            raise CalibrationError(
                f"running the model on calibration sample {sample} failed: {type(exc).__name__}: {exc}",
                hint="check that the sample's shapes are ones the model accepts",
            ) from exc
        ort_q.calibrate.save_tensors_data(tensors, ranges_path)


def _write_trt_table(ranges_path: Path, cache_path: Path, tmp: Path) -> None:
    """Also write ORT's TensorRT-style tables next to the cache (for ORT's TensorRT provider)."""
    from onnxruntime.quantization import write_calibration_table
    from onnxruntime.quantization.calibrate import load_tensors_data

    table_dir = tmp / "table"
    table_dir.mkdir()
    root = logging.getLogger()
    root.addFilter(_drop_table_dump)  # it logs the whole table on the root logger at INFO
    try:
        with _quiet():
            write_calibration_table(load_tensors_data(ranges_path).data, dir=str(table_dir))
        for suffix in ("flatbuffers", "cache"):
            target = cache_path.with_name(f"{cache_path.stem}.trt.{suffix}")
            partial = target.with_name(f".{target.name}.tmp")
            shutil.copyfile(table_dir / f"calibration.{suffix}", partial)
            partial.replace(target)
    except Exception as exc:  # the tables are a convenience: never fail the build for them
        logger.warning("could not write the TensorRT-style calibration table: %s", exc)
    finally:
        root.removeFilter(_drop_table_dump)


def _drop_table_dump(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("calibration cache:")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ORT's calibrators print progress to stdout; route it to DEBUG logs instead."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        text = buffer.getvalue().strip()
        if text:
            logger.debug("onnxruntime: %s", text.replace("\n", " | "))


@contextlib.contextmanager
def _guard(step: str) -> Iterator[None]:
    try:
        yield
    except StreamRTError:
        raise
    except Exception as exc:
        raise BuildError(f"int8 {step} failed: {type(exc).__name__}: {exc}") from exc
