"""The bundled benchmark workload: frames in, a CNN on the device, top-k scores out.

Per item (one frame, uint8 HWC, 1080p by default, in pageable host memory):

========  ======  =====================================================================
stage     kind    work
========  ======  =====================================================================
load      host    copy the caller's frame into the slot's pinned buffer (worker thread)
h2d       h2d     pinned frame -> device (``non_blocking``)
pre       compute HWC uint8 -> NCHW, bilinear resize to ``size`` x ``size``, normalise
engine    compute ``ctx.infer({"images": ...}, stream)`` -> logits
post      compute softmax + top-k into fixed-size device buffers (no host sync)
d2h       d2h     scores, classes and logits -> pinned host buffers
========  ======  =====================================================================

Stream groups: ``in`` (h2d, pre), ``engine``, ``out`` (post, d2h), as in the reference design.
With pageable slots (the synchronous baseline) ``load`` only references the caller's frame and
the copies block, which is the loop people write by hand.

The engine is anything with ``create_context()`` whose contexts have
``infer(inputs: dict[str, Tensor], stream) -> dict[str, Tensor]`` that enqueues on ``stream``
without a host sync: :class:`TorchModuleEngine` around the bundled :func:`tiny_cnn`, or an
engine from ``streamrt.load(plan)``. Input and output names come from ``engine.inputs`` /
``engine.outputs`` when the engine has them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from streamrt.device.base import Stream, StreamLike
from streamrt.device.cuda import stream_scope
from streamrt.device.staging import gather_into, to_device, to_host
from streamrt.pipeline.stage import Lane, Slot, Stage, StageKind

__all__ = [
    "FrameResult",
    "FrameSpec",
    "FrameWorkload",
    "TorchModuleContext",
    "TorchModuleEngine",
    "make_frames",
    "tiny_cnn",
]

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
_POISON_INT = -7


@dataclass(frozen=True)
class FrameSpec:
    """Shapes of the workload: frame ``height`` x ``width``, model input ``size``, outputs."""

    height: int = 1080
    width: int = 1920
    size: int = 640
    classes: int = 1000
    topk: int = 5
    channels: int = 16  # width of the first conv of :func:`tiny_cnn`


@dataclass(frozen=True)
class FrameResult:
    """Host copies of one frame's outputs."""

    scores: np.ndarray  # (topk,) float32 softmax probabilities, descending
    classes: np.ndarray  # (topk,) int64
    logits: np.ndarray  # (classes,) in the engine's dtype

    def equal(self, other: FrameResult) -> bool:
        """Bit-identical outputs (the check that no stream ordering was lost)."""
        return all(
            a.dtype == b.dtype and a.tobytes() == b.tobytes()
            for a, b in ((self.scores, other.scores), (self.classes, other.classes), (self.logits, other.logits))
        )


def tiny_cnn(spec: FrameSpec = FrameSpec(), seed: int = 0) -> nn.Module:
    """A small, deterministic conv net (5 stride-2 convs, global pool, linear).

    Weights come from a private generator (He-normal), so every process builds the same model
    without touching torch's global RNG.
    """
    c = spec.channels
    widths = [3, c, 2 * c, 4 * c, 8 * c, 16 * c]
    layers: list[nn.Module] = []
    for cin, cout in itertools.pairwise(widths):
        layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU(inplace=True)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], spec.classes)]
    model = nn.Sequential(*layers).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
                assert module.bias is not None
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.01)
    model.requires_grad_(False)
    return model


class TorchModuleContext:
    """One execution context of a :class:`TorchModuleEngine` (serves one stream at a time)."""

    def __init__(self, engine: TorchModuleEngine) -> None:
        self._engine = engine

    @torch.no_grad()
    def infer(self, inputs: Mapping[str, Any], stream: StreamLike | None = None) -> dict[str, Any]:
        """Enqueue the forward pass on ``stream`` (CUDA) or run it here (host); no host sync."""
        engine = self._engine
        with stream_scope(stream):
            y = engine.module(inputs[engine.input_name])
        return {engine.output_name: y}


class TorchModuleEngine:
    """The engine contract around an ``nn.Module``: ``create_context().infer(inputs, stream)``.

    Stands in for a compiled plan in the benchmark until a real engine is passed instead.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        device: Any = "cpu",
        dtype: torch.dtype = torch.float32,
        input_name: str = "images",
        output_name: str = "logits",
    ) -> None:
        self.module = module.to(device=device, dtype=dtype).eval()
        self.dtype = dtype
        self.input_name = input_name
        self.output_name = output_name

    def create_context(self) -> TorchModuleContext:
        return TorchModuleContext(self)


def make_frames(count: int, spec: FrameSpec = FrameSpec(), seed: int = 0) -> list[torch.Tensor]:
    """``count`` random uint8 HWC frames in ordinary (pageable) host memory."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (spec.height, spec.width, 3), dtype=torch.uint8, generator=gen)
            for _ in range(count)]


def _io_name(specs: Sequence[Any] | None, default: str) -> str:
    return str(specs[0].name) if specs else default


def _engine_dtype(engine: Any, default: torch.dtype) -> torch.dtype:
    if isinstance(getattr(engine, "dtype", None), torch.dtype):
        return engine.dtype
    inputs = getattr(engine, "inputs", None)
    return inputs[0].dtype.torch if inputs else default


