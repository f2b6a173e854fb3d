"""TensorRT 10.x / 11.x differences and the TensorRT backend's pure logic.

This module never imports ``tensorrt`` at import time, so CI (which cannot install TensorRT)
imports and tests it. Functions that need the library take the module as an argument (``trt``):
that is the seam unit tests use to pass a small fake; the fakes test *this* logic, not TensorRT.

What differs between the versions, and what StreamRT does about it (``docs/tensorrt.md`` has
the full table with sources):

* Network flags: 10.x needs ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` (opt-in); on 11.x
  strong typing is always on and the flag is deprecated and ignored. ``EXPLICIT_BATCH`` is never
  touched: it was ignored in 10.x and is gone from the 11.x enum. See :func:`network_flags`.
* Precision builder flags (FP16, BF16, INT8, FP8...) and INT8 calibrators: deprecated in 10.x,
  removed in 11.x. StreamRT never sets them; precision comes from Cast and Q/DQ nodes.
* Engine inspector JSON: I/O tensors are listed under ``"Bindings"`` (10.x) or ``"I/O Tensors"``
  (11.x). :func:`normalize_inspector` gives one shape.
* Version-compatible plans: within a major version a newer runtime loads an older plan; across
  majors only 8 -> 10 and 10 -> 11. :func:`version_can_run` encodes that rule.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt.config import BuildConfig
from streamrt.errors import (
    BuildError,
    ConfigError,
    PlanMismatchError,
    ProfileError,
    StreamRTError,
    UnsupportedOperatorError,
)
from streamrt.plan import PlanManifest, check_field
from streamrt.types import DType, Shape, ShapeProfile, TensorSpec, format_shape

__all__ = [
    "HARDWARE_LEVELS",
    "LOGS",
    "BuildOptions",
    "BuildProgress",
    "LogCapture",
    "ParserErrorRecord",
    "build_failure",
    "build_options",
    "check_plan",
    "dtype_from_trt",
    "enum_name",
    "get_logger",
    "network_flags",
    "normalize_inspector",
    "parse_version",
    "parser_failure",
    "profile_shapes",
    "python_level",
    "timing_cache_path",
    "trt_dtype_name",
    "version_can_run",
]

trt_log = logging.getLogger("streamrt.backends.tensorrt.library")
"""Where TensorRT's own messages go (its ILogger is bridged to this logger)."""

MIN_VERSION = (10, 0)


def parse_version(text: str) -> tuple[int, int, int]:
    """``'10.16.0.72'`` -> ``(10, 16, 0)``; missing parts count as 0, suffixes are ignored."""
    parts = re.findall(r"\d+", str(text).split("+")[0])[:3]
    if not parts:
        raise ConfigError(f"cannot read a TensorRT version from {text!r}")
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return nums[0], nums[1], nums[2]


def enum_name(value: Any) -> str:
    """The member name of a pybind11 enum value (``Severity.WARNING`` -> ``'WARNING'``), or of a string."""
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name
    return str(value).rsplit(".", 1)[-1]


# --- network creation ---------------------------------------------------------------------------


def network_flags(trt: Any) -> int:
    """Flags for ``Builder.create_network``: strongly typed on 10.x, nothing on 11.x.

    On 11.x every network is strongly typed and ``STRONGLY_TYPED`` is deprecated and ignored,
    so no flag is passed. ``EXPLICIT_BATCH`` is never read (it no longer exists on 11.x).
    """
    version = parse_version(trt.__version__)
    if version[:2] < MIN_VERSION:
        raise BuildError(
            f"TensorRT {trt.__version__} is too old: the tensorrt backend needs TensorRT 10.0 or newer",
            hint="pip install 'tensorrt>=10'",
        )
    if version[0] >= 11:
        return 0
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if flag is None:
        raise BuildError(f"TensorRT {trt.__version__} has no strongly typed networks")
    return 1 << int(flag)


# --- dtypes -------------------------------------------------------------------------------------

# TensorRT DataType members that can be engine inputs/outputs here. FP8, INT4, FP4 and E8M0 exist
# in TensorRT but not in StreamRT's tables; DOUBLE and INT16 are in StreamRT's table but not
# in TensorRT (its DataType has no such members).
_TRT_IO = frozenset({"FLOAT", "HALF", "BF16", "INT8", "UINT8", "INT32", "INT64", "BOOL"})
_BY_TRT_NAME = {d.info.tensorrt: d for d in DType if d.info.tensorrt in _TRT_IO}


