"""The detection ensemble's pre- and post-processing steps (examples/12-detection-ensemble/models), run
through the Python backend by the real server on the CPU and compared with streamrt's in-process ops."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from streamrt.errors import RequestError
from streamrt.ops import CpuLetterbox, CpuPostprocess, LetterboxGeometry, PostprocessConfig
from streamrt.serve.config import ServerConfig
from streamrt.serve.protocol import InferRequest
from streamrt.serve.server import ServerThread

cv2 = pytest.importorskip("cv2")

pytestmark = pytest.mark.timeout(180)

MODELS = Path(__file__).resolve().parents[2] / "examples" / "12-detection-ensemble" / "models"
CPU_ONLY = "instance_group [ { count: 1 kind: KIND_CPU } ]"  # KIND_AUTO would pick a GPU where there is one


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("steps")
    for name in ("preprocess", "postprocess"):
        shutil.copytree(MODELS / name, repo / name)
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        group = next(line for line in text.splitlines() if line.startswith("instance_group"))
        config.write_text(text.replace(group, CPU_ONLY))
    raw = repo / "preprocess_raw"
    shutil.copytree(repo / "preprocess", raw)  # the same model.py taking raw BGR frames
    config = (raw / "config.pbtxt").read_text().replace('name: "preprocess"', 'name: "preprocess_raw"')
    (raw / "config.pbtxt").write_text(config.replace('data_type: TYPE_STRING dims: [ 1 ]',
                                                     'data_type: TYPE_UINT8 dims: [ -1, -1, 3 ]'))
    cfg = ServerConfig(http_port=None, grpc_port=None, metrics_port=None, exit_timeout_s=5.0)
    with ServerThread(repo, cfg, start_timeout=60) as running:
        yield running


def infer(server: ServerThread, model: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    response = server.call(server.server.infer(InferRequest(model, inputs=dict(inputs))), timeout=60)
    return response.outputs  # type: ignore[no-any-return]


def letterbox_reference(frame: np.ndarray) -> tuple[np.ndarray, list[int]]:
    op = CpuLetterbox(frame.shape[:2], (640, 640))
    out = np.empty((3, 640, 640), np.float32)
    op(frame, out)
    g = op.geometry
    return out, [g.src_h, g.src_w, g.dst_h, g.dst_w, g.new_h, g.new_w, g.top, g.left]


def test_preprocess_decodes_png_and_jpeg_as_in_process(server: ServerThread) -> None:
    rng = np.random.default_rng()
    frames = [rng.integers(0, 256, (480, 720, 3), dtype=np.uint8), rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)]
    png = cv2.imencode(".png", frames[0])[1].tobytes()
    jpeg = cv2.imencode(".jpg", frames[1])[1].tobytes()
    images = np.array([[png], [jpeg]], dtype=np.object_)
    out = infer(server, "preprocess", IMAGE=images)
    assert out["INPUT"].shape == (2, 3, 640, 640) and out["GEOMETRY"].shape == (2, 8)
    decoded = [frames[0], cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)]  # PNG is lossless
    for i, frame in enumerate(decoded):
        expected, geometry = letterbox_reference(frame)
        np.testing.assert_array_equal(out["INPUT"][i], expected)
        assert out["GEOMETRY"][i].tolist() == geometry


def test_preprocess_takes_raw_frames(server: ServerThread) -> None:
    rng = np.random.default_rng()
    frames = rng.integers(0, 256, (3, 360, 640, 3), dtype=np.uint8)
    out = infer(server, "preprocess_raw", IMAGE=frames)
    for i in range(3):
        expected, geometry = letterbox_reference(frames[i])
        np.testing.assert_array_equal(out["INPUT"][i], expected)
        assert out["GEOMETRY"][i].tolist() == geometry == [360, 640, 640, 640, 360, 640, 140, 0]


def test_preprocess_refuses_an_undecodable_image_alone(server: ServerThread) -> None:
    with pytest.raises(RequestError, match=r"IMAGE row 0 .* is not a JPEG or PNG image"):
        infer(server, "preprocess", IMAGE=np.array([[b"not an image"]], dtype=np.object_))


def _raw_detections(rng: np.random.Generator, batch: int, classes: int = 80, anchors: int = 400) -> np.ndarray:
    """yolov8 raw output: random low scores plus clusters of overlapping boxes with high scores."""
    raw = np.zeros((batch, 4 + classes, anchors), np.float32)
    raw[:, :2] = rng.uniform(50, 590, (batch, 2, anchors))
    raw[:, 2:4] = rng.uniform(10, 120, (batch, 2, anchors))
    raw[:, 4:] = rng.uniform(0, 0.3, (batch, classes, anchors))
    for b in range(batch):
        for anchor in rng.choice(anchors, 40, replace=False):
            raw[b, 4 + rng.integers(0, 3), anchor] = rng.uniform(0.5, 1.0)
    return raw


def test_postprocess_matches_in_process_nms_and_maps_to_frame_pixels(server: ServerThread) -> None:
    rng = np.random.default_rng()
    raw = _raw_detections(rng, 3)
    geometries = [LetterboxGeometry.fit(hw, (640, 640)) for hw in ((480, 720), (1080, 1920), (640, 300))]
    geometry = np.array([[g.src_h, g.src_w, g.dst_h, g.dst_w, g.new_h, g.new_w, g.top, g.left] for g in geometries],
                        np.int32)
    out = infer(server, "postprocess", RAW=raw, GEOMETRY=geometry)
    dets, counts = np.empty((3, 100, 6), np.float32), np.empty(3, np.int32)
    CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.45, max_det=100), "yolov8", 80)(raw, dets, counts)
    assert out["COUNT"][:, 0].tolist() == counts.tolist() and counts.min() > 5
    for i, g in enumerate(geometries):
        n = counts[i]
        boxes = g.to_source(dets[i, :n, :4].copy())
        np.testing.assert_allclose(out["DETECTIONS"][i, :n, :4], boxes, rtol=1e-6)
        np.testing.assert_array_equal(out["DETECTIONS"][i, :n, 4:], dets[i, :n, 4:])
        assert not out["DETECTIONS"][i, n:].any()
        assert (boxes[:, 2] <= g.src_w).all() and (boxes[:, 3] <= g.src_h).all()


def test_postprocess_refuses_a_raw_output_of_another_layout(server: ServerThread) -> None:
    with pytest.raises(RequestError, match="is not"):
        infer(server, "postprocess", RAW=np.zeros((1, 10, 50), np.float32), GEOMETRY=np.zeros((1, 8), np.int32))


@pytest.mark.gpu
@pytest.mark.torch
def test_steps_on_gpu_instances_match_the_cpu_ops(tmp_path: Path) -> None:
    """KIND_GPU instances: TorchLetterbox and TorchPostprocess on the device, outputs via DLPack."""
    repo = tmp_path / "repo"
    for name in ("preprocess", "postprocess"):
        shutil.copytree(MODELS / name, repo / name)
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        group = next(line for line in text.splitlines() if line.startswith("instance_group"))
        config.write_text(text.replace(group, "instance_group [ { count: 1 kind: KIND_GPU } ]"))
    cfg = ServerConfig(http_port=None, grpc_port=None, metrics_port=None, exit_timeout_s=5.0)
    rng = np.random.default_rng()
    with ServerThread(repo, cfg, start_timeout=120) as server:
        frame = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
        png = cv2.imencode(".png", frame)[1].tobytes()
        out = infer(server, "preprocess", IMAGE=np.array([[png]], dtype=np.object_))
        expected, geometry = letterbox_reference(frame)
        np.testing.assert_allclose(out["INPUT"][0], expected, atol=1.5 / 255)  # OpenCV's fixed point vs float
        assert out["GEOMETRY"][0].tolist() == geometry

        raw = _raw_detections(rng, 2)
        g = LetterboxGeometry.fit((720, 1280), (640, 640))
        row = [g.src_h, g.src_w, g.dst_h, g.dst_w, g.new_h, g.new_w, g.top, g.left]
        out = infer(server, "postprocess", RAW=raw, GEOMETRY=np.array([row, row], np.int32))
        dets, counts = np.empty((2, 100, 6), np.float32), np.empty(2, np.int32)
        CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.45, max_det=100), "yolov8", 80)(raw, dets, counts)
        assert out["COUNT"][:, 0].tolist() == counts.tolist()
        for i in range(2):
            n = counts[i]
            np.testing.assert_allclose(out["DETECTIONS"][i, :n, :4], g.to_source(dets[i, :n, :4].copy()),
                                       rtol=1e-5, atol=1e-3)
            np.testing.assert_allclose(out["DETECTIONS"][i, :n, 4:], dets[i, :n, 4:], rtol=1e-6)
            assert not out["DETECTIONS"][i, n:].any()
