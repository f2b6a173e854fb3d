"""Run ONNX's backend node tests through the importer (used by the conformance script and CI).

The node tests are the ``onnx.backend.test`` cases: one small model per case with input and
expected output arrays. Released onnx wheels do not always ship the generated
``onnx/backend/test/data/node`` directory, so by default the cases are built in memory from
``onnx.backend.test.case.node`` (the same generator ``backend-test-tools generate-data`` writes
that directory with); a directory laid out like ``data/node`` can be given instead.

A case belongs to the op type of its single node; ``*_expanded`` cases (the op's function body
expanded into primitive nodes) belong to the op they expand. Comparison follows the ONNX backend
runner: same dtype and shape, ``allclose`` with the case's rtol/atol for floats (NaNs equal),
exact equality otherwise.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .registry import MIN_OPSET, converter_table

__all__ = ["CaseResult", "NodeCase", "OpSummary", "load_cases", "run_case", "run_cases", "summarize"]

_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclass(frozen=True)
class NodeCase:
    """One backend node test.

    Attributes:
        name: Test name (``test_...``).
        op_type: The op the test belongs to.
        model: The test model.
        data_sets: ``(inputs, expected outputs)`` pairs of NumPy arrays.
        rtol: Relative tolerance for float outputs.
        atol: Absolute tolerance for float outputs.
    """

    name: str
    op_type: str
    model: onnx.ModelProto
    data_sets: tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]
    rtol: float = 1e-3
    atol: float = 1e-7

    @property
    def expanded(self) -> bool:
        return bool(_EXPANDED.search(self.name))

    @property
    def opset(self) -> int:
        return next((int(i.version) for i in self.model.opset_import if i.domain in ("", "ai.onnx")), 0)

    def unsupported_ops(self) -> list[str]:
        """Op types in the model (top level) without a converter."""
        table = converter_table()
        return sorted(
            {n.op_type for n in self.model.graph.node if n.op_type not in table or n.domain not in ("", "ai.onnx")}
        )


@dataclass
class CaseResult:
    """Outcome of one case: ``status`` is ``pass``, ``fail`` or ``excluded``."""

    case: NodeCase
    status: str
    detail: str = ""
    seconds: float = 0.0
    export: str = ""  # "", "pass" or "fail: ..." when the export check ran


@dataclass
class OpSummary:
    """Per-op counts of direct and expanded cases."""

    op_type: str
    passed: int = 0
    failed: int = 0
    excluded: int = 0
    exported: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed


def _to_array(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def _generated_cases() -> Iterator[tuple[str, onnx.ModelProto, list[tuple[Any, Any]], float, float]]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    for case in cases:
        if case.model is None or not case.data_sets:
            continue
        yield case.name, case.model, list(case.data_sets), float(case.rtol), float(case.atol)


def _disk_cases(root: Path) -> Iterator[tuple[str, onnx.ModelProto, list[tuple[Any, Any]], float, float]]:
    for case_dir in sorted(p for p in root.iterdir() if (p / "model.onnx").exists()):
        model = onnx.load(str(case_dir / "model.onnx"))
        data_sets = []
        for data_dir in sorted(case_dir.glob("test_data_set_*")):
            sets = []
            for prefix in ("input", "output"):
                arrays = []
                for pb in sorted(data_dir.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1])):
                    tensor = onnx.TensorProto()
                    tensor.ParseFromString(pb.read_bytes())
                    arrays.append(tensor)
                sets.append(arrays)
            data_sets.append((sets[0], sets[1]))
        yield case_dir.name, model, data_sets, 1e-3, 1e-7


def load_cases(data_dir: str | Path | None = None, ops: Iterable[str] | None = None) -> list[NodeCase]:
    """All node cases (optionally only those of ``ops``), generated or read from ``data_dir``."""
    raw = list(_disk_cases(Path(data_dir)) if data_dir else _generated_cases())
    single_op = {name: model.graph.node[0].op_type for name, model, *_ in raw if len(model.graph.node) == 1}
    wanted = set(ops) if ops is not None else None
    out = []
    for name, model, data_sets, rtol, atol in raw:
        base = _EXPANDED.sub("", name)
        op_type = single_op.get(base) or (model.graph.node[0].op_type if model.graph.node else "?")
        if wanted is not None and op_type not in wanted:
            continue
        sets = tuple(
            (tuple(_to_array(v) for v in inputs), tuple(_to_array(v) for v in outputs)) for inputs, outputs in data_sets
        )
        out.append(NodeCase(name, op_type, model, sets, rtol, atol))
    return out


def _to_torch(value: Any) -> torch.Tensor:
    from .values import numpy_to_torch

    if not isinstance(value, np.ndarray):
        raise TypeError(f"non-tensor input of type {type(value).__name__} (sequence/optional/map)")
    return numpy_to_torch(value)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    t = tensor.detach().cpu()
    if (t.dtype.itemsize == 1 and t.dtype.is_floating_point) or t.dtype == torch.bfloat16:
        return t.to(torch.float32).numpy()
    return t.numpy()


def _expected_dtype(ref: np.ndarray) -> np.dtype[Any]:
    """The NumPy dtype the importer's output should have: sub-byte types use their container."""
    from .values import SUB_BYTE_CONTAINERS

    return SUB_BYTE_CONTAINERS.get(ref.dtype.name, ref.dtype)


