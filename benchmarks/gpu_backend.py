"""GPU backend benchmark: StreamRT torch_inductor plans against PyTorch eager and ONNX Runtime CPU.

Side by side in one run, on fresh random inputs, timed with CUDA events after warm-up (median
of many runs):

* ResNet-50 (torchvision architecture, random weights), batch 32 and batch 1: PyTorch eager
  fp32 / fp16, StreamRT plans built from the nn.Module (fp32, fp16, fp16 + CUDA graphs);
  build and load times.
* The YOLO-style detector from ``streamrt.testing.yolo`` at 640x640, same variants.
* Accuracy through the ONNX path: ``resnet_like(18)`` ONNX -> plans (fp32, fp16) against
  ONNX Runtime CPU fp32, relative L2 error.

Usage: python benchmarks/gpu_backend.py OUTDIR [PARTS]   (writes OUTDIR/gpu-backend[-PARTS].md and .json)
PARTS: comma-separated subset of onnx,resnet50,yolo (default: all), each optionally with its
precisions, e.g. ``resnet50:fp32+fp16,yolo:fp16`` (default: fp32+fp16).
Needs a CUDA GPU (and torchvision for resnet50). A part that fails is a ``FAILED`` row and the next
part runs; the files are rewritten after every part.
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import streamrt
from streamrt.building.module_builder import build_module
from streamrt.config import BuildConfig
from streamrt.profiling.provenance import git_commit
from streamrt.types import ShapeProfile, ShapeRange


def cuda_median_ms(fn: Callable[[torch.Tensor], Any], inputs: list[torch.Tensor], runs: int = 50) -> float:
    """Median of CUDA-event times of ``fn`` on rotating inputs, after warm-up, on a side stream."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(5):
            fn(inputs[i % len(inputs)])
        stream.synchronize()
        times = []
        for i in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn(inputs[i % len(inputs)])
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    return float(np.median(times))


def ort_cpu_session(net: torch.nn.Module, shape: tuple[int, ...], path: Path) -> Any:
    """The same module exported to ONNX (TorchScript exporter, dynamic batch) in an ONNX Runtime CPU session."""
    import onnxruntime as ort

    example = torch.randn(2, *shape)
    device = next(net.parameters()).device
    cpu_net = net.float().cpu().eval()
    with torch.no_grad():
        torch.onnx.export(cpu_net, (example,), str(path), input_names=["images"], output_names=["out"],
                          dynamic_axes={"images": {0: "N"}, "out": {0: "N"}}, opset_version=17, dynamo=False)
    net.to(device)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def ort_cpu_median_ms(session: Any, inputs: list[np.ndarray], runs: int = 7) -> float:
    """Median host time of ONNX Runtime CPU runs (after one warm-up), rotating over the inputs."""
    session.run(None, {"images": inputs[0]})
    times = []
    for i in range(runs):
        start = time.perf_counter()
        session.run(None, {"images": inputs[i % len(inputs)]})
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))


