"""The scheduling room: which requests run together, and when.

Owns the dynamic batcher's queue (:mod:`.batcher`), the loop both schedulers run on (wake and
wait, batch launch through the rate limiter, drain and close: :mod:`.loop`), the per-model
scheduler that forms batches and hands them to an instance group (:mod:`.scheduler`), the
sequence batcher with its slots and control inputs (:mod:`.sequence`) and the one timer thread
they wake on (:mod:`.timers`).

May import: :mod:`streamrt.serve.execution` (instances, ``BatchResult``, rate-limiter tickets),
:mod:`streamrt.serve.configs`, :mod:`streamrt.serve.wire`, :mod:`streamrt.serve.observability`
and the layers below serve/; never a model, the core or a listener (``serve-rooms``).

Public surface (each module's ``__all__``):

* :mod:`.batcher`: ``BatchQueue``, ``Pending``;
* :mod:`.loop`: ``SchedulerLoop`` (the base of both schedulers), ``Executor``, ``Executors``, ``Job``;
* :mod:`.scheduler`: ``ModelScheduler``;
* :mod:`.sequence`: ``SequenceScheduler``, ``check_sequence_io``, ``sequence_warmup_inputs``;
* :mod:`.timers`: ``wake_at``, ``Cancellable``.
"""
