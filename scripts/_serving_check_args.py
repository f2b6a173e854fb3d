"""``scripts/gpu_serving_check.py``'s command line: its options, their parsers and their checks, apart so
that the script stays small and a CPU test can parse the runbook's next calls without running anything.

The scripts folder is not a package: the check imports this with ``scripts/`` on ``sys.path``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _serving_check_placement import engine_cpus_arg

DESCRIPTION = ("H200 check (issues 12 and 26): the server's front-end ceiling and ResNet fp16 plans served vs "
               "offline.")


TRANSPORTS: tuple[tuple[str, list[str]], ...] = (
    ("gRPC binary", []), ("gRPC + system shm", ["--shared-memory", "system"]),
    ("gRPC + CUDA shm", ["--shared-memory", "cuda"]))
"""The served variants: label and ``streamrt perf`` options."""


DIRECT_ENV = "STREAMRT_DIRECT_HOST_COPIES"
"""The engine process's switch for copies straight from page-locked arenas and shared-memory regions
(:func:`streamrt.device.staging.rows_to_device`); ``--direct-copies both`` measures the host transports with it
off and on in the same run."""


def env_variants(text: str) -> list[dict[str, str]]:
    """``--env-variants``: variants separated by ``;``, each ``NAME=VALUE`` assignments separated by ``,``.

    >>> env_variants("STREAMRT_STAGING_THREADS=off;STREAMRT_STAGING_THREADS=0,STREAMRT_BLOCKING_SYNC=1")
    [{'STREAMRT_STAGING_THREADS': 'off'}, {'STREAMRT_STAGING_THREADS': '0', 'STREAMRT_BLOCKING_SYNC': '1'}]
    """
    variants = []
    for variant in filter(None, (v.strip() for v in text.split(";"))):
        pairs = [a.strip().partition("=") for a in variant.split(",") if a.strip()]
        if any(not name or not eq for name, eq, _ in pairs):
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE[,NAME=VALUE...] per variant, got {variant!r}")
        variants.append({name: value for name, _, value in pairs})
    return variants


def client_variants(text: str) -> list[list[str]]:
    """``--client-variants``: variants separated by ``;``, each ``streamrt perf`` options separated by ``,``.

    >>> client_variants("--grpc-channel-share=0;--grpc-channel-share=6,--processes=4")
    [['--grpc-channel-share=0'], ['--grpc-channel-share=6', '--processes=4']]
    """
    variants = [[a.strip() for a in v.split(",") if a.strip()] for v in text.split(";") if v.strip()]
    if any(not a.startswith("--") for v in variants for a in v):
        raise argparse.ArgumentTypeError(f"expected perf options such as --grpc-channel-share=0, got {text!r}")
    return variants


TRANSPORT_KEYS = {"binary": "gRPC binary", "system": "gRPC + system shm", "cuda": "gRPC + CUDA shm"}
"""``--transports`` names: the served variants of :data:`TRANSPORTS` to run."""


def transports_arg(text: str) -> tuple[tuple[str, list[str]], ...]:
    """``--transports binary,system,cuda``: a subset of :data:`TRANSPORTS`, in its order."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in TRANSPORT_KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"--transports takes {','.join(TRANSPORT_KEYS)}, got {text!r}")
    labels = {TRANSPORT_KEYS[k] for k in keys}
    return tuple(t for t in TRANSPORTS if t[0] in labels)


CLIENTS = ("streamrt", "perf_analyzer")
"""``--clients`` names: ``streamrt perf`` and NVIDIA's perf_analyzer."""


