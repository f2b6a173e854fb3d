"""The architecture zoo: every model at fp32, fp16 and int8, accuracy and speed in one table.

For each architecture (torchvision / timm networks with random weights where those import, and the
test zoo's own networks from ``streamrt.testing.zoo``), in one run:

1. export to ONNX at the opset the table names (11-17, TorchScript exporter, dynamic batch);
2. build plans in parallel worker processes: the GPU backend (torch_inductor) at fp32 and fp16
   (with the build's accuracy gate), and ONNX Runtime CPU at fp32 and int8 (calibrated on random
   data: an int8 accuracy floor, not what real calibration data gives);
3. measure on fresh random inputs at one batch size: each plan against ONNX Runtime CPU fp32 on the
   original model (relative L2, cosine, top-1 agreement over the last axis) and its median time
   (CUDA events after warm-up for GPU plans; host clock for CPU plans), beside PyTorch eager fp32
   on the GPU.

Usage:
    python benchmarks/zoo.py OUTDIR [--models a,b] [--device cuda|cpu] [--batch 8] [--workers 4]

Writes OUTDIR/zoo.md (the table, with date, commit, device and command) and OUTDIR/zoo.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import datetime
import json
import multiprocessing
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Arch:
    """One architecture: how to make it, its input shape (without batch) and the opset to export at."""

    name: str
    make: Callable[[], Any]
    shape: tuple[int, ...]
    opset: int
    source: str


def _torchvision(name: str, **kwargs: Any) -> Callable[[], Any]:
    def make() -> Any:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs)

    return make


def _timm(name: str) -> Callable[[], Any]:
    def make() -> Any:
        import timm

        return timm.create_model(name, pretrained=False)

    return make


def _zoo(name: str) -> Callable[[], Any]:
    def make() -> Any:
        from streamrt.testing import zoo

        return zoo.MODELS[name].make()

    return make


def architectures() -> list[Arch]:
    """The public architectures (when their packages import) and the test zoo's networks."""
    archs = [
        Arch("resnet18", _torchvision("resnet18"), (3, 224, 224), 11, "torchvision"),
        Arch("mobilenet_v3_large", _torchvision("mobilenet_v3_large"), (3, 224, 224), 13, "torchvision"),
        Arch("efficientnet_b0", _torchvision("efficientnet_b0"), (3, 224, 224), 15, "torchvision"),
        Arch("vit_tiny_patch16_224", _timm("vit_tiny_patch16_224"), (3, 224, 224), 17, "timm"),
        Arch("convnext_atto", _timm("convnext_atto"), (3, 224, 224), 17, "timm"),
    ]
    try:
        from streamrt.testing import zoo
    except ImportError:
        return archs
    for i, (name, spec) in enumerate(sorted(zoo.MODELS.items())):
        archs.append(Arch(f"zoo:{name}", _zoo(name), tuple(spec.example_shape[1:]), 11 + (i % 7),
                           "streamrt.testing.zoo"))
    return archs


def _available(arch: Arch) -> bool:
    try:
        arch.make()
    except Exception:
        return False
    return True


def realistic(arch: Arch) -> Any:
    """The network with random weights and batch-norm statistics measured on random images
    (:func:`streamrt.testing.zoo.measure_batch_norm` says why)."""
    import torch

    from streamrt.testing.zoo import measure_batch_norm

    torch.manual_seed(0)
    return measure_batch_norm(arch.make(), arch.shape)


def export(arch: Arch, path: Path) -> Path:
    import torch

    net = realistic(arch)
    example = torch.randn(2, *arch.shape)
    with torch.no_grad():
        out = net(example)
    outputs = ["out"] if isinstance(out, torch.Tensor) else [f"out{i}" for i in range(len(out))]
    axes = {"images": {0: "N"}, **{o: {0: "N"} for o in outputs}}
    with torch.no_grad():
        torch.onnx.export(net, (example,), str(path), input_names=["images"], output_names=outputs,
                          dynamic_axes=axes, opset_version=arch.opset, dynamo=False)
    return path


@dataclass(frozen=True)
class Job:
    """One plan to build: model, backend, precision."""

    arch: str
    onnx: str
    backend: str
    precision: str
    shape: tuple[int, ...]
    batch: int
    device: str
    out: str


def build_job(job: Job) -> dict[str, Any]:
    """Build one plan in a worker process; returns the timing and the gate's report, or the error."""
    import streamrt
    from streamrt.config import BuildConfig
    from streamrt.types import ShapeProfile, ShapeRange

    shape = job.shape
    profile = ShapeProfile({"images": ShapeRange((1, *shape), (job.batch, *shape), (max(16, job.batch), *shape))})
    options: dict[str, Any] = {"device": job.device} if job.backend == "torch_inductor" else {}
    fields: dict[str, Any] = {"backend": job.backend, "precision": job.precision, "profiles": (profile,),
                              "backend_options": options}
    if job.precision == "int8":
        calib = Path(job.out).with_suffix(".calib")
        calib.mkdir(exist_ok=True)
        rng = np.random.default_rng(1)
        for i in range(8):
            np.savez(calib / f"{i}.npz", images=rng.standard_normal((4, *shape)).astype(np.float32))
        from streamrt.config import CalibrationConfig

        fields["calibration"] = CalibrationConfig(data=calib)
    started = time.perf_counter()
    lines: list[str] = []
    try:
        result = streamrt.build(job.onnx, BuildConfig(**fields), job.out, cache=False, progress=lines.append)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300], "log": lines,
                "trace": traceback.format_exc()[-2000:]}
    manifest = result.manifest
    facts = getattr(manifest, "to_dict", lambda: {})()
    return {"ok": True, "seconds": time.perf_counter() - started, "log": lines,
            "accuracy": (facts.get("precision_report") or {}).get("accuracy") if isinstance(facts, dict) else None}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a64) * np.linalg.norm(b64)
    return float(a64 @ b64 / denom) if denom else float("nan")


