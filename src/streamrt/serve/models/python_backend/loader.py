"""Finding and importing a Python model's ``model.py``, and the ``args`` its ``initialize`` receives.

Each instance imports ``model.py`` as a module of its own (``streamrt_python_models.<model>_v<version>_
<instance>_<n>``), so module-level state is per instance, as it is in Triton, where every instance is a
process. ``triton_python_backend_utils`` is registered in ``sys.modules`` (as
:mod:`.pb_utils`) before the import, and the version directory is put on ``sys.path`` so that
helper modules next to ``model.py`` import as they do in Triton.

Example:
    >>> find_model_file(Path("repo/add_sub"), 1, "")              # doctest: +SKIP
    PosixPath('repo/add_sub/1/model.py')
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import re
import sys
import threading
from pathlib import Path
from typing import Any

from streamrt.errors import ModelError, ModelNotFoundError
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.models.python_backend import pb_utils

__all__ = [
    "MODULE_PREFIX", "UTILS_MODULE", "auto_complete", "find_model_file", "forget_module", "import_model_class",
    "initialize_args",
]

UTILS_MODULE = "triton_python_backend_utils"
"""The name user code imports the utilities by."""
MODULE_PREFIX = "streamrt_python_models"
"""Package-like prefix of the imported ``model.py`` modules (they are not importable by it)."""

log = logging.getLogger(__name__)

_import_lock = threading.Lock()  # sys.path and sys.modules changes of concurrent loads
_imports = itertools.count()  # a reload imports beside the version still serving: names never repeat


def find_model_file(model_dir: Path, version: int, default_model_filename: str) -> Path:
    """``<model_dir>/<version>/model.py`` (or ``default_model_filename``).

    Raises:
        ModelNotFoundError: the file is not there.
    """
    path = model_dir / str(version) / (default_model_filename or "model.py")
    if not path.is_file():
        raise ModelNotFoundError(f"Python model '{model_dir.name}' version {version}: no {path.name} in {path.parent}",
                                 hint="a Python model is <repo>/<name>/<version>/model.py defining "
                                      "class TritonPythonModel")
    return path


def import_model_class(path: Path, model: str, version: int, instance: str) -> type:
    """Import ``path`` as a fresh module and return its ``TritonPythonModel`` class (the module's
    name is the class's ``__module__``: :func:`forget_module` takes it).

    Raises:
        ModelError: the import raised, or the module defines no ``TritonPythonModel`` with ``execute``.
    """
    safe = re.sub(r"\W", "_", f"{model}_v{version}_{instance}")
    with _import_lock:
        name = f"{MODULE_PREFIX}.{safe}_{next(_imports)}"
        sys.modules.setdefault(UTILS_MODULE, pb_utils)
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.append(folder)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ModelError(f"Python model '{model}': cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(name, None)
            log.error("Python model '%s': importing %s raised", model, path, exc_info=True)
            raise ModelError(f"Python model '{model}' version {version}: importing {path.name} raised "
                             f"{type(exc).__name__}: {exc}") from exc
    cls = getattr(module, "TritonPythonModel", None)
    if not isinstance(cls, type) or not callable(getattr(cls, "execute", None)):
        sys.modules.pop(name, None)
        raise ModelError(f"Python model '{model}' version {version}: {path.name} defines no class "
                         "TritonPythonModel with an execute(self, requests) method",
                         hint="see Triton's python_backend README for the class to write")
    return cls


def forget_module(name: str) -> None:
    """Drop an instance's ``model.py`` module from ``sys.modules`` (after its ``finalize``)."""
    if name.startswith(MODULE_PREFIX + "."):
        sys.modules.pop(name, None)


def auto_complete(path: Path, config: ModelConfig) -> ModelConfig:
    """``config`` as the model's ``auto_complete_config`` completes it (unchanged without one).

    The module imported to call it is dropped afterwards: as in Triton, nothing created there is
    seen by ``initialize`` or ``execute``.

    Raises:
        ModelError: ``auto_complete_config`` raised or returned no ``pb_utils.ModelConfig``.
        ConfigError: the completed config is not one StreamRT can serve.
    """
    from streamrt.serve.configs.config_message import from_mapping, to_message
    from streamrt.serve.configs.triton_config import message_json

    cls = import_model_class(path, config.name, 0, "auto_complete")
    try:
        complete = getattr(cls, "auto_complete_config", None)
        if not callable(complete):
            return config
        given = pb_utils.ModelConfig(json.dumps(message_json(to_message(config, ""))))
        try:
            result = complete(given)
        except Exception as exc:
            log.error("Python model '%s': auto_complete_config raised", config.name, exc_info=True)
            raise ModelError(f"Python model '{config.name}': auto_complete_config raised {type(exc).__name__}: "
                             f"{exc}") from exc
        if not isinstance(result, pb_utils.ModelConfig):
            raise ModelError(f"Python model '{config.name}': auto_complete_config returned "
                             f"{type(result).__name__}, not the pb_utils.ModelConfig it was given")
        data = {k: v for k, v in result.as_dict().items() if v not in ({}, [], "", None) or k == "dynamic_batching"}
        completed = from_mapping(data, config.name)
        return completed.replace(build=config.build)
    finally:
        forget_module(cls.__module__)


def initialize_args(model_config: dict[str, Any], *, model_dir: Path, version: int, instance: str, kind: str,
                    device_id: int) -> dict[str, str]:
    """The ``args`` dict of ``initialize``: every key and value a string, as Triton gives them."""
    return {
        "model_config": json.dumps(model_config),
        "model_instance_kind": kind,
        "model_instance_name": instance,
        "model_instance_device_id": str(device_id),
        "model_repository": str(model_dir),
        "model_version": str(version),
        "model_name": str(model_config.get("name", model_dir.name)),
    }
