"""Measured capacity of this machine for one detection setup: decode frames/s and engine frames/s.

Admission control (:mod:`streamrt.video.admission`) needs to know how many frames per second the
decoders and the engine can take before it admits cameras. A :class:`CapacityRecord` holds both,
for one (codec, resolution, decoder kind, plan, machine): the decode side is measured with the
hybrid policy's own probe (:func:`streamrt.video.hybrid.measure_capacity`, one single-threaded
PyAV decoder's rate times the cores, plus NVDEC where it exists), the engine side by a short
bounded loop of inferences at the run's batch. Probes take seconds, so the record is written to
``<cache dir>/capacity/<key>.json`` and read back by later runs with its age; ``streamrt detect
--remeasure`` ignores the cached one.

Sources that are not video files (synthetic clips, image folders, frames in memory) have no
decoder: their decode capacity is unbounded and the engine alone binds.

Example:
    >>> rec = CapacityRecord("h264", 1920, 1080, "cpu", decode_fps=1420.0, engine_fps=2000.0,
    ...                      plan="ab12", machine="host")
    >>> rec.capacity_fps, rec.binding
    (1420.0, 'decode')
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.config import default_cache_dir
from streamrt.video.model import DetectorModel

__all__ = ["CapacityRecord", "capacity_for", "capacity_path", "measure_engine", "plan_id", "probe_codec"]

log = logging.getLogger(__name__)

NO_DECODER = "none"  # frames that need no decoding (synthetic, images, memory)


@dataclass(frozen=True)
class CapacityRecord:
    """Decode and engine capacity (frames/s) for one setup, and when it was measured.

    Attributes:
        codec, width, height: the streams' codec (``raw`` for undecoded frames) and picture size.
        decoder: ``cpu``, ``nvdec`` or ``none``.
        decode_fps: frames/s the decoder pool decodes in total (``inf`` without a decoder).
        engine_fps: frames/s the detector plan runs at the run's batch.
        plan: :func:`plan_id` of the detector.
        machine: host name (and GPU where there is one).
        measured_at: UNIX time of the measurement.
        batch: the batch the engine was measured at.
    """

    codec: str
    width: int
    height: int
    decoder: str
    decode_fps: float
    engine_fps: float
    plan: str
    machine: str
    measured_at: float = 0.0
    batch: int = 1

    @property
    def capacity_fps(self) -> float:
        """The binding side's frames/s."""
        return min(self.decode_fps, self.engine_fps)

    @property
    def binding(self) -> str:
        """``decode`` or ``engine``: the side that limits."""
        return "decode" if self.decode_fps <= self.engine_fps else "engine"

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.measured_at)

    def describe(self) -> str:
        """``decode capacity 1,420 frames/s (cpu, h264 1920x1080)`` or the engine's equivalent."""
        if self.binding == "decode":
            return (f"decode capacity {self.decode_fps:,.0f} frames/s ({self.decoder}, {self.codec} "
                    f"{self.width}x{self.height})")
        return f"engine capacity {self.engine_fps:,.0f} frames/s (plan {self.plan}, batch {self.batch})"

    def key(self) -> str:
        return capacity_key(self.codec, self.width, self.height, self.decoder, self.plan, self.machine)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["decode_fps"] = None if math.isinf(self.decode_fps) else self.decode_fps
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        if values.get("decode_fps") is None:
            values["decode_fps"] = math.inf
        return cls(**values)


def machine_name() -> str:
    """Host name, plus the GPU's name where CUDA is up (a record is only valid on its machine)."""
    name = socket.gethostname()
    try:
        import torch

        if torch.cuda.is_available():
            name += "-" + torch.cuda.get_device_name()
    except ImportError:
        pass
    return name


def plan_id(model: DetectorModel) -> str:
    """A short hash of the detector's plan manifest (the engine's identity), else of its description."""
    manifest = getattr(model.engine, "manifest", None)
    payload: Any = manifest.to_dict() if manifest is not None else [model.source, model.backend, model.input_hw,
                                                                     type(model.engine).__name__]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def capacity_key(codec: str, width: int, height: int, decoder: str, plan: str, machine: str) -> str:
    raw = f"{codec}_{width}x{height}_{decoder}_{plan}_{machine}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw)


def capacity_path(key: str, cache_dir: str | Path | None = None) -> Path:
    """Where the record of ``key`` lives: ``<cache dir>/capacity/<key>.json``."""
    return Path(cache_dir or default_cache_dir()) / "capacity" / f"{key}.json"


_FOURCC_CODECS = {"avc1": "h264", "h264": "h264", "x264": "h264", "hev1": "hevc", "hvc1": "hevc", "hevc": "hevc",
                  "h265": "hevc", "av01": "av1", "vp09": "vp9", "vp80": "vp8", "mp4v": "mpeg4", "mjpg": "mjpeg"}


