"""One GPU session's worth of checks and measurements for real-time detection (run on the H200).

    python scripts/gpu_detection_check.py OUT_DIR [--quick] [--parts 1,2,5]

1. device ops vs their CPU versions: Triton letterbox vs the NumPy letterbox, Triton
   post-processing vs the NumPy post-processing, and the Triton kernels not synchronising with
   the host (``torch.cuda.set_sync_debug_mode("error")``);
2. fixed-size NMS vs ``torchvision.ops.batched_nms`` on 20k candidate boxes: same boxes (random,
   ties, identical boxes, zero-area boxes) and time (eager, CUDA graph), target >= 10x;
3. the detection benchmark (``benchmarks/detection.py``): synchronous loop vs pipeline topologies
   at 1080p with the best GPU backend, then the camera-paced N-stream sweep;
4. ``streamrt demo`` (the README's first command) end to end;
5. the GPU tests of the detection code (``pytest -m gpu tests/ops tests/video``).

Prints a table per part and writes ``OUT_DIR/part-<n>.md`` per part and ``OUT_DIR/gpu_detection_check.md``
(every part found in OUT_DIR, so parts run in separate invocations add up), plus the benchmark's own
report, timelines and the demo's outputs. A failing part is recorded and the others still run.

``--device cpu --quick`` is the CPU smoke run (tests/video/test_gpu_detection_check.py): the same parts
with the torch ops on the CPU, small frames and sweeps, no synchronisation check and no CUDA graph
(parts 2 and 5 need torchvision and a GPU to say anything; there they are recorded as failed or
skipped, which exercises the error handling).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamrt.ops.letterbox import CpuLetterbox, Normalize
from streamrt.ops.letterbox_torch import TorchLetterbox
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig
from streamrt.ops.postprocess_torch import TorchPostprocess
from streamrt.pipeline.collector import realtime_collector

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda"  # --device; the CPU smoke run sets "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _cuda_ms(fn: Callable[[], object], iters: int, warmup: int = 5) -> float:
    """Median milliseconds per call, each call timed on its own with a full synchronisation."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def raw_output(n: int, classes: int, seed: int, *, ties: bool = False, duplicates: bool = False,
               zero_area: bool = False, size: float = 1920.0) -> torch.Tensor:
    """A (1, 4 + classes, n) YOLOv8 raw output on the GPU: random boxes and sigmoid-like scores."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.empty(1, 4 + classes, n)
    raw[0, 0:2] = torch.rand(2, n, generator=g) * size
    raw[0, 2:4] = torch.rand(2, n, generator=g) * size * 0.1 + 2
    raw[0, 4:] = torch.rand(classes, n, generator=g)
    if ties:
        raw[0, 4:] = torch.floor(raw[0, 4:] * 8) / 8
    if duplicates:
        raw[0, :4, n // 2:] = raw[0, :4, : n - n // 2]
    if zero_area:
        raw[0, 2, ::3] = 0.0
    return raw.to(DEVICE)


def torchvision_reference(raw: torch.Tensor, iou: float, max_det: int, conf: float) -> torch.Tensor:
    """``batched_nms(...)[:max_det]`` rows (x1, y1, x2, y2, score, class) with the op's decode."""
    import torchvision

    cx, cy, w, h = raw[0, :4]
    boxes = torch.stack([cx - w * 0.5, cy - h * 0.5, cx + w * 0.5, cy + h * 0.5], 1)
    scores, classes = raw[0, 4:].max(0)
    keep_mask = scores >= conf
    idx = torch.nonzero(keep_mask).squeeze(1)
    keep = torchvision.ops.batched_nms(boxes[idx], scores[idx], classes[idx], iou)[:max_det]
    k = idx[keep]
    return torch.cat([boxes[k], scores[k, None], classes[k, None].float()], 1)


def _canonical(rows: torch.Tensor) -> np.ndarray:
    a = rows.double().cpu().numpy()
    return a[np.lexsort((a[:, 3], a[:, 2], a[:, 1], a[:, 0], a[:, 5], -a[:, 4]))]


