"""Asks scoped to one topology domain, end to end: a PodGroup whose members must sit in one
rack (and a Kueue Job whose pod template says so with gangcheck's own annotation), two racks
of the simulated cloud (it creates real Node objects; the real cluster-autoscaler's node
groups carry no rack label here), one node already in each. Rack 2 has room for a member now
and rack 1 none, so gangcheck asks inside rack 2 only; the sim delivers there, the members are
released pinned to rack 2, and no node comes up in rack 1. The sim stands in because the test
bed's cluster-autoscaler node groups are not racked."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
from gangcheck_dev.testbed.nodes import kwok_node

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    JOB,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from tests.e2e.conftest import GPU_TAINT, Cluster
from tests.e2e.helpers import delete_quietly, eventually, node_ready, unique
from tests.e2e.test_gangcheck import (  # noqa: F401 (fixtures)
    GPU,
    GPU_TYPE,
    SIM_CLASS,
    SIM_POOL,
    SimCloud,
    controller,
    delete_nodes,
    gang_job,
    gpu_queue,
    job_pods,
    job_running,
    nodes_with,
    running,
    sim,
    sim_group,
    workdir,
    workload_of,
)
from tests.e2e.test_podgroups import (  # noqa: F401 (fixtures)
    OPT_IN,
    Hooked,
    create_gated,
    hooked,
    webhook_registered,
)

Obj = dict[str, Any]
RACK = "gangcheck.io/e2e-rack"


def racked_group(pool: str, rack: str, max_nodes: int) -> Obj:
    group = sim_group(f"{pool}-{rack}", max_nodes)
    group["labels"] = {**group["labels"], SIM_POOL: pool, RACK: rack}
    return group


async def two_racks(kube: Kube, sim: SimCloud, pool: str) -> dict[str, str]:  # noqa: F811
    """Racks r1 and r2 of the sim's `pool` (room for 4 nodes each), one node already in each:
    r1's cordoned (no room), r2's can take one member now (waited for until Ready). Returns
    the pool's node labels."""
    sim.configure(racked_group(pool, "r1", 4))
    sim.configure(racked_group(pool, "r2", 4))
    labels = {GPU_TYPE: "e2e", SIM_POOL: pool}
    full = kwok_node(f"{pool}-r1-x", gpus=8, labels={**labels, RACK: "r1"}, taints=[GPU_TAINT])
    full["spec"]["unschedulable"] = True
    await kube.create(NODE, full)
    roomy = f"{pool}-r2-x"
    await kube.create(
        NODE, kwok_node(roomy, gpus=8, labels={**labels, RACK: "r2"}, taints=[GPU_TAINT])
    )

    async def usable() -> bool:
        # Ready and without the not-ready taint of its registration: until then r2 shows no
        # room and the racks rank by name, r1 first (seen once in a full run: the Job was
        # admitted and asked for before kwok had made r2's node Ready)
        node = await kube.get(NODE, roomy)
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        return node_ready(node) and "node.kubernetes.io/not-ready" not in taints

    await eventually(usable, timeout=30, interval=0.2, what=f"{roomy} Ready and untainted")
    return labels


async def asked_and_run_in_rack_2(
    kube: Kube, namespace: str, pool: str, pods: list[Obj]
) -> dict[str, str]:
    """The gang's pods all on r2's nodes, no node in r1 but the one there before, and its one
    request asked inside r2. Returns the request's annotations."""
    racks = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(RACK)
        for n in await nodes_with(kube, f"{SIM_POOL}={pool}")
    }
    assert {racks[p["spec"]["nodeName"]] for p in pods} == {"r2"}, (pods, racks)
    assert [n for n, r in racks.items() if r == "r1"] == [f"{pool}-r1-x"], racks
    (request,) = (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]
    notes: dict[str, str] = request["metadata"]["annotations"]
    assert notes["gangcheck.io/topology-domain"] == f"{RACK}=r2", notes
    return notes


def member(name: str, pool: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": "ring"},
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
            "nodeSelector": {GPU_TYPE: "e2e", SIM_POOL: pool},
            "tolerations": [GPU_TAINT.toleration()],
            "restartPolicy": "Never",
        },
    }


