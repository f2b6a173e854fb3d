"""GPU decoding with NVDEC through PyNvVideoCodec: compressed video in, NV12 device tensors out.

Only compressed bytes cross PCIe: PyNvVideoCodec's demuxer (FFmpeg) reads packets on the host,
an NVDEC session decodes them into device memory, and each picture reaches torch through
DLPack. :class:`NvdecPool` runs the sessions: one per stream (a session decodes one bitstream),
driven by ``workers`` host threads that each own a CUDA stream; the driver spreads the sessions
over the GPU's decode engines (7 NVDEC on an H200). Every stream has a bounded queue of decoded
pictures, so decoding runs ahead of the pipeline by at most ``depth`` frames and a pipeline that
outruns the decoders waits for them: decode cost is part of every measurement.

Pictures are copied out of the decoder's surface pool into a tensor of their own (device to
device; the decoder reuses its surfaces) and the worker synchronises its stream before handing
the picture over, so the pipeline may read it on any stream. The detection workload takes them
with ``frame_format = "nv12"`` and converts + letterboxes in one kernel
(:class:`streamrt.ops.letterbox_torch.TorchNv12Letterbox`); nothing visits the host.

PyNvVideoCodec imports only where a GPU and its driver are; the import stays inside this module
and a missing one is a :class:`~streamrt.errors.MissingDependencyError` naming ``pynvvideocodec``.
API used (PyNvVideoCodec 2.x): ``CreateDemuxer(filename=)``, ``demuxer.GetNvCodecId()``,
``CreateDecoder(gpuid=, codec=, cudacontext=, cudastream=, usedevicememory=True[, enableasyncallocations=])``,
``decoder.Decode(packet)`` -> frames, ``torch.from_dlpack(frame)`` -> (H * 3 / 2, W) uint8.

How sessions are made is an :class:`NvdecOptions` (issue 27: NVDEC alone fell past 4 sessions, and
150 sessions failed in ``cuvidCreateDecoder`` with CUDA_ERROR_OUT_OF_MEMORY). ``cudacontext=0``, the
old way, makes PyNvVideoCodec create a CUDA context of its own for every decoder (``cuCtxCreate``:
hundreds of MB each, and the GPU time-slices between contexts for every picture's post-processing
kernel); a foreign torch stream is then refused and the legacy default stream used. ``context=
"primary"`` hands every decoder the device's primary context (torch's) and the worker's torch stream.
A looping file used to get a new decoder (and context) at every pass; ``reuse=True`` keeps the
decoder and reopens only the demuxer. ``scripts/gpu_nvdec_scaling.py`` compares the ways in one run.

Past ~4 sessions one Python process binds (the GIL, per-frame host work: ~2,000-2,800 frames/s on
an H200 against 5,134 with the sessions over 4 processes): :mod:`streamrt.video.decode_processes`
runs these sessions in decoder processes and hands the pictures over by CUDA IPC.

Example:
    >>> pool = NvdecPool(["a.mp4", "b.mp4"], workers=2, loop=True)      # doctest: +SKIP
    >>> sources = pool.sources()                                         # doctest: +SKIP
    >>> picture = sources[0].read(); picture.shape, picture.device       # doctest: +SKIP
    (torch.Size([1620, 1920]), device(type='cuda', index=0))
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from streamrt._optional import require
from streamrt.errors import ConfigError
from streamrt.video.live_group import ReadyPictures
from streamrt.video.sources import SourceError, SourceInfo

__all__ = ["CONTEXTS", "NvdecOptions", "NvdecPool", "NvdecSource", "measure_nvdec", "nvdec_available",
           "primary_context"]

log = logging.getLogger(__name__)


def nvdec_available() -> bool:
    """PyNvVideoCodec is installed and a CUDA device exists (the import itself needs the driver)."""
    if importlib.util.find_spec("PyNvVideoCodec") is None:
        return False
    from streamrt.device import cuda_available

    return cuda_available()


def _nvc() -> Any:
    return require("PyNvVideoCodec", extra="nvdec", purpose="GPU video decoding (pip install pynvvideocodec)")


CONTEXTS = ("own", "primary")


@dataclass(frozen=True)
class NvdecOptions:
    """How NVDEC sessions are created (see the module docstring for why each matters).

    Attributes:
        context: ``primary`` (the default: the device's primary context, which torch uses, and the
            worker's stream) or ``own`` (``cudacontext=0``: PyNvVideoCodec creates a context per
            decoder, the old way).
        reuse: a looping file keeps its decoder at the end of a pass (only the demuxer reopens), the
            default; False opens a new decoder for every pass, the old way.

    The defaults are the way measured best on the H200 (docs/benchmarks/2026-12-02-h200-nvdec.md):
    one session 738 frames/s against the old way's 589, 2,788 against 1,702 at 4 sessions.
        async_alloc: ``enableasyncallocations`` (stream-ordered ``cuMemAllocAsync`` for the output
            surfaces) where the PyNvVideoCodec build knows it.
        timing: add up per-frame host time per phase (demux + decode, copy out, stream sync).
    """

    context: str = "primary"
    reuse: bool = True
    async_alloc: bool = False
    timing: bool = False

    def __post_init__(self) -> None:
        if self.context not in CONTEXTS:
            raise ConfigError(f"NVDEC context must be one of {', '.join(CONTEXTS)}, got {self.context!r}")

    def describe(self) -> str:
        """A short label, e.g. ``primary context, decoder reused``."""
        parts = [f"{self.context} context", "decoder reused" if self.reuse else "decoder per pass"]
        return ", ".join(parts + (["async allocations"] if self.async_alloc else []))


_PRIMARY: dict[int, int] = {}
_WARNED: list[bool] = []


def primary_context(gpu: int) -> int:
    """The handle of device ``gpu``'s primary CUDA context (the one torch runs in), retained once.

    Through the driver API with ctypes (``cuDevicePrimaryCtxRetain``): no extra dependency. The
    retain is never released: torch holds the same context for the life of the process anyway.
    """
    if gpu not in _PRIMARY:
        import ctypes

        import torch

        torch.cuda.init()  # cuInit, and torch's own retain of the primary context
        lib = ctypes.CDLL("libcuda.so.1")
        device, ctx = ctypes.c_int(), ctypes.c_void_p()
        for call, args in (("cuDeviceGet", (ctypes.byref(device), gpu)),
                           ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), device))):
            if (err := getattr(lib, call)(*args)) != 0:
                raise SourceError(f"{call} failed with CUDA error {err} on device {gpu}")
        _PRIMARY[gpu] = int(ctx.value or 0)
    return _PRIMARY[gpu]


class _Session:
    """One bitstream on one NVDEC decoder: packets in, NV12 pictures (device tensors) out."""

    def __init__(self, path: Path, gpu: int, stream: Any, loop: bool, options: NvdecOptions | None = None) -> None:
        self.path, self.gpu, self.stream, self.loop = path, gpu, stream, loop
        self.options = options or NvdecOptions()
        self.decoded = self.opened = 0
        self.open_s = 0.0
        self.times = {"decode": 0.0, "copy": 0.0, "sync": 0.0}  # host seconds per phase (options.timing)
        self.pts: Any = None  # the last picture's presentation time stamp (None where frames carry none)
        self._demuxer = _nvc().CreateDemuxer(filename=str(self.path))
        self._decoder = self._create()
        self.fps = _call(self._demuxer, "FrameRate") or 30.0
        self._frames = self._decode()

    def _create(self) -> Any:
        """A decoder for the demuxer's codec, in the context the options name."""
        import torch

        nvc, started = _nvc(), time.perf_counter()
        context = primary_context(self.gpu) if self.options.context == "primary" else 0
        extra = {"enableasyncallocations": True} if self.options.async_alloc else {}
        codec = self._demuxer.GetNvCodecId()
        try:  # decode on our stream, so the copy out of the surface pool is ordered after it
            decoder = nvc.CreateDecoder(gpuid=self.gpu, codec=codec, cudacontext=context,
                                        cudastream=self.stream.cuda_stream, usedevicememory=True, **extra)
        except Exception as exc:  # a context that refuses foreign streams (its own): the legacy default stream
            if not _WARNED:  # once per process, not once per session
                _WARNED.append(True)
                log.warning("NVDEC on a torch stream failed (%s); using the default stream", exc)
            self.stream = torch.cuda.default_stream(self.gpu)
            decoder = nvc.CreateDecoder(gpuid=self.gpu, codec=codec, cudacontext=context, cudastream=0,
                                        usedevicememory=True, **extra)
        self.opened += 1
        self.open_s += time.perf_counter() - started
        return decoder

    def _decode(self) -> Iterator[Any]:
        reuse, passes = self.options.reuse, 0
        while True:
            produced = False
            for packet in self._demuxer:
                for frame in self._decoder.Decode(packet):
                    produced = True
                    yield frame
            if not produced and reuse and passes:  # the kept decoder gave nothing after its flush: a new one
                log.warning("NVDEC: a decoder kept across passes decoded nothing on %s; new decoders from now",
                            self.path.name)
                reuse = False
            elif not (self.loop and produced):
                return
            passes += 1
            # from the start again: a new demuxer, and (the old way) a new decoder, since this one saw the end
            self._demuxer = _nvc().CreateDemuxer(filename=str(self.path))
            if not reuse:
                self._decoder = None  # freed before its successor is made
                self._decoder = self._create()

    def next(self, out: Any = None) -> Any:
        """The next picture as an owned (H * 3 / 2, W) uint8 device tensor, or None at the end.

        ``out``, a tensor of that shape, receives the picture instead of a new one (a decoder process
        copies straight into a slot the detector process shares with it, :mod:`~streamrt.video.decode_processes`).
        """
        import torch

        started = time.perf_counter()
        frame = next(self._frames, None)
        if frame is None:
            return None
        decoded = time.perf_counter()
        with torch.cuda.stream(self.stream):  # out of the decoder's surface pool, on this session's stream
            surface = torch.from_dlpack(frame)
            picture = surface.clone() if out is None else out.copy_(surface)
        self.pts = _pts(frame)
        if self.options.timing:
            self.times["decode"] += decoded - started
            self.times["copy"] += time.perf_counter() - decoded
        self.decoded += 1
        return picture

    def synchronize(self) -> None:
        """Wait for this session's stream (the picture is complete before any other stream reads it)."""
        started = time.perf_counter()
        self.stream.synchronize()
        if self.options.timing:
            self.times["sync"] += time.perf_counter() - started


