"""gangcheck on real Karpenter (v1.15, kwok provider), with the real kube-scheduler and Kueue.

gangcheck runs as its own process with its ServiceAccount's rights (base + ``karpenter`` +
``reclaim-nodeclaim``). Each test makes its own NodePool (a label of its own, so that no other
test's nodes match) and removes it, with every NodeClaim and node, afterwards.

a. a 4 x 8-GPU gang through Kueue: one NodeClaim per member, all Initialized; check Ready,
   every pod Running on the new nodes; once started, the nodes are neither held nor protected;
b. the NodePool's limits leave room for 3 of the 4 nodes: no claim is made (the gang cannot be
   whole), the attempt fails, Retry, then Rejected past ``backoffLimitCount``; no node left;
e. two gangs of 3 x 8 GPUs submitted together to a pool limited to 32 GPUs: one gang's claims
   are made, the other's attempts fail naming the limit while the first holds the room, and it
   gets the room once the first is done and its claims are given back; the pool's live claims
   never ask for more than 32 GPUs;
b'. claims Karpenter cannot launch (insufficient capacity: it deletes them) are a partial
   delivery: rolled back, Retry, Rejected; b''. capacity that comes but never fits is rolled
   back at the deadline, every claim withdrawn, no node left;
c. a PodGroup gang gated by the webhook, its config naming the Karpenter backend: released
   together once its NodeClaims arrived, every member Running on them;
d. consolidation (``WhenEmpty``, after 0 s) does not take the held, empty nodes while the
   gang starts: every claim made for the attempt is still there, uncordoned, when it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gangcheck_dev.testbed.karpenter import GPU_8X, NodePool

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    JOB,
    NAMESPACE,
    NODE,
    NODE_CLAIM,
    NODE_POOL,
    POD,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from gangcheck.logic.sources.karpenter import names
from tests.e2e.conftest import GPU_TAINT, Cluster
from tests.e2e.helpers import (
    condition,
    delete_quietly,
    eventually,
    is_true,
    node_ready,
    unique,
)
from tests.e2e.test_gangcheck import (
    AttemptRecord,
    Timeline,
    attempt_record,
    check_state,
    deactivated,
    gpu_queue,
    job_pods,
    running,
    until,
    workload_of,
)
from tests.e2e.test_gangcheck import (
    gang_job as e2e_gang_job,
)
from tests.e2e.test_podgroups import GATE, OPT_IN, Hooked, gated, webhook_registered
from tests.waiting import cancelled

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
GPU_TYPE = "gangcheck.io/gpu-type"
POOL_LABEL = "gangcheck.io/karpenter-e2e-pool"
HOLD_TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gangcheck-held-for"


def karpenter_config(pool: str, *, deadline: int, backoff_limit: int = 3) -> Obj:
    return {
        "backend": "Karpenter",
        "karpenter": {"nodePools": [pool]},
        "managedResources": [GPU],
        "retryStrategy": {
            "backoffLimitCount": backoff_limit,
            "backoffBaseSeconds": 1,
            "backoffMaxSeconds": 2,
        },
        "fulfillment": {
            "mode": "NodesFit",
            "deadlineSeconds": deadline,
            "startDeadlineSeconds": 120,
            "reclaimer": "DeleteNodeClaim",
        },
    }


def gang_job(name: str, count: int, labels: dict[str, str], *, cpu: str = "1") -> Obj:
    """A gang of ``count`` 8-GPU members on the nodes of the pool's ``labels``."""
    return e2e_gang_job(name, count, 8, cpu=cpu, node_selector=labels)


async def claims_of_pool(kube: Kube, pool: str) -> list[Obj]:
    listed = await kube.list_objects(NODE_CLAIM, label_selector=f"{names.NODE_POOL_LABEL}={pool}")
    return list(listed["items"])


async def nodes_of_pool(kube: Kube, pool: str) -> list[Obj]:
    listed = await kube.list_objects(NODE, label_selector=f"{names.NODE_POOL_LABEL}={pool}")
    return list(listed["items"])


