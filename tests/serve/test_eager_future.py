"""``eager_future``: a batch's answers resume their waiting requests inside the completion, before anything else
queued on the loop; every other case behaves as asyncio's own futures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from streamrt.serve.scheduling.eager import EAGER, eager_future

pytestmark = pytest.mark.skipif(not EAGER, reason="this Python's asyncio has no pure-Python Future to extend")


def _run(loop_kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_result_set_from_a_callback_resumes_the_waiter_at_once(loop_kind: str) -> None:
    """The order a completion sees: the waiting task has run (and its answer gone out) before set_result returns,
    ahead of a callback that was queued first. A loop's own future would resume it after both."""
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        future = eager_future(loop)

        async def request() -> None:
            value = await future
            order.append(f"answered {value}")

        task = loop.create_task(request())
        await asyncio.sleep(0)  # the task waits on the future

        def complete() -> None:
            loop.call_soon(order.append, "queued before the answer")
            future.set_result(7)
            order.append("completion returned")

        loop.call_soon(complete)
        await task
        await asyncio.sleep(0)

    _run(loop_kind, main)
    assert order == ["answered 7", "completion returned", "queued before the answer"]


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_inside_a_task_on_cancel_and_on_error_it_is_asyncios_future(loop_kind: str) -> None:
    results: list[Any] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def waiter(future: asyncio.Future[Any]) -> None:
            try:
                results.append(await future)
            except BaseException as exc:
                results.append(type(exc).__name__)

        for action in ("result in a task", "cancel", "error"):
            future = eager_future(loop)
            task = loop.create_task(waiter(future))
            await asyncio.sleep(0)
            if action == "result in a task":  # a task may not run another task's step: scheduled instead
                future.set_result(action)
                assert results[-1:] != [action]
            elif action == "cancel":
                future.cancel()
            else:
                future.set_exception(ValueError("failed batch"))
            await task
        assert results == ["result in a task", "CancelledError", "ValueError"]

    _run(loop_kind, main)


def test_a_failing_done_callback_reaches_the_loops_handler_and_the_rest_still_run() -> None:
    seen: list[Any] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: seen.append(context["exception"]))
        future = eager_future(loop)

        def broken(_: Any) -> None:
            raise RuntimeError("a bad callback")

        future.add_done_callback(broken)
        future.add_done_callback(lambda f: seen.append(f.result()))
        done = loop.create_future()

        def complete() -> None:
            future.set_result("ok")  # returns normally: the completion goes on with the batch's other requests
            done.set_result(None)

        loop.call_soon(complete)
        await done

    asyncio.run(main())
    assert [type(x).__name__ if isinstance(x, Exception) else x for x in seen] == ["RuntimeError", "ok"]