def _compare(expected: Sequence[Any], actual: Sequence[torch.Tensor], rtol: float, atol: float) -> None:
    if len(expected) != len(actual):
        raise AssertionError(f"{len(actual)} outputs, expected {len(expected)}")
    for i, (ref, out) in enumerate(zip(expected, actual, strict=True)):
        if not isinstance(ref, np.ndarray):
            raise AssertionError(f"output {i}: non-tensor expected output ({type(ref).__name__})")
        want = _expected_dtype(ref)
        got_dtype = str(out.dtype).removeprefix("torch.")
        if got_dtype != want.name:
            raise AssertionError(f"output {i}: dtype {got_dtype}, expected {want.name}")
        got = _to_numpy(out)
        if got.shape != ref.shape:
            raise AssertionError(f"output {i}: shape {got.shape}, expected {ref.shape}")
        if want.kind in "fc" or want.name == "bfloat16" or want.name.startswith("float8"):
            np.testing.assert_allclose(
                got.astype(np.float64),
                ref.astype(np.float64),
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                err_msg=f"output {i}",
            )
        else:
            np.testing.assert_array_equal(got, ref.astype(want), err_msg=f"output {i}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    lines = [line for line in text if line.strip()]
    head = lines[0] if lines else ""
    if head.startswith("Not equal to tolerance") or head.startswith("Arrays are not equal"):
        mismatch = next((line.strip() for line in lines if "Mismatched elements" in line), "")
        head = f"{head} {mismatch}".strip()
    return f"{type(exc).__name__}: {head}"[:200]


def _restamped(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    """``model`` with its opset raised to MIN_OPSET when that selects the same op versions.

    Ops whose newest version predates opset 11 (And, Not, Shrink...) get node tests at their
    old opset; at opset 11 the operator is identical, so the test applies unchanged.
    """
    for node in model.graph.node:
        try:
            old = onnx.defs.get_schema(node.op_type, opset, node.domain).since_version
            new = onnx.defs.get_schema(node.op_type, MIN_OPSET, node.domain).since_version
        except onnx.defs.SchemaError:
            return None
        if old != new:
            return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for imp in out.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = MIN_OPSET
    return out


def _bake_small_inputs(model: onnx.ModelProto, inputs: Sequence[Any]) -> tuple[onnx.ModelProto, list[Any]]:
    """For the export check: small 0-D/1-D inputs after the first become initializers.

    Node tests feed shapes, axes, pads, scales... as graph inputs, which makes them tensor
    contents that ``torch.export`` cannot read; exporters write them as constants, and that is
    the case the export check is meant to cover.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep_inputs, keep_values = [], []
    for index, (value_info, value) in enumerate(zip(model.graph.input, inputs, strict=False)):
        small = isinstance(value, np.ndarray) and value.ndim <= 1 and value.size <= 64 and value.dtype != object
        if index > 0 and small:
            out.graph.initializer.append(numpy_helper.from_array(value, value_info.name))
        else:
            keep_inputs.append(value_info)
            keep_values.append(value)
    del out.graph.input[:]
    out.graph.input.extend(keep_inputs)
    return out, keep_values


def run_case(case: NodeCase, *, export: bool = False) -> CaseResult:
    """Import ``case.model``, run every data set and compare (optionally also via torch.export)."""
    model: onnx.ModelProto | None = case.model
    if case.opset < MIN_OPSET:
        model = _restamped(case.model, case.opset)
    if model is None:
        return CaseResult(case, "excluded", f"opset {case.opset} < {MIN_OPSET}")
    missing = case.unsupported_ops()
    if case.expanded and missing:
        return CaseResult(case, "excluded", f"expanded graph uses unsupported {', '.join(missing)}")
    start = time.perf_counter()
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        # NaNs of the narrow float types make NumPy warn on every conversion.
        warnings.simplefilter("ignore")
        return _run_checked(case, model, start, export)


def _run_checked(case: NodeCase, model: onnx.ModelProto, start: float, export: bool) -> CaseResult:
    from . import export_program, import_onnx

    try:
        module = import_onnx(model)
        for inputs, outputs in case.data_sets:
            args = [_to_torch(v) for v in inputs]
            with torch.no_grad():
                got = module(*args)
            _compare(outputs, got, case.rtol, case.atol)
    except Exception as exc:
        return CaseResult(case, "fail", _first_line(exc), time.perf_counter() - start)
    result = CaseResult(case, "pass", "", time.perf_counter() - start)
    if export:
        try:
            inputs, outputs = case.data_sets[0]
            baked, rest = _bake_small_inputs(model, inputs)
            args = [_to_torch(v) for v in rest]
            program = export_program(baked, args)
            _compare(outputs, program.module()(*args), case.rtol, case.atol)
            result.export = "pass"
        except Exception as exc:
            result.export = "fail: " + _first_line(exc)
    return result


def run_cases(cases: Sequence[NodeCase], *, export: bool = False) -> list[CaseResult]:
    """Run ``cases`` in order."""
    return [run_case(case, export=export) for case in cases]


def summarize(results: Sequence[CaseResult]) -> dict[str, OpSummary]:
    """Per-op counts, keyed by op type (sorted)."""
    table: dict[str, OpSummary] = {}
    for r in results:
        s = table.setdefault(r.case.op_type, OpSummary(r.case.op_type))
        if r.status == "pass":
            s.passed += 1
            s.exported += r.export == "pass"
        elif r.status == "fail":
            s.failed += 1
            s.failures.append(r.case.name)
        else:
            s.excluded += 1
    return dict(sorted(table.items()))
