"""The pipeline a detection run gets by default on this machine, shared by ``demo`` and ``detect``.

On a GPU: one lane with a stream per stage and CUDA graphs, frames four deep. On the CPU, ONNX
Runtime already spreads one inference over every core, so a single lane has nothing left to
overlap with (the engine thread is the bound); one lane per core, each session with one intra-op
thread (:data:`~streamrt.video.model.LANE_OPTIONS`), runs several frames at once instead, with
less synchronisation. On the 2-core machine of issue 16 that choice ran the bundled clip at
243-349 FPS where a single stage-per-stream lane ran at 69.
"""

from __future__ import annotations

import os
from typing import Any

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video.model import LANE_OPTIONS

__all__ = ["default_pipeline", "lane_options"]


def default_pipeline(cuda: bool) -> PipelineConfig:
    """Three streams with CUDA graphs and a launch thread on a GPU; on a CPU one stage-per-stream lane per core.

    The launch thread: on the H200 on 2026-12-03 (1080p BGR frames, the bundled detector) it gave
    1,695.8 frames/s against 1,481.5 with graphs (1.14x) and 677.6 against 457.2 without (1.48x),
    detections identical to the synchronous loop's.
    """
    if cuda:
        return PipelineConfig(topology=Topology.STREAMS, ring_size=4, cuda_graphs=True, launch_thread=True)
    return PipelineConfig(topology=Topology.STREAMS, workers=max(1, os.cpu_count() or 1), ring_size=2)


def lane_options(backend: str, pipeline: PipelineConfig, cuda: bool) -> dict[str, Any]:
    """Backend options of the plan the lanes run: one thread per session for several CPU lanes, else none."""
    return dict(LANE_OPTIONS.get(backend, {})) if pipeline.workers > 1 and not cuda else {}
