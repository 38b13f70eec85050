"""Kueue taking a gang back, end to end: preemption, deactivation, waitForPodsReady, a queue
gone or stopped.

Kueue evicts a Workload (preempted by a higher priority, ``spec.active: false``, its pods
not Ready within waitForPodsReady's timeout, a stopped ClusterQueue with an admitted gang:
``Evicted`` True, every check reset to Pending, ``retryCount`` counted only for a check in
Retry: ``prepareForEviction`` in ``pkg/workload``) or, for a gang that is not admitted yet,
takes its quota back without evicting it when its LocalQueue is deleted or its ClusterQueue
stopped (``QuotaReserved`` False, ``Inadmissible``, the checks left as they are:
``reconcileOnLocalQueueActiveState`` and ``reconcileOnClusterQueueActiveState`` in Kueue's
workload controller). Each test plays one of these on a gang gangcheck provisions through
the simulated cloud, and asserts what stays: the requests, the nodes (deleted, recorded for
which request, tainted), the Events on the Workload, where the gang runs once Kueue admits
it again, and the last line of ``gangcheck diagnose``. Kueue reads waitForPodsReady only at
start: its test restarts the stack's Kueue with it, and without it afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from gangcheck_dev.testbed import stack
from gangcheck_dev.testbed.deploy import ManagedProcess

from gangcheck.diagnose import diagnose, render_text
from gangcheck.kube.client import Kube
from gangcheck.kube.resources import NODE, PROVISIONING_REQUEST, WORKLOAD, Resource
from gangcheck.logic.attempt.hold import HOLD_TAINT
from tests.e2e.conftest import Cluster
from tests.e2e.helpers import (
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    delete_quietly,
    events_of,
    eventually,
    get_or_none,
    is_true,
    messages,
    unique,
)
from tests.e2e.test_gangcheck import (  # the module's processes, reused
    ARRIVED_FOR,
    GPU_TYPE,
    SIM_CLASS,
    SIM_POOL,
    Queue,
    SimCloud,
    check_state,
    controller,  # noqa: F401
    delete_nodes,
    gang_job,
    gpu_queue,
    job_pods,
    nodes_with,
    our_config,
    running,
    sim,  # noqa: F401
    sim_group,
    workdir,  # noqa: F401
)

Obj = dict[str, Any]
PRIORITY_CLASS = Resource(
    "kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", False
)
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Two nodes of 8 GPUs: one gang of two at a time.
QUOTA_GPUS = 16
PREEMPT = {"withinClusterQueue": "LowerPriority"}


@contextlib.asynccontextmanager
async def priorities(kube: Kube) -> AsyncIterator[dict[str, str]]:
    """A low and a high WorkloadPriorityClass (name by level); removed afterwards."""
    names = {"low": unique("e2e-low"), "high": unique("e2e-high")}
    for level, value in (("low", 10), ("high", 1000)):
        await kube.create(PRIORITY_CLASS, {"metadata": {"name": names[level]}, "value": value})
    try:
        yield names
    finally:
        for name in names.values():
            await delete_quietly(kube, PRIORITY_CLASS, name)


def pool_of(
    cloud: SimCloud, pool: str, *answers: Obj, deadline: int = 60
) -> tuple[dict[str, str], Obj]:
    """The pool's 6 nodes in the simulated cloud (``answers``: how it answers some requests),
    and what a test's queue takes: the pool's node labels and gangcheck's config there."""
    cloud.configure(sim_group(pool, 6), *answers)
    return {GPU_TYPE: "e2e", SIM_POOL: pool}, our_config(klass=SIM_CLASS, deadline=deadline)


def job(name: str, pool: str, priority: str | None = None) -> Obj:
    """A gang of two 8-GPU pods on the pool, at ``priority`` (a WorkloadPriorityClass)."""
    body = gang_job(name, 2, 8, {SIM_POOL: pool})
    if priority is not None:
        body["metadata"]["labels"][PRIORITY_LABEL] = priority
    return body


def partial(namespace: str, pool: str, job_name: str) -> Obj:
    """The sim's rule: the first request of the Job's Workload gets one node of two."""
    return {
        "name": f"partial-{pool}",
        "match": {"namespace": namespace, "name": f"job-{job_name}-.*"},
        "times": 1,
        "deliver": 1,
    }


