"""The build side: everything that turns a model into a plan, and ``streamrt.open``.

``builder`` (:func:`streamrt.build`: cache, manifest, the rebuild command), ``flags`` (the build
flags' table, read by the CLI and written back by the builder), ``module_builder``
(:func:`streamrt.build_module`: a torch_inductor plan from an ``nn.Module``), ``accuracy_gate``
(the precision step: lower the graph, measure the plan against ONNX Runtime fp32, refuse or warn),
``speed_check`` (int8 against fp32 on the build machine) and ``opening`` (:func:`streamrt.open`:
a plan is loaded, a model built through the cache and then loaded).

May import ``verify`` and ``running`` (a fresh plan is run to check it) and everything below;
nothing under ``running`` or ``backends`` imports this package, so loading a plan never does.
This package's ``__init__`` stays empty: it is not named ``build`` because ``streamrt.build`` is
the public function.
"""
