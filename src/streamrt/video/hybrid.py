"""Hybrid decode: streams on NVDEC while it has room, on CPU decoders beyond, moved as measurements say.

:class:`HybridDecode` opens one :class:`HybridSource` per video, each decoded either by an NVDEC
session (:class:`~streamrt.video.decode_nvdec.NvdecPool`, primary context and kept decoders: the
:class:`~streamrt.video.decode_nvdec.NvdecOptions` default) or by a CPU decoder on a thread of its own
(:func:`~streamrt.video.decoding.open_nv12`: PyAV, else OpenCV, behind a
:class:`~streamrt.video.sources.Prefetch`).
Both deliver NV12 (a device tensor from NVDEC, a host array from the CPU), so streams of both
kinds share one detection pipeline and one batch: the workload's ``gather`` stage copies each
picture into place and the fused kernel converts them all.

With ``decode_processes > 0`` **nothing decodes in the consumer process**: the NVDEC sessions run in
``decode_processes`` decoder processes (:class:`~streamrt.video.decode_processes.ProcessDecodePool`,
pictures by CUDA IPC) and the CPU streams in ``cpu_processes`` more (the same pool, ``kind="cpu"``,
pictures through host shared memory). A CPU decoder as a thread of the consumer (the ``Prefetch`` of the
in-process mode) decodes and converts 1080p frames holding the GIL for part of every frame: on the
H200, 185 streams with 40-73 of them beside the thread feeding the engine achieved 32.7 FPS in all, the
trace binding on the consumer's main thread (GIL contention is the diagnosis, not yet measured). In
this mode :class:`HybridDecode` is itself a pool of ready lanes (:meth:`HybridDecode.take_ready`), so
the detector's live reader (``DetectConfig(live_reader="auto")``) reads all its streams, whichever
decoder holds them, from one :class:`~streamrt.video.live_group.LiveGroup` thread: no thread per stream.
A move there does not stall the other streams: the destination lane is opened on the monitor's thread
at the frame the stream had reached, the stream keeps reading its old lane meanwhile, and at the
switch the new lane's first pictures, up to the frame reached by then, are dropped unseen.

The choice is :class:`~streamrt.video.hybrid_policy.HybridPolicy`'s, from capacities measured
before the run (:func:`measure_capacity`) and, while it runs, from what each pool delivers:
every ``interval_s`` the sources' counters (frames delivered, reads that had to wait for the
decoder) become observations, and the policy's moves are applied: a moved stream closes its
decoder and reopens on the other at the frame it had reached. :meth:`HybridDecode.summary` goes
into the run report (``RunReport.decode``).

Example:
    >>> hybrid = HybridDecode(["a.mp4", "b.mp4"], capacity={"cpu": 200.0})       # doctest: +SKIP
    >>> report = run_detection(detector, hybrid.sources(), DetectConfig())      # doctest: +SKIP
    >>> report.decode = hybrid.summary()                                        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from streamrt._features import cuda_available
from streamrt.errors import ConfigError
from streamrt.video.decoding import open_nv12, start_over
from streamrt.video.hybrid_capacity import (
    CONSUMER_CORES,
    CPU_DECODER_NICENESS,
    cpu_decoder_processes,
    measure_capacity,
    measure_cpu_decode,
    measure_cpu_decode_together,
    measure_hybrid_capacity,
    measure_hybrid_capacity_for_plan,
)
from streamrt.video.hybrid_policy import DEFAULT_HEADROOM, HybridPolicy
from streamrt.video.live_group import ReadyPictures
from streamrt.video.sources import Prefetch, SourceError, SourceInfo

# the capacity measurements live in hybrid_capacity; their names are kept here, where they were first
__all__ = ["CONSUMER_CORES", "CPU_DECODER_NICENESS", "HybridDecode", "HybridSource", "cpu_decoder_processes",
           "measure_capacity", "measure_cpu_decode", "measure_cpu_decode_together", "measure_hybrid_capacity"]

log = logging.getLogger(__name__)

# A read that waited longer than this for its decoder counts as starved.
STARVED_S = 0.002


class HybridSource:
    """One stream of a :class:`HybridDecode`: NV12 pictures from whichever decoder holds it now."""

    frame_format = "nv12"

    def __init__(self, owner: HybridDecode, index: int, path: Path, decoder: str, impl: Any, first: int = 0) -> None:
        self._owner, self.index, self.path = owner, index, path
        self.first = first  # the file's frame the stream started at
        self.decoder = decoder
        self._impl: Any = impl
        self._pending: str | None = None
        # decoder processes: (decoder, its opened lane, the frame it starts at), ready for the reader to take
        self._incoming: tuple[str, Any, int] | None = None
        self._behind = 0  # pictures of the new lane before the frame reached: dropped unseen
        self._wanted: float | None = None  # when the live group first found no picture ready
        self._info = SourceInfo(path.name, impl.info.width, impl.info.height, impl.info.fps, None)
        self.read_count = 0
        self.starved = 0
        self.removed = False  # HybridDecode.remove: no longer decoded
        self.moves = 0
        self.move_drops = 0  # pictures decoded twice because of a move (the new lane's, before the frame reached)

    @property
    def info(self) -> SourceInfo:
        return self._info

    @property
    def pool_lane(self) -> tuple[HybridDecode, int] | None:
        """With decoder processes: the hybrid and this stream's index, so the detector's live reader reads every
        stream from one :class:`~streamrt.video.live_group.LiveGroup`
        (:func:`~streamrt.video.live_group.shared_lanes`); None otherwise (a thread per stream)."""
        return (self._owner, self.index) if self._owner.grouped else None

    def switch(self, decoder: str) -> None:
        """Move to ``decoder`` at the frame reached.

        In-process decoders: the move happens before the next read, on the reader's thread. Decoder
        processes: the destination lane opens now, on the caller's thread (the monitor's), while the reader
        goes on reading the old one; the reader switches over when it next reads.
        """
        if not self._owner.grouped:
            self._pending = decoder
            return
        with self._owner._moving:
            incoming = self._incoming
            if self.removed or (incoming is not None and incoming[0] == decoder):
                return
            if incoming is not None:  # moved back before it arrived: that lane is not needed
                self._incoming = None
                self._owner._remove(incoming[1])
            if decoder == self.decoder:
                return
            start = self.read_count
        lane = self._owner._open_lanes(decoder, [(self.path, self.first + start)])[0]
        with self._owner._moving:
            removed = self.removed  # removed while its new lane opened: that lane is not needed either
            if not removed:
                self._incoming = (decoder, lane, start)
        if removed:
            self._owner._remove(lane)

    def _arrive(self) -> None:
        """Take over a lane opened by :meth:`switch` (the reader's thread)."""
        if self._pending is not None and self._pending != self.decoder:  # in-process decoders
            self._impl.close()
            self._owner._closed(self.index, self.decoder)
            self.decoder, self._pending = self._pending, None
            self._impl = self._owner._open(self.index, self.path, self.decoder, skip=self.first + self.read_count)
            self.moves += 1
            return
        if self._incoming is None:
            return
        with self._owner._moving:
            if self._incoming is None:
                return
            decoder, lane, start = self._incoming
            old, self._incoming = self._impl, None
            self._impl, self.decoder = lane, decoder
        self._owner._remove(old)
        self._behind = self.read_count - start
        self.move_drops += self._behind
        self.moves += 1

    def read(self) -> Any:
        if self.removed:
            return None
        self._arrive()
        started = time.perf_counter()
        while self._behind > 0:
            if self._impl.read() is None:
                return None
            self._behind -= 1
        picture = self._impl.read()
        if time.perf_counter() - started > STARVED_S:
            self.starved += 1
        if picture is not None:
            self.read_count += 1
        return picture

    def skip(self, count: int) -> int:
        self._arrive()
        if self._behind:
            self._behind -= int(self._impl.skip(self._behind))
        n = int(self._impl.skip(count))
        self.read_count += n
        return n

    def stats(self) -> Any:
        return _Stats({"decoder": self.decoder, "moves": self.moves, "starved_reads": self.starved,
                       "move_drops": self.move_drops})

    def close(self) -> None:
        if not self.removed:  # a removed stream's decoder is closed (in-process) or gone (decoder processes)
            self._impl.close()


class _Stats:
    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)


