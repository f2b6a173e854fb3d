"""Request traces as OpenTelemetry spans, exported over OTLP/HTTP to a collector.

OpenTelemetry is the convention for distributed tracing (Triton: ``--trace-config
mode=opentelemetry``); ``streamrt serve --trace-otlp-url http://collector:4318/v1/traces`` sends
every sampled request (``--trace-rate``) as a tree of spans built from the same timestamps as the
Triton-format trace file:

* ``infer <model>`` (SERVER): received → response ready; attributes ``model.name``,
  ``model.version``, ``request.id``; status ERROR with the message when the request failed;
* ``queue`` (QUEUE_START → COMPUTE_START) and ``compute`` (COMPUTE_START → COMPUTE_END) under it,
  ``compute`` split into ``compute_input`` (batch gather and copy in), ``compute_infer`` (the
  engine) and ``compute_output`` (outputs out and split);
* for an ensemble, ``step <i>`` per step with the step's own queue and compute spans under it.

A request that carries a W3C ``traceparent`` (HTTP header or gRPC metadata) joins the caller's
trace: its ``infer`` span is a child of the caller's span. Spans are batched and sent from the
SDK's own thread; a collector that is down costs dropped spans and a log line, never a request.

Needs the ``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from streamrt._optional import require

__all__ = ["OtlpExporter", "TraceRecord", "parse_traceparent"]


class TraceRecord(Protocol):
    """What a finished request's trace gives (:class:`streamrt.serve.observability.tracing.RequestTrace`)."""

    @property
    def model(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def timestamps(self) -> Sequence[tuple[str, int]]: ...
    @property
    def wall_start(self) -> float: ...
    @property
    def error(self) -> str | None: ...
    @property
    def parent(self) -> str | None: ...

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_COMPUTE_PARTS = (("compute_input", "COMPUTE_START", "COMPUTE_INPUT_END"),
                  ("compute_infer", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
                  ("compute_output", "COMPUTE_OUTPUT_START", "COMPUTE_END"))
_STEP = re.compile(r"^STEP(\d+)_(.+)$")


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """``(trace id, parent span id, flags)`` of a W3C ``traceparent`` value, None when absent or
    malformed (a bad header starts a new trace, as the W3C spec says; it is not an error)."""
    found = _TRACEPARENT.match((value or "").strip().lower())
    if found is None:
        return None
    trace_id, span_id, flags = int(found[1], 16), int(found[2], 16), int(found[3], 16)
    return (trace_id, span_id, flags) if trace_id and span_id else None


class OtlpExporter:
    """Turns finished request traces (:class:`TraceRecord`) into spans and exports them over OTLP/HTTP.

    Args:
        url: the collector's OTLP/HTTP traces endpoint (``http://host:4318/v1/traces``).
        service: the ``service.name`` resource attribute.
    """

    def __init__(self, url: str, service: str = "streamrt") -> None:
        require("opentelemetry.sdk.trace", extra="otel", purpose="--trace-otlp-url")
        require("opentelemetry.exporter.otlp.proto.http.trace_exporter", extra="otel", purpose="--trace-otlp-url")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.url = url
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=5)))
        self._tracer = self._provider.get_tracer("streamrt.serve")

    def export(self, trace: TraceRecord) -> None:
        """Queue the spans of one finished request (sent in batches from the SDK's thread)."""
        from opentelemetry import trace as api
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        marks = dict(trace.timestamps)
        if "REQUEST_START" not in marks:
            return
        origin = marks["REQUEST_START"]
        wall_ns = int(trace.wall_start * 1e9)

        def at(name: str) -> int:
            return wall_ns + (marks[name] - origin)

        context = None
        parent = parse_traceparent(trace.parent)
        if parent is not None:
            remote = SpanContext(parent[0], parent[1], is_remote=True, trace_flags=TraceFlags(parent[2]))
            context = api.set_span_in_context(NonRecordingSpan(remote))
        end = at("REQUEST_END") if "REQUEST_END" in marks else wall_ns + (max(marks.values()) - origin)
        root = self._tracer.start_span(f"infer {trace.model}", context=context, kind=SpanKind.SERVER,
                                       start_time=wall_ns, attributes={
                                           "model.name": trace.model, "model.version": trace.version,
                                           "request.id": trace.request_id})
        if trace.error is not None:
            root.set_status(Status(StatusCode.ERROR, trace.error))
        inside = api.set_span_in_context(root)
        self._phases(marks, "", at, inside)
        steps: dict[int, dict[str, int]] = {}
        for name, ns in trace.timestamps:
            found = _STEP.match(name)
            if found is not None:
                steps.setdefault(int(found[1]), {})[found[2]] = ns
        for index, step_marks in sorted(steps.items()):
            step_at = {f"STEP{index}_{k}": v for k, v in step_marks.items()}
            start, stop = min(step_marks.values()), max(step_marks.values())
            span = self._tracer.start_span(f"step {index}", context=inside,
                                           start_time=wall_ns + (start - origin))
            self._phases(step_at, f"STEP{index}_", lambda n, m=step_at: wall_ns + (m[n] - origin),
                         api.set_span_in_context(span))
            span.end(end_time=wall_ns + (stop - origin))
        root.end(end_time=end)

    def _phases(self, marks: dict[str, int], prefix: str, at: Any, context: Any) -> None:
        """``queue`` and ``compute`` (with its three parts) from one request's or one step's marks."""
        def has(*names: str) -> bool:
            return all(prefix + n in marks for n in names)

        if has("QUEUE_START", "COMPUTE_START"):
            self._tracer.start_span("queue", context=context, start_time=at(prefix + "QUEUE_START")).end(
                end_time=at(prefix + "COMPUTE_START"))
        if not has("COMPUTE_START", "COMPUTE_END"):
            return
        from opentelemetry import trace as api

        compute = self._tracer.start_span("compute", context=context, start_time=at(prefix + "COMPUTE_START"))
        within = api.set_span_in_context(compute)
        for name, first, last in _COMPUTE_PARTS:
            if has(first, last):
                self._tracer.start_span(name, context=within, start_time=at(prefix + first)).end(
                    end_time=at(prefix + last))
        compute.end(end_time=at(prefix + "COMPUTE_END"))

    def close(self) -> None:
        """Send what is queued (up to the SDK's export timeout) and stop the exporter's thread."""
        self._provider.shutdown()
