"""The default CPU thread policy: a free core, fewer threads under load, one thread on two cores."""

from __future__ import annotations

import pytest

from streamrt.device.threads import ENV_VAR, default_cpu_threads, physical_cores, resolve_cpu_threads, usable_cores
from streamrt.errors import ConfigError


@pytest.mark.parametrize(
    ("cores", "physical", "load", "expected"),
    [
        (1, 1, 0.0, 1),
        (2, 2, 0.0, 1),  # two cores: one thread, whatever the load
        (2, 1, 5.0, 1),
        (16, 16, 0.0, 15),  # idle: leave one core free
        (16, 8, 0.0, 7),  # hyper-threads count once
        (16, 16, 8.2, 8),  # busy: what the load leaves
        (16, 16, 40.0, 1),
        (4, 4, 1.0, 3),
    ],
)
def test_default_policy(cores: int, physical: int, load: float, expected: int) -> None:
    assert default_cpu_threads(cores=cores, physical=physical, load=load) == expected


def test_this_machine_is_described_consistently() -> None:
    assert 1 <= physical_cores() <= usable_cores()
    assert 1 <= default_cpu_threads() <= max(1, usable_cores() - 1)


def test_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_cpu_threads(3) == 3
    assert resolve_cpu_threads(None) == resolve_cpu_threads(0) == default_cpu_threads()
    monkeypatch.setenv(ENV_VAR, "5")
    assert resolve_cpu_threads(None) == 5 and resolve_cpu_threads(2) == 2
    monkeypatch.setenv(ENV_VAR, "many")
    with pytest.raises(ConfigError, match=f"{ENV_VAR} must be an integer >= 1"):
        resolve_cpu_threads(None)
    with pytest.raises(ConfigError, match="got -1"):
        resolve_cpu_threads(-1)


@pytest.mark.torch
def test_threads_are_set_around_a_call_and_restored() -> None:
    import torch

    from streamrt.backends.torch_inductor.engine import _cpu_threads

    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with _cpu_threads(target):
        assert torch.get_num_threads() == target
    assert torch.get_num_threads() == before
