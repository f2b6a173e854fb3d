"""``scripts/_serving_check_placement.py``: the placements it parses, the server flags it gives, and the clients'
CPUs it sets and restores (the server's own placement: tests/serve/test_engine_cpus.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import _serving_check_placement as placement  # noqa: E402 - the scripts folder is not a package

USABLE = frozenset(os.sched_getaffinity(0))


def test_placements_parse_and_become_server_flags() -> None:
    assert placement.engine_cpus_arg("none; 0-1") == [None, frozenset({0, 1})]
    assert placement.label(frozenset({0, 1, 2, 8, 10, 11})) == "0-2,8,10-11"
    assert placement.label(None) == "none"
    assert placement.server_args(None) == []
    assert placement.server_args(frozenset({0, 1, 8})) == ["--engine-cpus", "0-1,8"]
    for bad in (";", "a", "3-1", "none;1-"):
        with pytest.raises(argparse.ArgumentTypeError):
            placement.engine_cpus_arg(bad)


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable CPUs")
def test_the_clients_run_beside_the_front_ends_and_the_mask_comes_back() -> None:
    engine = frozenset({min(USABLE)})
    with placement.clients_beside_front_ends(engine) as rest:
        assert rest == USABLE - engine
        assert frozenset(os.sched_getaffinity(0)) == rest  # the clients started from here inherit it
    assert frozenset(os.sched_getaffinity(0)) == USABLE


def test_a_placement_this_machine_cannot_give_is_refused_before_anything_moves() -> None:
    with pytest.raises(ValueError, match="not usable here"), \
            placement.clients_beside_front_ends(frozenset({max(USABLE) + 1})):
        pass
    with pytest.raises(ValueError, match="leaves no CPU"), placement.clients_beside_front_ends(USABLE):
        pass
    assert frozenset(os.sched_getaffinity(0)) == USABLE
    with placement.clients_beside_front_ends(None) as rest:
        assert rest is None
    assert "CPUs" in placement.topology()
    assert "ns/iteration" in placement.host_speed()
