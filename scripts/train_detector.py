"""Train StreamRT's bundled detector on generated shapes, export it to ONNX and measure its mAP@0.5.

Everything is generated here, nothing is downloaded: training images are random scenes from
:mod:`streamrt.video.synthetic` (five shape classes on textured backgrounds) passed through the
same letterbox op the detection pipeline uses, so the model sees exactly what it gets at run time.
The network is :class:`streamrt.testing.yolo.YoloLike` (YOLOv8-style, width 0.125: 0.7 M
parameters), trained with a task-aligned assigner (YOLOv8's TAL), BCE class loss and GIoU box
loss, AdamW with a cosine schedule and an EMA of the weights. The export is a plain YOLOv8
layout ONNX file (``(batch, 4 + 5, anchors)``, dynamic batch) with Ultralytics-style metadata
(``names``, ``imgsz``), so it runs through exactly the path users' models take.

Deterministic: data of step ``k`` comes from seed ``(seed, k)`` wherever it is generated, torch
runs deterministic algorithms with a fixed thread count.

Usage::

    python scripts/train_detector.py                      # ~25 min on 2 cores; writes src/streamrt/video/assets/
    python scripts/train_detector.py --steps 100 --out /tmp/det      # a quick smoke run
    python scripts/train_detector.py --eval-only src/streamrt/video/assets/shapes_detector.onnx
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from streamrt.ops.letterbox import CpuLetterbox
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig
from streamrt.testing.yolo import YoloLike
from streamrt.video.metrics import mean_average_precision
from streamrt.video.synthetic import CLASS_NAMES, SceneConfig, random_scene

log = logging.getLogger("train_detector")

ASSETS = Path(__file__).resolve().parents[1] / "src" / "streamrt" / "video" / "assets"
MODEL_NAME = "shapes_detector"
# Frame shapes (height, width) the generated training scenes take before letterboxing.
_ASPECTS = ((9, 16), (9, 16), (3, 4), (1, 1), (16, 9))
_EVAL_FRAMES = ((720, 1280), (1080, 1920), (480, 640), (600, 600))


# -- data ------------------------------------------------------------------------------------------


def training_sample(rng: np.random.Generator, imgsz: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One letterboxed scene: input (3, imgsz, imgsz) float32, boxes (n, 4) in input pixels, classes (n,)."""
    ah, aw = _ASPECTS[int(rng.integers(len(_ASPECTS)))]
    scale = imgsz / max(ah, aw) * float(rng.choice([1.0, 1.0, 1.0, 1.5, 2.0]))
    h, w = max(32, round(ah * scale)), max(32, round(aw * scale))
    image, truth = random_scene(rng, h, w, SceneConfig(max_objects=10))
    if rng.random() < 0.5:
        image = np.ascontiguousarray(image[:, ::-1])
        boxes = truth.boxes.copy()
        boxes[:, [0, 2]] = w - truth.boxes[:, [2, 0]]
    else:
        boxes = truth.boxes.copy()
    op = CpuLetterbox((h, w), (imgsz, imgsz))
    x = np.empty((3, imgsz, imgsz), np.float32)
    op(image, x)
    return x, op.geometry.to_input(boxes), truth.classes