@pytest.fixture
async def node_pool(kube: Kube, request: pytest.FixtureRequest) -> AsyncIterator[Obj]:
    """A NodePool of 8-GPU kwok machines, tainted like the GPU flavor, labelled uniquely;
    ``request.param``: extra ``NodePool`` fields (limits, consolidation)."""
    extra = dict(getattr(request, "param", {}))
    node_class = extra.pop("node_class", None)
    startup_taints = extra.pop("startup_taints", [])
    name = unique("karp")
    pool = NodePool(
        name,
        instance_types=(GPU_8X.name,),
        labels={GPU_TYPE: "karpenter", POOL_LABEL: name},
        taints=(GPU_TAINT,),
        **extra,
    )
    body = pool.to_dict()
    if node_class is not None:
        body["spec"]["template"]["spec"]["nodeClassRef"]["name"] = node_class
    if startup_taints:
        body["spec"]["template"]["spec"]["startupTaints"] = startup_taints
    created = await kube.create(NODE_POOL, body)
    try:
        yield created
    finally:
        await delete_quietly(kube, NODE_POOL, name)

        async def all_gone() -> bool:
            return not await claims_of_pool(kube, name) and not await nodes_of_pool(kube, name)

        await eventually(all_gone, timeout=90, what=f"every claim and node of {name} gone")


async def both_rolled_back(kube: Kube, workload: Obj, check: str) -> AttemptRecord:
    """The Events of both attempts (the second RolledBack Event may follow the Rejected
    verdict by a moment)."""

    async def recorded() -> AttemptRecord | None:
        record = await attempt_record(kube, workload, check)
        return record if len(record.rolled_back) >= 2 else None

    return await eventually(recorded, timeout=30, what="both attempts' RolledBack Events")


def flavor_labels(pool: Obj) -> dict[str, str]:
    return dict(pool["spec"]["template"]["metadata"]["labels"])