def clients_arg(text: str) -> tuple[str, ...]:
    """``--clients streamrt,perf_analyzer``: the load generators, in the order given."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or any(n not in CLIENTS for n in names):
        raise argparse.ArgumentTypeError(f"--clients takes {','.join(CLIENTS)}, got {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked and completed (nothing created): the runbook's commands are parsed by a CPU
    test with this, so a GPU call cannot die on its own arguments."""
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the smoke run (a tiny conv net instead of the ResNets; no CUDA shm)")
    parser.add_argument("--quick", action="store_true", help="one request size per protocol, short warm-ups")
    parser.add_argument("--plans", type=Path, default=None, help="folder with prebuilt resnet50.plan / resnet18.plan")
    parser.add_argument("--models", default=None,
                        help="in order; later ones skipped past the budget (default resnet50,resnet18; CPU: tiny)")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="start no further model after this many seconds (keeps the call under 9 minutes)")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--server-max-batch", type=int, default=None, metavar="N",
                        help="the served model's max_batch_size (default --max-batch, the plan's): a lower cap "
                             "shortens the longest batch, the lever under a latency bound")
    parser.add_argument("--queue-delay-us", type=int, default=500, help="dynamic batching's max queue delay")
    parser.add_argument("--preferred-batch-sizes", default=None, metavar="N[,N...]",
                        type=lambda text: [int(n) for n in text.split(",") if n.strip()],
                        help="dynamic batching's preferred_batch_size (default none)")
    parser.add_argument("--request-batch", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--processes", type=int, default=8, help="client processes sharing the concurrency")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--skip-frontend", action="store_true", help="skip the null-model ceiling (a)")
    parser.add_argument("--grpc-server", choices=("grpcio", "h2corn"), default="grpcio",
                        help="`streamrt serve --grpc-server` of every server started (h2corn: carry its wheel)")
    parser.add_argument("--http-server", choices=("aiohttp", "h2corn"), default="aiohttp",
                        help="`streamrt serve --http-server` of every server started (h2corn: HTTP/1.1 parsed in Rust, "
                        "the infer route over ASGI; 64 B requests at ~2/3 of aiohttp's server CPU on the CPU machine)")
    parser.add_argument("--frontend-processes", default="1", type=lambda text: [int(n) for n in text.split(",")],
                        help="comma list of `streamrt serve --frontend-processes` counts: (a) runs once per count, "
                        "(b) with the largest (default 1: the front ends in the engine process)")
    parser.add_argument("--null-spinning", choices=("default", "off"), default="off",
                        help="part (a)'s null models: --option spinning=false (the default since 2026-12-07: the "
                             "ceiling measures the front end, and spinning pool threads took the front ends' cores: "
                             "H100 4.8 MB gRPC 3.32 -> 7.43 GB/s, docs/benchmarks/2026-12-07-s11.md), or 'default' "
                             "for ONNX Runtime's own spinning pool threads")
    parser.add_argument("--engine-cpus", type=engine_cpus_arg, default=[None], metavar="none|LIST[;...]",
                        help="every part once per placement: 'none' (the kernel's), or a CPU list (e.g. 0-1) for "
                             "the engine process (`streamrt serve --engine-cpus`) with the front ends and clients on "
                             "the other CPUs (default none); the targets take each transport's best placement")
    parser.add_argument("--direct-copies", choices=("off", "on", "both"), default="on",
                        help=f"the engine process's {DIRECT_ENV} (copies straight from page-locked arenas and "
                             "shared-memory regions; on by default); both: the server's rows with it on, then "
                             "the host transports again with it off")
    parser.add_argument("--transports", type=transports_arg, default=TRANSPORTS, metavar="binary,system,cuda",
                        help="the served transports of (b) and (c) (default all three)")
    parser.add_argument("--client-variants", type=client_variants, default=[], metavar="--OPT=V[,--OPT=V][;...]",
                        help="after (b), its rows again on the same server with these `streamrt perf` options "
                             "added, a row each (e.g. --client-variants=--grpc-channel-share=0;--grpc-channel-share=6: "
                             "with '=', as the value starts with --)")
    parser.add_argument("--env-variants", type=env_variants, default=[], metavar="NAME=V[,NAME=V][;...]",
                        help="after part (b), the two host transports again from a server with each variant's "
                        "environment (e.g. 'STREAMRT_STAGING_THREADS=off;STREAMRT_BLOCKING_SYNC=1'), a row each")
    parser.add_argument("--clients", type=clients_arg, default=("streamrt",), metavar="streamrt,perf_analyzer",
                        help="the load generators: every row of (a), (b) and (c) once per client (default "
                             "streamrt: `streamrt perf`; perf_analyzer: NVIDIA's C++ one, from "
                             "scripts/setup_perf_analyzer.sh); a target takes a transport's best over clients")
    parser.add_argument("--perf-analyzer", default=None, metavar="PATH",
                        help="perf_analyzer's path (default $STREAMRT_PERF_ANALYZER, else "
                             "build/perf_analyzer/perf_analyzer)")
    parser.add_argument("--latency-bound-ms", type=float, default=15.0,
                        help="(c): each transport's best images/s with p99 within this, for the first model "
                        "(default 15, MLPerf's Server bound for ResNet-50; 0 skips (c))")
    parser.add_argument("--bound-range", default="4:256:2", metavar="START:END[:STEP]",
                        help="concurrency range of the search in (c), STEP its precision (default 4:256:2: requests "
                        "of 8 images are far under 15 ms below 4)")
    parser.add_argument("--bound-seconds", type=float, default=3.0, help="measurement window per level in (c)")
    args = parser.parse_args(argv)
    args.precision = "fp16" if args.device == "cuda" else "fp32"
    args.server_max_batch = args.server_max_batch or args.max_batch
    if not 1 <= args.server_max_batch <= args.max_batch:
        parser.error(f"--server-max-batch must be within 1..--max-batch ({args.max_batch}), "
                     f"got {args.server_max_batch}")
    if any(not 1 <= n <= args.server_max_batch for n in args.preferred_batch_sizes or []):
        parser.error(f"--preferred-batch-sizes must be within 1..{args.server_max_batch}")
    if args.models is None:
        args.models = "resnet50,resnet18" if args.device == "cuda" else "tiny"
    return args
