"""NVIDIA TensorRT backend (10.x and 11.x), build side: ONNX -> strongly typed network -> serialized engine.

**This backend has never been executed in this repository's environment**: TensorRT's libraries
come only from NVIDIA's package index, which these machines cannot reach. Every call below was
checked against TensorRT's Python binding sources and documentation (``docs/tensorrt.md`` lists
each call with its source), and ``tests/backends/test_tensorrt.py`` runs wherever
``import tensorrt`` works. The pure decisions (flags, tables, messages, compatibility rules) live
in :mod:`streamrt.backends.tensorrt.compat` and are tested on CPU.

Build: the precision-transformed ONNX model (StreamRT applies fp16/bf16 casts and int8 Q/DQ
*before* any backend builds) is parsed by ``OnnxParser`` into a strongly typed network, so the
types come from the graph and no precision builder flag is ever set (TensorRT 11 removed them).
One optimization profile per StreamRT shape profile; workspace limit from
``BuildConfig.memory_limit_mb``; ``builder_optimization_level`` from
``BuildConfig.optimization_level`` (both 0..5, default 3); DETAILED profiling verbosity so
``streamrt inspect``/``profile`` can name layers; a timing cache shared across builds (one file
per TensorRT version and GPU, next to the plan cache); TF32 off for ``fp32`` plans (IEEE fp32),
on otherwise. Options (``--option key=value``): ``version_compatible``, ``hardware_compatibility``
(``none``/``ampere_plus``/``same_compute_capability``), ``refit``, ``timing_cache`` (path or
``off``), ``cuda_graphs``.

Only :meth:`.backend.TensorRTBackend.build` imports this module; loading a plan never does.

Thread safety (TensorRT's rules): a new ``Builder`` per build, so concurrent builds in several
threads never share one; ``build_serialized_network`` releases the GIL.

Example:
    >>> streamrt.build("yolo.onnx", BuildConfig(backend="tensorrt", precision="fp16"), "yolo.plan")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorrt as trt

from streamrt.backends.base import BuildJob, BuildOutput
from streamrt.backends.tensorrt import compat
from streamrt.errors import BuildError, ConfigError, ProfileError, StreamRTError
from streamrt.plan import atomic_write
from streamrt.types import ShapeProfile, TensorSpec

__all__ = ["build"]

log = logging.getLogger(__name__)


def build(job: BuildJob, device: dict[str, Any]) -> BuildOutput:
    """Build one serialized engine of ``job.model`` for ``device`` (the backend's ``target_device``)."""
    return _Build(job, device).run()


class _Build:
    """One engine build, with a ``Builder`` of its own (TensorRT: one builder per thread).

    ``run`` keeps the ONNX parser alive until the plan is serialized: the network references
    weights that the parser owns.
    """

    def __init__(self, job: BuildJob, device: dict[str, Any]) -> None:
        self.model = job.model
        self.config = job.config
        self.profiles = job.profiles
        self.progress = job.progress
        self.cache_dir = job.cache_dir
        self.device = device
        self.options = compat.build_options(job.config)
        count = len(job.profiles)
        self.what = f"{job.model.name} ({count} profile{'s' if count != 1 else ''}) for {device.get('name')}"

    def run(self) -> BuildOutput:
        monitor = compat.BuildProgress(self.progress)
        with compat.LOGS.capture() as messages:
            try:
                logger = compat.get_logger(trt)
                builder = trt.Builder(logger)
                network = builder.create_network(compat.network_flags(trt))
                parser = self._parse(network, logger)
                config = self._config(builder)
                cache_file = self._load_timing_cache(config)
                config.progress_monitor = _monitor(monitor)
                self.progress(
                    f"building a TensorRT {trt.__version__} engine (optimization level "
                    f"{self.config.optimization_level}, {self.config.precision.value} from the graph)"
                )
                plan = builder.build_serialized_network(network, config)
            except StreamRTError:
                raise
            except Exception as exc:  # TensorRT's bindings raise RuntimeError/ValueError/TypeError
                raise BuildError(f"TensorRT failed while building {self.what}: {type(exc).__name__}: {exc}") from exc
        if monitor.error is not None:
            raise monitor.error
        if plan is None:
            raise compat.build_failure(messages, what=self.what)
        if cache_file is not None:
            _save_timing_cache(config, cache_file)
        payload = bytes(plan)
        del parser  # only now: the network's weights belonged to it
        return BuildOutput(
            payload=payload, settings=self._settings(cache_file), manifest_facts={"tensorrt": self.options.facts()}
        )

    def _parse(self, network: Any, logger: Any) -> Any:
        parser = trt.OnnxParser(network, logger)
        self.progress(f"parsing ONNX with TensorRT {trt.__version__} ({len(self.model.proto.graph.node)} nodes)")
        path = str(self.model.path) if self.model.path is not None else None
        if not parser.parse(self.model.data, path):
            records = [compat.ParserErrorRecord.from_trt(parser.get_error(i)) for i in range(parser.num_errors)]
            raise compat.parser_failure(records, opset=self.model.opset, model_name=self.model.name)
        return parser

    def _config(self, builder: Any) -> Any:
        config = builder.create_builder_config()
        if self.config.memory_limit_mb is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.config.memory_limit_mb * 2**20)
        config.builder_optimization_level = self.config.optimization_level
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        if self.config.precision.value == "fp32" and not self.config.tf32:
            config.clear_flag(trt.BuilderFlag.TF32)  # on by default in 10.x and 11.x: --tf32 keeps it
        if self.options.version_compatible:
            config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
        if self.options.refit:
            config.set_flag(trt.BuilderFlag.REFIT)
        if self.options.hardware_compatibility != "none":
            member = compat.HARDWARE_LEVELS[self.options.hardware_compatibility]
            level = getattr(trt.HardwareCompatibilityLevel, member, None)
            if level is None:
                raise ConfigError(f"TensorRT {trt.__version__} has no HardwareCompatibilityLevel.{member}")
            config.hardware_compatibility_level = level
        for index, profile in enumerate(self.profiles):
            self._add_profile(builder, config, index, profile, self.model.inputs)
        return config

    @staticmethod
    def _add_profile(
        builder: Any, config: Any, index: int, profile: ShapeProfile, inputs: Sequence[TensorSpec]
    ) -> None:
        trt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in compat.profile_shapes(profile, inputs).items():
            try:
                trt_profile.set_shape(name, lo, opt, hi)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise ProfileError(f"TensorRT rejected profile {index} for input '{name}': {exc}") from exc
        if config.add_optimization_profile(trt_profile) < 0:
            raise ProfileError(
                f"TensorRT rejected profile {index}: {compat.LOGS.last_errors()}",
                hint="every dynamic input needs min <= opt <= max and static dimensions equal to the model's",
            )

    def _load_timing_cache(self, config: Any) -> Path | None:
        if self.options.timing_cache == "":
            return None
        if self.options.timing_cache:
            path = Path(self.options.timing_cache)
        else:
            path = compat.timing_cache_path(self.cache_dir, str(trt.__version__), self.device)
        data = b""
        if path.is_file():
            data = path.read_bytes()
            self.progress(f"timing cache {path} ({len(data) / 1024:.0f} KiB)")
        cache = config.create_timing_cache(data)
        if cache is None or not config.set_timing_cache(cache, False):
            log.warning("TensorRT did not accept the timing cache %s; building with an empty one", path)
            if not config.set_timing_cache(config.create_timing_cache(b""), False):
                return None
        return path

    def _settings(self, cache_file: Path | None) -> dict[str, Any]:
        return {
            "strongly_typed": True,
            "builder_optimization_level": self.config.optimization_level,
            "workspace_bytes": self.config.memory_limit_mb * 2**20 if self.config.memory_limit_mb else None,
            "profiling_verbosity": "DETAILED",
            "tf32": self.config.tf32 or self.config.precision.value != "fp32",
            "timing_cache": str(cache_file) if cache_file else None,
            "cuda_graphs": self.options.cuda_graphs,
            **self.options.facts(),
        }


def _save_timing_cache(config: Any, path: Path) -> None:
    """Write the build's timing cache, merged with entries another build saved meanwhile."""
    cache = config.get_timing_cache()
    if cache is None:
        return
    try:
        if path.is_file():
            other = config.create_timing_cache(path.read_bytes())
            if other is not None:
                cache.combine(other, False)
        with atomic_write(path) as f:
            f.write(bytes(cache.serialize()))
    except OSError as exc:
        log.warning("could not save the TensorRT timing cache %s: %s", path, exc)


def _monitor(state: compat.BuildProgress) -> Any:
    """A ``trt.IProgressMonitor`` forwarding to ``state`` (TensorRT calls it with the GIL re-taken)."""

    class _Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            state.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return state.step_complete(phase_name, step)

        def phase_finish(self, phase_name: str) -> None:
            state.phase_finish(phase_name)

    return _Monitor()