class SyntheticBatches(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Batch ``k`` is a pure function of ``(seed, k)``, so worker processes change nothing."""

    def __init__(self, steps: int, batch: int, imgsz: int, seed: int) -> None:
        self.steps, self.batch, self.imgsz, self.seed = steps, batch, imgsz, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        samples = [training_sample(rng, self.imgsz) for _ in range(self.batch)]
        most = max(1, max(len(c) for _, _, c in samples))
        boxes = np.zeros((self.batch, most, 4), np.float32)
        classes = np.zeros((self.batch, most), np.int64)
        valid = np.zeros((self.batch, most), bool)
        for i, (_, b, c) in enumerate(samples):
            boxes[i, : len(c)], classes[i, : len(c)], valid[i, : len(c)] = b, c, True
        return {
            "images": torch.from_numpy(np.stack([x for x, _, _ in samples])),
            "boxes": torch.from_numpy(boxes),
            "classes": torch.from_numpy(classes),
            "valid": torch.from_numpy(valid),
        }


# -- model outputs for training (the same modules and decode as YoloLike.forward) ----------------------


def raw_outputs(model: YoloLike, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoded boxes (B, N, 4) xyxy, class logits (B, N, C), anchor points (N, 2), strides (N,)."""
    feats = model.features(images)
    head = model.head
    boxes, logits, points, strides = [], [], [], []
    for feat, box, cls, stride in zip(feats, head.box, head.cls, head.strides, strict=True):
        h, w = feat.shape[2:]
        gy, gx = torch.meshgrid(torch.arange(h, dtype=feat.dtype) + 0.5, torch.arange(w, dtype=feat.dtype) + 0.5,
                                indexing="ij")
        dist = F.softplus(box(feat)) * stride
        px, py = (gx * stride).flatten(), (gy * stride).flatten()
        d = dist.flatten(2)  # (B, 4, hw): left, top, right, bottom
        boxes.append(torch.stack([px - d[:, 0], py - d[:, 1], px + d[:, 2], py + d[:, 3]], 2))
        logits.append(cls(feat).flatten(2).transpose(1, 2))
        points.append(torch.stack([px, py], 1))
        strides.append(torch.full((h * w,), float(stride)))
    return torch.cat(boxes, 1), torch.cat(logits, 1), torch.cat(points), torch.cat(strides)


def pairwise_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of broadcast box tensors (..., 4) xyxy."""
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a + area_b - inter + 1e-7)


def giou_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    iou = pairwise_iou(a, b)
    hull = (torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])).clamp(min=0).prod(-1)
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = (a[..., 2:] - a[..., :2]).prod(-1) + (b[..., 2:] - b[..., :2]).prod(-1) - inter
    return 1 - (iou - (hull - union) / (hull + 1e-7))


@torch.no_grad()
def assign(pred_boxes: torch.Tensor, pred_scores: torch.Tensor, points: torch.Tensor, gt_boxes: torch.Tensor,
           gt_classes: torch.Tensor, gt_valid: torch.Tensor, topk: int = 10) -> tuple[torch.Tensor, ...]:
    """Task-aligned assignment (YOLOv8): per truth, the top-k anchors inside it by score^0.5 * IoU^6.

    Returns target boxes (B, N, 4), target scores (B, N, C) and the foreground mask (B, N).
    """
    b, n, c = pred_scores.shape
    inside = ((points[None, None] > gt_boxes[:, :, None, :2]) & (points[None, None] < gt_boxes[:, :, None, 2:])).all(-1)
    inside &= gt_valid[:, :, None]
    ious = pairwise_iou(gt_boxes[:, :, None, :], pred_boxes[:, None, :, :]).clamp(min=0)  # (B, M, N)
    cls_scores = pred_scores.gather(2, gt_classes[:, None, :].expand(b, n, -1)).transpose(1, 2)  # (B, M, N)
    align = cls_scores.pow(0.5) * ious.pow(6) * inside
    k = min(topk, n)
    top = align.topk(k, dim=2).indices
    chosen = torch.zeros_like(inside).scatter_(2, top, True) & inside
    # Fall back to every anchor inside a tiny truth when no alignment is positive yet (start of training).
    chosen |= inside & (align.amax(2, keepdim=True) <= 0) & (inside.sum(2, keepdim=True) <= k)
    multi = chosen.sum(1) > 1
    if multi.any():
        best = torch.where(chosen, ious, torch.full_like(ious, -1)).argmax(1)  # (B, N)
        one = torch.zeros_like(chosen).scatter_(1, best[:, None], True)
        chosen = torch.where(multi[:, None], one & chosen, chosen)
    fg = chosen.any(1)
    gt_index = chosen.float().argmax(1)  # (B, N)
    target_boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))
    target_classes = gt_classes.gather(1, gt_index)
    align = align * chosen
    norm = (align * ious.amax(2, keepdim=True) / (align.amax(2, keepdim=True) + 1e-9)).amax(1)  # (B, N)
    target_scores = F.one_hot(target_classes, c).float() * (norm * fg)[..., None]
    return target_boxes, target_scores, fg


def detection_loss(model: YoloLike, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    pred_boxes, logits, points, _ = raw_outputs(model, batch["images"])
    target_boxes, target_scores, fg = assign(pred_boxes.detach(), logits.detach().sigmoid(), points,
                                             batch["boxes"], batch["classes"], batch["valid"])
    norm = target_scores.sum().clamp(min=1)
    loss_cls = F.binary_cross_entropy_with_logits(logits, target_scores, reduction="sum") / norm
    weight = target_scores.sum(-1)[fg]
    loss_box = (giou_loss(pred_boxes[fg], target_boxes[fg]) * weight).sum() / norm
    loss = 7.5 * loss_box + 0.5 * loss_cls
    return loss, {"box": float(loss_box.detach()), "cls": float(loss_cls.detach()), "fg": float(fg.sum()) / fg.shape[0]}


class Ema:
    """Exponential moving average of the weights (and BN buffers), ramped up over the first steps."""

    def __init__(self, model: nn.Module, decay: float = 0.998, tau: float = 300.0) -> None:
        import copy

        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.decay * (1 - math.exp(-self.updates / self.tau))
        for ema_v, v in zip(self.model.state_dict().values(), model.state_dict().values(), strict=True):
            if ema_v.dtype.is_floating_point:
                ema_v.mul_(d).add_(v.detach(), alpha=1 - d)
            else:
                ema_v.copy_(v)


def _single_thread(worker: int) -> None:
    import cv2

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cv2.setNumThreads(1)


def train(args: argparse.Namespace) -> tuple[YoloLike, dict[str, Any]]:
    torch.manual_seed(args.seed)
    model = YoloLike(num_classes=len(CLASS_NAMES), width=args.width, depth=0.34)
    model.train()
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        (decay if p.ndim > 1 and "bn" not in name else no_decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0}],
                                  lr=args.lr, betas=(0.937, 0.999))
    warmup = min(100, args.steps // 10)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    ema = Ema(model)
    data = torch.utils.data.DataLoader(SyntheticBatches(args.steps, args.batch, args.imgsz, args.seed),
                                       batch_size=None, shuffle=False, num_workers=args.workers,
                                       prefetch_factor=4 if args.workers else None, worker_init_fn=_single_thread)
    started = time.perf_counter()
    for step, batch in enumerate(data):
        loss, parts = detection_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        scheduler.step()
        ema.update(model)
        if step % 50 == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - started
            log.info("step %4d/%d  loss %.3f (box %.3f cls %.3f, %.1f fg/img)  lr %.2e  %.0f s",
                     step, args.steps, float(loss), parts["box"], parts["cls"], parts["fg"],
                     scheduler.get_last_lr()[0], elapsed)
    facts = {"steps": args.steps, "batch": args.batch, "imgsz": args.imgsz, "width": args.width,
             "seed": args.seed, "train_seconds": round(time.perf_counter() - started, 1),
             "threads": torch.get_num_threads(), "parameters": sum(p.numel() for p in model.parameters())}
    assert isinstance(ema.model, YoloLike)
    return ema.model, facts


# -- export and evaluation -------------------------------------------------------------------------


def export(model: YoloLike, imgsz: int, path: Path, metadata: dict[str, str]) -> None:
    import onnx

    model = model.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, 3, imgsz, imgsz),), buffer, dynamo=False, opset_version=17,  # type: ignore[arg-type]
                          input_names=["images"], output_names=["output0"],
                          dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}})
    proto = onnx.load_from_string(buffer.getvalue())
    proto.producer_name = "streamrt scripts/train_detector.py"
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(path))


def evaluate(model_path: Path, images: int, seed: int, imgsz: int) -> dict[str, Any]:
    """mAP@0.5 of an ONNX file on held-out full-size scenes, through the deployment ops and ONNX Runtime."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    post = CpuPostprocess(PostprocessConfig(conf=0.001, iou=0.6, max_det=100), "yolov8", len(CLASS_NAMES))
    x = np.empty((1, 3, imgsz, imgsz), np.float32)
    dets, counts = np.empty((1, 100, 6), np.float32), np.empty(1, np.int32)
    predictions, truths = [], []
    rng = np.random.default_rng([seed, 10**6])  # a stream the training batches never use
    for i in range(images):
        h, w = _EVAL_FRAMES[i % len(_EVAL_FRAMES)]
        image, truth = random_scene(rng, h, w)
        op = CpuLetterbox((h, w), (imgsz, imgsz))
        op(image, x)
        (raw,) = session.run(None, {"images": x})
        post(raw, dets, counts)
        kept = dets[0, : counts[0]].copy()
        op.geometry.to_source(kept[:, :4])
        predictions.append((kept[:, :4], kept[:, 4], kept[:, 5].astype(np.int64)))
        truths.append((truth.boxes, truth.classes))
    result = mean_average_precision(predictions, truths, len(CLASS_NAMES), iou=0.5)
    return {"map50": round(result.map, 4), "images": images, "objects": result.truths,
            "per_class": {CLASS_NAMES[c]: round(ap, 4) for c, ap in result.per_class.items()},
            "frame_sizes": [f"{w}x{h}" for h, w in _EVAL_FRAMES]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps (default 1500)")
    parser.add_argument("--batch", type=int, default=32, help="images per step (default 32)")
    parser.add_argument("--imgsz", type=int, default=320, help="square model input (default 320)")
    parser.add_argument("--width", type=float, default=0.125, help="YoloLike width multiplier (default 0.125)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--workers", type=int, default=1, help="data generation processes (default 1)")
    parser.add_argument("--eval-images", type=int, default=500, help="held-out scenes for mAP (default 500)")
    parser.add_argument("--out", type=Path, default=ASSETS, help=f"output folder (default {ASSETS})")
    parser.add_argument("--eval-only", type=Path, metavar="ONNX", help="only evaluate this model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    # Without this, tiny activations (SiLU of very negative inputs) and gradients become subnormal
    # floats as training goes on, and the CPU slows down about 5x on them.
    torch.set_flush_denormal(True)
    if args.eval_only is not None:
        print(json.dumps(evaluate(args.eval_only, args.eval_images, args.seed, args.imgsz), indent=2))
        return 0
    model, facts = train(args)
    path = args.out / f"{MODEL_NAME}.onnx"
    names = {i: n for i, n in enumerate(CLASS_NAMES)}
    export(model, args.imgsz, path, {"names": repr(names), "imgsz": repr([args.imgsz, args.imgsz]), "stride": "32",
                                     "task": "detect", "author": "StreamRT",
                                     "description": "YOLOv8-style detector of synthetic shapes "
                                                    "(scripts/train_detector.py)"})
    (args.out / f"{MODEL_NAME}.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    started = time.perf_counter()
    facts["eval"] = evaluate(path, args.eval_images, args.seed, args.imgsz)
    facts["eval_seconds"] = round(time.perf_counter() - started, 1)
    facts["onnx_bytes"] = path.stat().st_size
    facts["torch"] = torch.__version__
    (args.out / f"{MODEL_NAME}.json").write_text(json.dumps(facts, indent=2) + "\n")
    log.info("mAP@0.5 %.3f on %d held-out scenes; wrote %s (%.2f MB)", facts["eval"]["map50"], args.eval_images,
             path, facts["onnx_bytes"] / 2**20)
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
