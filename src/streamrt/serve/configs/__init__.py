"""The configs room: the server's and each model's configuration, in every format it is read from.

Owns the frozen dataclasses (:mod:`.config`: ``ServerConfig``, ``ModelConfig`` and the batching,
sequence, instance-group, rate-limiter and warm-up parts; :mod:`.ensemble_config`), reading and
writing them as Triton ``config.pbtxt``/JSON through the protobuf message (:mod:`.triton_config`,
:mod:`.config_message`), the shape profiles derived from a config (:mod:`.derived_profiles`) and
the files a load request carries (:mod:`.model_files`).

May import: :mod:`streamrt.serve.wire` (the ``model_config.proto`` messages), the rooms below it
and the layers below serve/; never execution, scheduling, models or listeners (``serve-rooms``).
Everything above reads its settings from here.

Public surface (each module's ``__all__``):

* :mod:`.config`: ``ServerConfig``, ``ModelConfig``, ``TensorConfig``, ``BatchingConfig``,
  ``SequenceBatchingConfig``, ``InstanceGroupConfig``, ``RateLimiterConfig``, ``WarmupConfig``, ...;
* :mod:`.ensemble_config`: ``EnsembleConfig``, ``EnsembleStep``;
* :mod:`.config_message`: ``from_mapping``, ``from_message``, ``to_message``, ``read_config_file``;
* :mod:`.triton_config`: ``parse_text``, ``parse_mapping``, ``message_json``, ``unsupported_fields``,
  ``PLATFORMS``;
* :mod:`.derived_profiles`: ``derive_profile``; :mod:`.model_files`: ``FILE_PREFIX``,
  ``write_model_files``, ``remove_model_files``.
"""
