"""Where a request's latency goes, client to server and back: the client's record of each request joined
with the server's trace of the same request, for any number of servers side by side.

Inputs per server (``--run LABEL:REQUESTS:TRACE``):

* REQUESTS: ``streamrt perf ... --profile-export-file REQUESTS`` (each request carries its own id; its send and
  answer times are ``time.perf_counter_ns``, CLOCK_MONOTONIC);
* TRACE: that server's request trace over the same run, on the same host: ``streamrt serve --trace-file TRACE``
  (JSON lines) or ``tritonserver --trace-config triton,file=TRACE --trace-config rate=1 --trace-config
  level=TIMESTAMPS`` (one JSON array of partial objects); both stamp with the same clock.

Per request, joined by id: **inbound** = client send -> the server has the request (client call, socket, the
server's transport and hand-over), **server** = that -> the response is being sent (queue, batch, run, response),
**outbound** = that -> the client has the answer (transport, client). The server's marks are the first of
:data:`ARRIVED` and of :data:`ANSWERING` its trace has: Triton's front-end stamps (GRPC_WAITREAD_END,
GRPC_SEND_START, or HTTP's), StreamRT's REQUEST_START (the request parsed) and REQUEST_END (the response ready
for the front end).

    python benchmarks/latency_split.py --run triton:t-req.json:t-trace.json --run streamrt:s-req.json:s-trace.jsonl \
        [--skip 0.2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

PARTS = ("inbound", "server", "outbound", "total")
ARRIVED = ("GRPC_WAITREAD_END", "HTTP_RECV_END", "REQUEST_START")
"""The first of these a trace has ends the inbound part: Triton's front ends stamp when they have read the request
(its REQUEST_START follows), StreamRT's REQUEST_START is when the request is parsed."""
ANSWERING = ("GRPC_SEND_START", "HTTP_SEND_START", "REQUEST_END")
"""The first of these a trace has starts the outbound part: Triton's REQUEST_END is when it releases the request,
which can be after the client has the answer; StreamRT's is when the response is ready for the front end."""


def client_requests(path: Path) -> dict[str, tuple[int, int]]:
    """request id -> (sent, answered) ns from a perf profile export (every level)."""
    document = json.loads(path.read_text())
    return {r["request_id"]: (int(r["timestamp"]), int(r["response_timestamps"][-1]))
            for experiment in document["experiments"] for r in experiment["requests"]}


def server_spans(path: Path) -> dict[str, tuple[int, int]]:
    """request id -> (REQUEST_START, REQUEST_END) ns from a StreamRT (JSON lines) or Triton (JSON array) trace."""
    text = path.read_text().strip()
    entries: list[dict[str, Any]] = json.loads(text) if text.startswith("[") else [
        json.loads(line) for line in text.splitlines() if line.strip()]
    ids: dict[Any, str] = {}
    stamps: dict[Any, dict[str, int]] = defaultdict(dict)
    for entry in entries:  # Triton writes an id's fields over several objects; StreamRT one object per request
        if entry.get("request_id"):
            ids[entry["id"]] = str(entry["request_id"])
        for stamp in entry.get("timestamps", []):
            stamps[entry["id"]].setdefault(stamp["name"], int(stamp["ns"]))
    spans = {}
    for key, v in stamps.items():
        start = next((v[n] for n in ARRIVED if n in v), None)
        end = next((v[n] for n in ANSWERING if n in v), None)
        if key in ids and start is not None and end is not None:
            spans[ids[key]] = (start, end)
    return spans


def split(requests: dict[str, tuple[int, int]], spans: dict[str, tuple[int, int]],
          skip: float = 0.0) -> dict[str, np.ndarray]:
    """Microseconds of each part for the requests found on both sides, in send order after the first ``skip``
    share (the start of a window, where clients and server are not yet in step)."""
    joined = sorted((sent, spans[rid][0], spans[rid][1], answered)
                    for rid, (sent, answered) in requests.items() if rid in spans)
    times = np.array(joined[int(len(joined) * skip):], dtype=np.int64).reshape(-1, 4)
    if not len(times):
        raise SystemExit("no request id is in both files: was perf run with --profile-export-file against the "
                         "server that wrote the trace (every request traced: rate 1)?")
    sent, start, end, answered = times.T
    return {"inbound": (start - sent) / 1e3, "server": (end - start) / 1e3, "outbound": (answered - end) / 1e3,
            "total": (answered - sent) / 1e3}


def table(rows: list[tuple[str, int, dict[str, np.ndarray]]]) -> str:
    lines = ["| server | requests joined | part | p50 us | mean us | p90 us |", "|---|---:|---|---:|---:|---:|"]
    for label, count, parts in rows:
        for name in PARTS:
            x = parts[name]
            lines.append(f"| {label} | {count:,} | {name} | {np.median(x):,.0f} | {x.mean():,.0f} | "
                         f"{np.percentile(x, 90):,.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL:REQUESTS:TRACE",
                        help="a server's perf profile export and its trace (repeat for each server)")
    parser.add_argument("--skip", type=float, default=0.2, help="share of each window's first requests left out")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for item in args.run:
        label, requests, trace = item.split(":", 2)
        parts = split(client_requests(Path(requests)), server_spans(Path(trace)), args.skip)
        rows.append((label, len(parts["total"]), parts))
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
