"""compare_outputs: error metrics, the tolerance rule, top-1 agreement; fp16 against fp32 engines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.running.compare import compare_outputs, format_diffs, run_numpy, top1_agreement, topk_agreement
from streamrt.running.inputs import random_inputs, resolve_shapes
from streamrt.testing.models import CATALOGUE


def _logits(rng: np.random.Generator, n: int = 16, c: int = 10) -> np.ndarray:
    return rng.standard_normal((n, c)).astype(np.float32)


def test_identical_outputs_pass_with_zero_error() -> None:
    ref = {"logits": _logits(np.random.default_rng(0))}
    (d,) = compare_outputs(ref, {"logits": ref["logits"].copy()}, atol=0, rtol=0)
    assert d.passed and d.max_abs == 0 and d.mean_abs == 0 and d.max_rel == 0
    assert d.cosine == pytest.approx(1.0) and d.top1 == 1.0 and d.mismatches == 0 and d.total == 160


def test_errors_are_measured_in_float64() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 5))
    b = a + rng.uniform(-1e-3, 1e-3, a.shape)
    (d,) = compare_outputs({"y": a}, {"y": b.astype(np.float32)}, atol=1e-2, rtol=0)
    b32 = b.astype(np.float32).astype(np.float64)
    assert d.max_abs == pytest.approx(np.abs(a - b32).max())
    assert d.mean_abs == pytest.approx(np.abs(a - b32).mean())
    scale = np.maximum(np.abs(a), 1e-3 * np.abs(a).max())  # REL_FLOOR of the largest magnitude
    assert d.max_rel == pytest.approx((np.abs(a - b32) / scale).max())
    assert d.rel_l2 == pytest.approx(np.linalg.norm(a - b32) / np.linalg.norm(a))
    assert d.passed


def test_tolerance_rule_is_relative_to_the_reference() -> None:
    # Binary fractions, so the boundary cases are exact.
    a = np.array([1.0, 100.0, 0.0])
    b = np.array([1.0625, 93.75, 0.0078125])
    # |a-b| <= atol + rtol*|a| with rtol 1/16: 1/16 <= 1/16; 6.25 <= 6.25; 1/128 <= atol only.
    assert compare_outputs({"y": a}, {"y": b}, atol=0.0078125, rtol=0.0625)[0].passed
    (d,) = compare_outputs({"y": a}, {"y": b}, atol=0.0, rtol=0.0625)
    assert not d.passed and d.mismatches == 1  # the zero element
    # Swapping reference and test changes the scale: 6.25 > 93.75 / 16.
    (swapped,) = compare_outputs({"y": b}, {"y": a}, atol=0.0078125, rtol=0.0625)
    assert not swapped.passed and swapped.mismatches == 1


def test_nan_and_inf_handling() -> None:
    a = np.array([np.nan, np.inf, 1.0, 2.0])
    same = compare_outputs({"y": a}, {"y": a.copy()}, atol=0, rtol=0)[0]
    assert same.passed and same.max_abs == 0
    b = np.array([np.nan, np.inf, np.nan, 2.0])
    (d,) = compare_outputs({"y": a}, {"y": b})
    assert not d.passed and d.mismatches == 1


def test_missing_outputs_and_shape_mismatch_fail() -> None:
    ref = {"a": np.ones((2, 3)), "b": np.ones(4)}
    diffs = compare_outputs(ref, {"a": np.ones((3, 2)), "c": np.ones(1)})
    by_name = {d.name: d for d in diffs}
    assert "shape 3x2" in str(by_name["a"].problem) and not by_name["a"].passed
    assert "missing from the tested" in str(by_name["b"].problem)
    assert "missing from the reference" in str(by_name["c"].problem)
    text = format_diffs(diffs)
    assert "FAILED (3 of 3 outputs)" in text
    json.dumps([d.to_json() for d in diffs], allow_nan=False)  # NaN metrics become null


def test_top1_agreement() -> None:
    ref = _logits(np.random.default_rng(2), n=4, c=3)
    test = ref.copy()
    for row in (0, 1):  # make another class win in two rows
        test[row, (np.argmax(ref[row]) + 1) % 3] = ref[row].max() + 1
    assert top1_agreement(ref, test) == 0.5
    assert top1_agreement(ref[:, :1], test[:, :1]) is None  # C == 1: not a classifier
    assert top1_agreement(ref[2], test[2]) == 1.0  # rank 1: one row
    assert top1_agreement(ref.astype(np.int64), test.astype(np.int64)) is None  # not float


def test_top1_and_top5_for_sequence_outputs() -> None:
    # B x T x C, as a CTC recognizer returns: rows are all (b, t) positions, classes the last axis.
    rng = np.random.default_rng(5)
    ref = rng.standard_normal((2, 25, 40)).astype(np.float32)
    test = ref.copy()
    best = np.argmax(ref, axis=-1)
    test[0, :10] += np.eye(40, dtype=np.float32)[(best[0, :10] + 1) % 40] * 100  # another class wins ...
    for t in range(10, 15):  # ... and in 5 more rows the reference's class falls out of the top 5
        test[0, t, best[0, t]] -= 100
    assert top1_agreement(ref, test) == pytest.approx(35 / 50)
    assert topk_agreement(ref, test, 5) == pytest.approx(45 / 50)
    (d,) = compare_outputs({"y": ref}, {"y": test})
    assert d.top1 == pytest.approx(0.7) and d.top5 == pytest.approx(0.9)
    assert "70.00%" in format_diffs([d]) and "90.00%" in format_diffs([d])
    assert topk_agreement(ref[..., :5], test[..., :5], 5) is None  # top-5 of 5 classes says nothing


def test_relative_error_stays_readable_near_zero() -> None:
    # A softmax with a 1e-30 tail: |a - b| / |a| reached 1e16 there, though nothing that matters moved.
    logits = np.array([[20.0, 0.0, -50.0, -60.0]])
    ref = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    test = (ref + np.array([[-1e-7, 1e-7, 1e-14, 2e-14]])).astype(np.float32)
    (d,) = compare_outputs({"p": ref}, {"p": test})
    assert ref.min() < 1e-30
    assert d.max_rel < 1e-3 and d.rel_l2 < 1e-6
    assert np.isfinite(d.max_rel) and d.top1 == 1.0


def test_negative_tolerances_are_rejected() -> None:
    with pytest.raises(ConfigError):
        compare_outputs({}, {}, atol=-1)


def test_fp16_against_fp32_engine_shows_small_error(tmp_path: Path) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    profiles = CATALOGUE["small_cnn"].profiles
    engines = {
        p: streamrt.load(
            streamrt.build(
                src, BuildConfig(precision=p, profiles=profiles), tmp_path / f"{p}.plan", cache_dir=tmp_path / "c"
            ).path
        )
        for p in ("fp32", "fp16")
    }
    fp32 = engines["fp32"]
    feeds = random_inputs(fp32.inputs, resolve_shapes(fp32.inputs, fp32.profiles, batch=8), np.random.default_rng(3))
    ref = run_numpy(fp32, feeds)
    same = compare_outputs(ref, run_numpy(fp32, feeds), atol=0, rtol=0)
    assert all(d.passed for d in same)
    (d,) = compare_outputs(ref, run_numpy(engines["fp16"], feeds), atol=1e-5, rtol=1e-5)
    assert 0 < d.max_abs < 0.05 and d.cosine > 0.999
    assert d.top1 is not None and d.top1 >= 0.75
    assert not d.passed  # fp16 is not bit-exact at fp32 tolerances
    assert compare_outputs(ref, run_numpy(engines["fp16"], feeds), atol=0.05, rtol=0.05)[0].passed


def test_min_cosine_judges_by_direction_not_elements() -> None:
    rng = np.random.default_rng(5)
    ref = _logits(rng, n=64)
    test = ref.copy()
    test[0, 0] += 3.0  # one element far off: tolerances fail, the direction barely moves
    (strict,) = compare_outputs({"y": ref}, {"y": test}, atol=0.05, rtol=0.05)
    (loose,) = compare_outputs({"y": ref}, {"y": test}, atol=0.05, rtol=0.05, min_cosine=0.95)
    assert not strict.passed and loose.passed and 0.95 < loose.cosine < 1.0
    noise = rng.standard_normal(ref.shape).astype(np.float32)
    (bad,) = compare_outputs({"y": ref}, {"y": noise}, min_cosine=0.95)
    assert not bad.passed
    assert format_diffs([loose]).splitlines()[-1] == "PASSED: cosine >= 0.95"
    with pytest.raises(ConfigError, match="min_cosine"):
        compare_outputs({"y": ref}, {"y": test}, min_cosine=1.5)
