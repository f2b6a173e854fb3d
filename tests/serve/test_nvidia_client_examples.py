"""``scripts/nvidia_client_examples.py`` end to end with example scripts of our own, and the models
its repository serves (``streamrt.testing.triton_examples``) checked against NumPy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread
from streamrt.testing.triton_examples import MODEL_NAMES, write_repository

pytestmark = pytest.mark.timeout(240)
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nvidia_client_examples.py"

# An example in the manner of NVIDIA's: -u URL (the port of the protocol its name says), exits 1 on a
# wrong sum or difference of random numbers, prints PASS otherwise.
SUMS_EXAMPLE = textwrap.dedent('''
    import argparse, sys
    import numpy as np
    import tritonclient.{module} as client_module

    parser = argparse.ArgumentParser()
    parser.add_argument("-u", "--url", default="localhost:8000")
    client = client_module.InferenceServerClient(parser.parse_args().url)
    rng = np.random.default_rng()
    a, b = (rng.integers(-1000, 1000, (1, 16)).astype(np.int32) for _ in range(2))
    inputs = [client_module.InferInput(f"INPUT{{i}}", [1, 16], "INT32") for i in range(2)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    if not (np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b)):
        print("wrong sum or difference")
        sys.exit(1)
    print("PASS: sums")
''')

# A gRPC example (by its name) that checks something the server does not do: it must be reported failed.
WRONG_EXAMPLE = textwrap.dedent('''
    import argparse, sys
    import numpy as np
    import tritonclient.grpc as grpcclient

    parser = argparse.ArgumentParser()
    parser.add_argument("-u", "--url", default="localhost:8001")
    client = grpcclient.InferenceServerClient(parser.parse_args().url)
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
    for item in inputs:
        item.set_data_from_numpy(np.ones((1, 16), np.int32))
    if client.infer("simple", inputs).as_numpy("OUTPUT0")[0, 0] != 3:
        print("expected 1 + 1 = 3")
        sys.exit(1)
    print("PASS: never")
''')


def _harness(examples: Path, out: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--examples", str(examples), "--json", str(out), *args],
                          capture_output=True, text=True, timeout=200, check=False)
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


def test_harness_runs_examples_against_a_real_server(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "own_http_sums_client.py").write_text(SUMS_EXAMPLE.format(module="http"))
    (examples / "own_grpc_sums_client.py").write_text(SUMS_EXAMPLE.format(module="grpc"))
    (examples / "own_grpc_wrong_client.py").write_text(WRONG_EXAMPLE)
    (examples / "own_grpc_cudashm_client.py").write_text("raise SystemExit('must not run')\n")
    code, results, output = _harness(examples, tmp_path / "all.json")
    by_name = {r["example"]: r for r in results}
    assert by_name["own_http_sums_client.py"]["status"] == "passed", output
    assert by_name["own_grpc_sums_client.py"]["status"] == "passed", output
    assert by_name["own_http_sums_client.py"]["protocol"] == "http"
    assert by_name["own_grpc_sums_client.py"]["protocol"] == "grpc"
    wrong = by_name["own_grpc_wrong_client.py"]
    assert wrong["status"] == "failed" and "expected 1 + 1 = 3" in wrong["detail"] and wrong["protocol"] == "grpc"
    assert by_name["own_grpc_cudashm_client.py"] == {**by_name["own_grpc_cudashm_client.py"], "status": "skipped",
                                                     "detail": "CUDA shared memory needs a GPU"}
    assert code == 1, "a failed example must fail the run"
    assert "2 passed, 1 failed, 0 xfail, 1 skipped" in output

    code, results, output = _harness(examples, tmp_path / "k.json", "-k", "http_sums", "--markdown",
                                     str(tmp_path / "t.md"))
    assert code == 0, output
    assert [r["example"] for r in results] == ["own_http_sums_client.py"]
    assert "| own_http_sums_client.py | http |" in (tmp_path / "t.md").read_text()


def test_an_example_that_exits_0_without_its_pass_line_fails(tmp_path: Path) -> None:
    """Several of NVIDIA's examples exit 0 after a failed check and only leave out their PASS line."""
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "own_http_silent_client.py").write_text(
        "import argparse\nargparse.ArgumentParser().add_argument('-u', '--url')\n"
        "if False:\n    print('PASS: silent')\n")
    code, results, _ = _harness(examples, tmp_path / "r.json")
    assert code == 1 and results[0]["status"] == "failed" and "no PASS line" in results[0]["detail"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("examples") / "repo"
    assert write_repository(repo) == list(MODEL_NAMES)
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0)
    with ServerThread(repo, config, start_timeout=120) as running:
        yield running


