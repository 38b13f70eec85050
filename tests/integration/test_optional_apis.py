"""A cluster without Kueue or DRA: their caches are empty and synced, the rest runs."""

from __future__ import annotations

import asyncio

from gangcheck.kube.client import Kube
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import NODE, Resource
from tests.waiting import cancelled

NOT_SERVED = Resource("nothing.gangcheck.io", "v1", "things", "Thing")


async def test_an_optional_resource_that_is_not_served_is_an_empty_synced_cache(
    kube: Kube,
) -> None:
    absent = Informer(kube, NOT_SERVED, optional=True, absent_retry=0.2)
    required = Informer(kube, NOT_SERVED, retry_delay=0.2)
    nodes = Informer(kube, NODE)
    tasks = [asyncio.create_task(i.run()) for i in (absent, required, nodes)]
    try:
        await asyncio.wait_for(absent.synced.wait(), 10)
        await asyncio.wait_for(nodes.synced.wait(), 10)
        assert not absent.served and len(absent.store) == 0
        assert nodes.served
        await asyncio.sleep(1.0)  # a required one keeps relisting and never claims to be synced
        assert not required.synced.is_set()
        assert not tasks[0].done() and not tasks[1].done()  # both look again later
    finally:
        await cancelled(*tasks)
