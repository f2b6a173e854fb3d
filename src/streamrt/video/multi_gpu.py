"""Detection over several GPUs of one host: cameras dealt round-robin to the GPUs, one pipeline per GPU.

Each GPU gets its own detector (the engine loaded on that device: its weights, kernels and contexts
live there), its own pipeline with its lanes, streams, pinned slots and device buffers, and its own
host thread that feeds it (the Python thread that enqueues work is often the bound, DESIGN.md). The
sources are dealt like cards: source ``k`` goes to ``gpus[k % len(gpus)]``, so 4 cameras on
``--gpus 0,1`` run cameras 0 and 2 on GPU 0 and cameras 1 and 3 on GPU 1. Every GPU opens its detector
first, one GPU at a time (the first builds an ONNX model's plan, the others take it from the build
cache: same GPU model, same plan); the runs start together (a barrier), so the throughputs add up
over one window.

Results reach ``on_result`` with their source index in the caller's list (not the GPU's), one call at
a time (a lock), in order per source.

Example:
    >>> opener = lambda: open_detector(path)                                        # doctest: +SKIP
    >>> report = run_detection_on_gpus(opener, sources, DetectConfig(), gpus=[0, 1])  # doctest: +SKIP
    >>> print(report.format_text())                                                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamrt.device.base import Device
from streamrt.errors import ConfigError, StageTimeoutError
from streamrt.video.model import DetectorModel
from streamrt.video.report import RunReport
from streamrt.video.runner import DetectConfig, OnResult, run_detection
from streamrt.video.sources import FrameSource
from streamrt.video.workload import Detections, Frame

__all__ = ["MultiGpuReport", "deal_sources", "parse_gpus", "run_detection_on_gpus"]

log = logging.getLogger(__name__)


def parse_gpus(text: str, visible: int) -> list[int]:
    """``"0,1"`` -> ``[0, 1]``, checked against the ``visible`` GPU count.

    Raises:
        ConfigError: not a comma-separated list of distinct indices of visible GPUs (the message says which exist).
    """
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--gpus takes GPU indices separated by commas, e.g. 0,1; got {text!r}") from None
    if not gpus:
        raise ConfigError(f"--gpus names no GPU: {text!r}", hint="e.g. --gpus 0,1")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"--gpus lists a GPU twice: {text!r}", hint="list each GPU once")
    missing = [g for g in gpus if not 0 <= g < visible]
    if missing:
        which = f"GPUs 0..{visible - 1}" if visible else "no GPU"
        raise ConfigError(f"--gpus names GPU {missing[0]}, which does not exist; torch sees {which}",
                          hint="list visible GPU indices (CUDA_VISIBLE_DEVICES renumbers them from 0)")
    return gpus


def deal_sources(count: int, gpus: Sequence[int]) -> dict[int, list[int]]:
    """Source indices per GPU, dealt round-robin; GPUs left without a source are left out.

    >>> deal_sources(5, [0, 1])
    {0: [0, 2, 4], 1: [1, 3]}
    """
    dealt: dict[int, list[int]] = {}
    for k in range(count):
        dealt.setdefault(gpus[k % len(gpus)], []).append(k)
    return dealt


@dataclass
class MultiGpuReport:
    """The runs of one detection over several GPUs: one :class:`RunReport` per GPU, and their sum."""

    runs: dict[int, RunReport] = field(default_factory=dict)
    sources: dict[int, list[int]] = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self.runs.values())

    @property
    def wall_s(self) -> float:
        """The longest GPU's measured window (the runs started together)."""
        return max((r.wall_s for r in self.runs.values()), default=0.0)

    @property
    def fps(self) -> float:
        """Frames per second of all GPUs together over the longest window."""
        return self.frames / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": list(self.runs), "frames": self.frames, "wall_s": self.wall_s, "fps": self.fps,
                "sources": {str(g): s for g, s in self.sources.items()},
                "runs": {str(g): r.to_dict() for g, r in self.runs.items()}}

    def format_text(self) -> str:
        lines = [f"{len(self.runs)} GPUs: {self.frames} frames in {self.wall_s:.2f} s = {self.fps:.1f} FPS together"]
        for gpu, run in self.runs.items():
            p99 = run.latency_ms.get("p99")
            lines.append(f"  GPU {gpu}: sources {self.sources[gpu]}, {run.frames} frames, {run.fps:.1f} FPS"
                         + (f", p99 latency {p99:.1f} ms" if p99 is not None else ""))
        lines.append("")
        lines.extend(f"GPU {gpu}:\n{run.format_text()}" for gpu, run in self.runs.items())
        return "\n".join(lines)


