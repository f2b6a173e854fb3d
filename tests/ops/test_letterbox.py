"""Letterbox: geometry, the inverse box mapping, host (OpenCV/NumPy) and torch versions against torch's bilinear."""

from __future__ import annotations

import numpy as np
import pytest

from streamrt.errors import ConfigError, ShapeError
from streamrt.ops.letterbox import CpuLetterbox, LetterboxGeometry, Normalize, linear_taps

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("src", "dst", "new", "top_left"),
    [((1080, 1920), (640, 640), (360, 640), (140, 0)), ((720, 1280), (320, 320), (180, 320), (70, 0)),
     ((1920, 1080), (640, 640), (640, 360), (0, 140)), ((100, 100), (320, 480), (320, 320), (0, 80))],
)
def test_geometry_keeps_the_aspect_ratio_and_centres(src: tuple[int, int], dst: tuple[int, int],
                                                     new: tuple[int, int], top_left: tuple[int, int]) -> None:
    g = LetterboxGeometry.fit(src, dst)
    assert (g.new_h, g.new_w) == new and (g.top, g.left) == top_left


def test_box_mapping_round_trips() -> None:
    g = LetterboxGeometry.fit((720, 1280), (320, 320))
    rng = np.random.default_rng(0)
    boxes = np.sort(rng.uniform(0, 700, (50, 2, 2)), axis=1).reshape(50, 4).astype(np.float32)
    boxes[:, [1, 3]] = np.minimum(boxes[:, [1, 3]], 720)
    back = g.to_source(g.to_input(boxes.copy()))
    np.testing.assert_allclose(back, boxes, atol=1e-3)


def _reference(frame: np.ndarray, g: LetterboxGeometry, n: Normalize) -> np.ndarray:
    """torch.nn.functional.interpolate (bilinear, half-pixel) + pad + channel swap + normalise."""
    x = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    resized = torch.nn.functional.interpolate(x, size=(g.new_h, g.new_w), mode="bilinear", align_corners=False)[0]
    out = np.empty((3, g.dst_h, g.dst_w), np.float32)
    for c, src in enumerate(n.source_channel):
        out[c] = n.pad(c)
        inner = resized[src].numpy() / 255.0
        out[c, g.top: g.top + g.new_h, g.left: g.left + g.new_w] = (inner - n.mean[c]) / n.std[c]
    return out


@pytest.mark.parametrize("method", ["numpy", "opencv"])
@pytest.mark.parametrize(("src", "dst"), [((720, 1280), (320, 320)), ((97, 61), (64, 96)), ((50, 80), (128, 128))])
def test_cpu_letterbox_matches_torch_bilinear(method: str, src: tuple[int, int], dst: tuple[int, int]) -> None:
    if method == "opencv":
        pytest.importorskip("cv2")
    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    frame = np.random.default_rng(1).integers(0, 256, (*src, 3), dtype=np.uint8)
    op = CpuLetterbox(src, dst, n, method=method)
    out = np.full((1, 3, *dst), np.nan, np.float32)
    op(frame, out)
    # OpenCV interpolates in 11-bit fixed point and rounds to uint8: at most about 1 grey level.
    tol = 1e-4 if method == "numpy" else 1.01 / 255 / min(n.std)
    np.testing.assert_allclose(out[0], _reference(frame, op.geometry, n), rtol=0, atol=tol)


def test_padding_is_the_normalised_pad_value_and_rgb_order() -> None:
    frame = np.zeros((40, 80, 3), np.uint8)
    frame[..., 0] = 255  # blue in BGR
    out = np.empty((3, 80, 80), np.float32)
    CpuLetterbox((40, 80), (80, 80), method="numpy")(frame, out)
    assert out[:, 0, 0].tolist() == pytest.approx([114 / 255] * 3)
    assert out[:, 40, 40].tolist() == pytest.approx([0.0, 0.0, 1.0])  # blue lands in the last (B of RGB) plane


def test_float16_output() -> None:
    frame = np.random.default_rng(2).integers(0, 256, (60, 90, 3), dtype=np.uint8)
    a, b = np.empty((3, 64, 64), np.float32), np.empty((3, 64, 64), np.float16)
    CpuLetterbox((60, 90), (64, 64), method="numpy")(frame, a)
    CpuLetterbox((60, 90), (64, 64), method="numpy")(frame, b)
    np.testing.assert_allclose(b.astype(np.float32), a, atol=1e-3)


def test_wrong_sizes_are_clear_errors() -> None:
    op = CpuLetterbox((60, 90), (64, 64), method="numpy")
    with pytest.raises(ShapeError, match="60x90x3"):
        op(np.zeros((61, 90, 3), np.uint8), np.empty((3, 64, 64), np.float32))
    with pytest.raises(ShapeError, match="3x64x64"):
        op(np.zeros((60, 90, 3), np.uint8), np.empty((3, 64, 63), np.float32))
    with pytest.raises(ConfigError):
        Normalize(std=(1.0, 0.0, 1.0))
    with pytest.raises(ConfigError):
        CpuLetterbox((60, 90), (64, 64), method="pillow")


def test_taps_clamp_at_the_borders() -> None:
    i0, i1, frac = linear_taps(4, 8)
    assert i0.min() == 0 and i1.max() == 3 and frac[0] == 0.0 and frac[-1] == 0.0


@pytest.mark.parametrize("batch", [1, 3])
def test_torch_letterbox_equals_the_numpy_letterbox(batch: int) -> None:
    from streamrt.ops.letterbox_torch import TorchLetterbox

    n = Normalize(mean=(0.1, 0.2, 0.3), std=(0.5, 0.6, 0.7))
    frames = np.random.default_rng(3).integers(0, 256, (batch, 90, 160, 3), dtype=np.uint8)
    op = TorchLetterbox((90, 160), (96, 128), n, device="cpu", batch=batch, use_triton=False)
    out = torch.full((batch, 3, 96, 128), float("nan"))
    op(torch.from_numpy(frames), out)
    for b in range(batch):
        ref = np.empty((3, 96, 128), np.float32)
        CpuLetterbox((90, 160), (96, 128), n, method="numpy")(frames[b], ref)
        np.testing.assert_allclose(out[b].numpy(), ref, rtol=0, atol=1e-5)
    with pytest.raises(ShapeError):
        op(torch.from_numpy(frames[:, :89]), out)
