"""H200 check of the two GPU tests that failed on 2026-12-01 (issue 24 item 6, issue 27): what differs, and why.

    python scripts/gpu_trust_check.py OUT [--device cuda|cpu] [--quick] [--parts 1,2,3,4,5] [--no-builds]
        [--budget 520]

1. Engine rows: the bundled detector imported as eager torch (the GPU test's engine), batch 1 vs batch 2
   and row 0 of [a, b] vs row 0 of [a, stale], with torch's default math (cuDNN TF32 on) and TF32 off,
   each against the CPU's IEEE fp32: is the batch-1 vs batch-2 difference TF32's, and are rows independent?
2. Batched cameras (``test_batched_cameras_on_the_gpu``): two cameras with different scenes, both orders,
   one clip twice (the old test), streams with and without CUDA graphs, replicated lanes with graphs;
   per camera, row for row against the camera alone at batch 2 (same kernels) and at batch 1 (other
   kernels, and IoU-matched within the test's TF32 bound), for both TF32 settings.
3. Plans: the bundled detector built by ``open_detector`` (torch_inductor fp32 and fp16 on a GPU, two
   builds, cached in ``OUT/plans``; ONNX Runtime fp32 on the CPU): batched cameras as in 2, fp16 vs fp32.
4. Two-stage letterbox (``test_two_stage_steps_on_gpu_instances_match_the_in_process_chain``): the device
   letterbox vs the float and the OpenCV ones, the detector on each, device NMS vs host NMS.
5. The two GPU tests themselves, with their printed differences (on the CPU: collected only).

Every part catches its own failure and the next one runs; ``OUT/part-<n>.md``, ``OUT/gpu_trust_check.md``
and ``OUT/gpu_trust_check.json`` are rewritten after every part, so a killed run keeps what was done.
``--device cpu --quick`` runs every part on the CPU in seconds (the device path's stages on CPU tensors,
no graphs): the smoke run of ``tests/video/test_gpu_trust_check.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the GPU tests' engine (video.detection_helpers.ImportedEngine)

from streamrt.ops import CpuLetterbox, CpuPostprocess, LetterboxGeometry, PostprocessConfig  # noqa: E402
from streamrt.pipeline.config import PipelineConfig, Topology  # noqa: E402
from streamrt.video import DetectConfig, Detections, SyntheticClip, SyntheticSource, run_detection  # noqa: E402
from streamrt.video.compare import DetectionDiff, diff_detections  # noqa: E402
from streamrt.video.model import DetectorModel, bundled_labels, bundled_model, describe_engine  # noqa: E402

TF32_BOX_PX, TF32_SCORE = 0.25, 1e-2  # test_gpu_detection.py's bound (derivation there)
SEEDS = (4, 9)


@dataclasses.dataclass
class Run:
    """What the parts share: the device, the size of the run, the output folder, the JSON state."""

    device: str
    quick: bool
    out: Path
    builds: bool
    deadline: float = float("inf")  # time.monotonic() by which the whole check ends
    state: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def clips(self) -> list[SyntheticClip]:
        w, h, n = (320, 180, 3) if self.quick else (1280, 720, 8)
        return [SyntheticClip(width=w, height=h, frames=n, seed=s) for s in SEEDS]


@contextmanager
def tf32(enabled: bool | None) -> Iterator[str]:
    """TF32 for cuDNN convolutions and matmuls on, off, or (None) as torch left it; restored after."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    if enabled is not None:
        matmul.allow_tf32 = cudnn.allow_tf32 = enabled
    try:
        yield f"matmul TF32 {matmul.allow_tf32}, cuDNN TF32 {cudnn.allow_tf32}"
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def imported_detector(run: Run) -> tuple[DetectorModel, Any]:
    """The GPU test's detector (the ONNX model imported as eager torch) and the device to run it on: on
    the CPU the device path's stages on CPU tensors with fake CUDA streams (no graphs)."""
    from video.detection_helpers import FakeCudaDevice, ImportedEngine

    labels = tuple(bundled_labels().read_text().split())
    if run.cuda:
        return describe_engine(ImportedEngine("cuda", batch=4), labels=labels, source="bundled (imported)",
                               backend="torch"), None
    from streamrt.video.model import open_detector

    host = open_detector(bundled_model(), backend="onnxruntime", max_batch=4, cache_dir=run.out / "plans")
    return dataclasses.replace(host, engine=ImportedEngine("cpu"), device="cuda", backend="torch"), FakeCudaDevice()