@pytest.mark.timeout(300)
async def test_a_gang_bound_to_one_rack_is_asked_for_in_the_rack_with_room_only(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    hooked: Hooked,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    count = 3
    pool = unique("rack")
    await two_racks(kube, sim, pool)
    await kube.merge_patch(NAMESPACE, namespace, {"metadata": {"labels": OPT_IN}})
    config = unique("e2e-rack")
    spec = {
        "provisioningClassName": SIM_CLASS,
        "allowCustomProvisioningClass": True,
        "fulfillment": {"deadlineSeconds": 60, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 1, "backoffMaxSeconds": 2},
    }
    await kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    group = {
        "metadata": {"name": "ring", "annotations": {"gangcheck.io/provisioning-config": config}},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": count}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
        },
    }
    try:
        async with webhook_registered(kube, hooked):
            await kube.create(UPSTREAM_POD_GROUP_V1BETA1, group, namespace)
            began = time.monotonic()

            names = [f"ring-{i}" for i in range(count)]
            made = functools.partial(member, pool=pool)
            await create_gated(kube, namespace, names, made, "members gated by the webhook")

        async def all_running() -> list[Obj] | None:
            pods = running((await kube.list_objects(POD, namespace))["items"])
            return pods if len(pods) == count else None

        pods = await eventually(all_running, timeout=120, interval=0.5, what="members Running")
        started_after = time.monotonic() - began
        notes = await asked_and_run_in_rack_2(kube, namespace, pool, pods)
        cluster.record(
            f"h. PodGroup of {count} x 8 GPUs bound to one rack, sim cloud with racks r1 (no "
            f"room) and r2 (room for 1): asked in {notes['gangcheck.io/topology-domain']} only, "
            f"Running after {started_after:.1f}s, all in r2, "
            "nodes in r1: 1 (the one there before)"
        )
    finally:
        for i in range(count):
            await delete_quietly(kube, POD, f"ring-{i}", namespace)
        await delete_quietly(kube, UPSTREAM_POD_GROUP_V1BETA1, "ring", namespace)
        await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))
        await delete_quietly(kube, ATOMIC_CONFIG, config)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("controller")
async def test_a_kueue_job_bound_to_one_rack_by_gangchecks_annotation_is_asked_for_in_that_rack(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    sim: SimCloud,  # noqa: F811
) -> None:
    """Kueue v0.17 refuses its own podset-required-topology on a flavor without its
    topology-aware scheduling; gangcheck's form of it on the Job's pod template passes Kueue
    untouched: the ask goes to the rack with room only, the Job's pods are pinned there by the
    check's podSetUpdates, and no node comes up in the other rack."""
    count = 3
    pool = unique("jrack")
    labels = await two_racks(kube, sim, pool)
    spec = {
        "provisioningClassName": SIM_CLASS,
        "allowCustomProvisioningClass": True,
        "managedResources": [GPU],
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 60, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 1, "backoffMaxSeconds": 2},
    }
    job = gang_job("racked", count, 8, {SIM_POOL: pool})
    job["spec"]["template"]["metadata"] = {
        "annotations": {"gangcheck.io/podset-required-topology": RACK}
    }
    async with gpu_queue(kube, namespace, labels, ours=spec):
        began = time.monotonic()
        created = await kube.create(JOB, job, namespace)
        try:
            pods = await job_running(kube, namespace, "racked", count)
            started_after = time.monotonic() - began
            notes = await asked_and_run_in_rack_2(kube, namespace, pool, pods)
            assert all(p["spec"]["nodeSelector"].get(RACK) == "r2" for p in pods), pods
            workload = await workload_of(kube, namespace, created)
            assert workload is not None and workload["status"].get("admission"), workload
            cluster.record(
                f"h2. Kueue Job of {count} x 8 GPUs, gangcheck's podset-required-topology (a "
                f"flavor without Kueue's topology-aware scheduling), racks r1 (no room) and r2: "
                f"asked in {notes['gangcheck.io/topology-domain']} only, Running after "
                f"{started_after:.1f}s, all in r2, nodes in r1: 1 (the one there before)"
            )
        finally:
            await delete_quietly(kube, JOB, "racked", namespace)
            await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))
