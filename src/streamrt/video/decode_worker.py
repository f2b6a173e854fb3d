"""The worker side of :mod:`streamrt.video.decode_processes`: what runs in a decoder process.

A worker owns a share of the pool's streams: for each, a decoder (NVDEC on the pool's GPU, or the
CPU stand-in) and a thread that fills the stream's ring slots as the detector process hands them
back, announcing ``(stream, slot, pts)`` on the event queue once a slot is complete (see the
hand-over in :mod:`~streamrt.video.decode_processes`). Commands arrive over a :class:`_Link`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from streamrt.video.decode_nvdec import NvdecOptions
from streamrt.video.sources import SourceError

__all__ = ["KINDS"]

log = logging.getLogger(__name__)

KINDS = ("nvdec", "cpu")


class _NvdecDecoder:
    """One NVDEC session in a worker: its first picture decoded at open (the shape the ring needs)."""

    def __init__(self, path: Path, gpu: int, loop: bool, options: NvdecOptions, skip: int) -> None:
        import torch

        from streamrt.video.decode_nvdec import _Session

        self.stream = torch.cuda.Stream(device=gpu)
        self.session = _Session(path, gpu, self.stream, loop, options)
        for _ in range(skip):
            self.session.next()
        self._first: Any = self.session.next()
        if self._first is None:
            raise SourceError(f"video {path} has no decodable frames (corrupt or truncated)")
        self.session.synchronize()
        self._first_pts = self.session.pts
        self.shape = tuple(self._first.shape)
        self.fps = float(self.session.fps)

    def fill(self, out: Any) -> tuple[bool, Any]:
        """The next picture into ``out`` (complete when this returns) and its pts; False at the end."""
        import torch

        if self._first is not None:
            with torch.cuda.stream(self.stream):
                out.copy_(self._first)
            self._first, pts = None, self._first_pts
        else:
            if self.session.next(out) is None:
                return False, None
            pts = self.session.pts
        self.session.synchronize()  # complete in device memory before the detector process hears of it
        return True, pts

    def close(self) -> None:
        self.session = None  # type: ignore[assignment]


class _CpuDecoder:
    """The CI stand-in: a CPU NV12 decoder (PyAV, else OpenCV), looped, the frame index as its pts."""

    def __init__(self, path: Path, loop: bool, skip: int) -> None:
        from streamrt.video.decoding import open_nv12

        self.path, self.loop, self._open = path, loop, open_nv12
        self._src = open_nv12(path)
        self._k = 0
        self._first = self._read()
        for _ in range(skip):
            self._first = self._read()
        if self._first is None:
            raise SourceError(f"video {path} has no decodable frames (corrupt or truncated)")
        self.shape = tuple(self._first.shape)
        self.fps = float(self._src.info.fps)

    def _read(self) -> Any:
        frame = self._src.read()
        if frame is None and self.loop and self._k:
            from streamrt.video.decoding import start_over

            self._src, self._k = start_over(self._src, lambda: self._open(self.path)), 0
            frame = self._src.read()
        if frame is not None:
            self.pts, self._k = self._k, self._k + 1
        return frame

    def fill(self, out: Any) -> tuple[bool, Any]:
        import torch

        frame, self._first = (self._first, None) if self._first is not None else (self._read(), None)
        if frame is None:
            return False, None
        out.copy_(torch.from_numpy(frame))
        return True, self.pts

    def close(self) -> None:
        self._src.close()


class _WorkerLane:
    """A stream inside a worker: its decoder, the shared ring, the slots the detector handed back."""

    def __init__(self, stream: int, decoder: Any) -> None:
        self.stream, self.decoder = stream, decoder
        self.ring: Any = None
        self.free: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def run(self, events: Any) -> None:
        try:
            while (slot := self.free.get()) is not None:
                ok, pts = self.decoder.fill(self.ring[slot])
                if not ok:
                    events.put(("end", self.stream))
                    return
                events.put(("frame", self.stream, slot, pts))
        except BaseException as exc:  # the detector process raises it for this stream
            events.put(("error", self.stream, f"{type(exc).__name__}: {exc}"))

    def stop(self) -> None:
        self.free.put(None)


def _open_decoder(kind: str, path: str, gpu: int, loop: bool, options: NvdecOptions, skip: int) -> Any:
    if kind == "cpu":
        return _CpuDecoder(Path(path), loop, skip)
    return _NvdecDecoder(Path(path), gpu, loop, options, skip)


class _Link:
    """One end of a worker's duplex pipe: ``put`` from any thread (a lock), ``get`` from one.

    A pipe rather than ``multiprocessing.Queue``: no feeder thread and no cross-process lock per
    message (5,000 pictures/s cross it twice, announced and handed back), and the tensors still
    travel by torch's reducers (``Connection.send`` pickles with the same ForkingPickler).
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def put(self, message: Any) -> None:
        with self._lock:
            self.conn.send(message)

    def get(self, timeout: float) -> Any:
        """The next message; ``queue.Empty`` after ``timeout``, EOFError when the other end closed."""
        if not self.conn.poll(timeout):
            raise queue.Empty
        return self.conn.recv()

    def close(self) -> None:
        self.conn.close()


