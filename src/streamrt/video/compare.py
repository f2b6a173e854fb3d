"""Compare two runs' detections frame by frame and say what differs: counts, boxes, scores, classes.

Two runs of one camera (a batched run against the camera alone, a GPU run against the CPU path)
either compute the same thing, and then their detections are equal row for row, or they compute it
with different rounding (another batch size picks other kernels; TF32 or fp16 math), and then the
same objects are found with slightly moved boxes and scores, and a detection whose score sits at the
confidence threshold may be found by one run only. :func:`diff_detections` checks either contract
and, when it does not hold, names the first frames and rows that break it, so a failing check says
*what* differs instead of ``False``.

* ``match_iou=None``: row for row (same count, same classes, boxes within ``box_atol`` pixels,
  scores within ``score_atol``): the contract of runs that use the same kernels.
* ``match_iou=0.5``: each detection of ``got`` is matched to the reference detection of the same
  class with the highest IoU (greedy by score); matched pairs must agree within the tolerances, and
  a detection left unmatched is allowed only if its score is within ``score_atol`` of ``conf``
  (the threshold could have gone either way).

Example:
    >>> import numpy as np
    >>> a = Detections(0, 0, np.array([[0, 0, 10, 10]], np.float32), np.array([0.9], np.float32), np.array([1]))
    >>> b = Detections(0, 0, np.array([[0, 0, 10, 12]], np.float32), np.array([0.9], np.float32), np.array([1]))
    >>> print(diff_detections([a], [b], box_atol=1.0).format())
    1 frame(s): 1 differ; max |box| 2 px, max |score| 0
      camera 0 frame 0 row 0: box [0.0, 0.0, 10.0, 10.0] -> [0.0, 0.0, 10.0, 12.0] (|d| 2 > 1 px)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamrt.video.metrics import box_iou
from streamrt.video.workload import Detections

__all__ = ["DetectionDiff", "diff_detections"]


@dataclass
class DetectionDiff:
    """What :func:`diff_detections` found.

    Attributes:
        frames: frames compared.
        max_box: largest box-coordinate difference (pixels) over compared (or matched) rows.
        max_score: largest score difference over compared (or matched) rows.
        problems: one line per frame that breaks the contract (its first differing row).
        unmatched_near_conf: detections of one run only whose score was within ``score_atol`` of ``conf``.
    """

    frames: int = 0
    max_box: float = 0.0
    max_score: float = 0.0
    problems: list[str] = field(default_factory=list)
    unmatched_near_conf: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self, limit: int = 8) -> str:
        """A summary line and the first ``limit`` problems, indented."""
        head = (f"{self.frames} frame(s): {len(self.problems)} differ; max |box| {self.max_box:.3g} px, "
                f"max |score| {self.max_score:.3g}")
        if self.unmatched_near_conf:
            head += f"; {self.unmatched_near_conf} detection(s) of one run only, at the confidence threshold"
        lines = [head, *(f"  {p}" for p in self.problems[:limit])]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more")
        return "\n".join(lines)


def _row(det: Detections, i: int) -> str:
    box = [round(float(v), 2) for v in det.boxes[i]]
    return f"{box} score {float(det.scores[i]):.4f} class {int(det.classes[i])}"


def _rowwise(a: Detections, b: Detections, box_atol: float, score_atol: float, out: DetectionDiff) -> str | None:
    where = f"camera {b.source} frame {b.index}"
    if len(a) != len(b):
        first = next((i for i in range(min(len(a), len(b))) if a.classes[i] != b.classes[i]
                      or np.abs(a.boxes[i] - b.boxes[i]).max() > box_atol), min(len(a), len(b)))
        ra = _row(a, first) if first < len(a) else "-"
        rb = _row(b, first) if first < len(b) else "-"
        return f"{where}: {len(a)} -> {len(b)} detections; first difference at row {first}: {ra} -> {rb}"
    if not len(a):
        return None
    dbox = np.abs(a.boxes - b.boxes).max(axis=1)
    dscore = np.abs(a.scores - b.scores)
    out.max_box = max(out.max_box, float(dbox.max()))
    out.max_score = max(out.max_score, float(dscore.max()))
    for i in range(len(a)):
        if a.classes[i] != b.classes[i]:
            return f"{where} row {i}: class {int(a.classes[i])} -> {int(b.classes[i])} ({_row(a, i)} -> {_row(b, i)})"
        if dbox[i] > box_atol:
            return (f"{where} row {i}: box {[round(float(v), 2) for v in a.boxes[i]]} -> "
                    f"{[round(float(v), 2) for v in b.boxes[i]]} (|d| {dbox[i]:.3g} > {box_atol:g} px)")
        if dscore[i] > score_atol:
            return f"{where} row {i}: score {float(a.scores[i]):.5f} -> {float(b.scores[i]):.5f} (> {score_atol:g})"
    return None


def _matched(a: Detections, b: Detections, iou: float, box_atol: float, score_atol: float, conf: float,
             out: DetectionDiff) -> str | None:
    where = f"camera {b.source} frame {b.index}"
    overlaps = box_iou(b.boxes, a.boxes) if len(a) and len(b) else np.zeros((len(b), len(a)))
    overlaps[np.asarray(b.classes)[:, None] != np.asarray(a.classes)[None, :]] = 0.0
    taken = np.zeros(len(a), bool)
    problem = None
    for i in np.argsort(-np.asarray(b.scores), kind="stable"):
        candidates = np.where(taken, -1.0, overlaps[i]) if len(a) else np.zeros(0)
        j = int(np.argmax(candidates)) if len(a) else -1
        if j < 0 or candidates[j] < iou:
            if abs(float(b.scores[i]) - conf) <= score_atol:
                out.unmatched_near_conf += 1
                continue
            problem = problem or f"{where}: {_row(b, i)} has no match in the reference (best IoU " \
                                 f"{float(candidates.max()) if len(a) else 0:.2f})"
            continue
        taken[j] = True
        dbox, dscore = float(np.abs(a.boxes[j] - b.boxes[i]).max()), abs(float(a.scores[j] - b.scores[i]))
        out.max_box, out.max_score = max(out.max_box, dbox), max(out.max_score, dscore)
        if dbox > box_atol or dscore > score_atol:
            problem = problem or (f"{where}: {_row(a, j)} -> {_row(b, i)} (|box| {dbox:.3g} px, "
                                  f"|score| {dscore:.3g}; allowed {box_atol:g} px, {score_atol:g})")
    for j in (int(k) for k in np.flatnonzero(~taken)):
        if abs(float(a.scores[j]) - conf) <= score_atol:
            out.unmatched_near_conf += 1
        else:
            problem = problem or f"{where}: reference {_row(a, j)} was not found"
    return problem


def diff_detections(reference: Sequence[Detections], got: Sequence[Detections], *, box_atol: float = 0.0,
                    score_atol: float = 1e-6, match_iou: float | None = None, conf: float = 0.25) -> DetectionDiff:
    """Compare ``got`` with ``reference`` frame by frame (same order); see the module docstring.

    Args:
        reference, got: detections of the same frames in the same order.
        box_atol: allowed box-coordinate difference, in the detections' (frame) pixels.
        score_atol: allowed score difference (and, matched, the band around ``conf`` where a
            detection of one run only is allowed).
        match_iou: None compares row for row; a number matches detections by IoU first.
        conf: the runs' confidence threshold (matched mode).
    """
    out = DetectionDiff()
    if len(reference) != len(got):
        out.problems.append(f"{len(reference)} reference frame(s) but {len(got)} compared")
    for a, b in zip(reference, got, strict=False):
        out.frames += 1
        if a.index != b.index:  # the sources may differ: a camera alone is source 0
            out.problems.append(f"frame order: reference frame {a.index} compared with frame {b.index}")
            continue
        if match_iou is None:
            problem = _rowwise(a, b, box_atol, score_atol, out)
        else:
            problem = _matched(a, b, match_iou, box_atol, score_atol, conf, out)
        if problem is not None:
            out.problems.append(problem)
    return out
