"""Client side of the shared-memory extensions for the load generator (``perf --shared-memory``).

As perf_analyzer does, each client process puts the request's input tensors once into one input
region and gives every request one output region (all requests of the process write their outputs
there: the load generator checks nothing in them). Regions are made with tritonclient's own
utilities (``tritonclient.utils.shared_memory`` / ``cuda_shared_memory``), which is what users of
the extension run, and registered with the server by the load generator's HTTP or gRPC client.

Example:
    >>> regions = ClientRegions.create("system", {"x": x}, output_bytes={"y": 4096})   # doctest: +SKIP
    >>> regions.registrations()   # [(kind, name, key or raw handle, byte_size), ...]      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrt.errors import ConfigError, MissingDependencyError

__all__ = ["ClientRegions", "Registration"]


@dataclass(frozen=True)
class Registration:
    """One region to register: ``key`` (system) or ``raw_handle`` (CUDA, raw bytes), and its size."""

    kind: str
    name: str
    byte_size: int
    key: str = ""
    raw_handle: bytes = b""


@dataclass
class ClientRegions:
    """The input and output regions of one client process, and where each tensor lies in them."""

    kind: str
    inputs: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # name -> (region, offset, bytes)
    outputs: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    registrations: list[Registration] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list)
    _module: Any = None

    @classmethod
    def create(cls, kind: str, inputs: Mapping[str, np.ndarray], output_bytes: Mapping[str, int]) -> ClientRegions:
        """Make an input region holding ``inputs`` and an output region with ``output_bytes`` per output."""
        if kind not in ("system", "cuda"):
            raise ConfigError(f"shared memory must be system or cuda, got {kind!r}")
        module = _module(kind)
        regions = cls(kind, _module=module)
        tag = f"streamrt_perf_{os.getpid()}"
        in_size = sum(a.nbytes for a in inputs.values())
        out_size = sum(output_bytes.values())
        for suffix, size in (("in", in_size), ("out", out_size)):
            name = f"{tag}_{suffix}"
            if kind == "system":
                handle = module.create_shared_memory_region(name, f"/{name}", max(size, 1))
                regions.registrations.append(Registration(kind, name, max(size, 1), key=f"/{name}"))
            else:
                handle = module.create_shared_memory_region(name, max(size, 1), 0)
                import base64

                raw = base64.b64decode(module.get_raw_handle(handle))
                regions.registrations.append(Registration(kind, name, max(size, 1), raw_handle=raw))
            regions._handles.append(handle)
        offset = 0
        arrays = []
        for name, array in inputs.items():
            regions.inputs[name] = (f"{tag}_in", offset, array.nbytes)
            offset += array.nbytes
            arrays.append(np.ascontiguousarray(array))
        module.set_shared_memory_region(regions._handles[0], arrays)
        offset = 0
        for name, size in output_bytes.items():
            regions.outputs[name] = (f"{tag}_out", offset, size)
            offset += size
        return regions

    def close(self) -> None:
        """Destroy the regions (after the server unregistered them)."""
        for handle in self._handles:
            with contextlib.suppress(Exception):  # already gone: nothing left to free
                self._module.destroy_shared_memory_region(handle)
        self._handles.clear()


def _module(kind: str) -> Any:
    try:
        if kind == "system":
            import tritonclient.utils.shared_memory as shm
        else:
            import tritonclient.utils.cuda_shared_memory as shm
    except (ImportError, RuntimeError) as exc:  # cuda_shared_memory raises RuntimeError without cuda-python
        raise MissingDependencyError(
            "tritonclient" if kind == "system" else "cuda-python", "serve" if kind == "system" else "cuda-shm",
            purpose=f"--shared-memory {kind} ({exc})",
        ) from None
    return shm
