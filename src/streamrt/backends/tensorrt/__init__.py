"""The TensorRT backend: ``backend`` (the registry's :class:`Backend`: versions, target GPU,
compatibility, load), ``builder`` (ONNX -> serialized engine, imported by ``build`` only),
``engine`` (run a plan) and ``compat`` (the 10.x/11.x differences and pure decisions, importable
without TensorRT).

This package imports nothing heavy: ``import tensorrt`` happens in ``backend``, ``builder`` and
``engine``, so ``compat`` and its tests run on machines without TensorRT. The registry in
:mod:`streamrt.backends` loads ``backend.TensorRTBackend``; loading a plan never imports
``builder``.
"""
