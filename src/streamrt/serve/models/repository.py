"""The model repository: a directory of models, their lifecycle and their states.

Layout (Triton's)::

    <repo>/<model>/config.yaml        (or config.yml / config.json / Triton's config.pbtxt; optional)
    <repo>/<model>/<version>/model.plan   (or model.onnx, built on load through the build cache)

States, as the repository index reports them: ``LOADING`` (readiness false, warm-up included),
``READY``, ``UNLOADING``, ``UNAVAILABLE`` (with the reason: the load error, or "unloaded").
Loads run in worker threads so the server keeps answering; a model that fails to load is
UNAVAILABLE with its error and the others are unaffected. Reloading a READY model loads the new
versions beside the old ones and swaps them in only once they are warm; if the reload fails the
old versions keep serving.

Example:
    >>> repo = ModelRepository(Path("models"))            # doctest: +SKIP
    >>> await repo.load("cnn"); repo.get("cnn", "")       # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt.errors import ConfigError, ModelNotReadyError, RequestError, StreamRTError, UnknownModelError
from streamrt.serve.configs.config import CONFIG_FILES, ModelConfig
from streamrt.serve.configs.config_message import from_mapping, read_config_file
from streamrt.serve.configs.model_files import remove_model_files, write_model_files
from streamrt.serve.execution.memory_budget import MemoryBudget
from streamrt.serve.execution.rate_limiter import RateLimiter
from streamrt.serve.models.model import EngineLoader
from streamrt.serve.models.servable import LoadContext, Servable, load_servable
from streamrt.serve.process import settle_heap

__all__ = ["ModelEntry", "ModelRepository", "ModelState"]

log = logging.getLogger(__name__)


class ModelState(enum.Enum):
    """Lifecycle states, named as Triton's repository index names them."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ModelEntry:
    """What the repository knows about one model directory."""

    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = "unloaded"
    versions: dict[int, Servable] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    files: Path | None = None  # the directory of a load request's files, while it is loaded from them


def _versions(folder: Path) -> list[int]:
    # Triton ignores non-numeric directories and those with a leading zero.
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit() and p.name[0] != "0")


