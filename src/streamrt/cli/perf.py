"""``streamrt perf``: perf_analyzer-style load against any KServe v2 server (HTTP or gRPC).

Sweeps concurrency levels and prints throughput, client latency p50/p90/p95/p99 and the server's
own time split (queue, compute input/infer/output, from the statistics extension). Load can come
from several processes (``--processes``) and through shared memory (``--shared-memory``); the
report says when the client itself was busy enough to be the limit.

``--latency-bound-ms X`` searches instead of sweeping (perf_analyzer's ``--latency-threshold``, with
its ``--binary-search`` after the first level over): the highest throughput whose ``--percentile``
(p99 by default) stays within X ms, over ``--concurrency-range START[:END[:STEP]]``
(:mod:`streamrt.client.search`). See ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from streamrt.cli.args import add_alias
from streamrt.errors import ConfigError, StreamRTError
from streamrt.types import parse_shape

if TYPE_CHECKING:
    from streamrt.client.loadgen import LevelResult, LoadConfig

__all__ = ["parse_concurrency", "parse_search_range", "register", "run"]


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"8"`` / ``"1,8,64"`` / perf_analyzer's ``"start:end:step"`` (additive step) -> levels."""
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            start, end = parts[0], parts[1] if len(parts) > 1 else parts[0]
            step = parts[2] if len(parts) > 2 else 1
            if step < 1 or end < start:
                raise ValueError
            levels = tuple(range(start, end + 1, step))
        else:
            levels = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ConfigError(f"bad concurrency {text!r}: use N, N,M,... or start:end:step") from None
    if not levels or min(levels) < 1:
        raise ConfigError(f"concurrency levels must be >= 1, got {text!r}")
    return levels


