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
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread
from streamrt.serve.wire.protocol import InferRequest

cv2 = pytest.importorskip("cv2")

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "12-detection-ensemble" / "models"
DETECTOR = ROOT / "src" / "streamrt" / "video" / "assets" / "shapes_detector.onnx"
SIZE = 320  # the bundled detector's input, as the example's configs say
CLASSES = 5
CPU_ONLY = "instance_group [ { count: 1 kind: KIND_CPU } ]"  # KIND_AUTO would pick a GPU where there is one


def copy_models(repo: Path, group: str) -> None:
    """The example's models (the bundled detector in place), the Python steps' instance_group set to ``group``."""
    for name in ("preprocess", "postprocess", "detector", "detect"):
        shutil.copytree(MODELS / name, repo / name)
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        line = next((t for t in text.splitlines() if t.startswith("instance_group")), None)
        if line is not None and name in ("preprocess", "postprocess"):
            config.write_text(text.replace(line, group))
    shutil.copy(DETECTOR, repo / "detector" / "1" / "model.onnx")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("steps")
    copy_models(repo, CPU_ONLY)
    raw = repo / "preprocess_raw"
    shutil.copytree(repo / "preprocess", raw)  # the same model.py taking raw BGR frames
    config = (raw / "config.pbtxt").read_text().replace('name: "preprocess"', 'name: "preprocess_raw"')
    (raw / "config.pbtxt").write_text(config.replace('data_type: TYPE_STRING dims: [ 1 ]',
                                                     'data_type: TYPE_UINT8 dims: [ -1, -1, 3 ]'))
    cfg = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0)
    with ServerThread(repo, cfg, start_timeout=120) as running:
        yield running


def infer(server: ServerThread, model: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    response = server.call(server.server.infer(InferRequest(model, inputs=dict(inputs))), timeout=60)
    return response.outputs  # type: ignore[no-any-return]


def letterbox_reference(frame: np.ndarray) -> tuple[np.ndarray, list[int]]:
    op = CpuLetterbox(frame.shape[:2], (SIZE, SIZE))
    out = np.empty((3, SIZE, SIZE), np.float32)
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
    assert out["INPUT"].shape == (2, 3, SIZE, SIZE) and out["GEOMETRY"].shape == (2, 8)
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
        assert out["GEOMETRY"][i].tolist() == geometry == [360, 640, SIZE, SIZE, 180, 320, 70, 0]


def test_preprocess_refuses_an_undecodable_image_alone(server: ServerThread) -> None:
    with pytest.raises(RequestError, match=r"IMAGE row 0 .* is not a JPEG or PNG image"):
        infer(server, "preprocess", IMAGE=np.array([[b"not an image"]], dtype=np.object_))


def _raw_detections(rng: np.random.Generator, batch: int, classes: int = CLASSES, anchors: int = 400) -> np.ndarray:
    """yolov8 raw output: random low scores plus clusters of overlapping boxes with high scores."""
    raw = np.zeros((batch, 4 + classes, anchors), np.float32)
    raw[:, :2] = rng.uniform(20, SIZE - 20, (batch, 2, anchors))
    raw[:, 2:4] = rng.uniform(5, 60, (batch, 2, anchors))
    raw[:, 4:] = rng.uniform(0, 0.3, (batch, classes, anchors))
    for b in range(batch):
        for anchor in rng.choice(anchors, 40, replace=False):
            raw[b, 4 + rng.integers(0, 3), anchor] = rng.uniform(0.5, 1.0)
    return raw


def test_postprocess_matches_in_process_nms_and_maps_to_frame_pixels(server: ServerThread) -> None:
    rng = np.random.default_rng()
    raw = _raw_detections(rng, 3)
    geometries = [LetterboxGeometry.fit(hw, (SIZE, SIZE)) for hw in ((480, 720), (1080, 1920), (640, 300))]
    geometry = np.array([[g.src_h, g.src_w, g.dst_h, g.dst_w, g.new_h, g.new_w, g.top, g.left] for g in geometries],
                        np.int32)
    out = infer(server, "postprocess", RAW=raw, GEOMETRY=geometry)
    dets, counts = np.empty((3, 100, 6), np.float32), np.empty(3, np.int32)
    CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.45, max_det=100), "yolov8", CLASSES)(raw, dets, counts)
    assert out["COUNT"][:, 0].tolist() == counts.tolist() and counts.min() > 5
    for i, g in enumerate(geometries):
        n = counts[i]
        boxes = g.to_source(dets[i, :n, :4].copy())
        np.testing.assert_allclose(out["DETECTIONS"][i, :n, :4], boxes, rtol=1e-6)
        np.testing.assert_array_equal(out["DETECTIONS"][i, :n, 4:], dets[i, :n, 4:])
        assert not out["DETECTIONS"][i, n:].any()
        assert (boxes[:, 2] <= g.src_w).all() and (boxes[:, 3] <= g.src_h).all()


