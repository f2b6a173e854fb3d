"""Compressed test clips: a :class:`~streamrt.video.synthetic.SyntheticClip` encoded to H.264 or H.265.

Decoders are tested and benchmarked on these (never on downloaded video): the frames are a pure
function of the seed, so the decoded frames can be compared with the source frames, and the
clips made on the CPU machine are the clips the GPU machine decodes. Frame ``i`` gets
presentation time ``i / fps`` exactly (time base ``1 / fps`` in the encoder).

Example:
    >>> clip = SyntheticClip(width=320, height=180, frames=30)          # doctest: +SKIP
    >>> encode_clip(clip, "clip.mp4", codec="h264")                     # doctest: +SKIP
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from streamrt.errors import ConfigError
from streamrt.video.synthetic import SyntheticClip

__all__ = ["CODECS", "encode_clip", "smoke_clips"]

# Our codec name -> FFmpeg encoder.
CODECS = {"h264": "libx264", "h265": "libx265", "hevc": "libx265"}


def encode_clip(clip: SyntheticClip, path: str | Path, *, codec: str = "h264", crf: int = 23,
                preset: str = "veryfast", gop: int | None = None, bframes: int = 0) -> Path:
    """Encode every frame of ``clip`` into an MP4 (or MKV / TS by suffix) at ``path``.

    Args:
        codec: ``h264`` or ``h265``.
        crf: constant-rate quality (lower is better; 23 is x264's default).
        preset: x264/x265 speed preset.
        gop: keyframe interval in frames (default one per second).
        bframes: B-frames between references (0: presentation order = decode order, as cameras send).
    """
    import av

    if codec not in CODECS:
        raise ConfigError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    out = Path(path)
    rate = Fraction(clip.fps).limit_denominator(1001)
    with av.open(str(out), mode="w") as container:
        stream = container.add_stream(CODECS[codec], rate=rate)
        stream.width, stream.height, stream.pix_fmt = clip.width, clip.height, "yuv420p"
        stream.codec_context.time_base = 1 / rate
        keyint = gop or max(1, round(clip.fps))
        opts = {"crf": str(crf), "preset": preset}
        if codec == "h264":
            opts.update({"g": str(keyint), "bf": str(bframes)})
        else:
            opts["x265-params"] = f"keyint={keyint}:bframes={bframes}:log-level=error"
        stream.options = opts
        for i, image in enumerate(clip):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out


def smoke_clips(folder: str | Path, fps: float = 30.0) -> list[Path]:
    """Two tiny H.264 clips (320x180, 20 frames) for the GPU scripts' CPU smoke runs, made once in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for seed in (1, 2):
        path = folder / f"smoke{seed}.mp4"
        if not path.is_file():
            encode_clip(SyntheticClip(width=320, height=180, frames=20, fps=fps, seed=seed), path)
    return sorted(folder.glob("*.mp4"))
