"""Where an engine model's engine comes from: the version's file, opened or built, and what it needs.

:func:`load_engine` opens ``<model_dir>/<version>/<file>`` with :func:`streamrt.building.opening.open`
(a plan, or an ONNX model built through the build cache, with a batch profile derived from the
config when it gives none); :func:`load_estimate` says, before loading, how many bytes a load needs
at least and on which kind of device, so the memory budget can refuse a model before it is read.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from streamrt._features import cuda_available
from streamrt.backends.base import Engine
from streamrt.errors import ModelNotFoundError
from streamrt.serve.configs.config import ModelConfig

__all__ = ["load_engine", "load_estimate", "model_file"]

log = logging.getLogger(__name__)


def model_file(model_dir: Path, version: int, config: ModelConfig) -> Path | None:
    """The version's model file (``default_model_filename``, else ``model.plan`` or ``model.onnx``); None: none."""
    folder = model_dir / str(version)
    names = [config.default_model_filename] if config.default_model_filename else ["model.plan", "model.onnx"]
    return next((folder / n for n in names if (folder / n).is_file()), None)


def load_engine(model_dir: Path, version: int, config: ModelConfig) -> Engine:
    """Open ``<model_dir>/<version>/<file>`` with :func:`streamrt.open`: a plan, or an ONNX model built
    through the cache with a batch profile of 1..``max_batch_size`` when the config gives no profiles.

    Raises:
        ModelNotFoundError: the version directory holds no model file.
    """
    from streamrt.building.opening import open as open_engine

    path = model_file(model_dir, version, config)
    if path is None:
        names = [config.default_model_filename] if config.default_model_filename else ["model.plan", "model.onnx"]
        raise ModelNotFoundError(
            f"model '{config.name}' version {version}: no {' or '.join(names)} in {model_dir / str(version)}",
            hint="put a plan (streamrt build) or an ONNX model there, or set default_model_filename",
        )
    started = time.perf_counter()
    build = config.build
    source: Any = path
    if path.suffix == ".onnx" and not build.profiles:
        from streamrt.onnx.model import load_model
        from streamrt.serve.configs.derived_profiles import derive_profile

        source = load_model(path)  # read once: its inputs decide the profile, then it is built
        profile = derive_profile(config, source.inputs)
        build = build.replace(profiles=(profile,)) if profile is not None else build
    engine = open_engine(source, build, max_batch=config.max_batch_size or None, cache=True)
    log.info("model '%s' version %d: opened %s in %.1f s", config.name, version, path.name,
             time.perf_counter() - started)
    return engine


def load_estimate(model_dir: Path, version: int, config: ModelConfig) -> tuple[int, str]:
    """``(bytes, device kind)`` a load needs at least, before loading: the model file's size and the
    device its plan (or the build settings of an ONNX model) targets."""
    path = model_file(model_dir, version, config)
    if path is None:
        return 0, "cpu"  # nothing to estimate (an injected loader, or the load will say what is missing)
    device = "cuda" if cuda_available() else "cpu"  # when the file does not say: measure if there is a GPU
    try:
        if path.suffix == ".onnx":
            from streamrt.backends import get_backend

            device = str(get_backend(config.build.backend).target_device(config.build).get("kind", "cpu"))
        else:
            from streamrt.plan import read_manifest

            device = str(read_manifest(path).device.get("kind", "cpu"))
    except Exception:  # the load itself reports an unusable file; the measurement after it still applies
        log.debug("model '%s': no device known before loading %s", config.name, path, exc_info=True)
    return path.stat().st_size, device