def _pts(frame: Any) -> float | None:
    """A decoded frame's presentation time stamp, or None where this PyNvVideoCodec build gives none."""
    value = getattr(frame, "timestamp", None)
    try:
        value = value() if callable(value) else value
        return None if value is None else float(value)
    except (TypeError, ValueError):  # an accessor of another shape: no time stamp rather than a failed stream
        return None


def _call(obj: Any, name: str) -> Any:
    fn = getattr(obj, name, None)
    try:
        return fn() if callable(fn) else None
    except Exception:  # an accessor this PyNvVideoCodec version lacks or refuses
        return None


@dataclass
class _Lane:
    """A stream's queue between its decoding worker and the pipeline."""

    session: _Session
    depth: int
    queue: collections.deque[tuple[Any, float, Any]] = field(default_factory=collections.deque)
    finished: bool = False
    error: BaseException | None = None


class _Lanes(Protocol):
    """What a source reads from: an :class:`NvdecPool`, or decoder processes
    (:class:`~streamrt.video.decode_processes.ProcessDecodePool`)."""

    def _take(self, index: int) -> tuple[Any, float, Any] | None: ...


class NvdecSource:
    """One stream of an :class:`NvdecPool` (or of decoder processes), a frame source of NV12 device tensors.

    ``frame_format`` is ``"nv12"``: :func:`~streamrt.video.runner.run_detection` builds the NV12
    stages for it. ``read()`` blocks until the worker has decoded the next picture; ``last_pts`` is
    that picture's presentation time stamp (None where the frames carry none).
    """

    frame_format = "nv12"

    def __init__(self, pool: _Lanes, index: int, info: SourceInfo) -> None:
        self._pool, self._index, self._info = pool, index, info
        self.last_time = 0.0
        self.last_pts: Any = None
        self._read = 0

    @property
    def info(self) -> SourceInfo:
        return self._info

    @property
    def pool_lane(self) -> tuple[_Lanes, int]:
        """Its pool and its index there (:func:`~streamrt.video.live_group.shared_lanes` reads many at once)."""
        return self._pool, self._index

    def read(self) -> Any:
        item = self._pool._take(self._index)
        if item is None:
            return None
        picture, _, self.last_pts = item
        self.last_time = self._read / self._info.fps
        self._read += 1
        return picture

    def skip(self, count: int) -> int:
        skipped = 0
        while skipped < count and self._pool._take(self._index) is not None:
            skipped += 1
            self._read += 1
        return skipped

    def close(self) -> None:
        pass  # the pool owns the sessions


