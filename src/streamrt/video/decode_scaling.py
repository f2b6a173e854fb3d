"""How decoding scales with sessions: frames/s, host time, GIL waits, sessions that open, memory, order.

Issue 27 measured NVDEC alone rising to 2,009 frames/s at 4 sessions and *falling* past it on a GPU
with 7 decode engines, and 150 sessions failing to open. This module holds the measurements that
find out why, for any pool with :class:`~streamrt.video.decode_nvdec.NvdecPool`'s interface
(``sources()``, ``add(path)``, ``stats()``, ``close()``), so the CPU stand-in (:class:`StandInPool`,
OpenCV) runs the same code in CI that NVDEC runs on the GPU:

- :func:`drain`: every source read as fast as it goes on a thread of its own for ``seconds`` after a
  warm-up; aggregate frames/s, frames per stream, whether every stream's pictures came in order
  (presentation time stamps rising, or back to the first at a loop), and a :class:`GilProbe`.
- :func:`drain_in_processes`: the same, the sessions split over worker processes (no shared GIL).
- :func:`open_sessions`: sessions opened one at a time up to a limit, free device memory read
  before and after each, then a few frames decoded from every open stream.

Example:
    >>> spec = PoolSpec("cpu")                                              # doctest: +SKIP
    >>> with spec.open(["a.mp4"] * 2) as pool: drain(pool, 1.0)["fps"]    # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.errors import ConfigError
from streamrt.video.decode_nvdec import NvdecOptions
from streamrt.video.sources import SourceInfo, VideoFileSource

__all__ = ["DecoderLoad", "GilProbe", "PoolSpec", "StandInPool", "drain", "drain_in_processes", "open_sessions",
           "start_processes"]

KINDS = ("nvdec", "cpu")


class GilProbe:
    """How late a thread that sleeps 1 ms wakes up: a decoder call that holds the GIL shows as lateness.

    A thread that asks for 1 ms and gets the interpreter back 20 ms later waited for the GIL (or for
    the CPU) that long; the probe's p99 and worst lateness are the longest a Python thread waited.
    """

    def __init__(self, period_s: float = 0.001) -> None:
        self.period_s = period_s
        self.late_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            time.sleep(self.period_s)
            self.late_ms.append((time.perf_counter() - started - self.period_s) * 1e3)

    def __enter__(self) -> GilProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> dict[str, float]:
        """p50, p99 and worst lateness in ms (NaN before any sample)."""
        if not self.late_ms:
            return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
        late = np.asarray(self.late_ms)
        return {"p50_ms": float(np.percentile(late, 50)), "p99_ms": float(np.percentile(late, 99)),
                "max_ms": float(late.max())}


class DecoderLoad:
    """NVDEC utilisation sampled every 0.2 s from NVML while open (``mean`` None without nvidia-ml-py or a GPU).

    Tells engines that are busy (the hardware binds) from engines that wait (the host binds).
    """

    def __init__(self, gpu: int = 0, period_s: float = 0.2) -> None:
        self.samples: list[tuple[float, float]] = []  # (time.time(), utilisation 0..1)
        self.period_s = period_s
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        except Exception:  # no NVML here: no samples, and the tables say n/a
            self._nvml = None

    def __enter__(self) -> DecoderLoad:
        if self._nvml is not None:
            threading.Thread(target=self._run, name="nvdec-load", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                busy = float(self._nvml.nvmlDeviceGetDecoderUtilization(self._handle)[0]) / 100
            except Exception:  # a sample NVML refuses: skipped
                continue
            self.samples.append((time.time(), busy))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    @property
    def mean(self) -> float | None:
        """Mean utilisation (0..1) over every sample."""
        return self.mean_between(-math.inf, math.inf)

    def mean_between(self, begin: float, end: float) -> float | None:
        """Mean utilisation (0..1) of the samples taken between ``begin`` and ``end`` (``time.time()``)."""
        chosen = [u for t, u in self.samples if begin <= t <= end]
        return float(np.mean(chosen)) if chosen else None


class _Order:
    """Whether a stream's time stamps rise (a loop may start them over at the first one)."""

    def __init__(self) -> None:
        self.first: Any = None
        self.last: Any = None
        self.bad = 0
        self.known = True

    def see(self, pts: Any) -> None:
        if pts is None:
            self.known = False
            return
        if self.first is None:
            self.first = pts
        elif not (pts > self.last or pts <= self.first):  # a loop starts over at (or before) the first
            self.bad += 1
        self.last = pts