class ModelRepository:
    """Loads, serves and unloads the models of one repository directory (use on the event loop).

    Args:
        root: the repository directory.
        load_threads: models that may load at the same time.
        drain_timeout_s: how long an unload waits for the model's in-flight requests.
        engine_loader: replaces :func:`streamrt.serve.models.model.load_engine`.
        rate_limiter: the server's rate limiter (None: ``--rate-limit off``).
        memory_budget: the server's GPU memory ledger (None: each load checks free memory only).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        load_threads: int = 2,
        drain_timeout_s: float = 30.0,
        engine_loader: EngineLoader | None = None,
        rate_limiter: RateLimiter | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root} is not a directory")
        self.drain_timeout_s = drain_timeout_s
        self._entries: dict[str, ModelEntry] = {}
        self._loader = engine_loader
        self.rate_limiter = rate_limiter
        self.memory_budget = memory_budget
        self._executor = ThreadPoolExecutor(max_workers=load_threads, thread_name_prefix="streamrt-load")

    # --- discovery ----------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """Model directories in the repository (and models loaded from directories since removed)."""
        on_disk = {p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")}
        return sorted(on_disk | set(self._entries))

    def _entry(self, name: str, *, new: bool = False) -> ModelEntry:
        entry = self._entries.get(name)
        if entry is None:
            if not new and not (self.root / name).is_dir():
                raise UnknownModelError(f"unknown model '{name}': not in the repository {self.root}")
            entry = self._entries[name] = ModelEntry(name)
        return entry

    def read_config(
        self, name: str, override: Mapping[str, Any] | None = None, folder: Path | None = None
    ) -> ModelConfig:
        """The model's config from its directory, or ``override`` (a load request's config)."""
        folder = folder or self.root / name
        if override is not None:
            return from_mapping(override, name)
        for file in CONFIG_FILES:
            if (folder / file).is_file():
                return read_config_file(folder / file, name)
        return ModelConfig(name=name)

    # --- lifecycle ----------------------------------------------------------------------------

    async def load(
        self, name: str, config: Mapping[str, Any] | None = None, files: Mapping[str, bytes] | None = None,
        *, reload: bool = True,
    ) -> None:
        """Load (or reload) every version the policy selects; READY once all are warm.

        ``reload=False`` leaves a model that is READY by the time this load's turn comes as it is
        (start-up loads, and an ensemble's loads of its step models, which may meet).

        ``files`` (``{"file:1/model.onnx": data}``) replace the model directory for this load
        (see :mod:`.model_files`); they need ``config``.

        Raises:
            UnknownModelError: no such directory (and no files).
            RequestError: files without a config.
            StreamRTError: the load failed (the model is UNAVAILABLE with that reason, or keeps
                serving its old versions on a failed reload).
        """
        if files and config is None:
            raise RequestError(f"failed to load '{name}': model files need a config override in the same request",
                               hint="pass config=... with files=... to load_model")
        entry = self._entry(name, new=bool(files))
        async with entry.lock:
            if not reload and entry.state is ModelState.READY:
                return  # loaded by another load while this one waited (an ensemble's, at start-up)
            reload = entry.state is ModelState.READY
            if not reload:
                entry.state, entry.reason = ModelState.LOADING, ""
            folder = write_model_files(files) if files else None
            try:
                loaded = await self._load_versions(name, config, folder)
            except Exception as exc:
                remove_model_files(folder)
                reason = str(exc) if isinstance(exc, StreamRTError) else f"{type(exc).__name__}: {exc}"
                log.error("model '%s' failed to load: %s", name, reason)
                if not reload:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, reason
                if isinstance(exc, StreamRTError):
                    raise
                raise ModelNotReadyError(f"failed to load '{name}', {reason}") from exc  # Triton's words
            old = entry.versions
            for served in loaded.values():
                served.start()
            entry.versions = loaded
            old_files, entry.files = entry.files, folder
            entry.state, entry.reason = ModelState.READY, ""
            log.info("model '%s' ready: versions %s", name, ", ".join(map(str, loaded)))
        if old:
            await asyncio.gather(*(s.stop(self.drain_timeout_s) for s in old.values()))
        remove_model_files(old_files)
        settle_heap()

    async def _load_versions(
        self, name: str, override: Mapping[str, Any] | None, files: Path | None = None
    ) -> dict[int, Servable]:
        config = self.read_config(name, override, files)
        if config.ensemble_scheduling is not None:
            await self._load_steps(name, [s.model_name for s in config.ensemble_scheduling.steps])
        folder = files or self.root / name
        versions = config.version_policy.select(_versions(folder))
        if not versions:
            raise ConfigError(
                f"model '{name}': no version directory matches the version policy in {folder}",
                hint=f"put the model in {folder}/1/model.plan (or model.onnx)",
            )
        loop = asyncio.get_running_loop()
        jobs = [loop.run_in_executor(self._executor, load_servable,
                                     LoadContext(folder, v, config, self._loader, self.get,
                                                 self.rate_limiter, self.memory_budget)) for v in versions]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        loaded = {s.version: s for s in results if not isinstance(s, BaseException)}
        if errors:
            for served in loaded.values():
                await loop.run_in_executor(self._executor, served.release)
            raise errors[0]
        return loaded

    async def _load_steps(self, ensemble: str, models: list[str]) -> None:
        """Triton's rule: an ensemble's load first loads the models its steps name (those not READY,
        concurrently); unloading the ensemble later leaves them loaded.

        Raises:
            ConfigError: a step model is not in the repository, fails to load, or contains the ensemble.
        """
        for model in dict.fromkeys(models):
            if model not in self._entries and not (self.root / model).is_dir():
                raise ConfigError(f"ensemble '{ensemble}': step model '{model}' is not in the repository {self.root}",
                                  hint=f"add {self.root / model}/1/ or fix the step's model_name")
            path = self._path_to(model, ensemble, (ensemble,))
            if path:  # else two ensembles' loads would each wait for the other's lock
                raise ConfigError(f"ensemble '{ensemble}': step model '{model}' contains the ensemble again "
                                  f"({' -> '.join((ensemble, *path))})")
        results = await asyncio.gather(*(self.load(m, reload=False) for m in dict.fromkeys(models)),
                                       return_exceptions=True)
        for model, result in zip(dict.fromkeys(models), results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, StreamRTError):
                    raise result
                raise ConfigError(f"ensemble '{ensemble}': step model '{model}' failed to load: {result}") from None

    def _path_to(self, model: str, target: str, seen: tuple[str, ...]) -> tuple[str, ...]:
        """The chain of ensemble steps from ``model`` to ``target`` (empty: none), read from the configs."""
        if model == target:
            return (model,)
        if model in seen:
            return ()
        try:
            config = self.read_config(model)
        except StreamRTError:
            return ()  # its own load reports a bad config
        for step in config.ensemble_scheduling.steps if config.ensemble_scheduling else ():
            path = self._path_to(step.model_name, target, (*seen, model))
            if path:
                return (model, *path)
        return ()

    async def unload(self, name: str) -> None:
        """Stop accepting requests for ``name``, drain in-flight ones, release it (UNAVAILABLE)."""
        entry = self._entry(name)
        async with entry.lock:
            if not entry.versions:
                entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
                return
            entry.state, entry.reason = ModelState.UNLOADING, ""
            old, entry.versions = entry.versions, {}
            await asyncio.gather(*(s.stop(self.drain_timeout_s) for s in old.values()))
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
            remove_model_files(entry.files)
            entry.files = None
            log.info("model '%s' unloaded", name)

    async def close(self) -> None:
        """Unload every model and stop the loader threads."""
        await asyncio.gather(*(self.unload(n) for n in list(self._entries)), return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- lookups ------------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> Servable:
        """The served version (``""``: the highest loaded one).

        Raises:
            UnknownModelError: no such model or version.
            ModelNotReadyError: the model is loading, unloading or unavailable (with the reason).
        """
        entry = self._entries.get(name)
        if entry is None:
            if (self.root / name).is_dir():
                raise ModelNotReadyError(f"model '{name}' is not loaded")
            raise UnknownModelError(f"Request for unknown model: '{name}' is not found")
        if not entry.versions:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReadyError(f"model '{name}' is {entry.state.value}{why}")
        if not version:
            return entry.versions[max(entry.versions)]
        if not version.isdigit():
            raise RequestError(f"failed to get model version from specified version string '{version}' "
                               "(versions are positive integers)")
        if int(version) not in entry.versions:
            raise UnknownModelError(
                f"Request for unknown model: '{name}' version {version} is not found; served versions: "
                + ", ".join(map(str, entry.versions))
            )
        return entry.versions[int(version)]

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except StreamRTError:
            return False
        return self._entries[name].state is ModelState.READY

    def versions(self, name: str) -> list[str]:
        entry = self._entries.get(name)
        return [str(v) for v in sorted(entry.versions)] if entry else []

    def served(self) -> list[Servable]:
        """Every loaded model version (for statistics and metrics)."""
        return [s for e in self._entries.values() for _, s in sorted(e.versions.items())]

    def all_ready(self, names: list[str] | None = None) -> bool:
        """True when every model in ``names`` (default: every model being managed) is READY."""
        wanted = names if names is not None else list(self._entries)
        return all(n in self._entries and self._entries[n].state is ModelState.READY for n in wanted)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """The repository index: one row per model (and per loaded version)."""
        rows = []
        for name in self.model_names():
            entry = self._entries.get(name) or ModelEntry(name)
            if ready_only and entry.state is not ModelState.READY:
                continue
            if entry.versions:
                rows += [{"name": name, "version": str(v), "state": entry.state.value, "reason": entry.reason}
                         for v in sorted(entry.versions)]
            else:
                rows.append({"name": name, "version": "", "state": entry.state.value, "reason": entry.reason})
        return rows