class NvdecPool:
    """NVDEC sessions for a set of video files, driven by ``workers`` threads (see the module docstring).

    Args:
        paths: one video file per stream (H.264, H.265, AV1; MP4/MKV/AVI/TS).
        workers: host threads feeding the sessions (each with its own CUDA stream).
        depth: decoded pictures queued per stream ahead of the pipeline.
        loop: start a file over at its end (benchmarks: streams as long as needed).
        gpu: the device ordinal.
        options: how sessions are created (:class:`NvdecOptions`; default primary context, decoder kept).

    Raises:
        MissingDependencyError: PyNvVideoCodec is not installed.
        SourceError: a file is missing or NVDEC cannot decode it.
    """

    def __init__(self, paths: Sequence[str | Path], *, workers: int = 4, depth: int = 4, loop: bool = False,
                 gpu: int = 0, options: NvdecOptions | None = None) -> None:
        import torch

        if workers < 1 or depth < 1:
            raise ConfigError(f"NVDEC pool needs workers >= 1 and depth >= 1, got {workers}, {depth}")
        _nvc()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._gpu, self._depth, self._loop, self._workers = gpu, depth, loop, workers
        self.options = options or NvdecOptions()
        self._streams = [torch.cuda.Stream(device=gpu) for _ in range(workers)]
        self._lanes: list[_Lane] = []
        self._infos: list[SourceInfo] = []
        for path in paths:
            self.add(path)
        self._threads = [threading.Thread(target=self._work, args=(w,), name=f"nvdec:{w}", daemon=True)
                         for w in range(workers)]
        for t in self._threads:
            t.start()

    def add(self, path: str | Path, *, skip: int = 0) -> NvdecSource:
        """Open one more stream (a new session), its first ``skip`` frames decoded and dropped."""
        path = Path(path)
        if not path.is_file():
            raise SourceError(f"video file not found: {path}")
        index = len(self._lanes)
        stream = self._streams[index % self._workers]
        try:
            session = _Session(path, self._gpu, stream, self._loop, self.options)
            for _ in range(skip):
                session.next()
            first = session.next()
        except Exception as exc:
            raise SourceError(f"NVDEC cannot decode {path}: {type(exc).__name__}: {exc}",
                              hint="check the codec with ffprobe (NVDEC: H.264, H.265, AV1, VP9)") from None
        if first is None:
            raise SourceError(f"video {path} has no decodable frames (corrupt or truncated)")
        session.synchronize()
        lane = _Lane(session, self._depth)
        lane.queue.append((first, time.perf_counter(), session.pts))
        rows, width = first.shape
        info = SourceInfo(path.name, int(width), int(rows) * 2 // 3, float(session.fps), None)
        with self._cond:
            self._lanes.append(lane)
            self._infos.append(info)
            self._cond.notify_all()
        return NvdecSource(self, index, info)

    def remove(self, index: int) -> None:
        """Stop decoding stream ``index`` and free its session (its source then ends)."""
        with self._cond:
            lane = self._lanes[index]
            lane.finished = True
            lane.queue.clear()
            self._cond.notify_all()

    def sources(self) -> list[NvdecSource]:
        """One frame source per path, in order."""
        return [NvdecSource(self, i, info) for i, info in enumerate(self._infos)]

    @property
    def decoded(self) -> int:
        """Pictures decoded so far, all streams."""
        return sum(lane.session.decoded for lane in self._lanes)

    def stats(self) -> dict[str, float]:
        """Decoders created, seconds spent creating them, and (``options.timing``) host seconds per phase."""
        sessions = [lane.session for lane in self._lanes]
        out = {"decoded": float(sum(s.decoded for s in sessions)), "opened": float(sum(s.opened for s in sessions)),
               "open_s": sum(s.open_s for s in sessions)}
        for phase in ("decode", "copy", "sync"):
            out[f"{phase}_s"] = sum(s.times[phase] for s in sessions)
        return out

    def _work(self, worker: int) -> None:
        def todo() -> list[_Lane]:
            mine = self._lanes[worker::self._workers]
            return [lane for lane in mine if not lane.finished and len(lane.queue) < lane.depth]

        while not self._stop.is_set():
            with self._cond:
                self._cond.wait_for(lambda: self._stop.is_set() or bool(todo()))
                lanes = todo()
            for lane in lanes:
                try:
                    picture = lane.session.next()
                    if picture is not None:
                        lane.session.synchronize()  # complete before any other stream reads it
                except BaseException as exc:  # handed to the reader
                    picture, lane.error = None, exc
                with self._cond:
                    if lane.finished:  # removed meanwhile
                        continue
                    if picture is None:
                        lane.finished = True
                    else:
                        lane.queue.append((picture, time.perf_counter(), lane.session.pts))
                    self._cond.notify_all()

    def _take(self, index: int) -> tuple[Any, float, Any] | None:
        lane = self._lanes[index]
        with self._cond:
            self._cond.wait_for(lambda: bool(lane.queue) or lane.finished or self._stop.is_set())
            if lane.queue:
                item = lane.queue.popleft()
                self._cond.notify_all()
                return item
        if lane.error is not None:
            raise SourceError(f"NVDEC failed on {lane.session.path}: {type(lane.error).__name__}: {lane.error}")
        return None

    def take_ready(self, indices: Sequence[int]) -> ReadyPictures:
        """The next decoded picture of each of ``indices`` that has one, without waiting, and which of the
        others ended or failed (:class:`~streamrt.video.live_group.LiveGroup` reads the streams this way:
        one lock for the set and no reader thread per stream)."""
        ready = ReadyPictures()
        with self._cond:
            for index in indices:
                lane = self._lanes[index]
                if lane.queue:
                    picture, _, pts = lane.queue.popleft()
                    ready.taken.append((index, picture, pts))
                elif lane.error is not None:
                    ready.failed[index] = (f"NVDEC failed on {lane.session.path}: "
                                           f"{type(lane.error).__name__}: {lane.error}")
                elif lane.finished or self._stop.is_set():
                    ready.ended.append(index)
            if ready.taken:
                self._cond.notify_all()  # the decoder threads: room in those queues
        return ready

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.perf_counter() + 10  # in all, not per thread: 200 sessions must not take 2,000 s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        for lane in self._lanes:
            lane.queue.clear()
            lane.finished = True

    def __enter__(self) -> NvdecPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_nvdec(paths: Sequence[str | Path], decoders: int, seconds: float = 5.0, gpu: int = 0,
                  options: NvdecOptions | None = None) -> dict[str, float]:
    """NVDEC alone: ``decoders`` sessions (paths cycled, files looped), one thread each, decoding as fast
    as they can for ``seconds`` after a warm-up; returns frames/s in aggregate and per session.
    (``scripts/gpu_nvdec_scaling.py`` measures more: host time, GIL waits, sessions that open.)"""
    import torch

    pool = NvdecPool([paths[i % len(paths)] for i in range(decoders)], workers=decoders, depth=8, loop=True,
                     gpu=gpu, options=options)
    sources = pool.sources()
    stop = threading.Event()
    counts = [0] * decoders

    def drain(i: int) -> None:
        while not stop.is_set() and sources[i].read() is not None:
            counts[i] += 1

    threads = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(decoders)]
    for t in threads:
        t.start()
    time.sleep(min(1.0, seconds / 4))  # warm-up: sessions at full speed
    start_counts, started = sum(counts), time.perf_counter()
    time.sleep(seconds)
    done, wall = sum(counts) - start_counts, time.perf_counter() - started
    stop.set()
    for t in threads:  # each returns after its next picture (the workers still run)
        t.join(timeout=10)
    pool.close()
    torch.cuda.synchronize(gpu)
    return {"decoders": decoders, "fps": done / wall, "fps_per_decoder": done / wall / decoders}
