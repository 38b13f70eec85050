"""Waiting in unit tests for what a task running beside the test does (an informer, a
controller's loop): polled, with a bound, the durable outcome named in the failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(done: Callable[[], bool], what: str, *, timeout: float = 10.0) -> None:
    """Return once `done()` is true; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")
