"""capacitySourcePolicy Race for a PodGroup, end to end (issue 32): the simulated cloud (it
creates real Node objects) with a slow pool (one node at once, the rest a minute later) and a
fast one (the whole gang in about 3 s), the members gated by the webhook, both pools asked at
once; the members run on the fast pool, consuming its request, the slow pool's early node is
reclaimed and its request withdrawn, and the group records the winner. A module of its own:
gangcheck runs here with its webhook (`hooked`), and only one gangcheck may run at a time."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    EVENT,
    NAMESPACE,
    POD,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from tests.e2e.conftest import Cluster
from tests.e2e.helpers import delete_quietly, eventually, unique
from tests.e2e.test_capacity_sources import race
from tests.e2e.test_gangcheck import (  # noqa: F401 (fixtures)
    SIM_POOL,
    SimCloud,
    delete_nodes,
    nodes_with,
    running,
    sim,
    sim_group,
    workdir,
)
from tests.e2e.test_podgroups import (  # noqa: F401 (fixtures)
    OPT_IN,
    Hooked,
    create_gated,
    hooked,
    webhook_registered,
)
from tests.e2e.test_topology_asks import member

Obj = dict[str, Any]


@pytest.mark.timeout(300)
async def test_the_fast_source_wins_the_podgroup_and_the_slow_ones_arrivals_are_reclaimed(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    hooked: Hooked,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    """The same race for a PodGroup (issue 32): its members gated by the webhook, both pools
    asked at once, the members released onto the fast pool's request, the slow pool's early
    node reclaimed and its request withdrawn, the group recording the winner."""
    count = 2
    slow, fast = unique("slow"), unique("fast")
    sim.configure(
        sim_group(slow, 4),
        {"name": f"slow-{slow}", "match": {"name": ".*-1"}, "nodeDelaySeconds": [0, 60]},
    )
    sim.configure(
        sim_group(fast, 4),
        {"name": f"fast-{fast}", "match": {"name": ".*-1-s1"}, "nodeDelaySeconds": 3},
    )
    await kube.merge_patch(NAMESPACE, namespace, {"metadata": {"labels": OPT_IN}})
    config = unique("e2e-race")
    await kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": race(slow, fast)})
    group = {
        "metadata": {"name": "ring", "annotations": {"gangcheck.io/provisioning-config": config}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": count}}},
    }

    def unpooled(name: str) -> Obj:
        pod = member(name, pool="")
        del pod["spec"]["nodeSelector"][SIM_POOL]  # the sources pin it
        return pod

    try:
        async with webhook_registered(kube, hooked):
            await kube.create(UPSTREAM_POD_GROUP_V1BETA1, group, namespace)
            began = time.monotonic()
            names = [f"ring-{i}" for i in range(count)]
            await create_gated(kube, namespace, names, functools.partial(unpooled), "members gated")

        async def all_running() -> list[Obj] | None:
            pods = running((await kube.list_objects(POD, namespace))["items"])
            return pods if len(pods) == count else None

        pods = await eventually(all_running, timeout=120, interval=0.5, what="members Running")
        started_after = time.monotonic() - began
        on_fast = {n["metadata"]["name"] for n in await nodes_with(kube, f"{SIM_POOL}={fast}")}
        assert {p["spec"]["nodeName"] for p in pods} <= on_fast, (pods, on_fast)
        consumed = {
            p["metadata"]["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"]
            for p in pods
        }
        assert consumed == {"ring-pg-1-s1"}, consumed

        async def slow_gone() -> bool:
            return await nodes_with(kube, f"{SIM_POOL}={slow}") == []

        await eventually(slow_gone, timeout=60, what="the slow pool's arrivals reclaimed")

        async def loser_withdrawn() -> bool:
            # withdrawn after its arrivals are reclaimed: a moment after the nodes are gone
            listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
            return {r["metadata"]["name"] for r in listing["items"]} == {"ring-pg-1-s1"}

        await eventually(loser_withdrawn, timeout=30, what="only the winner's request left")

        async def recorded() -> Obj | None:
            # the group's record of the release and its winner is written once the members
            # are released (before the loser is withdrawn), so it is read as it settles
            obj = await kube.get(UPSTREAM_POD_GROUP_V1BETA1, "ring", namespace)
            notes = obj["metadata"].get("annotations") or {}
            return obj if notes.get("gangcheck.io/race-won-by") == "fast" else None

        obj = await eventually(recorded, timeout=30, what="the group recording the winner")
        notes = obj["metadata"]["annotations"]
        assert notes.get("gangcheck.io/state") == "Released", obj["metadata"]
        assert notes.get("gangcheck.io/request") == "ring-pg-1-s1", obj["metadata"]

        async def said(reason: str) -> list[str] | None:
            items = (await kube.list_objects(EVENT, namespace))["items"]
            found = [e["message"] for e in items if e.get("reason") == reason]
            return found or None

        (won,) = await eventually(
            functools.partial(said, "CapacityRaceWon"), timeout=20, what="CapacityRaceWon"
        )
        assert "'fast'" in won, won
        reclaiming = await eventually(
            functools.partial(said, "ReclaimingArrivals"), timeout=20, what="ReclaimingArrivals"
        )
        assert any(slow in m for m in reclaiming), reclaiming
        cluster.record(
            f"i. capacity sources Race for a PodGroup, sim cloud, {count} x 8 GPUs, the same "
            f"slow and fast pools: released after {started_after:.1f}s onto the fast pool's "
            f"request; the slow pool's arrival reclaimed, 0 nodes left there; {won}"
        )
    finally:
        for i in range(count):
            await delete_quietly(kube, POD, f"ring-{i}", namespace)
        await delete_quietly(kube, UPSTREAM_POD_GROUP_V1BETA1, "ring", namespace)
        for pool in (slow, fast):
            await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))
        await delete_quietly(kube, ATOMIC_CONFIG, config)
