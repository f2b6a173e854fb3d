"""A zoo of real architectures, built from PyTorch with fixed seeds and exported to ONNX.

Tests run every entry through every backend that runs on the machine and compare fp32 against
ONNX Runtime; benchmarks export them at opsets 11-17 and measure precision and speed. Each entry
gives the network (random weights, trained-looking batch-norm statistics, eval mode), an
example input shape (the profile's opt shape) and a dynamic shape profile, with a multiple-of
constraint where the network only runs at some sizes.

Entries: ``resnet`` (residual basic blocks), ``mobilenet`` (depthwise convs, hard-swish, SE),
``vit`` (patch embedding, multi-head attention, LayerNorm, GELU), ``crnn`` (conv features, a
bidirectional LSTM, CTC log-softmax over ``batch x time x classes``), ``unet`` (ConvTranspose,
bilinear Resize, skip concats; multiples of 4), ``yolo`` (YOLOv8-style detector with in-graph box
decoding; multiples of 32) and ``mtcnn`` (MTCNN's P-Net: PReLU, ceil-mode max pooling; any size).

Example:
    >>> entry = MODELS["mtcnn"]
    >>> net = entry.make()                                  # doctest: +SKIP
    >>> export("mtcnn", "pnet.onnx", opset=11)              # doctest: +SKIP
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from streamrt.testing import zoo_nets
from streamrt.testing.yolo import yolo_like
from streamrt.types import Shape, ShapeProfile, ShapeRange

__all__ = ["INPUT", "MODELS", "ZooModel", "export", "export_bytes", "measure_batch_norm"]

INPUT = "input"
"""Every zoo model has one input of this name."""


@dataclass(frozen=True)
class ZooModel:
    """One architecture of the zoo.

    Attributes:
        name: registry key.
        build: returns the network, untrained (seeded), in eval mode.
        example_shape: the input shape exports trace with (also the profile's opt shape).
        profile: the dynamic profile of input :data:`INPUT`.
        outputs: output names in the ONNX export.
        dynamic_axes: ONNX dynamic axes of the input, by axis.
        seed: the seed ``build`` uses.
    """

    name: str
    build: Callable[[], nn.Module]
    example_shape: Shape
    profile: ShapeProfile
    outputs: tuple[str, ...]
    dynamic_axes: dict[int, str]
    seed: int = 0

    def make(self) -> nn.Module:
        """A fresh copy of the network: same weights on every call, eval mode, fp32 on the CPU."""
        torch.manual_seed(self.seed)
        net = self.build()
        zoo_nets.randomize_norms(net, torch.Generator().manual_seed(self.seed + 1))
        return net.eval()

    def __call__(self) -> tuple[nn.Module, Shape, ShapeProfile]:
        """``(network, example input shape, profile)``: what a benchmark needs in one call."""
        return self.make(), self.example_shape, self.profile


def _profile(lo: Shape, opt: Shape, hi: Shape, multiple: Shape = ()) -> ShapeProfile:
    return ShapeProfile({INPUT: ShapeRange(lo, opt, hi, multiple)})


_BATCH_HW = {0: "batch", 2: "height", 3: "width"}

MODELS: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "resnet",
            zoo_nets.ResNetLike,
            (2, 3, 64, 64),
            _profile((1, 3, 32, 32), (2, 3, 64, 64), (4, 3, 96, 96)),
            ("logits",),
            _BATCH_HW,
        ),
        ZooModel(
            "mobilenet",
            zoo_nets.MobileNetLike,
            (2, 3, 64, 64),
            _profile((1, 3, 32, 32), (2, 3, 64, 64), (4, 3, 96, 96)),
            ("logits",),
            _BATCH_HW,
        ),
        ZooModel(
            "vit",
            zoo_nets.ViTLike,
            (2, 3, 32, 32),
            _profile((1, 3, 32, 32), (2, 3, 32, 32), (8, 3, 32, 32)),
            ("logits",),
            {0: "batch"},
        ),
        ZooModel(
            "crnn",
            zoo_nets.CRNN,
            (2, 1, 32, 128),
            _profile((1, 1, 32, 64), (2, 1, 32, 128), (4, 1, 32, 256), (1, 1, 1, 4)),
            ("log_probs",),
            {0: "batch", 3: "width"},
        ),
        ZooModel(
            "unet",
            zoo_nets.UNetLike,
            (1, 3, 64, 64),
            _profile((1, 3, 32, 32), (1, 3, 64, 64), (2, 3, 96, 96), (1, 1, 4, 4)),
            ("mask_logits",),
            _BATCH_HW,
        ),
        ZooModel(
            "yolo",
            lambda: yolo_like(num_classes=8, width=0.125, depth=0.34, seed=0),
            (1, 3, 96, 96),
            _profile((1, 3, 64, 64), (1, 3, 96, 96), (2, 3, 160, 160), (1, 1, 32, 32)),
            ("detections",),
            _BATCH_HW,
        ),
        ZooModel(
            "mtcnn",
            zoo_nets.MTCNNPNet,
            (1, 3, 48, 48),
            _profile((1, 3, 12, 12), (1, 3, 48, 48), (2, 3, 97, 97)),
            ("face_prob", "box_deltas"),
            _BATCH_HW,
        ),
    )
}


def export_bytes(name: str, opset: int = 17) -> bytes:
    """The zoo model ``name`` exported to ONNX (TorchScript exporter, dynamic axes, constants folded)."""
    entry = MODELS[name]
    net = entry.make()
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's tracer warnings about shape arithmetic
        torch.onnx.export(
            net,
            (torch.randn(*entry.example_shape),),
            buffer,  # type: ignore[arg-type]  # the TorchScript exporter writes to file objects too
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT],
            output_names=list(entry.outputs),
            dynamic_axes={INPUT: entry.dynamic_axes, **{o: {0: "batch"} for o in entry.outputs}},
        )
    return buffer.getvalue()


def export(name: str, path: str | Path, opset: int = 17) -> Path:
    """Export zoo model ``name`` to ``path`` at ``opset`` and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(export_bytes(name, opset))
    return out


def measure_batch_norm(net: nn.Module, shape: Shape, *, passes: int = 4, batch: int = 16) -> nn.Module:
    """``net`` in eval mode, its batch-norm statistics first measured on random images (in place).

    Random-init MobileNetV3 / EfficientNet in eval mode (running mean 0, variance 1) shrink their
    activations layer by layer to logits of about 1e-10, below fp16's range: an fp16 plan is then
    (rightly) refused, and torch.compile's fp16 answer is noise (relative error 1.0, measured on the
    H200 on 2026-12-03). Trained networks have normalised activations; a few train-mode passes give
    random-weight ones the same, so fp16 speed is measured on a model fp16 can run.
    """
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        net.train()
        with torch.no_grad():
            for _ in range(passes):
                net(torch.randn(batch, *shape))
    return net.eval()

