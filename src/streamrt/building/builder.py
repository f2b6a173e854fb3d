"""``streamrt.build``: model + BuildConfig -> plan file, with a content-keyed build cache.

Steps: load and check the model; validate the shape profiles against it; apply the precision
transform (fp16/bf16 casts, int8 Q/DQ from calibration data) to the ONNX graph; let the backend
build its payload; freeze everything into a plan written atomically.

The cache key is the SHA-256 of: the source model bytes, the build config (without paths that
do not change the result), the calibration data content, the backend and its version, the
target device, what the backend resolved the optimization level to on this machine
(:meth:`Backend.build_recipe`) and the plan format version. Building the same thing twice reuses the plan.

Example:
    >>> result = build("model.onnx", BuildConfig(precision="fp16"), "model.plan")   # doctest: +SKIP
    >>> result.cached, result.path                                                    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import shlex
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrt._oom import BUILD_HINT, out_of_memory_guard
from streamrt._version import __version__
from streamrt.backends import available_backends, get_backend
from streamrt.backends.base import BuildJob, BuildOutput, Progress
from streamrt.building.flags import build_flags
from streamrt.building.verify import verify_build
from streamrt.config import BuildConfig, default_cache_dir
from streamrt.errors import ConfigError, PlanError, StreamRTError, UnsupportedOperatorError
from streamrt.onnx.model import OnnxModel, load_model
from streamrt.onnx.profiles import resolve_profiles
from streamrt.plan import FORMAT_VERSION, PlanManifest, atomic_write, read_manifest, read_plan, write_plan
from streamrt.types import ShapeProfile, TensorSpec

__all__ = ["BuildResult", "build", "build_command", "cache_key", "make_manifest"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """Where the plan is, what it says, and whether the cache supplied it."""

    path: Path
    manifest: PlanManifest
    cached: bool
    seconds: float


def _log_progress(line: str) -> None:
    log.info("%s", line)


def _hash_folder(folder: Path) -> str:
    digest = hashlib.sha256()
    if folder.is_dir():
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(f.relative_to(folder)).encode())
            digest.update(hashlib.sha256(f.read_bytes()).digest())
    return digest.hexdigest()


#: Bumped whenever a StreamRT change alters what a build writes or accepts, so the build cache
#: never hands back a plan made by older rules. 2: output specs from the exported program
#: (dynamic outputs were recorded static), shape verification relative to the output's scale.
BUILD_RULES = 2


def cache_key(
    model: OnnxModel,
    config: BuildConfig,
    target: dict[str, Any],
    backend_version: str,
    recipe: Mapping[str, Any] | None = None,
) -> str:
    """The content hash that identifies a build (see module docs); ``recipe``: the backend's resolved level."""
    parts = {
        "recipe": dict(recipe or {}),
        "format": FORMAT_VERSION,
        "rules": BUILD_RULES,
        "model": model.sha256,
        "config": config.cache_key_dict(),
        "calibration": _hash_folder(config.calibration.data) if config.calibration else None,
        "backend_version": backend_version,
        "target": target,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def build_command(source: str, output: str | Path, config: BuildConfig) -> str:
    """The ``streamrt build`` command line that reproduces ``config`` for ``source``.

    The flags come from the CLI's option table (:func:`streamrt.building.flags.build_flags`), so
    every flag the CLI reads is written back.
    """
    return shlex.join(["streamrt", "build", source, "-o", str(output), *build_flags(config)])


def backends_running(op_type: str, domain: str, *, exclude: str = "") -> tuple[str, ...]:
    """The installed backends (other than ``exclude``) that say they can run ``op_type`` of ``domain``."""
    names = []
    for name in available_backends():
        if name == exclude:
            continue
        try:
            if get_backend(name).runs_operator(op_type, domain):
                names.append(name)
        except StreamRTError:
            continue
    return tuple(names)


def make_manifest(
    backend_name: str,
    target: dict[str, Any],
    config: BuildConfig,
    built: BuildOutput,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    profiles: tuple[ShapeProfile, ...],
    *,
    source_sha256: str,
    source_name: str,
    build_command: str,
    source_metadata: Mapping[str, str] | None = None,
) -> PlanManifest:
    """The manifest of a fresh build (shared by ONNX builds and module builds)."""
    backend = get_backend(backend_name)
    return PlanManifest(
        backend=backend.name,
        backend_version=backend.version(),
        runtime_versions=backend.runtime_versions(),
        device=target,
        precision=config.numeric_precision,
        inputs=inputs,
        outputs=outputs,
        profiles=profiles,
        source_sha256=source_sha256,
        source_name=source_name,
        build_settings={"config": config.to_dict(), "backend": dict(built.settings)},
        build_command=build_command,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        streamrt_version=__version__,
        extra=dict(built.manifest_facts),
        source_metadata=dict(source_metadata or {}),
    )


def build(
    model: str | Path | OnnxModel,
    config: BuildConfig | None = None,
    output: str | Path | None = None,
    *,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> BuildResult:
    """Build (or reuse) a plan for ``model``.

    Args:
        model: an ONNX file or an already loaded :class:`OnnxModel`.
        config: what to build; defaults to ONNX Runtime fp32 with profiles from the model.
        output: where to write the plan; defaults to the cache entry itself.
        cache: reuse an identical earlier build and store this one.
        cache_dir: defaults to ``$STREAMRT_CACHE`` or ``~/.cache/streamrt``.
        progress: receives one line per long step (default: logged at INFO).

    Raises:
        OutOfMemoryError: host or device memory ran out; no plan is written.
    """
    config = config or BuildConfig()
    name = model.name if isinstance(model, OnnxModel) else Path(model).name
    with out_of_memory_guard(f"building {name} with {config.backend}", BUILD_HINT):
        return _build(model, config, output, cache=cache, cache_dir=cache_dir, progress=progress)


def _reuse_cached(cached_plan: Path, out_path: Path, command: str) -> PlanManifest | None:
    """The cache entry, written to ``out_path``; None when the entry is unreadable (then rebuild).

    The entry records the command of the build that made it (maybe another ONNX path, another
    ``-o``); the copy records ``command``, so a later rebuild hint names this source and output.
    """
    try:
        manifest = read_manifest(cached_plan)
        if out_path.resolve() == cached_plan.resolve():
            return manifest
        if command == manifest.build_command:
            with atomic_write(out_path) as dst, open(cached_plan, "rb") as src:
                shutil.copyfileobj(src, dst)
            return manifest
        plan = read_plan(cached_plan)
    except PlanError:
        log.warning("ignoring unreadable cache entry %s", cached_plan)
        return None
    manifest = dataclasses.replace(plan.manifest, build_command=command)
    write_plan(out_path, manifest, plan.payload)
    return manifest


def _build(
    model: str | Path | OnnxModel,
    config: BuildConfig,
    output: str | Path | None,
    *,
    cache: bool,
    cache_dir: str | Path | None,
    progress: Progress | None,
) -> BuildResult:
    started = time.perf_counter()
    began = time.monotonic()  # the build budget's clock
    report = progress or _log_progress
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    source = model if isinstance(model, OnnxModel) else load_model(model)
    backend = get_backend(config.backend)
    if config.numeric_precision not in backend.precisions:
        raise ConfigError(
            f"backend '{backend.name}' cannot build precision {config.numeric_precision}; "
            f"it supports {', '.join(sorted(backend.precisions))}",
        )
    profiles = resolve_profiles(source.inputs, config.profiles)
    target = backend.target_device(config)
    key = cache_key(source, config, target, backend.version(), backend.build_recipe(config))
    cached_plan = cache_root / "plans" / f"{key}.plan"
    out_path = Path(output) if output is not None else cached_plan

    if cache and cached_plan.is_file():
        command = build_command(str(source.path) if source.path else source.name, out_path, config)
        reused = _reuse_cached(cached_plan, out_path, command)
        if reused is not None:
            report(f"reused cached plan {cached_plan.name[:16]}… (same model, settings and target)")
            return BuildResult(out_path, reused, True, time.perf_counter() - started)

    transformed, precision = source, None
    if config.precision.value != "fp32" or config.tf32:  # lower the graph, then gate the plan's accuracy
        from streamrt.building.accuracy_gate import PrecisionStep

        precision = PrecisionStep(source, config, profiles, backend, cache_root, report)
        transformed = precision.transform() if not config.tf32 else source
    report(f"building with {backend.name} {backend.version()}")
    try:
        built = backend.build(BuildJob(transformed, config, profiles, report, cache_root, began))
    except UnsupportedOperatorError as exc:
        if exc.alternatives is not None:
            raise
        raise exc.with_alternatives(backends_running(exc.op_type, exc.domain, exclude=backend.name)) from exc
    manifest = make_manifest(
        backend.name,
        target,
        config,
        built,
        transformed.inputs,
        built.outputs or transformed.outputs,  # what the payload returns, where the backend knows it
        profiles,
        source_sha256=source.sha256,
        source_name=source.name,
        source_metadata=source.metadata(),
        build_command=build_command(str(source.path) if source.path else source.name, out_path, config),
    )
    if precision is not None:
        manifest = precision.check(manifest, built.payload)  # AccuracyError: nothing is written
    manifest = verify_build(source, manifest, built.payload, config, report)
    write_plan(out_path, manifest, built.payload)
    # A plan whose build ran out of its budget is not what its settings ask for: a rebuild (with a
    # warmer timing cache) may finish, so it does not go into the plan cache.
    complete = not built.settings.get("build_budget", {}).get("fell_back")
    if cache and complete and out_path.resolve() != cached_plan.resolve():
        with atomic_write(cached_plan) as dst, open(out_path, "rb") as src:
            shutil.copyfileobj(src, dst)
    seconds = time.perf_counter() - started
    report(f"wrote {out_path} ({out_path.stat().st_size / 2**20:.2f} MiB) in {seconds:.1f} s")
    return BuildResult(out_path, manifest, False, seconds)
