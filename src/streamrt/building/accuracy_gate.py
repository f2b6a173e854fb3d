"""The precision step of a build: transform the graph, then refuse plans that lost the model.

:func:`measure_accuracy` is the entry point for any caller (the zoo benchmark): an engine or
ONNX model against a reference on feeds, as an :class:`~streamrt.measure.accuracy.AccuracyReport`.

:func:`streamrt.build` uses one :class:`PrecisionStep` for every fp16, bf16, int8 and TF32 build
(a TF32 plan has no graph transform: step 2 only, with :data:`TF32_BOUNDS` as its default gate):

1. :meth:`PrecisionStep.transform` lowers the ONNX graph (:func:`~streamrt.onnx.precision.lower_precision`)
   with the real sample data when there is some (calibration data or ``--sample-inputs``), and
   prints one line saying what stayed in fp32 (each node and its reason at ``--verbose``).
2. :meth:`PrecisionStep.check` loads the built payload in memory, runs it against ONNX Runtime
   fp32 on the original model (:func:`measure_accuracy`) on the sample
   feeds (calibration data, ``--sample-inputs``, else random inputs at the opt shapes), prints
   the per-output metrics and records them in the manifest's ``precision_report``. With
   ``--accuracy-threshold`` a miss raises :class:`~streamrt.errors.AccuracyError` before the plan
   is written; without one, a miss of :data:`WARN_BELOW` (cosine 0.99, relative L2 error 0.5:
   the scale is lost) is a warning. Measured on random inputs (no calibration data, no
   ``--sample-inputs``), the build warns that the numbers say nothing about real data
   (:data:`RANDOM_INPUTS_CAVEAT`) and the record says so (``accuracy.real_data``, ``accuracy.warning``).
3. int8 builds also time the plan against an fp32 plan of the same backend in interleaved rounds
   and say when fp32 is the better plan (:mod:`streamrt.building.speed_check`; ``--no-speed-check`` skips
   that second build).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt.backends.base import Engine
from streamrt.config import BuildConfig, Precision
from streamrt.errors import AccuracyError, ShapeError
from streamrt.measure.accuracy import AccuracyReport, AccuracyThreshold, accuracy_of
from streamrt.plan import Plan, PlanManifest
from streamrt.types import ShapeProfile

if TYPE_CHECKING:
    import onnx

    from streamrt.backends.base import Backend, Progress
    from streamrt.onnx.model import OnnxModel

__all__ = [
    "RANDOM_INPUTS_CAVEAT",
    "TF32_BOUNDS",
    "WARN_BELOW",
    "PrecisionStep",
    "measure_accuracy",
    "random_inputs_warning",
    "sample_feeds",
]

log = logging.getLogger(__name__)

Feeds = list[dict[str, np.ndarray]]
Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]

#: Without --accuracy-threshold, an output that misses these bounds gets a warning (never silent):
#: a direction lost (cosine) or a scale lost (relative L2 error; cosine cannot see a 50x scale).
WARN_BELOW = AccuracyThreshold({"cosine": 0.99, "rel_l2": 0.5})
#: A TF32 plan's default gate (``--tf32`` without --accuracy-threshold), a refusal when missed: TF32
#: keeps 10 mantissa bits, about 1e-3 relative error per product, which a deep network accumulates to
#: 1e-3..5e-3 relative L2. fp32 plans get no such allowance: ``verify.TOLERANCE["fp32"].rel`` is 1e-3.
TF32_BOUNDS = AccuracyThreshold({"rel_l2": 1e-2})
_MAX_SAMPLES = 8  # calibration samples the gate and the fp16 range check run on
_RANDOM_FEEDS = 2
#: What a gate on random inputs cannot show (printed with the warning, kept in the record).
RANDOM_INPUTS_CAVEAT = (
    "noise is not data: these numbers cannot show the activation ranges of real inputs (where fp16 "
    "overflows and int8 ranges clip) nor whether the plan agrees with fp32 on the classes, boxes or "
    "maps of real inputs"
)
_GIVE_DATA = "give real inputs with --sample-inputs FILE.npz (arrays keyed by input name) or --calib DIR"


def random_inputs_warning(feeds: int, why: str = "no calibration data and no --sample-inputs") -> str:
    """The build's warning for a gate that ran on ``feeds`` random inputs (``why``: how it came to that)."""
    return (
        f"warning: the accuracy gate ran on {feeds} feed(s) of RANDOM inputs at the opt shapes ({why}): "
        f"{RANDOM_INPUTS_CAVEAT}; {_GIVE_DATA}"
    )


