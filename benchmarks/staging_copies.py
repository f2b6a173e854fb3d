"""A server instance's input staging for large batches: one gather then one copy, against pieces on threads.

On the H200 (2026-12-05) ResNet-50 served over both host transports stopped at ~1,000 requests/s of 4.8 MB
(4.5-5.1 GB/s) while CUDA shared memory reached the engine: the batch's way from host memory to the device
binds. Each variant here stages the same batch the way an instance does (the requests' rows into the
instance's pinned slot, then to the device on the instance's stream):

* ``one copy``: ``HostSlots.gather`` (one ``np.concatenate``), then one host-to-device copy (the path before
  :mod:`streamrt.device.row_copier`; ``STREAMRT_STAGING_THREADS`` had no such switch then);
* ``pieces, T threads``: :func:`streamrt.device.staging.stage_to_device` with ``RowCopier(T)``: pieces of
  ``--piece-mib`` copied on the instance's thread and T helpers, each piece's host-to-device copy enqueued as
  it lands;
* ``DMA alone`` (CUDA only): the already gathered slot copied to the device, the bound of the overlap.

``--instances N`` stages from N threads at once (each an instance: its own slots and stream, the copier
shared as in the server), which is how a server with two GPU instances loads the host.

Timing: wall clock from the first request row touched to the batch complete where the engine reads it (on
CUDA after the instance's stream is synchronised: the host copies are host work, so CUDA events alone would
miss them), after warm-up, median over ``--runs``, rounds interleaved; the requests are random (4 rotating
batches), never zeros; every variant's result is checked against ``np.concatenate`` once per round.

Usage (from the repository root)::

    python benchmarks/staging_copies.py [--device cpu|cuda] [--threads 0,1,2,4] [--instances 1,2]
        [--requests 8] [--shape 8,3,224,224] [--runs 30] [--rounds 3] [--out docs/benchmarks/x.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.device import Device, HostSlots, get_device, stream_scope, to_device
from streamrt.device.row_copier import RowCopier
from streamrt.device.staging import stage_to_device
from streamrt.profiling.provenance import report_header

ROOT = Path(__file__).resolve().parents[1]
ROTATION = 4  # distinct random batches, so no run reads the previous one's rows from cache


def _stage_once(device: Device, slots: HostSlots, stream: Any, arrays: list[np.ndarray],
                copier: RowCopier | None) -> Any:
    """One batch staged as the instance does it; returns what the engine would read (synchronised)."""
    with stream_scope(stream):  # no copier: one gather, then one copy (the path before pieces)
        out = stage_to_device(slots, "x", arrays, device, stream, copier)
    stream.synchronize()
    return out


def _host(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.cpu().numpy()


class Lane:
    """One instance: its slots and stream, and its own rotating random batches."""

    def __init__(self, device: Device, index: int, requests: int, shape: tuple[int, ...], seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.device = device
        self.batches = [[rng.standard_normal(shape, dtype=np.float32) for _ in range(requests)]
                        for _ in range(ROTATION)]
        self.slots = HostSlots(device, requests * shape[0])
        self.stream = device.stream(f"lane{index}")

    def run(self, copier: RowCopier | None, runs: int, times: list[float], check: bool, dma_only: bool = False) -> None:
        """Stage ``runs`` batches, appending each one's seconds to ``times``; ``dma_only``: the copy of an already
        gathered slot to the device alone (the bound the pieces' overlap aims at)."""
        gathered = self.slots.gather("x", self.batches[0]) if dma_only else None
        for i in range(runs):
            arrays = self.batches[0 if dma_only else i % ROTATION]
            start = time.perf_counter()
            if gathered is not None:
                with stream_scope(self.stream):
                    out = to_device(gathered, self.device, self.stream)
                self.stream.synchronize()
            else:
                out = _stage_once(self.device, self.slots, self.stream, arrays, copier)
            times.append(time.perf_counter() - start)
            if check and i == 0:
                np.testing.assert_array_equal(_host(out), np.concatenate(arrays))

    def close(self) -> None:
        self.stream.close(timeout=10)


def measure(lanes: list[Lane], copier: RowCopier | None, runs: int, warmup: int,
            dma_only: bool = False) -> dict[str, float]:
    """Every lane staging ``runs`` batches at once (after ``warmup`` each); per-batch median and the
    aggregate GB/s (all lanes' bytes over the wall time of the whole measurement)."""
    for lane in lanes:
        lane.run(copier, warmup, [], True, dma_only)
    times: list[list[float]] = [[] for _ in lanes]
    with ThreadPoolExecutor(len(lanes), thread_name_prefix="instance") as instances:
        start = time.perf_counter()
        list(instances.map(lambda lane, t: lane.run(copier, runs, t, False, dma_only), lanes, times))
        wall = time.perf_counter() - start
    nbytes = sum(a.nbytes for a in lanes[0].batches[0])
    merged = sorted(x for t in times for x in t)
    return {"median_ms": statistics.median(merged) * 1e3, "p90_ms": merged[int(0.9 * (len(merged) - 1))] * 1e3,
            "gb_per_s": nbytes * runs * len(lanes) / wall / 1e9}


def variants(threads: list[int], piece_bytes: int,
             cuda: bool) -> list[tuple[str, Callable[[], RowCopier | None], bool]]:
    """(name, copier factory, DMA alone): one copy first (the ratios' base), the DMA-alone bound last on CUDA."""
    return [("one copy", lambda: None, False),
            *[(f"pieces, {t} threads", lambda t=t: RowCopier(t, piece_bytes=piece_bytes, min_bytes=0), False)  # type: ignore[misc]
              for t in threads],
            *([("DMA alone (slot to device)", lambda: None, True)] if cuda else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", default="0,1,2,4", help="copy threads of the pieces variants")
    parser.add_argument("--instances", default="1,2", help="instances staging at once")
    parser.add_argument("--requests", type=int, default=8, help="requests per batch")
    parser.add_argument("--shape", default="8,3,224,224", help="one request's tensor (float32)")
    parser.add_argument("--piece-mib", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the table (markdown) here, the raw rows beside it (.json)")
    args = parser.parse_args(argv)
    device = get_device(args.device)
    shape = tuple(int(d) for d in args.shape.split(","))
    batch_mb = args.requests * int(np.prod(shape)) * 4 / 1e6
    header = report_header(["python", "benchmarks/staging_copies.py", *(sys.argv[1:] if argv is None else argv)],
                           ROOT, f"device {device!r}")
    rows: list[dict[str, Any]] = []
    lines = [f"batch: {args.requests} requests of {shape} float32 = {batch_mb:.1f} MB; pieces of "
             f"{args.piece_mib:g} MiB; {args.runs} runs per round after {args.warmup}, {args.rounds} rounds", "",
             "| instances | variant | round | median ms / batch | p90 ms | GB/s (all instances) | x one copy |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    print("\n".join([*header, "", *lines]), flush=True)

    def write() -> None:  # after every row: a call cut short keeps what it measured
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join([f"# Input staging of large batches ({device!r})", "", *header, "", *lines,
                                           ""]))
            args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))

    def add(line: str) -> None:
        lines.append(line)
        print(line, flush=True)
        write()

    piece_bytes = int(args.piece_mib * (1 << 20))
    failed = 0
    for count in (int(n) for n in args.instances.split(",")):
        try:
            lanes = [Lane(device, i, args.requests, shape, seed=1000 * count + i) for i in range(count)]
        except Exception as exc:  # out of memory, say: the other instance counts still run
            failed += 1
            add(f"| {count} | (all) | | failed: {type(exc).__name__}: {str(exc)[:200]} | | | |")
            continue
        try:
            for round_ in range(1, args.rounds + 1):
                base = None
                for name, make, dma_only in variants([int(t) for t in args.threads.split(",")], piece_bytes,
                                                     device.is_cuda):
                    copier = make()
                    try:
                        result = measure(lanes, copier, args.runs, args.warmup, dma_only)
                    except Exception as exc:  # one variant's failure (a wrong batch, a CUDA error) is its row
                        failed += 1
                        add(f"| {count} | {name} | {round_} | failed: {type(exc).__name__}: {str(exc)[:200]} | | | |")
                        continue
                    finally:
                        if copier is not None:
                            copier.close()
                    base = result["gb_per_s"] if base is None else base
                    row = {"instances": count, "variant": name, "round": round_, **result,
                           "x_one_copy": result["gb_per_s"] / base}
                    rows.append(row)
                    add(f"| {count} | {name} | {round_} | {result['median_ms']:.2f} | {result['p90_ms']:.2f} | "
                        f"{result['gb_per_s']:.3g} | {row['x_one_copy']:.2f} |")
        finally:
            for lane in lanes:
                lane.close()
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
