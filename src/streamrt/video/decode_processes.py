"""Decoder processes: NVDEC sessions in worker processes, pictures handed to the detector by CUDA IPC.

On the H200 (docs/benchmarks/2026-12-02-h200-nvdec.md) NVDEC inside one Python process binds at
~2,000-2,800 frames/s (the GIL and per-frame host work), while the same sessions split over 4
processes reach 5,134 frames/s, 99% of the 7 engines' bound. :class:`ProcessDecodePool` is that
split for the detector: ``processes`` spawned workers each own a share of the streams' sessions
(streams dealt round-robin, a thread per session inside the worker) and hand every picture to the
detector process without a host round trip.

The hand-over, per stream:

1. The detector process allocates a ring of ``slots`` frame slots, one (slots, H * 3 / 2, W) uint8
   tensor on the GPU (host shared memory for ``kind="cpu"``), and sends it to the stream's worker
   through a ``torch.multiprocessing`` queue (spawn context): a CUDA tensor travels as an IPC handle.
   PyTorch's rule for CUDA IPC is that the sending process keeps the tensor alive while the receiver
   uses it: the ring lives in the pool until every worker has exited.
2. The worker decodes into a free slot (a copy from the decoder's surface on the session's own
   stream), synchronises that stream (the slot is complete in device memory before anyone hears of
   it) and announces ``(stream, slot, pts)`` on the pool's event queue.
3. A stream's reader (a :class:`~streamrt.video.decode_nvdec.NvdecSource`, the in-process pool's
   source) copies the slot into a picture of its own on the stream's copy stream, waits for that
   copy, and hands the slot back (a ``free`` command to the worker): the picture it returns is
   complete and owned, as the in-process pool's are, so the pipeline may keep it as long as it
   likes and read it on any stream.

Frames of one stream come from one worker thread through one queue, so they arrive in order. A
worker that dies fails its streams with an error naming the process and its exit code; a stream
that gets no picture for ``timeout_s`` fails with a timeout; :meth:`ProcessDecodePool.close` stops
the workers (terminating those that do not stop within 10 s) and frees the rings after they exit.

``kind="cpu"`` runs the same code with a CPU decoder (:func:`~streamrt.video.decoding.open_nv12`)
in the workers and host shared-memory slots: the CI stand-in, and the CPU side of hybrid decode.
With ``upload=True`` the detector process page-locks those rings (``cudaHostRegister``) and delivers
every picture on the GPU, one DMA from the slot to the device and no host copy: without it a CPU
picture cost a host copy out of the ring and then a pageable upload in the detector's gather (on the
H200, 185 hybrid streams: 19.5 ms per engine call of 93 pictures, against 0.87 ms with NVDEC alone).

Example:
    >>> pool = ProcessDecodePool(["a.mp4", "b.mp4"], processes=2, loop=True)   # doctest: +SKIP
    >>> picture = pool.sources()[0].read(); picture.device                      # doctest: +SKIP
    device(type='cuda', index=0)
    >>> pool.close()                                                             # doctest: +SKIP
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt.errors import ConfigError, PipelineError
from streamrt.video.decode_nvdec import NvdecOptions, NvdecSource
from streamrt.video.decode_worker import KINDS, _Link, _worker
from streamrt.video.live_group import ReadyPictures
from streamrt.video.sources import SourceError, SourceInfo

__all__ = ["KINDS", "ProcessDecodePool"]

log = logging.getLogger(__name__)

_POLL_S = 0.2  # how often the dispatcher looks at the workers' exit codes


# -- the detector process -----------------------------------------------------------------------


@dataclass
class _Lane:
    """A stream as the detector process sees it: its worker, its ring, the slots announced and not yet read."""

    path: Path
    worker: int
    ring: Any = None
    ready: collections.deque[tuple[int, Any]] = field(default_factory=collections.deque)
    finished: bool = False
    error: str | None = None
    announced: int = 0
    stream: Any = None  # the CUDA stream the reader copies out on
    wake: threading.Condition = field(default_factory=threading.Condition)  # on the pool's lock


class ProcessDecodePool:
    """Streams decoded in ``processes`` worker processes, :class:`~streamrt.video.decode_nvdec.NvdecPool`'s
    interface (``sources()``, ``add(path, skip=)``, ``remove(i)``, ``stats()``, ``close()``).

    Args:
        paths: one video file per stream.
        processes: worker processes (spawned); streams are dealt over them round-robin.
        kind: ``nvdec`` (NVDEC sessions, CUDA slots) or ``cpu`` (CPU decoders, host shared-memory slots).
        slots: frame slots per stream (how far a worker decodes ahead of the reader).
        loop: start a file over at its end (benchmarks).
        gpu: the device ordinal.
        options: how NVDEC sessions are created (:class:`~streamrt.video.decode_nvdec.NvdecOptions`).
        timeout_s: a stream that gets no picture for this long fails (a hung worker is not a hang).
        start_timeout_s: how long opening a stream may take (the first one starts a worker's CUDA).
        upload: ``kind="cpu"`` only: page-lock the shared rings in this process and deliver pictures on GPU
            ``gpu``, copied by DMA straight from their slots (where a ring cannot be locked, its copies are
            pageable and a warning says so).
        niceness: added to each worker's scheduling niceness (0-19, POSIX ``nice``), so that CPU decoders beside
            NVDEC decoder processes and the consumer yield their cores to them under contention. Measured on an
            H100 host on 2026-12-06 (+5 against 0, 160 hybrid streams): no fewer drops, 8-17% less CPU decoding,
            so :class:`~streamrt.video.hybrid.HybridDecode` leaves it at 0 unless asked.

    Raises:
        ConfigError: a bad count or kind.
        SourceError: a file is missing, cannot be decoded, or its worker does not answer.
    """

    def __init__(self, paths: Sequence[str | Path], *, processes: int = 4, kind: str = "nvdec", slots: int = 4,
                 loop: bool = False, gpu: int = 0, options: NvdecOptions | None = None, timeout_s: float = 30.0,
                 start_timeout_s: float = 180.0, upload: bool = False, niceness: int = 0) -> None:
        if not 0 <= niceness <= 19:
            raise ConfigError(f"a decoder-process pool's niceness must be within 0-19 (added to the workers' own), "
                              f"got {niceness}")
        if processes < 1 or slots < 1:
            raise ConfigError(f"a decoder-process pool needs processes >= 1 and slots >= 1, got {processes}, {slots}")
        if kind not in KINDS:
            raise ConfigError(f"decoder-process kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if upload and kind != "cpu":
            raise ConfigError("upload=True is for kind='cpu' decoder processes: NVDEC pictures are on the GPU already")
        import torch
        import torch.multiprocessing as tmp

        if upload and not torch.cuda.is_available():
            raise ConfigError("upload=True delivers pictures on the GPU, and torch sees no CUDA GPU here",
                              hint="leave upload off on a CPU-only machine")
        self.kind, self.processes, self._slots, self._loop, self._gpu = kind, processes, slots, loop, gpu
        self.options = options or NvdecOptions()
        self._timeout, self._start_timeout = timeout_s, start_timeout_s
        self._device = torch.device("cpu") if kind == "cpu" else torch.device("cuda", gpu)  # where the rings are
        self.upload = upload
        self._deliver = torch.device("cuda", gpu) if kind != "cpu" or upload else self._device  # the pictures
        self._locked: list[int] = []  # ring addresses page-locked in this process (upload)
        context = tmp.get_context("spawn")  # CUDA in a child needs spawn; the tensors travel by torch's reducers
        pipes = [context.Pipe(duplex=True) for _ in range(processes)]
        self._links = [_Link(mine) for mine, _ in pipes]
        self._procs = [context.Process(target=_worker, name=f"decoder:{w}", daemon=True,
                                       args=(w, kind, gpu, self.options, theirs, niceness))
                       for w, (_, theirs) in enumerate(pipes)]
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # replies to opens; each stream has its own on this lock
        self._lanes: list[_Lane] = []
        self._infos: list[SourceInfo] = []
        self._replies: dict[int, tuple[Any, ...]] = {}
        self._dead: dict[int, str] = {}
        self._closing = False
        self._copy_stream: Any = None  # take_ready's (CUDA pools)
        self._exited = threading.Event()
        for proc, (_, theirs) in zip(self._procs, pipes, strict=True):
            proc.start()
            theirs.close()  # the worker's end lives in the worker only: its exit reads as EOF here
        self._dispatcher = threading.Thread(target=self._dispatch, name=f"decoder-events:{kind}", daemon=True)
        self._dispatcher.start()
        try:
            self.add_many([(p, 0) for p in paths])
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int | None]:
        """The worker processes' ids."""
        return [p.pid for p in self._procs]

    def add(self, path: str | Path, *, skip: int = 0) -> NvdecSource:
        """Open one more stream, its first ``skip`` frames decoded and dropped."""
        return self.add_many([(path, skip)])[0]

    def add_many(self, items: Sequence[tuple[str | Path, int]]) -> list[NvdecSource]:
        """Open several streams at once (every worker opens its share in parallel)."""
        import torch

        indices = []
        for path, skip in items:
            path = Path(path)
            if not path.is_file():
                raise SourceError(f"video file not found: {path}")
            with self._cond:
                index = len(self._lanes)
                # live once its ring is sent; its own condition on the pool's lock: an event wakes its reader only
                self._lanes.append(_Lane(path, index % self.processes, finished=True,
                                         wake=threading.Condition(self._lock)))
                self._infos.append(SourceInfo(path.name, 0, 0, 30.0, None))
            self._send(index % self.processes, ("open", index, str(path), self._loop, skip))
            indices.append(index)
        sources = []
        for index in indices:
            lane = self._lanes[index]
            reply = self._reply(index)
            if reply[0] != "opened":
                hint = ("its traceback is on stderr" if lane.worker in self._dead
                        else "check the codec with ffprobe (NVDEC: H.264, H.265, AV1, VP9)")
                raise SourceError(f"decoder process {lane.worker} cannot decode {lane.path}: {reply[2]}", hint=hint)
            rows, width = reply[2]
            ring = torch.empty((self._slots, rows, width), dtype=torch.uint8, device=self._device)
            if self.kind == "cpu":
                ring.share_memory_()
                if self.upload:
                    self._page_lock(ring)
            if self._deliver.type == "cuda":
                lane.stream = torch.cuda.Stream(device=self._gpu)
            info = SourceInfo(lane.path.name, int(width), int(rows) * 2 // 3, float(reply[3]), None)
            with self._cond:
                lane.ring, lane.finished = ring, False
                self._infos[index] = info
            self._send(lane.worker, ("ring", index, ring))
            sources.append(NvdecSource(self, index, info))
        return sources

    def _page_lock(self, ring: Any) -> None:
        """Page-lock a host ring for direct uploads; a ring that cannot be locked is copied pageable."""
        from streamrt.device.staging import cuda_host_register

        try:
            locked = cuda_host_register(ring.data_ptr(), ring.numel())
        except PipelineError as exc:
            locked, why = False, exc.message
        else:
            why = "cudaHostRegister failed"
        if locked:
            self._locked.append(ring.data_ptr())
        else:
            log.warning("CPU decoder ring not page-locked (%s): its uploads are pageable copies", why)

    @property
    def page_locked(self) -> int:
        """Rings page-locked for direct uploads (``upload=True``)."""
        return len(self._locked)

    def remove(self, index: int) -> None:
        """Stop decoding stream ``index`` (its source then ends; its ring is freed at close)."""
        with self._cond:
            lane = self._lanes[index]
            lane.finished = True
            lane.ready.clear()
            lane.wake.notify_all()
        self._send(lane.worker, ("remove", index), quiet=True)

    def sources(self) -> list[NvdecSource]:
        """One frame source per stream, in order."""
        return [NvdecSource(self, i, info) for i, info in enumerate(self._infos)]

    @property
    def decoded(self) -> int:
        """Pictures announced by the workers so far, all streams."""
        return sum(lane.announced for lane in self._lanes)

    def stats(self) -> dict[str, float]:
        """Pictures decoded and sessions open (``scripts/gpu_nvdec_scaling.py``'s columns)."""
        return {"decoded": float(self.decoded), "opened": float(len(self._lanes))}

    # -- the hand-over ---------------------------------------------------------------------------

    def _send(self, worker: int, command: tuple[Any, ...], quiet: bool = False) -> None:
        try:
            if worker in self._dead:
                raise SourceError(self._dead[worker])
            self._links[worker].put(command)
        except (SourceError, OSError) as exc:  # OSError: a broken pipe, the worker gone
            if not quiet:
                raise SourceError(f"decoder process {worker} is gone: {exc}") from None

    def _reply(self, index: int) -> tuple[Any, ...]:
        deadline = time.monotonic() + self._start_timeout
        lane = self._lanes[index]
        with self._cond:
            while index not in self._replies:
                if lane.worker in self._dead:
                    return ("error", index, self._dead[lane.worker])
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("error", index, f"no answer in {self._start_timeout:.0f} s")
                self._cond.wait(left)
            return self._replies.pop(index)

    def _take(self, index: int) -> tuple[Any, float, Any] | None:
        """Stream ``index``'s next picture (owned, complete), when it came and its pts; None at its end
        (what :class:`~streamrt.video.decode_nvdec.NvdecSource` reads)."""
        item = self._announced(index)
        if item is None:
            return None
        slot, pts = item
        return self._copy_out(index, slot), time.perf_counter(), pts

    def _announced(self, index: int) -> tuple[int, Any] | None:
        """The next announced (slot, pts) of stream ``index``, waiting at most ``timeout_s``."""
        lane = self._lanes[index]
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                if lane.ready:
                    return lane.ready.popleft()
                if lane.error is not None:
                    raise SourceError(f"decoding {lane.path.name} failed: {lane.error}")
                if lane.finished or self._closing:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SourceError(f"no picture of {lane.path.name} from decoder process {lane.worker} in "
                                      f"{self._timeout:.0f} s", hint="the worker is stuck or overloaded")
                lane.wake.wait(left)

    def take_ready(self, indices: Sequence[int]) -> ReadyPictures:
        """One announced picture of each of ``indices`` that has one, copied out together, without waiting;
        and which of the others ended or failed.

        What :class:`~streamrt.video.live_group.LiveGroup` reads: one copy stream, one synchronisation and
        one ``free_many`` message per worker for the whole set, where :meth:`_take` costs every picture a
        reader thread, a synchronisation and a message (100 streams: 3,000 of each per second).
        """
        import torch

        ready, picked = ReadyPictures(), []
        with self._cond:
            for index in indices:
                lane = self._lanes[index]
                if lane.ready and lane.ring is not None:
                    slot, pts = lane.ready.popleft()
                    picked.append((index, lane.worker, lane.ring, slot, pts))
                elif lane.error is not None:
                    ready.failed[index] = f"decoding {lane.path.name} failed: {lane.error}"
                elif lane.finished or self._closing:
                    ready.ended.append(index)
        if not picked:
            return ready
        # One stacked copy for the set (one launch, one allocation, the GIL given up once), handed out
        # as views: a picture's memory is freed when the last view of its set is gone.
        slots = [ring[slot] for _, _, ring, slot, _ in picked]
        if self._deliver.type == "cpu":
            pictures = list(torch.stack(slots).unbind(0))
        else:
            if self._copy_stream is None:  # high priority: a copy-out is never queued behind the engine
                self._copy_stream = torch.cuda.Stream(device=self._gpu, priority=-1)
            with torch.cuda.stream(self._copy_stream):
                if self.kind == "cpu":  # page-locked host slots: one DMA each into the set, under one GIL release
                    pictures = list(torch.empty((len(slots), *slots[0].shape), dtype=torch.uint8,
                                                device=self._deliver).unbind(0))
                    torch._foreach_copy_(pictures, slots, non_blocking=True)
                else:
                    pictures = list(torch.stack(slots).unbind(0))
            self._copy_stream.synchronize()  # every copy done before the workers may overwrite the slots
        frees: dict[int, list[tuple[int, int]]] = {}
        for index, worker, _, slot, _ in picked:
            frees.setdefault(worker, []).append((index, slot))
        for worker, items in frees.items():
            self._send(worker, ("free_many", items), quiet=True)
        ready.taken = [(index, picture, pts) for (index, _, _, _, pts), picture in zip(picked, pictures, strict=True)]
        return ready

    def _copy_out(self, index: int, slot: int) -> Any:
        """Slot ``slot`` of stream ``index`` copied into a picture of its own; the slot handed back."""
        import torch

        lane = self._lanes[index]
        if lane.stream is None:
            picture = lane.ring[slot].clone()
        else:  # a device ring's slot, or a page-locked host one (upload)
            with torch.cuda.stream(lane.stream):
                picture = torch.empty_like(lane.ring[slot], device=self._deliver).copy_(lane.ring[slot],
                                                                                       non_blocking=True)
            lane.stream.synchronize()  # the copy is done before the worker may overwrite the slot
        self._send(lane.worker, ("free", index, slot), quiet=True)
        return picture

    def _dispatch(self) -> None:
        """Route the workers' events to the streams; notice workers that died."""
        from multiprocessing.connection import wait

        live: list[Any] = [link.conn for link in self._links]
        checked = time.monotonic()
        while not self._exited.is_set():
            events: list[Any] = []
            ready: list[Any] = wait(live, timeout=_POLL_S) if live else []
            for conn in ready:
                try:
                    events.append(conn.recv())
                    while len(events) < 256 and conn.poll(0):  # a burst under one acquisition of the lock
                        events.append(conn.recv())
                except (EOFError, OSError):  # the worker's end closed: it exited (its exit code follows)
                    live.remove(conn)
            if not live:
                time.sleep(_POLL_S)
            with self._lock:
                for event in events:
                    self._route(event)
                if not events or time.monotonic() - checked > _POLL_S:
                    checked = time.monotonic()
                    self._check_workers()

    def _route(self, event: tuple[Any, ...]) -> None:
        """One event to its stream (and only that stream's reader woken: 56 readers, 5,000 events/s)."""
        op, index = event[0], event[1]
        lane = self._lanes[index] if index < len(self._lanes) else None
        if op == "opened" or (op == "error" and lane is not None and lane.ring is None):
            self._replies[index] = event
            self._cond.notify_all()
            return
        if lane is None:
            return
        if op == "frame" and not lane.finished:
            lane.ready.append((event[2], event[3]))
            lane.announced += 1
        elif op == "error":
            lane.error, lane.finished = str(event[2]), True
        elif op == "end":
            lane.finished = True
        lane.wake.notify()

    def _check_workers(self) -> None:
        for w, proc in enumerate(self._procs):
            if w in self._dead or proc.exitcode is None:
                continue
            self._dead[w] = f"decoder process {w} (pid {proc.pid}) exited with code {proc.exitcode}"
            if not self._closing:
                log.error("%s", self._dead[w])
            for lane in self._lanes:
                if lane.worker == w and lane.error is None and not (lane.finished and lane.ring is not None):
                    lane.error, lane.finished = self._dead[w], True
            self._wake_all()

    def _wake_all(self) -> None:
        """Every waiting reader and opener (the lock held)."""
        self._cond.notify_all()
        for lane in self._lanes:
            lane.wake.notify_all()

    def close(self) -> None:
        """Stop the workers (terminate those that do not stop in 10 s), then free the rings."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._wake_all()
        for w in range(self.processes):
            self._send(w, ("stop",), quiet=True)
        # the dispatcher keeps draining events meanwhile: no worker blocks on a full pipe
        deadline = time.monotonic() + 10
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                log.warning("decoder process %s did not stop; terminating it", proc.pid)
                proc.terminate()
                proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        self._exited.set()
        self._dispatcher.join(timeout=2)
        for link in self._links:
            link.close()
        if self._locked:  # unlocked before the rings' memory can be unmapped
            from streamrt.device.staging import cuda_host_unregister

            for address in self._locked:
                cuda_host_unregister(address, 0)
            self._locked.clear()
        with self._cond:
            for lane in self._lanes:
                lane.ring, lane.finished = None, True
                lane.ready.clear()
        import torch

        if self.kind != "cpu" and torch.cuda.is_initialized():
            torch.cuda.ipc_collect()  # rings the workers held, now released

    def __enter__(self) -> ProcessDecodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
