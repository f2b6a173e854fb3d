"""The engine process's side of the front-end workers: spawn, serve their tensors, restart, stop.

:class:`FrontendSupervisor` is what :class:`~streamrt.serve.server.InferenceServer` opens instead
of its own HTTP and gRPC listeners when ``ServerConfig.frontend_processes`` > 1:

1. it reserves the public HTTP and gRPC ports (a socket bound with ``SO_REUSEPORT``, never
   listening, held until shutdown: port 0 resolves to one number that every worker and every
   restarted worker binds; the kernel spreads connections over the workers' listening sockets);
2. it serves the core's own HTTP and gRPC handlers on two private Unix sockets (the control
   plane: workers forward every call except inference there, unchanged);
3. it starts N workers (:mod:`.worker`), each with a socket pair (the tensor channel) and an arena
   (:mod:`.arena`), and runs each INFER message through ``core.infer`` with the inputs viewed in
   the arena, writing the outputs back into it;
4. a worker that exits is logged and replaced (new arena, new channel); its in-flight requests
   finish in the engine process and their replies are dropped (its clients saw their connections
   close); the old arena goes once they are done;
5. ``stop`` (called after the core drained its in-flight requests and unloaded the models) sends
   STOP to every worker, waits for them (then SIGTERM, then SIGKILL), and releases everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamrt
from streamrt.errors import ConfigError, StreamRTError
from streamrt.serve.listeners.frontends import channel
from streamrt.serve.listeners.frontends.arena import Arena
from streamrt.serve.listeners.frontends.channel import FrameReader, FrameWriter
from streamrt.serve.listeners.frontends.tensors import pack_outputs, unpack_request
from streamrt.serve.port import close_each

if TYPE_CHECKING:
    from streamrt.serve.core import ServerCore

__all__ = ["FrontendSupervisor"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
"""How long a worker may take to import, bind its ports and say HELLO."""


@dataclass(eq=False)
class _Worker:
    index: int
    process: asyncio.subprocess.Process
    arena: Arena
    writer: FrameWriter
    hello: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    reading: asyncio.Task[None] | None = None
    started: float = field(default_factory=time.monotonic)
    retired: bool = False  # failed to start: its exit is not restarted again by its own watcher


class FrontendSupervisor:
    """N front-end worker processes over one :class:`ServerCore`.

    Attributes:
        http_port, grpc_port: the public ports (None when that front end is off).
        workers: the running workers by index.
    """

    worker_command: tuple[str, ...] = (sys.executable, "-m", "streamrt.serve.listeners.frontends.worker")
    """How a worker starts (it reads its spec, pickled, from stdin); benchmarks/engine_request_path.py
    starts a load driver in its place to measure the engine process alone."""

    def __init__(self, core: ServerCore, count: int, arena_bytes: int) -> None:
        self.core, self.count, self.arena_bytes = core, count, arena_bytes
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.workers: dict[int, _Worker] = {}
        self.restarts = 0
        self._reserved: list[socket.socket] = []
        self._closers: list[Any] = []
        self._watchers: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._dir = Path(tempfile.mkdtemp(prefix="streamrt-frontends-"))

    # --- start ----------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.core.config
        try:
            if cfg.http_port is not None:
                self.http_port = self._reserve(cfg.host, cfg.http_port, "--http-port")
            if cfg.grpc_port is not None:
                self.grpc_port = self._reserve(cfg.host, cfg.grpc_port, "--grpc-port")
            await self._open_control_plane()
            await asyncio.gather(*(self._spawn(i) for i in range(self.count)))
        except BaseException:
            await self.stop()
            raise
        log.info("%d front-end processes serving http %s, grpc %s (pids %s)", self.count, self.http_port,
                 self.grpc_port, ", ".join(str(w.process.pid) for w in self.workers.values()))

    def _reserve(self, host: str, port: int, flag: str) -> int:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"port {port} on {host} is already in use ({exc.strerror})",
                              hint=f"{flag} N with a free port, or {flag} 0 to pick any") from None
        self._reserved.append(sock)
        return int(sock.getsockname()[1])

    async def _open_control_plane(self) -> None:
        """The core's own HTTP app and gRPC service on private Unix sockets (what workers forward to)."""
        if self.http_port is not None:
            from aiohttp import web

            from streamrt.serve.listeners.http import build_app

            runner = web.AppRunner(build_app(self.core), access_log=None, handle_signals=False)
            await runner.setup()
            await web.UnixSite(runner, str(self._dir / "http.sock")).start()
            self._closers.append(runner.cleanup)
        if self.grpc_port is not None:
            from streamrt.serve.listeners.grpc_service import bind_grpc, grpc_server, service_handler

            server = grpc_server(2**31 - 1)
            server.add_generic_rpc_handlers((service_handler(self.core),))
            if bind_grpc(server, f"unix:{self._dir / 'grpc.sock'}") == 0:
                raise StreamRTError(f"cannot bind the private gRPC socket in {self._dir}")
            await server.start()
            self._closers.append(lambda: server.stop(grace=1.0))

    async def _spawn(self, index: int) -> None:
        arena = Arena.create(self.arena_bytes, f"streamrt-frontend-{index}")
        arena.offer_inputs()  # CUDA instances copy request tensors from it to the device directly
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            spec = {
                "index": index, "config": self.core.config, "http_port": self.http_port, "grpc_port": self.grpc_port,
                "http_socket": str(self._dir / "http.sock"), "grpc_socket": str(self._dir / "grpc.sock"),
                "channel_fd": theirs.fileno(), "arena_fd": arena.fd, "arena_bytes": self.arena_bytes,
                "log_level": logging.getLogger("streamrt").getEffectiveLevel(),
                "cpus": None if self.core.frontend_cpus is None else sorted(self.core.frontend_cpus),
            }
            source = str(Path(streamrt.__file__).resolve().parents[1])  # the same streamrt in the worker
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
            process = await asyncio.create_subprocess_exec(
                *self.worker_command, stdin=asyncio.subprocess.PIPE,
                pass_fds=(theirs.fileno(), arena.fd), env=env)
        except BaseException:
            arena.close()
            ours.close()
            raise
        finally:
            theirs.close()
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(spec))
        await process.stdin.drain()
        process.stdin.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        worker = _Worker(index, process, arena, FrameWriter(writer))
        worker.reading = asyncio.get_running_loop().create_task(self._serve_worker(worker, reader))
        self.workers[index] = worker
        watcher = asyncio.get_running_loop().create_task(self._watch(worker))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        hello = asyncio.ensure_future(worker.hello.wait())
        done, _ = await asyncio.wait({hello, worker.reading}, timeout=START_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if hello not in done:
            hello.cancel()
            worker.retired = True
            if process.returncode is None:
                process.kill()
            what = "exited before it was ready" if worker.reading in done else \
                f"did not start within {START_TIMEOUT_S:.0f} s"
            raise StreamRTError(f"front-end worker {index} (pid {process.pid}) {what}",
                                hint="see its log lines above (frontend[N]); a port in use?")

    # --- serve ----------------------------------------------------------------------------------

    async def _serve_worker(self, worker: _Worker, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        frames = FrameReader(reader)
        while (messages := await frames.read()) is not None:
            for message in messages:
                kind = message[0]
                if kind == channel.INFER:
                    task = loop.create_task(self._infer(worker, message))
                    worker.tasks.add(task)
                    task.add_done_callback(worker.tasks.discard)
                elif kind == channel.FREE:
                    for offset in message[1]:
                        worker.arena.outputs.free(offset)
                elif kind == channel.HELLO:
                    worker.hello.set()
        if worker.tasks:  # the worker is gone: the engine may still read its arena until these finish
            await asyncio.gather(*worker.tasks, return_exceptions=True)
        worker.writer.close()
        worker.arena.close()

    async def _infer(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        rid = message[1]
        taken: list[int] = []
        try:
            request = unpack_request(message, worker.arena, self.core.shared_memory)
            response = await self.core.infer(request)
            outputs, in_memory = pack_outputs(response, worker.arena, taken)
            reply: tuple[Any, ...] = (channel.OK, rid, response.model, response.version, response.id, outputs,
                                      in_memory)
        except Exception as exc:
            for offset in taken:
                worker.arena.outputs.free(offset)
            taken = []
            reply = channel.error_message(rid, exc)
        if worker.writer.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            worker.writer.send(reply)

    async def _watch(self, worker: _Worker) -> None:
        code = await worker.process.wait()
        if self._stopping or worker.retired:
            return
        log.error("front-end worker %d (pid %d) exited with status %s; its in-flight requests fail, "
                  "starting a new one", worker.index, worker.process.pid, code)
        self.restarts += 1
        delay = 1.0 if time.monotonic() - worker.started < 5.0 else 0.0  # a worker that dies at start: slow down
        while not self._stopping:
            await asyncio.sleep(delay)
            try:
                await self._spawn(worker.index)
                return
            except Exception as exc:
                log.error("restarting front-end worker %d failed: %s", worker.index, exc)
                delay = min(max(delay * 2, 1.0), 10.0)

    # --- stop -----------------------------------------------------------------------------------

    async def stop(self, timeout: float = 10.0) -> None:
        """STOP every worker (SIGTERM, then SIGKILL after ``timeout``), close the control plane, release."""
        self._stopping = True
        for watcher in list(self._watchers):  # no restart may race the stop
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        workers = list(self.workers.values())
        for worker in workers:
            if not worker.writer.is_closing():
                worker.writer.send((channel.STOP,))
        for worker in workers:
            await self._end(worker, timeout)
        for worker in workers:
            if worker.reading is not None:
                await asyncio.gather(worker.reading, return_exceptions=True)
        self.workers.clear()
        await close_each(self._closers, "the front-end control plane")
        for sock in self._reserved:
            sock.close()
        self._reserved.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    @staticmethod
    async def _end(worker: _Worker, timeout: float) -> None:
        process = worker.process
        for step in (None, process.terminate, process.kill):
            if process.returncode is not None:
                return
            if step is not None:
                try:
                    step()
                except ProcessLookupError:
                    return
            try:
                await asyncio.wait_for(process.wait(), timeout if step is None else 5.0)
                return
            except asyncio.TimeoutError:
                log.warning("front-end worker %d (pid %d) did not stop; %s", worker.index, process.pid,
                            "terminating it" if step is None else "killing it")
