"""The ONNX Runtime backend: ``builder`` (optimize once, store the optimized model), ``engine``
(one shared session per plan) and ``session`` (providers and options both sides use).

The registry in :mod:`streamrt.backends` loads ``builder.OnnxRuntimeBackend``; a runtime that
only loads plans imports ``engine`` and never the build side.
"""
