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

from streamrt.backends import get_backend
from streamrt.backends.base import Engine
from streamrt.errors import PlanMismatchError
from streamrt.plan import read_plan, rebuild_command

__all__ = ["load"]

log = logging.getLogger(__name__)


def load(path: str | Path) -> Engine:
    """Load a plan: verify checksum and format, check the backend version and device, build the engine.

    Raises:
        PlanFormatError: truncated, tampered, foreign or unknown-format file.
        PlanMismatchError: built for another library version or device; the message holds
            the field, both values and the command that rebuilds the plan here.
        MissingDependencyError: the plan's backend library is not installed.
    """
    started = time.perf_counter()
    plan = read_plan(path)
    backend = get_backend(plan.manifest.backend)
    try:
        backend.check_compatible(plan.manifest)
    except PlanMismatchError as exc:
        # The manifest's command writes where the plan was first built; say how to rebuild *this* file.
        command = rebuild_command(exc.rebuild_command, path)
        raise PlanMismatchError(exc.field, exc.plan_value, exc.local_value, command) from None
    engine = backend.load(plan)
    log.debug("loaded %s (%s) in %.1f ms", path, plan.manifest.backend, (time.perf_counter() - started) * 1e3)
    return engine