def _inputs(mod: Any, dtype: str, *arrays: np.ndarray, names: tuple[str, ...] = ("INPUT0", "INPUT1")) -> list[Any]:
    items = []
    for name, array in zip(names, arrays, strict=False):
        item = mod.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        items.append(item)
    return items


def _text(values: np.ndarray) -> np.ndarray:
    return np.array([str(v).encode() for v in values.ravel()], dtype=object).reshape(values.shape)


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_stateless_models_answer_as_numpy(server: ServerThread, mod: Any) -> None:
    client = mod.InferenceServerClient(f"127.0.0.1:{server.http_port if mod is thttp else server.grpc_port}")
    rng = np.random.default_rng()
    a, b = (rng.integers(-(2**20), 2**20, (3, 16)).astype(np.int32) for _ in range(2))
    result = client.infer("simple", _inputs(mod, "INT32", a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    small_a, small_b = (rng.integers(-60, 60, (2, 16)).astype(np.int8) for _ in range(2))
    result = client.infer("simple_int8", _inputs(mod, "INT8", small_a, small_b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), small_a - small_b)
    result = client.infer("simple_string", _inputs(mod, "BYTES", _text(a), _text(b)))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), _text(a + b))
    words = np.array([[b"he\x00llo", b"\x00\x01\x02\x03", "ü".encode()]], dtype=object)
    assert client.infer("simple_identity", _inputs(mod, "BYTES", words)).as_numpy("OUTPUT0").tolist() == words.tolist()
    identity = client.infer("custom_identity_int32", _inputs(mod, "INT32", a))
    np.testing.assert_array_equal(identity.as_numpy("OUTPUT0"), a)
    client.close()