def _worker(worker: int, kind: str, gpu: int, options: NvdecOptions, conn: Any, niceness: int = 0) -> None:
    """A decoder process's entry: :func:`_worker_main` over its pipe, then ``os._exit``.

    The interpreter's own exit after the decoders close spends about a second in native teardown
    (no Python frame left); nothing is left to clean up by then, so the process ends at once.
    """
    import os
    import traceback

    code, link = 0, _Link(conn)
    try:
        _worker_main(worker, kind, gpu, options, link, link, niceness)
    except BaseException:  # the detector process reads the exit code
        traceback.print_exc()
        code = 1
    link.close()
    os._exit(code)


def _worker_main(worker: int, kind: str, gpu: int, options: NvdecOptions, commands: Any, events: Any,
                 niceness: int = 0) -> None:
    """A decoder process: opens the sessions it is asked for, decodes into the slots it is handed.

    ``niceness``: added to the process's scheduling niceness first (``os.nice``), so that under contention for
    the cores it yields to the processes that must never wait (the consumer, the NVDEC decoder processes).
    """
    import multiprocessing
    import os

    if niceness:
        os.nice(niceness)

    import torch  # now, not inside the first ring's unpickling: that would look like a stall

    from streamrt.pipeline.collector import configure_collector, settle_heap

    torch.set_num_threads(1)  # a picture's copy needs no thread pool; N processes' pools would fight for cores
    if kind == "cpu":  # one core per CPU decoder process: OpenCV's colour conversion without its thread pool
        from streamrt._optional import available

        if available("cv2"):
            import cv2

            cv2.setNumThreads(1)
    if kind == "nvdec":
        torch.cuda.set_device(gpu)  # the rings arrive on this device
    # a process of ours that must never stall: torch's ~165,000 objects frozen out of the collections (a full one
    # took 63 ms on the CI machine, longer than the two frames each of its streams queues), young ones rarer
    configure_collector()
    settle_heap()

    parent = multiprocessing.parent_process()
    lanes: dict[int, _WorkerLane] = {}
    try:
        while True:
            try:
                command = commands.get(timeout=1.0)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return  # the detector process is gone: nobody to decode for
                continue
            except EOFError:  # the detector process closed its end
                return
            op = command[0]
            if op == "stop":
                return
            stream = command[1]
            if op == "open":
                path, loop, skip = command[2:]
                try:
                    lanes[stream] = _WorkerLane(stream, _open_decoder(kind, path, gpu, loop, options, skip))
                except BaseException as exc:  # the opener raises it
                    events.put(("error", stream, f"{type(exc).__name__}: {exc}"))
                    continue
                decoder = lanes[stream].decoder
                events.put(("opened", stream, decoder.shape, decoder.fps))
            elif op == "ring":
                lane = lanes[stream]
                lane.ring = command[2]
                for slot in range(int(lane.ring.shape[0])):
                    lane.free.put(slot)
                lane.thread = threading.Thread(target=lane.run, args=(events,), name=f"decode:{stream}", daemon=True)
                lane.thread.start()
            elif op == "free" and stream in lanes:
                lanes[stream].free.put(command[2])
            elif op == "free_many":  # (stream, slot) pairs of several streams, handed back together
                for index, slot in command[1]:
                    if index in lanes:
                        lanes[index].free.put(slot)
            elif op == "remove" and stream in lanes:
                lanes.pop(stream).stop()
    finally:
        for lane in lanes.values():
            lane.stop()
        deadline = time.monotonic() + 5
        for lane in lanes.values():
            if lane.thread is not None:
                lane.thread.join(timeout=max(0.0, deadline - time.monotonic()))
            lane.decoder.close()
            lane.ring = None  # the IPC mapping goes before the process does
        lanes.clear()
