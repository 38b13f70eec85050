"""A keyed work queue: one key is never in flight twice, bursts coalesce, failures back off.

Level-triggered reconcilers put keys here; workers take a key, reconcile it, and either finish,
ask to be called again after a delay, or fail (then the key is retried with per-key
exponential backoff, reset on success).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of the queue: nothing, or to be called again after some seconds."""

    requeue_after: float | None = None


Reconcile = Callable[[str], Awaitable[Result]]


def soonest(*delays: float | None) -> float | None:
    """The shortest of the delays asked for (seconds), or None when none is."""
    asked = [d for d in delays if d is not None]
    return min(asked) if asked else None


@dataclass
class WorkQueue:
    """Keys waiting to be reconciled, with delays, per-key backoff and no double processing.

    A key made ready wakes one idle worker, not all of them: with many workers, waking each on
    every add cost more than the reconciles it led to."""

    base_backoff: float = 0.5
    max_backoff: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _ready: deque[str] = field(default_factory=deque)
    _queued: set[str] = field(default_factory=set)
    _active: set[str] = field(default_factory=set)
    _dirty: set[str] = field(default_factory=set)
    _delayed: list[tuple[float, str]] = field(default_factory=list)
    _failures: dict[str, int] = field(default_factory=dict)
    _idle: deque[asyncio.Future[None]] = field(default_factory=deque)
    _timekeeper: asyncio.Future[None] | None = None

    def add(self, key: str, *, after: float = 0.0) -> None:
        """Ask for key to be reconciled, now or after some seconds (the earliest ask wins)."""
        if after > 0:
            soonest = self._delayed[0][0] if self._delayed else None
            heapq.heappush(self._delayed, (self.clock() + after, key))
            if soonest is None or self._delayed[0][0] < soonest:
                self._wake_timekeeper()  # it waits until the soonest delay: now an earlier one
        elif key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._wake_one()

    def __len__(self) -> int:
        return len(self._queued) + len(self._delayed)

    @property
    def ready(self) -> int:
        """Keys ready to be reconciled and not yet taken by a worker (not those delayed)."""
        return len(self._queued)

    @property
    def in_flight(self) -> int:
        return len(self._active)

    async def get(self) -> str:
        """Wait for the next key that is ready and not in flight."""
        loop = asyncio.get_running_loop()
        while True:
            self._promote_due()
            if self._ready:
                key = self._ready.popleft()
                self._queued.discard(key)
                self._active.add(key)
                if self._ready:
                    self._wake_one()  # more ready than this worker takes: pass it on
                return key
            waiter: asyncio.Future[None] = loop.create_future()
            timeout = None
            if self._delayed and self._timekeeper is None:
                # one idle worker keeps time for the delayed keys; the others wait for a wake
                self._timekeeper = waiter
                timeout = self._delayed[0][0] - self.clock()
            self._idle.append(waiter)
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can hold a cancelled
                # worker until the timeout ends (seen as a controller taking minutes to stop).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the wake goes to another
                raise
            finally:
                if not waiter.done():
                    waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._idle.remove(waiter)
                if self._timekeeper is waiter:
                    self._timekeeper = None
                    if self._delayed:
                        self._wake_one()  # another idle worker takes the clock over

    def _wake_timekeeper(self) -> None:
        keeper = self._timekeeper
        if keeper is not None and not keeper.done():
            keeper.set_result(None)
        elif keeper is None:
            self._wake_one()

    def _wake_one(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def done(self, key: str, *, failed: bool = False, requeue_after: float | None = None) -> None:
        """Finish a key: clear or bump its backoff, and take it again if it changed meanwhile."""
        self._active.discard(key)
        if failed:
            self._failures[key] = self._failures.get(key, 0) + 1
            self.add(key, after=self.backoff(key))
        else:
            self._failures.pop(key, None)
            if requeue_after is not None:
                self.add(key, after=requeue_after)
        if key in self._dirty:
            self._dirty.discard(key)
            if not failed:
                self.add(key)

    def backoff(self, key: str) -> float:
        n = self._failures.get(key, 0)
        return float(min(self.base_backoff * 2 ** max(n - 1, 0), self.max_backoff))

    def _promote_due(self) -> None:
        now = self.clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, key = heapq.heappop(self._delayed)
            self.add(key)


async def run_workers(queue: WorkQueue, reconcile: Reconcile, *, workers: int = 4) -> None:
    """Run reconcile over queued keys with this many workers, until cancelled."""
    async with asyncio.TaskGroup() as tg:
        for _ in range(workers):
            tg.create_task(_worker(queue, reconcile))


async def _worker(queue: WorkQueue, reconcile: Reconcile) -> None:
    while True:
        key = await queue.get()
        try:
            result = await reconcile(key)
        except asyncio.CancelledError:
            queue.done(key)
            raise
        except Exception as e:
            log.warning("reconcile of %s failed, backing off: %s", key, e, exc_info=True)
            queue.done(key, failed=True)
        else:
            queue.done(key, requeue_after=result.requeue_after)