def measure_accuracy(
    reference: Engine | str | Path | onnx.ModelProto | OnnxModel | Runner,
    engine: Engine | str | Path | onnx.ModelProto | OnnxModel | Runner,
    feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
    *,
    inputs: str = "",
) -> AccuracyReport:
    """Run ``reference`` and ``engine`` on ``feeds`` and compare every reference output.

    Args:
        reference: an engine, an ONNX model (file, proto or :class:`OnnxModel`, run with ONNX
            Runtime fp32 on the CPU) or a callable ``feeds -> outputs``.
        engine: the engine (or ONNX model, or callable) under test.
        feeds: one feed ``{input: array}`` or a sequence of them (host arrays); float arrays are
            cast to each side's input dtypes, so an fp16-IO engine and an fp32 reference share feeds.
        inputs: where the feeds came from, for the report.

    Example:
        >>> with streamrt.load("model.fp16.plan") as engine:                         # doctest: +SKIP
        ...     report = measure_accuracy("model.onnx", engine, feeds)
        >>> report.output("logits").cosine, report.lines()                           # doctest: +SKIP
    """
    run_ref, run_test = _runner(reference), _runner(engine)
    batches = [feeds] if isinstance(feeds, Mapping) else list(feeds)
    if isinstance(reference, Engine):
        label = f"{reference.manifest.backend} {reference.manifest.precision}"
    else:
        label = "reference" if callable(reference) else "onnxruntime fp32"
    return accuracy_of(((run_ref(f), run_test(f)) for f in batches), inputs=inputs, reference=label)


def _runner(target: Any) -> Runner:
    if isinstance(target, Engine):
        return lambda feeds: _run_engine(target, feeds)
    if callable(target):
        return target
    from streamrt.onnx.runner import onnx_runner

    return onnx_runner(target)


