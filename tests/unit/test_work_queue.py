"""The keyed work queue: dedup, no double processing, backoff, requeue-after, concurrency."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gangcheck.runtime.queue import Result, WorkQueue, run_workers
from tests.waiting import cancelled


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ready(queue: WorkQueue) -> list[str]:
    """The keys get() would hand out now, without waiting."""
    queue._promote_due()
    return list(queue._ready)


async def take(queue: WorkQueue) -> str:
    return await asyncio.wait_for(queue.get(), 1)


async def test_a_key_added_twice_while_waiting_is_handed_out_once() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert [await take(queue), await take(queue)] == ["a", "b"]
    assert len(queue) == 0


async def test_a_key_in_flight_is_not_handed_out_again_until_done() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert await take(queue) == "a"
    queue.add("a")
    assert ready(queue) == []
    queue.done("a")
    assert await take(queue) == "a"


async def test_a_key_that_changed_in_flight_is_taken_again_once_after_done() -> None:
    queue = WorkQueue()
    queue.add("a")
    await take(queue)
    queue.add("a")
    queue.add("a")
    queue.done("a")
    assert ready(queue) == ["a"]


@pytest.mark.parametrize(
    ("failures", "backoff"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (8, 60.0)],
    ids=[
        "the first failure waits the base backoff",
        "the second failure waits twice as long",
        "the third failure waits four times as long",
        "many failures wait no longer than the cap",
    ],
)
async def test_a_failed_key_backs_off_exponentially(failures: int, backoff: float) -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add("a")
    for _ in range(failures):
        clock.now += 1000  # long past any backoff
        assert await take(queue) == "a"
        queue.done("a", failed=True)
    assert queue.backoff("a") == backoff
    clock.now += backoff - 0.01
    assert ready(queue) == []
    clock.now += 0.02
    assert ready(queue) == ["a"]


async def test_a_success_resets_the_backoff() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add("a")
    for failed in (True, True, True, False, True):
        clock.now += 1000
        assert await take(queue) == "a"
        queue.done("a", failed=failed)
        if not failed:
            queue.add("a")
    assert queue.backoff("a") == 0.5  # one failure since the success, not four


async def test_a_key_that_asks_to_be_called_again_comes_back_after_that_delay() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add("a")
    await take(queue)
    queue.done("a", requeue_after=5)
    clock.now += 4.9
    assert ready(queue) == []
    clock.now += 0.2
    assert ready(queue) == ["a"]


async def test_of_two_delayed_asks_the_earliest_wins() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add("a", after=10)
    queue.add("a", after=1)
    clock.now += 1.5
    assert ready(queue) == ["a"]


async def test_a_failure_does_not_swallow_a_change_made_meanwhile() -> None:
    """The key is retried after its backoff (not at once), and not lost."""
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add("a")
    await take(queue)
    queue.add("a")
    queue.done("a", failed=True)
    assert ready(queue) == []
    clock.now += queue.backoff("a") + 0.01
    assert ready(queue) == ["a"]


async def test_get_waits_for_a_delayed_key() -> None:
    queue = WorkQueue()
    queue.add("a", after=0.05)
    assert await asyncio.wait_for(queue.get(), 2) == "a"


async def run_for(
    queue: WorkQueue, reconcile: object, *, until: asyncio.Event, workers: int
) -> None:
    task = asyncio.create_task(run_workers(queue, reconcile, workers=workers))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(until.wait(), 5)
    finally:
        await cancelled(task)


async def test_workers_reconcile_different_keys_at_once_and_one_key_never_twice() -> None:
    queue = WorkQueue()
    running: set[str] = set()
    overlap: list[set[str]] = []
    seen: list[str] = []
    finished = asyncio.Event()

    async def reconcile(key: str) -> Result:
        assert key not in running
        if key == "a" and "a" not in seen:
            queue.add("a")  # changed while in flight
        running.add(key)
        overlap.append(set(running))
        await asyncio.sleep(0.02)
        seen.append(key)
        running.discard(key)
        if len(seen) == 4:
            finished.set()
        return Result()

    for key in ("a", "b", "c"):
        queue.add(key)
    await run_for(queue, reconcile, until=finished, workers=3)
    assert max(len(o) for o in overlap) == 3
    assert sorted(seen) == ["a", "a", "b", "c"]


async def test_a_reconcile_that_raises_is_retried_after_its_backoff() -> None:
    queue = WorkQueue(base_backoff=0.01)
    calls: list[str] = []
    finished = asyncio.Event()

    async def reconcile(key: str) -> Result:
        calls.append(key)
        if len(calls) < 3:
            raise RuntimeError("the API server said no")
        finished.set()
        return Result()

    queue.add("a")
    await run_for(queue, reconcile, until=finished, workers=2)
    assert calls == ["a", "a", "a"]
    assert queue.backoff("a") == 0.01  # reset by the success


async def test_a_reconcile_asking_to_be_called_again_is_called_again() -> None:
    queue = WorkQueue()
    calls: list[str] = []
    finished = asyncio.Event()

    async def reconcile(key: str) -> Result:
        calls.append(key)
        if len(calls) == 2:
            finished.set()
            return Result()
        return Result(requeue_after=0.01)

    queue.add("a")
    await run_for(queue, reconcile, until=finished, workers=1)
    assert calls == ["a", "a"]


async def test_a_key_made_ready_wakes_one_idle_worker_not_all() -> None:
    queue = WorkQueue()
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)
    assert len(queue._idle) == 3
    queue.add("a")
    for _ in range(5):
        await asyncio.sleep(0)
    finished = [t for t in getters if t.done()]
    assert [t.result() for t in finished] == ["a"]
    assert len(queue._idle) == 2  # the other two were never woken
    queue.add("b")
    queue.add("c")
    await asyncio.wait_for(asyncio.gather(*getters), 1)
    assert sorted(t.result() for t in getters) == ["a", "b", "c"]


async def test_a_delayed_key_reaches_one_of_many_idle_workers_when_due() -> None:
    queue = WorkQueue()
    getters = [asyncio.create_task(queue.get()) for _ in range(4)]
    await asyncio.sleep(0)
    queue.add("late", after=60)
    queue.add("soon", after=0.05)  # earlier than the one time is kept for: the keeper wakes
    done, pending = await asyncio.wait(getters, timeout=2, return_when=asyncio.FIRST_COMPLETED)
    assert [t.result() for t in done] == ["soon"]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    assert not queue._idle and queue._timekeeper is None


async def test_a_woken_worker_cancelled_passes_its_wake_on() -> None:
    queue = WorkQueue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.add("a")  # wakes the first
    first.cancel()
    assert await asyncio.wait_for(second, 1) == "a"
    with contextlib.suppress(asyncio.CancelledError):
        await first