def drain(pool: Any, seconds: float, warmup_s: float = 0.5, probe: bool = True) -> dict[str, Any]:
    """Read every source of ``pool`` on its own thread for ``warmup_s + seconds``; frames/s over ``seconds``."""
    sources = pool.sources()
    counts = [0] * len(sources)
    orders = [_Order() for _ in sources]
    errors: list[str] = []
    stop = threading.Event()

    def read(i: int) -> None:
        source = sources[i]
        try:
            while not stop.is_set() and source.read() is not None:
                orders[i].see(getattr(source, "last_pts", None))
                counts[i] += 1
        except Exception as exc:  # counted, reported; the other streams go on
            errors.append(f"stream {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(sources))]
    gil = GilProbe()
    with gil if probe else _Nothing(), DecoderLoad() as load:
        for t in threads:
            t.start()
        time.sleep(warmup_s)
        before, started, begin = list(counts), time.perf_counter(), time.time()
        stats_before = pool.stats()
        time.sleep(seconds)
        after, wall = list(counts), time.perf_counter() - started
        stats_after = pool.stats()
    stop.set()
    deadline = time.perf_counter() + 10
    for t in threads:  # each returns after its next picture
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    done = [a - b for a, b in zip(after, before, strict=True)]
    frames = max(sum(done), 1)
    delta = {k: stats_after[k] - stats_before.get(k, 0.0) for k in stats_after}
    return {"sessions": len(sources), "fps": sum(done) / wall, "fps_per_session": sum(done) / wall / len(sources),
            "min_stream_fps": min(done) / wall, "max_stream_fps": max(done) / wall,
            "in_order": sum(o.bad == 0 for o in orders), "order_known": all(o.known for o in orders),
            "decoders_opened_per_s": delta.get("opened", 0.0) / wall,
            "host_ms_per_frame": {p: 1e3 * delta.get(f"{p}_s", 0.0) / frames for p in ("decode", "copy", "sync")},
            "gil": gil.summary() if probe else {}, "nvdec_busy": load.mean_between(begin, begin + wall),
            "errors": errors[:5]}


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass(frozen=True)
class PoolSpec:
    """A decoder pool to open, picklable (worker processes open their own).

    Attributes:
        kind: ``nvdec`` (:class:`~streamrt.video.decode_nvdec.NvdecPool`) or ``cpu`` (:class:`StandInPool`).
        options: how NVDEC sessions are created.
        workers: driver threads; 0 means one per session.
        depth: pictures queued per stream.
    """

    kind: str = "nvdec"
    options: NvdecOptions = field(default_factory=NvdecOptions)
    workers: int = 0
    depth: int = 8

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"pool kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def open(self, paths: Sequence[str | Path], *, sessions: int | None = None, loop: bool = True) -> Any:
        """The pool over ``paths`` (cycled to ``sessions`` streams when given)."""
        n = len(paths) if sessions is None else sessions
        chosen = [paths[i % len(paths)] for i in range(n)]
        workers = self.workers or max(n, 1)
        if self.kind == "cpu":
            return StandInPool(chosen, loop=loop)
        from streamrt.video.decode_nvdec import NvdecPool

        return NvdecPool(chosen, workers=workers, depth=self.depth, loop=loop, options=self.options)

    def free_bytes(self, release: bool = False) -> int | None:
        """Free device memory (``cudaMemGetInfo``), None for the CPU stand-in; ``release`` first hands
        torch's cached blocks back to the driver (what earlier parts left is not counted to sessions)."""
        if self.kind == "cpu":
            return None
        import torch

        torch.cuda.synchronize()
        if release:
            torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info()[0])