async def workload(kube: Kube, namespace: str, job_name: str) -> Obj:
    """The Job's Workload (Kueue names it ``job-<name>-<hash>``)."""

    async def found() -> Obj | None:
        for item in (await kube.list_objects(WORKLOAD, namespace))["items"]:
            owners = item["metadata"].get("ownerReferences") or []
            if any(o.get("name") == job_name for o in owners):
                return dict(item)
        return None

    return await eventually(found, timeout=30, what=f"the Workload of {job_name}")


async def requests_of(kube: Kube, namespace: str, wl: Obj) -> list[Obj]:
    """The ProvisioningRequests gangcheck made for the Workload (by its name annotation)."""
    name = wl["metadata"]["name"]
    listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
    return [
        r
        for r in listing["items"]
        if (r["metadata"].get("annotations") or {}).get("gangcheck.io/workload") == name
    ]


async def one_arrived(kube: Kube, namespace: str, wl: Obj, pool: str) -> tuple[Obj, Obj]:
    """The Workload's request and the one node recorded as arrived for it, held for it."""

    async def recorded() -> tuple[Obj, Obj] | None:
        for req in await requests_of(kube, namespace, wl):
            key = f"{namespace}/{req['metadata']['name']}"
            for node in await nodes_with(kube, f"{SIM_POOL}={pool}"):
                if _recorded_for(node) == key and _held(node):
                    return req, node
        return None

    return await eventually(recorded, timeout=30, what="a node arrived and held for the gang")


async def gang_running(kube: Kube, namespace: str, job_name: str) -> list[Obj]:
    async def both() -> list[Obj] | None:
        pods = running(await job_pods(kube, namespace, job_name))
        return pods if len(pods) == 2 else None

    return await eventually(both, timeout=60, interval=0.5, what=f"{job_name} Running")


async def gone(kube: Kube, res: Resource, name: str, namespace: str | None = None) -> bool:
    return await get_or_none(kube, res, name, namespace) is None


def _recorded_for(node: Obj) -> str:
    return str((node["metadata"].get("annotations") or {}).get(ARRIVED_FOR, ""))


def _held(node: Obj) -> bool:
    return any(t["key"] == HOLD_TAINT for t in node["spec"].get("taints") or [])


def times(events: list[Obj], reason: str) -> int:
    """How many times Events of this reason were said (a repeat counted on its Event)."""
    return sum(int(e.get("count") or 1) for e in events if e.get("reason") == reason)


async def reasons(kube: Kube, obj: Obj, reason: str) -> list[str]:
    return messages(await events_of(kube, obj), reason)


async def told(kube: Kube, obj: Obj, reason: str) -> list[str]:
    """Waits for Kueue's Event ``reason`` on ``obj``: its recorder sends Events in the
    background, after the write they tell of."""
    return await eventually(
        lambda: reasons(kube, obj, reason), timeout=30, what=f"an Event {reason}"
    )


async def withdrawn(kube: Kube, namespace: str, wl: Obj, request: Obj, node: str) -> list[str]:
    """Waits until the node that arrived is reclaimed (deleted), the request deleted and the
    Event saying so recorded on the Workload; returns that Event's messages."""
    await eventually(lambda: gone(kube, NODE, node), timeout=30, what=f"{node} reclaimed")
    name = request["metadata"]["name"]
    await eventually(
        lambda: gone(kube, PROVISIONING_REQUEST, name, namespace), what=f"{name} deleted"
    )
    return await eventually(
        lambda: reasons(kube, wl, "ReclaimingArrivals"), what="the ReclaimingArrivals Event"
    )


async def verdict(kube: Kube, namespace: str, wl: Obj) -> str:
    """The last line of ``gangcheck diagnose`` for the Workload."""
    report = await diagnose(kube, f"workload/{namespace}/{wl['metadata']['name']}")
    return render_text(report).rstrip().splitlines()[-1]


async def came_back_cleanly(
    kube: Kube, namespace: str, job_name: str, first: Obj, pool: str
) -> None:
    """The gang withdrawn from its first attempt runs again on an attempt of its own: one
    request (not the first), its members on nodes recorded for it or for no request in
    flight (capacity another gang left), nothing left held, and diagnose says it runs."""
    pods = await gang_running(kube, namespace, job_name)
    wl = await workload(kube, namespace, job_name)
    (now,) = await requests_of(kube, namespace, wl)
    assert now["metadata"]["uid"] != first["metadata"]["uid"]
    live = {
        f"{namespace}/{r['metadata']['name']}"
        for r in (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]
    }
    key = f"{namespace}/{now['metadata']['name']}"
    nodes = {n["metadata"]["name"]: n for n in await nodes_with(kube, f"{SIM_POOL}={pool}")}
    on = {_recorded_for(nodes[p["spec"]["nodeName"]]) for p in pods}
    assert not (on & live) - {key}, (on, key)

    async def unheld() -> bool:
        return not any(_held(n) for n in await nodes_with(kube, f"{SIM_POOL}={pool}"))

    await eventually(unheld, timeout=30, what="the hold lifted once the gang started")
    assert await verdict(kube, namespace, wl) == "not blocked: admitted and running"