def cameras(model: DetectorModel, device: Any, clips: list[SyntheticClip], pipeline: PipelineConfig,
            batch: int, run: Run) -> list[list[Detections]]:
    """Each source's detections, in frame order."""
    out: list[Detections] = []
    triton = None if run.cuda else False
    pipeline = pipeline if run.cuda else pipeline.replace(trace=False)
    run_detection(model, [SyntheticSource(c) for c in clips], DetectConfig(pipeline=pipeline, batch=batch,
                                                                          use_triton=triton),
                  on_result=lambda f, d: out.append(d), device=device)
    return [[d for d in out if d.source == s] for s in range(len(clips))]


def cell(diff: DetectionDiff) -> str:
    text = f"max {diff.max_box:.3g} px / {diff.max_score:.2g}"
    if diff.unmatched_near_conf:
        text += f", {diff.unmatched_near_conf} at conf"
    return ("ok, " if diff.ok else "**DIFFERS**, ") + text + ("" if diff.ok else f": {diff.problems[0]}")


# -- parts -------------------------------------------------------------------------------------------


def part_rows(run: Run) -> list[str]:
    from video.detection_helpers import ImportedEngine

    clips = run.clips()
    frames = []
    for clip in clips:
        pixels = np.empty((3, 320, 320), np.float32)
        CpuLetterbox((clip.height, clip.width), (320, 320), method="numpy")(clip.frame(0), pixels)
        frames.append(torch.from_numpy(pixels))
    a, b = frames
    reference = ImportedEngine("cpu").create_context()
    ref = [reference.infer({"images": x[None]})["output0"][0].double() for x in (a, b)]
    emulated = ImportedEngine("cpu", tf32=True).create_context()
    emu = [emulated.infer({"images": x[None]})["output0"][0].double() for x in (a, b)]
    engine = ImportedEngine(run.device, batch=4).create_context()
    dev = torch.device(run.device)

    def infer(*rows: torch.Tensor) -> torch.Tensor:
        out = engine.infer({"images": torch.stack(rows).to(dev)})["output0"]
        return out.double().cpu()

    def rel(x: torch.Tensor, y: torch.Tensor) -> str:
        return f"{float((x - y).norm() / y.norm()):.2e}"

    lines = ["Raw output (9 x 2100) of frame 0 of each camera; rel = relative L2 against the CPU's IEEE fp32.", "",
             "| math | row | batch 1 vs CPU fp32 | batch 2 vs CPU fp32 | batch 1 vs batch 2 (max abs) | "
             "[a, b] vs [a, stale] row 0 (max abs) |", "|---|---|---:|---:|---:|---:|"]
    for setting in (None, False):
        with tf32(setting) as flags:
            one = [infer(a)[0], infer(b)[0]]
            two = infer(a, b)
            stale = infer(a, torch.zeros_like(a))[0]
            for r in (0, 1):
                inv = f"{float((two[0] - stale).abs().max()):.3g}" if r == 0 else ""
                lines.append(f"| {'torch default' if setting is None else 'TF32 off'} ({flags}) | {r} | "
                             f"{rel(one[r], ref[r])} | {rel(two[r], ref[r])} | "
                             f"{float((one[r] - two[r]).abs().max()):.3g} | {inv} |")
                run.state.setdefault("rows", []).append(lines[-1])
    for r in (0, 1):
        lines.append(f"| CPU, TF32 convolutions emulated | {r} | {rel(emu[r], ref[r])} | | | |")
    lines += ["", "- TF32 (unit roundoff 2^-11) puts an fp32 network ~1e-4..1e-3 (relative L2) from IEEE fp32; "
                  "with TF32 off the batch-1 vs batch-2 difference should fall to fp32 rounding (~1e-6) and the "
                  "last column should be 0 (rows independent: the premise of the same-kernels check)."]
    return lines


