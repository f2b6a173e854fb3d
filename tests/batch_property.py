"""The harness of the batch-integrity property test (issue 18), shared by the CPU and GPU variants.

:func:`send_burst` fires a burst of requests at once from several client threads (tritonclient
HTTP sync and async, gRPC sync and streaming, one client per thread; or, where tritonclient is not
installed, straight into the server's ``infer`` on its event loop), so the dynamic batcher merges
them across instances; :func:`check_answers` then holds every answer to the model run on that
request alone, and checks that every request got exactly one answer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

try:
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
except ImportError:  # the GPU machine's image has no tritonclient: in-process requests only
    tgrpc = thttp = None

from streamrt.serve.wire.protocol import InferRequest
from streamrt.testing.batch_models import MIXED_MAX_BATCH, mixed_dtype_inputs

Arrays = dict[str, np.ndarray]
DTYPES = {"a": "FP32", "b": "INT32", "c": "FP16"}
OUTPUTS = ("scaled", "rowsum", "half", "flag")
PROTOCOLS = ("http", "http_async", "grpc", "grpc_stream")
IN_PROCESS = ("in_process",)  # InferenceServer.infer on the server's loop: batcher and instances, no wire
AVAILABLE = PROTOCOLS if thttp is not None else IN_PROCESS
WORKERS = 6


@dataclass(frozen=True)
class Request:
    id: str
    protocol: str
    inputs: Arrays


_WIDTHS = {"a": 4, "b": 3, "c": 2}
# Edge values drawn as raw bit patterns: every float32 / float16 value there is, NaN payloads,
# infinities, -0.0 and subnormals included (st.floats(width=16) rejects too much inside a burst).
_SPECIALS = {
    "a": (st.integers(0, 2**32 - 1), np.uint32),
    "b": (st.integers(-(2**31), 2**31 - 1), np.int32),   # the int32 extremes (the model sums in int64)
    "c": (st.integers(0, 2**16 - 1), np.uint16),
}


@st.composite
def requests(draw: st.DrawFn, index: int = 0, max_rows: int = MIXED_MAX_BATCH // 2,
             protocols: tuple[str, ...] = PROTOCOLS) -> Request:
    """One request of 1..max_rows rows: distinct random values from a drawn seed (so that any row
    handed to the wrong request shows), with up to three drawn edge values per input written over them."""
    rows = draw(st.integers(1, max_rows))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = mixed_dtype_inputs(rng, rows)
    for name, (values, bits) in _SPECIALS.items():
        flat = inputs[name].reshape(-1).view(bits)
        for value in draw(st.lists(values, max_size=3)):
            flat[draw(st.integers(0, rows * _WIDTHS[name] - 1))] = value
    return Request(f"r{index}", draw(st.sampled_from(protocols)), inputs)


@st.composite
def bursts(draw: st.DrawFn, min_size: int = 4, max_size: int = 24,
           protocols: tuple[str, ...] = PROTOCOLS) -> list[Request]:
    n = draw(st.integers(min_size, max_size))
    return [draw(requests(i, protocols=protocols)) for i in range(n)]


def _inputs(module: Any, x: Arrays) -> list[Any]:
    items = []
    for name, value in x.items():
        inp = module.InferInput(name, list(value.shape), DTYPES[name])
        if module is thttp:
            inp.set_data_from_numpy(value, binary_data=True)  # JSON cannot carry NaN or inf
        else:
            inp.set_data_from_numpy(value)
        items.append(inp)
    return items


def _outputs(result: Any) -> Arrays:
    return {n: result.as_numpy(n) for n in OUTPUTS}


class Clients(threading.local):
    """One HTTP and one gRPC client per worker thread (tritonclient's HTTP client is not thread-safe),
    made on first use; ``server`` answers the in-process requests."""

    def __init__(self, server: Any, opened: list[Any]) -> None:
        self.server = server
        self._opened = opened
        self._http: Any = None
        self._grpc: Any = None

    @property
    def http(self) -> Any:
        if self._http is None:
            self._http = thttp.InferenceServerClient(f"127.0.0.1:{self.server.http_port}", concurrency=4,
                                                     network_timeout=60)
            self._opened.append(self._http)
        return self._http

    @property
    def grpc(self) -> Any:
        if self._grpc is None:
            self._grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{self.server.grpc_port}")
            self._opened.append(self._grpc)
        return self._grpc


def _send_group(clients: Clients, model: str, group: list[Request]) -> list[tuple[str, Any]]:
    """Send one worker's share; returns (request id, outputs or exception) per answer received."""
    answers: list[tuple[str, Any]] = []
    pending_http = []
    stream: list[Request] = []
    for r in group:
        try:
            if r.protocol == "in_process":
                response = clients.server.call(clients.server.server.infer(
                    InferRequest(model, id=r.id, inputs=dict(r.inputs))), timeout=60)
                answers.append((response.id, {n: np.asarray(response.outputs[n]) for n in OUTPUTS}))
            elif r.protocol == "http":
                result = clients.http.infer(model, _inputs(thttp, r.inputs), request_id=r.id)
                answers.append((result.get_response()["id"], _outputs(result)))
            elif r.protocol == "http_async":
                pending_http.append((r, clients.http.async_infer(model, _inputs(thttp, r.inputs), request_id=r.id)))
            elif r.protocol == "grpc":
                result = clients.grpc.infer(model, _inputs(tgrpc, r.inputs), request_id=r.id, client_timeout=60)
                answers.append((result.get_response().id, _outputs(result)))
            else:
                stream.append(r)
        except Exception as exc:
            answers.append((r.id, exc))
    for r, handle in pending_http:
        try:
            result = handle.get_result()
            answers.append((result.get_response()["id"], _outputs(result)))
        except Exception as exc:
            answers.append((r.id, exc))
    if stream:
        box: queue.Queue[tuple[Any, Any]] = queue.Queue()
        clients.grpc.start_stream(callback=lambda result, error: box.put((result, error)))
        try:
            for r in stream:
                clients.grpc.async_stream_infer(model, _inputs(tgrpc, r.inputs), request_id=r.id)
            for r in stream:
                result, error = box.get(timeout=60)
                if error is not None:  # a stream error carries no id; the server answers a stream in order
                    answers.append((r.id, error))
                else:
                    answers.append((result.get_response().id, _outputs(result)))
        finally:
            clients.grpc.stop_stream()
        try:  # nothing more may arrive once every request has its answer
            extra = box.get(timeout=0.05)
            answers.append(("<extra stream answer>", extra))
        except queue.Empty:
            pass
    return answers


def send_burst(pool: ThreadPoolExecutor, clients: Clients, model: str, burst: list[Request]) -> list[tuple[str, Any]]:
    """Send ``burst`` at once from the pool's threads; every answer with the id it came back with."""
    groups = [burst[i::WORKERS] for i in range(WORKERS)]
    barrier = threading.Barrier(sum(1 for g in groups if g))

    def work(group: list[Request]) -> list[tuple[str, Any]]:
        if any(r.protocol != "in_process" for r in group):
            clients.http  # noqa: B018 - opens this thread's clients before the start line
        barrier.wait(timeout=30)
        return _send_group(clients, model, group)

    futures = [pool.submit(work, g) for g in groups if g]
    return [answer for f in futures for answer in f.result(timeout=120)]


def _bitwise_equal(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit for bit, except a NaN's payload: a NaN must be a NaN at the same place. (ONNX Runtime's
    float->float16 Cast keeps payloads on its vectorised path and makes them 0x7e00 on the scalar one,
    so the payload depends on how many values the batch had; IEEE 754 leaves payloads open.)"""
    if got.dtype.kind != "f":
        return bool(np.array_equal(got, want))
    nan = np.isnan(got)
    if not np.array_equal(nan, np.isnan(want)):
        return False
    bits = np.dtype(f"u{got.dtype.itemsize}")
    return bool(np.array_equal(np.ascontiguousarray(got).view(bits)[~nan], np.ascontiguousarray(want).view(bits)[~nan]))


def check_answers(burst: list[Request], answers: list[tuple[str, Any]], reference: Callable[[Arrays], Arrays],
                  tolerance: dict[str, tuple[float, float]] | None = None, *, failures: str | None = None) -> int:
    """Every request answered exactly once, with its own outputs: bitwise equal to ``reference`` (the
    model run on that request alone), or within ``tolerance`` (output -> (rtol, atol)) where given.

    ``failures``: words every failure must contain for a failed request to be allowed (a model whose
    bad batches the server must refuse); None: no failure allowed. Returns how many failed."""
    by_id: dict[str, list[Any]] = {}
    for rid, answer in answers:
        by_id.setdefault(rid, []).append(answer)
    expected_ids = {r.id for r in burst}
    assert set(by_id) == expected_ids, f"answers for unknown ids {set(by_id) - expected_ids}, " \
                                       f"no answer for {expected_ids - set(by_id)}"
    failed = 0
    for r in burst:
        got = by_id[r.id]
        assert len(got) == 1, f"request {r.id} answered {len(got)} times"
        answer = got[0]
        if isinstance(answer, BaseException):
            assert failures is not None and failures in str(answer), f"request {r.id} ({r.protocol}) failed: {answer}"
            failed += 1
            continue
        want = reference(r.inputs)
        for name in OUTPUTS:
            mine, theirs = want[name], answer[name]
            assert theirs.shape == mine.shape and theirs.dtype == mine.dtype, \
                f"request {r.id} ({r.protocol}) output {name}: {theirs.dtype}{list(theirs.shape)}, " \
                f"alone it is {mine.dtype}{list(mine.shape)}"
            if tolerance and name in tolerance:
                rtol, atol = tolerance[name]
                np.testing.assert_allclose(theirs.astype(np.float64), mine.astype(np.float64), rtol=rtol, atol=atol,
                                           err_msg=f"request {r.id} ({r.protocol}) output {name}")
            else:
                assert _bitwise_equal(theirs, mine), \
                    f"request {r.id} ({r.protocol}) output {name} is not bitwise what it is alone:\n{theirs}\n{mine}"
    return failed