def rel_l2(test: np.ndarray, ref: np.ndarray) -> float:
    ref64 = ref.astype(np.float64)
    return float(np.linalg.norm(test.astype(np.float64) - ref64) / max(np.linalg.norm(ref64), 1e-30))


def top1(test: np.ndarray, ref: np.ndarray) -> float | None:
    if ref.ndim < 2 or ref.shape[-1] < 2:
        return None
    return float(np.mean(np.argmax(test, axis=-1) == np.argmax(ref, axis=-1)))


def host_median_ms(fn: Callable[[], Any], runs: int = 15) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def cuda_median_ms(fn: Callable[[Any, Any], Any], inputs: list[Any], runs: int = 50) -> float:
    """Median CUDA-event time of ``fn(stream)`` on a side stream after warm-up."""
    import torch

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(10):
            fn(inputs[i % len(inputs)], stream)
        stream.synchronize()
        times = []
        for i in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn(inputs[i % len(inputs)], stream)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    return float(np.median(times))


def run_plan(path: Path, feeds: list[np.ndarray], on_gpu: bool) -> tuple[dict[str, np.ndarray], float]:
    """One plan's outputs on ``feeds[0]`` (as fp32 host arrays) and its median time over the feeds."""
    import streamrt

    with streamrt.load(path) as engine:
        ctx = engine.create_context()
        if on_gpu:
            import torch

            dev_inputs = [{"images": torch.from_numpy(f).cuda()} for f in feeds]
            outs = {n: v.float().cpu().numpy() for n, v in ctx.infer(dev_inputs[0]).items()}
            return outs, cuda_median_ms(lambda x, s: ctx.infer(x, s), dev_inputs)
        outs = {n: np.asarray(v, dtype=np.float32) for n, v in ctx.infer({"images": feeds[0]}).items()}
        return outs, host_median_ms(lambda: ctx.infer({"images": feeds[1]}))


def measure(arch: Arch, onnx_path: Path, plans: dict[str, Path], batch: int, device: str) -> list[dict[str, Any]]:
    """Accuracy vs ONNX Runtime CPU fp32 on fresh random inputs, and the median time of each variant."""
    import onnxruntime as ort

    rng = np.random.default_rng(int(time.time()))
    feeds = [rng.standard_normal((batch, *arch.shape)).astype(np.float32) for _ in range(3)]
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    reference = session.run(None, {"images": feeds[0]})
    rows: list[dict[str, Any]] = [{"variant": "onnxruntime CPU fp32 (reference)",
                                   "ms": host_median_ms(lambda: session.run(None, {"images": feeds[1]}))}]
    for label, path in plans.items():
        on_gpu = label.startswith("torch_inductor") and device == "cuda"
        outs, ms = run_plan(path, feeds, on_gpu)
        worst = min(names, key=lambda n: cosine(outs[n], reference[names.index(n)]))
        ref = reference[names.index(worst)]
        finite = all(np.isfinite(v).all() for v in outs.values())
        rows.append({"variant": label, "ms": ms, "rel_l2": rel_l2(outs[worst], ref) if finite else float("nan"),
                     "cosine": cosine(outs[worst], ref), "top1": top1(outs[worst], ref), "output": worst})
    if device == "cuda":
        import torch

        net = realistic(arch).cuda()
        dev = [torch.from_numpy(f).cuda() for f in feeds]
        with torch.no_grad():
            rows.append({"variant": "PyTorch eager fp32 (GPU)", "ms": cuda_median_ms(lambda x, s: net(x), dev)})
    return rows


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return format(value, spec)