def in_process_chain(frame: np.ndarray) -> tuple[np.ndarray, int]:
    """The same chain without the server: letterbox, the detector through streamrt, NMS, frame pixels."""
    import streamrt

    pixels, _ = letterbox_reference(frame)
    engine = streamrt.open(DETECTOR, streamrt.BuildConfig(backend_options={"threads": 1}), max_batch=1, cache=True)
    try:
        raw = engine.create_context().infer({"images": pixels[None]})["output0"]
    finally:
        engine.close()
    dets, counts = np.empty((1, 100, 6), np.float32), np.empty(1, np.int32)
    CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.45, max_det=100), "yolov8", CLASSES)(raw, dets, counts)
    n = int(counts[0])
    LetterboxGeometry.fit(frame.shape[:2], (SIZE, SIZE)).to_source(dets[0, :n, :4])
    return dets[0], n


def test_detection_ensemble_matches_the_in_process_chain(server: ServerThread) -> None:
    from streamrt.video.synthetic import SyntheticClip

    frame = SyntheticClip(width=640, height=480, frames=1, seed=int(np.random.default_rng().integers(1000))).frame(0)
    png = cv2.imencode(".png", frame)[1].tobytes()
    out = infer(server, "detect", IMAGE=np.array([[png]], dtype=np.object_))
    expected, n = in_process_chain(frame)
    assert n > 0 and int(out["COUNT"][0, 0]) == n
    np.testing.assert_allclose(out["DETECTIONS"][0, :n], expected[:n], rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_script_gets_the_boxes_of_several_images(server: ServerThread, tmp_path: Path, protocol: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("detection_client", MODELS.parent / "client.py")
    assert spec is not None and spec.loader is not None
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    from streamrt.video.synthetic import SyntheticClip

    frames = [SyntheticClip(width=w, height=h, frames=1, seed=s).frame(0) for w, h, s in ((640, 480, 1), (800, 600, 2))]
    files = []
    for i, frame in enumerate(frames):
        files.append(tmp_path / f"f{i}.png")
        files[-1].write_bytes(cv2.imencode(".png", frame)[1].tobytes())
    port = server.http_port if protocol == "http" else server.grpc_port
    found = client.main([*(str(f) for f in files), "--url", f"127.0.0.1:{port}", "--protocol", protocol])
    for frame, boxes in zip(frames, found, strict=True):
        expected, n = in_process_chain(frame)
        assert n > 0 and len(boxes) == n
        np.testing.assert_allclose(boxes, expected[:n], rtol=1e-4, atol=1e-2)
    assert f"{files[0]}: {len(found[0])} objects" in capsys.readouterr().out


def test_postprocess_refuses_a_raw_output_of_another_layout(server: ServerThread) -> None:
    with pytest.raises(RequestError, match="is not"):
        infer(server, "postprocess", RAW=np.zeros((1, 4 + CLASSES + 1, 50), np.float32),
              GEOMETRY=np.zeros((1, 8), np.int32))


@pytest.mark.gpu
@pytest.mark.torch
def test_steps_on_gpu_instances_match_the_cpu_ops(tmp_path: Path) -> None:
    """KIND_GPU instances: TorchLetterbox and TorchPostprocess on the device, outputs via DLPack."""
    repo = tmp_path / "repo"
    copy_models(repo, "instance_group [ { count: 1 kind: KIND_GPU } ]")
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
        g = LetterboxGeometry.fit((720, 1280), (SIZE, SIZE))
        row = [g.src_h, g.src_w, g.dst_h, g.dst_w, g.new_h, g.new_w, g.top, g.left]
        out = infer(server, "postprocess", RAW=raw, GEOMETRY=np.array([row, row], np.int32))
        dets, counts = np.empty((2, 100, 6), np.float32), np.empty(2, np.int32)
        CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.45, max_det=100), "yolov8", CLASSES)(raw, dets, counts)
        assert out["COUNT"][:, 0].tolist() == counts.tolist()
        for i in range(2):
            n = counts[i]
            np.testing.assert_allclose(out["DETECTIONS"][i, :n, :4], g.to_source(dets[i, :n, :4].copy()),
                                       rtol=1e-5, atol=1e-3)
            np.testing.assert_allclose(out["DETECTIONS"][i, :n, 4:], dets[i, :n, 4:], rtol=1e-6)
            assert not out["DETECTIONS"][i, n:].any()
