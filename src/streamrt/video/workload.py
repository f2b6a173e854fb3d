"""Object detection as pipeline stages: letterbox, engine, NMS, each on its own stream.

An item is a list of :class:`Frame` (one frame, or one per camera when frames are batched into
the engine). Stages on a CUDA engine:

=======  ======  ======  =======================================================================
stage    kind    stream  work
=======  ======  ======  =======================================================================
load     host    load    copy the frames into the slot's pinned (B, H, W, 3) uint8 buffer (skipped
                         for frames already in pinned memory, e.g. a decoder's pinned buffers)
h2d      h2d     in      pinned frames -> device (``non_blocking``)
pre      comp.   in      one-pass letterbox + BGR->RGB + normalise + HWC->CHW (Triton)
engine   comp.   engine  ``ctx.infer`` on the (B, 3, h, w) input
post     comp.   out     decode + threshold + top-k + class-aware NMS, fixed-size (Triton)
d2h      d2h     out     ``max_det`` x 6 detections and the counts -> pinned host buffers
=======  ======  ======  =======================================================================

``pre``, ``engine`` and ``post`` are ``graphable`` (static shapes: the batch is always the full
B, unused rows hold stale frames whose detections are ignored), so ``cuda_graphs=True`` replays
each as one CUDA graph. On a CPU engine the stages are ``pre`` (host letterbox, OpenCV),
``engine`` and ``post`` (NumPy NMS), each on its own worker thread in the ``streams`` topology.
With pageable slots (the synchronous topology) ``load`` only references the caller's frames and
the copy blocks: the loop people write by hand.

The collector maps boxes back to frame pixels and returns one :class:`Detections` per frame.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrt.device.base import Stream
from streamrt.device.staging import to_device, to_host
from streamrt.ops.letterbox import CpuLetterbox, LetterboxGeometry, Normalize
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig
from streamrt.pipeline.stage import Lane, Slot, Stage, StageKind
from streamrt.video.model import DetectorModel

__all__ = ["DetectionWorkload", "Detections", "Frame", "gather_pictures", "split_detections"]


@dataclass
class Frame:
    """One frame on its way through the pipeline.

    Attributes:
        source: index of the source it came from.
        index: frame number within that source.
        image: uint8 BGR (height, width, 3); for NV12 sources an NV12 picture (H * 3 / 2, W), a host
            array or (NVDEC) a device tensor.
        captured: ``time.perf_counter()`` when the frame became available (latency starts here).
    """

    source: int
    index: int
    image: Any
    captured: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class Detections:
    """Detections of one frame, in frame pixels: ``boxes`` (n, 4) x1, y1, x2, y2; ``scores``; ``classes``."""

    source: int
    index: int
    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    captured: float = 0.0

    def __len__(self) -> int:
        return len(self.scores)

    def to_json(self, names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """A JSON-ready dict (what the JSON Lines sink writes per frame)."""
        return {
            "source": self.source,
            "frame": self.index,
            "detections": [
                {"box": [round(float(v), 2) for v in box], "score": round(float(score), 4), "class": int(cls),
                 **({"label": names[int(cls)] if int(cls) < len(names) else f"class{int(cls)}"} if names else {})}
                for box, score, cls in zip(self.boxes, self.scores, self.classes, strict=True)
            ],
        }

    def same_as(self, other: Detections, atol: float = 0.0) -> bool:
        """Same boxes (within ``atol`` pixels), scores and classes: the sync-vs-pipeline check."""
        return (len(self) == len(other) and np.array_equal(self.classes, other.classes)
                and np.allclose(self.boxes, other.boxes, rtol=0, atol=atol)
                and np.allclose(self.scores, other.scores, rtol=0, atol=max(atol, 1e-6)))


def gather_pictures(dst: Any, pictures: list[Any]) -> None:
    """``pictures`` (device tensors, or host arrays/tensors) copied into rows ``0..n-1`` of ``dst`` in one call.

    A copy per picture from Python gives the GIL up and waits to get it back once per picture (200
    streams on the H200 on 2026-12-02: 29.5 ms per engine call of 94 frames, the main thread 61%
    busy). ``torch._foreach_copy_`` copies pictures already on ``dst``'s device in one fused launch
    and host ones (a CPU decoder's NV12; from pinned memory: asynchronous) one after another in C++,
    on the current stream, all under one release of the GIL.
    """
    import torch

    if not pictures:
        return
    sources = [torch.from_numpy(p) if isinstance(p, np.ndarray) else p for p in pictures]
    torch._foreach_copy_(list(dst[: len(sources)].unbind(0)), sources, non_blocking=True)


class DetectionWorkload:
    """Frames -> letterbox -> engine -> NMS, as pipeline stages (see the module docstring).

    Args:
        model: the detector (its ``device`` decides the CUDA or CPU stages).
        frame_hw: (height, width) of every frame.
        batch: frames per engine call (<= ``model.max_batch``).
        postprocess: thresholds and ``max_det`` (default :class:`PostprocessConfig`).
        normalize: mean/std/channel order of the model's input (default YOLO's).
        use_triton: device ops on Triton kernels (None: where they can run).
        frame_format: ``bgr`` (uint8 (H, W, 3) host frames) or ``nv12`` (uint8 (H * 3 / 2, W) pictures,
            each either a device tensor from NVDEC or a host array from a CPU decoder; CUDA only):
            the NV12 stages gather them into the slot and convert + letterbox in one kernel.
        color_matrix: the NV12 frames' colour matrix (``bt601`` or ``bt709``, limited range).
    """

    def __init__(self, model: DetectorModel, frame_hw: tuple[int, int], *, batch: int = 1,
                 postprocess: PostprocessConfig | None = None, normalize: Normalize | None = None,
                 use_triton: bool | None = None, frame_format: str = "bgr", color_matrix: str = "bt601") -> None:
        from streamrt.errors import ConfigError

        self.model = model
        self.frame_hw = (int(frame_hw[0]), int(frame_hw[1]))
        if frame_format not in ("bgr", "nv12") or (frame_format == "nv12" and model.device != "cuda"):
            raise ConfigError(f"frame_format must be bgr, or nv12 on a CUDA engine; got {frame_format!r} on "
                              f"{model.device}", hint="decode to BGR for a CPU engine")
        self.frame_format = frame_format
        self.color_matrix = color_matrix
        self.batch = batch
        self.postprocess = postprocess or PostprocessConfig()
        self.normalize = normalize or Normalize()
        self.cuda = model.device == "cuda"
        self.geometry = LetterboxGeometry.fit(self.frame_hw, model.input_hw)
        self.use_triton = use_triton
        if self.cuda:
            import torch

            from streamrt.ops._backend import use_triton as resolve

            self.use_triton = resolve(torch.device("cuda"), use_triton)

    def stages(self) -> list[Stage]:
        """The stage table of this workload's device (see the module docstring)."""
        table: dict[bool, Callable[[], list[Stage]]] = {True: self._cuda_stages, False: self._cpu_stages}
        if self.frame_format == "nv12":
            return self._nv12_stages()
        return table[self.cuda]()

    def _nv12_stages(self) -> list[Stage]:
        # No host stage and no RGB frame: NVDEC pictures are gathered device to device, CPU-decoded
        # NV12 (half the bytes of BGR) host to device, then one kernel converts and letterboxes.
        return [
            Stage("gather", self.gather_nv12, kind=StageKind.H2D, stream="in"),
            Stage("pre", self.pre_nv12, kind=StageKind.COMPUTE, stream="in", graphable=True),
            Stage("engine", self.run_engine, kind=StageKind.COMPUTE, stream="engine", graphable=True),
            Stage("post", self.post_cuda, kind=StageKind.COMPUTE, stream="out", graphable=bool(self.use_triton)),
            Stage("d2h", self.d2h, kind=StageKind.D2H, stream="out"),
        ]

    def _cuda_stages(self) -> list[Stage]:
        return [
            Stage("load", self.load, kind=StageKind.HOST, stream="load"),
            Stage("h2d", self.h2d, kind=StageKind.H2D, stream="in"),
            Stage("pre", self.pre_cuda, kind=StageKind.COMPUTE, stream="in", graphable=True),
            Stage("engine", self.run_engine, kind=StageKind.COMPUTE, stream="engine", graphable=True),
            Stage("post", self.post_cuda, kind=StageKind.COMPUTE, stream="out", graphable=bool(self.use_triton)),
            Stage("d2h", self.d2h, kind=StageKind.D2H, stream="out"),
        ]

    def _cpu_stages(self) -> list[Stage]:
        return [
            Stage("pre", self.pre_cpu, kind=StageKind.HOST, stream="pre"),
            Stage("engine", self.run_engine, kind=StageKind.COMPUTE, stream="engine"),
            Stage("post", self.post_cpu, kind=StageKind.HOST, stream="post"),
        ]

    # -- setup ----------------------------------------------------------------------------------

    def setup_lane(self, lane: Lane) -> None:
        m, cfg = self.model, self.postprocess
        lane.state["context"] = m.engine.create_context()
        if self.cuda:
            import torch

            from streamrt.ops.letterbox_torch import TorchLetterbox
            from streamrt.ops.postprocess_torch import TorchPostprocess

            dev = lane.device.torch_device
            lane.state["letterbox"] = TorchLetterbox(self.frame_hw, m.input_hw, self.normalize, device=dev,
                                                     batch=self.batch, use_triton=self.use_triton)
            if self.frame_format == "nv12":
                from streamrt.ops.letterbox_torch import TorchNv12Letterbox

                lane.state["letterbox_nv12"] = TorchNv12Letterbox(self.frame_hw, m.input_hw, self.normalize,
                                                                  matrix=self.color_matrix, device=dev,
                                                                  use_triton=self.use_triton)
            out_dtype = getattr(torch, str(m.output_dtype))
            lane.state["post"] = TorchPostprocess(cfg, m.layout, m.num_classes, m.anchors, batch=self.batch,
                                                  device=dev, dtype=out_dtype, use_triton=self.use_triton)
            self._warm_up(lane, dev, out_dtype)
        else:
            lane.state["letterbox"] = CpuLetterbox(self.frame_hw, m.input_hw, self.normalize)
            lane.state["post"] = CpuPostprocess(cfg, m.layout, m.num_classes)

    def _warm_up(self, lane: Lane, dev: Any, out_dtype: Any) -> None:
        """Run the device ops once on zeros: Triton compiles its kernels here, on this thread, not
        on whichever pipeline thread first launches them."""
        import torch

        (h, w), (ih, iw), b, m = self.frame_hw, self.model.input_hw, self.batch, self.model
        images = torch.empty((b, 3, ih, iw), dtype=getattr(torch, str(m.input_dtype)), device=dev)
        if "letterbox_nv12" in lane.state:
            lane.state["letterbox_nv12"](torch.zeros((b, h * 3 // 2, w), dtype=torch.uint8, device=dev), images)
        else:
            lane.state["letterbox"](torch.zeros((b, h, w, 3), dtype=torch.uint8, device=dev), images)
        channels = m.layout.channels(m.num_classes)
        shape = (b, channels, m.anchors) if m.layout.anchors_last else (b, m.anchors, channels)
        dets = torch.empty((b, self.postprocess.max_det, 6), dtype=torch.float32, device=dev)
        lane.state["post"](torch.zeros(shape, dtype=out_dtype, device=dev), dets,
                           torch.empty((b,), dtype=torch.int32, device=dev))

    def setup_slot(self, slot: Slot) -> None:
        (h, w), (ih, iw), b, m = self.frame_hw, self.model.input_hw, self.batch, self.postprocess.max_det
        if self.cuda:
            import torch

            dev, pinned = slot.device, slot.pinned
            if self.frame_format == "nv12":  # no BGR staging: pictures are gathered straight into place
                slot["nv12_dev"] = dev.empty((b, h * 3 // 2, w), torch.uint8)
                slot["nv12_dev"].zero_()
            else:
                slot["frames"] = dev.host_buffer((b, h, w, 3), torch.uint8, pinned=pinned)
                slot["direct"] = [None] * b
                slot["frames_dev"] = dev.empty((b, h, w, 3), torch.uint8)
                slot["frames_dev"].zero_()
            slot["images"] = dev.empty((b, 3, ih, iw), getattr(torch, str(self.model.input_dtype)))
            slot["dets"] = dev.empty((b, m, 6), torch.float32)
            slot["counts"] = dev.empty((b,), torch.int32)
            slot["dets_host"] = dev.host_buffer((b, m, 6), torch.float32, pinned=pinned)
            slot["counts_host"] = dev.host_buffer((b,), torch.int32, pinned=pinned)
        else:
            slot["images"] = np.zeros((b, 3, ih, iw), self.model.input_dtype)
            slot["dets_host"] = np.zeros((b, m, 6), np.float32)
            slot["counts_host"] = np.zeros((b,), np.int32)

    # -- CUDA stages (fn(slot, item, stream)) -------------------------------------------------------

    def load(self, slot: Slot, item: int, stream: Stream) -> None:
        import torch

        frames: list[Frame] = slot.input
        if not slot.pinned:  # the naive loop: copy straight from the caller's (pageable) frames
            slot["frames"] = torch.from_numpy(np.stack([f.image for f in frames]))
            return
        direct: list[Any] = slot["direct"]
        for b, frame in enumerate(frames):
            image = torch.from_numpy(frame.image)
            if image.is_pinned():  # already in page-locked memory (a decoder's pinned buffer): no host copy
                direct[b] = image
            else:
                direct[b] = None
                slot["frames"][b].copy_(image)

    def h2d(self, slot: Slot, item: int, stream: Stream) -> None:
        dev, frames_dev = slot.device, slot["frames_dev"]
        if not slot.pinned:
            n = slot["frames"].shape[0]
            to_device(slot["frames"], dev, stream, out=frames_dev[:n], non_blocking=False)
            return
        for b, image in enumerate(slot["direct"][: len(slot.input)]):
            # The runner keeps every frame referenced until its result is collected, so a direct
            # source buffer stays valid while this asynchronous copy reads it.
            to_device(slot["frames"][b] if image is None else image, dev, stream, out=frames_dev[b])

    def gather_nv12(self, slot: Slot, item: int, stream: Stream) -> None:
        # NVDEC pictures are complete when handed over (the decoder side synchronised its stream).
        gather_pictures(slot["nv12_dev"], [f.image for f in slot.input])

    def pre_nv12(self, slot: Slot, item: int, stream: Stream) -> None:
        slot.lane.state["letterbox_nv12"](slot["nv12_dev"], slot["images"])

    def pre_cuda(self, slot: Slot, item: int, stream: Stream) -> None:
        slot.lane.state["letterbox"](slot["frames_dev"], slot["images"])

    def post_cuda(self, slot: Slot, item: int, stream: Stream) -> None:
        slot.lane.state["post"](slot["raw"], slot["dets"], slot["counts"])

    def d2h(self, slot: Slot, item: int, stream: Stream) -> None:
        for name in ("dets", "counts"):
            to_host(slot[name], stream, out=slot[f"{name}_host"], non_blocking=slot.pinned)

    # -- shared and CPU stages ----------------------------------------------------------------------

    def run_engine(self, slot: Slot, item: int, stream: Stream) -> None:
        images = slot["images"]
        if not self.cuda:
            images = images[: len(slot.input)]
        outputs = slot.lane.state["context"].infer({self.model.input_name: images}, stream)
        slot["raw"] = outputs[self.model.output_name]  # kept alive by the slot until it is reused

    def pre_cpu(self, slot: Slot, item: int, stream: Stream) -> None:
        letterbox, images = slot.lane.state["letterbox"], slot["images"]
        for b, frame in enumerate(slot.input):
            letterbox(frame.image, images[b])

    def post_cpu(self, slot: Slot, item: int, stream: Stream) -> None:
        n = len(slot.input)
        slot.lane.state["post"](np.asarray(slot["raw"]), slot["dets_host"][:n], slot["counts_host"][:n])

    # -- results ------------------------------------------------------------------------------------

    def collect(self, slot: Slot, item: int) -> list[Detections]:
        dets, counts = slot["dets_host"], slot["counts_host"]
        dets = dets.numpy() if not isinstance(dets, np.ndarray) else dets
        counts = counts.numpy() if not isinstance(counts, np.ndarray) else counts
        return split_detections(slot.input, dets, counts, self.geometry)


def split_detections(frames: Sequence[Any], dets: np.ndarray, counts: np.ndarray,
                     geometry: LetterboxGeometry) -> list[Detections]:
    """Each frame's detections in frame pixels, from a batch's ``dets`` (B, max_det, 6) and ``counts`` (B,).

    The whole batch's kept rows are gathered and mapped to frame pixels at once, then split per frame (views of one
    array): 5.0x less consumer CPU per frame than a copy and a mapping per frame at batch 32, 6.2x at 128, 0.79x at
    batch 1 (6 us more, at loads that leave the consumer idle) (``benchmarks/collect_detections.py``, 2026-12-06):
    time the consumer spends holding the GIL at thousands of frames/s.
    """
    if not frames:
        return []
    kept_per_frame = [int(k) for k in counts[: len(frames)]]
    kept = np.concatenate([dets[b, :k] for b, k in enumerate(kept_per_frame)])  # (sum of counts, 6), a copy
    geometry.to_source(kept[:, :4])
    classes = kept[:, 5].astype(np.int64)
    out = []
    start = 0
    for frame, k in zip(frames, kept_per_frame, strict=True):
        end = start + k
        out.append(Detections(frame.source, frame.index, kept[start:end, :4], kept[start:end, 4], classes[start:end],
                              frame.captured))
        start = end
    return out
