"""Run NVIDIA's Triton client examples against a real ``streamrt serve``.

Point ``--examples`` at a folder holding the scripts of ``triton-inference-server/client``'s
``src/python/examples`` (a checkout, or copies; they are not part of this repository). The script
writes the models those examples use (``streamrt.testing.triton_examples``), starts ``streamrt
serve`` on free ports (8000/8001/8002 when they are free, since a few examples hard-code them),
runs every example as ``python NAME.py -u localhost:PORT`` (the HTTP or gRPC port, as its name
says; ``-d`` again for the sequence examples, ``-i grpc`` / ``-i http`` for the two that take a
protocol), and prints one row per run: passed, failed (with the output's last lines), xfail (a
check that no server can pass with the installed tritonclient, see ``XFAILS``) or skipped with the
reason (decoupled models, CUDA shared memory, vLLM). An example passes when it exits
0 and, if its source prints ``PASS``, when its output says ``PASS`` (several examples exit 0 after a
failed check and only leave the ``PASS`` line out).

The image examples run as Triton's QA runs them (``IMAGE_RUNS``: ``-m densenet_onnx -c 3 -s INCEPTION``
on a picture the script writes, synchronous, ``-a`` and gRPC ``--streaming``; the ensemble on the
picture file's bytes) against untrained models of Triton's names and shapes; they need Pillow (and
``image_client.py`` over HTTP ``attrdict``), and are skipped with that reason where it is missing.

Model-control examples unload ``simple`` and count the repository's models (seven in some, eight in
others, as upstream's own repositories differ), so each runs against a server of its own whose
repository holds that many models.

    python scripts/nvidia_client_examples.py --examples ~/triton-client/src/python/examples \\
        [-k shm -k sequence] [--markdown OUT.md] [--json OUT.json]

Exit status: 0 when every example that should pass passed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from streamrt.testing.server_process import free_port, stop, wait_ready  # noqa: E402
from streamrt.testing.triton_examples import MODEL_NAMES, write_repository  # noqa: E402

#: Examples that cannot pass here, by name (a regular expression on the file name) and why.
SKIPS: tuple[tuple[str, str], ...] = (
    (r"^grpc_client\.py$", "sends inception's tensors to densenet_onnx: fails against Triton's own example model too"),
    (r"vllm", "needs a vLLM model (decoupled, generate extension)"),
    (r"custom_repeat", "decoupled model (repeat_int32)"),
)
#: Examples that fail against any server with the installed tritonclient: (file name, output, why).
#: Such a failure is reported as ``xfail`` and does not fail the run; any other failure does.
XFAILS: tuple[tuple[str, str, str], ...] = (
    (r"^simple_grpc_model_control\.py$", r"expected 'Invalid file path' for oversized file path; got 'StatusCode\.",
     "looks for the message in InferenceServerException.status(), which tritonclient sets to the gRPC code "
     "name; the server answers INVALID_ARGUMENT 'Invalid file path: ...' (tests/serve/test_triton_client_parity.py)"),
)
PICTURE = "{picture}"
"""Stands for the picture the script writes, in :data:`IMAGE_RUNS`."""
#: The image examples' runs: (file name, protocols, the variants of their arguments), as Triton's QA runs them.
_DENSENET = ("-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", PICTURE)
IMAGE_RUNS: tuple[tuple[str, tuple[str, ...], tuple[tuple[str, ...], ...]], ...] = (
    ("image_client.py", ("http", "grpc"), (_DENSENET, ("-a", *_DENSENET))),
    ("image_client.py", ("grpc",), (("--streaming", *_DENSENET),)),
    ("grpc_image_client.py", ("grpc",), (_DENSENET, ("--streaming", *_DENSENET),
                                         ("-m", "inception_graphdef", "-c", "3", "-s", "INCEPTION", PICTURE))),
    ("ensemble_image_client.py", ("http", "grpc"), (("-c", "3", PICTURE),)),
)
DECOUPLED = re.compile(r"decoupled|repeat_int32|square_int32")
SEQUENCE = re.compile(r"sequence_(sync|stream)")
REPOSITORY_COUNT = re.compile(r"get_model_repository_index\(\)\)?(?:\.models)?\)\s*!=\s*(\d+)")
PROTOCOL_FLAG = re.compile(r"['\"]--protocol['\"]")
URL_FLAG = re.compile(r"['\"]--url['\"]")
TAIL_LINES = 8


@dataclass(frozen=True)
class Run:
    """One invocation of one example."""

    example: str
    protocol: str
    args: tuple[str, ...]
    own_server: int = 0  # > 0: a fresh server whose repository holds this many models
    needs_default_ports: bool = False


@dataclass
class Result:
    example: str
    protocol: str
    args: str
    status: str  # passed | failed | xfail | skipped
    seconds: float
    detail: str


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _missing(modules: Sequence[str]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _cuda_shared_memory_missing() -> str | None:
    """Why tritonclient's CUDA shared memory cannot run here (no GPU, no cuda-python), or None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "CUDA shared memory needs a GPU"
        import tritonclient.utils.cuda_shared_memory  # noqa: F401  (needs cuda-python)
    except Exception as exc:  # an import that fails its own way (a CUDA library missing) is a reason too
        return f"CUDA shared memory is unusable here: {exc}"
    return None


