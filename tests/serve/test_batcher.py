"""The dynamic batcher's rules, driven with an explicit clock (no threads, no sleeps)."""

from __future__ import annotations

import pytest

from streamrt.errors import QueueFullError, RequestError
from streamrt.serve.configs.config import BatchingConfig, QueuePolicy
from streamrt.serve.scheduling.batcher import BatchQueue, Pending


def item(rows: int = 1, key: str = "a", at: float = 0.0, tag: str = "") -> Pending:
    return Pending(tag or f"{key}{rows}", rows=rows, key=key, enqueued=at)


def tags(batch: list[Pending] | None) -> list[str]:
    return [p.payload for p in batch or []]


def test_without_batching_every_request_runs_alone() -> None:
    q = BatchQueue(8, None)
    for i in range(3):
        q.push(item(tag=str(i)))
    assert [tags(q.next_batch(0.0)[0]) for _ in range(3)] == [["0"], ["1"], ["2"]]
    assert q.next_batch(0.0) == (None, None)


def test_full_batch_runs_at_once_and_the_rest_waits_for_the_delay() -> None:
    q = BatchQueue(4, BatchingConfig(max_queue_delay_microseconds=1000))
    for i in range(5):
        q.push(item(tag=str(i), at=0.0001 * i))
    batch, _ = q.next_batch(0.0005)
    assert tags(batch) == ["0", "1", "2", "3"]
    assert q.next_batch(0.0005) == (None, pytest.approx(0.0004 + 0.001))
    assert tags(q.next_batch(0.0015)[0]) == ["4"]


def test_delay_counts_from_the_oldest_request() -> None:
    q = BatchQueue(8, BatchingConfig(max_queue_delay_microseconds=2000))
    q.push(item(tag="old", at=1.0))
    q.push(item(tag="new", at=1.0019))
    assert q.next_batch(1.0019)[0] is None
    assert tags(q.next_batch(1.002)[0]) == ["old", "new"]


def test_zero_delay_runs_what_is_there() -> None:
    q = BatchQueue(8, BatchingConfig())
    q.push(item(2))
    q.push(item(3))
    assert [p.rows for p in q.next_batch(0.0)[0] or []] == [2, 3]


def test_preferred_size_runs_without_waiting() -> None:
    q = BatchQueue(8, BatchingConfig(max_queue_delay_microseconds=10**6, preferred_batch_size=(2, 4)))
    for i in range(5):
        q.push(item(tag=str(i)))
    assert tags(q.next_batch(0.0)[0]) == ["0", "1", "2", "3"]  # the largest preferred size
    assert q.next_batch(0.0)[0] is None  # 1 left: not preferred, waits


def test_rows_never_exceed_max_batch_size_and_order_is_kept() -> None:
    q = BatchQueue(8, BatchingConfig())
    for rows in (3, 3, 3):
        q.push(item(rows, tag=f"r{len(q)}"))
    assert tags(q.next_batch(0.0)[0]) == ["r0", "r1"]
    assert tags(q.next_batch(0.0)[0]) == ["r2"]


def test_only_compatible_shapes_share_a_batch() -> None:
    q = BatchQueue(8, BatchingConfig())
    q.push(item(key="a", tag="a1"))
    q.push(item(key="b", tag="b1"))
    q.push(item(key="a", tag="a2"))
    assert tags(q.next_batch(0.0)[0]) == ["a1", "a2"]
    assert tags(q.next_batch(0.0)[0]) == ["b1"]


def test_priority_levels_and_default_level() -> None:
    q = BatchQueue(1, BatchingConfig(priority_levels=3, default_priority_level=2))
    q.push(item(tag="default"), priority=0)
    q.push(item(tag="low"), priority=3)
    q.push(item(tag="high"), priority=1)
    assert [tags(q.next_batch(0.0)[0]) for _ in range(3)] == [["high"], ["default"], ["low"]]
    with pytest.raises(RequestError, match="priority 4 is out of range"):
        q.push(item(), priority=4)


def test_queue_size_limit_rejects_at_once() -> None:
    q = BatchQueue(4, BatchingConfig(default_queue_policy=QueuePolicy(max_queue_size=2)))
    q.push(item())
    q.push(item())
    with pytest.raises(QueueFullError, match="maximum of 2 requests"):
        q.push(item())
    assert len(q) == 2


def test_timeouts_default_and_override() -> None:
    policy = QueuePolicy(default_timeout_microseconds=1000, allow_timeout_override=True)
    q = BatchQueue(4, BatchingConfig(max_queue_delay_microseconds=10**6, default_queue_policy=policy))
    q.push(item(tag="default", at=0.0))
    q.push(item(tag="short", at=0.0), timeout_us=100)
    assert q.next_deadline() == pytest.approx(0.0001)
    assert tags(q.expire(0.0002)) == ["short"]
    assert tags(q.expire(0.0011)) == ["default"]
    assert len(q) == 0
    strict = BatchQueue(4, BatchingConfig(default_queue_policy=QueuePolicy(default_timeout_microseconds=1000)))
    strict.push(item(at=0.0), timeout_us=10)  # override not allowed: the default applies
    assert strict.next_deadline() == pytest.approx(0.001)


def test_dead_requests_are_dropped_silently() -> None:
    dead = {"gone"}
    q = BatchQueue(4, BatchingConfig(), is_dead=lambda p: p.payload in dead)
    q.push(item(tag="gone"))
    q.push(item(tag="live"))
    assert q.expire(0.0) == []
    assert tags(q.next_batch(0.0)[0]) == ["live"]
    assert tags(q.drain()) == []


def test_waiting_until_skips_only_passes_that_would_decide_nothing() -> None:
    """``waiting_until``: the delay's end for the oldest request while nothing can run or expire; None
    (a full pass) once the delay passed, the rows reach the maximum, or a preferred size or a
    request deadline could change the decision."""
    q = BatchQueue(4, BatchingConfig(max_queue_delay_microseconds=1000))
    assert q.waiting_until(0.0) is None  # empty
    q.push(item(at=1.0))
    q.push(item(at=1.0004))
    assert q.waiting_until(1.0005) == pytest.approx(1.001)
    assert q.next_batch(1.0005) == (None, pytest.approx(1.001))  # what a full pass decides
    assert q.waiting_until(1.001) is None
    q.push(item(2, at=1.0006))  # 4 rows: a full batch runs now
    assert q.waiting_until(1.0007) is None and len(q.next_batch(1.0007)[0] or []) == 3

    preferred = BatchQueue(8, BatchingConfig(max_queue_delay_microseconds=1000, preferred_batch_size=(2,)))
    preferred.push(item(at=0.0))
    assert preferred.waiting_until(0.0) is None
    timed = BatchQueue(8, BatchingConfig(max_queue_delay_microseconds=1000,
                                         default_queue_policy=QueuePolicy(default_timeout_microseconds=500)))
    timed.push(item(at=0.0))
    assert timed.waiting_until(0.0) is None
    assert BatchQueue(8, BatchingConfig()).waiting_until(0.0) is None  # no delay: nothing waits
