"""``scripts/_serving_check_placement.py``: the CPU lists it parses and the placement it gives a real server-like
process tree (a parent with a child, both with threads), checked in /proc, and the mask it restores."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import _serving_check_placement as placement  # noqa: E402 - the scripts folder is not a package

USABLE = frozenset(os.sched_getaffinity(0))

# a parent that starts a child, each with a second thread, then sleeps: the engine process and a front end
TREE = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import threading, time; "
                          "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
                          "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print('up', flush=True)
time.sleep(60)
"""


def _masks(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


def test_cpu_lists_parse_and_print_in_the_kernels_syntax() -> None:
    assert placement.cpu_list("0-2,8") == frozenset({0, 1, 2, 8})
    assert placement.label(frozenset({0, 1, 2, 8, 10, 11})) == "0-2,8,10-11"
    assert placement.label(None) == "none"
    assert placement.engine_cpus_arg("none; 0-1") == [None, frozenset({0, 1})]
    for bad in ("", "a", "3-1", "1-", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            placement.cpu_list(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        placement.engine_cpus_arg(";")


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable CPUs")
def test_the_engine_gets_its_cpus_and_the_tree_and_clients_the_rest() -> None:
    engine = frozenset({min(USABLE)})
    tree = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout is not None and tree.stdout.readline().strip() == "up"
        child = placement._descendants(tree.pid)
        assert len(child) == 1
        with placement.placed(tree.pid, engine) as rest:
            assert rest == USABLE - engine
            assert _masks(tree.pid) == {engine}
            assert _masks(child[0]) == {rest}
            assert frozenset(os.sched_getaffinity(0)) == rest  # the clients started from here inherit it
        assert frozenset(os.sched_getaffinity(0)) == USABLE
    finally:
        for pid in placement._descendants(tree.pid):
            os.kill(pid, signal.SIGKILL)
        tree.kill()
        tree.wait()


def test_a_placement_this_machine_cannot_give_is_refused_before_anything_moves() -> None:
    with pytest.raises(ValueError, match="not all of them are usable"), \
            placement.placed(os.getpid(), frozenset({max(USABLE) + 1})):
        pass
    with pytest.raises(ValueError, match="leaves no CPU"), placement.placed(os.getpid(), USABLE):
        pass
    assert frozenset(os.sched_getaffinity(0)) == USABLE
    with placement.placed(os.getpid(), None) as rest:
        assert rest is None
    assert "CPUs" in placement.topology()
