"""A running PodGroup whose minCount is raised and lowered, end to end: gangcheck's webhook
gates the members, the real kube-scheduler (GenericWorkload on) binds them onto kwok nodes.
The nodes come from the simulated cloud (``gangcheck-dev sim-cloud``), which answers in about
a second: the test keeps within its time budget (the real cluster-autoscaler's path for a
PodGroup is test_podgroups.py's).

minCount 2 -> 4 with 2 members added: one request for the 2 added, released together once
their nodes exist, 4 members running, the first 2 never moved; minCount back to 2: nothing the
members use is withdrawn.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from gangcheck.logic.podgroups import growth
from tests.e2e.conftest import GPU_TAINT, Cluster
from tests.e2e.helpers import delete_quietly, eventually, unique
from tests.e2e.test_gangcheck import (
    GPU,
    SIM_CLASS,
    SIM_POOL,
    SimCloud,
    delete_nodes,
    nodes_with,
    our_config,
    running,
    sim_group,
)
from tests.e2e.test_podgroups import (
    CONSUME,
    OPT_IN,
    Hooked,
    create_gated,
    webhook_registered,
)
from tests.e2e.test_podgroups import hooked as hooked  # noqa: PLC0414 (the fixture)
from tests.e2e.test_podgroups import sim as sim  # noqa: PLC0414 (the fixture)

Obj = dict[str, Any]


def member(name: str, *, group: str, pool: str) -> Obj:
    """A whole-node member of the simulated pool."""
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [
                {
                    "name": "train",
                    "image": "trainer:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", GPU: "8"},
                        "limits": {GPU: "8"},
                    },
                }
            ],
            "nodeSelector": {SIM_POOL: pool},
            "tolerations": [GPU_TAINT.toleration()],
            "restartPolicy": "Never",
        },
    }


async def placed(kube: Kube, namespace: str, count: int) -> dict[str, str] | None:
    pods = running((await kube.list_objects(POD, namespace))["items"])
    if len(pods) != count:
        return None
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}


async def set_min_count(kube: Kube, namespace: str, count: int) -> None:
    patch = {"spec": {"schedulingPolicy": {"gang": {"minCount": count}}}}
    await kube.merge_patch(UPSTREAM_POD_GROUP_V1BETA1, "grow", patch, namespace)


@pytest.mark.timeout(180)
async def test_min_count_raised_on_a_running_group_gets_the_added_members_together(
    kube: Kube, namespace: str, cluster: Cluster, hooked: Hooked, sim: SimCloud
) -> None:
    pool = unique("grow")
    sim.configure(sim_group(pool, 4))
    await kube.merge_patch(NAMESPACE, namespace, {"metadata": {"labels": OPT_IN}})
    config = unique("e2e-grow")
    await kube.create(
        ATOMIC_CONFIG,
        {"metadata": {"name": config}, "spec": our_config(klass=SIM_CLASS, deadline=30)},
    )
    group = {
        "metadata": {"name": "grow", "annotations": {"gangcheck.io/provisioning-config": config}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    made = functools.partial(member, group="grow", pool=pool)
    try:
        async with webhook_registered(kube, hooked):
            await kube.create(UPSTREAM_POD_GROUP_V1BETA1, group, namespace)
            began = time.monotonic()
            await create_gated(kube, namespace, ["grow-0", "grow-1"], made, "2 members gated")
            first = await eventually(
                lambda: placed(kube, namespace, 2), timeout=60, interval=0.5, what="2 running"
            )
            at_two = time.monotonic() - began

            await set_min_count(kube, namespace, 4)
            raised = time.monotonic()
            await create_gated(kube, namespace, ["grow-2", "grow-3"], made, "2 more gated")

        async def growth_request() -> Obj | None:
            for req in (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]:
                if growth.GROWS_ANNOTATION in (req["metadata"].get("annotations") or {}):
                    return dict(req)
            return None

        req = await eventually(growth_request, what="the growth's request")
        assert sum(p["count"] for p in req["spec"]["podSets"]) == 2
        four = await eventually(
            lambda: placed(kube, namespace, 4), timeout=60, interval=0.5, what="4 running"
        )
        at_four = time.monotonic() - raised
        for pod, node in first.items():
            assert four[pod] == node  # the running members never moved
        for pod in ("grow-2", "grow-3"):
            got = await kube.get(POD, pod, namespace)
            assert got["metadata"]["annotations"][CONSUME] == req["metadata"]["name"]

        await set_min_count(kube, namespace, 2)
        async with webhook_registered(kube, hooked):  # one more, beyond minCount: a late one
            await create_gated(kube, namespace, ["grow-4"], made, "a fifth gated")

        async def said() -> bool | None:
            obj = await kube.get(UPSTREAM_POD_GROUP_V1BETA1, "grow", namespace)
            text = (obj["metadata"].get("annotations") or {}).get("gangcheck.io/message", "")
            return True if "wait for room" in text else None

        # gangcheck has read the lowered group: the fifth waits as a late member (the pool
        # is full), no request made for it
        await eventually(said, timeout=30, what="the late member's reason on the group")
        # Nothing members use is withdrawn: the growth's request and all 4 nodes stay.
        assert await kube.get(PROVISIONING_REQUEST, req["metadata"]["name"], namespace)
        assert await placed(kube, namespace, 4) == four
        for node in four.values():
            assert not (await kube.get(NODE, node))["spec"].get("unschedulable")
        cluster.record(
            f"growth. PodGroup on the sim, whole-node members: 2 running after {at_two:.1f}s; "
            f"minCount 2 -> 4, 4 running {at_four:.1f}s later (one request for the 2 added)"
        )
    finally:
        for i in range(5):
            await delete_quietly(kube, POD, f"grow-{i}", namespace)
        await delete_quietly(kube, UPSTREAM_POD_GROUP_V1BETA1, "grow", namespace)
        await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))
        await delete_quietly(kube, ATOMIC_CONFIG, config)
