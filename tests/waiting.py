"""Waiting in tests for what a task running beside the test does (an informer, a
controller's loop) or a cluster does: polled, with a bound, the durable outcome named in the
failure; and for such a task's end, once the test is done with it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def until(done: Callable[[], bool], what: str, *, timeout: float = 10.0) -> None:
    """Return once `done()` is true; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, interval: float
) -> T:
    """Poll `probe` (a read of the cluster) every `interval` seconds until it answers something
    truthy, returned; AssertionError naming `what` and the last answer after `timeout` seconds.
    The integration harness and the end-to-end helpers each give it their defaults."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


async def cancelled(*tasks: asyncio.Task[Any]) -> None:
    """Cancel `tasks` and return once each has ended: nothing left running after the test.
    A task's CancelledError is what was asked for; any other error it ended with is raised
    (a task that failed on its own fails the test)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


class PassesEnded(Exception):
    """Raised by `Passes` at its last pass: ends the loop it is the sleep of."""


class Passes:
    """A loop's sleep (a provisioner's ``sleep``): records each wait it is asked for, and ends
    the loop (`PassesEnded`) at the `passes`-th. It waits `fraction` of each (none by default:
    a fake API server needs no time; a real one's informers take some)."""

    def __init__(self, passes: int, *, fraction: float = 0.0) -> None:
        self.left = passes
        self.fraction = fraction
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.left -= 1
        if not self.left:
            raise PassesEnded
        if self.fraction:
            await asyncio.sleep(seconds * self.fraction)