# -- preemption ----------------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_a_gang_preempted_while_waiting_gives_back_what_arrived_and_is_asked_again(
    kube: Kube,
    namespace: str,
    controller: ManagedProcess | None,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    """Low waits for its second node (one arrived, held for it) when High, of a higher
    priority, needs the quota: Kueue preempts Low. gangcheck withdraws Low's request and
    reclaims the node that arrived for it; High is provisioned and runs; once High is gone,
    Low is asked for again, on a request of its own, and runs."""
    pool = unique("preempt")
    labels, config = pool_of(sim, pool, partial(namespace, pool, "low"))
    try:
        async with (
            priorities(kube) as classes,
            gpu_queue(kube, namespace, labels, ours=config, gpus=QUOTA_GPUS, preemption=PREEMPT),
        ):
            await kube.create(JOB, job("low", pool, classes["low"]), namespace)
            low = await workload(kube, namespace, "low")
            first, arrived = await one_arrived(kube, namespace, low, pool)
            await kube.create(JOB, job("high", pool, classes["high"]), namespace)
            high = await workload(kube, namespace, "high")

            node = arrived["metadata"]["name"]
            said = await withdrawn(kube, namespace, low, first, node)
            assert len(said) == 1 and node in said[0] and "Workload evicted" in said[0], said
            await told(kube, low, "Preempted")
            await gang_running(kube, namespace, "high")
            assert is_true(
                await kube.get(WORKLOAD, high["metadata"]["name"], namespace), "Admitted"
            )

            await kube.delete(JOB, "high", namespace)
            await came_back_cleanly(kube, namespace, "low", first, pool)
    finally:
        await cleanup(kube, namespace, pool, "low", "high")


async def cleanup(kube: Kube, namespace: str, pool: str, *jobs: str) -> None:
    for name in jobs:
        await delete_quietly(kube, JOB, name, namespace)
    await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))


