"""A load generator's failures on one line (``streamrt perf``).

grpcio's ``AioRpcError`` prints as a multi-line block (status, details, debug string), which a
one-line CLI error cuts off mid-sentence; an HTTP server answering a gRPC client shows up only as
"Failed parsing HTTP/2" deep in it. These helpers say what happened in a line.
"""

from __future__ import annotations

import json

from streamrt.errors import StreamRTError

__all__ = ["grpc_error_line", "http_error_text", "unreachable"]


def http_error_text(body: bytes) -> str:
    """A KServe error reply's message (``{"error": "..."}``), else the start of the body, on one line."""
    text = body[:2000].decode(errors="replace")
    try:
        message = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        message = text
    return " ".join(str(message).split())[:300]


def grpc_error_line(exc: BaseException) -> str:
    """A gRPC call's failure on one line: ``INVALID_ARGUMENT: batch of 64 rows ...``."""
    code = getattr(exc, "code", lambda: None)()
    details = getattr(exc, "details", lambda: None)() or str(exc)
    details = " ".join(str(details).split())
    return f"{code.name}: {details}" if code is not None else details


def unreachable(protocol: str, url: str, model: str, exc: BaseException) -> StreamRTError:
    """Why the first call (the model's metadata) failed, on one line with what to try."""
    text = " ".join(str(getattr(exc, "details", lambda: None)() or exc).split())
    code = getattr(getattr(exc, "code", lambda: None)(), "name", None)
    if protocol == "grpc" and code == "UNAVAILABLE":
        if "HTTP/2" in text or "http1" in text.lower():
            return StreamRTError(f"no gRPC server at {url} (an HTTP server answered?)",
                                 hint="give the server's gRPC port (-u HOST:PORT, 8001 by default), or -i http "
                                 "for this one")
        return StreamRTError(f"no gRPC server at {url} ({text[:160]})", hint="is the server running there?")
    if code is not None:
        return StreamRTError(f"cannot get the metadata of model '{model}' from grpc://{url}: "
                             f"{grpc_error_line(exc)[:300]}", hint="is the server running there?")
    return StreamRTError(f"cannot get the metadata of model '{model}' from {protocol}://{url}: "
                         f"{type(exc).__name__}: {text[:200]}", hint="is the server running there?")
