"""Which decoder opens a video: PyAV (CPU, the default), OpenCV (CPU fallback), or a camera for URLs.

:func:`open_decoded` is what :func:`streamrt.video.sources.open_source` calls for anything that is
not a generated clip or an image: a stream URL opens a :class:`~streamrt.video.cameras.CameraSource`
(reconnecting, paced, bounded queue), a file opens :class:`~streamrt.video.decode_av.AvSource`
where PyAV is installed, else OpenCV's :class:`~streamrt.video.sources.VideoFileSource`.
The GPU decoder (NVDEC, :mod:`streamrt.video.decode_nvdec`) delivers device tensors instead of
host frames, so it is opened by the GPU pipeline directly, not here.

Example:
    >>> cfg = DecodeConfig(decoder="opencv")
    >>> cfg.decoder, cfg.threads
    ('opencv', 2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrt._optional import available
from streamrt.errors import ConfigError
from streamrt.video.sources import FrameSource, VideoFileSource, register_video_opener

__all__ = ["DECODERS", "DecodeConfig", "OpenCvNv12Source", "open_decoded", "open_nv12", "start_over"]

DECODERS = ("auto", "pyav", "opencv")


@dataclass(frozen=True)
class DecodeConfig:
    """How host-side video decoding runs.

    Attributes:
        decoder: ``auto`` (PyAV if installed, else OpenCV), ``pyav`` or ``opencv``.
        threads: FFmpeg decoder threads per stream (PyAV; 0 lets FFmpeg pick one per core).
    """

    decoder: str = "auto"
    threads: int = 2

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ConfigError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.threads < 0:
            raise ConfigError(f"decoder threads must be >= 0 (0: one per core), got {self.threads}")

    @property
    def resolved(self) -> str:
        """The decoder that will run: ``auto`` becomes ``pyav`` where PyAV imports, else ``opencv``."""
        if self.decoder != "auto":
            return self.decoder
        return "pyav" if available("av") else "opencv"


def open_decoded(spec: str, fps: float | None = None, config: DecodeConfig | None = None) -> FrameSource:
    """Open a video file or stream URL with the decoder ``config`` names (see the module docstring)."""
    from streamrt.video.decode_av import AvSource, is_stream_url

    cfg = config or DecodeConfig()
    if is_stream_url(spec):
        from streamrt.video.cameras import CameraConfig, CameraSource

        return CameraSource(spec, CameraConfig(threads=cfg.threads, fps=fps))
    if cfg.resolved == "pyav":
        return AvSource(spec, threads=cfg.threads)
    return VideoFileSource(spec)


class OpenCvNv12Source:
    """A video file decoded by OpenCV, delivered as NV12 (BGR -> I420, BT.601 limited, -> NV12): the
    CPU side of NVDEC + CPU pipelines where PyAV is not installed. PyAV hands over the decoder's
    own 4:2:0 planes instead (:class:`~streamrt.video.decode_av.AvSource` ``output="nv12"``)."""

    frame_format = "nv12"

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        from streamrt.video._cv2 import import_cv2

        self._cv2 = import_cv2()
        self._src = VideoFileSource(path, threads=threads)
        if self._src.info.width % 2 or self._src.info.height % 2:
            self._src.close()
            from streamrt.video.sources import SourceError

            raise SourceError(f"{path}: NV12 needs even frame sizes, got {self._src.info.width}x"
                              f"{self._src.info.height}")

    @property
    def info(self) -> Any:
        return self._src.info

    def read(self) -> np.ndarray | None:
        bgr = self._src.read()
        if bgr is None:
            return None
        h, w = bgr.shape[:2]
        i420 = self._cv2.cvtColor(bgr, self._cv2.COLOR_BGR2YUV_I420)
        out = np.empty((h * 3 // 2, w), np.uint8)
        out[:h] = i420[:h]
        chroma = out[h:].reshape(h // 2, w // 2, 2)
        flat, quarter = i420[h:].reshape(-1), h * w // 4
        chroma[..., 0] = flat[:quarter].reshape(h // 2, w // 2)
        chroma[..., 1] = flat[quarter:].reshape(h // 2, w // 2)
        return out

    def skip(self, count: int) -> int:
        return self._src.skip(count)

    def rewind(self) -> bool:
        """The file from its first frame again, by a seek (:meth:`VideoFileSource.rewind`)."""
        return self._src.rewind()

    def close(self) -> None:
        self._src.close()


def open_nv12(path: str | Path, threads: int = 1) -> Any:
    """A CPU decoder delivering NV12 host frames, decoding on ``threads`` threads: PyAV where installed, else
    OpenCV (its FFmpeg capped at ``threads`` too: uncapped, every decoder takes a thread per core)."""
    if available("av"):
        from streamrt.video.decode_av import AvSource

        return AvSource(path, threads=threads, output="nv12")
    return OpenCvNv12Source(path, threads=threads)


def start_over(source: Any, reopen: Callable[[], Any]) -> Any:
    """A decoder at its file's first frame again, for a looped stream at the end of its file: ``source``
    itself, rewound, where it can seek back (:meth:`~streamrt.video.decode_av.AvSource.rewind`, OpenCV's
    :meth:`~streamrt.video.sources.VideoFileSource.rewind`), else ``reopen()`` after closing it."""
    rewind = getattr(source, "rewind", None)
    if rewind is not None and rewind():
        return source
    source.close()
    return reopen()


register_video_opener(open_decoded)