def dtype_from_trt(value: Any) -> DType:
    """StreamRT dtype of a ``trt.DataType`` (or its name)."""
    name = enum_name(value)
    dtype = _BY_TRT_NAME.get(name)
    if dtype is None:
        raise ConfigError(
            f"TensorRT data type {name} has no StreamRT equivalent; engine inputs and outputs must be one of "
            f"{', '.join(sorted(_BY_TRT_NAME))}",
            hint="keep graph inputs/outputs in a standard type (Cast inside the graph)",
        )
    return dtype


def trt_dtype_name(dtype: DType) -> str:
    """The ``trt.DataType`` member name of a StreamRT dtype; TensorRT has no float64 or int16."""
    name = dtype.info.tensorrt
    if name not in _TRT_IO:
        raise ConfigError(
            f"TensorRT has no {dtype.value} tensors (DataType.{name} does not exist)",
            hint="cast the model's inputs/outputs to float32 or int32 before building",
        )
    return name


# --- build options ------------------------------------------------------------------------------

HARDWARE_LEVELS = {"none": "NONE", "ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}
_OPTIONS = ("version_compatible", "hardware_compatibility", "refit", "timing_cache", "cuda_graphs")


@dataclass(frozen=True)
class BuildOptions:
    """The TensorRT backend options (``BuildConfig.backend_options``), validated.

    Attributes:
        version_compatible: build with ``BuilderFlag.VERSION_COMPATIBLE`` (plan embeds a lean
            runtime; newer TensorRT versions can load it; may be slower).
        hardware_compatibility: ``none``, ``ampere_plus`` or ``same_compute_capability``.
        refit: build with ``BuilderFlag.REFIT`` (weights can be replaced later).
        timing_cache: ``None`` for the shared default file, ``""`` to disable, or a path;
            ``BuildConfig.timing_cache`` (``--timing-cache FILE``) takes precedence.
        cuda_graphs: default for ``create_context(cuda_graph=...)`` on engines loaded from the plan.
    """

    version_compatible: bool = False
    hardware_compatibility: str = "none"
    refit: bool = False
    timing_cache: str | None = None
    cuda_graphs: bool = False

    def facts(self) -> dict[str, Any]:
        """What the manifest records in ``extra["tensorrt"]`` (read back by :func:`check_plan`)."""
        return {
            "version_compatible": self.version_compatible,
            "hardware_compatibility": self.hardware_compatibility,
            "refit": self.refit,
        }


def _flag(opts: Mapping[str, Any], key: str) -> bool:
    value = opts.get(key, False)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if not isinstance(value, bool):
        raise ConfigError(f"tensorrt option {key} must be true or false, got {value!r}")
    return value


def build_options(config: BuildConfig) -> BuildOptions:
    """Validate ``config.backend_options`` for the tensorrt backend."""
    opts = dict(config.backend_options)
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown tensorrt backend options {unknown}; known: {', '.join(_OPTIONS)}")
    level = str(opts.get("hardware_compatibility", "none")).lower().replace("+", "_plus").replace("-", "_")
    if level not in HARDWARE_LEVELS:
        raise ConfigError(
            f"tensorrt option hardware_compatibility must be one of {', '.join(HARDWARE_LEVELS)}, "
            f"got {opts['hardware_compatibility']!r}"
        )
    cache = opts.get("timing_cache")
    if cache is False or (isinstance(cache, str) and cache.lower() in ("off", "none", "false", "")):
        cache = ""
    elif cache is True:
        cache = None
    elif cache is not None:
        cache = str(cache)
    if config.timing_cache is not None:  # --timing-cache FILE (BuildConfig) wins over the option
        cache = str(config.timing_cache)
    return BuildOptions(
        version_compatible=_flag(opts, "version_compatible"),
        hardware_compatibility=level,
        refit=_flag(opts, "refit"),
        timing_cache=cache,
        cuda_graphs=_flag(opts, "cuda_graphs"),
    )


def timing_cache_path(root: Path, trt_version: str, device: Mapping[str, Any]) -> Path:
    """The shared timing-cache file for one TensorRT version and one GPU (caches are device-specific)."""
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", str(device.get("name", "gpu"))).strip("-").lower() or "gpu"
    cc = str(device.get("compute_capability", "0.0")).replace(".", "")
    return root / "tensorrt" / f"timing-{trt_version}-{gpu}-sm{cc}.cache"


def profile_shapes(profile: ShapeProfile, inputs: Sequence[TensorSpec]) -> dict[str, tuple[Shape, Shape, Shape]]:
    """One StreamRT profile as ``{input: (min, opt, max)}`` for ``IOptimizationProfile.set_shape``.

    Static inputs without a range get their fixed shape (TensorRT wants every input covered).
    """
    shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
    for spec in inputs:
        rng = profile.ranges.get(spec.name)
        if rng is None:
            if spec.is_dynamic:
                raise ProfileError(f"the profile has no range for dynamic input '{spec.name}'")
            shapes[spec.name] = (spec.shape, spec.shape, spec.shape)
            continue
        for label, shape in (("min", rng.min), ("opt", rng.opt), ("max", rng.max)):
            if len(shape) != len(spec.shape):
                raise ProfileError(
                    f"input '{spec.name}': {label} shape {format_shape(shape)} has rank {len(shape)}, "
                    f"the network input has rank {len(spec.shape)}"
                )
        shapes[spec.name] = (tuple(rng.min), tuple(rng.opt), tuple(rng.max))
    return shapes


# --- plan compatibility -------------------------------------------------------------------------

_CROSS_MAJOR = frozenset({(8, 10), (10, 11)})


def version_can_run(plan_version: str, runtime_version: str) -> bool:
    """Whether a *version-compatible* plan built by ``plan_version`` loads in ``runtime_version``.

    Same major: any runtime at least as new as the builder. Across majors: only 8 -> 10 and
    10 -> 11 (TensorRT 11.4 support matrix, "Engine Portability").
    """
    plan, runtime = parse_version(plan_version), parse_version(runtime_version)
    if runtime < plan:
        return False
    return runtime[0] == plan[0] or (plan[0], runtime[0]) in _CROSS_MAJOR


def _cc(value: Any) -> tuple[int, int]:
    try:
        major, _, minor = str(value).partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return (0, 0)


def check_plan(manifest: PlanManifest, local_version: str, local_device: Mapping[str, Any] | None) -> None:
    """Raise :class:`PlanMismatchError` when a plan cannot load here, before TensorRT sees it.

    Args:
        manifest: the plan's manifest (``extra["tensorrt"]`` holds its compatibility flags).
        local_version: this machine's TensorRT version.
        local_device: this machine's GPU (``name``, ``compute_capability``), ``None`` without one.
    """
    facts = dict(manifest.extra.get("tensorrt", {}))
    if facts.get("version_compatible"):
        if not version_can_run(manifest.backend_version, local_version):
            raise PlanMismatchError(
                "tensorrt version (version-compatible plan: same major and not older, or 10 -> 11)",
                manifest.backend_version,
                local_version,
                manifest.build_command,
            )
    else:
        check_field(manifest, "tensorrt version", manifest.backend_version, local_version)
    if local_device is None:
        check_field(manifest, "device.kind", "cuda", "none (no CUDA GPU visible)")
        return
    level = str(facts.get("hardware_compatibility", "none"))
    plan_cc = manifest.device.get("compute_capability")
    local_cc = local_device.get("compute_capability")
    if level == "ampere_plus":
        if _cc(local_cc) < (8, 0):
            raise PlanMismatchError(
                "device.compute_capability (hardware-compatible plan: Ampere or newer)",
                f">= 8.0 (built on {plan_cc})",
                local_cc,
                manifest.build_command,
            )
        return
    if level != "same_compute_capability":
        check_field(manifest, "device.name", manifest.device.get("name"), local_device.get("name"))
    check_field(manifest, "device.compute_capability", plan_cc, local_cc)


# --- errors from the parser and the builder -----------------------------------------------------

_UNSUPPORTED = frozenset(f"UNSUPPORTED_NODE{s}" for s in ("", "_ATTR", "_INPUT", "_DATATYPE", "_DYNAMIC", "_SHAPE"))


@dataclass(frozen=True)
class ParserErrorRecord:
    """One ``trt.ParserError``, copied into plain values (so it outlives the parser)."""

    code: str
    desc: str
    node: int = -1
    node_name: str = ""
    node_operator: str = ""

    @classmethod
    def from_trt(cls, error: Any) -> ParserErrorRecord:
        """Copy ``code() desc() node() node_name() node_operator()`` of a ``trt.ParserError``."""
        return cls(
            code=enum_name(error.code()),
            desc=str(error.desc()),
            node=int(error.node()),
            node_name=str(error.node_name()),
            node_operator=str(error.node_operator()),
        )

    def format(self) -> str:
        where = f"node {self.node}" if self.node >= 0 else "graph"
        if self.node_name:
            where += f" '{self.node_name}'"
        if self.node_operator:
            where += f" ({self.node_operator})"
        return f"{where}: {self.code}: {self.desc.strip()}"


def _summary(lines: Sequence[str], limit: int = 4) -> str:
    text = "; ".join(lines[:limit])
    return text + (f"; and {len(lines) - limit} more" if len(lines) > limit else "")


def parser_failure(records: Sequence[ParserErrorRecord], *, opset: int, model_name: str) -> StreamRTError:
    """The StreamRT error for a failed ``OnnxParser.parse``: unsupported node, or a build error."""
    if not records:
        return BuildError(
            f"TensorRT's ONNX parser rejected {model_name} without reporting an error",
            hint="rerun with --verbose to see TensorRT's log",
        )
    detail = _summary([r.format() for r in records])
    first = next((r for r in records if r.code in _UNSUPPORTED and r.node_operator), None)
    if first is not None:
        return UnsupportedOperatorError(
            first.node_name or f"#{first.node}", first.node_operator, opset, "tensorrt", detail=detail
        )
    return BuildError(
        f"TensorRT's ONNX parser failed on {model_name}: {detail}",
        hint="check the model with 'streamrt inspect', or simplify it (constant folding) before building",
    )


_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"out of memory|outofmemory|could not be allocated|cudaErrorMemoryAllocation|failed to allocate", re.I
        ),
        "the GPU ran out of memory while building: lower the workspace (--memory-limit MB), reduce the max "
        "shapes of the profiles, or free GPU memory held by other processes",
    ),
    (
        re.compile(r"could not find any implementation", re.I),
        "TensorRT found no kernel for a node; this is often an out-of-memory during tactic selection: free GPU "
        "memory or reduce the max shapes, and check the node's types",
    ),
    (
        re.compile(r"MIN\s*<=\s*OPT\s*<=\s*MAX|violate shape constraints|optimization profile", re.I),
        "a shape profile does not fit the network: check --min-shapes/--opt-shapes/--max-shapes against the "
        "model's static dimensions",
    ),
)


