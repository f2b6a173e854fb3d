"""NV12 -> model input: the colour matrices, the NumPy reference, the torch version, and (with
``TRITON_INTERPRET=1``, see tests/ops/test_triton_interpret.py) the fused Triton kernel, on fresh
random pictures against the float64 reference.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from streamrt.errors import ConfigError, ShapeError
from streamrt.ops.letterbox import CpuLetterbox, Normalize
from streamrt.ops.nv12 import COLOR_MATRICES, CpuNv12Letterbox, nv12_to_rgb, rgb_to_nv12

torch = pytest.importorskip("torch")


def _random_nv12(rng: np.random.Generator, b: int, h: int, w: int) -> np.ndarray:
    """Full-swing random NV12 (Y, U, V all 0..255: out-of-gamut colours exercise the clamping)."""
    return rng.integers(0, 256, (b, h * 3 // 2, w), dtype=np.uint8)


@pytest.mark.parametrize("matrix", list(COLOR_MATRICES))
def test_matrix_inverts_rgb_to_nv12(matrix: str) -> None:
    rng = np.random.default_rng()
    rgb = rng.integers(0, 256, (16, 24, 3)).astype(np.float64)
    rgb = np.repeat(np.repeat(rgb[::2, ::2], 2, 0), 2, 1)  # flat 2x2 blocks: 4:2:0 loses nothing
    back = nv12_to_rgb(rgb_to_nv12(rgb, matrix), matrix)
    assert np.abs(back - rgb).max() <= 2.5  # 8-bit YUV rounding, amplified by the matrix


def test_bt601_matches_ffmpeg_on_flat_colours() -> None:
    av = pytest.importorskip("av")
    rng = np.random.default_rng()
    for colour in rng.integers(0, 256, (8, 3)):
        img = np.broadcast_to(colour.astype(np.uint8), (8, 8, 3)).copy()
        nv12 = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="nv12").to_ndarray()
        assert np.abs(nv12_to_rgb(nv12, "bt601") - img).max() <= 3.0  # FFmpeg's default is BT.601 limited


def test_reference_letterbox_equals_rgb_letterbox_of_the_converted_picture() -> None:
    rng = np.random.default_rng()
    nv12 = _random_nv12(rng, 1, 90, 160)[0]
    n = Normalize(mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25))
    ours = CpuNv12Letterbox((90, 160), (64, 64), n)(nv12, np.empty((3, 64, 64), np.float32))
    rgb = nv12_to_rgb(nv12)
    # Frames as BGR uint8 through the existing letterbox: the same up to the uint8 rounding of the colours.
    ref = CpuLetterbox((90, 160), (64, 64), n, method="numpy")(np.rint(rgb[..., ::-1]).astype(np.uint8),
                                                               np.empty((3, 64, 64), np.float32))
    assert np.abs(ours - ref).max() <= 0.5 / 255 / min(n.std) + 1e-5


@pytest.mark.parametrize("bgr_to_rgb", [True, False])
@pytest.mark.parametrize("matrix", list(COLOR_MATRICES))
def test_torch_version_equals_the_reference(matrix: str, bgr_to_rgb: bool) -> None:
    from streamrt.ops.letterbox_torch import TorchNv12Letterbox

    rng = np.random.default_rng()
    src, dst = (62, 98), (48, 64)
    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), bgr_to_rgb=bgr_to_rgb)
    frames = _random_nv12(rng, 2, *src)
    out = torch.full((2, 3, *dst), float("nan"))
    TorchNv12Letterbox(src, dst, n, matrix=matrix, device="cpu", use_triton=False)(torch.from_numpy(frames), out)
    for b in range(2):
        ref = CpuNv12Letterbox(src, dst, n, matrix)(frames[b], np.empty((3, *dst), np.float64))
        np.testing.assert_allclose(out[b].numpy(), ref, rtol=0, atol=2e-4)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs triton and TRITON_INTERPRET=1")
@pytest.mark.parametrize(("src", "dst", "matrix", "bgr_to_rgb"),
                         [((90, 160), (64, 64), "bt601", True), ((62, 98), (96, 64), "bt709", False)])
def test_triton_kernel_equals_the_reference(src: tuple[int, int], dst: tuple[int, int], matrix: str,
                                            bgr_to_rgb: bool) -> None:
    from streamrt.ops.letterbox_torch import TorchNv12Letterbox

    rng = np.random.default_rng()
    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), bgr_to_rgb=bgr_to_rgb)
    frames = _random_nv12(rng, 2, *src)
    padded = np.zeros((2, frames.shape[1], src[1] + 32), np.uint8)  # a decoder's pitched rows
    padded[..., : src[1]] = frames
    op = TorchNv12Letterbox(src, dst, n, matrix=matrix, device="cpu", use_triton=True)
    out = torch.full((2, 3, *dst), float("nan"))
    op(torch.from_numpy(padded)[..., : src[1]], out)
    for b in range(2):
        ref = CpuNv12Letterbox(src, dst, n, matrix)(frames[b], np.empty((3, *dst), np.float64))
        np.testing.assert_allclose(out[b].numpy(), ref, rtol=0, atol=2e-4)


def test_bad_shapes_and_names_are_refused() -> None:
    from streamrt.ops.letterbox_torch import TorchNv12Letterbox

    with pytest.raises(ShapeError, match="even"):
        CpuNv12Letterbox((91, 160), (64, 64))
    with pytest.raises(ConfigError, match="bt601"):
        CpuNv12Letterbox((90, 160), (64, 64), matrix="bt2020")
    op = TorchNv12Letterbox((90, 160), (64, 64), device="cpu", use_triton=False)
    with pytest.raises(ShapeError, match="NV12"):
        op(torch.zeros((1, 90, 160), dtype=torch.uint8), torch.empty((1, 3, 64, 64)))