def _step(client: Any, model: str, value: int, sequence_id: Any, start: bool, end: bool) -> int:
    item = tgrpc.InferInput("INPUT", [1, 1], "INT32")
    item.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(model, [item], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def test_sequence_models_interleaved(server: ServerThread) -> None:
    """Two sequences of each model, interleaved step by step, against what each model stands for."""
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    rng = np.random.default_rng()
    values = {k: rng.integers(-100, 100, 6).tolist() for k in range(2)}
    ids = {"simple_sequence": [str(uuid.uuid4()), int(rng.integers(1, 2**31))],
           "simple_dyna_sequence": [int(rng.integers(1, 2**20)), int(rng.integers(1, 2**20))],
           "simple_string_dyna_sequence": [str(rng.integers(1, 2**20)), str(rng.integers(1, 2**20))]}
    got: dict[tuple[str, int], list[int]] = {}
    for step in range(6):
        for model, pair in ids.items():
            for k, sequence_id in enumerate(pair):
                answer = _step(client, model, values[k][step], sequence_id, step == 0, step == 5)
                got.setdefault((model, k), []).append(answer)
    for k in range(2):
        v = values[k]
        assert got[("simple_sequence", k)] == [v[0] + 1, *v[1:]]
        assert got[("simple_dyna_sequence", k)] == [v[0] + 1, *v[1:5], v[5] + ids["simple_dyna_sequence"][k]]
        sums = np.cumsum(v).tolist()
        string_id = int(ids["simple_string_dyna_sequence"][k])
        assert got[("simple_string_dyna_sequence", k)] == [*sums[:5], sums[5] + string_id]
    client.close()


def _picture() -> tuple[bytes, np.ndarray]:
    """A JPEG and its pixels as NVIDIA's image examples prepare them for inception (RGB, 299x299 bilinear,
    INCEPTION scaling), from Pillow."""
    import io

    pil = pytest.importorskip("PIL.Image")
    y, x = np.mgrid[0:240, 0:320]
    buffer = io.BytesIO()
    pil.fromarray(np.stack([x * 255 // 320, y * 255 // 240, (x + y) % 256], -1).astype(np.uint8)).save(buffer, "JPEG")
    data = buffer.getvalue()
    scaled = np.asarray(pil.open(io.BytesIO(data)).convert("RGB").resize((299, 299), pil.BILINEAR), np.float32)
    return data, scaled / 127.5 - 1


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_image_models_classify_with_triton_labels_and_the_ensemble_preprocesses_as_the_client(
        server: ServerThread, mod: Any) -> None:
    """densenet_onnx and inception_graphdef answer top-k classes with their label files (inception's 1001 with
    the background first, as Triton's); the ensemble, given the JPEG's bytes, decodes and scales it on the server
    to the same classes and scores as inception_graphdef given the client's own preprocessing."""
    data, pixels = _picture()
    client = mod.InferenceServerClient(f"127.0.0.1:{server.http_port if mod is thttp else server.grpc_port}")
    kw = {"binary_data": True} if mod is thttp else {}
    direct = client.infer("inception_graphdef", _inputs(mod, "FP32", pixels[None], names=("input",)),
                          outputs=[mod.InferRequestedOutput("InceptionV3/Predictions/Softmax", class_count=3, **kw)])
    top = [entry.decode().split(":") for entry in direct.as_numpy("InceptionV3/Predictions/Softmax")[0]]
    assert [label for _, _, label in top] == [f"class_{int(index) - 1:04d}" for _, index, _ in top]
    assert [float(score) for score, _, _ in top] == sorted((float(score) for score, _, _ in top), reverse=True)
    ensemble = client.infer("preprocess_inception_ensemble",
                            _inputs(mod, "BYTES", np.array([[data]], dtype=object), names=("INPUT",)),
                            outputs=[mod.InferRequestedOutput("OUTPUT", class_count=3, **kw)])
    assert [entry.decode().split(":") for entry in ensemble.as_numpy("OUTPUT")[0]] == top
    densenet = client.infer("densenet_onnx", _inputs(mod, "FP32", np.zeros((1, 3, 224, 224), np.float32),
                                                     names=("data_0",)),
                            outputs=[mod.InferRequestedOutput("fc6_1", class_count=2, **kw)])
    assert all(entry.decode().split(":")[2].startswith("class_") for entry in densenet.as_numpy("fc6_1")[0])


def test_the_harness_runs_the_image_examples_on_a_picture_of_its_own(tmp_path: Path) -> None:
    """The image examples' runs come from IMAGE_RUNS (model, classes, scaling and the picture the harness writes),
    not from a bare -u: an example that insists on them passes only when it gets them."""
    pytest.importorskip("PIL")
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "ensemble_image_client.py").write_text(textwrap.dedent('''
        import argparse, sys
        import numpy as np
        import tritonclient.http as httpclient
        import tritonclient.grpc as grpcclient

        parser = argparse.ArgumentParser()
        parser.add_argument("-u", "--url", default="localhost:8000")
        parser.add_argument("-i", "--protocol", default="HTTP")
        parser.add_argument("-c", "--classes", type=int, default=1)
        parser.add_argument("image_filename")
        flags = parser.parse_args()
        mod = grpcclient if flags.protocol.lower() == "grpc" else httpclient
        client = mod.InferenceServerClient(flags.url)
        data = np.array([[open(flags.image_filename, "rb").read()]], dtype=object)
        item = mod.InferInput("INPUT", [1, 1], "BYTES")
        item.set_data_from_numpy(data)
        result = client.infer("preprocess_inception_ensemble", [item],
                              outputs=[mod.InferRequestedOutput("OUTPUT", class_count=flags.classes)])
        if len(result.as_numpy("OUTPUT")[0]) != 3:
            sys.exit("expected 3 classes")
        print("PASS")
    '''))
    code, results, output = _harness(examples, tmp_path / "r.json")
    assert code == 0, output
    assert [(r["protocol"], r["status"]) for r in results] == [("http", "passed"), ("grpc", "passed")], output
    assert all(r["args"].endswith("picture.jpg") and "-c 3" in r["args"] for r in results)
