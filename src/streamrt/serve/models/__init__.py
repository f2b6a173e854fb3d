"""The models room: a servable model version of each kind, and the repository that loads them.

Owns the :class:`~.servable.Servable` protocol and the kind table (:mod:`.servable`), the one model
class every kind is (:class:`~.scheduled.ScheduledModel`: scheduler choice, validation, output
selection and classification, stop), the engine kind (:mod:`.model`, with :mod:`.engine_files`
for finding or building the engine and :mod:`.engine_config` for resolving its config), ensembles
(:mod:`.ensemble`), Triton-style Python models (:mod:`.python_backend`), the classification
extension's labels (:mod:`.classification`) and the model repository with its load/unload/poll
lifecycle (:mod:`.repository`).

May import: :mod:`streamrt.serve.scheduling`, :mod:`streamrt.serve.execution`,
:mod:`streamrt.serve.configs`, :mod:`streamrt.serve.wire`, :mod:`streamrt.serve.observability`,
:mod:`streamrt.serve.process` and the layers below serve/; never the core, the port or a listener
(``serve-rooms``; it is independent of :mod:`streamrt.serve.port`).

Public surface (each module's ``__all__``):

* :mod:`.servable`: ``Servable``, ``LoadContext``, ``EngineLoader``, ``KINDS``, ``load_servable``,
  ``checked_inputs``, ``check_model_shape``, ``model_metadata``, ``kind_of``;
* :mod:`.scheduled`: ``ScheduledModel``;
* :mod:`.model`: ``ServedModel``, ``load_served_model``, ``load_engine``, ``resolve_config``
  (the last two defined in :mod:`.engine_files` / :mod:`.engine_config`, with ``load_estimate``);
* :mod:`.ensemble`: ``EnsembleModel``, ``load_ensemble``;
* :mod:`.python_backend`: ``PythonModel``, ``load_python_model``, ``resolve_python_config``
  (its ``pb_utils`` is the surface user ``model.py`` files import);
* :mod:`.repository`: ``ModelRepository``, ``ModelEntry``, ``ModelState``;
* :mod:`.classification`: ``read_labels``, ``top_k_classes``.
"""