def part_ops(report: dict[str, Any], quick: bool = False) -> list[str]:
    rng = np.random.default_rng(0)
    lines = ["| check | result |", "|---|---|"]
    sizes: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
        ((1080, 1920), (640, 640)), ((720, 1280), (320, 320)), ((1080, 1920), (384, 640)))
    if quick and DEVICE == "cpu":
        sizes = (((72, 128), (64, 64)), ((108, 192), (48, 64)))
    for (h, w), (ih, iw) in sizes:
        frames = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
        op = TorchLetterbox((h, w), (ih, iw), Normalize(), device=DEVICE, batch=2)
        out = torch.full((2, 3, ih, iw), float("nan"), device=DEVICE)
        op(torch.from_numpy(frames).to(DEVICE), out)
        ref = np.empty((3, ih, iw), np.float32)
        CpuLetterbox((h, w), (ih, iw), method="numpy")(frames[1], ref)
        diff = float(np.abs(out[1].cpu().numpy() - ref).max())
        lines.append(f"| letterbox {w}x{h} -> {iw}x{ih} (Triton={op.use_triton}) vs NumPy | max abs diff {diff:.2e} |")
        report.setdefault("letterbox", []).append(diff)
    cfg = PostprocessConfig(conf=0.25, iou=0.45, max_det=300, pre_nms_topk=1024)
    raw = raw_output(8400, 80, seed=1, size=640)
    post = TorchPostprocess(cfg, "yolov8", 80, 8400, device=DEVICE)
    dets, counts = torch.empty(1, 300, 6, device=DEVICE), torch.empty(1, dtype=torch.int32, device=DEVICE)
    post(raw, dets, counts)  # compile the kernels first: only the steady state must not synchronise
    _sync()
    if DEVICE != "cuda":
        synced = "not checked (no CUDA device)"
    else:
        torch.cuda.set_sync_debug_mode("error")
        try:
            post(raw, dets, counts)
            synced = "none (set_sync_debug_mode error)"
        except RuntimeError as exc:
            synced = f"SYNCHRONISED: {exc}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
    ref_d, ref_c = np.empty((1, 300, 6), np.float32), np.empty(1, np.int32)
    CpuPostprocess(cfg, "yolov8", 80)(raw.cpu().numpy(), ref_d, ref_c)
    same = int(counts[0]) == int(ref_c[0]) and np.array_equal(dets.cpu().numpy(), ref_d)
    lines.append(f"| post-processing 8400 anchors x 80 classes (Triton={post.use_triton}) vs NumPy | "
                 f"{'identical' if same else 'DIFFERENT'} ({int(counts[0])} vs {int(ref_c[0])} boxes) |")
    lines.append(f"| host synchronisations in post-processing | {synced} |")
    report["postprocess_identical"] = same
    return lines


