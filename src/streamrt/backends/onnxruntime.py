"""ONNX Runtime backend: StreamRT's embedded default, runs on any machine.

Build runs ONNX Runtime's graph optimizer (highest level by default) once and stores the
optimized model in the plan, so loading skips optimization and takes milliseconds. Session
settings (threads, execution mode, providers) are recorded in the plan and reused at load.

The CPU execution provider is the default. With ``onnxruntime-gpu`` installed,
``backend_options={"providers": ["CUDAExecutionProvider"]}`` (CLI: ``--provider cuda``)
selects CUDA or TensorRT execution providers; that path is present but only tested where
such a provider is available.

Optimized models at the highest level can contain CPU-specific layouts (NCHWc), so a plan is
tied to the ONNX Runtime version and the processor architecture it was built on.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from streamrt.backends.base import Backend, BuildJob, BuildOutput, Engine, ExecutionContext, LayerTiming
from streamrt.config import BuildConfig
from streamrt.errors import BuildError, ConfigError, InferenceError, UnsupportedOperatorError
from streamrt.onnx.model import OnnxModel
from streamrt.plan import Plan, PlanManifest

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeEngine"]

log = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
_LEVELS = {
    0: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    2: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}
_MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
# "Could not find an implementation for Foo(13) node with name 'bar'"
_NOT_IMPLEMENTED = re.compile(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'")
_NOT_REGISTERED = re.compile(r"(?:([\w.]+):)?(\w+)\((-?\d+)\) is not a registered function/op")
# Domains ONNX Runtime ships kernels for (the ONNX standard, ONNX-ML and its own contrib operators).
_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def _session_settings(config: BuildConfig) -> dict[str, Any]:
    opts = dict(config.backend_options)
    unknown = sorted(set(opts) - {"providers", "threads", "inter_op_threads", "execution_mode"})
    if unknown:
        raise ConfigError(
            f"unknown onnxruntime backend options {unknown}; known: providers, threads, "
            "inter_op_threads, execution_mode"
        )
    providers = [PROVIDERS.get(p, p) for p in opts.get("providers", ["cpu"])]
    missing = [p for p in providers if p not in ort.get_available_providers()]
    if missing:
        raise ConfigError(
            f"onnxruntime execution providers {missing} are not available here "
            f"(available: {', '.join(ort.get_available_providers())})",
            hint="install onnxruntime-gpu for CUDA/TensorRT providers",
        )
    mode = str(opts.get("execution_mode", "sequential"))
    if mode not in _MODES:
        raise ConfigError(f"execution_mode must be sequential or parallel, got {mode!r}")
    return {
        "providers": providers,
        "threads": int(opts.get("threads", 0)),
        "inter_op_threads": int(opts.get("inter_op_threads", 0)),
        "execution_mode": mode,
        "graph_optimization_level": config.optimization_level,
        "memory_limit_mb": config.memory_limit_mb,
    }


def _session_options(settings: Mapping[str, Any], level: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = _LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    so.intra_op_num_threads = int(settings.get("threads", 0))
    so.inter_op_num_threads = int(settings.get("inter_op_threads", 0))
    so.execution_mode = _MODES[str(settings.get("execution_mode", "sequential"))]
    so.log_severity_level = 3
    return so


def _providers(settings: Mapping[str, Any]) -> list[Any]:
    limit = settings.get("memory_limit_mb")
    out: list[Any] = []
    for name in settings["providers"]:
        if name == "CUDAExecutionProvider" and limit:
            out.append((name, {"gpu_mem_limit": str(int(limit) * 2**20)}))
        else:
            out.append(name)
    return out


def _cpu_isa() -> str:
    """The widest SIMD level ONNX Runtime's CPU kernels pick (it decides the NCHWc block size)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return platform.machine()
    for isa in ("avx512f", "avx2", "avx", "asimd", "neon"):
        if isa in flags:
            return isa
    return "generic"


def _translate(exc: Exception, model: OnnxModel | None) -> Exception:
    text = str(exc)
    match = _NOT_IMPLEMENTED.search(text)
    if match:
        op, opset, node = match.groups()
        return UnsupportedOperatorError(
            node, op, int(opset), "onnxruntime", detail=text.splitlines()[0][:200]
        )
    match = _NOT_REGISTERED.search(text)
    if match and model is not None:
        domain, op, _ = match.groups()
        domain = domain or ""
        node = next((n for n in model.proto.graph.node if n.op_type == op and n.domain == domain), None)
        opsets = {imp.domain: int(imp.version) for imp in model.proto.opset_import}
        return UnsupportedOperatorError(
            (node.name or f"{op} #{list(model.proto.graph.node).index(node)}") if node is not None else "?",
            op, opsets.get(domain, 0), "onnxruntime", detail="no kernel registered for this operator", domain=domain,
        )
    where = f" for {model.name}" if model else ""
    return BuildError(f"onnxruntime could not create a session{where}: {text.splitlines()[0][:300]}")


