"""``streamrt.device.cpus``: CPU lists in the kernel's syntax, the split between the engine and the rest, and
every thread of a real process (one started after the pin included) moved, checked in /proc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import thread_masks
from streamrt.device.cpus import format_cpu_list, parse_cpu_list, pin_process, split_cpus, usable_cpus
from streamrt.errors import ConfigError

USABLE = usable_cpus()

# a process with a second thread; after "go" on stdin it starts a third and reports its mask
LATE_THREAD = """
import os, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print('up', flush=True)
sys.stdin.readline()
seen = []
t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
t.start(); t.join()
print(','.join(map(str, seen[0])), flush=True)
time.sleep(60)
"""


def test_cpu_lists_parse_and_print_in_the_kernels_syntax() -> None:
    assert parse_cpu_list("0-2,8") == frozenset({0, 1, 2, 8})
    assert parse_cpu_list(" 3 , 1-1 ") == frozenset({1, 3})
    assert format_cpu_list({0, 1, 2, 8, 10, 11}) == "0-2,8,10-11"
    assert format_cpu_list([5]) == "5"
    assert parse_cpu_list(format_cpu_list({0, 2, 3, 4, 9})) == {0, 2, 3, 4, 9}
    for bad in ("", ",", "a", "3-1", "1-", "-1", "0-1,x"):
        with pytest.raises(ConfigError, match="CPU list"):
            parse_cpu_list(bad)


def test_the_split_refuses_what_this_machine_cannot_give() -> None:
    with pytest.raises(ConfigError, match="not usable here"):
        split_cpus({max(USABLE) + 1}, need_rest=False)
    with pytest.raises(ConfigError, match="leaves no CPU"):
        split_cpus(USABLE, need_rest=True)
    assert split_cpus(USABLE, need_rest=False) == frozenset()
    assert split_cpus({min(USABLE)}, need_rest=False) == USABLE - {min(USABLE)}


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable CPUs")
def test_every_thread_is_moved_and_a_later_thread_inherits_the_mask() -> None:
    cpus = frozenset({max(USABLE)})
    proc = subprocess.Popen([sys.executable, "-c", LATE_THREAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "up"
        assert thread_masks(proc.pid) == {USABLE}
        pin_process(proc.pid, cpus)
        assert thread_masks(proc.pid) == {cpus}
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert parse_cpu_list(proc.stdout.readline().strip()) == cpus
    finally:
        proc.kill()
        proc.wait()
    assert frozenset(os.sched_getaffinity(0)) == USABLE  # this process was not touched
