"""CI subset of the ONNX conformance run: every node test of every supported op, eager, on CPU.

This is the same run as ``python scripts/onnx_conformance.py`` without the export check; it takes
about 10 s on the 2-core CI machine (4 s to generate the cases, the rest to run ~1250 tests).
The failures are pinned, so a regression and a fix both show up here.
"""

from __future__ import annotations

import pytest
import torch

from streamrt.onnx.importer import supported_ops
from streamrt.onnx.importer.conformance import CaseResult, load_cases, run_cases, summarize

pytestmark = pytest.mark.torch

MIN_PASS_RATE = 0.95

KNOWN_FAILURES = {
    # Training-mode Dropout draws random masks; the tests expect NumPy's random stream.
    "test_training_dropout",
    "test_training_dropout_default",
    "test_training_dropout_default_mask",
    "test_training_dropout_mask",
    # Strings, sequences and optionals have no torch representation.
    "test_equal_string",
    "test_equal_string_broadcast",
    "test_identity_sequence",
    "test_identity_opt",
    # LSTM with peepholes and per-batch sequence_lens: refused at import (torch's LSTM kernel has neither).
    "test_lstm_with_peepholes",
}


@pytest.fixture(scope="module")
def results() -> list[CaseResult]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_cases(load_cases(ops=supported_ops()))
    finally:
        torch.set_num_threads(threads)


def test_failures_are_the_known_ones(results: list[CaseResult]) -> None:
    failed = {r.case.name: r.detail for r in results if r.status == "fail"}
    new = {name: why for name, why in failed.items() if name not in KNOWN_FAILURES}
    fixed = KNOWN_FAILURES - set(failed)
    assert not new, f"new conformance failures: {new}"
    assert not fixed, f"these pass now, remove them from KNOWN_FAILURES: {sorted(fixed)}"


def test_pass_rate(results: list[CaseResult]) -> None:
    counted = [r for r in results if r.status != "excluded"]
    passed = sum(r.status == "pass" for r in counted)
    assert len(counted) > 1000
    assert passed / len(counted) >= MIN_PASS_RATE


def test_every_supported_op_with_node_tests_passes_some(results: list[CaseResult]) -> None:
    summary = summarize(results)
    assert all(s.passed > 0 for s in summary.values()), [op for op, s in summary.items() if s.passed == 0]
    # Most supported ops have node tests; the few without are covered by the model tests.
    assert len(summary) >= 0.9 * len(supported_ops())


EXPORT_OPS = (
    "Reshape",
    "Resize",
    "Slice",
    "Split",
    "Squeeze",
    "Unsqueeze",
    "Expand",
    "Pad",
    "Gather",
    "Conv",
    "MaxPool",
)


def test_passing_tests_of_shape_heavy_ops_also_export() -> None:
    """``torch.export`` (static shapes, small inputs baked as constants) on a subset of ops."""
    results = run_cases(load_cases(ops=EXPORT_OPS), export=True)
    passing = [r for r in results if r.status == "pass"]
    assert len(passing) > 100
    failed = {r.case.name: r.export for r in passing if r.export != "pass"}
    assert not failed, failed
