"""``streamrt serve --engine-cpus``: a real server process with 2 front-end processes, the engine process's
threads on the CPUs given and the front ends' on the rest (checked in /proc), inference answered through them;
placements this machine cannot give refused with one line before anything binds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import thread_masks
from streamrt.device.cpus import format_cpu_list, usable_cpus
from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ServerConfig
from streamrt.testing.server_process import child_pids, free_port, stop, wait_ready

ROOT = Path(__file__).resolve().parents[2]
USABLE = usable_cpus()

pytestmark = pytest.mark.timeout(180)


def _repo(root: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "double",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "double" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "double" / "1" / "model.onnx"))
    (root / "double" / "config.yaml").write_text("max_batch_size: 8\n")
    return root


def _serve(repo: Path, http: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                     os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(http),
                             "--grpc-port", "0", "--metrics-port", "-1", "--log-level", "INFO", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def test_config_sorts_the_cpus_and_refuses_an_empty_list() -> None:
    assert ServerConfig(engine_cpus=(3, 1, 1)).engine_cpus == (1, 3)
    with pytest.raises(ConfigError, match="engine_cpus"):
        ServerConfig(engine_cpus=())
    with pytest.raises(ConfigError, match="engine_cpus"):
        ServerConfig(engine_cpus=(-1,))


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable CPUs")
def test_the_engine_process_and_the_front_ends_run_where_they_were_put(tmp_path: Path) -> None:
    engine = frozenset({min(USABLE)})
    http = free_port()
    server = _serve(_repo(tmp_path / "repo"), http, "--frontend-processes", "2", "--engine-cpus",
                    format_cpu_list(engine))
    try:
        wait_ready(http, 120, server)
        workers = child_pids(server.pid)
        assert len(workers) == 2
        assert thread_masks(server.pid) == {engine}  # every thread: the loop, the model's pool, the driver's
        for worker in workers:
            assert thread_masks(worker) == {USABLE - engine}
        x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
        body = json.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()
        for _ in range(4):  # the kernel spreads connections over both front ends
            request = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/double/infer", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as reply:
                y = np.array(json.loads(reply.read())["outputs"][0]["data"], np.float32).reshape(3, 4)
            np.testing.assert_array_equal(y, 2 * x)
        assert thread_masks(server.pid) == {engine}  # threads started while serving too
    finally:
        assert stop(server, 30) is not None
    log = server.stdout.read().decode() if server.stdout else ""
    assert f"engine process on CPUs {format_cpu_list(engine)}, front-end processes on " \
           f"{format_cpu_list(USABLE - engine)}" in log


@pytest.mark.parametrize(("cpus", "says"), [
    (str(max(USABLE) + 1), "are not usable here"),
    (format_cpu_list(USABLE), "leaves no CPU for the front-end processes"),
])
def test_a_placement_this_machine_cannot_give_is_one_line_and_no_server(tmp_path: Path, cpus: str,
                                                                        says: str) -> None:
    server = _serve(_repo(tmp_path / "repo"), free_port(), "--frontend-processes", "2", "--engine-cpus", cpus)
    out, _ = server.communicate(timeout=120)
    text = out.decode()
    assert server.returncode != 0
    assert says in text
    assert "Traceback" not in text


def test_a_malformed_list_is_refused_by_the_parser(tmp_path: Path) -> None:
    server = _serve(tmp_path, free_port(), "--engine-cpus", "0-x")
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 2
    assert "--engine-cpus: expected a CPU list such as 0-1,8" in out.decode()


IN_A_THREAD = """
import os, sys
from pathlib import Path
from streamrt.serve import ServerConfig, ServerThread
usable = frozenset(os.sched_getaffinity(0))
engine = frozenset({min(usable)})
def masks():
    found = set()
    for t in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            found.add(frozenset(os.sched_getaffinity(int(t))))
        except ProcessLookupError:  # the thread exited meanwhile
            pass
    return found
config = ServerConfig(http_port=0, grpc_port=None, metrics_port=None, engine_cpus=tuple(engine))
with ServerThread(sys.argv[1], config) as server:
    assert masks() == {engine}, masks()
assert masks() == {usable}, masks()
print("ok")
"""


@pytest.mark.skipif(len(USABLE) < 2, reason="needs two usable CPUs")
def test_a_server_in_a_thread_gives_the_process_its_cpus_back_at_stop(tmp_path: Path) -> None:
    """``ServerThread`` with ``engine_cpus`` pins the whole process while it serves (its caller's threads too: the
    option places a process) and gives every thread its CPUs back when it stops."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                     os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", IN_A_THREAD, str(_repo(tmp_path / "repo"))], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.stdout + done.stderr)[-3000:]
