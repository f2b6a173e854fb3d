"""The small protocols every backend fills in: Backend (build + load), Engine, ExecutionContext.

Build and run are separate: ``Backend.build`` turns a (precision-transformed) ONNX model into
payload bytes that :mod:`streamrt.plan` freezes; ``Backend.load`` turns a verified plan back
into an :class:`Engine`. An engine only validates and runs; it never imports builder code.

Lifecycle (after Polygraphy's runners): nothing heavy in ``__init__``; ``Engine.close()`` and
the context-manager protocol release resources, after which the engine, its contexts and
``create_context`` raise :class:`~streamrt.errors.InferenceError` (load the plan again);
:meth:`ExecutionContext.infer` checks names, dtypes and shapes against the profiles in one
place, then calls the backend's ``_infer_impl``.
A caller that validated its inputs already (the model server, once per request) passes
``check_inputs=False``, as with Polygraphy's ``infer(feed, check_inputs=False)``.

Example:
    >>> engine = streamrt.load("model.plan")                       # doctest: +SKIP
    >>> with engine.create_context() as ctx:                        # doctest: +SKIP
    ...     out = ctx.infer({"images": batch})
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from streamrt._oom import INFER_HINT, as_out_of_memory
from streamrt.errors import DTypeMismatchError, InferenceError, MissingInputError, ShapeError, UnknownInputError
from streamrt.onnx.profiles import check_shapes
from streamrt.plan import Plan, PlanManifest, check_field
from streamrt.types import DType, ShapeProfile, TensorSpec, format_shape

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

    from streamrt.config import BuildConfig
    from streamrt.device.base import StreamLike
    from streamrt.onnx.model import OnnxModel

__all__ = ["Backend", "BuildJob", "BuildOutput", "Engine", "ExecutionContext", "LayerTiming", "Progress"]

Progress = Callable[[str], None]
"""Receives one short line per build step ("optimizing graph", "autotuning 3/12")."""


@dataclass(frozen=True)
class BuildJob:
    """What :func:`streamrt.build` asks a backend to build.

    Attributes:
        model: the checked model, precision already applied to the graph.
        config: the build settings.
        profiles: the resolved shape profiles (every input named, min <= opt <= max).
        progress: receives one short line per long step.
        cache_dir: the build's cache root: backends keep their own caches under it (TensorRT's
            timing cache in ``tensorrt/``, Inductor's compile cache in ``inductor/``).
        started: ``time.monotonic()`` when the build began (before the model was loaded and
            lowered): a build budget counts from there.
    """

    model: OnnxModel
    config: BuildConfig
    profiles: tuple[ShapeProfile, ...]
    progress: Progress
    cache_dir: Path
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class BuildOutput:
    """What a backend's build returns; :func:`streamrt.build` wraps it into a plan.

    Attributes:
        payload: bytes the backend's ``load`` understands.
        settings: backend settings that shaped the payload, recorded in the manifest.
        manifest_facts: backend facts recorded in the manifest's ``extra`` section
            (compatibility flags, package names...).
        outputs: the outputs as the payload returns them (``-1`` for a dimension that follows a
            dynamic input), when the backend knows them from what it compiled; the plan records
            these instead of the model's declared outputs. Empty: the declared outputs stand.
    """

    payload: bytes
    settings: Mapping[str, Any] = field(default_factory=dict)
    manifest_facts: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[TensorSpec, ...] = ()


@dataclass(frozen=True)
class LayerTiming:
    """One row of a per-layer profile: ``streamrt profile`` sorts and sums these."""

    name: str
    op_type: str
    total_ms: float
    calls: int

    @property
    def mean_ms(self) -> float:
        return self.total_ms / max(self.calls, 1)


class Backend(abc.ABC):
    """A backend: builds payloads on this machine and loads plans into engines.

    Subclasses set ``name`` (the registry key), ``pip_extra`` (the pip extra that brings its
    library) and ``device_fields`` (the manifest ``device`` keys that must match at load).
    """

    name: ClassVar[str]
    pip_extra: ClassVar[str]
    device_fields: ClassVar[tuple[str, ...]] = ()
    precisions: ClassVar[frozenset[str]] = frozenset({"fp32"})
    # Q/DQ layout this backend fuses into integer kernels (see streamrt.onnx.quantize).
    int8_style: ClassVar[str] = "tensorrt"

    @abc.abstractmethod
    def version(self) -> str:
        """Version of the library that runs this backend's payloads."""

    @abc.abstractmethod
    def runtime_versions(self) -> dict[str, str]:
        """Versions of every library a payload depends on (recorded in the plan)."""

    @abc.abstractmethod
    def target_device(self, config: BuildConfig) -> dict[str, Any]:
        """The device this machine builds for, as recorded in the manifest's ``device``."""

    @abc.abstractmethod
    def build(self, job: BuildJob) -> BuildOutput:
        """Build a payload from ``job.model``, already checked and precision-transformed."""

    @abc.abstractmethod
    def load(self, plan: Plan) -> Engine:
        """Turn a verified, compatible plan into an engine."""

    def runs_operator(self, op_type: str, domain: str) -> bool | None:
        """Whether this backend can run ``op_type`` of ``domain``; None when it cannot tell without trying.

        Asked after another backend refused a node, to name the backends that could run it.
        """
        return None

    def build_recipe(self, config: BuildConfig) -> dict[str, Any]:
        """What ``config`` resolves to on this machine (optimization level -> knobs), for the build cache key."""
        return {}

    def describe_payload(self, payload: bytes) -> dict[str, Any]:
        """Extra facts for ``streamrt inspect`` read from a payload without loading it (e.g. ops)."""
        return {}

    def check_compatible(self, manifest: PlanManifest) -> None:
        """Raise PlanMismatchError when the plan cannot run here (library version or device).

        The default compares ``backend_version`` and ``device_fields``; backends that build
        version- or hardware-compatible payloads override it.
        """
        check_field(manifest, f"{self.name} version", manifest.backend_version, self.version())
        from streamrt.config import BuildConfig

        local = self.target_device(BuildConfig(backend=self.name))
        for key in self.device_fields:
            check_field(manifest, f"device.{key}", manifest.device.get(key), local.get(key))


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape)


