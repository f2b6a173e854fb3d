"""What ``streamrt profile`` reports for a CUDA engine: kernels, kinds with rates, and the roofline.

Puts together the kernel run (:mod:`streamrt.profiling.kernel_profile`), the FLOP count
(:mod:`streamrt.profiling.flops`), the device peak (:mod:`streamrt.profiling.peaks`) and the
roofline (:mod:`streamrt.profiling.roofline`) into one text report and one JSON object. The JSON
keeps ``layers`` (one row per kernel, as the per-node profile writes them) so readers of the
old shape keep working, and adds ``kernels``, ``kernel_kinds``, ``kind_rates`` and ``roofline``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrt.backends.base import LayerTiming
from streamrt.profiling.flops import FlopCount
from streamrt.profiling.kernel_profile import KernelProfile
from streamrt.profiling.layers import LayerProfile
from streamrt.profiling.peaks import peaks_for
from streamrt.profiling.roofline import KindRate, Roofline, format_kind_rates, kind_rates

__all__ = ["GpuProfileReport", "plan_precision"]


def plan_precision(manifest: Any) -> str:
    """The precision whose peak a plan is held to: ``tf32`` for fp32 plans built with TF32 allowed."""
    precision = str(manifest.precision)
    settings = manifest.build_settings or {}
    tf32 = settings.get("backend", {}).get("fp32_precision") == "tf32" or bool(settings.get("config", {}).get("tf32"))
    return "tf32" if precision == "fp32" and tf32 else precision


@dataclass(frozen=True)
class GpuProfileReport:
    """A profiled CUDA engine: kernel table, FLOPs credited by kind, and the whole-model roofline."""

    profile: KernelProfile
    roofline: Roofline
    rates: tuple[KindRate, ...]
    device_name: str

    @classmethod
    def build(
        cls, profile: KernelProfile, flops: FlopCount | None, precision: str, device_name: str
    ) -> GpuProfileReport:
        peaks = peaks_for(device_name)
        roofline = Roofline(flops, peaks, precision, profile.wall_ms, profile.table.per_iteration_ms, profile.timing)
        rates = kind_rates(profile.table, flops, roofline.peak_tflops)
        return cls(profile, roofline, tuple(rates), device_name)

    def layer_profile(self) -> LayerProfile:
        """The kernels as a per-node profile (one "node" per kernel name)."""
        timings = [LayerTiming(r.name, r.kind, r.total_us / 1e3, r.calls) for r in self.profile.table.rows]
        return LayerProfile.from_timings(timings, self.profile.table.iterations)

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        return {
            "device": self.device_name,
            **self.layer_profile().to_json(top),
            **self.profile.table.to_json(top),
            "kind_rates": [r.to_json() for r in self.rates],
            "roofline": self.roofline.to_json(),
        }

    def format(self, top: int | None = None) -> str:
        table = self.profile.table
        lines = [table.format(top), "", format_kind_rates(table, list(self.rates)), "", self.roofline.line()]
        if self.roofline.peaks is None:
            lines.append(f"(no peak figures for '{self.device_name}': rates shown without a fraction of the peak)")
        if not table.rows:
            lines.append("(the profiler recorded no GPU kernels: is CUPTI available to torch.profiler here?)")
        return "\n".join(lines)
