"""Inductor's CPU vector-ISA probe, paid once per machine and cache directory instead of once per compile process.

AOTInductor's compile calls ``pick_vec_isa()`` for its wrapper's compiler flags, even for a plan whose kernels all
run on the GPU. The probe builds a test program per vector ISA the CPU lists, and per extension an ISA checks on top
(AVX-512 BF16, VNNI, AMX, AMX-FP16), and loads each one (torch 2.11: in a new Python process that imports torch).
Every process that compiles pays it again: a level-5 build's compile child, a rebuild's. On the H100 of 2026-12-07
it took 42-48 s in a fresh process (``scripts/vec_isa_probe.py``), 22.5 s of a 64 s level-5 rebuild.

:func:`recorded_check_builds` answers the probe's test builds (``VecISA.check_build``) from a record in Inductor's cache
directory (``streamrt-vec-isa.json``), kept per CPU flags, torch version and C++ compiler with its version: the first
compile in a directory probes as torch does and records each test that passed (keyed by the ISA, its compiler flags and
the test program); a later compile gets the same answers without building or loading anything, so it picks exactly the
ISA the probe would have picked. A test that failed is not recorded (it could have failed for a passing reason, a full
disk, a timeout) and runs again in the next process. ``STREAMRT_VEC_ISA_RECORD=0`` turns the record off.

An earlier version set Inductor's ``cpp.vec_isa_ok``: that skips only the base test of each ISA; the extension
tests still ran (the 22.5 s above).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrt.plan import atomic_write

__all__ = ["OFF_SWITCH", "RECORD", "recorded_check_builds"]

log = logging.getLogger(__name__)

RECORD = "streamrt-vec-isa.json"
OFF_SWITCH = "STREAMRT_VEC_ISA_RECORD"
"""``STREAMRT_VEC_ISA_RECORD=0``: never use a record (every compile process probes, as torch does alone)."""


def _cache_dir() -> Path:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # older torch
        from torch._inductor.codecache import cache_dir
    return Path(cache_dir())


@functools.cache
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _compiler() -> str:
    """The C++ compiler Inductor builds with and its version text (``$CXX`` alone where torch's helpers moved): a
    compiler upgraded in place changes what the probe's tests would answer."""
    try:
        from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

        compiler = get_cpp_compiler()
        return f"{compiler}|{get_compiler_version_info(compiler)}"
    except Exception:
        return os.environ.get("CXX", "")


def identity() -> str:
    """What the probe's answers depend on: torch's version, the CPU's architecture and flags, the C++ compiler and
    its version."""
    import torch

    text = "|".join([torch.__version__, platform.machine(), _cpu_flags(), _compiler()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_key(isa: Any, code: str) -> str:
    """One test build: the ISA, the compiler flags it builds with now (an extension test adds its own) and the
    program."""
    flags = getattr(isa, "_arch_flags", "")
    return hashlib.sha256(f"{type(isa).__name__}|{flags}|{code}".encode()).hexdigest()[:24]


def _read_passed(path: Path) -> set[str]:
    """The tests ``path`` records as passed on this machine and torch; none for another's or an unreadable one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(record, dict) or record.get("identity") != identity():
        return set()
    return {str(key) for key in record.get("passed", [])}


@contextlib.contextmanager
def recorded_check_builds(folder: Path | None = None) -> Iterator[None]:
    """For the block: each vector-ISA test build the record in ``folder`` (default: Inductor's cache directory) says
    passed is answered without building; each other runs as usual and, when it passes, is added to the record at the
    end. Never raises on its own account: without torch's ``VecISA.check_build`` (internals moved) the block runs
    untouched."""
    if os.environ.get(OFF_SWITCH) == "0":
        yield
        return
    try:
        from torch._inductor.cpu_vec_isa import VecISA

        original = VecISA.check_build
        path = (folder or _cache_dir()) / RECORD
        passed = _read_passed(path)
    except Exception as exc:  # torch's internals moved: probe as usual
        log.debug("vector-ISA record not used: %s: %s", type(exc).__name__, exc)
        yield
        return
    added: set[str] = set()

    def check_build(self: Any, code: str) -> bool:
        key = check_key(self, code)
        if key in passed:
            return True
        ok = bool(original(self, code))
        if ok:
            added.add(key)
        return ok

    VecISA.check_build = check_build  # type: ignore[method-assign]
    try:
        yield
    finally:
        if VecISA.check_build is check_build:  # not replaced again meanwhile (another thread's block)
            VecISA.check_build = original  # type: ignore[method-assign]
        if added:
            _write(path, _read_passed(path) | passed | added)


def _write(path: Path, passed: set[str]) -> None:
    try:
        with atomic_write(path) as f:
            f.write(json.dumps({"identity": identity(), "passed": sorted(passed)}).encode())
    except Exception as exc:
        log.debug("vector-ISA record not written: %s: %s", type(exc).__name__, exc)