def part_cameras(run: Run) -> list[str]:
    model, device = imported_detector(run)
    clips = run.clips()
    sync = PipelineConfig(topology=Topology.SYNC)
    pipelines = [PipelineConfig(cuda_graphs=True), PipelineConfig(cuda_graphs=False),
                 PipelineConfig(topology=Topology.SINGLE, workers=2, ring_size=2, cuda_graphs=True)]
    if run.quick:
        pipelines = pipelines[:1]
    lines = [f"Clips {clips[0].width}x{clips[0].height}, {clips[0].frames} frames, seeds {SEEDS}; cells: max |box| "
             "(frame px) / max |score|, and the first difference.", "",
             "| math | pipeline | cameras | camera (row) | vs alone at batch 2 (same kernels, row for row) | "
             "vs alone at batch 1 (row for row) | vs alone at batch 1 (IoU-matched, TF32 bound) |",
             "|---|---|---|---|---|---|---|"]
    for setting in ((None, False) if run.cuda else (None,)):
        with tf32(setting):
            math = "torch default" if setting is None else "TF32 off"
            alone2 = [cameras(model, device, [c], sync, 2, run)[0] for c in clips]
            alone1 = [cameras(model, device, [c], sync, 1, run)[0] for c in clips]
            for pipeline in pipelines:
                orders = [(0, 1), (1, 0)] + ([(0, 0)] if pipeline.cuda_graphs and pipeline.workers == 1 else [])
                for order in orders:
                    got = cameras(model, device, [clips[i] for i in order], pipeline, 2, run)
                    for row, cam in enumerate(order):
                        same = diff_detections(alone2[cam], got[row], box_atol=1e-2, score_atol=1e-5)
                        rows = diff_detections(alone1[cam], got[row], box_atol=1e-2, score_atol=1e-5)
                        near = diff_detections(alone1[cam], got[row], match_iou=0.5, box_atol=TF32_BOX_PX,
                                               score_atol=TF32_SCORE)
                        lines.append(f"| {math} | {pipeline.describe()} | {'+'.join(map(str, order))} | {cam} "
                                     f"({row}) | {cell(same)} | {cell(rows)} | {cell(near)} |")
                        run.state.setdefault("cameras", []).append(
                            {"math": math, "pipeline": pipeline.describe(), "order": order, "camera": cam,
                             "same_kernels": same.format(), "batch1": rows.format(), "batch1_matched": near.format()})
                        print(lines[-1], flush=True)
    lines += ["", "- A defect (slot, row, stale input) shows in the first column; numerics only in the others.",
              "- Seeds 4+4 is the old test's scenario (one clip twice): it cannot show a swapped row."]
    return lines


def part_plans(run: Run) -> list[str]:
    from streamrt.video.model import open_detector

    if run.cuda and not run.builds:
        return ["skipped: --no-builds"]
    clips = run.clips()
    precisions = ("fp32", "fp16") if run.cuda else ("fp32",)
    backend = None if run.cuda else "onnxruntime"
    sync = PipelineConfig(topology=Topology.SYNC)
    lines = ["| plan | build s | camera | batched (graphs) vs alone at batch 2 | vs alone at batch 1 (matched) |",
             "|---|---:|---|---|---|"]
    first: dict[str, list[list[Detections]]] = {}
    for precision in precisions:
        started = time.perf_counter()
        model = open_detector(bundled_model(), backend=backend, precision=precision, max_batch=4,
                              cache_dir=run.out / "plans")
        built = time.perf_counter() - started
        label = f"{model.backend} {precision}"
        alone2 = [cameras(model, None, [c], sync, 2, run)[0] for c in clips]
        alone1 = first[precision] = [cameras(model, None, [c], sync, 1, run)[0] for c in clips]
        got = cameras(model, None, clips, PipelineConfig(cuda_graphs=True), 2, run)
        for cam in (0, 1):
            same = diff_detections(alone2[cam], got[cam], box_atol=1e-2, score_atol=1e-5)
            near = diff_detections(alone1[cam], got[cam], match_iou=0.5, box_atol=TF32_BOX_PX, score_atol=TF32_SCORE)
            lines.append(f"| {label} | {built:.0f} | {cam} | {cell(same)} | {cell(near)} |")
            print(lines[-1], flush=True)
    if "fp16" in first:
        lines += ["", "fp16 vs fp32 plan, each camera alone at batch 1 (IoU-matched, no tolerance: the numbers):"]
        for cam in (0, 1):
            d = diff_detections(first["fp32"][cam], first["fp16"][cam], match_iou=0.5, box_atol=float("inf"),
                                score_atol=1.0)
            lines.append(f"- camera {cam}: {d.format(3)}")
    lines += ["", f"- plan builds: {len(precisions)} (cached in {run.out / 'plans'}: a second run builds none)."]
    return lines


