"""What hybrid decode gives when both kinds of decoder run at once, read the way the detector reads them.

Capacities measured one pool at a time over-state the hybrid. On the H200 (2026-12-03, 185 streams): the
NVDEC decoder processes delivered 3,401 frames/s beside the CPU decoders against 5,134 alone, and the CPU
decoder processes 597 against the 1,242 planned. The 16 cores are shared, so planning from the sum of the
two admits streams that cannot be sustained.

:func:`measure_hybrid_capacity` opens both sides as :class:`~streamrt.video.hybrid.HybridDecode` runs them
(NVDEC sessions in decoder processes, one CPU decoder stream per CPU decoder process, pictures delivered
where the detector takes them). It drains both flat out through ``take_ready`` from one thread, as the
detector's live group does, and counts each side's pictures in the same window. The result is what
admission and the hybrid policy plan from.

Example:
    >>> measure_hybrid_capacity("clip.mp4", decode_processes=4)          # doctest: +SKIP
    {'nvdec': 4410.2, 'cpu': 702.9, 'nvdec_sessions': 16, 'cpu_decoders': 10, 'seconds': 3.0}
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from streamrt._features import cuda_available
from streamrt.errors import ConfigError
from streamrt.video.hybrid import cpu_decoder_processes

__all__ = ["measure_hybrid_capacity"]


def measure_hybrid_capacity(path: str | Path, *, decode_processes: int = 4, cpu_processes: int | None = None,
                            nvdec_sessions: int = 16, seconds: float = 3.0, warmup_s: float = 1.0,
                            process_kind: str = "nvdec", upload: bool | None = None,
                            slots: int = 4) -> dict[str, Any]:
    """Frames/s of each side of hybrid decode over ``path`` (looped), both decoding at once.

    Args:
        path: a video file.
        decode_processes: NVDEC decoder processes (as ``HybridDecode(decode_processes=...)``).
        cpu_processes: CPU decoder processes, one stream each; None:
            :func:`~streamrt.video.hybrid.cpu_decoder_processes`.
        nvdec_sessions: NVDEC sessions over those processes (on the H200, 14 or more reach the engines' bound).
        seconds: the measured window, after ``warmup_s``.
        process_kind: ``nvdec``, or ``cpu`` (the CI stand-in for the NVDEC side).
        upload: CPU pictures delivered on the GPU (``ProcessDecodePool(upload=True)``); None: when CUDA is available.
        slots: pictures decoded ahead per stream.

    Returns:
        ``nvdec`` and ``cpu`` frames/s, and the sessions, decoders and window they were measured with.
    """
    from streamrt.video.decode_processes import ProcessDecodePool

    if decode_processes < 1 or nvdec_sessions < 1 or seconds <= 0:
        raise ConfigError(f"measuring hybrid capacity needs decode_processes >= 1, nvdec_sessions >= 1 and "
                          f"seconds > 0, got {decode_processes}, {nvdec_sessions}, {seconds}")
    cpu_processes = cpu_processes or cpu_decoder_processes(decode_processes)
    upload = cuda_available() if upload is None else upload
    paths = [Path(path)]
    with ProcessDecodePool(paths * nvdec_sessions, processes=decode_processes, kind=process_kind, slots=slots,
                           loop=True, upload=upload and process_kind == "cpu") as nvdec, \
            ProcessDecodePool(paths * cpu_processes, processes=cpu_processes, kind="cpu", slots=slots, loop=True,
                              upload=upload) as cpu:
        counts = _drain_together({"nvdec": (nvdec, nvdec_sessions), "cpu": (cpu, cpu_processes)}, seconds, warmup_s)
    return {"nvdec": counts["nvdec"] / seconds, "cpu": counts["cpu"] / seconds, "nvdec_sessions": nvdec_sessions,
            "cpu_decoders": cpu_processes, "seconds": seconds}


def _drain_together(pools: dict[str, tuple[Any, int]], seconds: float, warmup_s: float) -> dict[str, int]:
    """Pictures each pool delivered in the window ``[warmup_s, warmup_s + seconds)``, every pool drained in turn
    from this thread without waiting (a failed stream fails the measurement: its capacity would be wrong)."""
    counts = dict.fromkeys(pools, 0)
    lanes = {name: list(range(n)) for name, (_, n) in pools.items()}
    start = time.perf_counter()
    measure_from, end = start + warmup_s, start + warmup_s + seconds
    while (now := time.perf_counter()) < end:
        took = 0
        for name, (pool, _) in pools.items():
            ready = pool.take_ready(lanes[name])
            if ready.failed:
                raise RuntimeError(f"hybrid capacity: {name} decoding failed: {next(iter(ready.failed.values()))}")
            took += len(ready.taken)
            if now >= measure_from:
                counts[name] += len(ready.taken)
        if not took:
            time.sleep(0.0005)
    return counts
