"""One holder at a time per key: a lock per key, kept only while someone holds or waits on it
(so none outlives its event loop, and the table does not grow with every key ever seen)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Turns(Generic[K]):
    def __init__(self) -> None:
        self._locks: dict[K, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """How many keys are held or waited on now."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def of(self, key: K) -> AsyncIterator[None]:
        """The turn of ``key``: entered once every earlier holder of it has left."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users > 1:
                self._locks[key] = (lock, users - 1)
            else:
                del self._locks[key]
