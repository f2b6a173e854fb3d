"""The two-stage ensemble of examples/12-detection-ensemble (detect_classify: preprocess -> detector ->
postprocess -> crop -> classifier) served by the real server on the CPU, compared with the same chain
run in-process (streamrt's ops and engines, no server): boxes within rtol 1e-4 / atol 1e-2 px, class
scores within atol 1e-4."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from streamrt.errors import RequestError
from streamrt.ops import CpuLetterbox, CpuPostprocess, LetterboxGeometry, PostprocessConfig
from streamrt.serve.config import ServerConfig
from streamrt.serve.protocol import InferRequest
from streamrt.serve.server import ServerThread

cv2 = pytest.importorskip("cv2")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.timeout(240), pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "12-detection-ensemble"
DETECTOR = ROOT / "src" / "streamrt" / "video" / "assets" / "shapes_detector.onnx"
SIZE, CLASSES, CROP, MAX_DET = 320, 5, 32, 100
STEPS = ("preprocess", "postprocess", "crop")  # the Python models
MODELS = (*STEPS, "detector", "classifier", "detect", "detect_classify")


def example_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example12_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_models(repo: Path, group: str) -> None:
    """The example's models with the detector and classifier in place, the Python steps' instance_group ``group``."""
    for name in MODELS:
        shutil.copytree(EXAMPLE / "models" / name, repo / name)
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        line = next((t for t in text.splitlines() if t.startswith("instance_group")), None)
        if line is not None and name in STEPS:
            config.write_text(text.replace(line, group))
    shutil.copy(DETECTOR, repo / "detector" / "1" / "model.onnx")
    example_module("make_classifier").main([str(repo / "classifier" / "1" / "model.onnx")])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("two_stage")
    copy_models(repo, "instance_group [ { count: 1 kind: KIND_CPU } ]")
    cfg = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0)
    with ServerThread(repo, cfg, start_timeout=180) as running:
        yield running


def infer(server: ServerThread, model: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    response = server.call(server.server.infer(InferRequest(model, inputs=dict(inputs))), timeout=60)
    return response.outputs  # type: ignore[no-any-return]


def in_process(frame: np.ndarray, classifier: Path) -> tuple[np.ndarray, np.ndarray]:
    """The chain without a server: letterbox, detector, NMS, frame pixels, crops, classifier."""
    import streamrt

    op = CpuLetterbox(frame.shape[:2], (SIZE, SIZE))
    pixels = np.empty((1, 3, SIZE, SIZE), np.float32)
    op(frame, pixels[0])
    options = streamrt.BuildConfig(backend_options={"threads": 1})
    with streamrt.open(DETECTOR, options, max_batch=1, cache=True) as detector:
        raw = detector.create_context().infer({"images": pixels})["output0"]
    dets, counts = np.empty((1, MAX_DET, 6), np.float32), np.empty(1, np.int32)
    CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.45, max_det=MAX_DET), "yolov8", CLASSES)(raw, dets, counts)
    n = int(counts[0])
    g = LetterboxGeometry.fit(frame.shape[:2], (SIZE, SIZE))
    g.to_source(dets[0, :n, :4])
    return dets[0][:n], classify(pixels[0], dets[0], n, g, classifier)


def classify(pixels: np.ndarray, dets: np.ndarray, n: int, g: LetterboxGeometry, classifier: Path) -> np.ndarray:
    """The classifier's scores [MAX_DET, CLASSES] of the crops of the first ``n`` boxes of ``dets`` (frame
    pixels) cut out of ``pixels`` (the letterboxed image, [3, SIZE, SIZE])."""
    import streamrt
    from streamrt.ops import crop_resize

    boxes = np.zeros((MAX_DET, 4), np.float32)
    boxes[:n] = dets[:n, :4]
    boxes[:, 0::2] = boxes[:, 0::2] * (g.new_w / g.src_w) + g.left  # back to letterbox pixels, as the crop step
    boxes[:, 1::2] = boxes[:, 1::2] * (g.new_h / g.src_h) + g.top
    crops = crop_resize(torch.from_numpy(pixels[None]), torch.from_numpy(boxes[None]), torch.tensor([n]),
                        (CROP, CROP))
    valid = (np.arange(MAX_DET) < n).astype(np.float32)[None]
    options = streamrt.BuildConfig(backend_options={"threads": 1})
    with streamrt.open(classifier, options, max_batch=1, cache=True) as engine:
        scores = engine.create_context().infer({"crops": crops.numpy(), "valid": valid})["scores"]
    return np.asarray(scores)[0]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_module("make_classifier").main([str(tmp_path_factory.mktemp("cls") / "classifier.onnx")])


def scene(seed: int, width: int = 640, height: int = 480) -> np.ndarray:
    from streamrt.video.synthetic import SyntheticClip

    return SyntheticClip(width=width, height=height, frames=1, seed=seed).frame(0)


def png(frame: np.ndarray) -> bytes:
    return bytes(cv2.imencode(".png", frame)[1].tobytes())


def check(dets: np.ndarray, count: int, scores: np.ndarray, frame: np.ndarray, classifier: Path) -> None:
    expected, expected_scores = in_process(frame, classifier)
    assert count == len(expected) > 0
    np.testing.assert_allclose(dets[:count], expected, rtol=1e-4, atol=1e-2)
    assert scores.shape == (MAX_DET, CLASSES)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-4)
    np.testing.assert_allclose(scores[:count].sum(axis=1), 1.0, atol=1e-5)  # softmax per valid crop
    assert not scores[count:].any() and not dets[count:].any()  # padded rows


def test_two_stage_ensemble_matches_the_in_process_chain(server: ServerThread, classifier: Path) -> None:
    seeds = np.random.default_rng().integers(1000, size=2)
    frames = [scene(int(seeds[0])), scene(int(seeds[1]), 800, 600)]
    out = infer(server, "detect_classify", IMAGE=np.array([[png(f)] for f in frames], dtype=np.object_))
    for i, frame in enumerate(frames):
        check(out["DETECTIONS"][i], int(out["COUNT"][i, 0]), out["SCORES"][i], frame, classifier)


def test_a_frame_without_detections_gets_zero_crops(server: ServerThread) -> None:
    blank = np.full((480, 640, 3), 114, np.uint8)
    out = infer(server, "detect_classify", IMAGE=np.array([[png(blank)], [png(scene(3))]], dtype=np.object_))
    assert int(out["COUNT"][0, 0]) == 0 and int(out["COUNT"][1, 0]) > 0
    assert not out["DETECTIONS"][0].any() and not out["SCORES"][0].any()
    crops = infer(server, "crop", PIXELS=np.random.default_rng().random((1, 3, SIZE, SIZE), dtype=np.float32),
                  GEOMETRY=np.array([[480, 640, SIZE, SIZE, 240, 320, 40, 0]], np.int32),
                  DETECTIONS=np.zeros((1, MAX_DET, 6), np.float32), COUNT=np.zeros((1, 1), np.int32))
    assert crops["CROPS"].shape == (1, MAX_DET, 3, CROP, CROP) and not crops["CROPS"].any()
    assert not crops["VALID"].any()


def test_an_error_in_a_step_fails_only_its_request(server: ServerThread, classifier: Path) -> None:
    """A bad image (preprocess) and crop tensors that disagree (crop) fail alone, while good requests
    sent at the same time get their answers."""
    frame = scene(5)
    good: list[dict[str, np.ndarray]] = []
    errors: list[BaseException] = []

    def send(image: bytes) -> None:
        try:
            good.append(infer(server, "detect_classify", IMAGE=np.array([[image]], dtype=np.object_)))
        except RequestError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(data,)) for data in (png(frame), b"not an image", png(frame))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(good) == 2 and len(errors) == 1
    assert "preprocess" in str(errors[0]) and "not a JPEG or PNG image" in str(errors[0])
    for out in good:
        check(out["DETECTIONS"][0], int(out["COUNT"][0, 0]), out["SCORES"][0], frame, classifier)
    with pytest.raises(RequestError, match=r"GEOMETRY row 0 \[0, 0, .* is not a letterbox geometry"):
        infer(server, "crop", PIXELS=np.zeros((1, 3, SIZE, SIZE), np.float32), GEOMETRY=np.zeros((1, 8), np.int32),
              DETECTIONS=np.zeros((1, MAX_DET, 6), np.float32), COUNT=np.zeros((1, 1), np.int32))
    again = infer(server, "detect_classify", IMAGE=np.array([[png(frame)]], dtype=np.object_))  # still serving
    assert int(again["COUNT"][0, 0]) == int(good[0]["COUNT"][0, 0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_client_over_tritonclient(server: ServerThread, classifier: Path, tmp_path: Path, protocol: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    client = example_module("classify")
    frames = [scene(11), scene(12, 720, 540)]
    files = []
    for i, frame in enumerate(frames):
        files.append(tmp_path / f"f{i}.png")
        files[-1].write_bytes(png(frame))
    port = server.http_port if protocol == "http" else server.grpc_port
    found = client.main([*(str(f) for f in files), "--url", f"127.0.0.1:{port}", "--protocol", protocol])
    for frame, (boxes, scores) in zip(frames, found, strict=True):
        expected, expected_scores = in_process(frame, classifier)
        assert len(boxes) == len(expected) == len(scores) > 0
        np.testing.assert_allclose(boxes, expected, rtol=1e-4, atol=1e-2)
        np.testing.assert_allclose(scores, expected_scores[: len(boxes)], atol=1e-4)
    assert "crop class" in capsys.readouterr().out
    sys.modules.pop("client", None)  # classify.py imported the detection client by that name


@pytest.mark.gpu
def test_two_stage_steps_on_gpu_instances_match_the_in_process_chain(tmp_path: Path, classifier: Path) -> None:
    """KIND_GPU Python steps: letterbox, NMS and crops on the device, PIXELS and CROPS passed as device
    tensors. The class scores are checked exactly against the served boxes and letterboxed pixels
    (crop + classifier in-process, atol 1e-4); the boxes against the CPU chain (TorchLetterbox's float
    resize vs OpenCV's fixed point: same count, within 1 px)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    repo = tmp_path / "repo"
    copy_models(repo, "instance_group [ { count: 1 kind: KIND_GPU } ]")
    cfg = ServerConfig(http_port=None, grpc_port=None, metrics_port=None, exit_timeout_s=5.0)
    with ServerThread(repo, cfg, start_timeout=180) as gpu_server:
        frames = [scene(21), scene(22, 1280, 720), np.full((480, 640, 3), 114, np.uint8)]  # the last: no boxes
        images = np.array([[png(f)] for f in frames], dtype=np.object_)
        out = infer(gpu_server, "detect_classify", IMAGE=images)
        letterboxed = infer(gpu_server, "preprocess", IMAGE=images)["INPUT"]
        for i, frame in enumerate(frames):
            n = int(out["COUNT"][i, 0])
            g = LetterboxGeometry.fit(frame.shape[:2], (SIZE, SIZE))
            scores = classify(letterboxed[i], out["DETECTIONS"][i], n, g, classifier)
            np.testing.assert_allclose(out["SCORES"][i], scores, atol=1e-4)
            assert not out["SCORES"][i, n:].any() and not out["DETECTIONS"][i, n:].any()
            expected, _ = in_process(frame, classifier)
            assert n == len(expected) and (n > 0) == (i < 2)
            np.testing.assert_allclose(out["DETECTIONS"][i, :n, :4], expected[:, :4], atol=1.0)
