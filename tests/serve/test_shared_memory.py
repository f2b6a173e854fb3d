"""The system shared-memory extension with the real tritonclient utilities, over HTTP and gRPC:
inputs and outputs in regions, status, unregister, every refusal with Triton's code (an unknown
region 404 / NOT_FOUND, a name registered twice 400 / ALREADY_EXISTS, the rest 400 /
INVALID_ARGUMENT) and none corrupting anything, regions released on unregister and shutdown,
and a soak over shared memory."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as shm
from tests.serve.conftest import BEHAVIOURS, fake_loader, make_repo, server_config
from tritonclient.utils import InferenceServerException

from streamrt.serve.server import ServerThread


def fan_out(n: int, fn: Any) -> list[Any]:
    """``fn(i)`` for i in 0..n-1 on threads; a result stays None when its call raised."""
    results: list[Any] = [None] * n
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fn(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results

pytestmark = pytest.mark.timeout(120)

X_BYTES = 2 * 3 * 32 * 32 * 4
Y_BYTES = 2 * 10 * 4


def _client(server: Any, protocol: str) -> Any:
    if protocol == "http":
        return thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    return tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _mappings(key: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(f"/dev/shm/{key}"))


def _unmapped_to(key: str, count: int, timeout_s: float = 5.0) -> int:
    """The mappings of ``key`` once they are down to ``count``, or after ``timeout_s``. An unregistered
    region is unmapped when the last array viewing it is freed: the answered request's arrays can outlive
    its reply for a moment (the engine's bookkeeping after the reply, or a reference cycle until the next
    collection; one such run failed on a fresh machine with two front-end processes)."""
    import gc

    deadline = time.monotonic() + timeout_s
    while (now := _mappings(key)) != count and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return now


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "2-frontend-processes"])
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path],
           request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """conftest's server, in one process and through two front-end worker processes (the workers
    parse the region parameters; the engine process resolves, checks and leases the regions)."""
    repo = make_repo(tmp_path_factory.mktemp("repo"), plans)
    config = server_config(frontend_processes=request.param)
    with ServerThread(repo, config, engine_loader=fake_loader, start_timeout=120) as running:
        yield running
    for b in BEHAVIOURS.values():
        b.reset()


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def region(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A 64 KiB client region (key unique per test), destroyed afterwards."""
    key = f"/streamrt_test_{abs(hash(request.node.nodeid)) % 10**8}_{threading.get_ident() % 1000}"
    handle = shm.create_shared_memory_region("r", key, 65536)
    yield handle, key
    shm.destroy_shared_memory_region(handle)


def _io(mod: Any, x_region: str, y_region: str, x_offset: int = 0, y_offset: int = 0,
        y_size: int = Y_BYTES) -> tuple[Any, Any]:
    inp = mod.InferInput("x", [2, 3, 32, 32], "FP32")
    inp.set_shared_memory(x_region, X_BYTES, offset=x_offset)
    out = mod.InferRequestedOutput("logits")
    out.set_shared_memory(y_region, y_size, offset=y_offset)
    return inp, out