def part_letterbox(run: Run) -> list[str]:
    import streamrt
    from streamrt.ops import TorchLetterbox, TorchPostprocess

    size, cfg = 320, PostprocessConfig(conf=0.25, iou=0.45, max_det=100)
    detector_path = ROOT / "src" / "streamrt" / "video" / "assets" / "shapes_detector.onnx"
    engine = streamrt.open(detector_path, streamrt.BuildConfig(backend_options={"threads": 1}), max_batch=1,
                           cache=True)
    ctx = engine.create_context()
    dev = torch.device(run.device)

    def detect(pixels: np.ndarray, hw: tuple[int, int], device_nms: bool) -> np.ndarray:
        raw = np.asarray(ctx.infer({"images": np.ascontiguousarray(pixels[None])})["output0"])
        if device_nms:
            post = TorchPostprocess(cfg, "yolov8", 5, raw.shape[2], device=dev, use_triton=None if run.cuda else False)
            dets_t, counts_t = torch.empty((1, 100, 6), device=dev), torch.empty(1, dtype=torch.int32, device=dev)
            post(torch.from_numpy(raw).to(dev), dets_t, counts_t)
            dets, n = dets_t.cpu().numpy(), int(counts_t[0])
        else:
            dets, counts = np.empty((1, 100, 6), np.float32), np.empty(1, np.int32)
            CpuPostprocess(cfg, "yolov8", 5)(raw, dets, counts)
            n = int(counts[0])
        kept = dets[0, :n].copy()
        LetterboxGeometry.fit(hw, (size, size)).to_source(kept[:, :4])
        return kept

    lines = ["| frame | device vs float letterbox | device vs OpenCV (levels) | boxes: device chain vs "
             "float+host NMS | device chain vs OpenCV chain (max px) | count device / OpenCV |",
             "|---|---:|---:|---:|---:|---|"]
    for seed, (w, h) in ((21, (640, 480)), (22, (1280, 720))):
        frame = SyntheticClip(width=w, height=h, frames=1, seed=seed).frame(0)
        out = torch.empty((3, size, size), device=dev)
        TorchLetterbox((h, w), (size, size), device=dev, use_triton=None if run.cuda else False)(
            torch.from_numpy(frame).to(dev), out)
        device_px = out.cpu().numpy()
        float_px, cv_px = np.empty_like(device_px), np.empty_like(device_px)
        CpuLetterbox((h, w), (size, size), method="numpy")(frame, float_px)
        CpuLetterbox((h, w), (size, size), method="opencv")(frame, cv_px)
        served, host, cv = detect(device_px, (h, w), True), detect(float_px, (h, w), False), detect(cv_px, (h, w),
                                                                                                    False)
        same = f"{np.abs(served - host).max():.3g}" if len(served) == len(host) else f"{len(served)} vs {len(host)}"
        moved = f"{np.abs(served[:, :4] - cv[:, :4]).max():.3g}" if len(served) == len(cv) else "-"
        lines.append(f"| scene {seed} {w}x{h} | {np.abs(device_px - float_px).max():.2g} | "
                     f"{255 * np.abs(device_px - cv_px).max():.2f} | {same} | {moved} | {len(served)} / {len(cv)} |")
        print(lines[-1], flush=True)
        if seed == 21:
            boxes = {name: [[round(float(v), 2) for v in box] for box in rows[:, :4]]
                     for name, rows in (("device", served), ("OpenCV", cv))}
            lines += [f"| | {name} chain boxes {value} | | | | |" for name, value in boxes.items()]
    engine.close()
    lines += ["", "- Expected: the device letterbox is the float one (<= 1e-4), <= 1 level from OpenCV's; the device "
                  "chain equals the float chain with host NMS (~1e-4 px); against the OpenCV chain one box of scene "
                  "21 moves ~1.9 px (107.36 vs 105.48 on the H200; 1.88 on the CPU)."]
    return lines


