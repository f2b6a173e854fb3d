"""The detection ensemble served vs the same chain in-process (issue 14): frames/s and latency.

Example 12's ensemble (``examples/12-detection-ensemble``: Python ``preprocess`` (decode +
letterbox) -> ``detector`` -> Python ``postprocess`` (NMS, boxes in frame pixels)) is served by
``streamrt serve`` and driven over gRPC by ``--concurrency`` client threads, one encoded frame per
request; the same chain runs in-process with the same ops (OpenCV decode, ``TorchLetterbox`` /
``CpuLetterbox``, the same detector plan, ``TorchPostprocess`` / ``CpuPostprocess``) in a loop of
one frame at a time and of ``--batch`` frames at a time. Every variant gets the same JPEG frames
(synthetic scenes with shapes the bundled detector finds), and the served answers are checked
against the in-process ones before timing (same count, boxes within 1 px).

On CUDA the detector is built with the GPU backend (torch_inductor, fp16) through the build cache
and the Python steps run on GPU instances; on the CPU (``--device cpu``, used by the CI test) the
detector runs on ONNX Runtime. Writes ``OUT/detection-ensemble-<device>.md`` and ``.json``.

``--two-stage`` benchmarks the two-stage ensemble ``detect_classify`` the same way (detector ->
``crop`` Python step -> the example's crop classifier, built like the detector: a torch_inductor
fp16 plan on CUDA, ONNX Runtime on the CPU); the in-process chain adds the same crops
(:func:`streamrt.ops.crop_resize`) and classifier, the served class scores are checked too (within
1e-3 on the CPU, 2e-2 on CUDA's fp16 plans), and the report is ``OUT/detection-two-stage-<device>.md``.

Usage::

    python benchmarks/detection_ensemble.py OUT [--device cuda] [--seconds 10] [--concurrency 16] [--two-stage]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "12-detection-ensemble" / "models"
DETECTOR = ROOT / "src" / "streamrt" / "video" / "assets" / "shapes_detector.onnx"
SIZE, CLASSES, MAX_BATCH = 320, 5, 8
CROP, MAX_DET = 32, 100  # the crop step's output size and the post-processing step's max_det


def _serving_frontend() -> Any:
    """benchmarks/serving_frontend.py (free_port, wait_ready), loaded by path: benchmarks is no package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_frontend", ROOT / "benchmarks" / "serving_frontend.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_repository(repo: Path, device: str, cache: Path, two_stage: bool = False) -> float:
    """The example's models in ``repo``, the detector (and with ``two_stage`` the crop classifier) built
    for ``device``; returns the build seconds."""
    import streamrt
    from streamrt.config import Precision
    from streamrt.types import ShapeProfile, ShapeRange

    extra = ("crop", "classifier", "detect_classify") if two_stage else ()
    for name in ("preprocess", "postprocess", "detector", "detect", *extra):
        shutil.copytree(EXAMPLE / name, repo / name)
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    for name in ("preprocess", "postprocess", "detector", *extra[:2]):
        config = repo / name / "config.pbtxt"
        lines = [line for line in config.read_text().splitlines()
                 if not line.startswith(("instance_group", "platform"))]
        config.write_text("\n".join(lines) + f"\ninstance_group [ {{ count: 2 kind: {kind} }} ]\n")
    started = time.perf_counter()
    sources: dict[str, tuple[Path, dict[str, tuple[int, ...]]]] = {"detector": (DETECTOR, {"images": (3, SIZE, SIZE)})}
    if two_stage:
        classifier = repo / "classifier.onnx"
        _example_module("make_classifier").main([str(classifier)])
        sources["classifier"] = (classifier, {"crops": (MAX_DET, 3, CROP, CROP), "valid": (MAX_DET,)})
    for name, (source, items) in sources.items():
        if device == "cuda":
            profile = ShapeProfile({k: ShapeRange((1, *item), (MAX_BATCH, *item), (MAX_BATCH, *item))
                                    for k, item in items.items()})
            build = streamrt.BuildConfig(backend="torch_inductor", precision=Precision.FP16, profiles=(profile,))
            streamrt.build(source, build, repo / name / "1" / "model.plan", cache_dir=cache)
        else:
            shutil.copy(source, repo / name / "1" / "model.onnx")
    return time.perf_counter() - started


