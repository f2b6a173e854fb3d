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

from dataclasses import dataclass

from streamrt._optional import available
from streamrt.errors import ConfigError
from streamrt.video.sources import FrameSource, VideoFileSource, register_video_opener

__all__ = ["DECODERS", "DecodeConfig", "open_decoded"]

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


register_video_opener(open_decoded)
