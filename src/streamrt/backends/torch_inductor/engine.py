"""Runtime side of the torch_inductor backend: engines, contexts and CUDA-graph replay.

Contexts run on the caller's stream: the AOTInductor runner launches on torch's current
stream, so ``infer(inputs, stream)`` enters ``torch.cuda.stream(stream)`` around the call and
never synchronises. Inputs must be ready on that stream (work that wrote them on another stream
must be waited for first, as with TensorRT's ``enqueueV3``). Outputs are allocated by the caching
allocator on that stream; a consumer on another stream must wait on an event recorded after
``infer`` (the pipeline does).

CUDA graphs, on by default for GPU plans (the build option ``cuda_graphs``, or
``create_context(cuda_graph=...)``): a launch-bound plan (a text recognizer: 14.8 ms per call
as a plan, 3.08 ms as a CUDA graph on the H200) pays one graph launch instead of one launch per
kernel. The runner is loaded single-threaded (required to capture it), warmed up on a side
stream, then captured ``graph_buffers`` times into separate static outputs. Each context keeps
captures for at most ``graph_cache`` input shapes (least recently used evicted; a new shape
costs a capture). By default every call returns fresh copies of the static outputs (one
device-to-device copy per output), so outputs stay valid like those of a plain call. With
``share_outputs=True`` calls rotate over the captures and return the static outputs themselves:
the outputs of call k stay valid until call ``k + graph_buffers`` on the same context (the next
stage can read item k while item k+1 replays). Shapes that cannot be captured (a plan that
synchronises with the host, e.g. for data-dependent output sizes) run as plain calls, and so
does a call made while the caller is itself capturing a CUDA graph (the pipeline's stage graphs).

GPU calls run under the plan's TF32 and cuDNN-benchmark flags (``tf32.py``), set around each
call and restored after it.

CPU plans run with the thread count of :mod:`streamrt.device.threads` (a policy that leaves a
core free and shrinks under load; the build option ``threads`` or ``create_context(threads=N)``
overrides it), set in the calling thread around each call.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from streamrt.backends.base import Engine, ExecutionContext, LayerTiming
from streamrt.backends.torch_inductor.payload import extract_payload
from streamrt.backends.torch_inductor.tf32 import backend_flags
from streamrt.device.cuda import as_torch_stream
from streamrt.errors import InferenceError, PlanFormatError
from streamrt.plan import PlanManifest

if TYPE_CHECKING:
    from streamrt.device.base import StreamLike

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
        self.device_kind = str(manifest.device.get("kind", "cpu"))
        self._dir = Path(tempfile.mkdtemp(prefix="streamrt-pt2-"))
        try:
            meta, self._packages = extract_payload(payload, len(manifest.profiles), self._dir)
        except PlanFormatError:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._input_names: list[str] = list(meta["inputs"])
        self._output_names = [o.name for o in manifest.outputs]
        settings = manifest.build_settings.get("backend", {})
        # Set around each GPU call and restored after (tf32.py): the user's process keeps its own flags.
        self.tf32 = settings.get("fp32_precision") == "tf32"
        self.cudnn_benchmark = bool(settings.get("cudnn_benchmark", False))
        ensure_cxx_runtime()

    def load_runner(self, profile: int) -> Any:
        """A new AOTInductor runner for one profile's package, in single-threaded mode.

        Each context owns its runners and is used by one thread at a time, so the model
        container's thread-sync logic buys nothing; worse, it makes a runner unsafe inside a CUDA
        graph captured by the caller (the pipeline captures whole stages): on the H200 such
        replays returned wrong outputs. Single-threaded runners capture cleanly.
        """
        from streamrt.backends.torch_inductor.nogil_runner import open_nogil_runner, open_torch_runner

        index = torch.cuda.current_device() if self.device_kind == "cuda" else -1
        # The runner without the GIL where the package allows it (nogil_runner.py: torch's holds
        # the GIL for every launch of the run), torch's otherwise.
        runner = open_nogil_runner(self._packages[profile], self._dir / f"nogil-{profile}-{index}", index)
        if runner is not None:
            return runner
        return open_torch_runner(self._packages[profile], index)

    def create_context(
        self,
        *,
        cuda_graph: bool | None = None,
        graph_buffers: int = 2,
        share_outputs: bool = False,
        graph_cache: int = 8,
        threads: int | None = None,
    ) -> TorchInductorContext:
        """A context with its own runners (see the module docs for CUDA graphs and CPU threads).

        Args:
            cuda_graph: replay CUDA graphs; defaults to the plan's ``cuda_graphs`` build option.
            graph_buffers: captures per shape (rotated over with ``share_outputs``).
            share_outputs: return the graphs' static outputs instead of fresh copies.
            graph_cache: input shapes whose captures are kept (least recently used evicted).
            threads: CPU plans: intra-op threads (default: the plan's ``threads`` option, else
                :func:`streamrt.device.threads.default_cpu_threads`).
        """
        settings = self.manifest.build_settings.get("backend", {})
        if cuda_graph is None:
            cuda_graph = bool(settings.get("cuda_graphs", False))
        cpu_threads = None
        if self.device_kind == "cpu":
            from streamrt.device.threads import resolve_cpu_threads

            cpu_threads = resolve_cpu_threads(threads if threads is not None else settings.get("threads"))
        return TorchInductorContext(
            self,
            cuda_graph=cuda_graph and self.device_kind == "cuda",
            buffers=graph_buffers,
            share_outputs=share_outputs,
            graph_cache=graph_cache,
            threads=cpu_threads,
        )

    def profile_layers(self, inputs: Mapping[str, Any], iterations: int = 10) -> list[LayerTiming]:
        """Kernel-level times from the torch profiler (generated kernels carry the fused op names)."""
        from torch.profiler import ProfilerActivity, profile

        ctx = self.create_context(cuda_graph=False)
        ctx.infer(inputs)  # warm-up outside the profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device_kind == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(iterations):
                ctx.infer(inputs)
            if self.device_kind == "cuda":
                torch.cuda.synchronize()
        rows = []
        for event in prof.key_averages():
            device_us = float(getattr(event, "device_time_total", 0.0) or 0.0)
            if self.device_kind == "cuda" and device_us <= 0:
                continue
            total_us = device_us if self.device_kind == "cuda" else float(event.self_cpu_time_total)
            if total_us <= 0:
                continue
            rows.append(
                LayerTiming(
                    event.key, "kernel" if self.device_kind == "cuda" else "op", total_us / 1e3, event.count
                )
            )
        return sorted(rows, key=lambda r: r.total_ms, reverse=True)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _CaptureGate:
    """Many CUDA runs at once, or one CUDA-graph capture alone, across every context in the process.

    A capture while another thread launches work (a server's second GPU instance replaying its
    graph) aborted the process on the H200 (2026-12-01, the batch-integrity property test with two
    GPU instances). Runs share the gate; a capture waits for running calls to finish and holds new
    ones back, and captures in thread-local mode so unrelated CUDA work elsewhere cannot break it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._capturing = False

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        with self._cond:
            while self._capturing:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with self._cond:
            while self._capturing or self._running:
                self._cond.wait()
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()


