"""Runtime side of the ONNX Runtime backend: one shared session per plan, contexts, layer profiles."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from streamrt._features import current_cuda_device
from streamrt.backends.base import Engine, ExecutionContext, LayerTiming
from streamrt.backends.onnxruntime.session import session_options, session_providers, translate
from streamrt.errors import InferenceError, InputError
from streamrt.plan import PlanManifest

if TYPE_CHECKING:
    from streamrt.device.base import StreamLike

__all__ = ["OnnxRuntimeContext", "OnnxRuntimeEngine"]


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
        self.device_kind = "cpu" if self._settings["providers"][0] == "CPUExecutionProvider" else "cuda"
        # The GPU providers go on the CUDA device current at load (the server loads a model's engine once
        # per GPU with that GPU current); None keeps ONNX Runtime's default, device 0.
        self._device_id = current_cuda_device() if self.device_kind == "cuda" else None
        self._session = self._new_session(profiling=False)
        self._output_names = [o.name for o in manifest.outputs]

    def _new_session(self, *, profiling: bool, prefix: str | None = None) -> ort.InferenceSession:
        # The payload is already optimized at build time; loading it must not optimize again.
        so = session_options(self._settings, 0)
        if profiling:
            so.enable_profiling = True
            so.profile_file_prefix = prefix or "streamrt-profile"
        try:
            return ort.InferenceSession(self._payload, sess_options=so,
                                        providers=session_providers(self._settings, self._device_id))
        except Exception as exc:
            raise translate(exc, None) from exc

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


def _strings(array: np.ndarray) -> np.ndarray:
    """BYTES elements (``bytes``) as the ``str`` ONNX Runtime's string tensors take (UTF-8)."""
    out = np.empty(array.shape, dtype=object)
    try:
        out.reshape(-1)[:] = [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise InputError(f"a string input is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                         "ONNX Runtime string tensors hold text") from None
    return out


class OnnxRuntimeContext(ExecutionContext):
    """Runs the shared session synchronously in the calling thread."""

    engine: OnnxRuntimeEngine

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: StreamLike | None) -> dict[str, Any]:
        engine = self.engine
        if engine.device_kind == "cuda" and not isinstance(next(iter(inputs.values())), np.ndarray):
            return self._infer_bound(inputs)
        feeds = {k: _strings(v) if v.dtype == object else np.ascontiguousarray(v) for k, v in inputs.items()}
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