def model_rows(
    name: str,
    net: torch.nn.Module,
    shape: tuple[int, ...],
    batches: tuple[int, ...],
    tmp: Path,
    precisions: tuple[str, ...] = ("fp32", "fp16"),
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    net = net.eval().cuda()
    big = max(batches)
    profile = ShapeProfile({"images": ShapeRange((1, *shape), (big, *shape), (big, *shape))})
    plans = {}
    for precision in precisions:
        cfg = BuildConfig(
            backend="torch_inductor",
            precision=precision,
            profiles=(profile,),
            backend_options={"device": "cuda", "freezing": True},
        )
        t0 = time.perf_counter()
        plans[precision] = build_module(
            net,
            [torch.randn(big, *shape, device="cuda")],
            tmp / f"{name}-{precision}.plan",
            cfg,
            input_names=["images"],
            output_names=["out"],
        ).path
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        streamrt.load(plans[precision])
        rows.append(
            {"model": name, "variant": f"build {precision}", "build_s": build_s, "load_s": time.perf_counter() - t0}
        )
    half = {"fp32": torch.float32, "fp16": torch.float16}
    ort_session = ort_cpu_session(net, shape, tmp / f"{name.replace(' ', '_')}.onnx")
    for batch in batches:
        inputs = [torch.randn(batch, *shape, device="cuda") for _ in range(4)]
        ref = None
        results: dict[str, float] = {}
        with torch.no_grad():
            for precision, dtype in half.items():
                eager = net.to(dtype)
                results[f"eager {precision}"] = cuda_median_ms(lambda x, m=eager, d=dtype: m(x.to(d)), inputs)
                out = eager(inputs[0].to(dtype)).float()
                if precision == "fp32":
                    ref = out
            net.float()
            for precision in precisions:
                engine = streamrt.load(plans[precision])
                for graphs in (False, True):
                    ctx = engine.create_context(cuda_graph=graphs)
                    label = f"plan {precision}{' + CUDA graphs' if graphs else ''}"
                    results[label] = cuda_median_ms(lambda x, c=ctx: c.infer({"images": x}), inputs)
                    got = ctx.infer({"images": inputs[0]})["out"].float()
                    torch.cuda.synchronize()
                    assert ref is not None
                    err = float((got - ref).norm() / ref.norm())
                    rows.append(
                        {
                            "model": name,
                            "batch": batch,
                            "variant": label,
                            "ms": results[label],
                            "rel_l2_vs_eager_fp32": err,
                        }
                    )
        results["onnxruntime CPU fp32"] = ort_cpu_median_ms(ort_session, [x.cpu().numpy() for x in inputs])
        for label in ("eager fp32", "eager fp16", "onnxruntime CPU fp32"):
            rows.append({"model": name, "batch": batch, "variant": label, "ms": results[label]})
        base32, base16 = results["eager fp32"], results["eager fp16"]
        for row in rows:
            if row.get("batch") == batch and row["model"] == name and "ms" in row:
                row["items_per_s"] = batch / row["ms"] * 1e3
                row["x_eager_fp32"] = base32 / row["ms"]
                row["x_eager_fp16"] = base16 / row["ms"]
    return rows


def onnx_accuracy(tmp: Path, precisions: tuple[str, ...] = ("fp32", "fp16")) -> list[dict[str, Any]]:
    import onnx
    import onnxruntime as ort

    from streamrt.testing.models import resnet_like

    path = tmp / "resnet18_like.onnx"
    onnx.save(resnet_like(18), str(path))
    x = np.random.default_rng().standard_normal((4, 3, 224, 224)).astype(np.float32)
    t0 = time.perf_counter()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = session.run(None, {"images": x})[0]
    ort_ms = (time.perf_counter() - t0) * 1e3
    rows = [
        {"model": "resnet18_like (ONNX)", "variant": "onnxruntime CPU fp32", "batch": 4, "host_ms_first_run": ort_ms}
    ]
    profile = ShapeProfile({"images": ShapeRange((1, 3, 224, 224), (4, 3, 224, 224), (8, 3, 224, 224))})
    for precision in precisions:
        cfg = BuildConfig(
            backend="torch_inductor", precision=precision, profiles=(profile,), backend_options={"device": "cuda"}
        )
        t0 = time.perf_counter()
        plan = streamrt.build(path, cfg, tmp / f"r18-{precision}.plan", cache=False).path
        build_s = time.perf_counter() - t0
        got = streamrt.load(plan).create_context().infer({"images": torch.from_numpy(x).cuda()})["logits"]
        rows.append(
            {
                "model": "resnet18_like (ONNX)",
                "variant": f"plan {precision} via importer",
                "batch": 4,
                "build_s": build_s,
                "rel_l2_vs_ort_fp32": rel_l2(got.float().cpu().numpy(), ref),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "out/gpu-backend")
    spec = argv[1] if len(argv) > 1 else "onnx,resnet50,yolo"
    parts: dict[str, tuple[str, ...]] = {}
    for item in spec.split(","):
        name, _, precs = item.partition(":")
        parts[name] = tuple(precs.split("+")) if precs else ("fp32", "fp16")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    suffix = "-" + "-".join(parts)  # part names only
    failed: list[str] = []

    def resnet50(tmp: Path, precisions: tuple[str, ...]) -> list[dict[str, Any]]:
        import torchvision

        return model_rows("resnet50", torchvision.models.resnet50(), (3, 224, 224), (1, 32), tmp, precisions)

    def yolo(tmp: Path, precisions: tuple[str, ...]) -> list[dict[str, Any]]:
        from streamrt.testing.yolo import yolo_like

        return model_rows("yolo_like 640", yolo_like(num_classes=80), (3, 640, 640), (1, 8), tmp, precisions)

    runners: dict[str, Callable[[Path, tuple[str, ...]], list[dict[str, Any]]]] = {
        "onnx": onnx_accuracy, "resnet50": resnet50, "yolo": yolo}
    with tempfile.TemporaryDirectory() as tmp:
        for name, precisions in parts.items():
            # Each part handles its own failure and the report is rewritten after every part: one crash (a
            # renamed API, a missing package) must not lose the other parts' numbers.
            try:
                if name not in runners:
                    raise KeyError(f"unknown part {name!r} (choose from {', '.join(runners)})")
                rows += runners[name](Path(tmp), precisions)
            except Exception as exc:
                traceback.print_exc()
                failed.append(name)
                message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300].replace("|", "/")
                rows.append({"model": name, "variant": f"FAILED ({message})"})
            _write(out, suffix, spec, rows)
    print((out / f"gpu-backend{suffix}.md").read_text())
    return 1 if failed else 0


def _write(out: Path, suffix: str, spec: str, rows: list[dict[str, Any]]) -> None:
    """The markdown table and JSON of every row so far."""
    commit = git_commit()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
    header = [
        "# GPU backend benchmark (torch_inductor plans vs PyTorch eager vs ONNX Runtime CPU)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- commit: {commit}",
        f"- device: {device}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"python {platform.python_version()}",
        f"- command: `python benchmarks/gpu_backend.py OUTDIR {spec}`",
        "- timing: CUDA events on a side stream after 5 warm-up runs, median of 50, 4 rotating random inputs; "
        "ONNX Runtime CPU: host clock, median of 7 runs after one warm-up",
        "",
        "| model | batch | variant | median ms | items/s | x eager fp32 | x eager fp16 | rel. L2 err "
        "| build s | load s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else ""

    lines = [
        f"| {r['model']} | {r.get('batch', '')} | {r['variant']} | {f(r.get('ms'), '.3f')} "
        f"| {f(r.get('items_per_s'), '.0f')} "
        f"| {f(r.get('x_eager_fp32'), '.2f')} | {f(r.get('x_eager_fp16'), '.2f')} "
        f"| {f(r.get('rel_l2_vs_eager_fp32', r.get('rel_l2_vs_ort_fp32')), '.2e')} "
        f"| {f(r.get('build_s'), '.1f')} | {f(r.get('load_s'), '.3f')} |"
        for r in rows
    ]
    text = "\n".join(header + lines) + "\n"
    (out / f"gpu-backend{suffix}.md").write_text(text)
    (out / f"gpu-backend{suffix}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