def build_failure(messages: Sequence[tuple[str, str]], *, what: str) -> BuildError:
    """The error for ``build_serialized_network`` returning ``None``, with TensorRT's messages.

    Args:
        messages: ``(severity, text)`` pairs TensorRT logged during the build.
        what: what was being built (model name and profiles), for the message.
    """
    errors = [text for sev, text in messages if sev in ("ERROR", "INTERNAL_ERROR")]
    shown = errors or [text for sev, text in messages if sev == "WARNING"]
    hint = "rerun with --verbose to see TensorRT's full log"
    for pattern, text in _HINTS:
        if any(pattern.search(m) for _, m in messages):
            hint = text
            break
    detail = _summary([m.strip().splitlines()[0][:300] for m in shown[-6:]]) if shown else "no error was logged"
    return BuildError(f"TensorRT could not build {what}: {detail}", hint=hint)


# --- logging ------------------------------------------------------------------------------------

_LEVELS = {
    "INTERNAL_ERROR": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARNING": logging.WARNING,
    # TensorRT's INFO lines are per build/context detail: DEBUG here, as StreamRT keeps INFO quiet.
    "INFO": logging.DEBUG,
    "VERBOSE": logging.DEBUG,
}


def python_level(severity: Any) -> int:
    """The :mod:`logging` level of a TensorRT ``ILogger.Severity`` (or its name)."""
    return _LEVELS.get(enum_name(severity), logging.DEBUG)


