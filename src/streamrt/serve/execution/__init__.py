"""The execution room: where a batch runs, on which device, and what it may cost.

Owns the model instances and their device staging (:mod:`.instances`: a worker per instance, staging
through :mod:`streamrt.device`), placing instance groups on GPUs
(:mod:`.placement`), the device-memory budget (:mod:`.memory_budget`), the output checks that
guard batching (:mod:`.integrity`) and the rate limiter's resources (:mod:`.rate_limiter`).

May import: :mod:`streamrt.serve.configs`, :mod:`streamrt.serve.wire`,
:mod:`streamrt.serve.observability` and the layers below serve/ (device, backends, types); never
scheduling, models, the core or a listener (``serve-rooms``): an instance does not know who
queued its batch or how the request arrived.

Public surface (each module's ``__all__``):

* :mod:`.instances`: ``InstanceGroup``, ``Instance``, ``BatchResult``, ``DeviceEngines``,
  ``DeviceOutputs``;
* :mod:`.placement`: ``Placement``, ``place_instances``, ``resolved_groups``, ``visible_gpus``,
  ``gpu_indices``, ``describe_gpus``;
* :mod:`.memory_budget`: ``MemoryBudget``, ``LoadMeasure``, ``model_limit``,
  ``release_device_memory``, ``free_device_memory``;
* :mod:`.integrity`: ``OutputCheck``, ``probe_batch_outputs``, ``probe_sizes``, ``batch_refusal``;
* :mod:`.rate_limiter`: ``RateLimiter``, ``Ticket``, ``GLOBAL``.
"""
