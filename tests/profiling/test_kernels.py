"""Kernel tables from torch.profiler traces, FLOP counts, device peaks and the roofline (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from streamrt.profiling.flops import FlopCount, count_flops, count_onnx_flops
from streamrt.profiling.gpu_report import GpuProfileReport, plan_precision
from streamrt.profiling.kernel_profile import KernelProfile
from streamrt.profiling.kernels import CPU_CATEGORIES, KernelTable, classify_kernel, self_times, trace_events
from streamrt.profiling.peaks import peak_precision, peaks_for
from streamrt.profiling.roofline import Roofline, kind_rates


class SmallConvNet(nn.Module):
    """conv 3->8 (3x3, pad 1), ReLU, depthwise conv 8->8 (3x3, groups 8), linear to 5 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, groups=8)
        self.fc = nn.Linear(8 * 14 * 14, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.depthwise(torch.relu(self.conv(x)))
        return self.fc(torch.flatten(y, 1))


def _hand_count(n: int) -> dict[str, int]:
    """2 FLOPs per multiply-add: conv 16x16 out, depthwise 14x14 out (1 input channel per group), linear."""
    return {
        "convolution": 2 * n * 8 * 16 * 16 * 3 * 9 + 2 * n * 8 * 14 * 14 * 1 * 9,
        "addmm": 2 * n * (8 * 14 * 14) * 5,
    }


def _cpu_trace(tmp_path: Path, iterations: int) -> dict[str, object]:
    from torch.profiler import ProfilerActivity, profile

    net = SmallConvNet().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        net(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(iterations):
                net(x)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_real_cpu_trace_is_parsed_and_aggregated(tmp_path: Path) -> None:
    trace = _cpu_trace(tmp_path, iterations=3)
    events = trace_events(trace, CPU_CATEGORIES)
    table = KernelTable.from_events(events, iterations=3)
    by_name = {r.name: r for r in table.rows}
    assert by_name["aten::conv2d"].calls == 2 * 3 and by_name["aten::linear"].calls == 3
    assert by_name["aten::relu"].calls == 3
    assert by_name["aten::conv2d"].calls_per_iteration == 2
    # self time: conv2d's children (convolution, ...) are not counted again in conv2d's row
    conv_inclusive = sum(e.duration_us for e in events if e.name == "aten::conv2d")
    assert 0 <= by_name["aten::conv2d"].total_us < conv_inclusive
    # the summed self time is the time covered by the top-level ops, counted once
    top_level = [e for e in events if not any(
        o is not e and o.track == e.track and o.start_us <= e.start_us
        and e.start_us + e.duration_us <= o.start_us + o.duration_us and o.duration_us > e.duration_us
        for o in events)]
    assert table.total_us == pytest.approx(sum(e.duration_us for e in top_level), rel=1e-6)
    assert sum(r.share for r in table.rows) == pytest.approx(100.0)
    assert [r.total_us for r in table.rows] == sorted((r.total_us for r in table.rows), reverse=True)
    assert {r.kind for r in table.rows} == {"op"}
    data = table.to_json(top=3)
    assert len(data["kernels"]) == 3 and data["distinct_kernels"] == len(table.rows)
    assert "=== Kernels (3 iterations" in table.format(top=2) and "more kernels)" in table.format(top=2)


def _event(name: str, ts: float, dur: float, cat: str = "kernel", tid: int = 7, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_synthetic_trace_self_times_kinds_and_bytes() -> None:
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "gpu"}},
        _event("triton_poi_fused_convolution_relu_0", 0.0, 10.0),
        _event("void cudnn::engines_precompiled::nchwToNhwcKernel<__half>", 10.0, 5.0),
        _event("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", 20.0, 60.0),
        _event("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", 100.0, 40.0),
        _event("Memcpy DtoD (Device -> Device)", 150.0, 4.0, cat="gpu_memcpy", bytes=4_000_000),
        _event("Memset (Device)", 160.0, 1.0, cat="gpu_memset", bytes=1000),
        _event("cudaLaunchKernel", 0.0, 3.0, cat="cuda_runtime", tid=1),  # host side: not a kernel
    ]}
    events = trace_events(trace)
    assert len(events) == 6
    table = KernelTable.from_events(events, iterations=2)
    rows = {r.kind: r for r in table.rows}
    assert table.rows[0].kind == "matmul/conv" and table.rows[0].calls == 2 and table.rows[0].mean_us == 50.0
    assert rows["matmul/conv"].share == pytest.approx(100 * 100 / 120)
    assert rows["pointwise"].total_us == 10.0 and rows["layout"].total_us == 5.0
    assert rows["memcpy"].gb_per_s == pytest.approx(4_000_000 / 4e3)  # bytes / (us * 1e3) = GB/s
    assert rows["pointwise"].gb_per_s is None  # a kernel's bytes are not known: left blank
    assert table.per_iteration_ms == pytest.approx(0.060)
    assert table.kind_ms_per_iteration("matmul/conv") == pytest.approx(0.050)
    # nested host events: the child's time is taken out of the parent's
    nested = trace_events({"traceEvents": [_event("outer", 0.0, 10.0, cat="cpu_op"),
                                           _event("inner", 2.0, 3.0, cat="cpu_op"),
                                           _event("inner", 6.0, 1.0, cat="cpu_op"),
                                           _event("other-thread", 1.0, 4.0, cat="cpu_op", tid=9)]},
                          CPU_CATEGORIES)
    assert self_times(nested) == [6.0, 3.0, 1.0, 4.0]


