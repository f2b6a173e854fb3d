"""torch_inductor warns that half precision on the CPU is slow and names the ONNX Runtime backend."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")

from streamrt.backends.torch_inductor.builder import warn_slow_cpu_precision


@pytest.mark.parametrize(("kind", "precision", "warns"), [
    ("cpu", "fp16", True), ("cpu", "bf16", True), ("cpu", "fp32", False), ("cuda", "fp16", False),
])
def test_half_precision_on_cpu_warns(kind: str, precision: str, warns: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamrt.backends.torch_inductor.builder"):
        warn_slow_cpu_precision(kind, precision)
    messages = [r.getMessage() for r in caplog.records]
    assert bool(messages) == warns
    if warns:
        assert "--backend onnxruntime" in messages[0] and precision in messages[0]
