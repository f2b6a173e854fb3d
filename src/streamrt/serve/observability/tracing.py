"""Request tracing (JSON lines) and the request context that structured logs read.

Tracing follows Triton's trace extension: when ``ServerConfig.trace_file`` is set, every
``trace_rate``-th request gets a :class:`RequestTrace`, and when it is answered one JSON object is
appended to the file::

    {"id": 7, "model_name": "cnn", "model_version": "1", "request_id": "abc",
     "timestamps": [{"name": "REQUEST_START", "ns": ...}, {"name": "QUEUE_START", "ns": ...},
                    {"name": "COMPUTE_START", "ns": ...}, {"name": "COMPUTE_INPUT_END", "ns": ...},
                    {"name": "COMPUTE_OUTPUT_START", "ns": ...}, {"name": "COMPUTE_END", "ns": ...},
                    {"name": "REQUEST_END", "ns": ...}]}

Timestamps are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux, the clock Triton's steady
clock reads), so differences are durations; ``wall_start`` is the receipt as a Unix time in
seconds, to line a trace up with logs. REQUEST_START is when the front end received the request,
QUEUE_START when it entered the model's queue, COMPUTE_START when its batch left the queue for an
instance, COMPUTE_INPUT_END / COMPUTE_OUTPUT_START bound the engine run (from the instance's own
timings), COMPUTE_END when the batch's result reached the event loop, REQUEST_END when the
response was ready for the front end. A failed request has an ``"error"`` field and only the
timestamps it reached.

:data:`REQUEST_CONTEXT` holds the request id, model and version of the request a task is
handling; ``streamrt serve --log-format json`` adds them to every log line written inside it.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from streamrt.errors import ConfigError

if TYPE_CHECKING:
    from streamrt.serve.observability.otel import OtlpExporter

__all__ = ["REQUEST_CONTEXT", "RequestContext", "RequestTrace", "Tracer"]


@dataclass(frozen=True)
class RequestContext:
    """What structured logs say about the request being handled."""

    request_id: str
    model: str
    version: str


REQUEST_CONTEXT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "streamrt_request", default=None)


@dataclass
class RequestTrace:
    """The timestamps of one traced request (Triton's trace JSON, one object per request)."""

    id: int
    model: str
    version: str
    request_id: str
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    wall_start: float = field(default_factory=time.time)
    error: str | None = None
    parent: str | None = None  # the caller's W3C traceparent, when it sent one

    def mark(self, name: str, ns: int | None = None) -> None:
        self.timestamps.append((name, time.perf_counter_ns() if ns is None else ns))

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": self.id, "model_name": self.model, "model_version": self.version, "request_id": self.request_id,
            "wall_start": round(self.wall_start, 6),
            "timestamps": [{"name": name, "ns": ns} for name, ns in self.timestamps],
        }
        if self.error is not None:
            entry["error"] = self.error
        return entry


class Tracer:
    """Samples requests and writes their traces: JSON lines appended to ``path`` and/or spans sent
    to an OpenTelemetry collector (thread-safe).

    Args:
        path: the trace file (appended to; its folder must exist); None: no file.
        rate: trace one request in ``rate`` (Triton's ``trace-rate``; 1 traces every request).
        otlp_url: an OTLP/HTTP traces endpoint (:mod:`streamrt.serve.observability.otel`); None: no spans.
    """

    def __init__(self, path: str | Path | None, rate: int = 1, *, otlp_url: str | None = None) -> None:
        if rate < 1:
            raise ConfigError(f"trace_rate must be an integer >= 1, got {rate}", hint="--trace-rate 1 traces all")
        self.path, self.rate = (Path(path) if path is not None else None), rate
        self._file: IO[str] | None = None
        if self.path is not None:
            try:
                self._file = self.path.open("a", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot open the trace file {self.path}: {exc.strerror}",
                                  hint="--trace-file PATH in a folder that exists and is writable") from None
        self._otlp: OtlpExporter | None = None
        if otlp_url is not None:
            from streamrt.serve.observability.otel import OtlpExporter

            self._otlp = OtlpExporter(otlp_url)
        self._lock = threading.Lock()
        self._seen = itertools.count()
        self._ids = itertools.count(1)

    def start(self, model: str, version: str, request_id: str, received_ns: int,
              parent: str | None = None) -> RequestTrace | None:
        """A trace for this request when it is sampled (None otherwise), REQUEST_START marked;
        ``parent``: the request's W3C traceparent (its spans join the caller's trace)."""
        if next(self._seen) % self.rate:
            return None
        trace = RequestTrace(next(self._ids), model, version, request_id, parent=parent)
        trace.wall_start -= (time.perf_counter_ns() - received_ns) / 1e9
        trace.mark("REQUEST_START", received_ns)
        return trace

    def finish(self, trace: RequestTrace) -> None:
        """Mark REQUEST_END; append the trace as one line and/or queue its spans."""
        trace.mark("REQUEST_END")
        if self._otlp is not None:
            self._otlp.export(trace)
        if self._file is None:
            return
        line = json.dumps(trace.to_json())
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
        if self._otlp is not None:
            self._otlp.close()
            self._otlp = None