def skip_reason(path: Path, source: str) -> str | None:
    for pattern, reason in SKIPS:
        if re.search(pattern, path.name):
            return reason
    if "cudashm" in path.name:
        return _cuda_shared_memory_missing()
    if any(path.name == name for name, _, _ in IMAGE_RUNS):
        missing = _missing(["PIL", *(["attrdict"] if "attrdict" in source else [])])
        if missing:
            return f"needs {' and '.join(missing)} (the example's own imports; pip install pillow attrdict)"
    if DECOUPLED.search(source):
        return "decoupled model"
    return None


def plan(path: Path, source: str, picture: Path | None = None) -> list[Run]:
    """The runs of one example: its protocol(s) and arguments, from its name and argument parser (the image
    examples: :data:`IMAGE_RUNS`, on ``picture``)."""
    name = path.name
    images = [(protocols, variants) for n, protocols, variants in IMAGE_RUNS if n == name]
    if images:
        flag = PROTOCOL_FLAG.search(source) is not None
        return [Run(name, protocol, (*(("-i", protocol) if flag else ()),
                                     *(str(picture) if a == PICTURE else a for a in variant)))
                for protocols, variants in images for protocol in protocols for variant in variants]
    counted = REPOSITORY_COUNT.search(source)
    own = int(counted.group(1)) if counted else 0
    hard_coded = not URL_FLAG.search(source)
    protocols = ["http", "grpc"] if PROTOCOL_FLAG.search(source) else ["grpc" if "grpc" in name else "http"]
    runs = []
    for protocol in protocols:
        base = ("-i", protocol) if PROTOCOL_FLAG.search(source) else ()
        variants: list[tuple[str, ...]] = [base]
        if SEQUENCE.search(name) and "--dyna" in source:
            variants.append((*base, "-d"))
        runs += [Run(name, protocol, v, own, hard_coded) for v in variants]
    return runs


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    http: int
    grpc: int
    log: Path


@contextmanager
def serving(repo: Path, log_dir: Path, default_ports: bool) -> Iterator[Server]:
    """``streamrt serve repo`` in a subprocess, ready (``/v2/health/ready``) before it is yielded."""
    ports = (8000, 8001, 8002) if default_ports else (free_port(), free_port(), free_port())
    log = log_dir / f"server-{repo.name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", str(ports[0]),
               "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--exit-timeout", "5"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(process, ports[0], ports[1], log)
    try:
        wait_ready(ports[0], 180, process, log=log)
        yield server
    finally:
        stop(process)


