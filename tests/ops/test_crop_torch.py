"""streamrt.ops.crop_resize against a float64 NumPy bilinear sampler written from the definition
(output pixel j of a box samples x1 + (j + 0.5) * (x2 - x1) / w, edge pixels repeated)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from streamrt.errors import ShapeError  # noqa: E402
from streamrt.ops import crop_resize  # noqa: E402

pytestmark = pytest.mark.torch


def reference(image: np.ndarray, box: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[C, h, w] bilinear samples of ``image`` [C, H, W] inside ``box`` at the output pixels' centres."""
    c, height, width = image.shape
    x1, y1, x2, y2 = box.astype(np.float64)
    xs = x1 + (np.arange(size[1]) + 0.5) * (x2 - x1) / size[1] - 0.5  # pixel-centre coordinates
    ys = y1 + (np.arange(size[0]) + 0.5) * (y2 - y1) / size[0] - 0.5
    out = np.empty((c, *size))
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            x, y = min(max(x, 0.0), width - 1.0), min(max(y, 0.0), height - 1.0)
            x0, y0 = int(np.floor(x)), int(np.floor(y))
            x1_, y1_ = min(x0 + 1, width - 1), min(y0 + 1, height - 1)
            fx, fy = x - x0, y - y0
            out[:, i, j] = ((1 - fy) * ((1 - fx) * image[:, y0, x0] + fx * image[:, y0, x1_])
                            + fy * ((1 - fx) * image[:, y1_, x0] + fx * image[:, y1_, x1_]))
    return out


def random_boxes(rng: np.random.Generator, n: int, m: int, height: int, width: int) -> np.ndarray:
    x = np.sort(rng.uniform(-5, width + 5, (n, m, 2)), axis=-1)  # some past the edges
    y = np.sort(rng.uniform(-5, height + 5, (n, m, 2)), axis=-1)
    return np.stack([x[..., 0], y[..., 0], x[..., 1] + 0.5, y[..., 1] + 0.5], axis=-1).astype(np.float32)


def check(device: str) -> None:
    rng = np.random.default_rng()
    images = rng.random((3, 3, 40, 56), dtype=np.float32)
    boxes = random_boxes(rng, 3, 6, 40, 56)
    counts = np.array([6, 2, 0], np.int32)  # the last image: no detections, zero crops
    crops = crop_resize(torch.from_numpy(images).to(device), torch.from_numpy(boxes).to(device),
                        torch.from_numpy(counts).to(device), (16, 12)).cpu().numpy()
    assert crops.shape == (3, 6, 3, 16, 12) and crops.dtype == np.float32
    for n in range(3):
        for m in range(6):
            if m < counts[n]:
                np.testing.assert_allclose(crops[n, m], reference(images[n], boxes[n, m], (16, 12)), atol=2e-5)
            else:
                assert not crops[n, m].any()


def test_crops_match_the_bilinear_reference_and_zero_the_padding_rows() -> None:
    check("cpu")


def test_a_box_covering_the_whole_image_at_its_size_is_the_image() -> None:
    image = torch.rand(1, 3, 20, 30)
    crops = crop_resize(image, torch.tensor([[[0.0, 0.0, 30.0, 20.0]]]), torch.tensor([1]), (20, 30))
    torch.testing.assert_close(crops[0, 0], image[0], atol=1e-5, rtol=0)


def test_shapes_that_disagree_are_refused() -> None:
    with pytest.raises(ShapeError, match="crop_resize takes"):
        crop_resize(torch.zeros(2, 3, 8, 8), torch.zeros(1, 4, 4), torch.zeros(2), (4, 4))


@pytest.mark.gpu
def test_crops_on_cuda_match_the_reference() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check("cuda")
