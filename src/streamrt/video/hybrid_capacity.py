"""Decode capacity for hybrid decode: what CPU decoders and NVDEC give, alone and both at once.

- :func:`measure_cpu_decode`, :func:`measure_cpu_decode_together`: one CPU decoder, and the CPU decoder processes
  all decoding at the same time;
- :func:`measure_capacity`: each side on its own (the CPU side together, NVDEC in threads);
- :func:`measure_hybrid_capacity`: **both sides at once**, read the way the detector reads them;
- :func:`measure_process_decode`: NVDEC alone in decoder processes (``streamrt detect --decode-processes N``).

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

import os
import time
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from streamrt._features import cuda_available
from streamrt._optional import available
from streamrt.errors import ConfigError
from streamrt.video.decoding import open_nv12

__all__ = ["CONSUMER_CORES", "CPU_DECODER_NICENESS", "cpu_decoder_processes", "measure_capacity", "measure_cpu_decode",
           "measure_cpu_decode_together", "measure_hybrid_capacity", "measure_hybrid_capacity_for_plan",
           "measure_process_decode"]

CONSUMER_CORES = 2
"""Cores left to the consumer process: the thread feeding the engine, and the live group's and the pools'
dispatcher threads beside it. Not given to CPU decoders."""

CPU_DECODER_NICENESS = 0
"""What the CPU decoder processes of a hybrid add to their niceness by default (``HybridDecode(cpu_niceness=)``).
At +5 they would yield contended cores to the NVDEC decoder processes and the consumer (a nice-5 process weighs
about a third of a nice-0 one in Linux's scheduler). Measured side by side on one H100 host on 2026-12-06
(``gpu_video_check.py --parts 5 --cpu-niceness 0`` vs ``5``, ~160 streams): no fewer drops (staggered starts 0 and
0, lockstep 5 and 9), and the CPU side measured 8-17% less beside NVDEC, so fewer streams admitted. So 0."""


def cpu_decoder_processes(nvdec_processes: int = 0, cores: int | None = None) -> int:
    """CPU decoder processes (one core each) this machine can give: its cores less :data:`CONSUMER_CORES`
    and one per NVDEC decoder process (they drive their sessions and copy every picture), at least 1.

    An H200 host of 16 cores with 4 NVDEC processes: 10.
    """
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores - CONSUMER_CORES - nvdec_processes)


def measure_cpu_decode(path: str | Path, seconds: float = 2.0, threads: int = 1) -> float:
    """Frames/s one CPU decoder (:func:`~streamrt.video.decoding.open_nv12`) with ``threads`` threads gets from
    ``path`` (NV12 out, looped), OpenCV's own thread pool held to ``threads`` meanwhile, as in a CPU decoder
    process."""
    cv2 = import_module("cv2") if available("cv2") else None
    before = cv2.getNumThreads() if cv2 is not None else None
    if cv2 is not None:
        cv2.setNumThreads(threads)
    try:
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            source = open_nv12(path, threads)
            while time.perf_counter() - started < seconds and source.read() is not None:
                done += 1
            source.close()
        return done / (time.perf_counter() - started)
    finally:
        if cv2 is not None:
            cv2.setNumThreads(before)


def _decode_from(path: str, seconds: float, start_at: float) -> float:
    """One process of :func:`measure_cpu_decode_together`: wait for the common start, then measure."""
    time.sleep(max(0.0, start_at - time.time()))
    return measure_cpu_decode(path, seconds)


def measure_cpu_decode_together(path: str | Path, processes: int, seconds: float = 2.0) -> float:
    """Frames/s ``processes`` single-threaded CPU decoders get from ``path`` **at the same time**, each in a
    process of its own (as CPU decoder processes run), summed.

    One decoder's rate times the cores over-states what the cores give together: on the H200's host one
    decoder alone did 124 frames/s, and 36 streams over 10 CPU decoder processes got 597 frames/s in all,
    not 1,240 (shared memory bandwidth and clocks, and the NVDEC processes beside them).
    """
    if processes <= 1:
        return measure_cpu_decode(path, seconds)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no forked copy of a CUDA or threaded parent
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        start_at = time.time() + 3.0 + 0.3 * processes  # every child imported and waiting before the start
        rates = [pool.submit(_decode_from, str(path), seconds, start_at) for _ in range(processes)]
        return float(sum(r.result() for r in rates))


def measure_capacity(path: str | Path, *, cores: int | None = None, nvdec_sessions: int = 8,
                     seconds: float = 2.0) -> dict[str, float]:
    """Decode capacity of this machine on ``path``: NVDEC (``nvdec_sessions`` in parallel, if available)
    and the CPU (``cores`` single-threaded decoders measured at the same time in processes of their own,
    by default the cores :func:`cpu_decoder_processes` gives CPU decoders: not those the consumer needs)."""
    cores = cores or cpu_decoder_processes()
    capacity = {"cpu": measure_cpu_decode_together(path, cores, seconds)}
    from streamrt.video.decode_nvdec import measure_nvdec, nvdec_available

    if nvdec_available():
        capacity["nvdec"] = measure_nvdec([path], nvdec_sessions, seconds)["fps"]
    return capacity


def measure_hybrid_capacity(path: str | Path, *, decode_processes: int = 4, cpu_processes: int | None = None,
                            nvdec_sessions: int = 16, seconds: float = 3.0, warmup_s: float = 1.0,
                            process_kind: str = "nvdec", upload: bool | None = None,
                            slots: int = 4, cpu_niceness: int = CPU_DECODER_NICENESS) -> dict[str, Any]:
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
        cpu_niceness: the CPU decoder processes' niceness (``ProcessDecodePool(niceness=...)``), as the hybrid
            runs them.

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
                              upload=upload, niceness=cpu_niceness) as cpu:
        counts = _drain_together({"nvdec": (nvdec, nvdec_sessions), "cpu": (cpu, cpu_processes)}, seconds, warmup_s)
    return {"nvdec": counts["nvdec"] / seconds, "cpu": counts["cpu"] / seconds, "nvdec_sessions": nvdec_sessions,
            "cpu_decoders": cpu_processes, "cpu_niceness": cpu_niceness, "seconds": seconds}


def measure_hybrid_capacity_for_plan(path: str | Path, demands: Sequence[float], *, headroom: float,
                                     first_sessions: int = 16, **measure: Any) -> dict[str, Any]:
    """:func:`measure_hybrid_capacity`, then again with as many NVDEC sessions as the plan puts on NVDEC.

    A few free-running sessions may over-state what many paced ones get: on an H100 on 2026-12-06 the 139
    streams planned on NVDEC from 16 sessions' 4,665 frames/s needed 96.7% of what that side gave in the run
    (the policy read 4,310), not the 90% planned, and dropped frames (docs/benchmarks/2026-12-06-h100-video.md).
    So the plan made from the first
    measurement (``HybridPolicy(..., headroom).assign(demands)``) names the NVDEC session count, and when that is
    more than ``first_sessions`` both sides are measured again with it; the second figures are the capacity.

    Args:
        path: a video file.
        demands: frames/s of each stream to place (the plan's input).
        headroom: the policy's planning fraction.
        first_sessions: NVDEC sessions of the first measurement.
        measure: the rest of :func:`measure_hybrid_capacity`'s arguments.

    Returns:
        The capacity :func:`measure_hybrid_capacity` returns (its ``nvdec_sessions`` the count measured with),
        plus ``first`` (the first measurement) and ``planned_nvdec`` (the streams the first plan put on NVDEC
        within its share).
    """
    from streamrt.video.hybrid_policy import HybridPolicy

    first = measure_hybrid_capacity(path, nvdec_sessions=first_sessions, **measure)
    policy = HybridPolicy({"nvdec": first["nvdec"], "cpu": first["cpu"]}, headroom=headroom)
    on_nvdec = [d for pool, d in zip(policy.assign(demands), demands, strict=True) if pool == "nvdec"]
    planned = policy.fitting("nvdec", on_nvdec)  # within its planned share, not the overflow a full plan adds
    final = measure_hybrid_capacity(path, nvdec_sessions=planned, **measure) if planned > first_sessions else first
    return {**final, "first": first, "planned_nvdec": planned}


def measure_process_decode(path: str | Path, *, processes: int, sessions: int = 16, seconds: float = 2.0,
                           warmup_s: float = 1.0, kind: str = "nvdec", slots: int = 4) -> float:
    """Frames/s of ``sessions`` streams of ``path`` (looped) decoded in ``processes`` decoder processes, drained
    flat out through ``take_ready`` as the detector's live group reads them.

    One process binds NVDEC at ~2,000-2,800 frames/s on an H200 while 4 reach its engines' bound, so a
    capacity measured in this process (:func:`measure_capacity`) under-states decoder processes by half.

    Args:
        path: a video file.
        processes: decoder processes (as ``ProcessDecodePool(processes=...)``).
        sessions: streams decoded at once (on the H200 14 or more reach the engines' bound).
        seconds: the measured window, after ``warmup_s``.
        kind: ``nvdec``, or ``cpu`` (the CI stand-in).
        slots: pictures decoded ahead per stream.
    """
    from streamrt.video.decode_processes import ProcessDecodePool

    if processes < 1 or sessions < 1 or seconds <= 0:
        raise ConfigError(f"measuring decoder processes needs processes >= 1, sessions >= 1 and seconds > 0, got "
                          f"{processes}, {sessions}, {seconds}")
    with ProcessDecodePool([Path(path)] * sessions, processes=processes, kind=kind, slots=slots, loop=True) as pool:
        return _drain_together({"decoded": (pool, sessions)}, seconds, warmup_s)["decoded"] / seconds


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
