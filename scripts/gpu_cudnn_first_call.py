"""What the first call of cuDNN's fused convolutions costs in a fresh process (issue 28).

On the H200 (2026-12-04, 78e6761) a level-5 ResNet-50 plan with cuDNN's fused convolution epilogues
answered its first call in a new process after 45-61 s, with cuDNN's benchmark mode on or off, and its
second after 1.3 ms. This script times, in a fresh child per mode, the first and second call of every
ResNet-50 (batch 32, fp16, channels-last) convolution shape as ``aten.cudnn_convolution_relu`` /
``aten.cudnn_convolution_add_relu`` (what ``conv_epilogues=cudnn`` emits) and as a plain
``aten.convolution``, so the cost is attributed to an op and a shape, and each mode (cuDNN's heuristic
mode B, benchmark mode) is measured against the default.

    python scripts/gpu_cudnn_first_call.py OUT_DIR [--modes default,heur_b,benchmark]
    python scripts/gpu_cudnn_first_call.py OUT_DIR --device cpu    # the CPU smoke run (plain convolutions only)

Writes ``OUT_DIR/cudnn-first-call.jsonl`` (one line per mode as it finishes) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

# (in channels, out channels, kernel, stride, input size, residual add): ResNet-50's convolutions after the stem
SHAPES: list[tuple[int, int, int, int, int, bool]] = [
    (64, 64, 1, 1, 56, False), (64, 64, 3, 1, 56, False), (64, 256, 1, 1, 56, True), (256, 64, 1, 1, 56, False),
    (256, 128, 1, 1, 56, False), (128, 128, 3, 2, 56, False), (128, 512, 1, 1, 28, True),
    (512, 128, 1, 1, 28, False), (128, 128, 3, 1, 28, False),
    (512, 256, 1, 1, 28, False), (256, 256, 3, 2, 28, False), (256, 1024, 1, 1, 14, True),
    (1024, 256, 1, 1, 14, False), (256, 256, 3, 1, 14, False),
    (1024, 512, 1, 1, 14, False), (512, 512, 3, 2, 14, False), (512, 2048, 1, 1, 7, True),
    (2048, 512, 1, 1, 7, False), (512, 512, 3, 1, 7, False),
]

MODES: dict[str, dict[str, str]] = {
    "default": {},
    "heur_b": {"TORCH_CUDNN_USE_HEURISTIC_MODE_B": "1"},
    "benchmark": {"STREAMRT_CUDNN_BENCHMARK": "1"},
}


def child(device: str, batch: int) -> list[dict[str, Any]]:
    """In this (fresh) process: first and second call of each shape, fused op and plain convolution."""
    import torch

    torch.backends.cudnn.benchmark = os.environ.get("STREAMRT_CUDNN_BENCHMARK") == "1"
    dtype = torch.float16 if device == "cuda" else torch.float32
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)

    def timed(fn: Any) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    torch.zeros(1, device=device)  # the context, outside the first timing
    for cin, cout, k, stride, size, add in SHAPES:
        def make(*shape: int) -> Any:
            return torch.randn(*shape, generator=gen).to(device, dtype)

        x = make(batch, cin, size, size).contiguous(memory_format=torch.channels_last)
        w = make(cout, cin, k, k).contiguous(memory_format=torch.channels_last)
        b = make(cout)
        pad, out = k // 2, (size + 2 * (k // 2) - k) // stride + 1
        z = make(batch, cout, out, out).contiguous(memory_format=torch.channels_last)
        args = ([stride] * 2, [pad] * 2, [1, 1], 1)
        row: dict[str, Any] = {"shape": f"{cin}->{cout} {k}x{k}/{stride} @{size}{' +add' if add else ''}"}
        if device == "cuda":
            fused = (partial(torch.ops.aten.cudnn_convolution_add_relu, x, w, z, 1.0, b, *args) if add
                     else partial(torch.ops.aten.cudnn_convolution_relu, x, w, b, *args))
            row["fused_first_s"], row["fused_second_s"] = timed(fused), timed(fused)
        plain = partial(torch.ops.aten.convolution, x, w, b, *args[:3], False, [0, 0], 1)
        row["plain_first_s"], row["plain_second_s"] = timed(plain), timed(plain)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mode")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.device, args.batch)))
        return 0
    if args.out is None:
        parser.error("OUT_DIR is required")
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "cudnn-first-call.jsonl"
    batch = args.batch if args.device == "cuda" else 1
    for mode in modes:  # each part handles its own failure and the next one still runs
        t0 = time.perf_counter()
        result: dict[str, Any] = {"mode": mode, "env": MODES[mode], "device": args.device}
        try:
            done = subprocess.run([sys.executable, __file__, "--child", "--device", args.device, "--batch", str(batch)],
                                  env={**os.environ, **MODES[mode]}, capture_output=True, text=True,
                                  timeout=args.timeout)
            if done.returncode != 0:
                raise RuntimeError(f"child exited {done.returncode}: {done.stderr.strip()[-800:]}")
            result["rows"] = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as exc:  # reported in the row, the next mode still runs
            result["error"] = f"{type(exc).__name__}: {exc}"
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        with log.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(table(result), flush=True)
    return 0


def table(result: dict[str, Any]) -> str:
    """One mode's rows as a Markdown table with totals."""
    head = f"## mode {result['mode']} ({result['device']}, {result['wall_s']} s in the child)"
    if "error" in result:
        return f"{head}\n\nfailed: {result['error']}\n"
    rows = result["rows"]
    keys = [k for k in ("fused_first_s", "fused_second_s", "plain_first_s", "plain_second_s") if k in rows[0]]
    lines = [head, "", "| shape | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += [f"| {r['shape']} | " + " | ".join(f"{r[k]:.4f}" for k in keys) + " |" for r in rows]
    lines.append("| **total** | " + " | ".join(f"**{sum(r[k] for r in rows):.3f}**" for k in keys) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