def _enter_cuda(gpu: int) -> Device:
    """Make ``gpu`` this thread's current CUDA device (the detector loads and probes there); its device."""
    import torch

    from streamrt.device import get_device

    device = get_device("cuda", gpu)  # checks that the GPU exists
    torch.cuda.set_device(gpu)
    return device


def run_detection_on_gpus(
    open_model: Callable[[], DetectorModel],
    sources: Sequence[FrameSource],
    config: DetectConfig,
    gpus: Sequence[int],
    *,
    on_result: OnResult | None = None,
    timeout_s: float | None = None,
    enter: Callable[[int], Device] | None = None,
) -> MultiGpuReport:
    """Run ``sources`` dealt over ``gpus``, a detector and a pipeline on each (see the module docstring).

    Args:
        open_model: opens the detector; called once per GPU with that GPU current, in that GPU's thread.
        sources: the cameras or files, all of one frame size (as for :func:`run_detection`).
        config: how each GPU's pipeline is fed (its ``batch`` 0 means one frame per source of that GPU).
        gpus: CUDA device indices (:func:`parse_gpus`).
        on_result: every frame and its detections, with the source index of ``sources``.
        timeout_s: how long to wait for a GPU's run (None: as long as it takes).
        enter: makes a GPU current in the calling thread and returns its device (default: CUDA's;
            CPU tests pass host devices to run the dealing, threads and merging without a GPU).

    Raises:
        ConfigError: no GPUs (a GPU left without sources is not used).
        StageTimeoutError: a GPU's run did not finish within ``timeout_s``.
        StreamRTError: the first error a GPU's run raised (the other runs are waited for first).
    """
    if not gpus:
        raise ConfigError("a multi-GPU detection run needs at least one GPU")
    dealt = deal_sources(len(sources), gpus)
    lock = threading.Lock()
    opening = threading.Lock()
    start = threading.Barrier(len(dealt))
    reports: dict[int, RunReport] = {}
    errors: dict[int, BaseException] = {}

    def deliver(mapping: list[int]) -> OnResult | None:
        if on_result is None:
            return None
        callback = on_result

        def forward(frame: Frame, det: Detections) -> None:
            source = mapping[frame.source]
            with lock:
                callback(dataclasses.replace(frame, source=source), dataclasses.replace(det, source=source))

        return forward

    def run_on(gpu: int, mine: list[int]) -> None:
        try:
            device = (enter or _enter_cuda)(gpu)
            with opening:  # one at a time: the first builds the plan (compilers are not thread-safe), the rest reuse it
                model = open_model()
        except BaseException as exc:
            errors[gpu] = exc
            start.abort()
            return
        try:
            start.wait()
        except threading.BrokenBarrierError:
            return  # another GPU failed to open its detector: that error is the one to report
        try:
            reports[gpu] = run_detection(model, [sources[k] for k in mine], config,
                                         on_result=deliver(mine), device=device)
        except BaseException as exc:
            errors[gpu] = exc

    threads = [threading.Thread(target=run_on, args=(gpu, mine), name=f"detect-gpu{gpu}", daemon=True)
               for gpu, mine in dealt.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
        if thread.is_alive():
            raise StageTimeoutError(f"the detection run on {thread.name} did not finish within {timeout_s} s")
    if errors:
        gpu, exc = next(iter(errors.items()))
        log.error("detection on GPU %d failed: %s", gpu, exc)
        raise exc
    return MultiGpuReport(runs={g: reports[g] for g in dealt}, sources=dealt)
