"""Scheduler wake-ups: on time below a millisecond on asyncio's loop and on uvloop, through the loop's
timerfd (Linux) and through the timer thread (elsewhere), cancellable, and a batching delay under 1 ms
waited without spinning the scheduler or waking it for every request that joins the batch."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrt.serve.scheduling import batcher as batcher_module
from streamrt.serve.scheduling import timers
from streamrt.serve.scheduling.timers import wake_at

LOOPS = ["asyncio", "uvloop"]
SOURCES = ["timerfd", "thread"]


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where short wake-ups come from: the loop's timerfd (the timer thread refuses work), or the timer
    thread (as on a system without timerfd)."""
    if request.param == "timerfd":
        if not sys.platform.startswith("linux"):
            pytest.skip("timerfd is Linux's")

        def no_thread(*_: Any) -> None:
            raise AssertionError("a short wake-up went to the timer thread although the loop has a timerfd")

        monkeypatch.setattr(timers._TIMERS, "add", no_thread)
    else:
        monkeypatch.setattr(timers, "_loop_timer", lambda loop: None)
    return str(request.param)


def _run(kind: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(main())
    return asyncio.run(main())


@pytest.mark.parametrize("kind", LOOPS)
def test_wake_ups_come_at_their_time_and_not_before(kind: str, source: str) -> None:
    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, float]] = []
        for delay in (0.0, 0.0002, 0.0005, 0.0009, 0.002, 0.0035, -0.001):
            when = time.monotonic() + delay
            fired = asyncio.Event()
            wake_at(loop, when, lambda w=when, f=fired: (seen.append((w, time.monotonic())), f.set()))
            await asyncio.wait_for(fired.wait(), 5)
        return seen

    for when, at in _run(kind, main):
        assert at >= when
        assert at - when < 0.05  # generous for a loaded CI machine; typically < 0.2 ms below 1 ms


@pytest.mark.parametrize("kind", LOOPS)
def test_a_cancelled_wake_up_never_runs(kind: str, source: str) -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        for delay in (0.0, 0.0003, 0.003):
            wake_at(loop, time.monotonic() + delay, lambda d=delay: ran.append(f"cancelled {d}")).cancel()
        kept = asyncio.Event()
        wake_at(loop, time.monotonic() + 0.006, kept.set)
        await asyncio.wait_for(kept.wait(), 5)
        await asyncio.sleep(0.01)
        return ran

    assert _run(kind, main) == []


def _counted(monkeypatch: pytest.MonkeyPatch, owner: type, method: str) -> list[int]:
    """Count the calls of ``owner.method`` (in the one-element list returned)."""
    calls = [0]
    original = getattr(owner, method)

    def counted(self: Any, *args: Any) -> Any:
        calls[0] += 1
        return original(self, *args)

    monkeypatch.setattr(owner, method, counted)
    return calls


def _batches(kind: str, repo_dir: Path, clients: int, requests: int, reset: Callable[[], None],
             stagger: bool = False) -> int:
    """Serve the null model (one instance, max batch 64, 500 us delay) on ``kind``'s loop; call ``reset`` once
    it is warm, run ``clients`` clients of ``requests`` requests each (``stagger``: client i waits i loop
    iterations before each request, so arrivals spread over iterations as requests off sockets do); the
    batches run after ``reset``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from serving_frontend import write_repository
    from streamrt.serve.configs.config import ServerConfig
    from streamrt.serve.core import ServerCore
    from streamrt.serve.wire.protocol import InferRequest

    repo = write_repository(repo_dir / "repo", instances=1, delay_us=500)

    async def main() -> int:
        core = ServerCore(repo, ServerConfig(http_port=None, grpc_port=None, startup_models=["null_small"]))
        await core.start(wait_ready=True)
        x = np.random.default_rng(0).standard_normal((1, 16), dtype=np.float32)

        def executions() -> int:
            return int(core.statistics("null_small")["model_stats"][0]["execution_count"])

        async def client(index: int) -> None:
            for _ in range(requests):
                for _ in range(index if stagger else 0):
                    await asyncio.sleep(0)
                await core.infer(InferRequest("null_small", inputs={"x": x}))

        reset()
        before = executions()
        await asyncio.gather(*(client(i) for i in range(clients)))
        batches = executions() - before
        await core.stop()
        return batches

    return int(_run(kind, main))


@pytest.mark.parametrize("kind", LOOPS)
def test_a_sub_millisecond_batching_delay_does_not_spin_the_scheduler(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 clients, max batch 64, 500 us delay: every batch waits out the delay. The scheduler looks
    at the queue a few times per batch (an arrival, the wake-up, a completion), not once per loop
    iteration until the delay has passed (16 times per batch on uvloop before wake_at)."""
    calls = _counted(monkeypatch, batcher_module.BatchQueue, "next_batch")
    batches = _batches(kind, tmp_path, clients=4, requests=50, reset=lambda: calls.__setitem__(0, 0))
    assert calls[0] <= 5 * batches, (calls[0], batches)


@pytest.mark.parametrize("kind", LOOPS)
def test_requests_joining_a_waiting_batch_do_not_wake_the_scheduler(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 clients, one instance, max batch 64, 500 us delay: the scheduler passes once for the batch's first
    request, once when the delay ends and once per completion, not once per arriving request (which
    was ~10 passes per batch of ~8, each walking the queue)."""
    from streamrt.serve.scheduling import scheduler as scheduler_module

    passes = _counted(monkeypatch, scheduler_module.ModelScheduler, "_step")
    batches = _batches(kind, tmp_path, clients=8, requests=40, reset=lambda: passes.__setitem__(0, 0), stagger=True)
    assert batches <= 320 / 3, f"{batches} batches for 320 requests: the requests did not batch"
    assert passes[0] <= 4 * batches, (passes[0], batches)


def test_the_loop_yields_its_core_once_per_batch_handed_to_an_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a batch goes to an instance thread the loop yields (sched_yield) so the batch starts at once:
    once per batch, not per request."""
    from streamrt.serve.scheduling import loop as loop_module

    yields = [0]
    monkeypatch.setattr(loop_module, "_SCHED_YIELD", lambda: yields.__setitem__(0, yields[0] + 1))
    batches = _batches("asyncio", tmp_path, clients=12, requests=1, reset=lambda: yields.__setitem__(0, 0))
    assert yields[0] == batches and batches < 12, (yields[0], batches)


def test_a_forked_child_gets_its_own_timer_thread() -> None:
    """The timer thread does not survive a fork: the child starts its own on first use."""
    import multiprocessing

    async def short_wake() -> float:
        loop = asyncio.get_running_loop()
        fired = asyncio.Event()
        when = time.monotonic() + 0.0004
        wake_at(loop, when, fired.set)
        await asyncio.wait_for(fired.wait(), 5)
        return time.monotonic() - when

    assert asyncio.run(short_wake()) >= 0  # the parent's timer thread is running now

    def child(out: Any) -> None:
        out.put(asyncio.run(short_wake()))

    context = multiprocessing.get_context("fork")
    out = context.Queue()
    process = context.Process(target=child, args=(out,))
    process.start()
    late = out.get(timeout=20)
    process.join(20)
    assert process.exitcode == 0 and 0 <= late < 1.0
