"""Members packed onto shared NodeClaims, on real Karpenter (v1.15, kwok provider).

f. eight 1-GPU members of one Kueue gang, in a NodePool that may launch an 8-GPU machine and a
   cheaper CPU one and declares both (``gangcheck.io/instance-types``): one NodeClaim asking for
   the eight members' sum, naming only the 8-GPU machine (the kwok provider launches the
   cheapest type a claim names), one node, and all eight pods Running on it;
g. a gang whose 16-GPU member no declared machine takes: every attempt fails at once naming the
   pool and the member, no claim made, Retry, then Rejected.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gangcheck_dev.testbed.karpenter import CPU_4X, GPU_8X, NodePool

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import JOB, NODE_CLAIM, NODE_POOL, PROVISIONING_REQUEST
from gangcheck.logic.sources.karpenter import names
from tests.e2e.conftest import GPU_TAINT, Cluster
from tests.e2e.helpers import delete_quietly, eventually, is_true, unique
from tests.e2e.karpenter.test_karpenter import (
    GPU,
    GPU_TYPE,
    POOL_LABEL,
    both_rolled_back,
    claims_of_pool,
    flavor_labels,
    karpenter_config,
    nodes_of_pool,
)
from tests.e2e.test_gangcheck import (
    Timeline,
    check_state,
    deactivated,
    gang_job,
    gpu_queue,
    job_pods,
    running,
    until,
    workload_of,
)
from tests.e2e.test_podgroups import Hooked

Obj = dict[str, Any]
#: What one node of each type offers to pods: the type's resources less the kwok provider's
#: kube-reserved overhead (100m CPU, 10Mi memory).
DECLARED = {
    GPU_8X.name: {GPU: "8", "cpu": "31900m", "memory": "262134Mi", "pods": "110"},
    CPU_4X.name: {"cpu": "3900m", "memory": "16374Mi", "pods": "110"},
}


@pytest.fixture
async def declaring_pool(kube: Kube) -> AsyncIterator[Obj]:
    """A NodePool that may launch the 8-GPU and the CPU machine, declaring both."""
    name = unique("karp-pack")
    body = NodePool(
        name,
        instance_types=(GPU_8X.name, CPU_4X.name),
        labels={GPU_TYPE: "karpenter", POOL_LABEL: name},
        taints=(GPU_TAINT,),
    ).to_dict()
    body["metadata"]["annotations"] = {names.INSTANCE_TYPES: json.dumps(DECLARED)}
    created = await kube.create(NODE_POOL, body)
    try:
        yield created
    finally:
        await delete_quietly(kube, NODE_POOL, name)

        async def all_gone() -> bool:
            return not await claims_of_pool(kube, name) and not await nodes_of_pool(kube, name)

        await eventually(all_gone, timeout=90, what=f"every claim and node of {name} gone")


def one_gpu_gang(name: str, count: int, labels: dict[str, str], *, gpus: int = 1) -> Obj:
    """A gang of ``count`` members of ``gpus`` GPUs each on the nodes of the pool's ``labels``."""
    return gang_job(name, count, gpus, node_selector=labels)


@pytest.mark.timeout(300)
async def test_eight_one_gpu_members_share_one_eight_gpu_claim_and_all_run(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    declaring_pool: Obj,
) -> None:
    count, pool = 8, declaring_pool["metadata"]["name"]
    labels = flavor_labels(declaring_pool)
    timeline = Timeline()
    async with gpu_queue(kube, namespace, labels, ours=karpenter_config(pool, deadline=120)) as q:
        began = time.monotonic()
        job = await kube.create(JOB, one_gpu_gang("gang", count, labels), namespace)
        try:

            async def all_running() -> list[Obj] | None:
                workload = await workload_of(kube, namespace, job)
                timeline.see(check_state(workload, q.check))
                pods = running(await job_pods(kube, namespace, "gang"))
                return pods if len(pods) == count else None

            pods = await until(all_running, timeout=200, what="gang Running", timeline=timeline)
            started_after = time.monotonic() - began
            (request,) = (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]
            assert is_true(request, "Provisioned")
            accepted = next(c for c in request["status"]["conditions"] if c["type"] == "Accepted")
            assert accepted["message"] == f"created 1 NodeClaims for 8 members in NodePool {pool!r}"
            # One claim for the whole gang: the eight members' sum, the 8-GPU machine only.
            (claim,) = await claims_of_pool(kube, pool)
            assert claim["spec"]["resources"]["requests"] == {GPU: "8", "cpu": "8", "memory": "8Gi"}
            instance = names.INSTANCE_TYPE_LABEL
            wanted = [r for r in claim["spec"]["requirements"] if r["key"] == instance]
            assert wanted == [{"key": instance, "operator": "In", "values": [GPU_8X.name]}]
            assert claim["metadata"]["annotations"][names.CLAIM_MEMBERS] == "8"
            (node,) = await nodes_of_pool(kube, pool)
            assert node["metadata"]["labels"][instance] == GPU_8X.name
            assert node["metadata"]["name"] == claim["status"]["nodeName"]
            assert {p["spec"]["nodeName"] for p in pods} == {node["metadata"]["name"]}
            cluster.record(
                f"f. Karpenter, {count} pods x 1 GPU: all Running after {started_after:.1f}s "
                f"on 1 NodeClaim ({GPU_8X.name}) of {pool}; check states: "
                f"{' | '.join(timeline.states)}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            for made in await claims_of_pool(kube, pool):
                await delete_quietly(kube, NODE_CLAIM, made["metadata"]["name"])


@pytest.mark.timeout(300)
async def test_a_member_no_declared_machine_takes_fails_every_attempt_at_once(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    declaring_pool: Obj,
) -> None:
    pool = declaring_pool["metadata"]["name"]
    labels = flavor_labels(declaring_pool)
    timeline = Timeline()
    config = karpenter_config(pool, deadline=10, backoff_limit=1)
    async with gpu_queue(kube, namespace, labels, ours=config) as q:
        began = time.monotonic()
        job = await kube.create(JOB, one_gpu_gang("gang", 2, labels, gpus=16), namespace)
        try:
            workload = await deactivated(
                kube, namespace, job, q.check, timeout=120, timeline=timeline
            )
            rejected_after = time.monotonic() - began
            record = await both_rolled_back(kube, workload, q.check)
            assert record.went_to("Retry") and record.went_to("Rejected"), record
            why = (
                f"NodePool {pool!r}: no instance type it may launch can take member 0 of "
                "PodTemplate"
            )
            assert all(why in m and f"{GPU}=16)" in m for m in record.rolled_back), record
            assert await claims_of_pool(kube, pool) == []
            assert await nodes_of_pool(kube, pool) == []
            cluster.record(
                f"g. Karpenter, 2 pods x 16 GPUs, machines of 8 declared: Rejected after "
                f"{rejected_after:.1f}s, no NodeClaim made; rollbacks {record.rolled_back}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
