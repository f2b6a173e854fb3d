"""``streamrt.open``: the one way to get an engine from a plan or from a model.

A plan file is loaded as it is (:func:`streamrt.load`: checksum, version and device checks). An
ONNX model is built through the content-keyed build cache (:func:`streamrt.build`), then its plan
is loaded; when the build config gives no shape profiles and ``max_batch`` is set, the profile is
a batch range 1..``max_batch`` over every input whose only dynamic dimension is the leading one
(:func:`with_batch_profile`). The model is read once, whatever is derived from it.

The CLI (``bench``, ``profile``, ``compare``), the model server (``model.onnx`` in a repository)
and the video detector all open their engines here.

Example:
    >>> engine = streamrt.open("model.onnx", BuildConfig(precision="fp16"), max_batch=32)   # doctest: +SKIP
    >>> engine = streamrt.open("model.plan")                                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.types import ShapeProfile, ShapeRange, TensorSpec

if TYPE_CHECKING:
    from streamrt.backends.base import Engine, Progress
    from streamrt.onnx.model import OnnxModel

__all__ = ["batch_profile", "open", "with_batch_profile"]

log = logging.getLogger(__name__)


def batch_profile(inputs: Sequence[TensorSpec], max_batch: int, opt_batch: int | None = None) -> ShapeProfile | None:
    """A profile with batch 1..``max_batch`` (opt ``opt_batch``, default ``max_batch``) for each input
    whose leading dimension is its only dynamic one; ``None`` when no input is like that.

    Inputs with other dynamic dimensions are left out: the build then asks for their ranges.

    Raises:
        ConfigError: ``max_batch`` < 1.
    """
    if max_batch < 1:
        raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch}")
    opt = max_batch if opt_batch is None else min(max(1, opt_batch), max_batch)
    ranges = {}
    for spec in inputs:
        rest = tuple(spec.shape[1:])
        if spec.shape and spec.shape[0] < 0 and all(d > 0 for d in rest):
            ranges[spec.name] = ShapeRange((1, *rest), (opt, *rest), (max_batch, *rest))
    return ShapeProfile(ranges) if ranges else None


def with_batch_profile(
    config: BuildConfig, inputs: Sequence[TensorSpec], max_batch: int | None, opt_batch: int | None = None
) -> BuildConfig:
    """``config`` with :func:`batch_profile` as its profile, unless it has profiles or ``max_batch`` is unset."""
    if config.profiles or not max_batch:
        return config
    profile = batch_profile(inputs, max_batch, opt_batch)
    return config.replace(profiles=(profile,)) if profile is not None else config


def open(
    model: str | Path | OnnxModel,
    config: BuildConfig | None = None,
    *,
    max_batch: int | None = None,
    opt_batch: int | None = None,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> Engine:
    """Load a plan, or build an ONNX model (through the cache) and load its plan.

    Args:
        model: a plan file, an ONNX file, or an already loaded :class:`~streamrt.onnx.model.OnnxModel`.
        config: what to build (ONNX only; a plan is loaded as it is). Defaults to ``BuildConfig()``.
        max_batch, opt_batch: the default batch profile when ``config`` has no profiles (ONNX only).
        cache, cache_dir, progress: passed to :func:`streamrt.build`.

    Raises:
        ModelNotFoundError: no such file (:func:`~streamrt.onnx.model.load_model`'s error).
        PlanFormatError / PlanMismatchError: a plan that is damaged or built for another machine.
        ConfigError / ProfileError / BuildError: the model cannot be built with these settings.
    """
    from streamrt.running.runtime import load

    if not isinstance(model, (str, Path)):
        return _build_and_load(model, config, max_batch, opt_batch, cache, cache_dir, progress)
    from streamrt.plan import is_plan_file

    path = Path(model)
    if is_plan_file(path):
        return load(path)
    from streamrt.onnx.model import load_model

    return _build_and_load(load_model(path), config, max_batch, opt_batch, cache, cache_dir, progress)


def _build_and_load(
    model: OnnxModel,
    config: BuildConfig | None,
    max_batch: int | None,
    opt_batch: int | None,
    cache: bool,
    cache_dir: str | Path | None,
    progress: Progress | None,
) -> Engine:
    from streamrt.building.builder import build
    from streamrt.running.runtime import load

    config = with_batch_profile(config or BuildConfig(), model.inputs, max_batch, opt_batch)
    result = build(model, config, cache=cache, cache_dir=cache_dir, progress=progress)
    log.info("%s: %s %s in %.1f s", model.name, "reused cached plan" if result.cached else "built plan",
             result.path.name, result.seconds)
    return load(result.path)
