"""``streamrt.load``: plan file -> Engine, after every compatibility check.

This module imports no ONNX transforms and no compilers: a deployment that only runs plans
pays for the plan container, the registry and the one backend the plan names.

Example:
    >>> engine = load("model.plan")                    # doctest: +SKIP
    >>> ctx = engine.create_context()                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from streamrt._features import cuda_available
from streamrt._oom import LOAD_HINT, out_of_memory_guard
from streamrt.backends import available_backends, get_backend
from streamrt.backends.base import Engine
from streamrt.errors import MissingDependencyError, PlanMismatchError, PlanRequirementsError
from streamrt.plan import PlanManifest, read_plan, rebuild_command

__all__ = ["load"]

log = logging.getLogger(__name__)


def load(path: str | Path) -> Engine:
    """Load a plan: verify checksum and format, check the backend version and device, build the engine.

    Raises:
        PlanFormatError: truncated, tampered, foreign or unknown-format file.
        PlanMismatchError: built for another library version or device; the message holds
            the field, both values and the command that rebuilds the plan here.
        PlanRequirementsError: the plan's backend library (or the GPU it needs) is missing here;
            a :class:`MissingDependencyError` too.
        OutOfMemoryError: host or device memory ran out while reading or loading the plan.
    """
    started = time.perf_counter()
    size = Path(path).stat().st_size if Path(path).is_file() else 0
    with out_of_memory_guard(f"loading plan {path} ({size / 2**20:.1f} MiB)", LOAD_HINT):
        return _load(path, started)


def _load(path: str | Path, started: float) -> Engine:
    plan = read_plan(path)
    try:
        backend = get_backend(plan.manifest.backend)
    except MissingDependencyError as exc:
        raise requirements_error(plan.manifest, path, exc) from exc
    try:
        backend.check_compatible(plan.manifest)
    except PlanMismatchError as exc:
        # The manifest's command writes where the plan was first built; say how to rebuild *this* file.
        command = rebuild_command(exc.rebuild_command, path)
        raise PlanMismatchError(exc.field, exc.plan_value, exc.local_value, command) from None
    engine = backend.load(plan)
    log.debug("loaded %s (%s) in %.1f ms", path, plan.manifest.backend, (time.perf_counter() - started) * 1e3)
    return engine


def plan_needs(manifest: PlanManifest) -> str:
    """What a plan needs to run, in words: backend and versions, and its device."""
    others = [f"{k} {v}" for k, v in manifest.runtime_versions.items() if k != manifest.backend]
    versions = ", ".join([f"{manifest.backend} {manifest.backend_version}", *others])
    device = dict(manifest.device)
    if device.get("kind") == "cuda":
        where = (f"an NVIDIA GPU like the {device.get('name', '?')} it was built on (compute capability "
                 f"{device.get('compute_capability', '?')}, CUDA {device.get('cuda', '?')})")
    else:
        where = f"a {device.get('arch', 'CPU')} CPU" + (f" with {device['isa']}" if device.get("isa") else "")
    return f"the {manifest.backend} backend ({versions}) and {where}"


def requirements_error(
    manifest: PlanManifest, path: str | Path, missing: MissingDependencyError
) -> PlanRequirementsError:
    """The error for a plan whose backend library is not installed: what is missing, what the plan needs."""
    lacks = [f"the '{missing.package}' Python package"]
    if manifest.device.get("kind") == "cuda" and not cuda_available():
        lacks.append("a CUDA device")
    here = [name for name in available_backends() if name != manifest.backend]
    rebuild = rebuild_command(manifest.build_command, path)
    if here and f"--backend {manifest.backend}" in rebuild:
        rebuild = rebuild.replace(f"--backend {manifest.backend}", f"--backend {here[0]}", 1)
    return PlanRequirementsError(
        f"{path} needs {plan_needs(manifest)}; this machine lacks {' and '.join(lacks)}",
        package=missing.package,
        extra=missing.extra,
        hint=f"run it where those are (pip install 'streamrt[{missing.extra}]' there), or rebuild for this "
        f"machine: {rebuild}",
    )