class OnnxRuntimeBackend(Backend):
    """Builds optimized ONNX models for ONNX Runtime and loads them into sessions."""

    name = "onnxruntime"
    extra = "core"
    device_fields = ("kind", "arch", "isa")
    # bf16 and tf32 have no CPU kernels in ONNX Runtime for most operators.
    precisions = frozenset({"fp32", "fp16", "int8"})
    int8_style = "onnxruntime"

    def runs_operator(self, op_type: str, domain: str) -> bool | None:
        return domain in _DOMAINS

    def version(self) -> str:
        return str(ort.__version__)

    def runtime_versions(self) -> dict[str, str]:
        import onnx

        return {"onnxruntime": self.version(), "onnx": str(onnx.__version__), "numpy": np.__version__}

    def target(self, config: BuildConfig) -> dict[str, Any]:
        providers = [PROVIDERS.get(p, p) for p in config.backend_options.get("providers", ["cpu"])]
        kind = "cuda" if any(p != "CPUExecutionProvider" for p in providers) else "cpu"
        return {"kind": kind, "arch": platform.machine(), "isa": _cpu_isa(), "providers": providers}

    def build(self, job: BuildJob) -> BuildOutput:
        model, config, progress = job.model, job.config, job.progress  # no cache of its own: the plan cache is enough
        settings = _session_settings(config)
        level = config.optimization_level
        progress(f"optimizing graph (onnxruntime {self.version()}, level {level})")
        with tempfile.TemporaryDirectory(prefix="streamrt-ort-") as tmp:
            optimized = Path(tmp) / "optimized.onnx"
            so = _session_options(settings, level)
            so.optimized_model_filepath = str(optimized)
            try:
                ort.InferenceSession(model.data, sess_options=so, providers=_providers(settings))
            except Exception as exc:  # onnxruntime raises its own pybind exception types
                raise _translate(exc, model) from exc
            payload = optimized.read_bytes() if optimized.exists() else model.data
        return BuildOutput(payload=payload, settings=settings)

    def describe_payload(self, payload: bytes) -> dict[str, Any]:
        import onnx

        from streamrt.onnx.model import model_from_proto

        optimized = model_from_proto(onnx.load_from_string(payload), check=False)
        return {"op_histogram": optimized.op_histogram()}

    def load(self, plan: Plan) -> OnnxRuntimeEngine:
        return OnnxRuntimeEngine(plan.manifest, plan.payload)


class OnnxRuntimeEngine(Engine):
    """An ONNX Runtime session over a plan's optimized model.

    One session is shared by all contexts: ``InferenceSession.run`` is thread-safe.
    """

    def __init__(self, manifest: PlanManifest, payload: bytes) -> None:
        super().__init__(manifest)
        self._payload = payload
        self._settings = dict(manifest.build_settings.get("backend", {}))
        if "providers" not in self._settings:
            self._settings["providers"] = ["CPUExecutionProvider"]
        self.device = "cpu" if self._settings["providers"][0] == "CPUExecutionProvider" else "cuda"
        self._session = self._new_session(profiling=False)
        self._output_names = [o.name for o in manifest.outputs]

    def _new_session(self, *, profiling: bool, prefix: str | None = None) -> ort.InferenceSession:
        # The payload is already optimized at build time; loading it must not optimize again.
        so = _session_options(self._settings, 0)
        if profiling:
            so.enable_profiling = True
            so.profile_file_prefix = prefix or "streamrt-profile"
        try:
            return ort.InferenceSession(self._payload, sess_options=so, providers=_providers(self._settings))
        except Exception as exc:
            raise _translate(exc, None) from exc

    @property
    def session(self) -> ort.InferenceSession:
        return self._session

    def create_context(self) -> OnnxRuntimeContext:
        return OnnxRuntimeContext(self)

    def profile_layers(self, inputs: Mapping[str, Any], iterations: int = 10) -> list[LayerTiming]:
        """Per-node kernel times from ONNX Runtime's profiler (a separate profiling session)."""
        self.validate(inputs)
        feeds = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        with tempfile.TemporaryDirectory(prefix="streamrt-ortprof-") as tmp:
            session = self._new_session(profiling=True, prefix=os.path.join(tmp, "profile"))
            session.run(self._output_names, feeds)  # warm-up, excluded below
            warm_calls = _node_calls(Path(session.end_profiling()))
            session = self._new_session(profiling=True, prefix=os.path.join(tmp, "profile2"))
            for _ in range(iterations):
                session.run(self._output_names, feeds)
            rows = _node_calls(Path(session.end_profiling()))
        del warm_calls
        return sorted(rows.values(), key=lambda r: r.total_ms, reverse=True)

    def close(self) -> None:
        super().close()
        self._session = None


def _node_calls(trace: Path) -> dict[str, LayerTiming]:
    events = json.loads(trace.read_text())
    trace.unlink(missing_ok=True)
    rows: dict[str, LayerTiming] = {}
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        name = ev["name"][: -len("_kernel_time")]
        op = ev.get("args", {}).get("op_name", "?")
        prev = rows.get(name)
        dur = float(ev.get("dur", 0)) / 1000.0
        rows[name] = LayerTiming(
            name, op, dur + (prev.total_ms if prev else 0.0), 1 + (prev.calls if prev else 0)
        )
    return rows


class OnnxRuntimeContext(ExecutionContext):
    """Runs the shared session synchronously in the calling thread."""

    engine: OnnxRuntimeEngine

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        engine = self.engine
        if engine.device == "cuda" and not isinstance(next(iter(inputs.values())), np.ndarray):
            return self._infer_bound(inputs)
        feeds = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        try:
            outs = engine.session.run(engine._output_names, feeds)
        except Exception as exc:
            raise InferenceError(f"onnxruntime failed: {str(exc).splitlines()[0][:300]}") from exc
        return dict(zip(engine._output_names, outs, strict=True))

    def _infer_bound(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """IO binding for device tensors (torch CUDA tensors): no host round trip."""
        import torch

        engine = self.engine
        binding = engine.session.io_binding()
        for name, tensor in inputs.items():
            t = tensor.contiguous()
            binding.bind_input(
                name,
                "cuda",
                t.device.index or 0,
                np.dtype(str(t.dtype).replace("torch.", "")),
                tuple(t.shape),
                t.data_ptr(),
            )
        for name in engine._output_names:
            binding.bind_output(name, "cuda")
        engine.session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return {
            name: torch.utils.dlpack.from_dlpack(v.to_dlpack())
            for name, v in zip(engine._output_names, values, strict=True)
        }
