"""A detection engine and what the video pipeline must know about it: input size and dtype, batch range,
output layout, class names.

:func:`open_detector` takes an ONNX file or a plan. An ONNX file goes through the build cache
(``streamrt.build``) with a dynamic batch profile, on the best backend this machine has unless
one is named (:data:`BACKEND_PREFERENCE`: TensorRT, else the GPU backend, else ONNX Runtime on
the CPU). Class names come from a labels file (one name per line), else the model's metadata
(``names``, as Ultralytics exports write it), else ``class0..``; the input size comes from the
model's input shape, else its ``imgsz`` metadata. The output layout is read from one probe
inference (:func:`streamrt.ops.layouts.resolve_layout`), so YOLOv5 and YOLOv8/YOLO11 exports drop in.

Example:
    >>> detector = open_detector(bundled_model())                       # doctest: +SKIP
    >>> detector.layout.name, detector.names[:2], detector.input_hw     # doctest: +SKIP
    ('yolov8', ('circle', 'square'), (320, 320))
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.errors import ConfigError, ModelError, ModelNotFoundError
from streamrt.ops.layouts import OutputLayout, resolve_layout
from streamrt.types import ShapeRange, TensorSpec

__all__ = [
    "BACKEND_PREFERENCE",
    "LANE_OPTIONS",
    "DetectorModel",
    "best_backend",
    "bundled_labels",
    "bundled_model",
    "describe_engine",
    "detector_build_config",
    "open_detector",
    "read_labels",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _BackendChoice:
    needs_cuda: bool
    precision: str


# Best first: the first whose library imports (and whose device exists) builds the demo's plan.
BACKEND_PREFERENCE: dict[str, _BackendChoice] = {
    "tensorrt": _BackendChoice(needs_cuda=True, precision="fp16"),
    "torch_inductor": _BackendChoice(needs_cuda=True, precision="fp16"),
    "onnxruntime": _BackendChoice(needs_cuda=False, precision="fp32"),
}


# Backend options of a plan that serves one of several parallel pipeline lanes on the host: one
# intra-op thread per session, so lanes run frames side by side instead of fighting over every core.
LANE_OPTIONS: dict[str, dict[str, Any]] = {"onnxruntime": {"threads": 1}}


def best_backend() -> str:
    """The first backend of :data:`BACKEND_PREFERENCE` that can run on this machine."""
    from streamrt.backends import available_backends
    from streamrt.device import cuda_available

    available, cuda = set(available_backends()), cuda_available()
    for name, choice in BACKEND_PREFERENCE.items():
        if name in available and (cuda or not choice.needs_cuda):
            return name
    return "onnxruntime"


def bundled_model() -> Path:
    """The ONNX file of the bundled shapes detector (trained by ``scripts/train_detector.py``)."""
    return Path(str(resources.files("streamrt.video") / "assets" / "shapes_detector.onnx"))


def bundled_labels() -> Path:
    return bundled_model().with_suffix(".txt")


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a labels file: one per line, blank lines and ``#`` comments ignored."""
    p = Path(path)
    if not p.is_file():
        raise ModelNotFoundError(f"labels file not found: {p}")
    names = [line.strip() for line in p.read_text().splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    if not names:
        raise ModelError(f"labels file {p} has no names")
    return tuple(names)


def _names_from_metadata(metadata: dict[str, str]) -> tuple[str, ...] | None:
    text = metadata.get("names")
    if not text:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        log.warning("ignoring unreadable 'names' metadata: %.80s", text)
        return None
    if isinstance(value, dict):
        return tuple(str(value[k]) for k in sorted(value))
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return None


def _imgsz_from_metadata(metadata: dict[str, str]) -> tuple[int, int] | None:
    try:
        value = ast.literal_eval(metadata.get("imgsz", ""))
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return (int(value[0]), int(value[1]))
    return None


@dataclass
class DetectorModel:
    """An engine plus the facts the detection pipeline needs (see the module docstring).

    Attributes:
        engine: has ``inputs``, ``outputs``, ``profiles``, ``create_context()``.
        device: ``"cpu"`` or ``"cuda"``, where the engine's inputs and outputs live.
        input_name, output_name: the image input and the raw detection output.
        input_hw: model input (height, width).
        input_dtype: NumPy dtype of the input (float32, or float16 for fp16 IO).
        max_batch: the largest batch the engine accepts.
        layout, num_classes, anchors: from the probe inference.
        names: one class name per class.
        source: the model file it came from (for reports).
    """

    engine: Any
    device: str
    input_name: str
    output_name: str
    input_hw: tuple[int, int]
    input_dtype: np.dtype[Any]
    max_batch: int
    layout: OutputLayout
    num_classes: int
    anchors: int
    output_dtype: np.dtype[Any]
    names: tuple[str, ...]
    source: str = ""
    backend: str = ""

    def label(self, cls: int) -> str:
        return self.names[cls] if 0 <= cls < len(self.names) else f"class{cls}"


def _batch_range(engine: Any, name: str, shape: Sequence[int]) -> int:
    if shape[0] != -1:
        return int(shape[0])
    best = 1
    for profile in getattr(engine, "profiles", ()):
        rng: ShapeRange | None = profile.ranges.get(name)
        if rng is not None:
            best = max(best, int(rng.max[0]))
    return best


def _probe(engine: Any, device: str, name: str, hw: tuple[int, int], dtype: np.dtype[Any]) -> Any:
    """One inference on zeros to learn the output's concrete shape and dtype."""
    x = np.zeros((1, 3, *hw), dtype)
    ctx = engine.create_context()
    if device == "cuda":
        import torch

        outputs = ctx.infer({name: torch.from_numpy(x).to("cuda")})
        torch.cuda.synchronize()
    else:
        outputs = ctx.infer({name: x})
    return outputs


def describe_engine(engine: Any, *, device: str | None = None, labels: Sequence[str] | None = None,
                    metadata: dict[str, str] | None = None, layout: str | None = None,
                    imgsz: tuple[int, int] | None = None, source: str = "", backend: str = "") -> DetectorModel:
    """Wrap an engine (a loaded plan, or anything with the engine contract) as a :class:`DetectorModel`.

    Raises:
        ModelError: the engine has no 4-D image input, no 3-D output, or an output of unknown layout.
    """
    metadata = metadata or {}
    inputs, outputs = list(engine.inputs), list(engine.outputs)
    if len(inputs) != 1 or len(inputs[0].shape) != 4 or inputs[0].shape[1] not in (3, -1):
        shapes = ", ".join(f"{s.name} {s.shape}" for s in inputs)
        raise ModelError(f"a detector needs one image input (batch, 3, height, width), got {shapes}",
                         hint="export the model with a single NCHW image input")
    spec = inputs[0]
    hw = tuple(int(d) for d in spec.shape[2:])
    if min(hw) < 1:
        hw = imgsz or _imgsz_from_metadata(metadata) or (640, 640)
        log.info("input %s has dynamic height/width; using %dx%d", spec.name, *hw)
    dev = device or engine.device_kind
    in_dtype = spec.dtype.numpy
    raw = _probe(engine, dev, spec.name, (int(hw[0]), int(hw[1])), in_dtype)
    out_name = outputs[0].name if outputs else next(iter(raw))
    value = raw[out_name]
    shape = tuple(int(d) for d in value.shape)
    names = tuple(labels) if labels else _names_from_metadata(metadata)
    chosen, classes = resolve_layout(shape, num_classes=len(names) if names else None, layout=layout)
    if names is None:
        names = tuple(f"class{i}" for i in range(classes))
    anchors = chosen.split(shape)[1]
    out_dtype = np.dtype(str(value.dtype).removeprefix("torch."))
    log.info("detector %s: input %s %dx%d %s, output %s %s layout %s, %d classes, %d anchors, batch <= %d on %s",
             source or "engine", spec.name, hw[0], hw[1], in_dtype, out_name, shape, chosen.name, classes, anchors,
             _batch_range(engine, spec.name, spec.shape), dev)
    return DetectorModel(
        engine=engine, device=dev, input_name=spec.name, output_name=out_name, input_hw=(int(hw[0]), int(hw[1])),
        input_dtype=in_dtype, max_batch=_batch_range(engine, spec.name, spec.shape), layout=chosen,
        num_classes=classes, anchors=anchors, output_dtype=out_dtype, names=names, source=source, backend=backend,
    )


def detector_build_config(backend: str, spec: TensorSpec, *, max_batch: int = 16, opt_batch: int = 1,
                          precision: str | None = None) -> Any:
    """A :class:`~streamrt.config.BuildConfig` for the detector input ``spec``: the backend's precision
    (:data:`BACKEND_PREFERENCE`) and, when the batch is dynamic, a batch profile 1..``max_batch``
    (:func:`streamrt.building.opening.with_batch_profile`).

    Raises:
        ConfigError: the batch is dynamic and so is the image size (a detector needs a fixed one).
    """
    from streamrt.building.opening import with_batch_profile
    from streamrt.config import BuildConfig, Precision

    if backend not in BACKEND_PREFERENCE and precision is None:
        precision = "fp32"
    precision = precision or BACKEND_PREFERENCE[backend].precision
    from streamrt.backends import get_backend

    if precision not in get_backend(backend).precisions:
        precision = "fp32"
    if spec.shape[0] == -1 and min(spec.shape[1:]) < 1:
        raise ConfigError(f"input '{spec.name}' has dynamic height/width {tuple(spec.shape)}",
                          hint="export the detector with a fixed image size")
    config = BuildConfig(backend=backend, precision=Precision(precision))
    return with_batch_profile(config, [spec], max_batch, opt_batch)


def open_detector(
    path: str | Path,
    *,
    backend: str | None = None,
    labels: str | Path | Sequence[str] | None = None,
    layout: str | None = None,
    max_batch: int = 16,
    opt_batch: int = 1,
    precision: str | None = None,
    config: Any = None,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    options: Mapping[str, Any] | None = None,
) -> DetectorModel:
    """Load a plan, or build (through the cache) and load an ONNX detector; see the module docstring.

    Args:
        path: ``.onnx`` file or plan file.
        backend: for ONNX files; None picks :func:`best_backend`.
        labels: a labels file or the names themselves (else ``path`` with a ``.txt`` suffix, else the
            model's ``names`` metadata, else ``class0..``).
        layout: force an output layout (``yolov8``, ``yolov5``, ``yolov8t``).
        max_batch, opt_batch: the dynamic batch profile built for ONNX files with a dynamic batch.
        precision: override the backend's default precision (fp16 on GPU backends, fp32 on ONNX Runtime).
        config: a complete :class:`~streamrt.config.BuildConfig` (overrides backend/precision/batch).
        cache, cache_dir, progress: passed to :func:`streamrt.build`.
        options: backend options of a plan built from an ONNX file (e.g. ``{"threads": 1}``).

    Raises:
        ModelNotFoundError: no such file.
        ModelError: not a detector StreamRT can decode (the message says what was expected).
    """
    from streamrt.building.opening import open as open_engine
    from streamrt.plan import is_plan_file

    p = Path(path)
    if not p.is_file():
        raise ModelNotFoundError(f"detector model not found: {p}")
    names = read_labels(labels) if isinstance(labels, (str, Path)) else (tuple(labels) if labels else None)
    if names is None and p.with_suffix(".txt").is_file():
        names = read_labels(p.with_suffix(".txt"))
    if is_plan_file(p):
        engine = open_engine(p)
        chosen = str(engine.manifest.backend)
    else:
        from streamrt.onnx.model import load_model

        model = load_model(p)
        spec = model.inputs[0] if model.inputs else None
        if spec is None:
            raise ModelError(f"{p} has no inputs")
        chosen = backend or (config.backend if config is not None else best_backend())
        build_config = config or detector_build_config(chosen, spec, max_batch=max_batch, opt_batch=opt_batch,
                                                       precision=precision)
        if options and config is None:
            build_config = build_config.replace(backend_options=dict(options))
        engine = open_engine(model, build_config, cache=cache, cache_dir=cache_dir, progress=progress)
    metadata = dict(engine.manifest.source_metadata)  # the source ONNX's metadata_props
    return describe_engine(engine, labels=names, metadata=metadata, layout=layout, source=p.name, backend=chosen)
