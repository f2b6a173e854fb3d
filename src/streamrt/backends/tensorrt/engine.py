"""Runtime side of the TensorRT backend: engines, execution contexts on pipeline streams, profiler.

**Never executed in this repository's environment** (TensorRT cannot be installed here); see
``docs/tensorrt.md`` for the source of every call and ``tests/backends/test_tensorrt.py``.

Only the name-based tensor API is used (``num_io_tensors``, ``get_tensor_name/mode/dtype``,
``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``). Device memory comes from
torch's caching allocator, and work is enqueued on the caller's stream: ``infer(inputs,
stream)`` takes a StreamRT ``CudaStream`` (its ``.torch``), a ``torch.cuda.Stream`` or a raw
``cudaStream_t``. On the legacy default stream (where ``execute_async_v3`` costs extra device
synchronisations) the context works on a stream of its own that waits for, and is waited on
by, the caller's stream. ``infer`` never synchronises with the host, except to hand NumPy
outputs back for NumPy inputs.

Contexts follow TensorRT's rules: one context per concurrent stream (each has its own
activation memory), used by one thread at a time (a lock serialises calls). A context called on
a new stream first waits for its previous enqueue, since both would use the same activation
memory. The optimization profile is chosen per call with ``set_optimization_profile_async`` on
the enqueue stream, before the input shapes are set. Shapes outside every profile are rejected
by :meth:`Engine.validate` before TensorRT is called.

Outputs whose shape depends on the data (``-1`` after the inputs are set) are sized by an
``IOutputAllocator`` and copied out. ``input_consumed`` is an event TensorRT records once the
inputs have been read (``set_input_consumed_event``), so a pipeline can refill input slots early.

CUDA graphs (``create_context(cuda_graph=True)``): after a warm-up enqueue (the first enqueue
after a shape change allocates, which cannot be captured), one enqueue is captured with static
input and output buffers; each call copies the inputs in, replays, and returns copies of the
outputs. A captured graph is only valid for the context state it was captured in, so a shape or
profile change drops it and captures again; a failed capture falls back to plain enqueues.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorrt as trt
import torch

from streamrt.backends.base import Engine, ExecutionContext, LayerTiming
from streamrt.backends.tensorrt import compat
from streamrt.errors import InferenceError, PlanFormatError, ShapeError, StreamRTError
from streamrt.plan import PlanManifest
from streamrt.types import DType, format_shape

if TYPE_CHECKING:
    from streamrt.device.base import StreamLike

__all__ = ["TensorRTContext", "TensorRTEngine"]

log = logging.getLogger(__name__)
_ALIGNMENT = 256  # IExecutionContext::setTensorAddress: "The pointer must have at least 256-byte alignment."


class TensorRTEngine(Engine):
    """A deserialized TensorRT engine. Create one :class:`TensorRTContext` per concurrent stream."""

    def __init__(self, manifest: PlanManifest, payload: bytes) -> None:
        super().__init__(manifest)
        self.device_kind = "cuda"
        self._settings = dict(manifest.build_settings.get("backend", {}))
        self._runtime = trt.Runtime(compat.get_logger(trt))
        if manifest.extra.get("tensorrt", {}).get("version_compatible"):
            # A version-compatible plan embeds a lean runtime (host code); StreamRT checked the plan.
            self._runtime.engine_host_code_allowed = True
        with compat.LOGS.capture() as messages:
            engine = self._runtime.deserialize_cuda_engine(payload)
        if engine is None:
            detail = "; ".join(m.strip().splitlines()[0][:300] for _, m in messages[-3:]) or "no message"
            raise PlanFormatError(
                f"TensorRT {trt.__version__} could not deserialize the plan's engine: {detail}",
                hint=f"rebuild the plan here: {manifest.build_command}",
            )
        self._engine: Any = engine
        self._io = _read_io(engine)
        self._check_io()
        self._input_names = [s.name for s in manifest.inputs if s.name in self._io]
        self._output_names = [s.name for s in manifest.outputs]
        self._output_dtypes = {name: self._io[name][1].torch for name in self._output_names}

    def _check_io(self) -> None:
        want = {s.name: (True, s.dtype) for s in self.manifest.inputs}
        want.update({s.name: (False, s.dtype) for s in self.manifest.outputs})
        # TensorRT may drop a graph input that no node reads; it is then accepted and ignored.
        unused = {name for name, (is_input, _) in want.items() if is_input and name not in self._io}
        if {k: v for k, v in want.items() if k not in unused} != self._io:
            raise PlanFormatError(
                f"the TensorRT engine's I/O tensors {sorted(self._io)} do not match the plan's manifest {sorted(want)}"
            )
        if self._engine.num_optimization_profiles != len(self.manifest.profiles):
            raise PlanFormatError(
                f"the TensorRT engine has {self._engine.num_optimization_profiles} optimization profiles, "
                f"the manifest {len(self.manifest.profiles)}"
            )

    @property
    def trt_engine(self) -> Any:
        """The ``trt.ICudaEngine`` (for advanced use; StreamRT's contexts cover inference)."""
        if self._engine is None:  # set to None by close() only
            raise self.closed_error()
        return self._engine

    def create_context(self, *, cuda_graph: bool | None = None) -> TensorRTContext:
        """A new execution context. ``cuda_graph`` defaults to the plan's ``cuda_graphs`` option."""
        if cuda_graph is None:
            cuda_graph = bool(self._settings.get("cuda_graphs", False))
        return TensorRTContext(self, cuda_graph=cuda_graph)

    def inspect_layers(self) -> dict[str, Any]:
        """Layers and I/O tensors from TensorRT's engine inspector (for ``streamrt inspect``).

        Returns ``{"layers": [{"name", "type", "details"}], "io_tensors": [...],
        "profiling_verbosity": ...}``; ``details`` holds TensorRT's own fields (tactic, formats,
        ...) for plans built with DETAILED profiling verbosity, which StreamRT always uses.
        """
        inspector = self.trt_engine.create_engine_inspector()
        text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        info = compat.normalize_inspector(json.loads(text))
        info["profiling_verbosity"] = self._settings.get("profiling_verbosity")
        return info

    def profile_layers(self, inputs: Mapping[str, Any], iterations: int = 10) -> list[LayerTiming]:
        """Per-layer times from ``IProfiler`` on a context of its own, after one unprofiled warm-up.

        With a profiler attached, each enqueue is synchronous and reports every layer, so these
        times are for finding hot layers, not for throughput (``streamrt bench`` measures that).
        """
        self.validate(inputs)
        stream = torch.cuda.Stream()
        feeds = {name: _device_input(value) for name, value in inputs.items()}
        profiler = _LayerProfiler()
        ctx = self.create_context(cuda_graph=False)
        try:
            ctx.infer(feeds, stream)
            stream.synchronize()
            ctx.trt_context.profiler = profiler
            for _ in range(iterations):
                ctx.infer(feeds, stream)
            stream.synchronize()
        finally:
            ctx.close()
        types = {row["name"]: row["type"] for row in self.inspect_layers()["layers"]}
        rows = [LayerTiming(name, types.get(name, "?"), ms, calls) for name, (ms, calls) in profiler.rows.items()]
        return sorted(rows, key=lambda r: r.total_ms, reverse=True)

    def close(self) -> None:
        super().close()
        self._engine = None
        self._runtime = None


def _read_io(engine: Any) -> dict[str, tuple[bool, DType]]:
    io = {}
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        if is_input and engine.get_tensor_location(name) == trt.TensorLocation.HOST:
            raise PlanFormatError(
                f"input '{name}' is a shape tensor on the host; StreamRT's TensorRT contexts pass device tensors only"
            )
        io[name] = (is_input, compat.dtype_from_trt(engine.get_tensor_dtype(name)))
    return io


class _LayerProfiler(trt.IProfiler):
    """Sums ``report_layer_time`` calls per layer: ``rows[name] = (total_ms, calls)``."""

    def __init__(self) -> None:
        trt.IProfiler.__init__(self)
        self.rows: dict[str, tuple[float, int]] = {}

    def report_layer_time(self, layer_name: str, ms: float) -> None:
        total, calls = self.rows.get(layer_name, (0.0, 0))
        self.rows[layer_name] = (total + float(ms), calls + 1)


class _OutputAllocator(trt.IOutputAllocator):
    """Device memory for an output whose shape is only known during ``execute_async_v3``.

    TensorRT calls ``reallocate_output_async`` (``reallocate_output`` on bindings that lack the
    async variant) and then ``notify_shape``, both before ``execute_async_v3`` returns. The buffer
    is reused across calls; :meth:`take` returns a copy of the valid part.
    """

    def __init__(self) -> None:
        trt.IOutputAllocator.__init__(self)
        self.buffer: Any = None
        self.shape: tuple[int, ...] = ()

    def _grow(self, size: int) -> int:
        size = max(int(size), 1)
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.uint8, device="cuda")
        return int(self.buffer.data_ptr())

    def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
        return self._grow(size)

    def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int, stream: int) -> int:
        return self._grow(size)

    def notify_shape(self, tensor_name: str, shape: Any) -> None:
        self.shape = tuple(int(d) for d in shape)

    def take(self, dtype: Any) -> Any:
        count = int(np.prod(self.shape)) if self.shape else 1
        if count == 0 or self.buffer is None:
            return torch.empty(self.shape, dtype=dtype, device="cuda")
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        return self.buffer[:nbytes].view(dtype).view(self.shape).clone()


