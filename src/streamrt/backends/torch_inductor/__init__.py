"""The torch_inductor backend: torch.export + AOTInductor packages (GPU, or CPU through C++).

Rooms: ``backend`` (the registry's :class:`Backend`: versions, target, compatibility, load),
``builder`` (export and compile one ``.pt2`` per shape profile, imported by ``build`` only),
``engine`` (load packages, contexts, CUDA-graph replay), ``payload`` (the plan's zip of
packages), ``target`` (device kind and what a plan is tied to), ``cache`` (Inductor's compile
cache directory and the ``--timing-cache``), ``levels`` (optimization levels 0..5 as Inductor
knobs), ``memory_format`` (level 5's measured layout choice), ``tf32`` (TF32 and cuDNN benchmark
flags, set and restored around builds and calls). Building straight from an
``nn.Module`` is :func:`streamrt.build_module` (``streamrt.building.module_builder``), one layer up.

The registry in :mod:`streamrt.backends` loads ``backend.TorchInductorBackend``; loading a plan
imports ``backend`` and ``engine``, never ``builder``.
"""
