"""Rounds: median with spread, the shared noise rule, no ratio over a noisy baseline, the bound flag."""

from __future__ import annotations

import pytest

from streamrt.measure.noise import COV_THRESHOLD, is_unstable
from streamrt.measure.rounds import Rounds, format_ratio, noise_warning, ratio
from streamrt.measure.stats import Stats
from streamrt.profiling.pipeline_summary import BOUND_FLAG, PipelineSummary, format_comparison


def test_median_and_spread() -> None:
    r = Rounds.of([160.0, 100.0, 110.0])
    assert r.median == 110.0 and r.values == (160.0, 100.0, 110.0)
    assert r.describe("FPS") == f"median of 3 rounds, 100.0-160.0 FPS, CoV {r.stats.cov:.1f}%"
    assert Rounds.of([5.0]).describe("FPS") == "1 round" and not Rounds.of([5.0]).noisy


def test_noise_rule_is_bench_rule() -> None:
    steady, shaky = [100.0, 101.0, 99.5], [100.0, 18.0, 95.0]
    assert Rounds.of(steady).noisy == is_unstable(Stats.from_samples(steady)) is False
    assert Rounds.of(shaky).noisy == is_unstable(Stats.from_samples(shaky)) is True
    assert Stats.from_samples(shaky).cov > COV_THRESHOLD


def test_no_ratio_over_a_disturbed_baseline() -> None:
    # The case: the synchronous baseline fell to 16-18 items/s in one round.
    base, piped = Rounds.of([150.0, 17.0, 148.0]), Rounds.of([160.0, 158.0, 161.0])
    assert ratio(piped, base) is None and format_ratio(piped, base) == "baseline unstable"
    steady = Rounds.of([80.0, 80.5, 79.5])
    assert format_ratio(piped, steady) == "2.00x" and ratio(piped, steady) == pytest.approx(2.0)
    warning = noise_warning({"sync": base, "pipeline": piped}, "cpu")
    assert warning is not None and "sync CoV" in warning and "pipeline CoV" not in warning
    assert noise_warning({"pipeline": piped}, "cpu") is None


def _summary(label: str, items_per_s: float, busy: float | None = None) -> PipelineSummary:
    resources = {"GPU compute": busy} if busy is not None else {}
    return PipelineSummary(label, 100, 100 / items_per_s * 1e3, items_per_s, {"p50": 1.0, "p99": 2.0},
                           resource_busy=resources)


def test_comparison_with_rounds_and_a_bound_below_the_measurement() -> None:
    timed_a, timed_b = _summary("sync", 100.0), _summary("streams", 160.0)
    traced_b = _summary("streams", 100.0, busy=0.9)  # bound 111.1 < the timed 160: the contradiction
    rounds = [Rounds.of([100.0, 20.0, 99.0]), Rounds.of([160.0, 159.0, 161.0])]
    table = format_comparison([(timed_a, None), (timed_b, traced_b)], rounds=rounds)
    lines = table.splitlines()
    assert "| spread (CoV) |" in lines[0]
    assert "| sync | 100.0 | baseline unstable | 20.0-100.0 (" in lines[2]
    assert f"| 111.1 {BOUND_FLAG} |" in lines[3]
    assert lines[-1].startswith(f"{BOUND_FLAG} bound below the measured items/s")
    honest = format_comparison([(timed_a, None), (timed_b, _summary("streams", 150.0, busy=0.9))])
    assert BOUND_FLAG not in honest  # bound 166.7 >= 160: nothing to flag