def test_inputs_and_outputs_in_shared_memory(server: Any, reference: Any, region: Any, protocol: str) -> None:
    handle, key = region
    client, mod = _client(server, protocol), thttp if protocol == "http" else tgrpc
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    try:
        client.unregister_system_shared_memory()
        mapped = _mappings(key.lstrip("/"))
        client.register_system_shared_memory("io", key, 65536)
        assert _mappings(key.lstrip("/")) == mapped + 1
        shm.set_shared_memory_region(handle, [x], offset=1024)
        shm.set_shared_memory_region(handle, [np.full(16, np.nan, np.float32)], offset=40000)  # poison the output
        inp, out = _io(mod, "io", "io", x_offset=1024, y_offset=40000)
        result = client.infer("cnn", [inp], outputs=[out])
        y = shm.get_contents_as_numpy(handle, np.float32, [2, 10], offset=40000)
        np.testing.assert_allclose(y, reference("small_cnn", {"x": x})["logits"], rtol=1e-4, atol=1e-5)
        described = result.get_output("logits")
        params = described["parameters"] if protocol == "http" else {
            k: v.string_param or v.int64_param for k, v in described.parameters.items()}
        assert params["shared_memory_region"] == "io"
        assert params["shared_memory_byte_size"] == Y_BYTES
        status = client.get_system_shared_memory_status()
        names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
        assert names == ["io"]
        client.unregister_system_shared_memory("io")
        assert _unmapped_to(key.lstrip("/"), mapped) == mapped  # the server's mapping is gone
        status = client.get_system_shared_memory_status()
        assert not (status if protocol == "http" else status.regions)
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_mixed_shared_memory_and_raw_inputs_keep_their_order(server: Any, reference: Any, region: Any,
                                                             protocol: str) -> None:
    """Model `pair` has inputs a and b: a from shared memory, b sent raw (gRPC: raw index 0 is b)."""
    handle, key = region
    client, mod = _client(server, protocol), thttp if protocol == "http" else tgrpc
    meta = client.get_model_metadata("pair")
    inputs = meta["inputs"] if protocol == "http" else [
        {"name": t.name, "shape": list(t.shape), "datatype": t.datatype} for t in meta.inputs]
    rng = np.random.default_rng()
    arrays = {t["name"]: rng.standard_normal([abs(d) for d in t["shape"]]).astype(np.float32) for t in inputs}
    first, second = inputs[0]["name"], inputs[1]["name"]
    try:
        client.register_system_shared_memory("pair_in", key, 65536)
        shm.set_shared_memory_region(handle, [arrays[first]])
        a = mod.InferInput(first, list(arrays[first].shape), "FP32")
        a.set_shared_memory("pair_in", arrays[first].nbytes)
        b = mod.InferInput(second, list(arrays[second].shape), "FP32")
        b.set_data_from_numpy(arrays[second])
        result = client.infer("pair", [a, b])
        expected = reference("two_io", arrays)
        for name, value in expected.items():
            np.testing.assert_allclose(result.as_numpy(name), value, rtol=1e-5, atol=1e-6)
    finally:
        client.unregister_system_shared_memory()
        client.close()


_CODES = {"bad": ("400", "INVALID_ARGUMENT"), "unknown": ("404", "NOT_FOUND"), "taken": ("400", "ALREADY_EXISTS")}


def _refused(call: Any, *fragments: str, kind: str = "bad") -> None:
    """``call`` is refused with the status Triton gives that ``kind`` of refusal, naming ``fragments``."""
    with pytest.raises(InferenceServerException) as info:
        call()
    text = str(info.value)
    status = str(info.value.status())
    assert any(status in (code, f"StatusCode.{code}") for code in _CODES[kind]), (status, text)
    for fragment in fragments:
        assert fragment in text, text


