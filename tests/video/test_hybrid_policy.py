"""The hybrid decode policy as pure logic: an injected clock and capacities, no decoders."""

from __future__ import annotations

import pytest

from streamrt.errors import ConfigError
from streamrt.video.hybrid_policy import HybridPolicy, Move


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_nvdec_first_then_cpu_then_over_capacity() -> None:
    policy = HybridPolicy({"nvdec": 120.0, "cpu": 60.0}, headroom=1.0)
    assert policy.assign([30.0] * 7) == ["nvdec"] * 4 + ["cpu"] * 2 + ["nvdec"]
    s = policy.summary(policy.assign([30.0] * 7), [30.0] * 7)
    assert not s["fits"] and s["binding"] == "nvdec" and s["pools"]["nvdec"]["utilisation"] == 1.25
    assert HybridPolicy({"cpu": 100.0}).assign([30.0, 30.0]) == ["cpu", "cpu"]  # no NVDEC on this machine


def test_headroom_keeps_slack() -> None:
    policy = HybridPolicy({"nvdec": 100.0, "cpu": 100.0}, headroom=0.8)
    assert policy.assign([30.0] * 4) == ["nvdec", "nvdec", "cpu", "cpu"]


def test_saturated_nvdec_spills_to_cpu_and_returns_when_it_has_room() -> None:
    clock = Clock()
    policy = HybridPolicy({"nvdec": 300.0, "cpu": 120.0}, headroom=1.0, hold_s=2.0, clock=clock)
    demands = [30.0] * 10
    plan = policy.assign(demands)
    assert plan == ["nvdec"] * 10
    # Measured: NVDEC only manages 240 frames/s with its streams starving -> two streams spill.
    policy.observe("nvdec", 240.0, saturated=True)
    assert policy.rebalance(plan, demands) == [Move(9, "nvdec", "cpu"), Move(8, "nvdec", "cpu")]
    assert plan.count("cpu") == 2
    # Within the hold time nothing moves, whatever the measurements say.
    policy.observe("nvdec", 400.0, saturated=False)
    clock.t = 1.0
    assert policy.rebalance(plan, demands) == []
    # Later, with NVDEC shown to do 400 frames/s, the CPU streams return.
    clock.t = 2.5
    assert policy.rebalance(plan, demands) == [Move(8, "cpu", "nvdec"), Move(9, "cpu", "nvdec")]
    assert plan == ["nvdec"] * 10 and len(policy.moves) == 4


def test_saturated_cpu_moves_to_nvdec_with_room() -> None:
    clock = Clock()
    policy = HybridPolicy({"nvdec": 90.0, "cpu": 300.0}, headroom=1.0, clock=clock)
    demands = [30.0] * 6
    plan = policy.assign(demands)
    assert plan == ["nvdec"] * 3 + ["cpu"] * 3
    policy.observe("cpu", 45.0, saturated=True)  # the CPU is busy with other work
    policy.observe("nvdec", 150.0, saturated=False)
    moves = policy.rebalance(plan, demands)
    assert moves == [Move(5, "cpu", "nvdec"), Move(4, "cpu", "nvdec")]
    assert policy.summary(plan, demands)["fits"]


def test_nothing_moves_where_it_cannot_fit() -> None:
    policy = HybridPolicy({"nvdec": 60.0, "cpu": 30.0}, headroom=1.0, hold_s=0.0)
    plan, demands = ["nvdec", "nvdec", "nvdec"], [30.0] * 3
    policy.observe("nvdec", 60.0, saturated=True)
    assert policy.rebalance(plan, demands) == [Move(2, "nvdec", "cpu")]
    policy.observe("cpu", 10.0, saturated=True)
    assert policy.rebalance(plan, demands) == []  # both full: nothing to gain
    assert policy.summary(plan, demands)["binding"] == "cpu"


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="at least one decoder pool"):
        HybridPolicy({"nvdec": 0.0})
    with pytest.raises(ConfigError, match="decoder pools are"):
        HybridPolicy({"vaapi": 10.0})
    with pytest.raises(ConfigError, match="headroom"):
        HybridPolicy({"cpu": 10.0}, headroom=0.0)
