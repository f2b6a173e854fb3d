"""``streamrt inspect MODEL.onnx|PLAN``: IO, profiles, op histogram, precision and provenance."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from streamrt.cli._optimization import optimization_lines
from streamrt.plan import is_plan_file
from streamrt.types import format_shape

__all__ = ["describe", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show IO tensors, profiles, op histogram, precision and build provenance",
        description="Describe an ONNX model or a plan file.",
    )
    parser.add_argument("path", type=Path, help="ONNX model or plan")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--layers", action="store_true", help="load the plan and add the backend's per-layer engine information"
    )
    parser.set_defaults(func=run)


def describe(path: Path) -> dict[str, Any]:
    """What ``inspect --json`` prints: the model's description, or the plan's manifest."""
    if is_plan_file(path):
        from streamrt.plan import read_plan

        plan = read_plan(path)  # verifies the checksum: inspect reports broken plans too
        info = {
            "kind": "plan",
            "path": str(path),
            "size_bytes": path.stat().st_size,
            **plan.manifest.to_dict(),
        }
        from streamrt.backends import get_backend
        from streamrt.errors import MissingDependencyError

        try:
            info.update(get_backend(plan.manifest.backend).describe_payload(plan.payload))
        except MissingDependencyError as exc:
            # The manifest needs no backend library: show it, and say what running the plan takes.
            from streamrt.running.runtime import requirements_error

            info["runnable_here"] = str(requirements_error(plan.manifest, path, exc))
        return info
    from streamrt.onnx.model import load_model

    return load_model(path).describe()


def _io_lines(title: str, tensors: list[dict[str, Any]]) -> list[str]:
    lines = [f"{title}:"]
    for t in tensors:
        lines.append(f"  {t['name']:<24} {t['dtype']:<9} {format_shape(t['shape'])}")
    return lines


def _text(info: dict[str, Any]) -> str:
    lines: list[str] = []
    if info["kind"] == "plan":
        lines.append(f"plan {info['path']} ({info['size_bytes'] / 2**20:.2f} MiB)")
        lines.append(f"  backend      {info['backend']} {info['backend_version']}")
        lines.append(f"  precision    {info['precision']}")
        lines.append(f"  device       {', '.join(f'{k}={v}' for k, v in info['device'].items())}")
        lines.append(f"  source       {info['source_name']} (sha256 {info['source_sha256'][:16]}…)")
        lines.append(f"  created      {info['created_at']} by streamrt {info['streamrt_version']}")
        lines.append(f"  runtime      {', '.join(f'{k} {v}' for k, v in info['runtime_versions'].items())}")
        lines.append(f"  rebuild      {info['build_command']}")
        lines += optimization_lines(info.get("build_settings", {}))
        if "runnable_here" in info:
            lines.append(f"  cannot run here: {info['runnable_here']}")
    else:
        lines.append(f"onnx model {info['path']}")
        lines.append(f"  opset {info['opset']}, ir {info['ir_version']}, producer {info['producer'] or '?'}")
        lines.append(f"  sha256 {info['sha256']}")
    lines += _io_lines("inputs", info["inputs"]) + _io_lines("outputs", info["outputs"])
    lines += _precision_lines(info.get("precision_report") or {})
    for i, profile in enumerate(info.get("profiles", [])):
        lines.append(f"profile {i}:")
        for name, r in profile.items():
            lines.append(
                f"  {name:<24} min {format_shape(r['min'])}  opt {format_shape(r['opt'])}  "
                f"max {format_shape(r['max'])}"
            )
    hist = info.get("op_histogram") or {}
    if hist:
        lines.append(f"ops ({sum(hist.values())} nodes):")
        lines += [f"  {op:<28} {count}" for op, count in hist.items()]
    layers = info.get("layers")
    if isinstance(layers, dict):
        rows = layers.get("layers", [])
        lines.append(f"layers ({len(rows)}):")
        lines += [f"  {row.get('name', '?'):<40} {row.get('type', '')}" for row in rows]
    elif layers:
        lines.append(f"layers: {layers}")
    return "\n".join(lines)


def _precision_lines(record: dict[str, Any]) -> list[str]:
    """What the precision transform kept in fp32, the accuracy vs fp32 and (int8) the speed."""
    if not record:
        return []
    from streamrt.measure.accuracy import AccuracyReport

    lines = []
    kept = record.get("kept_nodes", [])
    if "kept_by_op_type" in record:
        lines.append(f"kept in fp32: {len(kept)} node(s) by value range, {record['kept_by_op_type']} by op type")
        lines += [f"  {k['name']:<24} {k['op_type']:<18} {k['reason']}" for k in kept]
    sensitivity = record.get("sensitivity")
    if sensitivity:
        layers = sensitivity.get("kept_layers", [])
        met = "met" if sensitivity.get("met") else "NOT met"
        lines.append(f"int8 target {sensitivity.get('target')} {met}: {len(layers)} layer(s) kept in fp32")
        lines += [f"  {k['name']:<24} {k['op_type']:<18} cosine {k['cosine_alone']:.5f} alone" for k in layers]
    lines += [f"int8 note: {note}" for note in record.get("notes", [])]
    accuracy = record.get("accuracy")
    if accuracy:
        lines += AccuracyReport.from_dict(accuracy).lines()
        if "passed" in accuracy:
            verdict = "pass" if accuracy["passed"] else "MISS: " + "; ".join(accuracy.get("violations", [])[:3])
            lines.append(f"  gate {accuracy.get('threshold')}: {verdict}")
        lines += _random_inputs_lines(accuracy)
    speed = record.get("speed") or {}
    if "speedup" in speed:
        rounds = f", median of {speed['rounds']} interleaved rounds" if "rounds" in speed else ""
        noisy = ", NOISY: the rounds disagreed" if speed.get("noisy") else ""
        times = f"{speed['low_ms']:.3f} ms vs fp32 {speed['fp32_ms']:.3f} ms"
        lines.append(f"speed: {times} ({speed['speedup']:.2f}x{rounds}{noisy})")
        verdict_line = (speed.get("verdict") or {}).get("line")
        if verdict_line:
            lines.append(f"  verdict: {verdict_line}")
    return lines


def _random_inputs_lines(accuracy: dict[str, Any]) -> list[str]:
    """The gate's random-inputs warning (plans built before it was recorded: from the inputs label)."""
    if accuracy.get("real_data", not str(accuracy.get("inputs", "")).startswith("random inputs")):
        return []
    warning = accuracy.get("warning")
    if not warning:
        from streamrt.building.accuracy_gate import random_inputs_warning

        warning = random_inputs_warning(int(accuracy.get("samples", 0)))
    return [f"  {warning}"]


def run(args: argparse.Namespace) -> int:
    from streamrt.cli.common import require_file

    require_file(args.path)
    info = describe(args.path)
    if args.layers and info["kind"] == "plan":
        import streamrt

        layers = streamrt.load(args.path).inspect_layers()
        info["layers"] = layers if layers is not None else f"backend '{info['backend']}' reports no layer information"
    print(json.dumps(info, indent=2) if args.json else _text(info))
    return 0
