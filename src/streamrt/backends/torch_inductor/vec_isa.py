"""Inductor's CPU vector-ISA probe, paid once per machine and cache directory instead of once per compile process.

AOTInductor's compile calls ``pick_vec_isa()`` for its wrapper's compiler flags, even for a plan whose kernels all
run on the GPU. The probe builds a test program per vector ISA the CPU lists (kept in Inductor's cache directory)
and loads each one (torch 2.11: in a new Python process that imports torch), and every process that compiles pays
it again: a level-5 build's compile child, a rebuild's. ``scripts/vec_isa_probe.py`` measures it.

The first compile in a cache directory probes as torch does and records what it picked, with the CPU's flags and
torch's version (``streamrt-vec-isa.json`` beside Inductor's files). A later compile on the same CPU flags and torch
trusts the record: Inductor's ``cpp.vec_isa_ok`` skips the probe and ``cpp.simdlen`` picks the recorded ISA's width
among the ISAs the CPU lists. The record is checked before it is used (the ISA so picked must be the recorded one,
else the probe runs as usual), so a compile never gets another ISA than the probe would have given it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

from streamrt.plan import atomic_write

__all__ = ["OFF_SWITCH", "RECORD", "forget_unprobed_isas", "record_probed_isa", "recorded_isa_configs"]

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


def identity() -> str:
    """What the probe's answer depends on: torch's version, the CPU's architecture and flags, the C++ compiler."""
    import torch

    text = "|".join([torch.__version__, platform.machine(), _cpu_flags(), os.environ.get("CXX", "")])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded_isa_configs(folder: Path | None = None) -> dict[str, Any]:
    """Inductor configs that skip the probe when ``folder`` (Inductor's cache directory) recorded its answer for this
    machine and torch and that answer is what the configs pick; ``{}`` otherwise (the compile probes as usual).
    Never raises: the probe is the fallback."""
    if os.environ.get(OFF_SWITCH) == "0":
        return {}
    try:
        from torch._inductor import config
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        path = (folder or _cache_dir()) / RECORD
        if not path.is_file():
            return {}
        record = json.loads(path.read_text())
        if record.get("identity") != identity() or not record.get("bits"):
            return {}
        configs = {"cpp.vec_isa_ok": True, "cpp.simdlen": int(record["bits"])}
        with config.patch(configs):
            picked = str(pick_vec_isa())
        if picked != record.get("isa"):  # another ISA of that width listed first: probe as torch does
            forget_unprobed_isas()
            log.info("vector-ISA record %s says %s, the CPU's list gives %s: probing", path, record.get("isa"), picked)
            return {}
        return configs
    except Exception as exc:  # torch's internals moved: probe as usual
        log.debug("vector-ISA record not used: %s: %s", type(exc).__name__, exc)
        return {}


def forget_unprobed_isas() -> None:
    """After a compile with :func:`recorded_isa_configs`: the process's cached ISA list was built without the probe;
    drop it so a compile without the record probes. Never raises."""
    try:
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list

        valid_vec_isa_list.cache_clear()
    except Exception as exc:
        log.debug("vector-ISA list not cleared: %s: %s", type(exc).__name__, exc)


def record_probed_isa(folder: Path | None = None) -> None:
    """Record what this process's probe picked (``pick_vec_isa()``: its answer is cached, so free after a compile),
    unless a record is there already. Never raises."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        path = (folder or _cache_dir()) / RECORD
        if path.is_file():
            return
        isa = pick_vec_isa()
        if not isa:  # no vector ISA: nothing worth skipping
            return
        with atomic_write(path) as f:
            f.write(json.dumps({"identity": identity(), "isa": str(isa), "bits": isa.bit_width()}).encode())
    except Exception as exc:
        log.debug("vector-ISA probe not recorded: %s: %s", type(exc).__name__, exc)
