"""The ONNX Runtime backend: ``backend`` (the registry's :class:`Backend`: versions, target
device, compatibility, load), ``builder`` (optimize once, store the optimized model), ``engine``
(one shared session per plan) and ``session`` (providers and options both sides use).

The registry in :mod:`streamrt.backends` loads ``backend.OnnxRuntimeBackend``; a runtime that
only loads plans imports ``backend`` and ``engine`` and never ``builder``, which ``build``
imports when it runs.
"""
