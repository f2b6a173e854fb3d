"""int8 by explicit quantization: Q/DQ nodes from calibration ranges, with a calibration cache.

ONNX Runtime's quantization tooling does the math: ``quant_pre_process`` (shape inference and
constant folding), ``create_calibrator`` (min-max, entropy or percentile ranges over the
calibration folder), and ``quantize_static`` in QDQ format, symmetric int8 activations and
weights (optionally per-channel), which is what TensorRT's explicit quantization expects. The
ranges are stored in StreamRT's calibration cache (:mod:`streamrt.onnx.calibration`) and handed to
``quantize_static`` through its ``calibration_cache_path``, so a later build with the same model,
data and settings skips calibration entirely.

Before quantizing, models below opset 13 are upgraded with ONNX's version converter (per-channel
``DequantizeLinear`` takes an ``axis`` only from opset 13), pre-processing failures are reported
as warnings with their reason (and retried without symbolic shape inference), and ONNX Runtime's
"Expected bias ... to be an initializer" lines become one summary line. With a target
(``BuildConfig.int8_target``), :mod:`streamrt.onnx.int8_sensitivity` keeps the quantized layers
that hurt the output most in fp32 until the target is met.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from streamrt.config import CalibrationConfig, CalibrationMethod
from streamrt.errors import BuildError, CalibrationError, StreamRTError
from streamrt.onnx.autocast import name_nodes
from streamrt.onnx.calibration import (
    CalibrationDataset,
    CalibrationKey,
    model_digest,
    read_calibration_cache,
    write_calibration_cache,
)
from streamrt.onnx.lowering import PrecisionResult
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
_QDQ_OPSET = 13  # per-channel DequantizeLinear (its axis attribute) needs opset 13
_SENSITIVITY_SAMPLES = 16  # calibration samples the sensitivity pass measures on, without feeds


def quantize_int8(
    model: onnx.ModelProto,
    calib: CalibrationConfig,
    op_types: Sequence[str],
    *,
    cache_dir: Path,
    progress: Progress,
    style: str = "tensorrt",
    target: str | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] = (),
) -> PrecisionResult:
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
        target: an accuracy threshold (``"top1=0.99"``); when plain int8 misses it on the
            sample feeds, the most sensitive quantized layers are kept in fp32 until it is met.
        feeds: sample inputs for the sensitivity pass (default: the first calibration samples).

    Returns:
        The QDQ model with the report (opset upgrade, pre-processing, layers kept in fp32). All
        intermediate files live in a temporary folder removed on any exit.

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
    notes: list[str] = []
    work, per_channel = _upgrade_opset(model, calib.per_channel, notes)
    with tempfile.TemporaryDirectory(prefix="streamrt-int8-") as tmp_name:
        tmp = Path(tmp_name)
        prepared = _prepare(work, tmp, progress, notes)
        ranges_path = tmp / "ranges.json"
        if ranges is not None:
            # One channel per message: ``progress`` is what the CLI shows; the log only records it.
            logger.debug("reusing calibration cache %s", cache_path)
            progress(f"int8: reusing calibration cache {cache_path}")
            ranges_path.write_text(json.dumps(ranges))
        else:
            assert dataset is not None
            with _collect_bias_warnings([]):
                _calibrate(ort_q, prepared, dataset, calib, op_types, tmp / "augmented.onnx", ranges_path, progress)
            write_calibration_cache(cache_path, key, json.loads(ranges_path.read_text()))
            _write_trt_table(ranges_path, cache_path, tmp)
            logger.debug("wrote calibration cache %s", cache_path)
            progress(f"int8: wrote calibration cache {cache_path}")
        progress(f"int8: inserting Q/DQ nodes into {', '.join(op_types)} (per_channel={per_channel})")
        bias_lines: list[str] = []

        def quantize(exclude: Sequence[str] = ()) -> onnx.ModelProto:
            output = tmp / "quantized.onnx"
            with _guard("Q/DQ insertion"), _collect_bias_warnings(bias_lines):
                ort_q.quantize_static(
                    str(prepared),
                    str(output),
                    None,
                    quant_format=ort_q.QuantFormat.QDQ,
                    op_types_to_quantize=op_types,
                    per_channel=per_channel,
                    activation_type=ort_q.QuantType.QInt8 if tensorrt_style else ort_q.QuantType.QUInt8,
                    weight_type=ort_q.QuantType.QInt8,
                    calibrate_method=ort_q.methods[calib.method],
                    nodes_to_exclude=list(exclude),
                    extra_options={
                        "ActivationSymmetric": tensorrt_style,
                        "WeightSymmetric": True,
                        # TensorRT fuses Q/DQ into the consumer: outputs of quantized ops stay float.
                        "OpTypesToExcludeOutputQuantization": op_types if tensorrt_style else [],
                    },
                    calibration_cache_path=str(ranges_path),
                )
                return onnx.load(str(output))

        quantized = quantize()
        if bias_lines:
            notes.append(
                f"{len(set(bias_lines))} bias input(s) are not initializers and stay float "
                f"(onnxruntime: 'Expected bias ... to be an initializer'), e.g. {sorted(set(bias_lines))[:3]}"
            )
        record: dict[str, Any] = {"precision": "int8", "opset": _opset(work), "per_channel": per_channel}
        details: list[str] = []
        line = f"int8: quantized {', '.join(op_types)}"
        if target is not None:
            from streamrt.onnx.int8_sensitivity import restore_accuracy

            samples = list(feeds) or _first_samples(dataset)
            if not samples:
                notes.append("no samples for the int8 sensitivity pass (calibration folder absent): skipped")
            else:
                restored = restore_accuracy(onnx.load(str(prepared)), quantize, op_types, samples, target, progress)
                quantized = restored.model
                record["sensitivity"] = restored.to_dict()
                details += restored.lines()
                line = restored.summary
        for note in notes:
            logger.warning("int8: %s", note)
        record["notes"] = notes
    return PrecisionResult(quantized, line, tuple(details), record)


def _first_samples(dataset: CalibrationDataset | None) -> list[dict[str, np.ndarray]]:
    if dataset is None:
        return []
    return [dataset.load(i) for i in range(min(len(dataset), _SENSITIVITY_SAMPLES))]


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def _upgrade_opset(model: onnx.ModelProto, per_channel: bool, notes: list[str]) -> tuple[onnx.ModelProto, bool]:
    """Opset >= 13 for per-channel Q/DQ (ONNX's version converter); per-tensor when that fails."""
    opset = _opset(model)
    if opset >= _QDQ_OPSET:
        return model, per_channel
    try:
        upgraded = onnx.version_converter.convert_version(model, _QDQ_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if per_channel:
            notes.append(
                f"opset {opset} could not be upgraded to {_QDQ_OPSET} ({reason}); per-channel Q/DQ needs "
                f"opset {_QDQ_OPSET}, so weights use per-tensor scales"
            )
        return model, False
    logger.info("int8: upgraded opset %d -> %d for Q/DQ", opset, _QDQ_OPSET)
    return upgraded, per_channel


@contextlib.contextmanager
def _collect_bias_warnings(lines: list[str]) -> Iterator[None]:
    """ORT logs one root-logger warning per non-initializer bias: collect them into one note.

    Its advice to pre-process is dropped too: a pre-processing failure is reported with its reason.
    """

    def keep(record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("Expected bias"):
            lines.append(message.split("'")[1] if "'" in message else message)
            return False
        return not message.startswith("Please consider")  # pre-processing: reported already

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


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


def _prepare(model: onnx.ModelProto, tmp: Path, progress: Progress, notes: list[str]) -> Path:
    """Save the model and run ORT's quantization pre-processing (shape inference, folding).

    Symbolic shape inference fails on some real models (an assertion on Concat, "Incomplete
    symbolic shape inference"); the step is then retried with ONNX shape inference only, and
    the reason is reported. Every node gets a name, so layers can be excluded by name.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    named = onnx.ModelProto()
    named.CopyFrom(model)
    name_nodes(named.graph)
    _constants_to_initializers(named.graph)
    source = tmp / "model.onnx"
    large = named.ByteSize() > _PROTOBUF_LIMIT
    onnx.save_model(named, str(source), save_as_external_data=large)
    prepared = tmp / "prepared.onnx"
    progress("int8: pre-processing the model (shape inference, constant folding)")
    failures = []
    for skip_symbolic in (False, True):
        try:
            with _quiet():
                quant_pre_process(
                    str(source), str(prepared), skip_symbolic_shape=skip_symbolic, save_as_external_data=large
                )
        except Exception as exc:
            text = str(exc).splitlines()[0] if str(exc) else ""
            failures.append(f"{'without' if skip_symbolic else 'with'} symbolic shape inference: "
                            f"{type(exc).__name__}{': ' + text if text else ''}")  # fmt: skip
            continue
        if failures:
            notes.append(f"pre-processing {failures[0]}; retried without it (ONNX shape inference only)")
        result = onnx.load(str(prepared))
        name_nodes(result.graph)  # the optimizer may add unnamed nodes
        onnx.save_model(result, str(prepared), save_as_external_data=large)
        return prepared
    notes.append(
        f"pre-processing failed ({'; '.join(failures)}); quantizing without it: shapes are unknown "
        "to the quantizer, and layers it cannot type stay float"
    )
    return source


def _constants_to_initializers(graph: onnx.GraphProto) -> None:
    """Top-level tensor Constants become initializers: ORT quantizes weights and biases only from those.

    Pre-processing folds them too, but not when it fails; without this, every Conv bias held by a
    Constant stays float with an "Expected bias ... to be an initializer" line.
    """
    keep = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


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
