"""Send images to the served detection ensemble ("detect") with tritonclient and print the boxes.

Serve the example's models first (the detector file copied in, see models/detector/config.pbtxt):

    cp src/streamrt/video/assets/shapes_detector.onnx examples/12-detection-ensemble/models/detector/1/model.onnx
    streamrt serve examples/12-detection-ensemble/models
    python examples/12-detection-ensemble/client.py photo.jpg other.png     # or no files: a synthetic frame
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

LABELS = ("circle", "square", "triangle", "star", "cross")  # the bundled shapes detector's classes


def detect(url: str, images: list[bytes], protocol: str = "http") -> list[np.ndarray]:
    """The detections (x1, y1, x2, y2, score, class in frame pixels) of each encoded image."""
    if protocol == "grpc":
        import tritonclient.grpc as client_module
    else:
        import tritonclient.http as client_module  # type: ignore[no-redef]
    client = client_module.InferenceServerClient(url)
    item = client_module.InferInput("IMAGE", [len(images), 1], "BYTES")
    item.set_data_from_numpy(np.array([[data] for data in images], dtype=np.object_))
    result = client.infer("detect", [item])
    client.close()
    dets, counts = result.as_numpy("DETECTIONS"), result.as_numpy("COUNT")[:, 0]
    return [dets[i, : counts[i]] for i in range(len(images))]


def _synthetic_png() -> bytes:
    import cv2

    from streamrt.video.synthetic import SyntheticClip

    return bytes(cv2.imencode(".png", SyntheticClip(width=640, height=480, frames=1).frame(0))[1].tobytes())


# The formats the ensemble's decode step reads, by their first bytes.
_MAGIC = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG"}


def read_image(path: Path) -> bytes:
    """The encoded bytes of a JPEG or PNG file; ValueError (one line) for a missing or non-image file."""
    if not path.is_file():
        raise ValueError(f"image not found: {path}")
    data = path.read_bytes()
    if not any(data.startswith(magic) for magic in _MAGIC):
        raise ValueError(f"{path} is not a JPEG or PNG image (it starts with {data[:8]!r})")
    return data


def _fail(prog: str, message: str) -> NoReturn:
    """One line on stderr and exit status 2, as the ``streamrt`` commands do."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> list[np.ndarray]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*", type=Path, help="JPEG/PNG files (up to 8; none: a synthetic frame)")
    parser.add_argument("--url", default="127.0.0.1:8000", help="server address (gRPC: port 8001)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = parser.parse_args(argv)
    try:
        images = [read_image(p) for p in args.images] or [_synthetic_png()]
    except ValueError as exc:
        _fail(parser.prog, str(exc))
    try:
        found = detect(args.url, images, args.protocol)
    except Exception as exc:  # tritonclient's InferenceServerException, a refused connection: one line
        message = " ".join(str(getattr(exc, "message", lambda: None)() or exc).split())
        _fail(parser.prog, f"the server at {args.url} ({args.protocol}) failed: {message[:300]}")
    for name, boxes in zip([str(p) for p in args.images] or ["synthetic"], found, strict=True):
        print(f"{name}: {len(boxes)} objects")
        for x1, y1, x2, y2, score, cls in boxes:
            print(f"  {LABELS[int(cls)]:8s} {score:.2f}  ({x1:.0f}, {y1:.0f}) - ({x2:.0f}, {y2:.0f})")
    return found


if __name__ == "__main__":
    main()