def _run_engine(engine: Engine, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from streamrt.running.inputs import cast_inputs, to_device, to_numpy

    values = to_device(cast_inputs(dict(feeds), engine.inputs), engine.device_kind)
    with engine.create_context() as ctx:
        outputs = ctx.infer(values)
        if engine.device_kind == "cuda":
            _synchronize()  # the outputs are valid once the engine's stream gets there
        return {name: to_numpy(value) for name, value in outputs.items()}


def sample_feeds(model: OnnxModel, config: BuildConfig, profiles: tuple[ShapeProfile, ...]) -> tuple[Feeds, str, bool]:
    """Feeds the build measures on: ``(feeds, where they came from, whether they are real data)``.

    ``--sample-inputs FILE.npz`` first, then the first calibration samples, else fresh random
    inputs at the first profile's opt shapes (not real data: the fp16 activation-range rule
    ignores them).
    """
    from streamrt.running.inputs import default_shapes, load_inputs, random_inputs

    if config.sample_inputs is not None:
        return [load_inputs(config.sample_inputs, model.inputs)], f"sample inputs {config.sample_inputs.name}", True
    if config.calibration is not None and Path(config.calibration.data).exists():
        from streamrt.onnx.calibration import CalibrationDataset

        data = CalibrationDataset.from_config(config.calibration, model.inputs)
        count = min(len(data), _MAX_SAMPLES)
        return [data.load(i) for i in range(count)], f"calibration data ({count} samples)", True
    rng = np.random.default_rng()
    shapes = default_shapes(model.inputs, profiles)
    return [random_inputs(model.inputs, shapes, rng) for _ in range(_RANDOM_FEEDS)], "random inputs", False


class PrecisionStep:
    """One build's precision transform and accuracy gate (see the module docs).

    Example:
        >>> step = PrecisionStep(source, config, profiles, backend, cache_dir, report)   # doctest: +SKIP
        >>> transformed = step.transform()          # before backend.build               # doctest: +SKIP
        >>> manifest = step.check(manifest, payload)  # before write_plan                # doctest: +SKIP
    """

    def __init__(
        self,
        source: OnnxModel,
        config: BuildConfig,
        profiles: tuple[ShapeProfile, ...],
        backend: Backend,
        cache_dir: Path,
        progress: Progress,
    ) -> None:
        self.source = source
        self.config = config
        self.profiles = profiles
        self.backend = backend
        self.cache_dir = cache_dir
        self.progress = progress
        self.record: dict[str, Any] = {}
        self._feeds: tuple[Feeds, str, bool] | None = None
        self._random_why = "no calibration data and no --sample-inputs"

    def feeds(self) -> tuple[Feeds, str, bool]:
        if self._feeds is None:
            self._feeds = sample_feeds(self.source, self.config, self.profiles)
        return self._feeds

    def transform(self) -> OnnxModel:
        """The precision-lowered model; prints what stayed in fp32."""
        from streamrt.onnx.model import model_from_proto
        from streamrt.onnx.precision import lower_precision

        feeds, _, real = self.feeds()
        self.progress(f"applying precision {self.config.precision.value} to the ONNX graph")
        result = lower_precision(
            self.source.proto,
            self.config,
            cache_dir=self.cache_dir,
            progress=self.progress,
            int8_style=self.backend.int8_style,
            feeds=feeds if real else (),
        )
        if result.summary:
            self.progress(result.summary)
        for line in result.details:
            log.debug("%s", line)
        self.record.update(result.record)
        return model_from_proto(result.model, self.source.path)

    def check(self, manifest: PlanManifest, payload: bytes) -> PlanManifest:
        """Measure the built payload against fp32; raise AccuracyError on a threshold miss."""
        engine = self.backend.load(Plan(manifest, payload))
        try:
            report = self._measure(engine)
            for line in report.lines():
                self.progress(line)
            self.record["accuracy"] = report.to_dict()
            self._say_where_the_feeds_came_from(report)
            misses = self._judge(report)  # raises on a --accuracy-threshold miss; fills passed/threshold
            if self.config.precision is Precision.INT8 and self.config.speed_check:
                from streamrt.building.speed_check import speed_against_fp32

                self.record["speed"] = speed_against_fp32(
                    engine,
                    manifest,
                    source=self.source,
                    config=self.config,
                    profiles=self.profiles,
                    backend=self.backend,
                    cache_dir=self.cache_dir,
                    feeds=self.feeds()[0][0],
                    misses=misses + self._target_misses(report),
                    progress=self.progress,
                )
        finally:
            engine.close()
        return dataclasses.replace(manifest, precision_report=dict(self.record))

    def _measure(self, engine: Engine) -> AccuracyReport:
        feeds, label, _ = self.feeds()
        try:
            return measure_accuracy(self.source.proto, engine, feeds, inputs=label)
        except ShapeError as exc:  # sample shapes outside the plan's profiles: measure at opt shapes
            log.warning("accuracy gate: %s; measuring on random inputs at the opt shapes instead", exc)
            self._random_why = f"the sample data does not fit the plan's profiles: {exc}"
            self._feeds = sample_feeds(
                self.source, dataclasses.replace(self.config, sample_inputs=None, calibration=None), self.profiles
            )
            feeds, label, _ = self._feeds
            return measure_accuracy(self.source.proto, engine, feeds, inputs=label)

    def _say_where_the_feeds_came_from(self, report: AccuracyReport) -> None:
        """Random feeds: a warning now and in the record (inspect shows it); real ones: recorded as such."""
        real = self.feeds()[2]
        self.record["accuracy"]["real_data"] = real
        if not real:
            warning = random_inputs_warning(report.samples, self._random_why)
            self.record["accuracy"]["warning"] = warning
            log.warning("%s", warning)

    def _target_misses(self, report: AccuracyReport) -> list[str]:
        """How the gate's feeds miss ``--int8-target`` (or the sensitivity pass missed it)."""
        misses = report.violations(AccuracyThreshold.parse(self.config.int8_target)) if self.config.int8_target else []
        sensitivity = self.record.get("sensitivity") or {}
        if sensitivity and not sensitivity.get("met", True):
            misses.append(f"--int8-target {sensitivity.get('target')} not met by the sensitivity pass")
        return misses

    def _judge(self, report: AccuracyReport) -> list[str]:
        """The misses of the gate's bounds (the threshold's, else :data:`WARN_BELOW`); raises on a threshold."""
        precision = self.config.numeric_precision
        threshold_text = self.config.accuracy_threshold or (str(TF32_BOUNDS) if self.config.tf32 else None)
        if threshold_text is not None:
            threshold = AccuracyThreshold.parse(threshold_text)
            misses = report.violations(threshold)
            self.record["accuracy"].update(threshold=str(threshold), passed=not misses, violations=misses)
            if misses:
                which = "--accuracy-threshold" if self.config.accuracy_threshold else "the TF32 bounds"
                raise AccuracyError(
                    f"the {precision} plan misses {which} {threshold} against onnxruntime fp32: "
                    f"{'; '.join(misses[:3])}{' ...' if len(misses) > 3 else ''}; no plan was written",
                    hint=_hint(self.config),
                )
            return misses
        misses = report.violations(WARN_BELOW)
        self.record["accuracy"].update(threshold=f"{WARN_BELOW} (warning)", passed=not misses, violations=misses)
        if misses:
            log.warning("the %s plan is far from fp32: %s; %s", precision, "; ".join(misses[:3]), _hint(self.config))
        return misses


def _hint(config: BuildConfig) -> str:
    if config.tf32:
        return "build without --tf32 (IEEE fp32), or accept more error with --accuracy-threshold rel_l2=..."
    if config.precision is Precision.INT8:
        return "try --int8-target top1=0.99 (or cosine=0.99) to keep sensitive layers in fp32, or build fp16"
    return "keep sensitive op types in fp32 with --fp32-ops, give real data with --sample-inputs, or build fp32"


def _synchronize() -> None:
    import torch

    torch.cuda.synchronize()