@pytest.mark.timeout(120)
async def test_a_running_gang_preempted_leaves_its_nodes_as_they_are_and_runs_again(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: ManagedProcess | None,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    """Low runs on the two nodes that arrived for it when High preempts it: Kueue stops
    Low's pods; gangcheck withdraws Low's request and reclaims nothing (the nodes were the
    started gang's to use, free now for anyone); High runs; once High is gone Low runs
    again on a request of its own."""
    pool = unique("preempt-run")
    labels, config = pool_of(sim, pool)
    try:
        async with (
            priorities(kube) as classes,
            gpu_queue(kube, namespace, labels, ours=config, gpus=QUOTA_GPUS, preemption=PREEMPT),
        ):
            await kube.create(JOB, job("low", pool, classes["low"]), namespace)
            low_pods = await gang_running(kube, namespace, "low")
            low = await workload(kube, namespace, "low")
            (first,) = await requests_of(kube, namespace, low)
            ran_on = {p["spec"]["nodeName"] for p in low_pods}
            await kube.create(JOB, job("high", pool, classes["high"]), namespace)
            await gang_running(kube, namespace, "high")

            assert await gone(kube, PROVISIONING_REQUEST, first["metadata"]["name"], namespace)
            await told(kube, low, "Preempted")
            assert await reasons(kube, low, "ReclaimingArrivals") == []
            for name in ran_on:  # never reclaimed, never held again
                node = await kube.get(NODE, name)
                assert not _held(node) and node["spec"].get("unschedulable") is not True
            nodes = len(await nodes_with(kube, f"{SIM_POOL}={pool}"))

            await kube.delete(JOB, "high", namespace)
            await came_back_cleanly(kube, namespace, "low", first, pool)
            cluster.record(
                f"eviction: a running gang of 2 preempted by one of 2: {nodes} nodes in the "
                f"pool once the preemptor ran, "
                f"{len(await nodes_with(kube, f'{SIM_POOL}={pool}'))} once the first ran again"
            )
    finally:
        await cleanup(kube, namespace, pool, "low", "high")


# -- deactivation --------------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_a_gang_deactivated_mid_attempt_gives_back_what_arrived_and_is_asked_again(
    kube: Kube,
    namespace: str,
    controller: ManagedProcess | None,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    """``spec.active: false`` while one node of two has arrived: Kueue evicts (Deactivated);
    gangcheck withdraws the request and reclaims the node. Active again, the gang is asked
    for afresh and runs; deactivated once running, its request goes and its nodes stay, none
    held, and diagnose says it is deactivated."""
    pool = unique("deactivate")
    labels, config = pool_of(sim, pool, partial(namespace, pool, "low"))
    try:
        async with gpu_queue(kube, namespace, labels, ours=config):
            await kube.create(JOB, job("low", pool), namespace)
            low = await workload(kube, namespace, "low")
            first, arrived = await one_arrived(kube, namespace, low, pool)
            name = low["metadata"]["name"]
            await kube.merge_patch(WORKLOAD, name, {"spec": {"active": False}}, namespace)

            node = arrived["metadata"]["name"]
            said = await withdrawn(kube, namespace, low, first, node)
            assert len(said) == 1 and node in said[0], said

            await kube.merge_patch(WORKLOAD, name, {"spec": {"active": True}}, namespace)
            await came_back_cleanly(kube, namespace, "low", first, pool)
            (second,) = await requests_of(kube, namespace, low)
            ran_on = {p["spec"]["nodeName"] for p in await job_pods(kube, namespace, "low")}

            await kube.merge_patch(WORKLOAD, name, {"spec": {"active": False}}, namespace)

            async def let_go() -> bool:
                return await gone(kube, PROVISIONING_REQUEST, second["metadata"]["name"], namespace)

            await eventually(let_go, timeout=30, what="the running gang's request withdrawn")
            for name_ in ran_on:
                assert not _held(await kube.get(NODE, name_))
            assert (await verdict(kube, namespace, low)).startswith(
                "blocked: the Workload is deactivated (spec.active=false)"
            )
    finally:
        await cleanup(kube, namespace, pool, "low")


# -- quota taken back without eviction -----------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "how",
    [
        "LocalQueue deleted",
        # the same path in gangcheck (Kueue's quota taken back without eviction): make soak
        pytest.param("ClusterQueue HoldAndDrain", marks=pytest.mark.soak),
    ],
)
async def test_a_gang_whose_queue_stops_mid_attempt_gives_back_what_arrived_at_its_deadline(
    kube: Kube,
    namespace: str,
    controller: ManagedProcess | None,  # noqa: F811
    sim: SimCloud,  # noqa: F811
    how: str,
) -> None:
    """One node of two has arrived, held for the gang, when its LocalQueue is deleted (or
    its ClusterQueue set to HoldAndDrain): Kueue takes the quota back without evicting, the
    check left Pending. gangcheck keeps the attempt until its deadline, then withdraws it and
    reclaims the node, saying so on the check; the queue back, the gang is asked for again
    and runs. Before, the request and the held node stayed for as long as the queue did not
    come back."""
    pool = unique("stopped")
    deadline = 6
    labels, config = pool_of(sim, pool, partial(namespace, pool, "low"), deadline=deadline)
    try:
        async with gpu_queue(kube, namespace, labels, ours=config) as queue:
            await kube.create(JOB, job("low", pool), namespace)
            low = await workload(kube, namespace, "low")
            first, arrived = await one_arrived(kube, namespace, low, pool)
            await stop(kube, queue, how)

            async def quota_lost() -> bool:
                got = await kube.get(WORKLOAD, low["metadata"]["name"], namespace)
                return not is_true(got, "QuotaReserved")

            await eventually(quota_lost, timeout=30, what="Kueue takes the quota back")
            node = arrived["metadata"]["name"]
            said = await withdrawn(kube, namespace, low, first, node)
            assert len(said) == 1 and node in said[0] and "quota lost" in said[0], said
            got = await kube.get(WORKLOAD, low["metadata"]["name"], namespace)
            message = check_state(got, queue.check).get("message", "")
            assert message.startswith("Workload quota lost (Inadmissible: "), message
            assert "the 1 node(s) that arrived for it reclaimed safely" in message, message

            await resume(kube, queue, how)
            await came_back_cleanly(kube, namespace, "low", first, pool)
    finally:
        await cleanup(kube, namespace, pool, "low")


async def stop(kube: Kube, queue: Queue, how: str) -> None:
    if how == "LocalQueue deleted":
        await kube.delete(LOCAL_QUEUE, "lq", queue.namespace)
    else:
        patch = {"spec": {"stopPolicy": "HoldAndDrain"}}
        await kube.merge_patch(CLUSTER_QUEUE, queue.cluster_queue, patch)