def _warm(kind: str, hold_s: float) -> int:
    """Start a worker process's CUDA and PyNvVideoCodec (minutes of nothing later, not inside a window)."""
    if kind == "nvdec":
        import PyNvVideoCodec  # noqa: F401
        import torch

        torch.cuda.init()
        torch.zeros(1, device="cuda")
    time.sleep(hold_s)  # held, so that every worker process of the pool gets one of these
    return os.getpid()


def start_processes(executor: Executor, processes: int, kind: str) -> int:
    """Spawn and warm every worker process of ``executor`` now; the number of distinct processes."""
    futures = [executor.submit(_warm, kind, 1.0) for _ in range(processes)]
    return len({f.result(timeout=180) for f in futures})  # a worker that cannot start fails the part, not the call


def _child(spec: PoolSpec, paths: list[str], sessions: int, seconds: float, warmup_s: float,
           start_at: float) -> dict[str, Any]:
    """One worker process's share: open, wait for the common start, drain; its numbers and measuring window."""
    with spec.open(paths, sessions=sessions) as pool:
        time.sleep(max(0.0, start_at - time.time()))
        started = time.time() + warmup_s
        result = drain(pool, seconds, warmup_s, probe=False)
    result["window"] = (started, started + seconds)
    return result


def drain_in_processes(executor: Executor, processes: int, spec: PoolSpec, paths: Sequence[str | Path],
                       sessions: int, seconds: float, warmup_s: float = 1.0, open_s: float = 0.15) -> dict[str, Any]:
    """``sessions`` split over ``processes`` worker processes of ``executor`` (a spawn-context process pool,
    warmed by :func:`start_processes`).

    Every process opens its share, then all start at one instant (``open_s`` per session after the
    call, at least 1 s); the sum of their rates is the aggregate, and ``overlap`` says how much of
    the window all of them shared (near 1: a fair sum).
    """
    shares = [sessions // processes + (i < sessions % processes) for i in range(processes)]
    start_at = time.time() + max(1.0, open_s * max(shares))
    with DecoderLoad() as load:
        futures = [executor.submit(_child, spec, [str(p) for p in paths], share, seconds, warmup_s, start_at)
                   for share in shares if share]
        wait = max(1.0, start_at - time.time()) + warmup_s + seconds + 60  # a hung worker fails this point only
        parts = [f.result(timeout=wait) for f in futures]
    begin, end = max(p["window"][0] for p in parts), min(p["window"][1] for p in parts)
    fps = sum(p["fps"] for p in parts)
    return {"sessions": sessions, "processes": len(parts), "fps": fps, "fps_per_session": fps / sessions,
            "min_stream_fps": min(p["min_stream_fps"] for p in parts),
            "in_order": sum(p["in_order"] for p in parts), "order_known": all(p["order_known"] for p in parts),
            "decoders_opened_per_s": sum(p["decoders_opened_per_s"] for p in parts),
            "host_ms_per_frame": {k: float(np.mean([p["host_ms_per_frame"][k] for p in parts]))
                                  for k in ("decode", "copy", "sync")},
            "overlap": max(0.0, end - begin) / seconds, "gil": {}, "nvdec_busy": load.mean_between(begin, end),
            "errors": [e for p in parts for e in p["errors"]]}


def open_sessions(spec: PoolSpec, paths: Sequence[str | Path], limit: int, *, deadline: float,
                  frames: int = 10, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Open sessions one at a time (paths cycled) until ``limit``, a failure or ``deadline`` (perf_counter).

    Free device memory is read before and after every session; then ``frames`` pictures are read
    from every open stream in turn and each stream's order checked.
    """
    if spec.kind == "cpu":
        pool: Any = StandInPool([], loop=True)
    else:  # a few driver threads: this counts sessions that open, it does not race them
        from streamrt.video.decode_nvdec import NvdecPool

        pool = NvdecPool([], workers=spec.workers or 16, depth=2, loop=True, options=spec.options)
    per_session: list[int] = []
    sources: list[Any] = []
    error, stopped = "", "limit"
    start_free = free = spec.free_bytes(release=True)
    started = time.perf_counter()
    try:
        for i in range(limit):
            if time.perf_counter() > deadline:
                stopped = "time budget"
                break
            try:
                pool.add(paths[i % len(paths)])
            except Exception as exc:  # the wall we are looking for: record it and stop opening
                error, stopped = f"{type(exc).__name__}: {exc}"[:400], "failure"
                break
            now = spec.free_bytes()
            if free is not None and now is not None:
                per_session.append(free - now)
            free = now
            if log and (i + 1) % 25 == 0:
                log(f"  {i + 1} sessions open, {0 if free is None else free / 2**30:.1f} GiB free")
        opened = len(pool.sources())
        open_s = time.perf_counter() - started
        orders = [_Order() for _ in range(opened)]
        sources = pool.sources()
        read, failed = 0, set[int]()
        for _ in range(frames if time.perf_counter() < deadline else 0):
            for s, source in enumerate(sources):
                if s in failed:
                    continue
                try:
                    picture = source.read()
                except Exception as exc:  # e.g. a stream whose decoder ran out of memory later: counted, not fatal
                    failed.add(s)
                    error = error or f"reading stream {s}: {type(exc).__name__}: {exc}"[:400]
                    continue
                if picture is not None:
                    orders[s].see(getattr(source, "last_pts", None))
                    read += 1
    finally:
        pool.close()
        del pool, sources  # the sessions (their decoders and pictures) go now, not at the next collection
        spec.free_bytes(release=True)  # the sessions' pictures back to the driver for the parts after
    mib = np.asarray(per_session, dtype=float) / 2**20
    return {"asked": limit, "opened": opened, "stopped": stopped, "error": error, "open_s": open_s,
            "mib_per_session_median": float(np.median(mib)) if mib.size else None,
            "mib_per_session_max": float(mib.max()) if mib.size else None,
            "mib_total": None if start_free is None or free is None else (start_free - free) / 2**20,
            "frames_read": read, "streams_failed": len(failed), "in_order": sum(o.bad == 0 for o in orders),
            "order_known": all(o.known for o in orders)}


class _StandInSource:
    """A looping OpenCV decode with the frame index as its time stamp (what NVDEC's frames carry)."""

    frame_format = "bgr"

    def __init__(self, path: Path, loop: bool) -> None:
        self.path, self.loop = path, loop
        self._src = VideoFileSource(path)
        self.last_pts: Any = None
        self.opened = 1
        self._k = 0

    @property
    def info(self) -> SourceInfo:
        return self._src.info

    def read(self) -> Any:
        frame = self._src.read()
        if frame is None and self.loop and self._k:
            self._src.close()
            self._src, self._k = VideoFileSource(self.path), 0
            self.opened += 1
            frame = self._src.read()
        if frame is not None:
            self.last_pts, self._k = self._k, self._k + 1
        return frame

    def close(self) -> None:
        self._src.close()


class StandInPool:
    """:class:`~streamrt.video.decode_nvdec.NvdecPool`'s interface over CPU decoders (OpenCV), for CI.

    Each source decodes on the thread that reads it; ``stats()`` counts decoder opens (one per
    pass, as the old NVDEC way did) so the same columns fill on the CPU.
    """

    def __init__(self, paths: Sequence[str | Path], *, loop: bool = True) -> None:
        self._loop = loop
        self._sources: list[_StandInSource] = []
        for path in paths:
            self.add(path)

    def add(self, path: str | Path) -> _StandInSource:
        source = _StandInSource(Path(path), self._loop)
        self._sources.append(source)
        return source

    def sources(self) -> list[_StandInSource]:
        return list(self._sources)

    def stats(self) -> dict[str, float]:
        return {"opened": float(sum(s.opened for s in self._sources))}

    def close(self) -> None:
        for source in self._sources:
            source.close()

    def __enter__(self) -> StandInPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