_GATE = _CaptureGate()


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
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
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


_UNCAPTURABLE = object()  # cache entry of a shape whose capture failed: run it as plain calls


class TorchInductorContext(ExecutionContext):
    """Runs one engine on the caller's stream, optionally through CUDA-graph replay."""

    engine: TorchInductorEngine

    def __init__(
        self,
        engine: TorchInductorEngine,
        *,
        cuda_graph: bool,
        buffers: int,
        share_outputs: bool = False,
        graph_cache: int = 8,
        threads: int | None = None,
    ) -> None:
        super().__init__(engine)
        self.cuda_graph = cuda_graph
        self.share_outputs = share_outputs
        self.threads = threads
        self._buffers = max(1, buffers)
        self._cache_size = max(1, graph_cache)
        self._runners: dict[int, Any] = {}
        self._graphs: collections.OrderedDict[tuple[int, tuple[tuple[int, ...], ...]], Any] = (
            collections.OrderedDict()
        )

    @property
    def graph_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Input shapes with a live capture, least recently used first."""
        return [key[1] for key, value in self._graphs.items() if value is not _UNCAPTURABLE]

    def _runner(self, profile: int) -> Any:
        if profile not in self._runners:
            self._runners[profile] = self.engine.load_runner(profile)
        return self._runners[profile]

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: StreamLike | None) -> dict[str, Any]:
        engine = self.engine
        as_numpy = any(isinstance(v, np.ndarray) for v in inputs.values())
        args = [torch.as_tensor(inputs[name]) for name in engine._input_names]
        runner = self._runner(profile)
        torch_stream = as_torch_stream(stream)
        try:
            if engine.device_kind == "cuda":
                with torch.cuda.stream(torch_stream) if torch_stream is not None else _null(), \
                        backend_flags(engine.tf32, engine.cudnn_benchmark):
                    outs = self._run_cuda(runner, profile, args)
            else:
                with _cpu_threads(self.threads):
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
        if torch.cuda.is_current_stream_capturing():  # inside the caller's own capture: record plainly
            return runner(*args)
        if not self.cuda_graph:
            with _GATE.run():
                return runner(*args)
        key = (profile, tuple(tuple(a.shape) for a in args))
        graphs = self._graphs.get(key)
        if graphs is None:
            with _GATE.capture():
                graphs = self._capture(runner, key, args)
        else:
            self._graphs.move_to_end(key)
        with _GATE.run():
            if graphs is _UNCAPTURABLE:
                return runner(*args)
            outs = graphs.run(args)
            if self.share_outputs:
                return outs
            if isinstance(outs, torch.Tensor):
                return outs.clone()
            return [o.clone() for o in outs]

    def _capture(self, runner: Any, key: tuple[int, tuple[tuple[int, ...], ...]], args: list[torch.Tensor]) -> Any:
        log.debug("capturing CUDA graphs for shapes %s", key[1])
        try:
            graphs: Any = _Graphs(runner, args, self._buffers if self.share_outputs else 1)
        except Exception as exc:  # any capture failure means "run this shape plainly"
            log.warning(
                "torch_inductor: shapes %s cannot be captured as a CUDA graph (%s: %s); running them as plain calls",
                key[1], type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "",
            )
            graphs = _UNCAPTURABLE
        self._graphs[key] = graphs
        while len(self._graphs) > self._cache_size:
            self._graphs.popitem(last=False)
        return graphs

    def close(self) -> None:
        self._graphs.clear()
        self._runners.clear()


@contextlib.contextmanager
def _cpu_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads in this thread, restoring the count after.

    OpenMP's team size is per calling thread, and a host stream runs on its own worker, so it is
    set around every call rather than once; both calls are cheap when nothing changes.
    """
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
