"""Hybrid decode: streams on NVDEC while it has room, on CPU decoders beyond, moved as measurements say.

:class:`HybridDecode` opens one :class:`HybridSource` per video, each decoded either by an NVDEC
session (:class:`~streamrt.video.decode_nvdec.NvdecPool`, primary context and kept decoders: the
:class:`~streamrt.video.decode_nvdec.NvdecOptions` default) or by PyAV on a CPU thread
(:func:`~streamrt.video.decoding.open_nv12`: PyAV, else OpenCV, behind a
:class:`~streamrt.video.sources.Prefetch`).
Both deliver NV12 (a device tensor from NVDEC, a host array from the CPU), so streams of both
kinds share one detection pipeline and one batch: the workload's ``gather`` stage copies each
picture into place and the fused kernel converts them all.

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
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from streamrt.video.decoding import open_nv12
from streamrt.video.hybrid_policy import HybridPolicy
from streamrt.video.sources import Prefetch, SourceInfo

__all__ = ["HybridDecode", "HybridSource", "measure_capacity", "measure_cpu_decode"]

log = logging.getLogger(__name__)

# A read that waited longer than this for its decoder counts as starved.
STARVED_S = 0.002


def measure_cpu_decode(path: str | Path, seconds: float = 2.0, threads: int = 1) -> float:
    """Frames/s one PyAV decoder with ``threads`` threads gets from ``path`` (NV12 out, looped)."""
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        source = open_nv12(path, threads)
        while time.perf_counter() - started < seconds and source.read() is not None:
            done += 1
        source.close()
    return done / (time.perf_counter() - started)


def measure_capacity(path: str | Path, *, cores: int | None = None, nvdec_sessions: int = 8,
                     seconds: float = 2.0) -> dict[str, float]:
    """Decode capacity of this machine on ``path``: NVDEC (``nvdec_sessions`` in parallel, if available)
    and the CPU (one single-threaded decoder's rate x the cores this process may use)."""
    cores = cores or len(os.sched_getaffinity(0))
    capacity = {"cpu": measure_cpu_decode(path, seconds) * cores}
    from streamrt.video.decode_nvdec import measure_nvdec, nvdec_available

    if nvdec_available():
        capacity["nvdec"] = measure_nvdec([path], nvdec_sessions, seconds)["fps"]
    return capacity


class HybridSource:
    """One stream of a :class:`HybridDecode`: NV12 pictures from whichever decoder holds it now."""

    frame_format = "nv12"

    def __init__(self, owner: HybridDecode, index: int, path: Path, decoder: str) -> None:
        self._owner, self.index, self.path = owner, index, path
        self.decoder = decoder
        self._impl: Any = owner._open(index, path, decoder, skip=0)
        self._pending: str | None = None
        self._info = SourceInfo(path.name, self._impl.info.width, self._impl.info.height, self._impl.info.fps, None)
        self.read_count = 0
        self.starved = 0
        self.moves = 0

    @property
    def info(self) -> SourceInfo:
        return self._info

    def switch(self, decoder: str) -> None:
        """Move to ``decoder`` before the next read (the consumer's thread does the move)."""
        self._pending = decoder

    def read(self) -> Any:
        if self._pending is not None and self._pending != self.decoder:
            self._impl.close()
            self._owner._closed(self.index, self.decoder)
            self.decoder, self._pending = self._pending, None
            self._impl = self._owner._open(self.index, self.path, self.decoder, skip=self.read_count)
            self.moves += 1
        started = time.perf_counter()
        picture = self._impl.read()
        if time.perf_counter() - started > STARVED_S:
            self.starved += 1
        if picture is not None:
            self.read_count += 1
        return picture

    def skip(self, count: int) -> int:
        n = int(self._impl.skip(count))
        self.read_count += n
        return n

    def stats(self) -> Any:
        return _Stats({"decoder": self.decoder, "moves": self.moves, "starved_reads": self.starved})

    def close(self) -> None:
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
        capacity: frames/s per pool (``nvdec``, ``cpu``); None measures them (:func:`measure_capacity`).
        policy: a ready policy (tests); overrides ``capacity``.
        fps: each stream's demand; None uses the files' frame rates.
        loop: start files over at their end (benchmarks).
        cpu_threads: FFmpeg threads per CPU-decoded stream.
        nvdec_workers: host threads driving the NVDEC sessions.
        decode_processes: run the NVDEC sessions in this many decoder processes, pictures handed over by
            CUDA IPC (:class:`~streamrt.video.decode_processes.ProcessDecodePool`: one process binds NVDEC
            at ~2,000-2,800 frames/s on an H200, 4 reach its engines' bound); 0 drives them with
            ``nvdec_workers`` threads in this process.
        process_kind: what those processes decode with: ``nvdec``, or ``cpu`` (the CI stand-in).
        depth: pictures decoded ahead per stream.
        interval_s: how often measurements feed the policy (0: never re-balance).
        clock: monotonic seconds (tests).
    """

    def __init__(self, paths: Sequence[str | Path], *, capacity: dict[str, float] | None = None,
                 policy: HybridPolicy | None = None, fps: float | None = None, loop: bool = False,
                 cpu_threads: int = 1, nvdec_workers: int = 4, depth: int = 4, interval_s: float = 1.0,
                 decode_processes: int = 0, process_kind: str = "nvdec",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = [Path(p) for p in paths]
        self.policy = policy or HybridPolicy(capacity or measure_capacity(self.paths[0]), clock=clock)
        self._loop, self._threads, self._depth = loop, cpu_threads, depth
        self._nvdec_workers = nvdec_workers
        self._processes, self._process_kind = decode_processes, process_kind
        self._nvdec: Any = None
        self._nvdec_index: dict[int, int] = {}
        probe = open_nv12(self.paths[0])
        self.demands = [float(fps or probe.info.fps)] * len(self.paths)
        probe.close()
        self.assignment = self.policy.assign(self.demands)
        self._sources = [HybridSource(self, i, p, d) for i, (p, d) in enumerate(zip(self.paths, self.assignment,
                                                                                     strict=True))]
        self._interval = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._last: dict[str, tuple[int, int]] = {}
        self._last_t = clock()
        self._monitor = threading.Thread(target=self._watch, name="hybrid-decode", daemon=True)
        if interval_s > 0:
            self._monitor.start()

    def sources(self) -> list[HybridSource]:
        return list(self._sources)

    # -- decoders -------------------------------------------------------------------------------

    def _open(self, index: int, path: Path, decoder: str, skip: int) -> Any:
        if decoder == "nvdec":
            from streamrt.video.decode_nvdec import NvdecPool

            if self._nvdec is None and self._processes:
                from streamrt.video.decode_processes import ProcessDecodePool

                self._nvdec = ProcessDecodePool([], processes=self._processes, kind=self._process_kind,
                                                slots=self._depth, loop=self._loop)
            elif self._nvdec is None:
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

    # -- measurements and moves -----------------------------------------------------------------

    def step(self) -> list[Any]:
        """Feed the policy one round of measurements and apply its moves (the monitor thread calls this)."""
        now = self._clock()
        span = max(now - self._last_t, 1e-9)
        self._last_t = now
        for name in ("nvdec", "cpu"):
            mine = [s for s in self._sources if s.decoder == name]
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
            self._sources[move.stream].switch(move.dst)
        return moves

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self.step()

    def summary(self) -> dict[str, Any]:
        """The plan, the capacities, the moves made: for the run report."""
        out = self.policy.summary(self.assignment, self.demands)
        out["assignment"] = {name: sum(1 for s in self._sources if s.decoder == name) for name in ("nvdec", "cpu")}
        return out

    def close(self) -> None:
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join(timeout=5)
        for s in self._sources:
            s.close()
        if self._nvdec is not None:
            self._nvdec.close()

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
            self._src.close()
            self._src = open_nv12(self.path, self.threads)
            picture = self._src.read()
        return picture

    def skip(self, count: int) -> int:
        return sum(1 for _ in range(count) if self.read() is not None)

    def close(self) -> None:
        self._src.close()
