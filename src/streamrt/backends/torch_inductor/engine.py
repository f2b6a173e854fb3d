"""Runtime side of the torch_inductor backend: engines, contexts and CUDA-graph replay.

Contexts run on the caller's stream: the AOTInductor runner launches on torch's current
stream, so ``infer(inputs, stream)`` enters ``torch.cuda.stream(stream)`` around the call and
never synchronises. Outputs are allocated by the caching allocator on that stream; a consumer
on another stream must wait on an event recorded after ``infer`` (the pipeline does).

CUDA graphs (``create_context(cuda_graph=True)``, static shapes per capture): the runner is
loaded single-threaded (required to capture it), warmed up on a side stream, then captured
``graph_buffers`` times into separate static outputs. Calls rotate over the captures, so the
outputs of call k stay valid until call ``k + graph_buffers`` on the same context: the next
stage can read item k while item k+1 replays. A new input shape triggers a new capture.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrt.backends.base import Engine, ExecutionContext, LayerTiming
from streamrt.backends.torch_inductor.payload import extract_payload
from streamrt.backends.torch_inductor.tf32 import set_tf32
from streamrt.errors import InferenceError, PlanFormatError
from streamrt.plan import PlanManifest

__all__ = ["TorchInductorContext", "TorchInductorEngine", "ensure_cxx_runtime"]

log = logging.getLogger(__name__)
_CXX_RUNTIME_LOADED = False


def ensure_cxx_runtime() -> None:
    """Put the system ``libstdc++`` into the process's global symbol scope, once, before loading.

    Why (found on the H200 image, torch 2.11+cu130, g++ 13): AOTInductor compiles a package's
    ``.so`` with the system ``g++`` against its libstdc++ headers, but links it against
    ``libtorch*.so`` only (``libstdc++`` is not in its DT_NEEDED). ``libtorch_cpu.so`` exports its
    own statically linked, older copy of ``std::filesystem`` (101 dynamic symbols). The package's
    undefined ``std::filesystem::path`` symbols therefore bind to torch's copy, whose internal
    layout differs from g++ 13's headers, and loading segfaults inside ``path`` code. Importing
    onnxruntime first "fixed" it only because that makes the system ``libstdc++`` global. Opening
    the compiler's ``libstdc++`` with RTLD_GLOBAL makes every package bind to the runtime it was
    compiled for, whatever was imported before. ``scripts/gpu_aoti_diagnose.py`` reproduces it.
    """
    global _CXX_RUNTIME_LOADED
    if _CXX_RUNTIME_LOADED:
        return
    _CXX_RUNTIME_LOADED = True
    candidates = []
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler:
        try:
            out = subprocess.run(
                [compiler, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            if out and Path(out).is_absolute():
                candidates.append(out)
        except (OSError, subprocess.SubprocessError):
            pass
    candidates.append("libstdc++.so.6")
    for name in candidates:
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            log.debug("loaded C++ runtime %s globally", name)
            return
        except OSError:
            continue


class TorchInductorEngine(Engine):
    """AOTInductor packages (one per profile) extracted to a private directory."""

    def __init__(self, manifest: PlanManifest, payload: bytes) -> None:
        super().__init__(manifest)
        self.device = str(manifest.device.get("kind", "cpu"))
        self._dir = Path(tempfile.mkdtemp(prefix="streamrt-pt2-"))
        try:
            meta, self._packages = extract_payload(payload, len(manifest.profiles), self._dir)
        except PlanFormatError:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._input_names: list[str] = list(meta["inputs"])
        self._output_names = [o.name for o in manifest.outputs]
        set_tf32(manifest.build_settings.get("backend", {}).get("fp32_precision") == "tf32")
        ensure_cxx_runtime()

    def load_runner(self, profile: int) -> Any:
        """A new AOTInductor runner for one profile's package, in single-threaded mode.

        Each context owns its runners and is used by one thread at a time, so the model
        container's thread-sync logic buys nothing; worse, it makes a runner unsafe inside a CUDA
        graph captured by the caller (the pipeline captures whole stages): on the H200 such
        replays returned wrong outputs. Single-threaded runners capture cleanly.
        """
        from torch._inductor.package import load_package

        index = torch.cuda.current_device() if self.device == "cuda" else -1
        return load_package(
            str(self._packages[profile]), run_single_threaded=True, device_index=index
        )

    def create_context(
        self, *, cuda_graph: bool | None = None, graph_buffers: int = 2
    ) -> TorchInductorContext:
        """A context with its own runners. ``cuda_graph`` defaults to the plan's build option."""
        if cuda_graph is None:
            cuda_graph = bool(self.manifest.build_settings.get("backend", {}).get("cuda_graphs", False))
        return TorchInductorContext(
            self, cuda_graph=cuda_graph and self.device == "cuda", buffers=graph_buffers
        )

    def profile_layers(self, inputs: Mapping[str, Any], iterations: int = 10) -> list[LayerTiming]:
        """Kernel-level times from the torch profiler (generated kernels carry the fused op names)."""
        from torch.profiler import ProfilerActivity, profile

        ctx = self.create_context(cuda_graph=False)
        ctx.infer(inputs)  # warm-up outside the profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(iterations):
                ctx.infer(inputs)
            if self.device == "cuda":
                torch.cuda.synchronize()
        rows = []
        for event in prof.key_averages():
            device_us = float(getattr(event, "device_time_total", 0.0) or 0.0)
            if self.device == "cuda" and device_us <= 0:
                continue
            total_us = device_us if self.device == "cuda" else float(event.self_cpu_time_total)
            if total_us <= 0:
                continue
            rows.append(
                LayerTiming(
                    event.key, "kernel" if self.device == "cuda" else "op", total_us / 1e3, event.count
                )
            )
        return sorted(rows, key=lambda r: r.total_ms, reverse=True)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _Graphs:
    """``buffers`` CUDA-graph captures of one runner at one set of input shapes."""

    def __init__(self, runner: Any, inputs: list[torch.Tensor], buffers: int) -> None:
        self.static_inputs = [t.clone() for t in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on a side stream, as torch's CUDA-graph notes require
                runner(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graphs = []
        self.outputs: list[Any] = []
        for _ in range(buffers):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = runner(*self.static_inputs)
            self.graphs.append(graph)
            self.outputs.append(out)
        self.turn = 0

    def run(self, inputs: list[torch.Tensor]) -> Any:
        for dst, src in zip(self.static_inputs, inputs, strict=True):
            dst.copy_(src, non_blocking=True)
        k = self.turn
        self.turn = (k + 1) % len(self.graphs)
        self.graphs[k].replay()
        return self.outputs[k]


class TorchInductorContext(ExecutionContext):
    """Runs one engine on the caller's stream, optionally through CUDA-graph replay."""

    engine: TorchInductorEngine

    def __init__(self, engine: TorchInductorEngine, *, cuda_graph: bool, buffers: int) -> None:
        super().__init__(engine)
        self.cuda_graph = cuda_graph
        self._buffers = max(1, buffers)
        self._runners: dict[int, Any] = {}
        self._graphs: dict[tuple[int, tuple[tuple[int, ...], ...]], _Graphs] = {}

    def _runner(self, profile: int) -> Any:
        if profile not in self._runners:
            self._runners[profile] = self.engine.load_runner(profile)
        return self._runners[profile]

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        engine = self.engine
        as_numpy = any(isinstance(v, np.ndarray) for v in inputs.values())
        args = [torch.as_tensor(inputs[name]) for name in engine._input_names]
        runner = self._runner(profile)
        torch_stream = getattr(stream, "torch", stream)
        try:
            if engine.device == "cuda":
                with torch.cuda.stream(torch_stream) if torch_stream is not None else _null():
                    outs = self._run_cuda(runner, profile, args)
            else:
                outs = runner(*args)
        except Exception as exc:
            raise InferenceError(f"torch_inductor failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
        if isinstance(outs, torch.Tensor):
            outs = [outs]
        result = dict(zip(engine._output_names, outs, strict=True))
        if as_numpy:
            return {k: v.detach().cpu().numpy() for k, v in result.items()}
        return result

    def _run_cuda(self, runner: Any, profile: int, args: list[torch.Tensor]) -> Any:
        if not self.cuda_graph:
            return runner(*args)
        key = (profile, tuple(tuple(a.shape) for a in args))
        graphs = self._graphs.get(key)
        if graphs is None:
            log.debug("capturing CUDA graphs for shapes %s", key[1])
            graphs = self._graphs[key] = _Graphs(runner, args, self._buffers)
        return graphs.run(args)

    def close(self) -> None:
        self._graphs.clear()
        self._runners.clear()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
