"""The multi-stream pipeline: stages on streams chained by events, a ring of slots, topologies.

Example:
    >>> from streamrt.pipeline import Pipeline, PipelineConfig, Stage, StageKind
    >>> def load(slot, item, stream):
    ...     slot["x"] = slot.input + 1
    >>> def square(slot, item, stream):
    ...     slot.output = slot["x"] ** 2
    >>> stages = [Stage("load", load, kind=StageKind.HOST), Stage("square", square)]
    >>> with Pipeline(stages, PipelineConfig(device="cpu", ring_size=2)) as pipe:
    ...     [r.value for r in pipe.map([1, 2, 3])]
    [4, 9, 16]

The bundled GPU benchmark workload (a small CNN on 1080p frames, a torch-module engine) is demo
code, not pipeline machinery: it lives in :mod:`streamrt.testing.workloads`, which imports torch.
"""

from __future__ import annotations

from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.pipeline.executor import Pipeline
from streamrt.pipeline.stage import Lane, Result, Slot, Stage, StageFn, StageKind, Workload
from streamrt.pipeline.tracing import PipelineTrace, StageSpan

__all__ = [
    "Lane",
    "Pipeline",
    "PipelineConfig",
    "PipelineTrace",
    "Result",
    "Slot",
    "Stage",
    "StageFn",
    "StageKind",
    "StageSpan",
    "Topology",
    "Workload",
]