def test_refusals_use_tritons_codes_and_corrupt_nothing(server: Any, region: Any, protocol: str) -> None:
    handle, key = region
    client, mod = _client(server, protocol), thttp if protocol == "http" else tgrpc
    x = np.random.default_rng().standard_normal((2, 3, 32, 32)).astype(np.float32)
    poison = np.arange(16, dtype=np.float32) + 0.5
    small = shm.create_shared_memory_region("small", f"{key}_small", 4096)
    try:
        _refused(lambda: client.register_system_shared_memory("huge", f"{key}_small", 1 << 20), "exceeds")
        client.register_system_shared_memory("small", f"{key}_small", 4096)  # holds x? no: 24 KiB do not fit
        client.register_system_shared_memory("big", key, 65536)
        _refused(lambda: client.register_system_shared_memory("big", key, 16),
                 "shared memory region 'big' already in manager", kind="taken")
        # Triton's second mapping of one key fails (it reuses the first registration's closed descriptor)
        _refused(lambda: client.register_system_shared_memory("again", key, 16, offset=4096),
                 "failed to register shared memory region 'again'", "'big'")
        _refused(lambda: client.register_system_shared_memory("nokey", "/streamrt_no_such_key", 16), "cannot open")
        shm.set_shared_memory_region(handle, [x])
        shm.set_shared_memory_region(handle, [poison], offset=50000)
        _refused(lambda: client.infer("cnn", [_io(mod, "nowhere", "big")[0]]),
                 "Unable to find shared memory region: 'nowhere'", kind="unknown")
        _refused(lambda: client.infer("cnn", [_io(mod, "small", "big")[0]]), "exceeds", "small")
        _refused(lambda: client.infer("cnn", list(_io(mod, "big", "big", y_offset=65536 - 8))[:1],
                                      outputs=[_io(mod, "big", "big", y_offset=65536 - 8)[1]]), "exceeds")
        # The output needs 80 bytes; the request gives 40: refused after inference, region untouched.
        inp, out = _io(mod, "big", "big", y_offset=50000, y_size=40)
        _refused(lambda: client.infer("cnn", [inp], outputs=[out]), "80 bytes", "nothing was written")
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [16], offset=50000), poison)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [2, 3, 32, 32]), x)
        _refused(lambda: client.get_system_shared_memory_status("nowhere"),
                 "Unable to find system shared memory region: 'nowhere'", kind="unknown")
        _refused(lambda: client.get_cuda_shared_memory_status("big"),
                 "The region named 'big' is registered as system shared memory, not CUDA shared memory",
                 kind="unknown")
        # The server still serves the region correctly after all that.
        inp, out = _io(mod, "big", "big", y_offset=50000)
        client.infer("cnn", [inp], outputs=[out])
        assert not np.array_equal(shm.get_contents_as_numpy(handle, np.float32, [16], offset=50000), poison)
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(small)


def test_unregister_while_in_use_is_refused(server: Any, behaviours: Any, region: Any, protocol: str) -> None:
    handle, key = region
    client, mod = _client(server, protocol), thttp if protocol == "http" else tgrpc
    x = np.random.default_rng().standard_normal((2, 3, 32, 32)).astype(np.float32)
    gate = threading.Semaphore(0)
    try:
        client.register_system_shared_memory("held", key, 65536)
        shm.set_shared_memory_region(handle, [x])
        behaviours["slow"].gate = gate
        inp, out = _io(mod, "held", "held", y_offset=30000)
        done: dict[str, Any] = {}
        runner = threading.Thread(target=lambda: done.setdefault("r", _client(server, protocol).infer(
            "slow", [inp], outputs=[out])))
        runner.start()
        deadline = time.monotonic() + 20
        while behaviours["slow"].calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        _refused(lambda: client.unregister_system_shared_memory("held"), "held", "use it")
        _refused(lambda: client.unregister_system_shared_memory(), "held")
        gate.release()
        runner.join(30)
        assert "r" in done
        client.unregister_system_shared_memory("held")
    finally:
        gate.release()
        client.unregister_system_shared_memory()
        client.close()


@pytest.mark.parametrize("frontend_processes", [1, 2], ids=["one-process", "2-frontend-processes"])
def test_regions_are_released_on_shutdown(make_server: Any, region: Any, frontend_processes: int) -> None:
    _, key = region
    other = shm.create_shared_memory_region("b", f"{key}_b", 16384)
    keys = (key.lstrip("/"), f"{key}_b".lstrip("/"))
    mapped = [_mappings(k) for k in keys]
    try:
        with make_server(frontend_processes=frontend_processes) as server:
            client = _client(server, "http")
            client.register_system_shared_memory("a", key, 4096)
            client.register_system_shared_memory("b", f"{key}_b", 4096, offset=8192)
            client.close()
            assert [_mappings(k) for k in keys] == [n + 1 for n in mapped]
        assert [_mappings(k) for k in keys] == mapped
    finally:
        shm.destroy_shared_memory_region(other)


