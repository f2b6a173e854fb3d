"""``streamrt perf``: perf_analyzer-style load against any KServe v2 server (HTTP or gRPC).

Sweeps concurrency levels and prints throughput, client latency p50/p90/p95/p99 and the server's
own time split (queue, compute input/infer/output, from the statistics extension). Load can come
from several processes (``--processes``) and through shared memory (``--shared-memory``); the
report says when the client itself was busy enough to be the limit.
See ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

from streamrt.cli.args import add_alias
from streamrt.errors import ConfigError, StreamRTError
from streamrt.types import parse_shape

__all__ = ["parse_concurrency", "register", "run"]


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
    parser.add_argument("--shared-memory", choices=["none", "system", "cuda"], default="none",
                        help="put inputs and outputs in registered shared-memory regions, like perf_analyzer "
                        "(local servers only; default none)")
    parser.add_argument("--output-shared-memory-size", type=int, default=102400, metavar="BYTES",
                        help="bytes per output region when the output size is not static (default 102400)")
    parser.add_argument("--token", default=None,
                        help="bearer token (default: $STREAMRT_SERVE_TOKEN when set)")
    output = parser.add_argument("-o", "--output", "-f", type=Path, default=None, metavar="FILE.csv",
                                 help="write perf_analyzer-style CSV here (-f: perf_analyzer's spelling)")
    add_alias(parser, "--csv", output)
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streamrt.cli.common import check_output
    from streamrt.client.loadgen import LoadConfig, format_results, run_load

    if args.output:  # before minutes of load, as build checks -o
        check_output(args.output, example="perf.csv")
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
        concurrency=parse_concurrency(args.concurrency_range),
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
    )
    results = run_load(cfg)
    refused = next((r for r in results if not r.requests and r.errors), None)
    if refused is not None:  # no latencies to report: say why instead of a table of nan and a CSV of zeros
        raise StreamRTError(
            f"the server refused every request at concurrency {refused.concurrency} (all {refused.errors} "
            f"failed); the first error: {refused.first_error}",
            hint="fix what the error names (e.g. -b/--batch-size within the model's max_batch_size, --shape)")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)  # as build -o does
        with open(args.output, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["Concurrency", "Inferences/Second", "Server Queue", "Server Compute Input",
                             "Server Compute Infer", "Server Compute Output", "p50 latency", "p90 latency",
                             "p95 latency", "p99 latency"])
            for r in sorted(results, key=lambda r: r.throughput):
                lat = r.latency_ms
                us = [int(v * 1e3) for v in (lat.median, lat.p90, lat.p95, lat.p99)] if lat else [0] * 4
                s = r.server_us
                writer.writerow([r.concurrency, f"{r.throughput:.2f}",
                                 *(int(s.get(k, 0)) for k in ("queue", "compute_input", "compute_infer",
                                                              "compute_output")), *us])
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(format_results(results))
    return 0 if all(r.requests for r in results) else 1