@pytest.mark.parametrize(("name", "kind"), [
    ("triton_poi_fused__native_batch_norm_legit_no_training_convolution_relu_3", "pointwise"),
    ("triton_red_fused_mean_7", "reduction"),
    ("triton_per_fused_add_native_layer_norm_2", "reduction"),
    ("triton_tem_fused_convolution_0", "matmul/conv"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matmul/conv"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8>", "matmul/conv"),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>", "matmul/conv"),
    ("void cudnn::engines_precompiled::nhwcToNchwKernel<__half, __half, float, false, true>", "layout"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "pointwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduction"),
    ("some_custom_kernel", "other"),
])
def test_classify_kernel(name: str, kind: str) -> None:
    assert classify_kernel(name) == kind


def test_flop_count_of_a_small_conv_net_matches_a_hand_count() -> None:
    count = count_flops(SmallConvNet().eval(), [torch.randn(4, 3, 16, 16)])
    hand = _hand_count(4)
    assert count.by_op == hand
    assert count.total == sum(hand.values()) and count.batch == 4
    assert count.per_item == sum(_hand_count(1).values())
    assert count.attention == 0


def test_onnx_flops_through_the_importer_match(tmp_path: Path) -> None:
    net = SmallConvNet().eval()
    path = tmp_path / "net.onnx"
    with torch.no_grad():
        torch.onnx.export(net, (torch.randn(2, 3, 16, 16),), str(path), input_names=["x"], output_names=["y"],
                          dynamo=False, opset_version=17)
    import numpy as np

    x = np.random.default_rng().standard_normal((3, 3, 16, 16)).astype(np.float16)  # an fp16 plan's input
    count = count_onnx_flops(path, {"x": x})
    assert count.total == sum(_hand_count(3).values())
    assert count.by_op["convolution"] == _hand_count(3)["convolution"]


