"""Image-like calibration and test data for a model with one NCHW image input.

int8 calibration needs samples that look like what the model will see in service: random
normal noise calibrates the activation ranges of noise, not of pictures. :func:`synthetic_images`
draws pictures: a smooth background gradient with a few filled rectangles and discs in random
colours, in [0, 1], then normalised with the ImageNet mean and standard deviation as most vision
models expect.

Run ``python -m streamrt.testing.calib MODEL.onnx DEST`` with DEST a folder (one ``.npy`` sample
per file, the layout ``streamrt build --calib DEST`` reads) or a ``.npz`` file (one batch keyed by
the input name, the layout ``streamrt compare --inputs`` reads). Use another ``--seed`` for test
data than for calibration data, so the accuracy is measured on pictures the calibration never saw::

    python -m streamrt.testing.calib cnn.onnx calib_dir/            # 64 calibration samples
    python -m streamrt.testing.calib cnn.onnx test.npz --seed 1     # a held-out batch of 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from streamrt.errors import ConfigError, StreamRTError, describe_os_error
from streamrt.onnx.model import load_model

__all__ = ["synthetic_images", "write_calibration_data"]

_MEAN = np.array([0.485, 0.456, 0.406])
_STD = np.array([0.229, 0.224, 0.225])


def _picture(rng: np.random.Generator, channels: int, height: int, width: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    a, b = rng.uniform(-1, 1, size=(2, channels, 1, 1))
    img = rng.uniform(0.2, 0.8, size=(channels, 1, 1)) + 0.3 * (a * yy + b * xx)
    for _ in range(int(rng.integers(1, 5))):
        colour = rng.uniform(0, 1, size=(channels, 1, 1))
        cy, cx = rng.uniform(0, 1, size=2) * (height, width)
        ry, rx = rng.uniform(0.1, 0.4, size=2) * (height, width)
        if rng.random() < 0.5:
            mask = (np.abs(yy * max(height, width) - cy) < ry) & (np.abs(xx * max(height, width) - cx) < rx)
        else:
            mask = ((yy * max(height, width) - cy) / ry) ** 2 + ((xx * max(height, width) - cx) / rx) ** 2 < 1
        img = np.where(mask, colour, img)
    img = np.clip(img + rng.normal(0, 0.02, size=img.shape), 0, 1)
    mean = _MEAN[:channels] if channels <= 3 else np.full(channels, 0.45)
    std = _STD[:channels] if channels <= 3 else np.full(channels, 0.225)
    return (img - mean[:, None, None]) / std[:, None, None]


def synthetic_images(count: int, channels: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """``count`` normalised pictures as a float32 array ``(count, channels, height, width)``."""
    rng = np.random.default_rng(seed)
    return np.stack([_picture(rng, channels, height, width) for _ in range(count)]).astype(np.float32)


def _image_input(model_path: Path) -> tuple[str, tuple[int, int, int]]:
    model = load_model(model_path)
    if len(model.inputs) != 1:
        raise ConfigError(
            f"{model_path} has {len(model.inputs)} inputs; image data is for a model with one NCHW input",
            hint="write .npz samples keyed by input name yourself (see docs/building.md)",
        )
    spec = model.inputs[0]
    chw = spec.shape[1:]
    if len(spec.shape) != 4 or any(d < 1 for d in chw):
        raise ConfigError(
            f"input {spec.name!r} of {model_path} has shape {spec.shape}; expected N x C x H x W with C, H, W fixed",
            hint="write .npz samples keyed by input name yourself (see docs/building.md)",
        )
    return spec.name, (chw[0], chw[1], chw[2])


def write_calibration_data(model_path: str | Path, dest: str | Path, *, count: int = 64, seed: int = 0) -> Path:
    """Write pictures for ``model_path``'s image input: a folder of ``.npy`` samples, or one ``.npz`` batch."""
    model_path, dest = Path(model_path), Path(dest)
    name, (c, h, w) = _image_input(model_path)
    images = synthetic_images(count, c, h, w, seed)
    if dest.suffix == ".npz":
        dest.parent.mkdir(parents=True, exist_ok=True)
        np.savez(dest, **{name: images})  # type: ignore[arg-type]  # numpy stubs type allow_pickle here
    else:
        dest.mkdir(parents=True, exist_ok=True)
        for i, img in enumerate(images):
            np.save(dest / f"{i:04d}.npy", img)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamrt.testing.calib",
        description="Write image-like calibration data (a folder of .npy samples) or a test batch (.npz).",
    )
    parser.add_argument("model", type=Path, help="ONNX model with one N x C x H x W input")
    parser.add_argument("dest", type=Path, help="folder (calibration samples) or FILE.npz (one batch)")
    parser.add_argument("--count", type=int, help="pictures to write (default 64 for a folder, 8 for .npz)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0; use another for test data)")
    args = parser.parse_args(argv)
    count = args.count or (8 if args.dest.suffix == ".npz" else 64)
    try:
        dest = write_calibration_data(args.model, args.dest, count=count, seed=args.seed)
    except StreamRTError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only or missing folder: one line, not a traceback
        print(f"{parser.prog}: error: cannot write {describe_os_error(exc)} "
              "(hint: give a destination in a folder you can write to)", file=sys.stderr)
        return 2
    print(f"wrote {count} image-like samples to {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
