"""ONNX Runtime backend, build side: StreamRT's embedded default, runs on any machine.

Build runs ONNX Runtime's graph optimizer (highest level by default) once and stores the
optimized model in the plan, so loading skips optimization and takes milliseconds. Session
settings (threads, execution mode, providers) are recorded in the plan and reused at load.

The CPU execution provider is the default. With ``onnxruntime-gpu`` installed,
``backend_options={"providers": ["CUDAExecutionProvider"]}`` (CLI: ``--provider cuda``)
selects CUDA or TensorRT execution providers; that path is present but only tested where
such a provider is available.

Only :meth:`.backend.OnnxRuntimeBackend.build` imports this module; loading a plan never does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import onnxruntime as ort

from streamrt.backends.base import BuildJob, BuildOutput
from streamrt.backends.onnxruntime.session import MODES, PROVIDERS, session_options, session_providers, translate
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError

__all__ = ["optimize"]


_OPTIONS = ("providers", "threads", "inter_op_threads", "execution_mode", "spinning")
_THREAD_OPTIONS = ("threads", "inter_op_threads")


def _thread_count(opts: dict[str, Any], key: str) -> int:
    """A thread-count option, checked where the option table is: ``threads=abc`` or ``threads=-3``
    is a one-line ConfigError, not a ValueError from ``int()`` or a session that ignores it."""
    value = opts.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"onnxruntime option {key} must be an integer >= 0 (0 = automatic), got {value!r}",
                          hint=f"--option {key}=N with N >= 0")
    return value


def _session_settings(config: BuildConfig) -> dict[str, Any]:
    opts = dict(config.backend_options)
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown onnxruntime backend options {unknown}; known: {', '.join(_OPTIONS)}")
    threads = {key: _thread_count(opts, key) for key in _THREAD_OPTIONS}
    providers = [PROVIDERS.get(p, p) for p in opts.get("providers", ["cpu"])]
    missing = [p for p in providers if p not in ort.get_available_providers()]
    if missing:
        raise ConfigError(
            f"onnxruntime execution providers {missing} are not available here "
            f"(available: {', '.join(ort.get_available_providers())})",
            hint="install onnxruntime-gpu for CUDA/TensorRT providers",
        )
    spinning = opts.get("spinning")
    if spinning is not None and not isinstance(spinning, bool):
        raise ConfigError(f"onnxruntime option spinning must be true or false, got {spinning!r}",
                          hint="--option spinning=false: idle pool threads sleep instead of spinning (a server "
                               "running batches concurrently beside other processes)")
    mode = str(opts.get("execution_mode", "sequential"))
    if mode not in MODES:
        raise ConfigError(f"execution_mode must be sequential or parallel, got {mode!r}")
    return {
        "providers": providers,
        "threads": threads["threads"],
        "inter_op_threads": threads["inter_op_threads"],
        "execution_mode": mode,
        "graph_optimization_level": config.optimization_level,
        "memory_limit_mb": config.memory_limit_mb,
        **({"spinning": spinning} if spinning is not None else {}),  # absent: ONNX Runtime's default (spin)
    }


def optimize(job: BuildJob) -> BuildOutput:
    """Run ONNX Runtime's graph optimizer once on ``job.model``; the optimized model is the payload.

    No cache of its own: the plan cache is enough.
    """
    model, config, progress = job.model, job.config, job.progress
    settings = _session_settings(config)
    level = config.optimization_level
    progress(f"optimizing graph (onnxruntime {ort.__version__}, level {level})")
    with tempfile.TemporaryDirectory(prefix="streamrt-ort-") as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        so = session_options(settings, level)
        so.optimized_model_filepath = str(optimized)
        try:
            ort.InferenceSession(model.data, sess_options=so, providers=session_providers(settings))
        except Exception as exc:  # onnxruntime raises its own pybind exception types
            raise translate(exc, model) from exc
        payload = optimized.read_bytes() if optimized.exists() else model.data
    return BuildOutput(payload=payload, settings=settings)
