"""An AOTInductor runner that gives the GIL up while the model runs.

torch's runner (``torch._C._aoti.AOTIModelPackageLoader.run``, what ``load_package`` returns)
holds the GIL for the whole model run: every kernel launch of the plan, 0.66 ms per 1080p frame
for the bundled detector on the H200 without CUDA graphs, during which no other Python thread of
the process moves. The streams pipeline then cannot overlap a frame's host stages with the next
frame's engine stage: on 2026-12-02 streams alone reached 1.49-1.55x the synchronous loop, its
load thread waiting for the GIL (``scripts/gpu_video_check.py`` part 4).

This runner calls the model's own C entry points (``AOTInductorModelContainerCreateWithDevice``,
``...RunSingleThreaded``, ``...Delete``, the C ABI every AOTInductor ``.so`` exports) through
:mod:`ctypes`, which releases the GIL around each foreign call. Tensors cross the boundary as
AtenTensorHandles (``torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors`` and
``alloc_tensors_by_stealing_from_void_ptrs``, the helpers torch's runner uses itself); the run
takes ownership of the input handles and hands over new output handles.

It opens only the packages it understands: one model library, kernels either in it or as
``.cubin`` files beside it (passed as the cubin directory), weights inside the library, no
proxy executor (custom operators). Anything else, or any failure to open, returns ``None`` and
the caller uses torch's runner. ``STREAMRT_AOTI_RUNNER=torch`` forces torch's runner (the A/B
of the benchmarks); ``nogil`` (the default) uses this one where it can.

torch's runner is opened by :func:`open_torch_runner`, not ``torch._inductor.package.load_package``:
``load_package`` first compares the package's device information with this machine's, and that calls
Inductor's ``pick_vec_isa``, which compiles test programs against ATen's vector headers in a process that
has not compiled anything yet. On the H200 (2026-12-04) that was 48 of the 52.6 s a fresh process took
to open torch's runner for a ResNet-50 plan (our runner: 6.3 s); the comparison only logs a warning,
and a plan's manifest already refuses a device it was not built for.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["RUNNER_ENV", "NoGilRunner", "open_nogil_runner", "open_torch_runner", "runner_kind"]

log = logging.getLogger(__name__)

RUNNER_ENV = "STREAMRT_AOTI_RUNNER"
# Files of a package's model folder this runner knows what to do with; anything else (external
# weights, extern-kernel nodes for a proxy executor, sources to compile on load) means torch's runner.
_KNOWN = (".so", ".cpp", ".cubin", "_metadata.json", ".h")
# Extraction happens once per folder: a second context of the same profile opens the library already
# there (rewriting a library another context has mapped would crash it).
_EXTRACTING = threading.Lock()


def runner_kind() -> str:
    """``nogil`` (default) or ``torch``, from ``STREAMRT_AOTI_RUNNER``."""
    kind = os.environ.get(RUNNER_ENV, "nogil").strip().lower() or "nogil"
    return kind if kind in ("nogil", "torch") else "nogil"


def _capsule_api() -> tuple[Any, Any]:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return get, new


class NoGilRunner:
    """One model container of one AOTInductor library; ``runner(*tensors)`` like torch's runner.

    Used by one thread at a time (like a single-threaded torch runner: a context owns its runners).
    """

    def __init__(self, library: Path, device: str, cubin_dir: Path) -> None:
        import torch
        from torch.utils import _pytree as pytree

        self._torch = torch
        self._lib = ctypes.CDLL(str(library))  # CDLL, not PyDLL: each call runs without the GIL
        self._device = device
        self._handle = ctypes.c_void_p()
        self._check(self._lib.AOTInductorModelContainerCreateWithDevice(
            ctypes.byref(self._handle), ctypes.c_size_t(1), device.encode(), str(cubin_dir).encode()), "create")
        counts = [ctypes.c_size_t(), ctypes.c_size_t()]
        self._check(self._lib.AOTInductorModelContainerGetNumInputs(self._handle, ctypes.byref(counts[0])), "inputs")
        self._check(self._lib.AOTInductorModelContainerGetNumOutputs(self._handle, ctypes.byref(counts[1])), "outputs")
        self.num_inputs, self.num_outputs = counts[0].value, counts[1].value
        specs = [ctypes.c_char_p(), ctypes.c_char_p()]
        self._check(self._lib.AOTInductorModelContainerGetCallSpec(
            self._handle, ctypes.byref(specs[0]), ctypes.byref(specs[1])), "call spec")
        self._out_spec = pytree.treespec_loads((specs[1].value or b"").decode())
        self._run = self._lib.AOTInductorModelContainerRunSingleThreaded
        self._get, self._new = _capsule_api()
        self._to_handles = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors
        self._from_handles = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"AOTInductor model container: {what} failed (AOTIRuntimeError {code})")

    def __call__(self, *args: Any) -> Any:
        torch = self._torch
        if len(args) != self.num_inputs:
            raise RuntimeError(f"the model takes {self.num_inputs} inputs, got {len(args)}")
        handles = (ctypes.c_void_p * self.num_inputs)(*[self._get(h, None) for h in self._to_handles(list(args))])
        outputs = (ctypes.c_void_p * self.num_outputs)()
        stream = None
        if self._device.startswith("cuda"):  # torch's runner launches on the current stream: so does this one
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self._run(self._handle, handles, ctypes.c_size_t(self.num_inputs), outputs,
                              ctypes.c_size_t(self.num_outputs), stream, None), "run")
        tensors = self._from_handles([self._new(outputs[i], None, None) for i in range(self.num_outputs)])
        from torch.utils import _pytree as pytree

        return pytree.tree_unflatten(tensors, self._out_spec)

    def close(self) -> None:
        if self._handle:
            self._lib.AOTInductorModelContainerDelete(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()


def open_torch_runner(package: Path, device_index: int, model_name: str = "model") -> Any:
    """torch's single-threaded runner for ``package``, what ``load_package(..., run_single_threaded=True)``
    returns, without its device-information check (see the module docstring)."""
    import torch
    from torch._inductor.package.package import AOTICompiledModel

    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), model_name, True, 1, device_index)
    return AOTICompiledModel(loader)


def open_nogil_runner(package: Path, folder: Path, device_index: int, model_name: str = "model") -> NoGilRunner | None:
    """``package`` (a ``.pt2``) opened as a :class:`NoGilRunner` (model files extracted under ``folder``),
    or ``None`` where this runner does not apply (see the module docstring); never raises."""
    if runner_kind() != "nogil":
        return None
    try:
        with zipfile.ZipFile(package) as archive:
            marker = f"/data/aotinductor/{model_name}/"
            members = [n for n in archive.namelist() if marker in n and not n.endswith("/")]
            unknown = [n for n in members if not n.endswith(_KNOWN)]
            libraries = [n for n in members if n.endswith(".so")]
            if unknown or len(libraries) != 1 or any("/data/weights/" in n for n in archive.namelist()):
                log.debug("%s: torch's runner (files %s)", package.name, unknown or libraries)
                return None
            library = folder / libraries[0]
            with _EXTRACTING:
                if not library.exists():
                    archive.extractall(folder, members)
        device = "cpu" if device_index < 0 else f"cuda:{device_index}"
        return NoGilRunner(library, device, library.parent)
    except Exception as exc:  # any surprise: torch's runner, which holds the GIL but works
        log.warning("AOTInductor runner without the GIL unavailable for %s (%s: %s); using torch's runner",
                    package.name, type(exc).__name__, exc)
        return None