@dataclass
class _Graph:
    key: tuple[Any, ...]
    graph: Any
    inputs: dict[str, Any]
    outputs: dict[str, Any]


class TensorRTContext(ExecutionContext):
    """One ``IExecutionContext``: runs the engine on the caller's stream, one thread at a time.

    Example (on a GPU machine with TensorRT):
        >>> ctx = streamrt.load("yolo.plan").create_context()           # doctest: +SKIP
        >>> out = ctx.infer({"images": frames}, stream)                   # doctest: +SKIP
        >>> copy_stream.wait(ctx.input_consumed)  # refill the input slot  # doctest: +SKIP
    """

    engine: TensorRTEngine

    def __init__(self, engine: TensorRTEngine, *, cuda_graph: bool) -> None:
        super().__init__(engine)
        self.cuda_graph = cuda_graph
        with compat.LOGS.capture() as messages:
            ctx = engine.trt_engine.create_execution_context()
        if ctx is None:
            detail = "; ".join(m for _, m in messages[-3:]) or compat.LOGS.last_errors()
            raise InferenceError(
                f"TensorRT could not create an execution context: {detail}",
                hint="each context allocates its own activation memory: free GPU memory or use fewer contexts",
            )
        self._ctx: Any = ctx
        self._lock = threading.Lock()
        self._profile: int | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._addresses: dict[str, int] = {}
        self._allocators: dict[str, _OutputAllocator] = {}
        self._consumed: Any = None
        self._done = torch.cuda.Event()
        self._last_stream: int | None = None
        self._side: Any = None
        self._graph: _Graph | None = None
        self._no_graph: set[tuple[Any, ...]] = set()
        self._scratch_buffer: Any = None

    @property
    def trt_context(self) -> Any:
        """The ``trt.IExecutionContext``."""
        return self._ctx

    @property
    def active_profile(self) -> int | None:
        """Index of the optimization profile the last call used (None before the first call)."""
        return self._profile

    @property
    def input_consumed(self) -> Any:
        """A StreamRT ``CudaEvent`` that completes once the latest call's inputs have been read.

        Wait on it (``stream.wait(ctx.input_consumed)``) before overwriting those input buffers;
        outputs are ready only when the inference stream itself gets there. None before the first call.
        """
        return self._consumed

    def infer_into(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], stream: StreamLike | None = None
    ) -> dict[str, Any]:
        """Like ``infer``, but write into caller-owned device tensors (pre-allocated slots, no allocation).

        Raises:
            InferenceError: an output is missing, or has the wrong shape, dtype, device or alignment,
                or its shape depends on the data.
        """
        profile = self.engine.validate(inputs)
        missing = [name for name in self.engine._output_names if name not in outputs]
        if missing:
            raise InferenceError(f"infer_into needs a tensor for every output; missing {missing}")
        return self._run(inputs, profile, stream, outputs)

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: StreamLike | None) -> dict[str, Any]:
        as_numpy = any(isinstance(v, np.ndarray) for v in inputs.values())
        return self._run(inputs, profile, stream, None, as_numpy=as_numpy)

    def _run(
        self,
        inputs: Mapping[str, Any],
        profile: int,
        stream: Any,
        provided: Mapping[str, Any] | None,
        *,
        as_numpy: bool = False,
    ) -> dict[str, Any]:
        if self._ctx is None:
            raise InferenceError("this TensorRT execution context is closed")
        with self._lock, self._stream_for(stream) as (s, caller):
            tensors = {name: _device_input(inputs[name]) for name in self.engine._input_names}
            try:
                self._prepare(s, profile, tensors)
                if self.cuda_graph:
                    outs = self._run_graph(s, profile, tensors, provided)
                else:
                    outs = self._enqueue(s, tensors, provided)
            except StreamRTError:
                raise
            except Exception as exc:  # TensorRT's bindings raise RuntimeError/TypeError
                raise InferenceError(f"TensorRT failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
            self._done.record(s)
            self._last_stream = int(s.cuda_stream)
            if caller is not s:  # tensors crossed from the caller's stream to ours and back
                for t in tensors.values():
                    t.record_stream(s)
                for t in outs.values():
                    t.record_stream(caller)
            if as_numpy:  # copied on the inference stream, which the host then waits for
                return {name: _to_numpy(value) for name, value in outs.items()}
        return outs

    @contextmanager
    def _stream_for(self, stream: Any) -> Iterator[tuple[Any, Any]]:
        caller = _torch_stream(stream)
        if int(caller.cuda_stream) != 0:
            with torch.cuda.stream(caller):
                yield caller, caller
            return
        if self._side is None:
            self._side = torch.cuda.Stream()
        side = self._side
        side.wait_stream(caller)
        try:
            with torch.cuda.stream(side):
                yield side, caller
        finally:
            caller.wait_stream(side)

    def _prepare(self, s: Any, profile: int, tensors: Mapping[str, Any]) -> None:
        handle = int(s.cuda_stream)
        if self._last_stream is not None and self._last_stream != handle:
            s.wait_event(self._done)
        if profile != self._profile:
            self._ctx.set_optimization_profile_async(profile, handle)  # raises RuntimeError on failure
            self._profile = profile
            self._shapes.clear()
            self._addresses.clear()
            self._graph = None
        for name, t in tensors.items():
            shape = tuple(int(d) for d in t.shape)
            if self._shapes.get(name) != shape:
                if not self._ctx.set_input_shape(name, shape):
                    raise ShapeError(
                        f"TensorRT rejected shape {format_shape(shape)} for input '{name}' in profile {profile}: "
                        f"{compat.LOGS.last_errors()}"
                    )
                self._shapes[name] = shape
        if self._consumed is None:
            from streamrt.device.cuda import CudaEvent

            event = CudaEvent()
            event.torch.record(s)  # torch creates the CUDA event lazily, at its first record
            if not self.cuda_graph and not self._ctx.set_input_consumed_event(int(event.torch.cuda_event)):
                raise InferenceError(f"TensorRT refused the input-consumed event: {compat.LOGS.last_errors()}")
            self._consumed = event

    def _address(self, name: str, tensor: Any) -> None:
        ptr = int(tensor.data_ptr()) if tensor.numel() else int(self._scratch().data_ptr())
        if self._addresses.get(name) != ptr:
            if not self._ctx.set_tensor_address(name, ptr):
                raise InferenceError(f"TensorRT refused the address of tensor '{name}': {compat.LOGS.last_errors()}")
            self._addresses[name] = ptr

    def _scratch(self) -> Any:
        if self._scratch_buffer is None:
            self._scratch_buffer = torch.empty(_ALIGNMENT, dtype=torch.uint8, device="cuda")
        return self._scratch_buffer

    def _outputs(self, provided: Mapping[str, Any] | None) -> dict[str, Any]:
        """Output tensors at the shapes TensorRT computed; None for data-dependent ones."""
        outs: dict[str, Any] = {}
        for name in self.engine._output_names:
            shape = tuple(int(d) for d in self._ctx.get_tensor_shape(name))
            dtype = self.engine._output_dtypes[name]
            if any(d < 0 for d in shape):
                if provided is not None:
                    raise InferenceError(f"output '{name}' has a data-dependent shape; infer_into cannot write it")
                if name not in self._allocators:
                    self._allocators[name] = _OutputAllocator()
                    self._ctx.set_output_allocator(name, self._allocators[name])
                outs[name] = None
            elif provided is not None:
                outs[name] = _check_provided(name, provided[name], shape, dtype)
            else:
                outs[name] = torch.empty(shape, dtype=dtype, device="cuda")
        return outs

    def _enqueue(self, s: Any, tensors: Mapping[str, Any], provided: Mapping[str, Any] | None) -> dict[str, Any]:
        outs = self._outputs(provided)
        for name, t in tensors.items():
            self._address(name, t)
        for name, t in outs.items():
            if t is not None:
                self._address(name, t)
        if not self._ctx.execute_async_v3(int(s.cuda_stream)):
            raise InferenceError(f"TensorRT execute_async_v3 failed: {compat.LOGS.last_errors()}")
        for name, t in outs.items():
            if t is None:
                outs[name] = self._allocators[name].take(self.engine._output_dtypes[name])
        return outs

    def _run_graph(
        self, s: Any, profile: int, tensors: Mapping[str, Any], provided: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        key = (profile, *((name, tuple(t.shape)) for name, t in tensors.items()))
        if key in self._no_graph:
            return self._enqueue(s, tensors, provided)
        if self._graph is None or self._graph.key != key:
            self._graph = self._capture(s, key, tensors)
            if self._graph is None:
                self._no_graph.add(key)
                return self._enqueue(s, tensors, provided)
        graph = self._graph
        targets = None
        if provided is not None:
            targets = {n: _check_provided(n, provided[n], tuple(t.shape), t.dtype) for n, t in graph.outputs.items()}
        for name, t in tensors.items():
            graph.inputs[name].copy_(t, non_blocking=True)
        self._consumed.torch.record(s)  # inputs are consumed once copied into the static buffers
        graph.graph.replay()
        if targets is not None:
            for name, t in graph.outputs.items():
                targets[name].copy_(t, non_blocking=True)
            return targets
        return {name: t.clone() for name, t in graph.outputs.items()}

    def _capture(self, s: Any, key: tuple[Any, ...], tensors: Mapping[str, Any]) -> _Graph | None:
        outs = self._outputs(None)
        if any(t is None for t in outs.values()):
            log.warning("CUDA graphs are off for this engine: an output has a data-dependent shape")
            return None
        static = {name: t.clone() for name, t in tensors.items()}
        for name, t in (*static.items(), *outs.items()):
            self._address(name, t)
        # The first enqueue after a shape change allocates and initialises: never inside a capture.
        if not self._ctx.execute_async_v3(int(s.cuda_stream)):
            raise InferenceError(f"TensorRT execute_async_v3 failed: {compat.LOGS.last_errors()}")
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                ok = self._ctx.execute_async_v3(int(torch.cuda.current_stream().cuda_stream))
            if not ok:
                raise RuntimeError(compat.LOGS.last_errors())
        except Exception as exc:  # capture invalidated, a plugin that cannot be captured, ...
            log.warning(
                "CUDA-graph capture of the TensorRT engine failed for %s (%s); running without a graph", key, exc
            )
            return None
        log.debug("captured a CUDA graph for %s", key)
        return _Graph(key, graph, static, outs)

    def close(self) -> None:
        with self._lock:
            self._graph = None
            self._allocators.clear()
            self._ctx = None


def _torch_stream(stream: Any) -> Any:
    if stream is None:
        return torch.cuda.current_stream()
    value = getattr(stream, "torch", stream)
    if isinstance(value, int):
        return torch.cuda.ExternalStream(value)
    if not isinstance(value, torch.cuda.Stream):
        raise InferenceError(
            f"the tensorrt backend runs on CUDA streams; got {type(stream).__name__}",
            hint="pass a streamrt CUDA stream (get_device('cuda').stream(...)) or a torch.cuda.Stream",
        )
    return value


def _device_input(value: Any) -> Any:
    """A contiguous, 256-byte aligned CUDA tensor (copied only when it is not one already)."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        if array.dtype.name == "bfloat16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        return tensor.to("cuda")
    tensor = value if value.is_cuda else value.to("cuda", non_blocking=True)
    if not tensor.is_contiguous():
        return tensor.contiguous()
    if tensor.data_ptr() % _ALIGNMENT:
        return tensor.clone()
    return tensor


def _check_provided(name: str, tensor: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    if (
        tuple(tensor.shape) != shape
        or tensor.dtype != dtype
        or not tensor.is_cuda
        or not tensor.is_contiguous()
        or tensor.data_ptr() % _ALIGNMENT
    ):
        raise InferenceError(
            f"output '{name}' must be a contiguous, 256-byte aligned CUDA tensor of shape {format_shape(shape)} "
            f"and dtype {dtype}; got {format_shape(tuple(tensor.shape))} {tensor.dtype} on {tensor.device}"
        )
    return tensor


def _to_numpy(tensor: Any) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return np.asarray(tensor.view(torch.int16).cpu().numpy().view(DType.BFLOAT16.numpy))
    return np.asarray(tensor.cpu().numpy())
