"""A real Triton (the tritonserver of nvidia-pytriton 0.7.0, python backend) serving the models of
the differential test. Runs under the pytriton venv's interpreter, not StreamRT's: it imports
neither streamrt nor pytest.

    <pytriton venv>/bin/python triton_reference.py HTTP_PORT GRPC_PORT METRICS_PORT READY_FILE

Creates READY_FILE once Triton serves both models, then runs until stdin closes or SIGTERM. (A file,
not a line on stdout: tritonserver writes its log to the same stream, and a log line written at
the same moment can land in the middle of a printed marker.)

Models (the StreamRT side of the test serves the same functions as ONNX models):

* ``pair``: inputs a, b FP32 [-1, 10]; outputs sum = a + b, prod = a * b; max_batch_size 8,
  dynamic batching.
* ``reduce``: input x FP32 [-1, 3, 4, 4]; output y FP32 declared [-1, 1, 1, 1] but always
  [1, 1, 1, 1], the mean over every row of the batch; max_batch_size 8, dynamic batching.
"""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
import threading


def _libpython_on_path() -> None:
    # The python-backend stub must load the libpython of this interpreter (the note).
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir and libdir not in paths.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{paths}" if paths else libdir


def main() -> None:
    http_port, grpc_port, metrics_port = (int(a) for a in sys.argv[1:4])
    ready_file = sys.argv[4]
    _libpython_on_path()
    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    @batch
    def pair(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        return {"sum": a + b, "prod": a * b}

    @batch
    def reduce(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": np.mean(x, dtype=np.float32).reshape(1, 1, 1, 1)}

    batching = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=100_000))
    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                          http_address="127.0.0.1", grpc_address="127.0.0.1", exit_timeout_secs=2)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with Triton(config=config) as triton:
        triton.bind("pair", pair, inputs=[Tensor(name="a", dtype=np.float32, shape=(10,)),
                                          Tensor(name="b", dtype=np.float32, shape=(10,))],
                    outputs=[Tensor(name="sum", dtype=np.float32, shape=(10,)),
                             Tensor(name="prod", dtype=np.float32, shape=(10,))], config=batching)
        triton.bind("reduce", reduce, inputs=[Tensor(name="x", dtype=np.float32, shape=(3, 4, 4))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(1, 1, 1))], config=batching)
        triton.run()
        with open(ready_file + ".part", "w") as marker:
            marker.write(f"{os.getpid()}\n")
        os.replace(ready_file + ".part", ready_file)
        stop.wait()


if __name__ == "__main__":
    main()
