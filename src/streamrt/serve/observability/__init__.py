"""The observability room: the records every other room writes into while it serves.

Owns the per-model statistics and histograms (:mod:`.stats`), request tracing with its context
variable (:mod:`.tracing`) and the OpenTelemetry exporter behind ``--trace-otlp-url``
(:mod:`.otel`). Rendering them for Prometheus is a listener's job
(:mod:`streamrt.serve.listeners.metrics`), since it serves HTTP over the core.

May import: only the layers below serve/ (errors, ``_optional``); it is the bottom room of
serve/ (``serve-rooms``), so any room may record into it.

Public surface (each module's ``__all__``):

* :mod:`.stats`: ``ModelStats``, ``StepStats``, ``Histogram``, ``Duration``, the bucket tables;
* :mod:`.tracing`: ``Tracer``, ``RequestTrace``, ``RequestContext``, ``REQUEST_CONTEXT``;
* :mod:`.otel`: ``OtlpExporter``, ``TraceRecord``, ``parse_traceparent``.
"""