def probe_codec(path: str | Path) -> str:
    """The video codec of a file (``h264``, ``hevc``...), ``raw`` for anything that is not a video file. PyAV
    reads it; where PyAV is missing (the H200 image), OpenCV's FourCC (an H.264 file was keyed ``raw`` there)."""
    p = Path(path)
    if not p.is_file():
        return "raw"
    try:
        import av
    except ImportError:
        return _fourcc_codec(p)
    try:
        with av.open(str(p)) as container:
            return str(container.streams.video[0].codec_context.name)
    except Exception:  # not a video PyAV reads (an image): treated as undecoded frames
        return "raw"


def _fourcc_codec(path: Path) -> str:
    try:
        import cv2
    except ImportError:
        return "raw"
    capture = cv2.VideoCapture(str(path))
    try:
        code = int(capture.get(cv2.CAP_PROP_FOURCC)) if capture.isOpened() else 0
    finally:
        capture.release()
    fourcc = "".join(chr((code >> 8 * i) & 0xFF) for i in range(4)).strip("\x00 ").lower()
    return _FOURCC_CODECS.get(fourcc, fourcc or "raw") if code else "raw"


def measure_engine(model: DetectorModel, batch: int = 1, seconds: float = 1.0, max_calls: int = 200) -> float:
    """Frames/s of ``model``'s engine at ``batch`` on random input: a bounded loop of inferences."""
    rng = np.random.default_rng()
    x = rng.random((batch, 3, *model.input_hw), dtype=np.float32).astype(model.input_dtype)
    ctx = model.engine.create_context()
    sync: Any = None
    feed: Any = x
    if model.device == "cuda":
        import torch

        feed, sync = torch.from_numpy(x).to("cuda"), torch.cuda.synchronize
    ctx.infer({model.input_name: feed})  # warm-up: lazy initialisation stays out of the rate
    if sync is not None:
        sync()
    calls, started = 0, time.perf_counter()
    while calls < max_calls and (calls < 3 or time.perf_counter() - started < seconds):
        ctx.infer({model.input_name: feed})
        calls += 1
    if sync is not None:
        sync()
    return calls * batch / max(time.perf_counter() - started, 1e-9)


def capacity_for(model: DetectorModel, source: str, width: int, height: int, *, batch: int = 1,
                 cache_dir: str | Path | None = None, remeasure: bool = False, seconds: float = 1.0,
                 decoder: str | None = None, measure_decode: Callable[[], float] | None = None) -> CapacityRecord:
    """The capacity record for streams like ``source``: from the cache, else measured and cached.

    Args:
        model: the detector the run uses.
        source: one stream's source spec (a video file is probed for its codec and decoded).
        width, height: the streams' picture size.
        batch: the run's engine batch.
        cache_dir: StreamRT's cache dir (default ``$STREAMRT_CACHE`` or ``~/.cache/streamrt``).
        remeasure: measure even when a cached record exists.
        seconds: length of each probe.
        decoder, measure_decode: how the run decodes when it is not this process's own decoder (``nvdec in 4
            processes``, ``nvdec+cpu``) and how to measure that (frames/s); the record is kept under that name.
    """
    codec = probe_codec(source)
    if (decoder is None) != (measure_decode is None):
        raise ValueError("capacity_for: give decoder and measure_decode together")
    if decoder is None:
        decoder = "cpu" if codec != "raw" else NO_DECODER
        from streamrt.video.decode_nvdec import nvdec_available

        if decoder == "cpu" and nvdec_available():
            decoder = "nvdec"
    key = capacity_key(codec, width, height, decoder, plan_id(model), machine_name())
    path = capacity_path(key, cache_dir)
    if path.is_file() and not remeasure:
        try:
            record = CapacityRecord.from_dict(json.loads(path.read_text()))
            log.info("capacity from %s (%.0f s old): %s", path, record.age_s, record.describe())
            return record
        except (ValueError, TypeError) as exc:
            log.warning("ignoring unreadable capacity record %s (%s); measuring", path, exc)
    decode = math.inf
    if measure_decode is not None:
        decode = measure_decode()
    elif decoder != NO_DECODER:
        from streamrt.video.hybrid_capacity import measure_capacity

        pools = measure_capacity(source, seconds=seconds)
        decode = pools.get(decoder, pools["cpu"])
    record = CapacityRecord(codec, width, height, decoder, decode, measure_engine(model, batch, seconds),
                            plan_id(model), machine_name(), time.time(), batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.to_dict(), indent=2) + "\n")
    tmp.replace(path)  # a crashed write never leaves a half record under the final name
    log.info("capacity measured and cached in %s: %s", path, record.describe())
    return record