class Engine(abc.ABC):
    """A loaded plan. Create one :class:`ExecutionContext` per concurrent stream.

    Attributes:
        manifest: the plan's manifest (precision, provenance, build settings).
        device_kind: ``"cpu"`` or ``"cuda"``: where inputs and outputs live.
    """

    def __init__(self, manifest: PlanManifest) -> None:
        self.manifest = manifest
        self.device_kind: str = "cpu"
        self._closed = False  # read on every call (a bool check): a closed engine runs nothing

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the engine, and every context made from it, then refuse to run."""
        return self._closed

    def closed_error(self) -> InferenceError:
        """The error a closed engine raises when it is asked to run or to create a context."""
        m = self.manifest
        return InferenceError(
            f"the {m.backend} engine of plan '{m.source_name}' ({m.precision}) was closed; "
            "a closed engine and its contexts run nothing",
            hint="load the plan again (streamrt.load) and create contexts from the new engine",
        )

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.manifest.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.manifest.outputs

    @property
    def profiles(self) -> tuple[ShapeProfile, ...]:
        return self.manifest.profiles

    @abc.abstractmethod
    def create_context(self) -> ExecutionContext:
        """A new execution context; each serves one stream at a time."""

    def profile_layers(self, inputs: Mapping[str, Any], iterations: int = 10) -> list[LayerTiming]:
        """Per-layer times from the backend's own profiler, in a run separate from timed runs."""
        from streamrt.errors import StreamRTError

        raise StreamRTError(f"backend '{self.manifest.backend}' has no per-layer profiler")

    def inspect_layers(self) -> dict[str, Any] | None:
        """Per-layer engine information (TensorRT's engine inspector); ``None`` where a backend has none."""
        return None

    def validate(self, inputs: Mapping[str, Any]) -> int:
        """Check names, dtypes and shapes; return the index of the profile that accepts them.

        Raises:
            InferenceError: the engine was closed.
        """
        if self._closed:
            raise self.closed_error()
        expected = {s.name: s for s in self.inputs}
        for name in inputs:
            if name not in expected:
                raise UnknownInputError(
                    f"unknown input '{name}'; the engine's inputs are: {', '.join(expected)}"
                )
        shapes = {}
        for name, spec in expected.items():
            if name not in inputs:
                raise MissingInputError(
                    f"missing input '{name}' ({spec.dtype.value}, {format_shape(spec.shape)})"
                )
            value = inputs[name]
            got = DType.from_any(value.dtype)
            if got is not spec.dtype:
                raise DTypeMismatchError(
                    f"input '{name}' has dtype {got.value}, the engine expects {spec.dtype.value}",
                    hint=f"convert it, e.g. array.astype('{spec.dtype.value}')",
                )
            shape = _shape_of(value)
            if len(shape) != len(spec.shape):
                raise ShapeError(
                    f"input '{name}' has rank {len(shape)} ({format_shape(shape)}), "
                    f"the engine expects rank {len(spec.shape)} ({format_shape(spec.shape)})"
                )
            shapes[name] = shape
        return check_shapes(self.profiles, shapes)

    def select_profile(self, inputs: Mapping[str, Any]) -> int:
        """The index of the first profile that accepts the inputs' shapes, without the other checks.

        Raises:
            ShapeError: no profile accepts them (an engine cannot run outside its profiles).
        """
        if not self.profiles:
            return 0
        return check_shapes(self.profiles, {name: _shape_of(value) for name, value in inputs.items()})

    def close(self) -> None:
        """Release the engine; afterwards it and its contexts raise :meth:`closed_error` instead of running."""
        self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ExecutionContext(abc.ABC):
    """Runs an engine on one stream at a time.

    ``infer`` enqueues work on ``stream`` (a :class:`streamrt.device.base.Stream` or a bare
    ``torch.cuda.Stream``, :data:`streamrt.device.base.StreamLike`; ``None``
    means the engine's own default for synchronous use) and returns outputs that are valid once
    that stream reaches this point. CPU engines run synchronously in the calling thread, which
    for a host stream is that stream's worker.
    """

    def __init__(self, engine: Engine) -> None:
        if engine._closed:  # every backend's create_context comes through here
            raise engine.closed_error()
        self.engine = engine

    def infer(
        self, inputs: Mapping[str, Any], stream: StreamLike | None = None, *, check_inputs: bool = True
    ) -> dict[str, Any]:
        """Validate inputs against the engine, then run. Returns outputs by name.

        Args:
            inputs: one array or tensor per engine input.
            stream: where to enqueue the work: a StreamRT stream or a ``torch.cuda.Stream`` (``None``: the
                engine's default, synchronous use).
            check_inputs: check names, dtypes and ranks (:meth:`Engine.validate`). Turn it off only
                when the caller has checked them already: a wrong input then fails inside the backend
                or, worse, runs. The profile is picked by shape either way (:meth:`Engine.select_profile`).

        Raises:
            InferenceError: the engine was closed (:meth:`Engine.close`).
            OutOfMemoryError: host or device memory ran out while running.
        """
        if self.engine._closed:  # one attribute read: nothing measurable on the hot path
            raise self.engine.closed_error()
        profile = self.engine.validate(inputs) if check_inputs else self.engine.select_profile(inputs)
        try:
            return self._infer_impl(inputs, profile, stream)
        except Exception as exc:
            oom = as_out_of_memory(exc, self._describe_call(inputs), INFER_HINT)
            if oom is None or oom is exc:
                raise
            raise oom from exc

    def _describe_call(self, inputs: Mapping[str, Any]) -> str:
        shapes = ", ".join(f"{name} {format_shape(_shape_of(value))}" for name, value in inputs.items())
        return f"running {self.engine.manifest.backend} inference on {shapes}"

    @abc.abstractmethod
    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: StreamLike | None) -> dict[str, Any]:
        """Run with inputs already validated; ``profile`` is the accepting profile's index."""

    def close(self) -> None:  # noqa: B027 - optional hook, most contexts hold nothing
        """Release per-context resources."""

    def __enter__(self) -> ExecutionContext:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
