"""Writes whose order does not matter, side by side."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

WRITES_AT_ONCE = 16
"""The most writes in flight at once where their order does not matter: the nodes a gang
claims and the members a PodGroup releases (a gang of 64 nodes is Ready after a few round
trips, not 64 in a row), the gangs one pass of the dispatcher nominates."""


async def at_once(
    writes: Iterable[Callable[[], Awaitable[None]]], limit: int = WRITES_AT_ONCE
) -> list[BaseException | None]:
    """Run `writes` side by side, at most `limit` in flight, each to its end whatever the
    others meet (none is cut off mid-flight: its answer would be lost); what each raised, in
    order, None for those that succeeded."""
    gate = asyncio.Semaphore(limit)

    async def one(write: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await write()

    answers = await asyncio.gather(*(one(w) for w in writes), return_exceptions=True)
    return [a if isinstance(a, BaseException) else None for a in answers]
