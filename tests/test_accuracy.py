"""Accuracy metrics, thresholds, and the build-time gate (fp16/bf16/int8 plans vs ONNX Runtime fp32)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import streamrt
from precision_models import bn_model, overflow_chain, tiny_scale
from streamrt.building.accuracy_gate import measure_accuracy
from streamrt.config import BuildConfig
from streamrt.errors import AccuracyError, ConfigError
from streamrt.measure.accuracy import AccuracyReport, AccuracyThreshold, accuracy_of
from streamrt.plan import read_plan


def test_metrics_against_numpy() -> None:
    rng = np.random.default_rng()
    ref = rng.standard_normal((4, 6, 10)).astype(np.float32)
    noise = 0.01 * rng.standard_normal(ref.shape).astype(np.float32)
    test = ref + noise
    out = accuracy_of([({"y": ref}, {"y": test})]).output("y")
    a, b = ref.astype(np.float64).ravel(), test.astype(np.float64).ravel()
    assert out.cosine == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-12)
    assert out.max_abs == pytest.approx(np.abs(a - b).max(), rel=1e-6)
    assert out.rel_l2 == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(a), rel=1e-9)
    assert out.rel_median == pytest.approx(np.median(np.abs(a - b) / np.abs(a)), rel=1e-9)
    assert out.top1 == pytest.approx(np.mean(ref.argmax(-1) == test.argmax(-1)))


def test_relative_error_stays_readable_near_zero() -> None:
    """A softmax with exact zeros: max |d|/|ref| explodes (1e16), the median and p99 stay small."""
    rng = np.random.default_rng()
    ref = rng.uniform(0.01, 1.0, 10_000)
    ref[:5] = 0.0
    test = ref * (1 + 1e-3 * rng.standard_normal(ref.size))
    test[:5] = 1e-6
    out = accuracy_of([({"p": ref}, {"p": test})]).output("p")
    assert out.rel_median < 2e-3 and out.rel_p99 < 5e-3


def test_nan_in_plan_only_is_a_problem() -> None:
    ref = np.ones((2, 3), np.float32)
    test = ref.copy()
    test[0, 0] = np.nan
    report = accuracy_of([({"y": ref}, {"y": test})])
    assert report.outputs[0].problem and report.violations(AccuracyThreshold.parse("cosine=0.5"))


def test_threshold_grammar() -> None:
    assert AccuracyThreshold.parse("0.999").bounds == {"cosine": 0.999}
    assert AccuracyThreshold.parse("top1=0.99, rel_l2=0.05").bounds == {"top1": 0.99, "rel_l2": 0.05}
    for bad in ("cosin=0.9", "cosine=abc", "cosine=1.5", ""):
        with pytest.raises(ConfigError):
            AccuracyThreshold.parse(bad)
    with pytest.raises(ConfigError):
        BuildConfig(accuracy_threshold="top2=0.9")


def test_threshold_names_the_worst_output_first() -> None:
    rng = np.random.default_rng()
    ref = {"a": rng.standard_normal(100), "b": rng.standard_normal(100)}
    test = {"a": ref["a"] + 0.1 * rng.standard_normal(100), "b": -ref["b"]}
    misses = accuracy_of([(ref, test)]).violations(AccuracyThreshold.parse("cosine=0.999"))
    assert len(misses) == 2 and misses[0].startswith("b: cosine")


def test_report_round_trips_through_json() -> None:
    rng = np.random.default_rng()
    ref = {"y": rng.standard_normal((3, 4))}
    report = accuracy_of([(ref, {"y": ref["y"] + 1e-3})], inputs="random inputs")
    again = AccuracyReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.output("y").cosine == pytest.approx(report.output("y").cosine)
    assert again.lines() == report.lines()


def test_measure_accuracy_of_an_engine(tmp_path: Path) -> None:
    """The lead's benchmark entry point: ONNX reference vs a loaded plan."""
    rng = np.random.default_rng()
    model = bn_model(rng)
    path = tmp_path / "bn.onnx"
    onnx.save(model, path)
    plan = streamrt.build(path, BuildConfig(), tmp_path / "fp32.plan", cache=False).path
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(2)]
    with streamrt.load(plan) as engine:
        report = measure_accuracy(path, engine, feeds)
    assert report.samples == 2 and report.output("y").rel_l2 < 1e-5


