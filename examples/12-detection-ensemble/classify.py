"""Send images to the served two-stage ensemble ("detect_classify") and print each box with its crop's class.

Serve the example's models first (the detector copied in and the classifier written, see their configs):

    cp src/streamrt/video/assets/shapes_detector.onnx examples/12-detection-ensemble/models/detector/1/model.onnx
    python examples/12-detection-ensemble/make_classifier.py
    streamrt serve examples/12-detection-ensemble/models
    python examples/12-detection-ensemble/classify.py photo.jpg      # or no files: a synthetic frame
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def detect_classify(url: str, images: list[bytes], protocol: str = "http") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per encoded image: its detections (x1, y1, x2, y2, score, class in frame pixels) and the
    classifier's scores of each detection's crop ([count, classes])."""
    if protocol == "grpc":
        import tritonclient.grpc as client_module
    else:
        import tritonclient.http as client_module  # type: ignore[no-redef]
    client = client_module.InferenceServerClient(url)
    item = client_module.InferInput("IMAGE", [len(images), 1], "BYTES")
    item.set_data_from_numpy(np.array([[data] for data in images], dtype=np.object_))
    try:
        result = client.infer("detect_classify", [item])
    finally:
        client.close()
    dets, counts, scores = result.as_numpy("DETECTIONS"), result.as_numpy("COUNT")[:, 0], result.as_numpy("SCORES")
    return [(dets[i, : counts[i]], scores[i, : counts[i]]) for i in range(len(images))]


def main(argv: list[str] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from client import LABELS, _synthetic_png  # the detection client next to this file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*", type=Path, help="JPEG/PNG files (up to 8; none: a synthetic frame)")
    parser.add_argument("--url", default="127.0.0.1:8000", help="server address (gRPC: port 8001)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = parser.parse_args(argv)
    images = [p.read_bytes() for p in args.images] or [_synthetic_png()]
    found = detect_classify(args.url, images, args.protocol)
    for name, (boxes, scores) in zip([str(p) for p in args.images] or ["synthetic"], found, strict=True):
        print(f"{name}: {len(boxes)} objects")
        for (x1, y1, x2, y2, score, cls), crop_scores in zip(boxes, scores, strict=True):
            best = int(np.argmax(crop_scores))
            print(f"  {LABELS[int(cls)]:8s} {score:.2f}  ({x1:.0f}, {y1:.0f}) - ({x2:.0f}, {y2:.0f})  "
                  f"crop class {best} ({crop_scores[best]:.2f})")
    return found


if __name__ == "__main__":
    main()