# -- a + d. a gang on new Karpenter capacity, consolidation kept off its held nodes ---------


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "node_pool", [{"consolidation": "WhenEmpty", "consolidate_after": "0s"}], indirect=True
)
async def test_gang_on_karpenter_capacity_runs_on_its_own_new_nodes(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    count, pool = 4, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    timeline = Timeline()
    config = karpenter_config(pool, deadline=120)
    async with gpu_queue(kube, namespace, labels, ours=config) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, labels), namespace)
        try:

            async def all_running() -> list[Obj] | None:
                workload = await workload_of(kube, namespace, job)
                timeline.see(check_state(workload, queue.check))
                pods = running(await job_pods(kube, namespace, "gang"))
                return pods if len(pods) == count else None

            pods = await until(all_running, timeout=200, what="gang Running", timeline=timeline)
            started_after = time.monotonic() - began
            workload = await workload_of(kube, namespace, job)
            assert workload is not None and is_true(workload, "Admitted")
            (request,) = (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]
            key = f"{namespace}/{request['metadata']['name']}"
            assert is_true(request, "Provisioned")
            claims = await claims_of_pool(kube, pool)
            # One claim per member, all made for this attempt, none lost (d: consolidation
            # with consolidateAfter 0 s took none of the empty, held nodes before the start).
            assert len(claims) == count
            assert {c["metadata"]["annotations"][names.REQUESTED_FOR] for c in claims} == {key}
            claimed = {c["status"]["nodeName"] for c in claims}
            assert {p["spec"]["nodeName"] for p in pods} == claimed
            nodes = await nodes_of_pool(kube, pool)
            assert {n["metadata"]["name"] for n in nodes} == claimed
            assert all(node_ready(n) and not n["spec"].get("unschedulable") for n in nodes)

            async def let_go() -> bool:
                nodes = await nodes_of_pool(kube, pool)
                claims = await claims_of_pool(kube, pool)
                return all(not _protected(o) for o in [*nodes, *claims]) and not any(
                    t["key"] == HOLD_TAINT for n in nodes for t in n["spec"].get("taints") or []
                )

            async def initialized() -> bool:
                claims = await claims_of_pool(kube, pool)
                return len(claims) == count and all(is_true(c, "Initialized") for c in claims)

            # Karpenter marks its claims Initialized a moment after the nodes turn Ready.
            await eventually(initialized, timeout=30, what="every claim Initialized")
            # Once the gang started: the hold is lifted and Karpenter may manage the nodes.
            try:
                await eventually(let_go, timeout=30, what="hold and do-not-disrupt removed")
            except AssertionError as exc:
                seen = [
                    (n["metadata"].get("annotations"), n["spec"].get("taints"))
                    for n in await nodes_of_pool(kube, pool)
                ]
                raise AssertionError(f"{exc}\nnodes: {seen}") from None
            cluster.record(
                f"a. Karpenter, {count} pods x 8 GPUs: all Running after {started_after:.1f}s "
                f"on {count} NodeClaims of {pool}; check states: {' | '.join(timeline.states)}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            for claim in await claims_of_pool(kube, pool):
                await delete_quietly(kube, NODE_CLAIM, claim["metadata"]["name"])


def _protected(obj: Obj) -> bool:
    return (obj["metadata"].get("annotations") or {}).get(names.DO_NOT_DISRUPT) == "true"


# -- b. limits that leave room for 3 of 4 ------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_pool", [{"limits": {GPU: "24"}}], indirect=True)
async def test_gang_beyond_the_pools_limits_is_retried_then_rejected_leaving_no_node(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    count, pool = 4, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    timeline = Timeline()
    config = karpenter_config(pool, deadline=10, backoff_limit=1)
    async with gpu_queue(kube, namespace, labels, ours=config) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, labels), namespace)
        try:
            workload = await deactivated(
                kube, namespace, job, queue.check, timeout=120, timeline=timeline
            )
            rejected_after = time.monotonic() - began
            record = await both_rolled_back(kube, workload, queue.check)
            assert record.went_to("Retry") and record.went_to("Rejected"), record
            assert len(record.requests) == 2 and len(record.rolled_back) == 2, record
            why = f"NodePool '{pool}': limits nvidia.com/gpu=24 leave room for 3 of 4 nodes"
            assert all(why in m for m in record.rolled_back), record
            assert await claims_of_pool(kube, pool) == []
            assert await nodes_of_pool(kube, pool) == []
            assert running(await job_pods(kube, namespace, "gang")) == []
            cluster.record(
                f"b. Karpenter, {count} pods x 8 GPUs, NodePool limit 24 GPUs: Rejected after "
                f"{rejected_after:.1f}s, no NodeClaim made; rollbacks {record.rolled_back}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)


# -- e. two gangs submitted together to a limited pool -------------------------------------


def claim_gpus(claims: list[Obj]) -> int:
    """GPUs the live claims (not being deleted) ask for."""
    live = [c for c in claims if not c["metadata"].get("deletionTimestamp")]
    return sum(int(c["spec"]["resources"]["requests"].get(GPU, "0")) for c in live)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("node_pool", [{"limits": {GPU: "32"}}], indirect=True)
async def test_two_gangs_submitted_together_never_take_more_than_the_pools_limit(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    """Room for 4 of the 6 nodes asked: one gang runs on 3 claims (24 GPUs); the other is not
    admitted, its attempts failing with the limit named, until the first is done and gives its
    claims back; then it runs on 3 claims of its own."""
    count, pool = 3, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    timeline = Timeline()
    config = karpenter_config(pool, deadline=60, backoff_limit=40)
    async with gpu_queue(kube, namespace, labels, ours=config) as queue:
        began = time.monotonic()
        jobs = dict(
            zip(
                ("one", "two"),
                await asyncio.gather(
                    *(
                        kube.create(JOB, gang_job(n, count, labels), namespace)
                        for n in ("one", "two")
                    )
                ),
                strict=True,
            )
        )
        try:

            async def one_running() -> str | None:
                for name, job in jobs.items():
                    timeline.see(check_state(await workload_of(kube, namespace, job), queue.check))
                    if len(running(await job_pods(kube, namespace, name))) == count:
                        return name
                return None

            first = await until(one_running, timeout=120, what="a gang Running", timeline=timeline)
            second = "two" if first == "one" else "one"
            first_after = time.monotonic() - began
            held = await claims_of_pool(kube, pool)
            assert claim_gpus(held) <= 32, [c["metadata"]["name"] for c in held]

            async def second_turned_away() -> AttemptRecord | None:
                workload = await workload_of(kube, namespace, jobs[second])
                assert workload is not None and not is_true(workload, "Admitted")
                record = await attempt_record(kube, workload, queue.check)
                return record if record.rolled_back else None

            record = await eventually(
                second_turned_away, timeout=60, what=f"gang {second}'s attempt rolled back"
            )
            why = f"NodePool '{pool}': limits nvidia.com/gpu=32 leave room for 1 of 3 nodes"
            assert all(why in m for m in record.rolled_back), record
            assert claim_gpus(await claims_of_pool(kube, pool)) <= 32
            turned_away = len(record.rolled_back)

            # The first gang is done: its Job goes and its nodes are given back.
            await delete_quietly(kube, JOB, first, namespace)
            for claim in held:
                await delete_quietly(kube, NODE_CLAIM, claim["metadata"]["name"])

            async def second_running() -> list[Obj] | None:
                workload = await workload_of(kube, namespace, jobs[second])
                timeline.see(check_state(workload, queue.check))
                pods = running(await job_pods(kube, namespace, second))
                return pods if len(pods) == count else None

            pods = await until(
                second_running, timeout=180, what=f"gang {second} Running", timeline=timeline
            )
            second_after = time.monotonic() - began
            claims = await claims_of_pool(kube, pool)
            assert claim_gpus(claims) <= 32
            live = [c for c in claims if not c["metadata"].get("deletionTimestamp")]
            assert {p["spec"]["nodeName"] for p in pods} <= {
                c["status"].get("nodeName") for c in live
            }
            cluster.record(
                f"e. two gangs of {count} x 8 GPUs together, NodePool limit 32 GPUs: gang "
                f"{first} Running after {first_after:.1f}s on {len(held)} claims "
                f"({claim_gpus(held)} GPUs); gang {second} turned away {turned_away}+ times "
                f"({record.rolled_back[0]!r}), Running after {second_after:.1f}s on "
                f"{len(live)} claims once the first gave its back"
            )
        finally:
            for name in jobs:
                await delete_quietly(kube, JOB, name, namespace)
            for claim in await claims_of_pool(kube, pool):
                await delete_quietly(kube, NODE_CLAIM, claim["metadata"]["name"])


# -- b'. claims Karpenter cannot launch ------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_pool", [{"node_class": "no-such-class"}], indirect=True)
async def test_claims_karpenter_cannot_launch_are_a_partial_delivery_never_retried_forever(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    """The pool's node class does not exist: Karpenter's launch fails with insufficient
    capacity and it deletes each claim (its kwok provider's stockout)."""
    count, pool = 4, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    timeline = Timeline()
    config = karpenter_config(pool, deadline=30, backoff_limit=1)
    async with gpu_queue(kube, namespace, labels, ours=config) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, labels), namespace)
        try:
            workload = await deactivated(
                kube, namespace, job, queue.check, timeout=150, timeline=timeline
            )
            rejected_after = time.monotonic() - began
            record = await both_rolled_back(kube, workload, queue.check)
            assert record.went_to("Retry") and record.went_to("Rejected"), record
            assert len(record.rolled_back) == 2, record
            assert all("lost (gone before the gang started" in m for m in record.rolled_back), (
                record
            )

            # Withdrawn claims go once Karpenter's termination finalizer lets them: a claim
            # may still be terminating when the Workload is deactivated.
            async def all_gone() -> bool:
                return not await claims_of_pool(kube, pool) and not await nodes_of_pool(kube, pool)

            await eventually(all_gone, timeout=60, what="every claim and node of the pool gone")
            cluster.record(
                f"b'. Karpenter cannot launch (node class missing): Rejected after "
                f"{rejected_after:.1f}s; rollbacks {record.rolled_back}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)


# -- b''. capacity that comes but does not fit: the deadline ------------------------------


@pytest.mark.soak  # two deadlines; the partial arrival below rolls back at one too
@pytest.mark.timeout(300)
async def test_capacity_that_never_fits_is_rolled_back_at_the_deadline_leaving_no_claim(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    """Members ask for 40 CPUs, the pool's only machine has 32: the claims launch, but the
    gang never fits; at the deadline everything asked for is withdrawn or reclaimed."""
    count, pool = 2, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    timeline = Timeline()
    deadline = 15
    config = karpenter_config(pool, deadline=deadline, backoff_limit=1)
    async with gpu_queue(kube, namespace, labels, ours=config) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, labels, cpu="40"), namespace)
        try:
            workload = await deactivated(
                kube, namespace, job, queue.check, timeout=150, timeline=timeline
            )
            rejected_after = time.monotonic() - began
            record = await both_rolled_back(kube, workload, queue.check)
            assert record.went_to("Retry") and record.went_to("Rejected"), record
            assert len(record.rolled_back) == 2, record
            why = f"Deadline: the gang did not fit within {deadline}s"
            assert all(why in m for m in record.rolled_back), record

            async def all_gone() -> bool:
                return not await claims_of_pool(kube, pool) and not await nodes_of_pool(kube, pool)

            await eventually(all_gone, timeout=60, what="every claim and node of the pool gone")
            cluster.record(
                f"b''. Karpenter capacity that never fits ({count} x 40 CPUs on 32-CPU "
                f"machines), deadline {deadline}s: Rejected after {rejected_after:.1f}s; "
                f"rollbacks {record.rolled_back}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)


# -- b'''. a partial arrival: one node never becomes healthy ---------------------------------

DRIVER_TAINT = {"key": "example.com/gpu-driver", "value": "pending", "effect": "NoSchedule"}


async def play_gpu_drivers(kube: Kube, pool: str, broken: str) -> None:
    """As the nodes' GPU driver agent: lift the startup taint of every node of ``pool`` except
    the one of claim index ``broken``, whose GPU never becomes healthy."""
    while True:
        for node in await nodes_of_pool(kube, pool):
            meta, taints = node["metadata"], node["spec"].get("taints") or []
            index = (meta.get("annotations") or {}).get(names.CLAIM_INDEX)
            if index == broken or DRIVER_TAINT not in taints:
                continue
            kept = [t for t in taints if t != DRIVER_TAINT]
            patch = {
                "metadata": {"resourceVersion": meta["resourceVersion"]},
                "spec": {"taints": kept},
            }
            with contextlib.suppress(ApiError):
                await kube.merge_patch(NODE, meta["name"], patch)
        await asyncio.sleep(0.3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_pool", [{"startup_taints": [DRIVER_TAINT]}], indirect=True)
async def test_a_partial_arrival_is_rolled_back_at_the_deadline_and_reclaimed(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    """3 of 4 claims initialize; the 4th node's GPU driver never lifts its startup taint, so
    the gang never fits. At the deadline the nodes recorded as arrived (all 4: the 4th came
    for the gang too) are reclaimed with DeleteNodeClaim; no claim and no node is left. One
    attempt (backoffLimitCount 0): Retry then Rejected on Karpenter is the limits test's."""
    count, pool = 4, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    timeline = Timeline()
    deadline = 20
    config = karpenter_config(pool, deadline=deadline, backoff_limit=0)
    drivers = asyncio.create_task(play_gpu_drivers(kube, pool, str(count - 1)))
    async with gpu_queue(kube, namespace, labels, ours=config) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, labels), namespace)
        try:
            workload = await deactivated(
                kube, namespace, job, queue.check, timeout=200, timeline=timeline
            )
            rejected_after = time.monotonic() - began

            async def rolled_back() -> AttemptRecord | None:
                record = await attempt_record(kube, workload, queue.check)
                return record if record.rolled_back else None

            # The RolledBack Event may follow the Rejected verdict by a moment.
            record = await eventually(rolled_back, timeout=30, what="the RolledBack Event")
            assert record.went_to("Rejected") and not record.went_to("Retry"), record
            (message,) = record.rolled_back
            assert f"Deadline: the gang did not fit within {deadline}s" in message, record
            # Every node that came for the attempt was recorded and reclaimed (DeleteNodeClaim),
            # the one whose GPU never became healthy too.
            assert f"reclaimed {count} nodes" in message, record

            async def all_gone() -> bool:
                return not await claims_of_pool(kube, pool) and not await nodes_of_pool(kube, pool)

            await eventually(all_gone, timeout=90, what="every claim and node of the pool gone")
            assert running(await job_pods(kube, namespace, "gang")) == []
            cluster.record(
                f"b'''. Karpenter, 3 of 4 nodes healthy, deadline {deadline}s: Rejected after "
                f"{rejected_after:.1f}s; rollbacks {record.rolled_back}"
            )
        finally:
            await cancelled(drivers)
            await delete_quietly(kube, JOB, "gang", namespace)


# -- c. a PodGroup gang ---------------------------------------------------------------------


def member(name: str, group: str, labels: dict[str, str]) -> Obj:
    gpus = {GPU: "8"}
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [
                {
                    "name": "train",
                    "image": "trainer:1",
                    "resources": {"requests": {"cpu": "1", **gpus}, "limits": gpus},
                }
            ],
            "nodeSelector": dict(labels),
            "tolerations": [GPU_TAINT.toleration()],
            "restartPolicy": "Never",
        },
    }


