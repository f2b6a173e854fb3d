"""Host streams keep CUDA's stream/event semantics with worker threads."""

from __future__ import annotations

import threading
import time

import pytest

from helpers import wait_until
from streamrt.device import HostEvent, HostStream, InlineStream
from streamrt.errors import PipelineClosedError, PipelineError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def streams():
    made: list[HostStream] = []

    def make(name: str) -> HostStream:
        made.append(HostStream(name))
        return made[-1]

    yield make
    for stream in made:
        stream.close(cancel=True, timeout=5)


def test_work_runs_in_launch_order_on_the_worker_thread(streams) -> None:
    stream = streams("s")
    seen: list[tuple[int, str]] = []
    for i in range(50):
        stream.launch(lambda i=i: seen.append((i, threading.current_thread().name)))
    stream.synchronize()
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {stream.thread_name}
    assert stream.handle == 0 and not stream.is_cuda


def test_wait_orders_work_across_streams(streams) -> None:
    copy, compute = streams("copy"), streams("compute")
    log: list[str] = []
    copy.launch(lambda: (time.sleep(0.05), log.append("copied")))
    compute.wait(copy.record())
    compute.launch(lambda: log.append("computed"))
    compute.synchronize()
    assert log == ["copied", "computed"]


def test_unrecorded_event_is_complete_and_record_snapshots_generation(streams) -> None:
    event = HostEvent()
    assert event.query() and event.wait(0)
    stream = streams("s")
    gate = threading.Event()
    stream.launch(lambda: gate.wait(10))
    stream.record(event)
    assert not event.query()
    assert not event.wait(timeout=0.05)  # the stream is blocked behind the gate
    gate.set()
    assert event.wait(timeout=5)
    assert event.timestamp is not None


def test_wait_uses_the_record_current_at_call_time(streams) -> None:
    producer, consumer = streams("producer"), streams("consumer")
    event = producer.record()
    producer.synchronize()
    gate = threading.Event()
    producer.launch(lambda: gate.wait(10))
    consumer.wait(event)  # the earlier, completed record: must not wait for the gate
    ran = threading.Event()
    consumer.launch(ran.set)
    assert ran.wait(5)
    producer.record(event)  # re-record behind the gate
    consumer.wait(event)
    after = threading.Event()
    consumer.launch(after.set)
    assert not after.wait(0.1)
    gate.set()
    assert after.wait(5)


def test_errors_surface_at_synchronize_and_later_work_still_runs(streams) -> None:
    stream = streams("s")
    ran: list[int] = []
    stream.launch(lambda: 1 / 0)
    stream.launch(lambda: ran.append(1))
    with pytest.raises(PipelineError, match="ZeroDivisionError"):
        stream.synchronize()
    assert ran == [1]
    stream.synchronize()  # the error is reported once


def test_close_drains_by_default_and_rejects_new_work(streams) -> None:
    stream = streams("s")
    ran: list[int] = []
    for i in range(5):
        stream.launch(lambda i=i: (time.sleep(0.01), ran.append(i)))
    assert stream.close(timeout=5)
    assert ran == list(range(5))
    with pytest.raises(PipelineClosedError):
        stream.launch(lambda: None)


def test_close_cancel_skips_queued_work_but_fires_events(streams) -> None:
    stream = streams("s")
    gate = threading.Event()
    ran: list[int] = []
    stream.launch(lambda: gate.wait(10))
    stream.launch(lambda: ran.append(1))
    event = stream.record()
    closer = threading.Thread(target=lambda: stream.close(cancel=True, timeout=5))
    closer.start()
    wait_until(lambda: stream._cancel.is_set(), "close(cancel=True) to take effect")
    gate.set()
    closer.join(5)
    assert ran == [] and event.query()


def test_close_cancel_unblocks_a_worker_waiting_for_a_host_event(streams) -> None:
    blocked = streams("blocked")
    never = HostEvent()
    never.arm()  # recorded "somewhere" that never runs
    blocked.wait(never)
    start = time.perf_counter()
    assert blocked.close(cancel=True, timeout=5)
    assert time.perf_counter() - start < 2


def test_close_reports_a_stuck_callable(streams) -> None:
    stream = streams("s")
    gate = threading.Event()
    stream.launch(lambda: gate.wait(10))
    assert stream.close(timeout=0.1) is False
    gate.set()


def test_inline_stream_runs_in_the_caller_and_blocks_on_waits(streams) -> None:
    inline = InlineStream("inline")
    worker = streams("worker")
    caller = threading.current_thread().name
    seen: list[str] = []
    inline.launch(lambda: seen.append(threading.current_thread().name))
    assert seen == [caller]
    assert inline.record().query()
    worker.launch(lambda: time.sleep(0.05))
    inline.wait(worker.record())  # blocks here, like a host sync
    inline.launch(lambda: seen.append("after"))
    assert seen[-1] == "after"
    with pytest.raises(ZeroDivisionError):
        inline.launch(lambda: 1 / 0)


def test_elapsed_ms_needs_timing_events(streams) -> None:
    stream = streams("s")
    start = stream.record(stream.new_event(timing=True))
    stream.launch(lambda: time.sleep(0.02))
    end = stream.record(stream.new_event(timing=True))
    end.synchronize()
    assert start.elapsed_ms(end) >= 15
    with pytest.raises(PipelineError, match="timing"):
        stream.record().elapsed_ms(end)
