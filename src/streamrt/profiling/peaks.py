"""Datasheet peak rates of GPUs, by the name torch reports, for roofline columns.

Figures are the vendor's dense (no structured sparsity) tensor-core rates: NVIDIA's datasheets
print them "with sparsity", and dense is half of that. The H200 row also matches the workplace's
own notes (``.library/device/H200.md``: dense bf16 about 990 TFLOP/s, plain fp32 about 67,
HBM3e 4.8 TB/s) and carries the ceilings measured on such a machine (``KINDS.md``, 2026-11-04:
an 8192^3 bf16 matrix product at 769-798 TFLOP/s on random data, a device-to-device copy at
about 4.3 TB/s counting bytes read and written). A device that is not in the table gets no
roofline column: :func:`peaks_for` returns ``None`` rather than a guess.

Example:
    >>> peak = peaks_for("NVIDIA H200")
    >>> peak.tflops("fp16"), peak.hbm_tb_s
    (989.4, 4.8)
    >>> peaks_for("NVIDIA GeForce RTX 4090") is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PEAKS", "DevicePeaks", "peak_precision", "peaks_for"]


@dataclass(frozen=True)
class DevicePeaks:
    """Peak rates of one GPU model.

    Attributes:
        name: the model, as the table shows it.
        match: lowercase substrings that must all be in the device name torch reports.
        fp16: dense fp16/bf16 tensor-core TFLOP/s.
        tf32: dense TF32 tensor-core TFLOP/s.
        fp32: plain (CUDA-core) fp32 TFLOP/s.
        int8: dense int8 tensor-core TOP/s.
        hbm_tb_s: device-memory bandwidth, TB/s.
        source: where the figures come from.
        measured_matmul_tflops: a bf16 matrix product measured on such a device, if any.
        measured_copy_tb_s: a device-to-device copy measured on such a device, if any.
    """

    name: str
    match: tuple[str, ...]
    fp16: float
    tf32: float
    fp32: float
    int8: float
    hbm_tb_s: float
    source: str
    measured_matmul_tflops: float | None = None
    measured_copy_tb_s: float | None = None

    def tflops(self, precision: str) -> float:
        """The peak for ``precision`` (``fp16``, ``bf16``, ``tf32``, ``fp32`` or ``int8``)."""
        key = peak_precision(precision)
        return float(getattr(self, key))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fp16_bf16_dense_tflops": self.fp16,
            "tf32_dense_tflops": self.tf32,
            "fp32_tflops": self.fp32,
            "int8_dense_tops": self.int8,
            "hbm_tb_s": self.hbm_tb_s,
            "source": self.source,
            "measured_matmul_tflops": self.measured_matmul_tflops,
            "measured_copy_tb_s": self.measured_copy_tb_s,
        }


_DATASHEET = "NVIDIA datasheet (dense = half the 'with sparsity' figure)"

PEAKS: tuple[DevicePeaks, ...] = (
    # Most specific names first: "H200 NVL" before "H200".
    DevicePeaks("NVIDIA H200 NVL", ("h200", "nvl"), 835.5, 417.5, 60.0, 1671.0, 4.8, _DATASHEET),
    DevicePeaks(
        "NVIDIA H200 (SXM)", ("h200",), 989.4, 494.7, 66.9, 1978.9, 4.8,
        _DATASHEET + "; H200.md of this workplace agrees; measured ceilings from KINDS.md (2026-11-04)",
        measured_matmul_tflops=784.0, measured_copy_tb_s=4.3,
    ),
    DevicePeaks("NVIDIA H100 NVL", ("h100", "nvl"), 835.5, 417.5, 60.0, 1671.0, 3.9, _DATASHEET),
    DevicePeaks("NVIDIA H100 PCIe", ("h100", "pcie"), 756.5, 378.0, 51.2, 1513.0, 2.0, _DATASHEET),
    DevicePeaks("NVIDIA H100 SXM5", ("h100", "hbm3"), 989.4, 494.7, 66.9, 1978.9, 3.35, _DATASHEET),
    DevicePeaks("NVIDIA A100 SXM4 80GB", ("a100", "sxm4", "80gb"), 312.0, 156.0, 19.5, 624.0, 2.039, _DATASHEET),
    DevicePeaks("NVIDIA A100 SXM4 40GB", ("a100", "sxm4", "40gb"), 312.0, 156.0, 19.5, 624.0, 1.555, _DATASHEET),
)
"""Known devices; the first entry whose ``match`` substrings are all in the name wins."""

_PRECISION_KEY = {"fp16": "fp16", "bf16": "fp16", "tf32": "tf32", "fp32": "fp32", "int8": "int8"}


def peak_precision(precision: str) -> str:
    """The peak column a plan of ``precision`` is measured against (bf16 shares fp16's)."""
    try:
        return _PRECISION_KEY[precision.lower()]
    except KeyError:
        raise ValueError(f"no peak column for precision {precision!r}; known: {sorted(_PRECISION_KEY)}") from None


def peaks_for(device_name: str) -> DevicePeaks | None:
    """The peaks of the device torch names ``device_name``, or ``None`` for an unknown device."""
    lowered = device_name.lower()
    for peaks in PEAKS:
        if all(part in lowered for part in peaks.match):
            return peaks
    return None