class LogCapture:
    """Collects TensorRT messages (warnings and errors) for error reports.

    ``capture()`` collects every such message logged while the block runs, from any thread (the
    logger is one per process, so two concurrent builds see each other's messages). The last
    ``keep`` errors are also kept for runtime failures, which are reported after the fact.
    """

    def __init__(self, keep: int = 20) -> None:
        self._lock = threading.Lock()
        self._active: list[list[tuple[str, str]]] = []
        self.recent_errors: deque[str] = deque(maxlen=keep)

    def record(self, severity: Any, message: str) -> None:
        name = enum_name(severity)
        if name not in ("WARNING", "ERROR", "INTERNAL_ERROR"):
            return
        with self._lock:
            if name != "WARNING":
                self.recent_errors.append(message)
            for sink in self._active:
                sink.append((name, message))

    @contextmanager
    def capture(self) -> Iterator[list[tuple[str, str]]]:
        sink: list[tuple[str, str]] = []
        with self._lock:
            self._active.append(sink)
        try:
            yield sink
        finally:
            with self._lock:
                self._active.remove(sink)

    def last_errors(self, count: int = 3) -> str:
        with self._lock:
            errors = list(self.recent_errors)[-count:]
        return " | ".join(e.strip().splitlines()[0][:300] for e in errors) or "no TensorRT error was logged"


