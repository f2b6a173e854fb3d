"""The TensorRT backend: ``builder`` (ONNX -> serialized engine), ``engine`` (run a plan) and
``compat`` (the 10.x/11.x differences and pure decisions, importable without TensorRT).

This package imports nothing heavy: ``import tensorrt`` happens in ``builder`` and ``engine``,
so ``compat`` and its tests run on machines without TensorRT. The registry in
:mod:`streamrt.backends` loads ``builder.TensorRTBackend``.
"""