def part_nms(report: dict[str, Any], quick: bool) -> list[str]:
    import torchvision

    n, classes, iou, max_det = 20000, 80, 0.45, 300
    lines = [f"torchvision {torchvision.__version__}; {n} candidate boxes, {classes} classes, IoU {iou}, "
             f"max_det {max_det}", "", "| input | K (pre-NMS top-k) | same boxes as batched_nms[:max_det] | kept |",
             "|---|---:|---|---:|"]
    cases = {"random": {}, "ties (8 score levels)": {"ties": True}, "identical boxes (half duplicated)":
             {"duplicates": True}, "zero-area boxes (1/3)": {"zero_area": True},
             "all three": {"ties": True, "duplicates": True, "zero_area": True}}
    for seed, (name, kw) in enumerate(cases.items()):
        for k in (n, 1024):
            raw = raw_output(n, classes, seed=seed, **kw)
            ref = torchvision_reference(raw, iou, max_det, 0.0)
            op = TorchPostprocess(PostprocessConfig(conf=0.0, iou=iou, max_det=max_det, pre_nms_topk=k), "yolov8",
                                  classes, n, device=DEVICE)
            dets = torch.empty(1, max_det, 6, device=DEVICE)
            counts = torch.empty(1, dtype=torch.int32, device=DEVICE)
            op(raw, dets, counts)
            got = dets[0, : int(counts[0])]
            same = got.shape == ref.shape and np.array_equal(_canonical(got), _canonical(ref))
            report.setdefault("nms_equal", {})[f"{name} K={k}"] = same
            lines.append(f"| {name} | {k} | {'yes' if same else 'NO'} | {got.shape[0]} / {ref.shape[0]} |")
    raw = raw_output(n, classes, seed=7)
    cx, cy, w, h = raw[0, :4]
    boxes = torch.stack([cx - w * 0.5, cy - h * 0.5, cx + w * 0.5, cy + h * 0.5], 1)
    scores, cls = raw[0, 4:].max(0)
    iters = 3 if quick and DEVICE == "cpu" else 20 if quick else 100
    tv_ms = _cuda_ms(lambda: torchvision.ops.batched_nms(boxes, scores, cls, iou), iters)
    lines += ["", "| implementation | ms per call (median) | vs batched_nms |", "|---|---:|---:|",
              f"| torchvision.ops.batched_nms (NMS only) | {tv_ms:.3f} | 1.00x |"]
    report["batched_nms_ms"] = tv_ms
    for k in (n, 4096, 1024):
        op = TorchPostprocess(PostprocessConfig(conf=0.0, iou=iou, max_det=max_det, pre_nms_topk=k), "yolov8",
                              classes, n, device=DEVICE)
        dets = torch.empty(1, max_det, 6, device=DEVICE)
        counts = torch.empty(1, dtype=torch.int32, device=DEVICE)
        eager = _cuda_ms(partial(op, raw, dets, counts), iters)
        if DEVICE != "cuda":  # no CUDA graph to replay: the eager row is what the CPU can say
            report.setdefault("ours_ms", {})[str(k)] = {"eager": eager, "graph": eager}
            lines.append(f"| StreamRT decode+top-k+NMS, K={k}, eager | {eager:.3f} | {tv_ms / eager:.1f}x |")
            continue
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(3):
                op(raw, dets, counts)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            op(raw, dets, counts)
        replay = _cuda_ms(graph.replay, iters)
        report.setdefault("ours_ms", {})[str(k)] = {"eager": eager, "graph": replay}
        lines.append(f"| StreamRT decode+top-k+NMS, K={k}, eager | {eager:.3f} | {tv_ms / eager:.1f}x |")
        lines.append(f"| StreamRT decode+top-k+NMS, K={k}, CUDA graph | {replay:.3f} | {tv_ms / replay:.1f}x |")
    best = min(v["graph"] for v in report["ours_ms"].values())
    full = report["ours_ms"][str(n)]["graph"]
    lines.append("")
    lines.append(f"- target >= 10x on {n} boxes: K={n} (all boxes, exact for every input) {tv_ms / full:.1f}x "
                 f"({'met' if tv_ms / full >= 10 else 'NOT met'}); best K {tv_ms / best:.1f}x.")
    return lines