def _example_module(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example12_{name}", EXAMPLE.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def frames(count: int, seed: int = 0) -> tuple[list[np.ndarray], list[bytes]]:
    """``count`` synthetic 640x480 BGR scenes and their JPEG encodings."""
    import cv2

    from streamrt.video.synthetic import SyntheticClip

    clip = SyntheticClip(width=640, height=480, frames=count, seed=seed)
    images = [clip.frame(i) for i in range(count)]
    return images, [bytes(cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()) for im in images]


class InProcessChain:
    """Decode, letterbox, detector, NMS and frame-pixel boxes without a server (the same ops as the steps).

    With a ``classifier`` (the two-stage chain) each box's crop (:func:`streamrt.ops.crop_resize` on
    the letterboxed pixels) is classified too and every box row gets the crop's class scores appended
    (``[count, 6 + classes]``)."""

    def __init__(self, plan_or_onnx: Path, device: str, classifier: Path | None = None) -> None:
        import streamrt
        from streamrt.ops import PostprocessConfig

        self.device = device
        self.engine = streamrt.open(plan_or_onnx, max_batch=MAX_BATCH)
        self.context = self.engine.create_context()
        self.classifier = streamrt.open(classifier, max_batch=MAX_BATCH) if classifier is not None else None
        self.classifier_context = self.classifier.create_context() if self.classifier is not None else None
        self.config = PostprocessConfig(conf=0.25, iou=0.45, max_det=100, pre_nms_topk=1024)
        self._letterbox: dict[tuple[int, int], Any] = {}
        self._post: dict[int, Any] = {}
        if device == "cuda":
            import torch

            self.stream = torch.cuda.Stream()

    def close(self) -> None:
        self.engine.close()
        if self.classifier is not None:
            self.classifier.close()

    def _classify(self, pixels: Any, dets: Any, counts: Any) -> Any:
        """The classifier's scores [n, MAX_DET, classes] of the crops of ``dets`` (letterbox pixels)."""
        import torch

        from streamrt.ops import crop_resize

        assert self.classifier_context is not None
        pixels, dets, counts = (torch.as_tensor(t) for t in (pixels, dets, counts))
        crops = crop_resize(pixels, dets[..., :4], counts, (CROP, CROP))
        valid = (torch.arange(dets.shape[1], device=dets.device).view(1, -1) < counts.view(-1, 1)).float()
        if self.device == "cuda":
            out = self.classifier_context.infer({"crops": crops, "valid": valid}, self.stream)["scores"]
            return out if isinstance(out, torch.Tensor) else torch.as_tensor(out, device="cuda")
        return np.asarray(self.classifier_context.infer({"crops": crops.numpy(), "valid": valid.numpy()})["scores"])

    def __call__(self, jpegs: list[bytes]) -> list[np.ndarray]:
        import cv2

        decoded = [np.asarray(cv2.imdecode(np.frombuffer(j, np.uint8), cv2.IMREAD_COLOR)) for j in jpegs]
        return self._gpu(decoded) if self.device == "cuda" else self._cpu(decoded)

    def _cpu(self, decoded: list[np.ndarray]) -> list[np.ndarray]:
        from streamrt.ops import CpuLetterbox, CpuPostprocess

        n = len(decoded)
        pixels = np.empty((n, 3, SIZE, SIZE), np.float32)
        ops = [self._letterbox.setdefault(f.shape[:2], CpuLetterbox(f.shape[:2], (SIZE, SIZE))) for f in decoded]
        for i, (op, frame) in enumerate(zip(ops, decoded, strict=True)):
            op(frame, pixels[i])
        raw = np.asarray(self.context.infer({"images": pixels})["output0"])
        dets, counts = np.empty((n, self.config.max_det, 6), np.float32), np.empty(n, np.int32)
        CpuPostprocess(self.config, "yolov8", CLASSES)(raw, dets, counts)
        scores = self._classify(pixels, dets, counts) if self.classifier is not None else None
        out = []
        for i, op in enumerate(ops):
            boxes = dets[i, : counts[i]].copy()
            op.geometry.to_source(boxes[:, :4])
            out.append(boxes if scores is None else np.concatenate([boxes, scores[i, : counts[i]]], axis=1))
        return out

    def _gpu(self, decoded: list[np.ndarray]) -> list[np.ndarray]:
        import torch

        from streamrt.ops import TorchLetterbox, TorchPostprocess

        n = len(decoded)
        with torch.cuda.stream(self.stream):
            pixels = torch.empty((n, 3, SIZE, SIZE), dtype=torch.float32, device="cuda")
            ops = []
            for i, frame in enumerate(decoded):
                op = self._letterbox.get(frame.shape[:2])
                if op is None:
                    op = self._letterbox[frame.shape[:2]] = TorchLetterbox(frame.shape[:2], (SIZE, SIZE),
                                                                           device="cuda")
                op(torch.from_numpy(frame).pin_memory().cuda(non_blocking=True), pixels[i])
                ops.append(op)
            raw = self.context.infer({"images": pixels}, self.stream)["output0"]
            raw = raw if isinstance(raw, torch.Tensor) else torch.as_tensor(raw, device="cuda")
            post = self._post.get(n) or self._post.setdefault(
                n, TorchPostprocess(self.config, "yolov8", CLASSES, int(raw.shape[2]), batch=MAX_BATCH, device="cuda"))
            dets = torch.empty((n, self.config.max_det, 6), dtype=torch.float32, device="cuda")
            counts = torch.empty(n, dtype=torch.int32, device="cuda")
            post(raw.float(), dets, counts)
            scores = self._classify(pixels, dets, counts).float().cpu() if self.classifier is not None else None
            host_dets, host_counts = dets.cpu(), counts.cpu()  # synchronises the stream
        out = []
        for i, op in enumerate(ops):
            k = int(host_counts[i])
            boxes = host_dets[i, :k].numpy().copy()
            op.geometry.to_source(boxes[:, :4])
            out.append(boxes if scores is None else np.concatenate([boxes, scores[i, :k].numpy()], axis=1))
        return out


def time_in_process(chain: InProcessChain, jpegs: list[bytes], batch: int, seconds: float) -> dict[str, Any]:
    """Loop over the frames ``batch`` at a time for ``seconds``: frames/s and per-call latency."""
    for i in range(3):  # warm-up (letterbox and NMS ops, CUDA graphs)
        chain(jpegs[i * batch:(i + 1) * batch] or jpegs[:batch])
    latencies, done, i = [], 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        chunk = [jpegs[(i + k) % len(jpegs)] for k in range(batch)]
        t0 = time.perf_counter()
        chain(chunk)
        latencies.append(time.perf_counter() - t0)
        done += batch
        i += batch
    elapsed = time.perf_counter() - start
    return _row(f"in-process, {batch} frame{'s' if batch > 1 else ''} per call", done, elapsed, latencies, 0)


def time_served(url: str, jpegs: list[bytes], concurrency: int, seconds: float,
                model: str = "detect") -> dict[str, Any]:
    """``concurrency`` gRPC client threads, one frame per request, for ``seconds``."""
    import tritonclient.grpc as grpcclient

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client(offset: int) -> None:
        c = grpcclient.InferenceServerClient(url)
        mine: list[float] = []
        k = offset
        while time.perf_counter() < stop:
            item = grpcclient.InferInput("IMAGE", [1, 1], "BYTES")
            item.set_data_from_numpy(np.array([[jpegs[k % len(jpegs)]]], dtype=np.object_))
            t0 = time.perf_counter()
            try:
                c.infer(model, [item])
                mine.append(time.perf_counter() - t0)
            except Exception:
                with lock:
                    errors[0] += 1
            k += concurrency
        c.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return _row(f"served ensemble {model}, gRPC, concurrency {concurrency}, 1 frame per request", len(latencies),
                elapsed, latencies, errors[0])


def _row(name: str, frames_done: int, elapsed: float, latencies: list[float], errors: int) -> dict[str, Any]:
    ms = np.asarray(latencies) * 1e3 if latencies else np.zeros(1)
    return {"variant": name, "frames": frames_done, "seconds": round(elapsed, 2),
            "frames_per_s": round(frames_done / elapsed, 1), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "errors": errors}


def check_served(url: str, chain: InProcessChain, jpegs: list[bytes], model: str = "detect",
                 score_atol: float = 1e-3) -> int:
    """The served boxes (and class scores) of a few frames against the in-process chain's; returns the
    frames checked."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url)
    try:
        for jpeg in jpegs[:8]:
            item = grpcclient.InferInput("IMAGE", [1, 1], "BYTES")
            item.set_data_from_numpy(np.array([[jpeg]], dtype=np.object_))
            result = c.infer(model, [item])
            n = int(result.as_numpy("COUNT")[0, 0])
            served = result.as_numpy("DETECTIONS")[0, :n]
            expected = chain([jpeg])[0]
            if n != len(expected) or not np.allclose(served[:, :4], expected[:, :4], atol=1.0):
                raise SystemExit(f"served detections differ from the in-process chain: {n} vs {len(expected)} boxes")
            if model == "detect_classify":
                scores = result.as_numpy("SCORES")[0]
                if not np.allclose(scores[:n], expected[:, 6:], atol=score_atol) or scores[n:].any():
                    worst = float(np.abs(scores[:n] - expected[:, 6:]).max()) if n else 0.0
                    raise SystemExit(f"served class scores differ from the in-process chain by {worst:.2e} "
                                     f"(> {score_atol:g}) or padded rows are not zero")
    finally:
        c.close()
    return min(8, len(jpegs))


def _start_server(repo: Path, grpc_port: int, http_port: int) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    server = subprocess.Popen(
        [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http_port),
         "--grpc-port", str(grpc_port), "--metrics-port", "-1", "--log-level", "WARNING"],
        env={**os.environ, "PYTHONPATH": path})
    try:
        _serving_frontend().wait_ready(http_port, 300, server)
    except SystemExit:
        server.terminate()
        raise
    return server


def _device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return str(torch.cuda.get_device_name())
    return f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"


def write_report(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    two_stage = meta.get("two_stage", False)
    title = "Two-stage ensemble (detector -> crops -> classifier)" if two_stage else "Detection ensemble"
    lines = [f"# {title} served vs in-process ({meta['device']})", "",
             f"- date: {meta['date']}", f"- commit: {meta['commit']}", f"- device: {meta['device_name']}",
             f"- command: `{meta['command']}`",
             f"- frames: {meta['frames']} synthetic 640x480 JPEG scenes; detector: bundled shapes detector "
             f"({meta['detector']}), built in {meta['build_s']:.1f} s; served answers checked against the "
             f"in-process chain on {meta['checked']} frames (same count, boxes within 1 px"
             + (f", class scores within {meta['score_atol']:g})" if two_stage else ")"), "",
             "| variant | frames/s | p50 ms | p99 ms | frames | errors |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['frames_per_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['frames']} "
              f"| {r['errors']} |" for r in rows]
    base = out / f"detection-{'two-stage' if two_stage else 'ensemble'}-{meta['device']}"
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return base.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--seconds", type=float, default=10.0, help="per variant")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch", type=int, default=MAX_BATCH, help="frames per in-process call (second loop)")
    parser.add_argument("--frames", type=int, default=64, help="distinct frames cycled through")
    parser.add_argument("--two-stage", action="store_true",
                        help="the two-stage ensemble detect_classify (detector -> crops -> classifier)")
    args = parser.parse_args(argv)
    model = "detect_classify" if args.two_stage else "detect"
    score_atol = 2e-2 if args.device == "cuda" else 1e-3  # fp16 plans on CUDA
    args.out.mkdir(parents=True, exist_ok=True)
    from streamrt.profiling.provenance import git_commit

    work = Path(tempfile.mkdtemp(prefix="detens-"))
    server = None
    chain = None
    try:
        repo = work / "repo"
        cache = Path(os.environ.get("STREAMRT_CACHE", work / "cache"))
        build_s = make_repository(repo, args.device, cache, args.two_stage)
        print(f"detector ready in {build_s:.1f} s", flush=True)
        _, jpegs = frames(args.frames)
        plan = next((repo / "detector" / "1").glob("model.*"))
        classifier = next((repo / "classifier" / "1").glob("model.*")) if args.two_stage else None
        chain = InProcessChain(plan, args.device, classifier)
        rows: list[dict[str, Any]] = []
        run: list[Callable[[], dict[str, Any]]] = [
            lambda: time_in_process(chain, jpegs, 1, args.seconds),
            lambda: time_in_process(chain, jpegs, args.batch, args.seconds)]
        for job in run:
            rows.append(job())
            print(rows[-1], flush=True)
        sf = _serving_frontend()
        grpc_port, http_port = sf.free_port(), sf.free_port()
        server = _start_server(repo, grpc_port, http_port)
        checked = check_served(f"127.0.0.1:{grpc_port}", chain, jpegs, model, score_atol)
        time_served(f"127.0.0.1:{grpc_port}", jpegs, args.concurrency, min(2.0, args.seconds), model)  # warm-up
        rows.append(time_served(f"127.0.0.1:{grpc_port}", jpegs, args.concurrency, args.seconds, model))
        print(rows[-1], flush=True)
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "commit": os.environ.get("STREAMRT_COMMIT") or git_commit(ROOT), "device": args.device,
                "device_name": _device_name(args.device), "command": shlex.join([sys.argv[0], *(argv or sys.argv[1:])]),
                "frames": args.frames, "build_s": build_s, "checked": checked, "two_stage": args.two_stage,
                "score_atol": score_atol,
                "detector": ("torch_inductor fp16 plan" if args.device == "cuda" else "ONNX Runtime CPU, fp32")
                + (", the crop classifier the same" if args.two_stage else "")}
        print(write_report(args.out, meta, rows).read_text())
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
        if chain is not None:
            chain.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
