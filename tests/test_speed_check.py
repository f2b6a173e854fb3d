"""The int8 speed check (:mod:`streamrt.building.speed_check`): interleaved rounds, bench's noise rule, the verdict.

The measuring function is driven with fake runners of known relative cost (sleeps: their cost
does not depend on how busy the 2 CPU cores are); the verdict with numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from streamrt.building.speed_check import FASTER, int8_verdict, interleaved_rounds
from streamrt.measure.noise import COV_THRESHOLD


def test_ratio_of_runners_of_known_cost_comes_from_interleaved_rounds() -> None:
    calls: list[str] = []

    def runner(name: str, seconds: float) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            time.sleep(seconds)

        return run

    timing = interleaved_rounds({"slow": runner("slow", 0.006), "fast": runner("fast", 0.003)}, budget_s=1.5)
    # 2x the cost, within 15% (sleep overshoots by ~0.1 ms per call on a loaded machine)
    assert timing.ratio("fast", "slow") == pytest.approx(2.0, rel=0.15)
    assert timing.ms("slow") == pytest.approx(6.0, rel=0.2) and timing.ms("fast") == pytest.approx(3.0, rel=0.2)
    assert timing.rounds >= 2 and timing.seconds < 1.5 + 0.3  # the budget holds (a round may outlast the last)
    # interleaved: after the warm-up (slow slow fast fast) the rounds run "slow fast", "fast slow",
    # "slow fast"...; a flipped round's first block joins the one before it, so each round after the
    # first adds one block of calls of one runner: 2 + 2 + (rounds - 1). Timing one runner's rounds
    # and then the other's would give 4 blocks.
    blocks = [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]
    assert len(blocks) == timing.rounds + 3 and blocks[:4] == ["slow", "fast", "slow", "fast"]


def test_a_runner_whose_time_swings_between_rounds_gets_the_noise_warning() -> None:
    count = [0]

    def swinging() -> None:  # 1 ms for 5 calls, 4 ms for the next 5: rounds of 5 calls disagree
        count[0] += 1
        time.sleep(0.001 if (count[0] // 5) % 2 else 0.004)

    timing = interleaved_rounds(
        {"int8": swinging, "fp32": lambda: time.sleep(0.002)}, budget_s=2.0, calls_per_round=5, max_rounds=6
    )
    assert timing.noisy and timing.cases["int8"].stats.cov > COV_THRESHOLD
    warning = timing.warning("cpu", "and rebuild")
    assert warning is not None and "int8 CoV" in warning and f"the limit is {COV_THRESHOLD}%" in warning


def test_int8_slower_and_less_accurate_says_fp32_is_the_better_plan() -> None:
    misses = ["logits: top1 0.97 < 0.99"]
    verdict = int8_verdict(0.62, noisy=False, misses=misses, device="cpu")
    assert verdict.better == "fp32" and not verdict.faster and not verdict.accurate
    assert verdict.line is not None
    assert verdict.line.startswith("fp32 is the better plan for this model on this machine")
    assert "0.62x fp32" in verdict.line and "top1 0.97 < 0.99" in verdict.line and "--precision fp32" in verdict.line
    on_gpu = int8_verdict(0.9, noisy=False, misses=misses, device="cuda")
    assert on_gpu.better == "fp16" and on_gpu.line is not None and "--precision fp16" in on_gpu.line


def test_a_speed_up_on_a_noisy_machine_is_not_counted() -> None:
    misses = ["y: cosine 0.95 < 0.99"]
    assert int8_verdict(1.6, noisy=True, misses=misses, device="cpu").better == "fp32"
    assert int8_verdict(FASTER - 0.01, noisy=False, misses=misses, device="cpu").better == "fp32"
    line = int8_verdict(1.6, noisy=True, misses=misses, device="cpu").line
    assert line is not None and "not measurably faster" in line and "noisy" in line


def test_int8_that_pays_or_keeps_its_accuracy_is_not_called_worse() -> None:
    good = int8_verdict(1.8, noisy=False, misses=[], device="cpu")
    assert good.faster and good.accurate and good.better is None and good.line is None
    fast_but_off = int8_verdict(1.8, noisy=False, misses=["y: top1 0.9 < 0.99"], device="cpu")
    assert fast_but_off.better is None and fast_but_off.line is not None and "misses" in fast_but_off.line
    same_speed = int8_verdict(1.0, noisy=False, misses=[], device="cpu")
    assert same_speed.better is None and same_speed.line is not None and "not faster" in same_speed.line