def run_example(examples: Path, run: Run, server: Server, timeout: float) -> Result:
    source = (examples / run.example).read_text()
    port = server.grpc if run.protocol == "grpc" else server.http
    args = (*run.args, "-u", f"localhost:{port}") if URL_FLAG.search(source) else run.args
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, run.example, *args], cwd=examples, capture_output=True,
                              text=True, timeout=timeout, check=False)
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        # TimeoutExpired keeps what was read as bytes, even with text=True
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else (p or "") for p in (exc.stdout, exc.stderr)]
        rc, output = -1, "".join(parts) + f"\ntimed out after {timeout:.0f} s"
    seconds = time.monotonic() - start
    expects_pass = re.search(r"print\(\s*['\"]PASS", source) is not None
    ok = rc == 0 and (not expects_pass or "PASS" in output)
    why = "" if ok else f"exit {rc}" + ("" if rc else ", no PASS line") + ": " + " | ".join(
        line for line in output.strip().splitlines()[-TAIL_LINES:])
    status = "passed" if ok else "failed"
    for name, pattern, reason in XFAILS:
        if not ok and re.search(name, run.example) and re.search(pattern, output):
            status, why = "xfail", f"{reason} ({why})"
    return Result(run.example, run.protocol, " ".join(run.args), status, seconds, why)


def write_picture(path: Path) -> None:
    """A 320x240 JPEG (colour gradients) for the image examples."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:240, 0:320]
    pixels = np.stack([x * 255 // 320, y * 255 // 240, (x + y) % 256], -1).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=90)


def select(examples: Path, patterns: Sequence[str]) -> list[Path]:
    paths = sorted(p for p in examples.glob("*.py") if not p.name.startswith("_"))
    return [p for p in paths if not patterns or any(k in p.name for k in patterns)]


def run_all(examples: Path, patterns: Sequence[str], work: Path, timeout: float) -> list[Result]:
    results: list[Result] = []
    runs: list[Run] = []
    picture = work / "picture.jpg"
    for path in select(examples, patterns):
        source = path.read_text()
        reason = skip_reason(path, source)
        if reason:
            results.append(Result(path.name, "grpc" if "grpc" in path.name else "http", "", "skipped", 0.0, reason))
        else:
            runs += plan(path, source, picture)
    if any(r.example in {name for name, _, _ in IMAGE_RUNS} for r in runs):
        write_picture(picture)
    if not runs:
        return results
    default_ports = all(port_is_free(p) for p in (8000, 8001, 8002))
    shared = [r for r in runs if not r.own_server]
    if shared:
        repo = work / "repo"
        write_repository(repo)
        with serving(repo, work, default_ports) as server:
            for run in shared:
                results.append(_guarded(examples, run, server, timeout, default_ports))
    for index, run in enumerate(r for r in runs if r.own_server):
        repo = work / f"repo-{index}-{run.own_server}"
        write_repository(repo, MODEL_NAMES[:run.own_server])
        with serving(repo, work, default_ports) as server:
            results.append(_guarded(examples, run, server, timeout, default_ports))
    return results


def _guarded(examples: Path, run: Run, server: Server, timeout: float, default_ports: bool) -> Result:
    if run.needs_default_ports and not default_ports:
        return Result(run.example, run.protocol, " ".join(run.args), "skipped", 0.0,
                      "hard-codes localhost:8000/8001, which were busy")
    return run_example(examples, run, server, timeout)


def table(results: Sequence[Result], markdown: bool = False) -> str:
    rows = [(r.example, r.protocol, r.args, r.status, f"{r.seconds:.1f}", r.detail) for r in results]
    head = ("example", "protocol", "args", "result", "s", "detail")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(5)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths) + "  {}"
    return "\n".join(fmt.format(*row) for row in [head, *rows])


def summary(results: Sequence[Result]) -> str:
    counts = {status: sum(r.status == status for r in results) for status in ("passed", "failed", "xfail", "skipped")}
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=Path, required=True, help="folder of NVIDIA's example scripts")
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="run only examples whose file name contains this (repeatable)")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per example (default 120)")
    parser.add_argument("--work-dir", type=Path, help="where to write the repositories and server logs "
                        "(default: a temporary folder)")
    args = parser.parse_args(argv)
    if not args.examples.is_dir():
        parser.error(f"--examples {args.examples} is not a folder")
    with tempfile.TemporaryDirectory(prefix="nvidia-examples-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = run_all(args.examples.resolve(), args.patterns, work, args.timeout)
    print(table(results))
    print(summary(results))
    if args.markdown:
        args.markdown.write_text(table(results, markdown=True) + "\n\n" + summary(results) + "\n")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    if not results:
        print("no example matched", file=sys.stderr)
        return 1
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