LOGS = LogCapture()
_LOGGER: Any = None
_LOGGER_LOCK = threading.Lock()


def get_logger(trt: Any) -> Any:
    """The process-wide ``trt.ILogger`` that forwards TensorRT's messages to :mod:`logging`.

    TensorRT treats the logger as a process singleton (the one given to the first builder or
    runtime is used for everything it creates), so StreamRT creates exactly one.
    """
    global _LOGGER
    with _LOGGER_LOCK:
        if _LOGGER is None:

            class _Bridge(trt.ILogger):
                def __init__(self) -> None:
                    trt.ILogger.__init__(self)

                def log(self, severity: Any, msg: str) -> None:
                    LOGS.record(severity, msg)
                    level = python_level(severity)
                    if trt_log.isEnabledFor(level):
                        trt_log.log(level, "%s", msg)

            _LOGGER = _Bridge()
        return _LOGGER


# --- build progress -----------------------------------------------------------------------------


@dataclass
class _Phase:
    steps: int
    depth: int
    started: float = field(default=0.0)


class BuildProgress:
    """Turns TensorRT's ``IProgressMonitor`` callbacks into a few progress lines.

    Only the two outermost phase levels are reported, and step lines at most every
    ``interval`` seconds, so a long build prints a readable trail instead of thousands of lines.
    ``cancel()`` makes the next ``step_complete`` return False, which asks TensorRT to stop.
    An exception raised by the progress callback is kept in ``error`` and cancels the build.
    """

    def __init__(
        self, report: Callable[[str], None], interval: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._report = report
        self._interval = interval
        self._clock = clock
        self._phases: dict[str, _Phase] = {}
        self._last = -float("inf")
        self.cancelled = False
        self.error: BaseException | None = None

    def cancel(self) -> None:
        self.cancelled = True

    def _emit(self, line: str) -> None:
        try:
            self._report(line)
        except BaseException as exc:  # KeyboardInterrupt included: TensorRT must stop, then re-raise
            self.error = exc
            self.cancelled = True

    def phase_start(self, name: str, parent: str | None, steps: int) -> None:
        depth = self._phases[parent].depth + 1 if parent and parent in self._phases else 0
        self._phases[name] = _Phase(int(steps), depth, self._clock())
        if depth <= 1:
            self._emit(f"tensorrt: {name} ({steps} steps)" if steps > 1 else f"tensorrt: {name}")

    def step_complete(self, name: str, step: int) -> bool:
        phase = self._phases.get(name)
        now = self._clock()
        if phase is not None and phase.depth <= 1 and phase.steps > 1 and now - self._last >= self._interval:
            self._last = now
            self._emit(f"tensorrt: {name} {step + 1}/{phase.steps}")
        return not self.cancelled

    def phase_finish(self, name: str) -> None:
        phase = self._phases.pop(name, None)
        if phase is not None and phase.depth == 0:
            self._emit(f"tensorrt: {name} done in {self._clock() - phase.started:.1f} s")


# --- engine inspector ---------------------------------------------------------------------------


def normalize_inspector(data: Any) -> dict[str, Any]:
    """One shape for ``EngineInspector.get_engine_information(JSON)`` across versions and verbosities.

    Returns ``{"layers": [{"name", "type", "details"}], "io_tensors": [...]}``: layers are plain
    names with ``LAYER_NAMES_ONLY``/``NONE`` verbosity and dicts (``Name``, ``LayerType``, ...)
    with ``DETAILED``; I/O tensors are under ``"Bindings"`` (10.x) or ``"I/O Tensors"`` (11.x).
    """
    if isinstance(data, list):
        data = {"Layers": data}
    if not isinstance(data, Mapping):
        raise ConfigError(f"unexpected TensorRT inspector output of type {type(data).__name__}")
    layers = []
    for index, layer in enumerate(data.get("Layers", [])):
        if isinstance(layer, Mapping):
            name = str(layer.get("Name", index))
            layers.append({"name": name, "type": str(layer.get("LayerType", "?")), "details": dict(layer)})
        else:
            layers.append({"name": str(layer), "type": "?", "details": {}})
    io = data.get("I/O Tensors", data.get("Bindings", []))
    return {"layers": layers, "io_tensors": list(io)}