def load_script(path: Path, name: str) -> Any:
    """Import a program of ``benchmarks/`` or ``scripts/`` as module ``name``.

    The module is registered in ``sys.modules`` before it runs: ``dataclass`` (and pickling) look
    their class's module up there, and fail on an unregistered one.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_benchmark() -> Any:
    return load_script(ROOT / "benchmarks" / "detection.py", "detection_bench")


def part_benchmark(out: Path, quick: bool) -> list[str]:
    bench = _load_benchmark()
    args = ["--device", DEVICE, "--out", str(out / "detection")]
    if quick and DEVICE == "cpu":
        args += ["--size", "128x72", "--frames", "4", "--items", "8", "--warmup", "2", "--rounds", "1",
                 "--workers", "2", "--streams", "1,2", "--duration", "2", "--max-batch", "2"]
    elif quick:
        args += ["--items", "200", "--rounds", "2", "--streams", "1,8,32,64", "--duration", "3"]
    status = bench.main(args)
    if status:  # main's exit status: a failure there is this part's
        raise RuntimeError(f"benchmarks/detection.py exited {status}")
    return (out / "detection" / "detection.md").read_text().splitlines()


def part_demo(out: Path, quick: bool = False) -> list[str]:
    from streamrt.video.demo import DemoConfig, run_demo

    config = DemoConfig(out_dir=out / "demo")
    if quick and DEVICE == "cpu":
        config = DemoConfig(out_dir=out / "demo", width=160, height=96, frames=12, warmup_frames=2, rounds=1)
    result = run_demo(config, progress=print)
    return [f"- backend {result.detector.backend}, {result.pipeline.frames} frames {result.pipeline.frame_size}",
            f"- synchronous loop {result.sync.fps:.1f} FPS, pipeline ({result.pipeline.label}) "
            f"{result.pipeline.fps:.1f} FPS: **{result.speedup:.2f}x**",
            f"- same detections: {'yes' if result.identical else 'NO'}; mAP@0.5 on the clip {result.map50:.3f}",
            f"- pipeline bound: {result.pipeline.bottleneck}"]


def part_tests() -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/ops", "tests/video",
           "tests/cli/test_detect_cli.py"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    return [f"`{' '.join(cmd[2:])}` exit {done.returncode}", "", "```", *tail, "```"]


def main(argv: list[str] | None = None) -> int:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the smoke run of the script itself (with --quick: seconds)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and sweep points")
    parser.add_argument("--parts", default="1,2,3,4,5",
                        help="parts to run (default all); runs into the same folder add up in the summary")
    args = parser.parse_args(argv)
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this script is for the GPU machine (--device cpu is its smoke run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU",
                              "torch": torch.__version__}
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    parts: dict[str, tuple[str, Callable[[], list[str]]]] = {
        "1": ("1. Device ops vs CPU ops", lambda: part_ops(report, args.quick)),
        "2": ("2. Fixed-size NMS vs torchvision.ops.batched_nms", lambda: part_nms(report, args.quick)),
        "3": ("3. Detection benchmark (sync vs pipeline at 1080p, camera-paced sweep)",
              lambda: part_benchmark(args.out, args.quick)),
        "4": ("4. streamrt demo", lambda: part_demo(args.out, args.quick)),
        "5": ("5. GPU tests", part_tests),
    }
    for key in [k.strip() for k in args.parts.split(",") if k.strip()]:
        if key not in parts:
            report.setdefault("failed", []).append(f"part {key}: no such part (1-5)")
            continue
        title, fn = parts[key]
        print(f"\n== {title}", flush=True)
        started = time.perf_counter()
        try:
            with realtime_collector():  # as `streamrt detect` runs
                lines = fn()
        except Exception as exc:
            lines = ["```", traceback.format_exc(), "```"]
            report.setdefault("failed", []).append(f"{title}: {type(exc).__name__}: {exc}")
        lines.append(f"\n({time.perf_counter() - started:.0f} s)")
        print("\n".join(lines), flush=True)
        (args.out / f"part-{key}.md").write_text("\n".join([f"## {title}", "", *lines, ""]) + "\n")
    (args.out / f"gpu_detection_check-{args.parts.replace(',', '')}.json").write_text(
        json.dumps(report, indent=2, default=str) + "\n")
    header = ["# GPU detection check", "", *(f"- {k}: {v}" for k, v in report.items() if k != "failed"), ""]
    done = [(args.out / f"part-{k}.md").read_text() for k in parts if (args.out / f"part-{k}.md").is_file()]
    (args.out / "gpu_detection_check.md").write_text("\n".join(header) + "\n" + "\n".join(done))
    print(f"\nwrote {args.out}/gpu_detection_check.md")
    return 1 if report.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