def parse_search_range(text: str) -> tuple[int, int, int]:
    """``--concurrency-range`` for the latency-bound search: ``"N"`` / ``"START:END"`` / ``"START:END:STEP"``
    -> (start, end, step); a lone N searches from N up to DEFAULT_MAX_CONCURRENCY (1024), step 1."""
    from streamrt.client.search import DEFAULT_MAX_CONCURRENCY

    try:
        parts = [int(p) for p in text.split(":")]
        if "," in text or len(parts) > 3:
            raise ValueError
    except ValueError:
        raise ConfigError(f"bad concurrency range {text!r} for --latency-bound-ms: use START, START:END or "
                          "START:END:STEP (the search picks the levels in between)") from None
    start = parts[0]
    end = parts[1] if len(parts) > 1 else max(start, DEFAULT_MAX_CONCURRENCY)
    step = parts[2] if len(parts) > 2 else 1
    if start < 1 or end < start or step < 1:
        raise ConfigError(f"bad concurrency range {text!r}: needs 1 <= START <= END and STEP >= 1")
    return start, end, step


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "perf",
        help="load-test a KServe v2 / Triton server like perf_analyzer (throughput, latency percentiles)",
        description="Send requests from N concurrent clients to a KServe v2 server (StreamRT, Triton, ...) "
        "and report throughput, client latency percentiles and the server's time split.",
    )
    parser.add_argument("-m", "--model", required=True, help="model name")
    parser.add_argument("-x", "--model-version", default="", help="model version (default: the server's)")
    parser.add_argument("-u", "--url", default=None, help="host:port (default 127.0.0.1:8000, gRPC :8001)")
    parser.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http", help="protocol (default http)")
    parser.add_argument("--concurrency-range", default="1", metavar="RANGE",
                        help="N, N,M,... or start:end:step (default 1)")
    parser.add_argument("-b", "--batch-size", type=int, default=1, help="rows per request (default 1)")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                        help="dims without batch for an input with dynamic dims, e.g. x:3x224x224")
    parser.add_argument("--input-data", choices=["random", "zero"], default="random")
    parser.add_argument("--input-tensor-format", choices=["binary", "json"], default="binary",
                        help="HTTP tensor encoding (default binary)")
    parser.add_argument("--measurement-interval", type=float, default=5000.0, metavar="MS",
                        help="measurement window per level (default 5000 ms)")
    warmup = parser.add_argument("--warmup-ms", type=float, default=1000.0, metavar="MS",
                                 help="warm-up per level in milliseconds (default 1000)")
    add_alias(parser, "--warmup", warmup, note=True)
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="client processes sharing each concurrency level, one merged report (default 1); "
                        "one Python process tops out near a few thousand small requests/s")
    parser.add_argument("--grpc-channel-share", type=int, default=None, metavar="N",
                        help="gRPC: concurrent requests per channel, each channel its own connection (6: "
                        "tritonclient's C++ library's rule; default 0: one channel per process). Front-end "
                        "processes sharing a port get connections, not requests: few connections spread "
                        "unevenly over them")
    parser.add_argument("--shared-memory", choices=["none", "system", "cuda"], default="none",
                        help="put inputs and outputs in registered shared-memory regions, like perf_analyzer "
                        "(local servers only; default none)")
    parser.add_argument("--output-shared-memory-size", type=int, default=102400, metavar="BYTES",
                        help="bytes per output region when the output size is not static (default 102400)")
    parser.add_argument("--latency-bound-ms", type=float, default=None, metavar="MS",
                        help="search for the highest throughput whose --percentile latency stays within MS: "
                        "doubles the concurrency from the range's start, then bisects between the last level "
                        "under and the first over (like perf_analyzer's --latency-threshold and --binary-search)")
    parser.add_argument("--percentile", type=int, choices=[50, 90, 95, 99], default=None,
                        help="the latency percentile --latency-bound-ms bounds (default 99)")
    parser.add_argument("--token", default=None,
                        help="bearer token (default: $STREAMRT_SERVE_TOKEN when set)")
    output = parser.add_argument("-o", "--output", "-f", type=Path, default=None, metavar="FILE.csv",
                                 help="write perf_analyzer-style CSV here (-f: perf_analyzer's spelling)")
    add_alias(parser, "--csv", output)
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--profile-export-file", type=Path, default=None, metavar="FILE.json",
                        help="write every measured request's id, send and answer times here (perf_analyzer's "
                             "flag); each request then carries an id of its own, so the server's request trace "
                             "(streamrt serve --trace-file, tritonserver --trace-config) can be joined with it "
                             "(benchmarks/latency_split.py)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streamrt.cli.common import check_output
    from streamrt.client.loadgen import LoadConfig, format_results, run_load
    from streamrt.client.search import LatencyBound, run_search

    if args.output:  # before minutes of load, as build checks -o
        check_output(args.output, example="perf.csv")
    if args.profile_export_file:
        check_output(args.profile_export_file, example="requests.json")
    bound = None
    if args.latency_bound_ms is not None:
        start, end, step = parse_search_range(args.concurrency_range)
        bound = LatencyBound(args.latency_bound_ms, args.percentile or 99, start, end, step)
    elif args.percentile is not None:
        raise ConfigError("--percentile sets the percentile of --latency-bound-ms",
                          hint="add --latency-bound-ms MS, or leave --percentile out (the table shows p50 to p99)")
    shapes = {}
    for item in args.shape:
        name, sep, dims = item.partition(":")
        if not sep:
            raise ConfigError(f"bad --shape {item!r}: expected NAME:DIMS such as x:3x224x224")
        shapes[name] = parse_shape(dims)
    token = args.token or os.environ.get("STREAMRT_SERVE_TOKEN")
    cfg = LoadConfig(
        url=args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001"),
        model=args.model,
        version=args.model_version,
        protocol=args.protocol,
        concurrency=(bound.start,) if bound else parse_concurrency(args.concurrency_range),
        batch_size=args.batch_size,
        shapes=shapes,
        data=args.input_data,
        binary=args.input_tensor_format == "binary",
        duration_s=args.measurement_interval / 1e3,
        warmup_s=args.warmup_ms / 1e3,
        headers={"authorization": f"Bearer {token}"} if token else {},
        processes=args.processes,
        shared_memory=args.shared_memory,
        output_shared_memory_size=args.output_shared_memory_size,
        request_ids=args.profile_export_file is not None,
        **({} if args.grpc_channel_share is None else {"grpc_channel_share": args.grpc_channel_share}),
    )
    found = run_search(cfg, bound) if bound else None
    results = found.levels if found else run_load(cfg)
    marks = found.marks() if found else None
    # A search's higher levels may fail (a full queue): they are over the bound. Only a refused first level
    # (or any refused level of a sweep) means the requests themselves are wrong.
    refused = next((r for r in results[: 1 if found else None] if not r.requests and r.errors), None)
    if refused is not None:  # no latencies to report: say why instead of a table of nan and a CSV of zeros
        raise StreamRTError(
            f"the server refused every request at concurrency {refused.concurrency} (all {refused.errors} "
            f"failed); the first error: {refused.first_error}",
            hint="fix what the error names (e.g. -b/--batch-size within the model's max_batch_size, --shape)")
    if args.output:
        _write_csv(args.output, results, marks)
    if args.profile_export_file:
        _write_profile_export(args.profile_export_file, cfg, results)
    if args.json:
        print(json.dumps(found.to_json() if found else [r.to_json() for r in results], indent=2))
    else:
        print(format_results(results, marks))
        if found and found.best:
            print(found.summary())
            if found.reached_end:
                print(f"note: concurrency {found.bound.end}, the range's end, was still under the bound: "
                      f"give a higher END (--concurrency-range {found.bound.start}:END) to look further")
    if found:
        if found.best is None:  # the table and the files are written: then one line and perf's failure status
            raise StreamRTError(found.summary(), hint=f"raise --latency-bound-ms, or lower the load per request "
                                f"(-b/--batch-size) or the range's start ({found.bound.start})")
        return 0
    return 0 if all(r.requests for r in results) else 1