class HybridDecode:
    """Streams over NVDEC and CPU decoders (see the module docstring).

    Args:
        paths: one video file per stream.
        capacity: frames/s per pool (``nvdec``, ``cpu``); None measures them: with decoder processes both sides
            decoding at once (alone, each side over-states what it gives beside the other), with as many NVDEC
            sessions as the plan puts there
            (:func:`~streamrt.video.hybrid_capacity.measure_hybrid_capacity_for_plan`; the measurement is kept in
            ``measured``), else each side alone (:func:`measure_capacity`, the CPU side with the cores given to
            CPU decoders).
        policy: a ready policy (tests); overrides ``capacity``.
        fps: each stream's demand; None uses the files' frame rates.
        loop: start files over at their end (benchmarks).
        cpu_threads: FFmpeg threads per CPU-decoded stream (in-process CPU decoders).
        nvdec_workers: host threads driving the NVDEC sessions.
        decode_processes: run the NVDEC sessions in this many decoder processes, pictures handed over by
            CUDA IPC (:class:`~streamrt.video.decode_processes.ProcessDecodePool`: one process binds NVDEC
            at ~2,000-2,800 frames/s on an H200, 4 reach its engines' bound), and the CPU streams in
            ``cpu_processes`` more; 0 drives NVDEC with ``nvdec_workers`` threads in this process and runs
            each CPU stream on a thread of this process.
        cpu_processes: CPU decoder processes when ``decode_processes > 0`` (streams dealt round-robin, a
            thread per stream inside each); None: :func:`cpu_decoder_processes` (the cores less those of the
            consumer and of the NVDEC processes).
        process_kind: what the NVDEC side's processes decode with: ``nvdec``, or ``cpu`` (the CI stand-in).
        upload: decoder processes: CPU decoders' pictures are delivered on the GPU, one DMA each from their
            page-locked shared rings (``ProcessDecodePool(upload=True)``), so the detector's gather copies
            device to device only; None: when CUDA is available.
        depth: pictures decoded ahead per stream.
        interval_s: how often measurements feed the policy (0: never re-balance).
        headroom: the share of each side's capacity the plan fills (the policy's, and the measurement's plan);
            ignored with ``policy``.
        cpu_niceness: added to the CPU decoder processes' niceness (decoder processes only), so the NVDEC
            processes and the consumer win the cores when they contend; the capacity is measured with it.
        start_frames: the frame of its file each stream starts at (decoded and dropped first); None: 0 for all.
            Looped files that all start at frame 0 end at once, and every session starts over at the same moment.
        clock: monotonic seconds (tests).
    """

    def __init__(self, paths: Sequence[str | Path], *, capacity: dict[str, float] | None = None,
                 policy: HybridPolicy | None = None, fps: float | None = None, loop: bool = False,
                 cpu_threads: int = 1, nvdec_workers: int = 4, depth: int = 4, interval_s: float = 1.0,
                 decode_processes: int = 0, cpu_processes: int | None = None, process_kind: str = "nvdec",
                 upload: bool | None = None, headroom: float = DEFAULT_HEADROOM,
                 start_frames: Sequence[int] | None = None, cpu_niceness: int = CPU_DECODER_NICENESS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if decode_processes < 0 or (cpu_processes is not None and cpu_processes < 1):
            raise ConfigError(f"decode_processes must be >= 0 and cpu_processes >= 1 (or None), got "
                              f"{decode_processes}, {cpu_processes}")
        self.paths = [Path(p) for p in paths]
        self._starts = [0] * len(self.paths) if start_frames is None else [int(k) for k in start_frames]
        if len(self._starts) != len(self.paths) or min(self._starts, default=0) < 0:
            raise ConfigError(f"start_frames needs one frame >= 0 per stream ({len(self.paths)}), got {start_frames}")
        self._processes, self._process_kind = decode_processes, process_kind
        self.cpu_niceness = cpu_niceness
        self.upload = cuda_available() if upload is None else upload
        self.cpu_processes = cpu_processes or cpu_decoder_processes(decode_processes)
        probe = open_nv12(self.paths[0])
        self.demands = [float(fps or probe.info.fps)] * len(self.paths)
        probe.close()
        self.measured: dict[str, Any] | None = None  # the capacity measurement, when this hybrid made one
        self._headroom = headroom
        if policy is None and capacity is None:
            capacity = self._measure()
        self.policy = policy or HybridPolicy(capacity or {}, headroom=self._headroom, clock=clock)
        self._loop, self._threads, self._depth = loop, cpu_threads, depth
        self._nvdec_workers = nvdec_workers
        self._nvdec: Any = None
        self._cpu: Any = None  # the CPU decoder processes' pool (decode_processes > 0)
        self._nvdec_index: dict[int, int] = {}
        self._moving = threading.Lock()  # a lane handed from the monitor's thread to the reader's
        self._starting = threading.Lock()  # a pool's processes started once
        self._stop = threading.Event()
        self._sources: list[HybridSource] = []
        self.assignment = self.policy.assign(self.demands)
        try:
            self._sources = self._open_all()
        except BaseException:
            self.close()
            raise
        self._interval = interval_s
        self._clock = clock
        self._last: dict[str, tuple[int, int]] = {}
        self._last_t = clock()
        self._monitor = threading.Thread(target=self._watch, name="hybrid-decode", daemon=True)
        if interval_s > 0:
            self._monitor.start()

    def _measure(self) -> dict[str, float]:
        """Both pools' capacities on the first file, measured the way this hybrid will run them."""
        if self._processes:  # at the NVDEC session count the plan gives (a few sessions over-state many)
            self.measured = measure_hybrid_capacity_for_plan(
                self.paths[0], self.demands, headroom=self._headroom, decode_processes=self._processes,
                cpu_processes=self.cpu_processes, process_kind=self._process_kind, upload=self.upload,
                cpu_niceness=self.cpu_niceness)
            return {"nvdec": self.measured["nvdec"], "cpu": self.measured["cpu"]}
        return measure_capacity(self.paths[0], cores=self.cpu_processes)

    @property
    def grouped(self) -> bool:
        """Every stream is decoded in decoder processes and read through :meth:`take_ready`."""
        return self._processes > 0

    def sources(self) -> list[HybridSource]:
        return list(self._sources)

    # -- decoders -------------------------------------------------------------------------------

    def _open_all(self) -> list[HybridSource]:
        if not self.grouped:
            return [HybridSource(self, i, p, d, self._open(i, p, d, skip=self._starts[i]), self._starts[i])
                    for i, (p, d) in enumerate(zip(self.paths, self.assignment, strict=True))]
        lanes: dict[int, Any] = {}
        for name in ("nvdec", "cpu"):  # each pool opens its share in parallel
            mine = [i for i, d in enumerate(self.assignment) if d == name]
            if mine:
                opened = self._open_lanes(name, [(self.paths[i], self._starts[i]) for i in mine])
                lanes.update(zip(mine, opened, strict=True))
        return [HybridSource(self, i, p, d, lanes[i], self._starts[i])
                for i, (p, d) in enumerate(zip(self.paths, self.assignment, strict=True))]

    def _pool(self, decoder: str) -> Any:
        """The decoder processes of ``decoder``'s side, started on first use."""
        from streamrt.video.decode_processes import ProcessDecodePool

        with self._starting:
            if decoder == "nvdec" and self._nvdec is None:
                self._nvdec = ProcessDecodePool([], processes=self._processes, kind=self._process_kind,
                                                slots=self._depth, loop=self._loop,
                                                upload=self.upload and self._process_kind == "cpu")
            elif decoder == "cpu" and self._cpu is None:
                self._cpu = ProcessDecodePool([], processes=self.cpu_processes, kind="cpu", slots=self._depth,
                                              loop=self._loop, upload=self.upload, niceness=self.cpu_niceness)
            return self._nvdec if decoder == "nvdec" else self._cpu

    def _open_lanes(self, decoder: str, items: Sequence[tuple[Path, int]]) -> list[Any]:
        """Streams opened in ``decoder``'s processes, each at its frame (decoder processes)."""
        return list(self._pool(decoder).add_many(list(items)))

    def remove(self, index: int) -> None:
        """Stop decoding stream ``index`` for good (admission refused it): its decoder closes (its NVDEC session
        and pictures freed), its demand leaves the plan and the policy never moves it; reading it gives None.
        The other streams keep their decoders."""
        source = self._sources[index]
        with self._moving:
            if source.removed:
                return
            source.removed = True
            self.demands[index] = 0.0
            incoming, source._incoming = source._incoming, None
        if incoming is not None:
            self._remove(incoming[1])
        if self.grouped:
            self._remove(source._impl)
        else:
            source._impl.close()
            self._closed(index, source.decoder)

    def _remove(self, lane: Any) -> None:
        """Stop decoding a lane of the decoder processes (its pool stays open)."""
        pool, index = lane.pool_lane
        pool.remove(index)

    def _open(self, index: int, path: Path, decoder: str, skip: int) -> Any:
        """An in-process decoder for one stream (``decode_processes == 0``)."""
        if decoder == "nvdec":
            from streamrt.video.decode_nvdec import NvdecPool

            if self._nvdec is None:
                self._nvdec = NvdecPool([], workers=self._nvdec_workers, depth=self._depth, loop=self._loop)
            source = self._nvdec.add(path, skip=skip)
            self._nvdec_index[index] = source._index
            return source
        plain = open_nv12(path, self._threads)
        cpu = _Looped(path, self._threads, plain) if self._loop else plain
        cpu.skip(skip)
        return Prefetch(cpu, depth=self._depth)

    def _closed(self, index: int, decoder: str) -> None:
        if decoder == "nvdec" and self._nvdec is not None:
            self._nvdec.remove(self._nvdec_index.pop(index))

    def take_ready(self, indices: Sequence[int]) -> ReadyPictures:
        """One ready picture of each of streams ``indices`` that has one, whichever pool decodes it, without
        waiting (what :class:`~streamrt.video.live_group.LiveGroup` reads; decoder processes only).

        A stream that moved takes over its new lane here, and drops the pictures that lane decoded before
        the frame the stream had reached (asked for together: ``take_ready`` of a pool takes one picture
        per mention of a lane).
        """
        if not self.grouped:
            raise ConfigError("take_ready needs the streams in decoder processes",
                              hint="HybridDecode(..., decode_processes=N) with N >= 1")
        asks: dict[int, tuple[Any, list[int], list[HybridSource]]] = {}
        out = ReadyPictures()
        for index in indices:
            source = self._sources[index]
            if source.removed:
                out.ended.append(index)
                continue
            source._arrive()
            pool, lane = source._impl.pool_lane
            entry = asks.setdefault(id(pool), (pool, [], []))
            for _ in range(source._behind + 1):
                entry[1].append(lane)
                entry[2].append(source)
        now = time.perf_counter()
        for pool, lanes, owners in asks.values():
            by_lane = {lane: source for lane, source in zip(lanes, owners, strict=True)}
            ready = pool.take_ready(lanes)
            for lane, picture, pts in ready.taken:
                source = by_lane[lane]
                if source._behind > 0:
                    source._behind -= 1
                    continue
                if source._wanted is not None and now - source._wanted > STARVED_S:
                    source.starved += 1
                source._wanted = None
                source.read_count += 1
                out.taken.append((source.index, picture, pts))
            out.ended.extend(by_lane[lane].index for lane in ready.ended)
            out.failed.update({by_lane[lane].index: message for lane, message in ready.failed.items()})
        delivered = {index for index, _, _ in out.taken} | set(out.ended) | set(out.failed)
        for index in set(indices) - delivered:
            source = self._sources[index]
            if source._wanted is None:
                source._wanted = now
        return out

    # -- measurements and moves -----------------------------------------------------------------

    def step(self) -> list[Any]:
        """Feed the policy one round of measurements and apply its moves (the monitor thread calls this)."""
        now = self._clock()
        span = max(now - self._last_t, 1e-9)
        self._last_t = now
        for name in ("nvdec", "cpu"):
            mine = [s for s in self._sources if s.decoder == name and not s.removed]
            reads, starved = sum(s.read_count for s in mine), sum(s.starved for s in mine)
            last_reads, last_starved = self._last.get(name, (reads, starved))
            self._last[name] = (reads, starved)
            if not mine or reads == last_reads:
                continue
            saturated = (starved - last_starved) > 0.1 * (reads - last_reads)
            self.policy.observe(name, (reads - last_reads) / span, saturated=saturated)
        moves = self.policy.rebalance(self.assignment, self.demands)
        for move in moves:
            log.info("hybrid decode: stream %d %s -> %s", move.stream, move.src, move.dst)
            try:
                self._sources[move.stream].switch(move.dst)
            except SourceError as exc:  # the stream stays where it is
                log.warning("hybrid decode: stream %d cannot move to %s: %s", move.stream, move.dst, exc)
                self.assignment[move.stream] = move.src
        return moves

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self.step()

    def summary(self) -> dict[str, Any]:
        """The plan, the capacities, the moves made: for the run report."""
        live = [i for i, source in enumerate(self._sources) if not source.removed]
        out = self.policy.summary([self.assignment[i] for i in live], [self.demands[i] for i in live])
        out["assignment"] = {name: sum(1 for s in self._sources if s.decoder == name and not s.removed)
                             for name in ("nvdec", "cpu")}
        out["removed"] = sum(1 for s in self._sources if s.removed)
        if self.grouped:
            out["processes"] = {"nvdec": self._processes, "cpu": self.cpu_processes}
            out["cpu_niceness"] = self.cpu_niceness
            cpu = self._cpu
            out["cpu_pictures"] = ("host" if not self.upload else
                                   f"uploaded from page-locked rings ({cpu.page_locked} locked)" if cpu is not None
                                   else "uploaded")
        return out

    def close(self) -> None:
        self._stop.set()
        monitor = getattr(self, "_monitor", None)
        if monitor is not None and monitor.is_alive():
            monitor.join(timeout=5)
        for s in self._sources:
            s.close()
        for pool in (self._nvdec, self._cpu):
            if pool is not None:
                pool.close()

    def __enter__(self) -> HybridDecode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Looped:
    """A PyAV source that starts its file over at the end."""

    def __init__(self, path: Path, threads: int, first: Any) -> None:
        self.path, self.threads, self._src = path, threads, first
        self.frame_format = "nv12"

    @property
    def info(self) -> SourceInfo:
        return self._src.info

    def read(self) -> Any:
        picture = self._src.read()
        if picture is None:
            self._src = start_over(self._src, lambda: open_nv12(self.path, self.threads))
            picture = self._src.read()
        return picture

    def skip(self, count: int) -> int:
        return sum(1 for _ in range(count) if self.read() is not None)

    def close(self) -> None:
        self._src.close()
