"""Out-of-memory, host or device, turned into one :class:`~streamrt.errors.OutOfMemoryError`.

Host allocations fail with :class:`MemoryError` (NumPy's says how much: "Unable to allocate
1.00 GiB for an array..."); torch's CUDA caching allocator raises ``torch.OutOfMemoryError``
("Tried to allocate 2.00 GiB"); torch's CPU allocator raises a plain ``RuntimeError``
("[enforce fail at alloc_cpu.cpp:127] ... DefaultCPUAllocator: can't allocate memory: you tried to
allocate 70368744177664 bytes"); ONNX Runtime raises its own exception with "Failed to allocate
memory". :func:`out_of_memory_guard` wraps a build, a load or an inference so that any of them
ends as one line naming what was being allocated and what to try, never a traceback. It imports
nothing heavy: torch's error is recognised by name.

Example:
    >>> with out_of_memory_guard("loading plan m.plan", BUILD_HINT):     # doctest: +SKIP
    ...     payload = path.read_bytes()
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from streamrt.errors import OutOfMemoryError, StreamRTError

__all__ = ["BUILD_HINT", "INFER_HINT", "LOAD_HINT", "as_out_of_memory", "out_of_memory_guard"]

BUILD_HINT = ("build smaller max shapes (--max-shapes), a lower --opt-level (less autotuning), "
              "or build on a machine or device with more free memory")
LOAD_HINT = ("free memory (other processes, other loaded models), load fewer instances, "
             "or run on another device (--option device=cpu, or another GPU via CUDA_VISIBLE_DEVICES)")
INFER_HINT = ("use smaller inputs or batches (rebuild with smaller --max-shapes), fewer instances or "
              "--workers, or another device (another GPU via CUDA_VISIBLE_DEVICES, or the CPU)")

_AMOUNT = re.compile(r"(?:[Tt]ried to allocate|Unable to allocate|can't allocate memory: you tried to allocate)"
                     r"\s+([\d.]+\s*(?:[KMGT]i?B|bytes|B))")
_ORT_OOM = re.compile(r"Failed to allocate memory|bad_alloc|out of memory", re.I)
# torch's CPU allocator (c10/core/impl/alloc_cpu.cpp) fails with a RuntimeError, not a MemoryError.
_TORCH_CPU_OOM = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|alloc_cpu\.cpp")
_BYTES = re.compile(r"^(\d+)\s*bytes$")


def _readable(amount: str) -> str:
    """``70368744177664 bytes`` -> ``64.0 TiB`` (amounts already in KiB/MiB/GiB are kept)."""
    match = _BYTES.match(amount)
    if match is None:
        return amount
    size = float(match.group(1))
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return amount  # pragma: no cover - the loop always returns


def as_out_of_memory(exc: BaseException, what: str, hint: str) -> OutOfMemoryError | None:
    """The :class:`OutOfMemoryError` for ``exc`` if it is an out-of-memory failure, else None."""
    if isinstance(exc, OutOfMemoryError):
        return exc
    if isinstance(exc, StreamRTError):  # a backend's BuildError/InferenceError wrapping the allocator's error
        return as_out_of_memory(exc.__cause__, what, hint) if exc.__cause__ is not None else None
    name, module = type(exc).__name__, type(exc).__module__
    text = str(exc)
    if name == "OutOfMemoryError" and module.startswith("torch"):
        memory = "CUDA device" if "CUDA" in text or "cuda" in text else "device"
    elif isinstance(exc, MemoryError) or (type(exc) is RuntimeError and _TORCH_CPU_OOM.search(text)):
        memory = "host"
    elif module.startswith("onnxruntime") and _ORT_OOM.search(text):
        memory = "device" if "CUDA" in text else "host"
    else:
        return None
    match = _AMOUNT.search(text)
    return OutOfMemoryError(what, memory=memory, requested=_readable(match.group(1)) if match else None, hint=hint)


@contextlib.contextmanager
def out_of_memory_guard(what: str, hint: str) -> Iterator[None]:
    """Re-raise any out-of-memory failure inside the block as :class:`OutOfMemoryError`."""
    try:
        yield
    except Exception as exc:
        oom = as_out_of_memory(exc, what, hint)
        if oom is None or oom is exc:
            raise
        raise oom from exc