class FrameWorkload:
    """Frames -> pre-processing -> engine -> top-k, as pipeline stages (see the module docstring).

    Args:
        engine: has ``create_context()``; one context is created per lane.
        spec: frame and model shapes.
        poison: fill output buffers with NaN / -7 at setup and after each collect, so an output
            that a stage failed to write (or wrote late) cannot pass for a result.

    Example:
        >>> spec = FrameSpec(height=24, width=32, size=16, classes=10, topk=3, channels=4)
        >>> engine = TorchModuleEngine(tiny_cnn(spec))
        >>> from streamrt.pipeline import Pipeline, PipelineConfig
        >>> cfg = PipelineConfig(device="cpu", ring_size=2)
        >>> with Pipeline.from_workload(FrameWorkload(engine, spec), cfg) as pipe:
        ...     results = [r.unwrap() for r in pipe.map(make_frames(3, spec))]
        >>> results[0].classes.shape
        (3,)
    """

    def __init__(self, engine: Any, spec: FrameSpec = FrameSpec(), *, poison: bool = False) -> None:
        self.engine = engine
        self.spec = spec
        self.poison = poison
        self.input_name = _io_name(getattr(engine, "inputs", None), "images")
        self.output_name = _io_name(getattr(engine, "outputs", None), "logits")
        self.dtype = _engine_dtype(engine, torch.float32)

    def stages(self) -> list[Stage]:
        return [
            Stage("load", self.load, kind=StageKind.HOST, stream="load"),
            Stage("h2d", self.h2d, kind=StageKind.H2D, stream="in"),
            Stage("pre", self.pre, kind=StageKind.COMPUTE, stream="in", graphable=True),
            Stage("engine", self.run_engine, kind=StageKind.COMPUTE, stream="engine", graphable=True),
            Stage("post", self.post, kind=StageKind.COMPUTE, stream="out", graphable=True),
            Stage("d2h", self.d2h, kind=StageKind.D2H, stream="out"),
        ]

    def setup_lane(self, lane: Lane) -> None:
        dev = lane.device.torch_device
        lane.state["context"] = self.engine.create_context()
        # Normalisation folded into one multiply-add on 0..255 pixels: (x - 255 m) * 1/(255 s).
        lane.state["shift"] = (torch.tensor(_MEAN) * 255).view(1, 3, 1, 1).to(dev, self.dtype)
        lane.state["scale"] = (1 / (torch.tensor(_STD) * 255)).view(1, 3, 1, 1).to(dev, self.dtype)

    def setup_slot(self, slot: Slot) -> None:
        s, dev, pinned = self.spec, slot.device, slot.pinned
        slot["frame"] = dev.host_buffer((s.height, s.width, 3), torch.uint8, pinned=pinned)
        slot["frame_dev"] = dev.empty((s.height, s.width, 3), torch.uint8)
        slot["images"] = dev.empty((1, 3, s.size, s.size), self.dtype)
        slot["logits"] = dev.empty((1, s.classes), self.dtype)
        slot["scores"] = dev.empty((1, s.topk), torch.float32)
        slot["classes"] = dev.empty((1, s.topk), torch.int64)
        slot["scores_host"] = dev.host_buffer((1, s.topk), torch.float32, pinned=pinned)
        slot["classes_host"] = dev.host_buffer((1, s.topk), torch.int64, pinned=pinned)
        slot["logits_host"] = dev.host_buffer((1, s.classes), self.dtype, pinned=pinned)
        if self.poison:
            self.poison_slot(slot)

    def poison_slot(self, slot: Slot) -> None:
        """Overwrite every output buffer (device and host) with values no stage produces."""
        for name in ("logits", "scores", "logits_host", "scores_host"):
            slot[name].fill_(float("nan"))
        for name in ("classes", "classes_host"):
            slot[name].fill_(_POISON_INT)

    # -- stages (fn(slot, item, stream)) -------------------------------------------------------

    def load(self, slot: Slot, item: int, stream: Stream) -> None:
        frame = torch.as_tensor(slot.input)
        if slot.pinned:
            gather_into(slot["frame"], [frame])  # host memcpy into the ring's pinned buffer
        else:
            slot["frame"] = frame  # the naive loop copies straight from the caller's frame

    def h2d(self, slot: Slot, item: int, stream: Stream) -> None:
        to_device(slot["frame"], slot.device, stream, out=slot["frame_dev"], non_blocking=slot.pinned)

    @torch.no_grad()
    def pre(self, slot: Slot, item: int, stream: Stream) -> None:
        state = slot.lane.state
        x = slot["frame_dev"].permute(2, 0, 1).unsqueeze(0).to(self.dtype)
        x = F.interpolate(x, size=(self.spec.size, self.spec.size), mode="bilinear", align_corners=False)
        torch.mul(x.sub_(state["shift"]), state["scale"], out=slot["images"])

    def run_engine(self, slot: Slot, item: int, stream: Stream) -> None:
        outputs = slot.lane.state["context"].infer({self.input_name: slot["images"]}, stream)
        slot["logits"] = outputs[self.output_name]  # kept alive by the slot until it is reused

    @torch.no_grad()
    def post(self, slot: Slot, item: int, stream: Stream) -> None:
        probs = torch.softmax(slot["logits"].float(), dim=1)
        torch.topk(probs, self.spec.topk, dim=1, out=(slot["scores"], slot["classes"]))

    def d2h(self, slot: Slot, item: int, stream: Stream) -> None:
        for name in ("scores", "classes", "logits"):
            to_host(slot[name], stream, out=slot[f"{name}_host"], non_blocking=slot.pinned)

    def collect(self, slot: Slot, item: int) -> FrameResult:
        result = FrameResult(
            scores=slot["scores_host"][0].numpy().copy(),
            classes=slot["classes_host"][0].numpy().copy(),
            logits=slot["logits_host"][0].numpy().copy(),
        )
        if self.poison:
            for name in ("scores_host", "logits_host"):
                slot[name].fill_(float("nan"))
            slot["classes_host"].fill_(_POISON_INT)
        return result
