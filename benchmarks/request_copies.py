"""Where a binary gRPC request's tensor bytes are copied between the socket and the engine, and back.

A real ``streamrt serve`` (one process, or ``--frontend-processes N``) serves an ONNX Runtime CPU
``Identity`` model (so the output is as large as the input); tritonclient sends requests one at a
time (``raw_input_contents``) and checks each answer. Probes installed in every server process (a
``sitecustomize`` on the server's ``PYTHONPATH``; the front-end workers inherit it) wrap the steps a
tensor crosses and record, for each, how many tensor bytes it copied:

* ``grpcio: message -> bytes`` / ``grpcio: bytes -> send buffer``: the request ``bytes`` grpcio hands
  to ``ModelInfer`` and the response ``bytes`` it is given back (grpcio copies both: its Python API
  takes and gives ``bytes`` only);
* ``parse: raw_input_contents -> numpy``: input arrays that are not views of the request bytes;
* ``arena write (inputs / outputs)``, ``channel inline``: front-end tensors copied into the shared
  arena or into the channel message (with the pickled frame bytes counted separately);
* ``batch gather``: the instance's batch input that is not the request's own memory;
* ``unattributed``: an array that reaches the instance or the serialiser in memory none of the
  steps above produced (a copy made somewhere no probe looks);
* ``response: outputs -> message bytes``: the serialised response's copy of each output.

Provenance is checked by address: each probe records the buffers it produced (request bytes, the
arena mappings, the engine's outputs), and an array is a view when its memory lies inside one.

Usage (from the repository root)::

    python benchmarks/request_copies.py [--requests 5] [--frontends 1,2] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamrt.profiling.provenance import git_commit
from streamrt.testing.server_process import stop

ROOT = Path(__file__).resolve().parents[1]
PROBE_ENV = "STREAMRT_COPY_PROBE_DIR"
SIZES = {"64 B": (1, 16), "4.8 MB": (8, 3, 224, 224)}
STAGES = (
    "grpcio: message -> bytes",
    "parse: raw_input_contents -> numpy",
    "arena write (inputs)",
    "batch gather",
    "unattributed (before the engine)",
    "arena write (outputs)",
    "channel inline (outputs)",
    "unattributed (after the engine)",
    "response: outputs -> message bytes",
    "grpcio: bytes -> send buffer",
)


# --- the probes (run inside the server's processes) -------------------------------------------------


class _Probe:
    """Records copies to ``<dir>/<pid>.jsonl`` and the address ranges of the buffers it has seen."""

    def __init__(self, folder: str) -> None:
        self.file = open(Path(folder) / f"{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115 - process lifetime
        self.known: list[tuple[int, int]] = []  # [start, end) of buffers whose views are not copies

    def copy(self, stage: str, nbytes: int) -> None:
        if nbytes:
            self.file.write(json.dumps({"stage": stage, "bytes": int(nbytes)}) + "\n")

    def frame(self, nbytes: int) -> None:
        self.file.write(json.dumps({"stage": "channel frames (pickled, both ways)", "bytes": int(nbytes)}) + "\n")

    def start(self, *buffers: Any) -> None:
        """A new request: forget the old buffers (their memory may be reused by new copies)."""
        self.known = []
        for buffer in buffers:
            self.know(buffer)

    def know(self, buffer: Any) -> None:
        start, size = _range(buffer)
        if size:
            self.known.append((start, start + size))

    def inside(self, array: Any) -> bool:
        start, size = _range(array)
        return not size or any(a <= start and start + size <= b for a, b in self.known)


def _range(buffer: Any) -> tuple[int, int]:
    import numpy as np

    if isinstance(buffer, (bytes, bytearray, memoryview)):
        buffer = np.frombuffer(buffer, np.uint8)
    if not isinstance(buffer, np.ndarray) or buffer.dtype.hasobject:
        return 0, 0
    return int(buffer.__array_interface__["data"][0]), int(buffer.nbytes)


def install_probes(folder: str) -> None:
    """Wrap the steps of the request path in this process (called by the server's ``sitecustomize``)."""
    import numpy as np

    from streamrt.device import staging
    from streamrt.serve.execution import instances
    from streamrt.serve.listeners import grpc_service
    from streamrt.serve.listeners.frontends import channel, supervisor, tensors

    probe = _Probe(folder)

    infer = grpc_service.InferenceRpcs._infer

    async def _infer(self: Any, data: bytes, traceparent: str | None) -> bytes:
        probe.copy("grpcio: message -> bytes", len(data))
        arena = getattr(self.port, "arena", None)  # a front-end worker's
        probe.start(data, *(() if arena is None else (arena.array,)))
        answer = await infer(self, data, traceparent)
        probe.copy("grpcio: bytes -> send buffer", len(answer))
        return answer

    grpc_service.InferenceRpcs._infer = _infer  # type: ignore[method-assign]

    parse = grpc_service.parse_infer_request

    def parse_infer_request(data: bytes, *args: Any, **kwargs: Any) -> Any:
        request = parse(data, *args, **kwargs)
        for array in request.inputs.values():
            if isinstance(array, np.ndarray) and not probe.inside(array):
                probe.copy("parse: raw_input_contents -> numpy", array.nbytes)
                probe.know(array)
        return request

    grpc_service.parse_infer_request = parse_infer_request

    serialize = grpc_service.serialize_grpc_response

    def serialize_grpc_response(response: Any) -> bytes:
        for name, array in response.outputs.items():
            if name not in response.in_shared_memory and not probe.inside(np.asarray(array)):
                probe.copy("unattributed (after the engine)", np.asarray(array).nbytes)
        data = serialize(response)
        probe.copy("response: outputs -> message bytes",
                   sum(np.asarray(a).nbytes for n, a in response.outputs.items() if n not in response.in_shared_memory))
        return data

    grpc_service.serialize_grpc_response = serialize_grpc_response

    place = tensors._place

    def _place(array: Any, arena: Any, blocks: Any, taken: list[int]) -> Any:
        where = place(array, arena, blocks, taken)
        if arena.offset_of(array) is None:
            half = "inputs" if blocks is arena.inputs else "outputs"
            probe.copy(f"arena write ({half})" if where[0] == "a" else f"channel inline ({half})", array.nbytes)
        return where

    tensors._place = _place

    pack_outputs = tensors.pack_outputs

    def _pack_outputs(response: Any, arena: Any, taken: list[int]) -> Any:
        outputs, in_memory = pack_outputs(response, arena, taken)
        for name, _, _, where in outputs:
            if where[0] == "b" and np.asarray(response.outputs[name]).nbytes <= tensors.INLINE_OUTPUT_BYTES:
                probe.copy("channel inline (outputs)", len(where[1]))
        return outputs, in_memory

    supervisor.pack_outputs = _pack_outputs

    unpack = tensors.unpack_request

    def unpack_request(message: Any, arena: Any, registry: Any) -> Any:
        probe.start(arena.array)  # the engine process's side of a front-end request
        return unpack(message, arena, registry)

    supervisor.unpack_request = unpack_request

    unpack_outputs = tensors.unpack_outputs

    def _unpack_outputs(message: Any, arena: Any) -> Any:
        response = unpack_outputs(message, arena)
        for array in response.outputs.values():
            probe.know(array)  # inline outputs: the pickle's bytes (counted as channel frames)
        return response

    tensors.unpack_outputs = _unpack_outputs  # the worker runs as __main__ and imports it after this

    send = channel.FrameWriter.send

    def _send(self: Any, message: tuple[Any, ...]) -> None:
        send(self, message)
        probe.frame(len(self._parts[-1]))

    channel.FrameWriter.send = _send  # type: ignore[method-assign]

    slot_gather = staging.HostSlots.gather

    def _slot_gather(self: Any, name: str, arrays: Any, *more: Any) -> Any:
        batch = slot_gather(self, name, arrays, *more)
        probe.copy("batch gather", batch.array.nbytes)
        probe.know(batch.array)
        return batch

    staging.HostSlots.gather = _slot_gather  # type: ignore[method-assign]

    gather = instances.Instance._gather

    def _gather(self: Any, requests: Any, *more: Any) -> Any:
        for request in requests:
            for array in request.values():
                if isinstance(array, np.ndarray) and not probe.inside(array):
                    probe.copy("unattributed (before the engine)", array.nbytes)
                    probe.know(array)
        gathered = gather(self, requests, *more)
        for name, value in gathered.items():
            if isinstance(value, np.ndarray):
                if not probe.inside(value):
                    probe.copy("batch gather", value.nbytes)
            else:  # a CUDA batch: the DMA of its rows (a host copy first only when it went through a slot)
                probe.copy("host -> device (DMA, not a CPU copy)", sum(np.asarray(r[name]).nbytes for r in requests))
        return gathered

    instances.Instance._gather = _gather  # type: ignore[method-assign]

    run = instances.Instance._infer

    def _run(self: Any, inputs: Any, *more: Any) -> Any:
        outputs = run(self, inputs, *more)
        for array in outputs.values():
            probe.know(array)
        return outputs

    instances.Instance._infer = _run  # type: ignore[method-assign]

    to_host = instances.to_host

    def _to_host(value: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(value, np.ndarray) and value.is_cuda:
            probe.copy("device -> host (DMA, not a CPU copy)", value.nbytes)
        return to_host(value, *args, **kwargs)

    instances.to_host = _to_host


SITECUSTOMIZE = f"""import os, sys
if os.environ.get({PROBE_ENV!r}):
    sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
    import request_copies
    request_copies.install_probes(os.environ[{PROBE_ENV!r}])
"""


# --- the driver -------------------------------------------------------------------------------------


def write_repository(repo: Path, device: str = "cpu") -> Path:
    """``echo_small`` ([-1, 16] fp32) and ``echo_image`` ([-1, 3, 224, 224] fp32): ONNX ``Identity``, served
    by ONNX Runtime on the CPU, or (``device="cuda"``) built with torch_inductor for two CUDA instances."""
    import onnx
    from onnx import TensorProto, helper

    for name, item in (("echo_small", (16,)), ("echo_image", (3, 224, 224))):
        dims: list[Any] = ["n", *item]
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        kind = "KIND_CPU"
        if device == "cuda":
            import streamrt
            from streamrt.types import ShapeProfile, ShapeRange

            source = repo / name / "1" / "model.onnx"
            profile = ShapeProfile({"x": ShapeRange((1, *item), (8, *item), (8, *item))})
            streamrt.build(source, streamrt.BuildConfig(backend="torch_inductor", profiles=(profile,)),
                           repo / name / "1" / "model.plan", cache_dir=repo.parent / "cache")
            source.replace(repo.parent / f"{name}.onnx")
            kind = "KIND_GPU"
        (repo / name / "config.yaml").write_text(json.dumps({
            "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 100},
            "instance_group": [{"count": 1, "kind": kind}]}))
    return repo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records(folder: Path) -> dict[Path, list[dict[str, Any]]]:
    """Each process's records so far (a process's file grows while the others do too)."""
    return {path: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in sorted(folder.glob("*.jsonl"))}


def measure(frontends: int, requests: int, work: Path, device: str = "cpu",
            server_src: Path | None = None) -> dict[str, dict[str, float]]:
    """``{size: {stage: bytes copied per request}}`` through a server with ``frontends`` front-end processes."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    probes = work / f"probes-{frontends}"
    probes.mkdir(parents=True)
    (work / "site").mkdir(exist_ok=True)
    (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    repo = work / "repo"
    if not repo.exists():
        write_repository(repo, device)
    http, grpc = _free_port(), _free_port()
    env = {**os.environ, PROBE_ENV: str(probes), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(work / "site"), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    extra = ["--frontend-processes", str(frontends)] if frontends > 1 else []
    if server_src is not None:  # another tree's server (an older commit's src/), the same probes and client
        env["PYTHONPATH"] = os.pathsep.join([str(work / "site"), str(server_src.resolve()),
                                             os.environ.get("PYTHONPATH", "")])
    log = open(work / f"server-{frontends}.log", "wb")  # noqa: SIM115 - closed after the server stops
    server = subprocess.Popen(
        [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http), "--grpc-port",
         str(grpc), "--metrics-port", "-1", "--log-level", "WARNING", *extra],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    result: dict[str, dict[str, float]] = {}
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        deadline = time.monotonic() + 600
        while True:
            with contextlib.suppress(Exception):
                if client.is_model_ready("echo_small") and client.is_model_ready("echo_image"):
                    break
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"server not ready (exit {server.poll()}); see {log.name}")
            time.sleep(0.3)
        rng = np.random.default_rng()
        for size, shape in SIZES.items():
            model = "echo_small" if len(shape) == 2 else "echo_image"
            for index in range(requests + 2):
                if index == 2:  # two warm-up requests (slots, arenas' first pages)
                    before = _records(probes)
                x = rng.standard_normal(shape, dtype=np.float32)
                tensor = grpcclient.InferInput("x", list(shape), "FP32")
                tensor.set_data_from_numpy(x)
                answer = client.infer(model, [tensor]).as_numpy("y")
                if not np.array_equal(answer, x):
                    raise SystemExit(f"{model}: the answer is not the request")
            totals: collections.Counter[str] = collections.Counter()
            for path, lines in _records(probes).items():
                for record in lines[len(before.get(path, ())):]:
                    totals[record["stage"]] += record["bytes"]
            result[size] = {stage: total / requests for stage, total in totals.items()}
        client.close()
    finally:
        stop(server)
        log.close()
    return result


def table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    """Markdown: one row per stage, one column per (front ends, size), bytes copied per request."""
    columns = [(f, s) for f in results for s in SIZES]
    head = " | ".join(f"{'1 process' if f == 1 else f'{f} front ends'}, {s}" for f, s in columns)
    lines = [f"| copy (bytes per request) | {head} |", "|---" + "|---:" * len(columns) + "|"]
    stages = [*STAGES, *sorted({k for r in results.values() for v in r.values() for k in v} - set(STAGES))]
    for stage in stages:
        values = [results[f][s].get(stage, 0) for f, s in columns]
        lines.append(f"| {stage} | " + " | ".join(f"{v:,.0f}" for v in values) + " |")
    not_cpu = ("channel frames", "host -> device", "device -> host")
    sums = [sum(v for k, v in results[f][s].items() if not k.startswith(not_cpu)) for f, s in columns]
    lines.append("| **tensor bytes copied by the CPU** | " + " | ".join(f"**{v:,.0f}**" for v in sums) + " |")
    tensor = [4 * math.prod(SIZES[s]) for _, s in columns]
    lines.append("| copies of the tensor (in + out) | "
                 + " | ".join(f"{v / t:.2f}" for v, t in zip(sums, tensor, strict=True)) + " |")
    return "\n".join(lines)


def _gpu(device: str) -> str:
    if device != "cuda":
        return ""
    import torch

    return f", {torch.cuda.get_device_name(0)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5, help="measured requests per size (after 2 warm-ups)")
    parser.add_argument("--frontends", default="1,2", help="front-end process counts to measure, comma-separated")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="serve the echo models with ONNX Runtime on the CPU or torch_inductor on CUDA")
    parser.add_argument("--server-src", type=Path, default=None,
                        help="run the server from this source tree (an older commit's src/, for a before row)")
    parser.add_argument("--out", type=Path, default=None, help="append the table to this markdown file")
    parser.add_argument("--json", type=Path, default=None, help="write {frontends: {size: {stage: bytes}}} here")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="streamrt-copies-"))
    results = {int(f): measure(int(f), args.requests, work, args.device, args.server_src)
               for f in args.frontends.split(",")}
    text = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit(ROOT)}, "
            f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}{_gpu(args.device)}), "
            f"`python benchmarks/request_copies.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
            f"{table(results)}\n")
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    if args.out is not None:
        with args.out.open("a") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