def test_fp16_build_records_kept_nodes_and_accuracy(tmp_path: Path) -> None:
    path = tmp_path / "bn.onnx"
    onnx.save(bn_model(np.random.default_rng()), path)
    lines: list[str] = []
    result = streamrt.build(
        path, BuildConfig(precision="fp16"), tmp_path / "bn.plan", cache=False, progress=lines.append
    )
    record = read_plan(result.path).manifest.precision_report
    assert {k["op_type"] for k in record["kept_nodes"]} == {"Constant", "BatchNormalization"}
    assert record["accuracy"]["outputs"][0]["cosine"] >= 0.999
    assert record["accuracy"]["passed"] and record["accuracy"]["threshold"].endswith("(warning)")
    assert any("kept in fp32 by value range" in line for line in lines)
    assert any(line.startswith("accuracy vs onnxruntime fp32") for line in lines)


def test_threshold_miss_fails_the_build_and_writes_no_plan(tmp_path: Path) -> None:
    path = tmp_path / "bn.onnx"
    onnx.save(bn_model(np.random.default_rng()), path)
    config = BuildConfig(precision="fp16", accuracy_threshold="max_abs=1e-9")
    with pytest.raises(AccuracyError, match=r"misses --accuracy-threshold max_abs=1e-09.*y: max_abs"):
        streamrt.build(path, config, tmp_path / "bn.plan", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "bn.plan").exists()
    assert not list((tmp_path / "cache").rglob("*.plan"))