def test_soak_over_shared_memory_every_request_answered_once(server: Any, reference: Any, protocol: str) -> None:
    """6 clients x 3 s, each with its own region: every answer is its own input's, none lost."""
    mod = thttp if protocol == "http" else tgrpc

    def client(i: int) -> tuple[int, int]:
        rng = np.random.default_rng(i)
        key = f"/streamrt_soak_{protocol}_{i}"
        handle = shm.create_shared_memory_region(f"soak{i}", key, X_BYTES * 2)
        c = _client(server, protocol)
        sent = ok = 0
        try:
            c.register_system_shared_memory(f"soak{i}", key, X_BYTES * 2)
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
                shm.set_shared_memory_region(handle, [x])
                inp, out = _io(mod, f"soak{i}", f"soak{i}", y_offset=X_BYTES)
                sent += 1
                result = c.infer("cnn", [inp], outputs=[out], request_id=f"{i}-{sent}")
                rid = result.get_response()["id"] if protocol == "http" else result.get_response().id
                assert rid == f"{i}-{sent}"
                y = shm.get_contents_as_numpy(handle, np.float32, [2, 10], offset=X_BYTES)
                np.testing.assert_allclose(y, reference("small_cnn", {"x": x})["logits"], rtol=1e-4, atol=1e-5)
                ok += 1
        finally:
            c.unregister_system_shared_memory(f"soak{i}")
            c.close()
            shm.destroy_shared_memory_region(handle)
        return sent, ok

    before = server.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
    results = fan_out(6, client)
    after = server.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
    sent = sum(r[0] for r in results)
    assert sent > 0 and all(r is not None and r[0] == r[1] for r in results), results
    assert after - before == sent


def test_classification_into_shared_memory_is_refused(server: Any, region: Any) -> None:
    """Classification answers are BYTES strings: a region cannot take them, and nothing is written."""
    handle, key = region
    client = _client(server, "http")
    x = np.random.default_rng().standard_normal((2, 3, 32, 32)).astype(np.float32)
    poison = np.arange(16, dtype=np.float32)
    try:
        client.register_system_shared_memory("cls", key, 65536)
        shm.set_shared_memory_region(handle, [x])
        shm.set_shared_memory_region(handle, [poison], offset=40000)
        # tritonclient refuses this itself; a hand-written request reaches the server.
        body = {"inputs": [{"name": "x", "shape": [2, 3, 32, 32], "datatype": "FP32", "parameters": {
                    "shared_memory_region": "cls", "shared_memory_byte_size": X_BYTES}}],
                "outputs": [{"name": "logits", "parameters": {
                    "classification": 3, "shared_memory_region": "cls", "shared_memory_byte_size": Y_BYTES,
                    "shared_memory_offset": 40000}}]}
        request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/cnn/infer",
                                         data=json.dumps(body).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 400 and "nothing was written" in err.value.read().decode()
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [16], offset=40000), poison)
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_system_regions_are_offered_for_page_locking_until_unregistered(tmp_path: Any) -> None:
    """A CUDA instance copies a system region's tensors to the device straight from the mapping: the
    registry offers each mapping to staging.PINNABLE (nothing is locked until a copy reads it) and
    withdraws it on unregister."""
    import uuid

    from streamrt.device.staging import PINNABLE
    from streamrt.serve.wire.shared_memory import RegionRef, SharedMemoryRegistry

    key = f"/streamrt_pin_{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 8192)
        registry = SharedMemoryRegistry()
        registry.register_system("pinned", key, 0, 8192)
        leases: list[Any] = []
        view = registry.read_input(RegionRef("pinned", 4096, 64), np.dtype(np.float32), (16,), "input 'x'", leases)
        assert PINNABLE.offers(view) and PINNABLE.locked_bytes == 0
        SharedMemoryRegistry.release(leases)
        registry.unregister("system", "pinned")
        assert not PINNABLE.offers(view)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
