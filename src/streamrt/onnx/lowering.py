"""What a precision transform returns: the lowered model and what it kept in fp32 (and why)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

__all__ = ["PrecisionResult"]


@dataclass(frozen=True)
class PrecisionResult:
    """The transformed model and what the transform decided (for the build's report and manifest).

    Attributes:
        model: the model every backend builds from.
        summary: one line for the build's output ("fp16: 3 nodes kept in fp32 ...").
        details: lines for ``--verbose`` (one per kept node or layer, with its reason).
        record: JSON-ready facts stored in the plan's manifest under ``precision_report``.
    """

    model: onnx.ModelProto
    summary: str = ""
    details: tuple[str, ...] = ()
    record: Mapping[str, Any] = field(default_factory=dict)