async def resume(kube: Kube, queue: Queue, how: str) -> None:
    if how == "LocalQueue deleted":
        await eventually(
            lambda: gone(kube, LOCAL_QUEUE, "lq", queue.namespace),
            timeout=30,
            what="the LocalQueue gone",
        )
        body = {"metadata": {"name": "lq"}, "spec": {"clusterQueue": queue.cluster_queue}}
        await kube.create(LOCAL_QUEUE, body, queue.namespace)
    else:
        await kube.merge_patch(CLUSTER_QUEUE, queue.cluster_queue, {"spec": {"stopPolicy": "None"}})


# -- waitForPodsReady ----------------------------------------------------------------------

#: Kueue's waitForPodsReady, short for the test: an admitted gang whose pods are not all
#: Ready within 4 s is evicted (PodsReadyTimeout) and requeued after about a second; at the
#: second timeout it is deactivated (backoffLimitCount 1).
PODS_READY = {
    "waitForPodsReady": {
        "timeout": "4s",
        "requeuingStrategy": {
            "backoffBaseSeconds": 1,
            "backoffMaxSeconds": 2,
            "backoffLimitCount": 1,
        },
    }
}


@pytest.fixture
def pods_ready_kueue(cluster: Cluster) -> Iterator[None]:
    """The stack's Kueue restarted with PODS_READY for one test, then as it was."""
    if cluster.plane is None:
        pytest.fail(
            "waitForPodsReady needs Kueue's configuration, which the suite sets only on the "
            "local stack it starts (not on the cluster GANGCHECK_E2E_KUBECONFIG names)"
        )
    plane = cluster.plane
    (kueue,) = [a for a in plane.addons if isinstance(a, stack.Kueue)]
    before = dict(kueue.config_overrides)
    kueue.reconfigure(plane, {**before, **PODS_READY})
    try:
        yield
    finally:
        kueue.reconfigure(plane, before)


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("pods_ready_kueue")
async def test_a_gang_whose_pods_are_not_ready_in_time_is_evicted_requeued_and_let_go(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: ManagedProcess | None,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    """Kueue's waitForPodsReady: gangcheck provisions the gang and Kueue admits it, but its
    members never start (a scheduling gate nobody lifts), so Kueue evicts it
    (PodsReadyTimeout), requeues it, admits it again, and at the second timeout deactivates
    it. gangcheck withdraws each attempt's request at each eviction and leaves no node held
    or fenced for the gang: its nodes were delivered whole (the attempt fulfilled), so they
    stay, open to anyone, for the gang's next admission or the autoscaler's scale-down."""
    pool = unique("podsready")
    labels, config = pool_of(sim, pool)
    body = job("low", pool)
    body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "e2e.gangcheck.io/never"}]
    try:
        async with gpu_queue(kube, namespace, labels, ours=config):
            await kube.create(JOB, body, namespace)
            low = await workload(kube, namespace, "low")
            name = low["metadata"]["name"]

            async def deactivated() -> Obj | None:
                got = await kube.get(WORKLOAD, name, namespace)
                return got if got["spec"].get("active") is False else None

            final = await eventually(deactivated, timeout=60, what="Kueue deactivates the gang")
            limit = "EvictedDueToDeactivatedDueToRequeuingLimitExceeded"
            await told(kube, final, limit)  # may come after spec.active=false
            events = await events_of(kube, final)
            said = [(e.get("reason"), e.get("count"), e.get("message")) for e in events]
            assert times(events, "Admitted") == 2, said
            assert times(events, "EvictedDueToPodsReadyTimeout") == 1, said
            assert times(events, limit) == 1, said

            async def no_request() -> bool:
                return not await requests_of(kube, namespace, low)

            await eventually(no_request, timeout=30, what="every request of the gang withdrawn")
            nodes = await nodes_with(kube, f"{SIM_POOL}={pool}")
            assert nodes and not any(_held(n) for n in nodes)
            assert not any(n["spec"].get("unschedulable") for n in nodes)
            assert await reasons(kube, low, "ReclaimingArrivals") == []
            assert (await verdict(kube, namespace, low)).startswith(
                "blocked: the Workload is deactivated (spec.active=false): The workload is "
                "deactivated due to exceeding the maximum number of re-queuing retries"
            )
            cluster.record(
                f"eviction: waitForPodsReady, a gang of 2 evicted twice, deactivated: "
                f"{len(nodes)} nodes left in the pool, none held"
            )
    finally:
        await cleanup(kube, namespace, pool, "low")