def test_gate_warns_without_a_threshold(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A scale fp16 cannot hold (cosine stays 1.0, the values are 60x off): the build warns, never silent."""
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_scale(), path)
    streamrt.build(path, BuildConfig(precision="fp16"), tmp_path / "a.plan", cache=False)
    warnings = [r.getMessage() for r in caplog.records if "far from fp32" in r.getMessage()]
    assert warnings and "y: rel_l2" in warnings[0], caplog.text


def test_sample_inputs_keep_overflowing_activations_fp32(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(overflow_chain(), path)
    np.savez(tmp_path / "in.npz", x=np.random.default_rng().standard_normal((2, 64)).astype(np.float32))
    config = BuildConfig(precision="fp16", sample_inputs=tmp_path / "in.npz", accuracy_threshold="cosine=0.999")
    result = streamrt.build(path, config, tmp_path / "a.plan", cache=False)
    kept = {k["name"] for k in result.manifest.precision_report["kept_nodes"]}
    assert {"mul1", "mul2", "mul3"} <= kept


def test_cli_build_threshold_and_inspect(tmp_path: Path) -> None:
    path = tmp_path / "bn.onnx"
    onnx.save(bn_model(np.random.default_rng()), path)
    np.savez(tmp_path / "in.npz", x=np.random.default_rng().standard_normal((1, 3, 16, 16)).astype(np.float32))
    cli = [sys.executable, "-m", "streamrt.cli.main"]
    common = ["--precision", "fp16", "--no-cache", "--sample-inputs", str(tmp_path / "in.npz")]
    ok = subprocess.run(
        [*cli, "build", str(path), "-o", str(tmp_path / "a.plan"), *common, "--accuracy-threshold", "cosine=0.999"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "sample inputs in.npz" in ok.stderr
    shown = subprocess.run([*cli, "inspect", str(tmp_path / "a.plan")], capture_output=True, text=True, timeout=60)
    assert "kept in fp32" in shown.stdout and "accuracy vs onnxruntime fp32" in shown.stdout
    assert "gate cosine=0.999: pass" in shown.stdout
    bad = subprocess.run(
        [*cli, "build", str(path), "-o", str(tmp_path / "b.plan"), *common[:3], "--accuracy-threshold", "max_abs=1e-9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "no plan was written" in bad.stderr and not (tmp_path / "b.plan").exists()


def test_int8_build_records_speed_against_fp32(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from precision_models import seq_model
    from streamrt.config import CalibrationConfig

    path = tmp_path / "seq.onnx"
    onnx.save(seq_model(np.random.default_rng(0)), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng()
    for i in range(4):
        np.savez(calib / f"{i}.npz", tokens=rng.integers(0, 64, (2, 16)))
    config = BuildConfig(precision="int8", calibration=CalibrationConfig(calib, method="minmax"))
    lines: list[str] = []
    with caplog.at_level("WARNING"):
        result = streamrt.build(path, config, tmp_path / "a.plan", cache=False, progress=lines.append)
    speed = result.manifest.precision_report["speed"]
    assert speed["low_ms"] > 0 and speed["fp32_ms"] > 0
    # the speed line comes from interleaved rounds within the budget, and the verdict is recorded
    assert speed["rounds"] >= 2 and speed["seconds"] <= 3.0 + 1.0
    assert isinstance(speed["noisy"], bool) and (speed["noise_warning"] is not None) == speed["noisy"]
    verdict = speed["verdict"]
    assert verdict["accurate"] == (not result.manifest.precision_report["accuracy"]["violations"])
    assert verdict["faster"] == (speed["speedup"] >= 1.05 and not speed["noisy"])
    said = "\n".join(lines) + caplog.text
    assert "vs fp32" in said and "interleaved rounds" in said
    assert ("the better plan" in said) == (verdict["better"] is not None)
    assert ("not faster" in said or "not measurably faster" in said) == (not verdict["faster"])
    quiet = streamrt.build(path, config.replace(speed_check=False), tmp_path / "b.plan", cache=False)
    assert "speed" not in quiet.manifest.precision_report
    assert "--no-speed-check" in quiet.manifest.build_command


def test_gate_on_random_inputs_warns_and_records_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No calibration data, no --sample-inputs: the fp16 gate says it measured noise, as a warning and in the record."""
    path = tmp_path / "bn.onnx"
    onnx.save(bn_model(np.random.default_rng()), path)
    with caplog.at_level("WARNING"):
        result = streamrt.build(path, BuildConfig(precision="fp16"), tmp_path / "a.plan", cache=False)
    accuracy = result.manifest.precision_report["accuracy"]
    assert accuracy["inputs"] == "random inputs" and accuracy["real_data"] is False
    warned = [r for r in caplog.records if "RANDOM inputs" in r.getMessage()]
    assert warned and warned[0].levelname == "WARNING" and warned[0].getMessage() == accuracy["warning"]
    for needed in ("activation ranges of real inputs", "agrees with fp32 on the classes", "--sample-inputs", "--calib"):
        assert needed in accuracy["warning"]


def test_inspect_shows_the_random_inputs_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from streamrt.cli.main import main

    path = tmp_path / "bn.onnx"
    onnx.save(bn_model(np.random.default_rng()), path)
    plan = streamrt.build(path, BuildConfig(precision="fp16"), tmp_path / "a.plan", cache=False).path
    capsys.readouterr()
    assert main(["inspect", str(plan)]) == 0
    shown = capsys.readouterr().out
    assert "accuracy vs onnxruntime fp32 on 2 feed(s) of random inputs" in shown
    assert "warning: the accuracy gate ran on 2 feed(s) of RANDOM inputs" in shown and "--sample-inputs" in shown


@pytest.mark.parametrize("data", ["sample_inputs", "calibration"])
def test_gate_on_real_data_uses_it_and_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, data: str
) -> None:
    """fp16 too, not only int8: --sample-inputs or --calib data feed the gate, and no random-inputs warning."""
    from streamrt.config import CalibrationConfig

    path = tmp_path / "bn.onnx"
    onnx.save(bn_model(np.random.default_rng()), path)
    rng = np.random.default_rng()
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.savez(calib / f"{i}.npz", x=rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    if data == "sample_inputs":
        config = BuildConfig(precision="fp16", sample_inputs=calib / "0.npz")
        expected, samples = "sample inputs 0.npz", 1
    else:
        config = BuildConfig(precision="fp16", calibration=CalibrationConfig(calib))
        expected, samples = "calibration data (3 samples)", 3
    with caplog.at_level("WARNING"):
        result = streamrt.build(path, config, tmp_path / "a.plan", cache=False)
    accuracy = result.manifest.precision_report["accuracy"]
    assert accuracy["inputs"] == expected and accuracy["samples"] == samples
    assert accuracy["real_data"] is True and "warning" not in accuracy
    assert "RANDOM inputs" not in caplog.text
