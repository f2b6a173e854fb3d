"""Chrome-trace JSON export of a pipeline trace (opens in Perfetto and ``chrome://tracing``).

Layout: one process "device streams" with a thread per CUDA stream, one process "host threads"
with a thread per host thread (host stages, and the ``enqueue`` spans that show what launching
each CUDA stage cost in Python). Every span is a complete event (``"ph": "X"``) named
``stage #item`` with the item, lane and kind in ``args``; timestamps are microseconds.

Example:
    >>> from streamrt.pipeline.tracing import PipelineTrace, StageSpan
    >>> trace = PipelineTrace("demo", spans=[StageSpan("pre", 0, 0, "lane0/in", "compute", 0.0, 1.5)],
    ...                       tracks={"lane0/in": "cuda stream"})
    >>> doc = to_chrome_trace(trace)
    >>> [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    ['pre #0']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamrt.pipeline.tracing import TRACK_CUDA, PipelineTrace

__all__ = ["ordered_tracks", "to_chrome_trace", "write_chrome_trace"]

_PID_DEVICE, _PID_HOST = 1, 2


def ordered_tracks(trace: PipelineTrace) -> list[str]:
    """Tracks in display order: CUDA streams first, then host threads, each sorted by name."""
    tracks = dict(trace.tracks)
    for span in trace.spans:
        tracks.setdefault(span.track, "host thread")
    return sorted(tracks, key=lambda t: (tracks[t] != TRACK_CUDA, t))


def to_chrome_trace(trace: PipelineTrace) -> dict[str, Any]:
    """The trace as a Chrome-trace JSON object (``{"traceEvents": [...], ...}``)."""
    tracks = ordered_tracks(trace)
    tid = {track: i + 1 for i, track in enumerate(tracks)}
    pid = {track: _PID_DEVICE if trace.tracks.get(track) == TRACK_CUDA else _PID_HOST for track in tracks}
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _PID_DEVICE, "name": "process_name", "args": {"name": "device streams"}},
        {"ph": "M", "pid": _PID_HOST, "name": "process_name", "args": {"name": "host threads"}},
    ]
    for track in tracks:
        events.append({"ph": "M", "pid": pid[track], "tid": tid[track], "name": "thread_name", "args": {"name": track}})
        events.append(
            {
                "ph": "M",
                "pid": pid[track],
                "tid": tid[track],
                "name": "thread_sort_index",
                "args": {"sort_index": tid[track]},
            }
        )
    for span in trace.spans:
        events.append(
            {
                "name": f"{span.stage} #{span.item}",
                "cat": span.kind,
                "ph": "X",
                "ts": round(span.start_ms * 1e3, 3),
                "dur": round(max(span.end_ms - span.start_ms, 0.0) * 1e3, 3),
                "pid": pid[span.track],
                "tid": tid[span.track],
                "args": {
                    "item": span.item,
                    "lane": span.lane,
                    "stage": span.stage,
                    "kind": span.kind,
                    "failed": span.failed,
                },
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"label": trace.label, "items": trace.items, **{k: str(v) for k, v in trace.meta.items()}},
    }


def write_chrome_trace(trace: PipelineTrace, path: str | Path) -> Path:
    """Write :func:`to_chrome_trace` to ``path`` (parent folders are created) and return it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_chrome_trace(trace)))
    return out