async def gated_members(
    kube: Kube, namespace: str, count: int, labels: dict[str, str]
) -> list[Obj] | None:
    """Creates the members; one created before the API server called the new webhook is
    deleted and created again."""
    pods = []
    for i in range(count):
        name = f"ddp-{i}"
        existing = await kube.get_if_exists(POD, name, namespace)
        if existing is not None and gated(existing):
            pods.append(existing)
            continue
        if existing is not None:
            await kube.delete(POD, name, namespace, grace_period_seconds=0)
            return None
        pods.append(await kube.create(POD, member(name, "ddp", labels), namespace))
    return pods if all(map(gated, pods)) else None


@pytest.mark.timeout(300)
async def test_podgroup_gang_is_released_together_on_karpenter_capacity(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: Hooked,
    node_pool: Obj,
) -> None:
    count, pool = 3, node_pool["metadata"]["name"]
    labels = flavor_labels(node_pool)
    await kube.merge_patch(NAMESPACE, namespace, {"metadata": {"labels": OPT_IN}})
    config = unique("e2e-karp-pg")
    spec = karpenter_config(pool, deadline=120)
    del spec["managedResources"]
    await kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    group = {
        "metadata": {"name": "ddp", "annotations": {"gangcheck.io/provisioning-config": config}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": count}}},
    }
    try:
        async with webhook_registered(kube, controller):
            await kube.create(UPSTREAM_POD_GROUP_V1BETA1, group, namespace)
            began = time.monotonic()

            async def all_gated() -> list[Obj] | None:
                return await gated_members(kube, namespace, count, labels)

            await eventually(all_gated, timeout=30, what="members gated by the webhook")

        async def all_running() -> list[Obj] | None:
            pods = (await kube.list_objects(POD, namespace))["items"]
            early = [p for p in pods if p["spec"].get("nodeName") and gated(p)]
            assert not early, "a member bound while gated"
            ran = running(pods)
            return ran if len(ran) == count else None

        pods = await eventually(all_running, timeout=180, interval=0.5, what="members Running")
        started_after = time.monotonic() - began
        released = await kube.get(UPSTREAM_POD_GROUP_V1BETA1, "ddp", namespace)
        assert (released["metadata"].get("annotations") or {}).get("gangcheck.io/state") in (
            "Released",
            "Started",
        )
        (request,) = (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]
        assert is_true(request, "Provisioned")
        claims = await claims_of_pool(kube, pool)
        assert len(claims) == count
        assert {p["spec"]["nodeName"] for p in pods} == {c["status"]["nodeName"] for c in claims}
        assert not any(GATE in str(p["spec"].get("schedulingGates")) for p in pods)
        cluster.record(
            f"c. PodGroup of {count} x 8 GPUs, webhook-gated, on Karpenter: all members "
            f"Running after {started_after:.1f}s on {count} NodeClaims"
        )
    finally:
        for i in range(count):
            await delete_quietly(kube, POD, f"ddp-{i}", namespace)
        await delete_quietly(kube, UPSTREAM_POD_GROUP_V1BETA1, "ddp", namespace)
        await delete_quietly(kube, ATOMIC_CONFIG, config)
        for claim in await claims_of_pool(kube, pool):
            await delete_quietly(kube, NODE_CLAIM, claim["metadata"]["name"])


# -- bad input ------------------------------------------------------------------------------


async def test_a_config_naming_a_missing_node_pool_keeps_the_check_inactive(
    kube: Kube, cluster: Cluster, controller: Hooked
) -> None:
    name = unique("e2e-karp-bad")
    spec = karpenter_config("no-such-pool", deadline=30)
    await kube.create(ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": spec})
    parameters = {"apiGroup": "gangcheck.io", "kind": "AtomicProvisioningConfig", "name": name}
    check = {"controllerName": "gangcheck.io/atomic-provisioning", "parameters": parameters}
    await kube.create(ADMISSION_CHECK, {"metadata": {"name": name}, "spec": check})
    try:

        async def inactive() -> Obj | None:
            got = await kube.get(ADMISSION_CHECK, name)
            active = condition(got, "Active") or {}
            return active if active.get("status") == "False" else None

        active = await eventually(inactive, timeout=30, what="the check marked inactive")
        assert active["reason"] == "KarpenterBackendUnavailable"
        assert active["message"] == "spec.karpenter.nodePools[0]: NodePool 'no-such-pool' not found"
    finally:
        await delete_quietly(kube, ADMISSION_CHECK, name)
        await delete_quietly(kube, ATOMIC_CONFIG, name)