GPU_TESTS = ["tests/video/test_gpu_detection.py",
             "tests/serve/test_two_stage_ensemble.py::test_two_stage_steps_on_gpu_instances_match_the_in_process_chain"]


def part_tests(run: Run) -> list[str]:
    extra = ["-s", "-m", "gpu"] if run.cuda else ["--collect-only"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *GPU_TESTS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    limit = max(60.0, min(400.0, run.deadline - time.monotonic() - 10))
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return [f"`{' '.join(cmd[2:])}` stopped after {limit:.0f} s (the --budget)"]
    (run.out / "gpu_tests.log").write_text(done.stdout + done.stderr)
    tail = (done.stdout + done.stderr).strip().splitlines()[-40:]
    run.state["tests_exit"] = done.returncode
    return [f"`{' '.join(cmd[2:])}` exit {done.returncode} (full output: gpu_tests.log)", "", "```", *tail, "```"]


PARTS: dict[str, tuple[str, Callable[[Run], list[str]]]] = {
    "1": ("1. Engine rows: batch 1 vs batch 2, TF32 on and off, against IEEE fp32", part_rows),
    "2": ("2. Batched cameras (test_batched_cameras_on_the_gpu and variants)", part_cameras),
    "3": ("3. Plans: batched cameras on built plans, fp16 vs fp32", part_plans),
    "4": ("4. Two-stage letterbox and NMS (test_two_stage_steps_on_gpu_instances...)", part_letterbox),
    "5": ("5. The two GPU tests", part_tests),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small clips (the CPU smoke run)")
    parser.add_argument("--parts", default="1,2,3,4,5")
    parser.add_argument("--no-builds", dest="builds", action="store_false", help="skip part 3's plan builds")
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for the whole check (part 5 is cut)")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.parts.split(",") if k.strip()]
    if unknown := [k for k in keys if k not in PARTS]:
        print(f"unknown parts {unknown}; parts are {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --quick for the smoke run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    from streamrt.profiling.provenance import git_commit

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    env = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": os.environ.get("STREAMRT_COMMIT") or git_commit(),
           "device": f"{device} (torch {torch.__version__}, CUDA {torch.version.cuda})",
           "command": " ".join(["python", *(argv if argv is not None else sys.argv)])}
    run = Run(args.device, args.quick, args.out, args.builds, deadline=time.monotonic() + args.budget)
    sections = []
    for key in keys:
        title, fn = PARTS[key]
        print(f"\n== {title}", flush=True)
        started = time.perf_counter()
        try:
            lines = fn(run)
        except Exception as exc:  # the next part still runs
            lines = ["```", traceback.format_exc(), "```"]
            run.state.setdefault("failed", []).append(f"{title}: {type(exc).__name__}: {exc}")
        lines.append(f"\n({time.perf_counter() - started:.0f} s)")
        print("\n".join(lines), flush=True)
        sections.append("\n".join([f"## {title}", "", *lines, ""]))
        (args.out / f"part-{key}.md").write_text(sections[-1] + "\n")
        (args.out / "gpu_trust_check.md").write_text(
            "\n".join(["# GPU trust check", "", *(f"- {k}: {v}" for k, v in env.items()), "", *sections]) + "\n")
        (args.out / "gpu_trust_check.json").write_text(json.dumps({"environment": env, **run.state}, indent=2,
                                                                  default=str) + "\n")
    print(f"\nwrote {args.out}/gpu_trust_check.md")
    return 1 if run.state.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