def _write_profile_export(path: Path, cfg: LoadConfig, results: list[LevelResult]) -> None:
    """Every measured request of every level: perf_analyzer's profile export layout (``experiments``, each with
    its ``requests``' ``timestamp`` and ``response_timestamps``), plus each request's id; times are
    ``time.perf_counter_ns`` (CLOCK_MONOTONIC), the clock of StreamRT's and Triton's trace timestamps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    experiments = [{"experiment": {"mode": "concurrency", "value": r.concurrency},
                    "requests": [{"request_id": rid, "timestamp": sent, "response_timestamps": [done]}
                                 for rid, sent, done in r.request_log]} for r in results]
    document = {"version": 1, "service_kind": "kserve-v2", "protocol": cfg.protocol, "endpoint": cfg.url,
                "model": cfg.model, "clock": "CLOCK_MONOTONIC ns (time.perf_counter_ns)", "experiments": experiments}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    tmp.replace(path)


def _write_csv(path: Path, results: list[LevelResult], marks: list[str] | None) -> None:
    """perf_analyzer's CSV (rows by throughput, latencies in µs); a search adds its ``Latency Bound`` verdict."""
    path.parent.mkdir(parents=True, exist_ok=True)  # as build -o does
    verdicts = dict(zip(map(id, results), marks, strict=True)) if marks is not None else {}
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Concurrency", "Inferences/Second", "Server Queue", "Server Compute Input",
                         "Server Compute Infer", "Server Compute Output", "p50 latency", "p90 latency",
                         "p95 latency", "p99 latency", *(["Latency Bound"] if marks is not None else [])])
        for r in sorted(results, key=lambda r: r.throughput):
            lat = r.latency_ms
            us = [int(v * 1e3) for v in (lat.median, lat.p90, lat.p95, lat.p99)] if lat else [0] * 4
            s = r.server_us
            writer.writerow([r.concurrency, f"{r.throughput:.2f}",
                             *(int(s.get(k, 0)) for k in ("queue", "compute_input", "compute_infer",
                                                          "compute_output")), *us,
                             *([verdicts[id(r)]] if marks is not None else [])])