def test_peak_lookup() -> None:
    h200 = peaks_for("NVIDIA H200")
    assert h200 is not None and h200.name.startswith("NVIDIA H200 (SXM")
    assert (h200.tflops("fp16"), h200.tflops("bf16"), h200.tflops("tf32"), h200.tflops("fp32")) == (
        989.4, 989.4, 494.7, 66.9)
    assert h200.hbm_tb_s == 4.8 and h200.measured_matmul_tflops is not None
    nvl = peaks_for("NVIDIA H200 NVL")
    assert nvl is not None and nvl.tflops("fp16") < h200.tflops("fp16")
    h100 = peaks_for("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.hbm_tb_s == 3.35 and h100.tflops("fp16") == 989.4
    pcie = peaks_for("NVIDIA H100 PCIe")
    assert pcie is not None and pcie.hbm_tb_s == 2.0
    assert peaks_for("NVIDIA GeForce RTX 4090") is None and peaks_for("cpu") is None
    assert peak_precision("bf16") == "fp16" and peak_precision("int8") == "int8"
    with pytest.raises(ValueError, match="no peak column"):
        peak_precision("fp8")


def _table() -> KernelTable:
    events = trace_events({"traceEvents": [
        _event("sm90_xmma_gemm_f16", 0.0, 80.0), _event("flash_fwd_kernel", 80.0, 10.0),
        _event("triton_poi_fused_add_0", 90.0, 10.0)]})
    return KernelTable.from_events(events, iterations=1)


def test_roofline_and_kind_rates() -> None:
    flops = FlopCount(10**8, {"convolution": 8 * 10**7, "_scaled_dot_product_flash_attention": 2 * 10**7}, 8)
    rates = {r.kind: r for r in kind_rates(_table(), flops, 989.4)}
    assert rates["matmul/conv"].flops_per_iteration == 8 * 10**7
    assert rates["matmul/conv"].tflops == pytest.approx(8e7 / 80e-6 / 1e12)  # 1 TFLOP/s
    assert rates["attention"].tflops == pytest.approx(2e7 / 10e-6 / 1e12)
    assert rates["matmul/conv"].fraction_of_peak == pytest.approx(1.0 / 989.4)
    assert kind_rates(_table(), None, 989.4) == []
    roof = Roofline(flops, peaks_for("NVIDIA H200"), "fp16", wall_ms=0.125, kernel_ms=0.1, timing="median of 5")
    assert roof.achieved_tflops == pytest.approx(0.8)  # 1e8 FLOPs in 125 us
    assert roof.fraction_of_peak == pytest.approx(0.8 / 989.4)
    assert "0.1% of NVIDIA H200 (SXM) fp16 peak 989.4 TFLOP/s" in roof.line()
    unknown = Roofline(flops, None, "fp16", wall_ms=0.125, kernel_ms=0.1)
    assert unknown.fraction_of_peak is None and "unknown device: no roofline column" in unknown.line()
    assert "FLOPs unknown" in Roofline(None, None, "fp16", 0.1, 0.1).line()


def test_gpu_report_json_keeps_layers_and_adds_kernels() -> None:
    profile = KernelProfile(_table(), wall_ms=0.125, graphs=True, timed_runs=5, trace={})
    flops = FlopCount(10**11, {"convolution": 10**11}, 8)
    report = GpuProfileReport.build(profile, flops, "fp16", "NVIDIA H200")
    data = report.to_json(top=2)
    assert len(data["layers"]) == 2 and len(data["kernels"]) == 2 and data["nodes"] == 3
    assert sum(k["share_percent"] for k in data["kernel_kinds"]) == pytest.approx(100.0)
    assert data["roofline"]["fraction_of_peak"] == pytest.approx(800.0 / 989.4)  # 1e11 FLOPs in 125 us
    # no attention op counted: all FLOPs go to the matmul/conv kernels
    assert [r["kind"] for r in data["kind_rates"]] == ["matmul/conv"]
    text = report.format(top=2)
    assert "By kind" in text and "Roofline:" in text and "CUDA graphs" in text
    assert "no peak figures" in GpuProfileReport.build(profile, flops, "fp16", "Mystery GPU").format()


def test_plan_precision_reads_tf32() -> None:
    class Manifest:
        def __init__(self, precision: str, settings: dict[str, object]) -> None:
            self.precision, self.build_settings = precision, settings

    ieee = {"fp32_precision": "ieee"}
    assert plan_precision(Manifest("fp32", {"backend": {"fp32_precision": "tf32"}, "config": {}})) == "tf32"
    assert plan_precision(Manifest("fp32", {"backend": ieee, "config": {"tf32": True}})) == "tf32"  # optlevels' field
    assert plan_precision(Manifest("fp32", {"backend": ieee, "config": {"tf32": False}})) == "fp32"
    assert plan_precision(Manifest("fp16", {"backend": {}, "config": {}})) == "fp16"
