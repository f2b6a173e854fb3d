"""Python models in the shape of Triton's Python backend: ``model.py`` with ``class TritonPythonModel``.

A model directory ``<repo>/<name>/config.pbtxt`` with ``backend: "python"`` and
``<repo>/<name>/<version>/model.py`` defining ``TritonPythonModel`` (``initialize(self, args)``,
``execute(self, requests) -> responses``, optional ``finalize(self)``) runs unchanged: user code
imports ``triton_python_backend_utils as pb_utils`` (:mod:`.pb_utils`), receives the requests of
each dynamic batch as a list and returns one ``InferenceResponse`` per request, in order.

Modules: :mod:`.loader` (finding and importing ``model.py``, ``initialize``'s args),
:mod:`.pb_utils` (the utilities module), :mod:`.runner` (instances on worker threads, one
``execute`` per batch), :mod:`.responses` (each response checked against the config: a wrong
dtype, shape or missing output, or ``error=TritonError``, fails only its request) and
:mod:`.model` (:class:`PythonModel`, the :class:`~streamrt.serve.models.servable.Servable`).

**Threads, not processes.** Triton runs every instance of a Python model in a stub process of
its own and moves tensors through shared memory, so instances run in parallel, each with its own
interpreter and GIL. StreamRT runs each instance as its own ``TritonPythonModel`` object on a
worker thread of its own inside the server process. Tensors pass by reference: inputs are the
zero-copy NumPy views of the request body, and CUDA tensors a step returns through DLPack stay on
the device. The price is the GIL: the instances share it with each other, with the event loop
and with the front ends. Work that releases the GIL (NumPy, OpenCV, torch and CUDA kernels, file
and network I/O) overlaps across instances and with serving; pure-Python loops do not, and a
long pure-Python ``execute`` slows every model's request handling while it runs. Module-level
state is per instance (each imports ``model.py`` as a module of its own, as each Triton stub does),
but process-wide state (``os.environ``, helper modules in ``sys.modules``, torch's global settings)
is shared between all Python models.

Example:
    >>> from streamrt.serve.models.servable import KINDS
    >>> KINDS["python"]
    'streamrt.serve.models.python_backend:load_python_model'
"""

from __future__ import annotations

from streamrt.serve.models.python_backend.model import PythonModel, load_python_model, resolve_python_config

__all__ = ["PythonModel", "load_python_model", "resolve_python_config"]
