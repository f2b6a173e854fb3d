"""The torch_inductor backend: torch.export + AOTInductor packages (GPU, or CPU through C++).

Rooms: ``builder`` (the :class:`Backend`: export and compile one ``.pt2`` per shape profile),
``engine`` (load packages, contexts, CUDA-graph replay), ``payload`` (the plan's zip of
packages), ``target`` (device kind and what a plan is tied to), ``cache`` (Inductor's compile
cache directory), ``tf32`` (the TF32 switch both sides set). Building straight from an
``nn.Module`` is :func:`streamrt.build_module` (``streamrt.module_builder``), one layer up.

The registry in :mod:`streamrt.backends` loads ``builder.TorchInductorBackend``; loading a plan
imports ``engine`` only.
"""
