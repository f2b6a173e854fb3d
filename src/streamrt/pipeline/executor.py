"""The multi-stream pipeline executor.

How one item moves (stage ``j`` on stream ``S[j]`` of its lane):

1. ``submit(value)`` picks the item's lane (round-robin) and slot (the lane's ring). If that
   slot still holds an older item, the producer collects items in order until it is free: that
   is the backpressure, and the reason the steady state allocates nothing.
2. For each stage: ``S[j].wait(end[j-1])`` (skipped when ``S[j]`` is ``S[j-1]``), launch the
   stage, ``S[j].record(end[j])``. Stage ``j+1`` of item ``k`` waits for stage ``j`` of item
   ``k`` only, never for the device. ``end`` events are pre-allocated per slot and re-recorded.
3. A CUDA stream cannot wait on the GPU for a host event that is still pending, so when a CUDA
   stage follows a host stage that has not finished, the rest of the item's launches is queued
   on that host stream and runs on its worker thread, right after the host stage. With
   ``launch_thread`` every such continuation goes instead to the lane's ``launch`` host stream,
   behind a barrier on the host stage's event: the host stage's thread goes on with its next
   item while this one's CUDA stages are launched, and each stage is still launched by one
   thread, items in order.
4. Results are collected in input order: wait (on the host, with ``stage_timeout_s``) for the
   item's last event, run the collector, release the slot.

Errors: a stage that raises fails its item (the :class:`Result` carries a
:class:`~streamrt.errors.StageError`); later stages of that item are skipped, other items go on.
A result that does not arrive within ``stage_timeout_s`` raises
:class:`~streamrt.errors.StageTimeoutError` naming the stuck stage, and the pipeline refuses
further work (the stuck slot cannot be reused safely); ``close()`` then cancels.

Threading: one thread drives ``submit``/``get``/``map``/``close``. Host stages run on their
streams' worker threads; with ``launch_thread`` each lane has one more, its launcher.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from streamrt.device import get_device
from streamrt.device.base import Device
from streamrt.errors import ConfigError, PipelineClosedError, PipelineError, StageError, StageTimeoutError
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.pipeline.graphs import capture_graph
from streamrt.pipeline.ring import SlotState, lane_streams
from streamrt.pipeline.stage import Lane, Result, Slot, Stage, Workload
from streamrt.pipeline.tracing import PipelineTrace, TraceClock, add_item_spans

__all__ = ["Pipeline"]

logger = logging.getLogger(__name__)

Collector = Callable[[Slot, int], Any]


def _default_collect(slot: Slot, item: int) -> Any:
    return slot.output


class Pipeline:
    """Runs items through stages on several streams, in order, with bounded in-flight work.

    Example:
        >>> from streamrt.pipeline import Pipeline, PipelineConfig, Stage
        >>> def double(slot, item, stream):
        ...     slot.output = slot.input * 2
        >>> with Pipeline([Stage("double", double)], PipelineConfig(device="cpu")) as pipe:
        ...     [r.value for r in pipe.map(range(4))]
        [0, 2, 4, 6]
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        config: PipelineConfig | None = None,
        *,
        device: Device | None = None,
        setup_lane: Callable[[Lane], None] | None = None,
        setup_slot: Callable[[Slot], None] | None = None,
        collect: Collector | None = None,
    ) -> None:
        self._config = config or PipelineConfig()
        self._stages = tuple(stages)
        if not self._stages:
            raise ConfigError("a pipeline needs at least one stage")
        names = [s.name for s in self._stages]
        if len(set(names)) != len(names):
            raise ConfigError(f"stage names must be unique, got {names}")
        self._device = device if device is not None else get_device(self._config.device)
        self._collect = collect or _default_collect
        self._closed = False
        self._broken: PipelineError | None = None
        self._next_item = 0
        self._inflight: deque[SlotState] = deque()
        self._ready: deque[Result] = deque()
        self._nvtx: Any = None
        if self._config.nvtx and self._device.is_cuda:
            import torch

            try:  # fail here, not inside every stage, when this torch build has no NVTX
                torch.cuda.nvtx.range_push("streamrt")
                torch.cuda.nvtx.range_pop()
            except Exception as exc:
                raise ConfigError(f"nvtx=True but NVTX ranges are unavailable: {exc}") from exc
            self._nvtx = torch.cuda.nvtx
        self._lanes = [self._make_lane(w) for w in range(self._config.workers)]
        self._slots: list[list[SlotState]] = []
        try:
            for lane in self._lanes:
                if setup_lane is not None:
                    setup_lane(lane)
                slots = range(self._config.slots_per_lane)
                self._slots.append([self._make_slot(lane, i, setup_slot) for i in slots])
            if self._config.cuda_graphs and self._device.is_cuda:
                self._capture_graphs()
            if self._device.is_cuda:
                # Weights, constants and poisoned buffers were written on whatever stream was
                # current (usually the default stream). torch's streams are non-blocking: they do
                # not wait for the default stream, so make all of that land before the first item.
                self._device.synchronize()
                self._check_stream_pool()
        except BaseException:
            self._close_streams(cancel=True)
            raise
        # A private stream for the trace clock's reference event, created once (torch hands
        # out streams from a pool of 32 per device; creating one per reset would cycle it).
        self._clock_stream = self._device.stream("clock") if self._device.is_cuda else None
        self._clock: TraceClock
        self._trace: PipelineTrace
        self.reset_trace()
        logger.debug("pipeline %s on %s: %d lanes x %d slots", self._config.describe(), self._device,
                     len(self._lanes), self._config.slots_per_lane)

    @classmethod
    def from_workload(
        cls, workload: Workload, config: PipelineConfig | None = None, *, device: Device | None = None
    ) -> Pipeline:
        """A pipeline running ``workload``'s stages with its lane/slot setup and collector."""
        return cls(
            workload.stages(),
            config,
            device=device,
            setup_lane=workload.setup_lane,
            setup_slot=workload.setup_slot,
            collect=workload.collect,
        )

    # -- construction -------------------------------------------------------------------------

    def _make_lane(self, index: int) -> Lane:
        streams = lane_streams(self._device, self._stages, self._config.topology, index)
        after_host = any(b.is_cuda and not a.is_cuda for a, b in itertools.pairwise(streams))
        launcher = None
        # sync: its host stages run inline, done before the next launch, so there is nothing to overlap
        if self._config.launch_thread and after_host and self._config.topology is not Topology.SYNC:
            launcher = self._device.host_stream(f"lane{index}/launch")
        return Lane(index, self._device, streams, launcher=launcher)

    def _make_slot(self, lane: Lane, index: int, setup: Callable[[Slot], None] | None) -> SlotState:
        slot = Slot(index, lane, self._device, self._config.use_pinned)
        if setup is not None:
            setup(slot)
        return SlotState(slot, len(self._stages), self._config.trace)

    def _check_stream_pool(self) -> None:
        handles = [s.handle for lane in self._lanes for s in lane.unique_streams if s.is_cuda]
        if len(set(handles)) < len(handles):
            logger.warning(
                "this pipeline asks for %d CUDA streams but torch hands out streams from a pool of 32 per "
                "priority, so some lanes share one (correct, but serialised); use fewer workers or stream groups",
                len(handles),
            )

    def _capture_graphs(self) -> None:
        for states in self._slots:
            for state in states:
                slot = state.slot
                for j, stage in enumerate(self._stages):
                    stream = slot.lane.streams[j]
                    if not (stage.graphable and stream.is_cuda):
                        continue
                    try:
                        state.graphs[j] = capture_graph(partial(stage.fn, slot, -1, stream), stream)
                    except PipelineError as exc:
                        logger.warning("stage '%s' runs eagerly: %s", stage.name, exc)

    # -- properties ---------------------------------------------------------------------------

    @property
    def config(self) -> PipelineConfig:
        return self._config

    @property
    def device(self) -> Device:
        return self._device

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self._stages

    @property
    def lanes(self) -> list[Lane]:
        return list(self._lanes)

    @property
    def slots(self) -> list[Slot]:
        """Every slot of every lane (for tests that poison buffers, or for inspection)."""
        return [state.slot for states in self._slots for state in states]

    @property
    def in_flight(self) -> int:
        """Items submitted whose results have not been collected yet."""
        return len(self._inflight)

    @property
    def graphs_captured(self) -> int:
        """How many (slot, stage) CUDA graphs are replayed instead of eager launches."""
        return sum(g is not None for states in self._slots for s in states for g in s.graphs)

    # -- producer side ------------------------------------------------------------------------

    def submit(self, value: Any) -> int:
        """Start ``value`` through the pipeline and return its item index.

        Blocks while the item's slot still holds an older item (backpressure).

        Raises:
            PipelineClosedError: after ``close()``.
            StageTimeoutError: an older item did not finish within ``stage_timeout_s``.
        """
        self._check_usable()
        item = self._next_item
        workers = self._config.workers
        state = self._slots[item % workers][(item // workers) % self._config.slots_per_lane]
        while state.item is not None:
            self._collect_oldest()
        self._next_item += 1
        if self._trace.start_ms is None:
            self._trace.start_ms = self._clock.now_ms()
        state.begin(item, value)
        self._inflight.append(state)
        self._launch(state, 0)
        if self._config.topology is Topology.SYNC:
            self._collect_oldest()  # the naive loop: a host sync per item
        return item

    def _launch(self, state: SlotState, start: int, *, waited: bool = False) -> None:
        """Launch stages ``start..`` of the slot's item (see the module docstring, steps 2-3);
        ``waited``: the lane's launcher has waited for stage ``start - 1``."""
        lane = state.slot.lane
        streams = lane.streams
        try:
            for j in range(start, len(self._stages)):
                stream = streams[j]
                if j > 0 and streams[j - 1] is not stream:
                    previous = state.ends[j - 1]
                    after_host = stream.is_cuda and not streams[j - 1].is_cuda
                    if after_host and lane.launcher is not None and not (waited and j == start):
                        state.next_stage = j
                        lane.launcher.wait(previous)
                        lane.launcher.launch(partial(self._launch, state, j, waited=True))
                        return
                    if after_host and lane.launcher is None and not previous.query():
                        state.next_stage = j
                        streams[j - 1].launch(partial(self._launch, state, j))
                        return
                    stream.wait(previous)
                start_event = state.starts[j]
                if start_event is not None:
                    stream.record(start_event)
                stream.launch(partial(self._run_stage, state, j))
                stream.record(state.ends[j])
            state.next_stage = len(self._stages)
        except Exception as exc:
            # The scheduling itself failed (a closed stream, a CUDA error while recording): the
            # slot's work is in an unknown state, so the pipeline stops taking work.
            error = PipelineError(f"launching item {state.item} failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            state.error = state.error or error
            self._broken = self._broken or error
            logger.error("%s", error, exc_info=True)
        state.launched.set()

    def _run_stage(self, state: SlotState, j: int) -> None:
        """The stage wrapper every stream runs: skip after a failure, time, NVTX, catch."""
        if state.error is not None:
            return
        stage = self._stages[j]
        graph = state.graphs[j]
        item = -1 if state.item is None else state.item
        t0 = time.perf_counter()
        if self._nvtx is not None:
            self._nvtx.range_push(f"{stage.name} #{item}")
        try:
            if graph is not None:
                graph.replay()
            else:
                stage.fn(state.slot, item, state.slot.lane.streams[j])
        except Exception as exc:
            state.error = StageError(stage.name, item, exc)
            logger.debug("stage '%s' failed on item %s", stage.name, state.item, exc_info=True)
        finally:
            if self._nvtx is not None:
                self._nvtx.range_pop()
        state.host_t0[j] = t0
        state.host_t1[j] = time.perf_counter()
        state.thread[j] = threading.current_thread().name
        state.ran[j] = True

    # -- consumer side ------------------------------------------------------------------------

    def _collect_oldest(self) -> None:
        """Wait for the oldest in-flight item, collect it into the ready queue, free its slot."""
        state = self._inflight[0]
        timeout = self._config.stage_timeout_s
        deadline = time.perf_counter() + timeout
        done = state.launched.wait(timeout) and state.ends[-1].wait(max(0.0, deadline - time.perf_counter()))
        if not done:
            raise self._timed_out(state, timeout)
        self._inflight.popleft()
        item = state.item if state.item is not None else -1
        value, error = None, state.error
        if error is None:
            try:
                value = self._collect(state.slot, item)
            except Exception as exc:
                error = StageError("collect", item, exc)
        latency = time.perf_counter() - state.submitted
        self._record(state, item, latency, error is not None)
        state.release()
        self._ready.append(Result(item, value, error, latency))

    def _collect_done(self) -> None:
        """Collect, without blocking, the oldest items that have already finished."""
        while self._inflight:
            state = self._inflight[0]
            if not (state.launched.is_set() and state.ends[-1].query()):
                return
            self._collect_oldest()

    def _timed_out(self, state: SlotState, timeout: float) -> StageTimeoutError:
        stuck = next(
            (j for j in range(state.next_stage) if not state.ends[j].query()),
            max(state.next_stage - 1, 0),
        )
        stage = self._stages[stuck]
        error = StageTimeoutError(
            f"stage '{stage.name}' did not finish item {state.item} within {timeout:g} s "
            f"(stream '{state.slot.lane.streams[stuck].name}')",
            hint="a stage is stuck or waits for something that never happens; raise stage_timeout_s "
            "if it is only slow",
        )
        self._broken = error
        return error

    def get(self) -> Result:
        """The next result in input order, waiting for it if needed.

        Raises:
            PipelineError: nothing is in flight, or the pipeline is broken.
            StageTimeoutError: the item did not finish within ``stage_timeout_s``.
        """
        if not self._ready:
            if self._broken is not None:
                raise self._broken
            if not self._inflight:
                if self._closed:
                    raise PipelineClosedError("the pipeline is closed and every result was taken")
                raise PipelineError("get() with nothing in flight", hint="submit() an item first")
            self._collect_oldest()
        return self._ready.popleft()

    def poll(self) -> list[Result]:
        """Results that are ready now, in order, without blocking."""
        if self._broken is None:
            self._collect_done()
        out = list(self._ready)
        self._ready.clear()
        return out

    def map(self, values: Iterable[Any]) -> Iterator[Result]:
        """Submit every value and yield results in input order as they become ready."""
        for value in values:
            self.submit(value)
            yield from self.poll()
        while self._inflight or self._ready:
            yield self.get()

    # -- tracing ------------------------------------------------------------------------------

    def reset_trace(self) -> None:
        """Start a new trace window (e.g. after warm-up); latencies and spans restart."""
        self._clock = TraceClock(self._clock_stream)
        self._trace = PipelineTrace(
            self._config.describe(),
            meta={"device": self._device.kind, **self._config.to_dict()},
        )

    def trace(self) -> PipelineTrace:
        """The trace of the current window (spans only with ``config.trace``)."""
        return self._trace

    def _record(self, state: SlotState, item: int, latency_s: float, failed: bool) -> None:
        self._trace.add_latency(latency_s * 1e3)
        self._trace.end_ms = self._clock.now_ms()
        if self._config.trace:
            add_item_spans(self._trace, self._clock, self._stages, state, item, failed)

    # -- shutdown -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise PipelineClosedError("submit() after close()", hint="create a new Pipeline")
        if self._broken is not None:
            raise PipelineError(f"the pipeline is unusable after an earlier failure: {self._broken}",
                                hint="close() it and create a new one")

    def _close_streams(self, *, cancel: bool) -> bool:
        ok = True
        for lane in self._lanes:  # a launcher first: it launches onto the others
            for stream in ([lane.launcher] if lane.launcher is not None else []) + lane.unique_streams:
                ok = stream.close(cancel=cancel, timeout=self._config.close_timeout_s) and ok
        return ok

    def close(self, *, cancel: bool = False) -> None:
        """Finish (or with ``cancel`` abandon) in-flight work, stop workers and free buffers.

        Draining keeps the results: ``get()``/``poll()`` still return them after ``close()``.
        Cancelling skips queued host work and discards in-flight results; CUDA work already
        enqueued cannot be cancelled and is waited for. Buffers are released only once every
        stream has stopped, so no kernel can touch freed memory.
        """
        if self._closed:
            return
        self._closed = True
        if not cancel and self._broken is None:
            try:
                while self._inflight:
                    self._collect_oldest()
            except PipelineError as exc:
                logger.warning("close(): cancelling after %s", exc)
                cancel = True
        stopped = self._close_streams(cancel=cancel)
        self._inflight.clear()
        if not stopped:
            logger.error("close(): some streams did not stop within %s s; keeping their buffers alive",
                         self._config.close_timeout_s)
            return
        for states in self._slots:
            for state in states:
                state.graphs = [None] * len(state.graphs)
                state.slot.buffers.clear()
        for lane in self._lanes:
            lane.state.clear()
        self._slots = []

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(cancel=exc_type is not None)