def table(results: dict[str, Any], batch: int) -> str:
    lines = [f"| model | opset | variant | build s | ms (batch {batch}) | images/s | x ORT CPU fp32 | x eager fp32 "
             "| rel. L2 | cosine | top-1 agree | gate |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, entry in results.items():
        if "error" in entry:
            lines.append(f"| {name} | {entry.get('opset', '')} | **failed**: {entry['error']} |||||||||")
            continue
        rows = entry["rows"]
        base = {r["variant"]: r["ms"] for r in rows}
        ort_ms = base.get("onnxruntime CPU fp32 (reference)")
        eager_ms = base.get("PyTorch eager fp32 (GPU)")
        for row in rows:
            build = entry["builds"].get(row["variant"], {})
            gate = build.get("accuracy")
            gate_text = "-" if not gate else ("pass" if gate.get("passed", True) else "FAIL")
            ms = row["ms"]
            lines.append(
                f"| {name} | {entry['opset']} | {row['variant']} | {_fmt(build.get('seconds'), '.1f')} "
                f"| {ms:.3f} | {batch / ms * 1e3:,.0f} | {_fmt(ort_ms / ms if ort_ms else None, '.2f')} "
                f"| {_fmt(eager_ms / ms if eager_ms else None, '.2f')} | {_fmt(row.get('rel_l2'), '.2e')} "
                f"| {_fmt(row.get('cosine'), '.6f')} | {_fmt(row.get('top1'), '.3f')} | {gate_text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--models", default="",
                        help="comma-separated names, e.g. resnet18,zoo:crnn (default: the torchvision/timm ones)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4, help="parallel plan builds")
    parser.add_argument("--precisions", default="fp32,fp16,int8")
    args = parser.parse_args(argv)
    out: Path = args.outdir
    (out / "plans").mkdir(parents=True, exist_ok=True)
    wanted = {m for m in args.models.split(",") if m}
    archs = [a for a in architectures() if (a.name in wanted if wanted else a.source != "streamrt.testing.zoo")]
    archs = [a for a in archs if _available(a)]
    precisions = [p for p in args.precisions.split(",") if p]
    results: dict[str, Any] = {}
    jobs: dict[tuple[str, str], Job] = {}
    onnx_paths: dict[str, Path] = {}
    for arch in archs:
        safe = arch.name.replace(":", "-")
        try:
            onnx_paths[arch.name] = export(arch, out / "plans" / f"{safe}.onnx")
        except Exception as exc:
            results[arch.name] = {"opset": arch.opset, "error": f"export: {type(exc).__name__}: {exc}"[:300]}
            continue
        for precision in precisions:
            backend = "onnxruntime" if precision == "int8" else "torch_inductor"
            label = f"{backend} {precision}"
            jobs[(arch.name, label)] = Job(arch.name, str(onnx_paths[arch.name]), backend, precision, arch.shape,
                                           args.batch, args.device, str(out / "plans" / f"{safe}-{precision}.plan"))
    print(f"exported {len(onnx_paths)} models; building {len(jobs)} plans on {args.workers} workers", flush=True)
    builds: dict[tuple[str, str], dict[str, Any]] = {}
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        pending = {pool.submit(build_job, job): key for key, job in jobs.items()}
        for done in futures.as_completed(pending):
            key = pending[done]
            try:
                builds[key] = done.result()
            except Exception as exc:  # a worker died (e.g. a crash in a native library)
                builds[key] = {"ok": False, "error": f"worker: {type(exc).__name__}: {exc}"[:300]}
            state = "ok" if builds[key]["ok"] else builds[key]["error"]
            print(f"  built {key[0]} {key[1]}: {state}", flush=True)
    for arch in archs:
        if arch.name not in onnx_paths:
            continue
        mine = {label: b for (name, label), b in builds.items() if name == arch.name}
        plans = {label: Path(jobs[(arch.name, label)].out) for label, b in mine.items() if b["ok"]}
        try:
            rows = measure(arch, onnx_paths[arch.name], plans, args.batch, args.device)
        except Exception as exc:
            results[arch.name] = {"opset": arch.opset, "error": f"measure: {type(exc).__name__}: {exc}"[:300]}
            continue
        failed = {label: b["error"] for label, b in mine.items() if not b["ok"]}
        rows += [{"variant": f"{label} (build failed: {err})", "ms": float("nan")} for label, err in failed.items()]
        results[arch.name] = {"opset": arch.opset, "source": arch.source, "rows": rows, "builds": mine}
        print(f"measured {arch.name}", flush=True)
        write_report(out, results, args, argv)  # after each model: a run cut short keeps what it measured
    print(write_report(out, results, args, argv))
    return 0


def write_report(out: Path, results: dict[str, Any], args: argparse.Namespace, argv: list[str] | None) -> str:
    commit = _commit()
    header = (f"# Architecture zoo: accuracy and speed per precision\n\n"
              f"- date: {datetime.date.today()}, commit: {commit}, device: {_device(args.device)}\n"
              f"- command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:] if argv is None else argv)}`"
              "\n"
              f"- accuracy: the worst output of each plan vs ONNX Runtime CPU fp32 on the original ONNX, fresh "
              f"random inputs (batch {args.batch}); int8 calibrated on 32 random-normal samples (a floor); random "
              "weights with batch-norm statistics measured on random images (see `realistic`)\n"
              "- time: median; GPU plans and eager by CUDA events on a side stream after warm-up, CPU by host clock"
              "\n\n")
    text = header + table(results, args.batch) + "\n"
    (out / "zoo.md").write_text(text)
    (out / "zoo.json").write_text(json.dumps(results, indent=1, default=str))
    return text


def _commit() -> str:
    from streamrt.profiling.provenance import git_commit

    return git_commit()


def _device(device: str) -> str:
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return f"{platform.processor() or platform.machine()} CPU"


if __name__ == "__main__":
    sys.exit(main())
