"""Across clusters: Kueue's MultiKueue sends a gang's Workload to several workers, each worker's
gangcheck provisions for it, one wins; the losers withdraw and give back what arrived.

Jobs are queued in the manager; its ClusterQueue carries MultiKueue's AdmissionCheck. In each
worker the same LocalQueue leads to a ClusterQueue with gangcheck's AdmissionCheck and a
flavor pinned to that worker's simulated cloud (conftest.py: worker-1 stocked out after one
node, worker-2 with room).

- Kueue's AllAtOnce dispatcher (the default), then its Incremental one (with two workers its
  first round nominates both): the gang runs in worker-2; worker-1 scaled up one node for it,
  and when the manager removed worker-1's copy of the Workload, worker-1's gangcheck withdrew
  its request and reclaimed that node: nothing is left there.
- The Job deleted in the manager mid-flight (both workers holding one node for it): nothing
  is left in any cluster.
- An external dispatcher (Kueue started with a dispatcher name it does not own; the test
  nominates) moving the gang from worker-1 to worker-2: worker-1 gives back its node.

What is asserted is durable: the manager's Workload (``status.clusterName``), the objects
left in each worker, the Events each worker's cloud records on a request for every node it
delivered for it (``NodeDelivered``), which outlive the nodes and the requests, and
gangcheck's Event on the gone Workload copy naming the nodes it reclaimed
(``ReclaimingArrivals``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from gangcheck_dev.simcloud.cloud import DELIVERED_REASON
from gangcheck_dev.testbed.multicluster import ALL_AT_ONCE, CHECK, INCREMENTAL

from gangcheck.kube.client import APPLY_PATCH, Kube
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    EVENT,
    NAMESPACE,
    NODE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    WORKLOAD,
)
from gangcheck.logic.dispatch import DISPATCHER
from gangcheck.model.objects import request_of
from tests.e2e.helpers import (
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    SERVICE_ACCOUNT,
    container,
    delete_quietly,
    eventually,
    get_or_none,
    is_true,
    unique,
)
from tests.e2e.multicluster.conftest import (
    GPU_TAINT,
    GPU_TYPE,
    POOL,
    SIM_CLASS,
    SIM_POOL,
    STOCKED_OUT,
    WITH_ROOM,
    Bed,
)

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
ARRIVED_FOR = "gangcheck.io/arrived-for"
#: On a request kept open after its gang went, its source having said Provisioned=True
#: (gangcheck's lifecycle.promise): what still comes for it is recorded and reclaimed.
GANG_GONE = "gangcheck.io/gang-gone"
OUR_CONTROLLER = "gangcheck.io/atomic-provisioning"
MANAGER = "manager"
MEMBERS = 2
#: Well past anything in this module: a worker's attempt ends only because its copy goes.
DEADLINE = 300


# -- queues, gangs ----------------------------------------------------------------------------


async def fresh_namespace(kubes: dict[str, Kube]) -> str:
    """One namespace of the same name in every cluster (MultiKueue copies into the same)."""
    name = unique("mc")
    for kube in kubes.values():
        await kube.create(NAMESPACE, {"metadata": {"name": name}})
    for cluster, kube in kubes.items():
        if cluster != MANAGER:  # pods run in the workers only

            async def account(kube: Kube = kube) -> object:
                return await get_or_none(kube, SERVICE_ACCOUNT, "default", name)

            await eventually(account, timeout=30, what=f"{cluster}: ServiceAccount {name}/default")
    return name


def cluster_queue(flavor: str, check: str) -> Obj:
    quota = [
        {"name": "cpu", "nominalQuota": "1000"},
        {"name": "memory", "nominalQuota": "10Ti"},
        {"name": GPU, "nominalQuota": "256"},
    ]
    return {
        "metadata": {"name": flavor},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [{"name": flavor, "resources": quota}],
                }
            ],
            "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
        },
    }


@contextlib.asynccontextmanager
async def queues(
    kubes: dict[str, Kube],
    namespace: str,
    *,
    deadline: int = DEADLINE,
    backoff: int = 1,
    check: str = CHECK,
) -> AsyncIterator[str]:
    """LocalQueue ``lq`` in every cluster: in the manager through MultiKueue's AdmissionCheck
    ``check``, in each worker through gangcheck's (its ``deadline`` and retry ``backoff``, in
    seconds), on a flavor pinned to that worker's cloud. Removed after."""
    name = unique("mc-gang")
    made: list[tuple[Kube, Any, str, str | None]] = []

    async def create(kube: Kube, res: Any, body: Obj, ns: str | None = None) -> None:
        await kube.create(res, body, ns)
        made.append((kube, res, body["metadata"]["name"], ns))

    try:
        manager = kubes[MANAGER]
        await create(manager, RESOURCE_FLAVOR, {"metadata": {"name": name}})
        await create(manager, CLUSTER_QUEUE, cluster_queue(name, check))
        await create(
            manager,
            LOCAL_QUEUE,
            {"metadata": {"name": "lq"}, "spec": {"clusterQueue": name}},
            namespace,
        )
        for cluster, kube in kubes.items():
            if cluster == MANAGER:
                continue
            spec = {
                "provisioningClassName": SIM_CLASS,
                "allowCustomProvisioningClass": True,
                "managedResources": [GPU],
                "retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": backoff},
                "fulfillment": {
                    "mode": "NodesFit",
                    "deadlineSeconds": deadline,
                    "reclaimer": "DeleteNode",
                },
            }
            await create(kube, ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": spec})
            check = {
                "controllerName": OUR_CONTROLLER,
                "parameters": {
                    "apiGroup": "gangcheck.io",
                    "kind": "AtomicProvisioningConfig",
                    "name": name,
                },
            }
            await create(kube, ADMISSION_CHECK, {"metadata": {"name": name}, "spec": check})
            flavor = {
                "nodeLabels": {SIM_POOL: POOL},
                "nodeTaints": [GPU_TAINT.to_dict()],
                "tolerations": [GPU_TAINT.toleration()],
            }
            await create(kube, RESOURCE_FLAVOR, {"metadata": {"name": name}, "spec": flavor})
            await create(kube, CLUSTER_QUEUE, cluster_queue(name, name))
            lq = {"metadata": {"name": "lq"}, "spec": {"clusterQueue": name}}
            await create(kube, LOCAL_QUEUE, lq, namespace)
        for cluster, kube in kubes.items():

            async def active(kube: Kube = kube) -> bool:
                return is_true(await kube.get(CLUSTER_QUEUE, name), "Active")

            await eventually(active, timeout=30, what=f"{cluster}: ClusterQueue {name} Active")
        yield name
    finally:
        for kube, res, obj, ns in reversed(made):
            await delete_quietly(kube, res, obj, ns)


def gang_job(name: str) -> Obj:
    """A suspended Job of ``MEMBERS`` pods that must all run, each on a whole 8-GPU node."""
    return {
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "suspend": True,
            "parallelism": MEMBERS,
            "completions": MEMBERS,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container({"cpu": "1", "memory": "1Gi", GPU: "8"}, {GPU: "8"})],
                    "nodeSelector": {GPU_TYPE: "e2e"},
                    "tolerations": [GPU_TAINT.toleration()],
                }
            },
        },
    }


# -- what a cluster holds ---------------------------------------------------------------------


async def items(kube: Kube, res: Any, namespace: str | None = None, **kw: str) -> list[Obj]:
    return list((await kube.list_objects(res, namespace, **kw)).get("items") or [])


async def delivered(kube: Kube, namespace: str) -> list[str]:
    """The nodes the worker's cloud delivered for the gang of ``namespace``: the Events it
    records on each request (reason NodeDelivered), which outlive the nodes and requests."""
    events = await items(kube, EVENT, namespace, field_selector=f"reason={DELIVERED_REASON}")
    return sorted(e["message"].split()[1] for e in events)


async def delivered_at(kube: Kube, namespace: str) -> dict[str, float]:
    """When the worker's cloud delivered each node for the gang (its NodeDelivered Event's
    first timestamp, epoch seconds)."""
    events = await items(kube, EVENT, namespace, field_selector=f"reason={DELIVERED_REASON}")
    out = {}
    for e in events:
        stamp = str(e.get("firstTimestamp") or e.get("eventTime") or "")
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None
        out[e["message"].split()[1]] = at.timestamp() if at else 0.0
    return out


async def holding(kube: Kube, namespace: str) -> dict[str, list[str]]:
    """What a worker still holds for the gang of ``namespace``: its Workloads, requests,
    templates, and any node its cloud delivered for it or recorded as arrived for it."""
    nodes = await items(kube, NODE)
    names = {n["metadata"]["name"] for n in nodes}
    marks = {n["metadata"]["name"]: _arrived_for(n) for n in nodes}
    return {
        "workloads": _names(await items(kube, WORKLOAD, namespace)),
        "requests": _names(await items(kube, PROVISIONING_REQUEST, namespace)),
        "templates": _names(await items(kube, POD_TEMPLATE, namespace)),
        "arrived": sorted(n for n, mark in marks.items() if mark.startswith(f"{namespace}/")),
        "delivered": sorted(set(await delivered(kube, namespace)) & names),
    }


def _names(objs: list[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def _arrived_for(node: Obj) -> str:
    return str((node["metadata"].get("annotations") or {}).get(ARRIVED_FOR, ""))


async def told_reclaimed(kube: Kube, namespace: str, nodes: list[str]) -> None:
    """gangcheck's Event (ReclaimingArrivals, on the Workload copy that is gone) names each
    of ``nodes`` as reclaimed because the Workload was deleted."""

    async def told() -> list[str]:
        events = await items(kube, EVENT, namespace, field_selector="reason=ReclaimingArrivals")
        return [str(e.get("message") or "") for e in events]

    messages = await eventually(told, timeout=15, what="a ReclaimingArrivals Event")
    text = " ".join(messages)
    assert "Workload deleted" in text, messages
    assert all(node in text for node in nodes), (nodes, messages)


async def until_empty(kube: Kube, namespace: str, what: str, *, timeout: float = 30) -> None:
    """Waits until the worker holds nothing for the gang (``holding``), else says what."""

    async def empty() -> bool:
        return not any((await holding(kube, namespace)).values())

    try:
        await eventually(empty, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still held: {await holding(kube, namespace)}") from None


async def until_given_back(kube: Kube, namespace: str, what: str) -> list[str]:
    """Waits until the worker holds no Workload and no node for the gang (none recorded for
    it, none its cloud delivered), and any request left is one gangcheck keeps open for
    what its source may still deliver (``GANG_GONE``, its source's ``Provisioned=True``
    promise: docs/multicluster.md) with its templates (those its podSets name) and nothing
    else; returns the requests kept."""

    async def given_back() -> tuple[list[str]] | None:
        held = await holding(kube, namespace)
        if held["workloads"] or held["arrived"] or held["delivered"]:
            return None
        requests = await items(kube, PROVISIONING_REQUEST, namespace)
        kept = [
            r["metadata"]["name"]
            for r in requests
            if GANG_GONE in (r["metadata"].get("annotations") or {})
        ]
        if len(kept) != len(requests):
            return None
        asked = {p.template_name for r in requests for p in request_of(r).pod_sets}
        ok = all(t in asked for t in held["templates"])
        return (kept,) if ok else None  # truthy with no request kept too: a durable end

    try:
        (kept,) = await eventually(given_back, timeout=30, what=what)
        return kept
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still held: {await holding(kube, namespace)}") from None


async def drop_kept(kube: Kube, namespace: str) -> None:
    """Deletes the requests kept open for the gang (as an operator may) so that no later test
    of the bed meets them; gangcheck's orphan sweep then deletes their templates."""
    for req in await items(kube, PROVISIONING_REQUEST, namespace):
        await delete_quietly(kube, PROVISIONING_REQUEST, req["metadata"]["name"], namespace)
    await until_empty(kube, namespace, "the kept request's templates deleted")


async def manager_workload(kube: Kube, namespace: str) -> Obj | None:
    found = await items(kube, WORKLOAD, namespace)
    return found[0] if found else None


async def admitted_in_a_worker(manager: Kube, namespace: str, *, timeout: float = 60) -> Obj:
    """The manager's Workload of the gang of ``namespace`` once a worker admitted it
    (``status.clusterName`` set, ``Admitted``)."""

    async def placed() -> Obj | None:
        wl = await manager_workload(manager, namespace)
        done = wl is not None and (wl.get("status") or {}).get("clusterName")
        return wl if done and is_true(wl, "Admitted") else None

    return await eventually(placed, timeout=timeout, what="the manager's Workload admitted")


async def gang_running(kube: Kube, namespace: str) -> list[Obj]:
    """The gang's ``MEMBERS`` pods in worker-2 (``kube``), once all are Running."""

    async def all_running() -> list[Obj] | None:
        pods = await items(kube, POD, namespace)
        up = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return up if len(up) == MEMBERS else None

    return await eventually(all_running, timeout=30, what="the gang Running in worker-2")


async def cleanup_winner(kube: Kube, namespace: str) -> None:
    """The nodes that came for the winning gang (it ran on them: nothing reclaims them)."""
    for node in await items(kube, NODE):
        mark = (node["metadata"].get("annotations") or {}).get(ARRIVED_FOR, "")
        if mark.startswith(f"{namespace}/"):
            await delete_quietly(kube, NODE, node["metadata"]["name"])


# -- the race -------------------------------------------------------------------------------


async def race(bed: Bed, kubes: dict[str, Kube], dispatcher: str) -> None:
    """A gang in two workers at once: worker-2 wins, worker-1 withdraws and gives back."""
    bed.clusters.set_dispatcher(dispatcher)
    manager, loser, winner = kubes[MANAGER], kubes[STOCKED_OUT], kubes[WITH_ROOM]
    namespace = await fresh_namespace(kubes)
    async with queues(kubes, namespace):
        began = time.monotonic()
        await manager.create(JOB, gang_job("gang"), namespace)
        try:
            wl = await admitted_in_a_worker(manager, namespace)
            admitted = time.monotonic()
            assert wl["status"]["clusterName"] == WITH_ROOM
            pods = await gang_running(winner, namespace)
            started = time.monotonic()
            pool = {
                n["metadata"]["name"]
                for n in await items(winner, NODE, label_selector=f"{SIM_POOL}={POOL}")
            }
            assert {p["spec"]["nodeName"] for p in pods} <= pool

            # worker-1's cloud said Provisioned=True and delivered 1 node of 2: its request
            # is kept open for the other (what it delivers is reclaimed), holding no node
            kept = await until_given_back(loser, namespace, f"{STOCKED_OUT} holding no node")
            emptied = time.monotonic()
            scaled = await delivered(loser, namespace)
            assert scaled, "worker-1's cloud brought up no node: the race proves nothing"
            await told_reclaimed(loser, namespace, scaled)
            bed.measurements.append(
                f"{dispatcher.rsplit('/', 1)[-1]}: admitted in {WITH_ROOM} "
                f"{admitted - began:.1f}s after the Job, Running at {started - began:.1f}s; "
                f"{STOCKED_OUT} had scaled up {len(scaled)} node(s) and held 0 nodes, 0 "
                f"Workloads {emptied - admitted:.1f}s after the admission "
                f"({len(kept)} request kept open for what its cloud may still deliver)"
            )
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(winner, namespace)
            await drop_kept(loser, namespace)


@pytest.mark.timeout(180)
async def test_all_at_once_the_gang_runs_where_it_fits_and_the_stocked_out_worker_gives_back(
    bed: Bed, kubes: dict[str, Kube]
) -> None:
    await race(bed, kubes, ALL_AT_ONCE)


@pytest.mark.soak  # the same race as above, after a restart of the manager's Kueue: 12 s more
@pytest.mark.timeout(180)
async def test_incremental_the_gang_runs_where_it_fits_and_the_stocked_out_worker_gives_back(
    bed: Bed, kubes: dict[str, Kube]
) -> None:
    await race(bed, kubes, INCREMENTAL)


@pytest.mark.timeout(180)
async def test_a_job_deleted_mid_flight_leaves_nothing_in_any_worker(
    bed: Bed, kubes: dict[str, Kube]
) -> None:
    """Both workers hold one node of two for the gang when its Job is deleted in the manager:
    the garbage collector deletes the manager's Workload, MultiKueue removes both copies, and
    each worker's gangcheck reclaims its node. Each cloud had said Provisioned=True, so each
    request is kept open for what still comes (its PodTemplates, owned by nothing, outlive
    the copy in a worker whose garbage collector runs): worker-2's cloud delivers the other
    node ``LATE_DELAY`` s after the first, after the copy went, and gangcheck records it for
    the kept request and reclaims it too, then deletes the request (everything asked for
    came); worker-1's, stocked out, delivers nothing more, and its request is kept, holding
    no node, until its deadline (deleted here by hand)."""
    bed.clusters.set_dispatcher(ALL_AT_ONCE)  # whatever ran before in the folder
    manager = kubes[MANAGER]
    workers = {name: kube for name, kube in kubes.items() if name != MANAGER}
    namespace = await fresh_namespace(kubes)
    async with queues(kubes, namespace):
        await manager.create(JOB, gang_job("gang-partial"), namespace)
        try:
            for name, kube in workers.items():

                async def one_arrived(kube: Kube = kube) -> list[str]:
                    return (await holding(kube, namespace))["arrived"]

                await eventually(one_arrived, timeout=30, what=f"{name}: a node arrived for it")
            deleted = time.monotonic()
            await manager.delete(JOB, "gang-partial", namespace)

            async def manager_empty() -> bool:
                return await manager_workload(manager, namespace) is None

            await eventually(manager_empty, timeout=30, what="the manager's Workload deleted")
            gone = time.time()
            left = []
            for name, kube in workers.items():
                kept = await until_given_back(kube, namespace, f"{name} holding no node")
                if name == WITH_ROOM:  # its second node comes late, and is reclaimed
                    await until_empty(kube, namespace, f"{name} holding nothing", timeout=45)
                    kept = []
                else:
                    assert len(kept) == 1, kept  # nothing more comes: kept to its deadline
                scaled = await delivered(kube, namespace)
                assert len(scaled) == (1 if name == STOCKED_OUT else MEMBERS), (name, scaled)
                await told_reclaimed(kube, namespace, scaled)
                late = [n for n, at in (await delivered_at(kube, namespace)).items() if at > gone]
                left.append(
                    f"{name} scaled up {len(scaled)} ({len(late)} after the copy went), "
                    f"holds 0 nodes and {len(kept)} request(s) kept open"
                )
            bed.measurements.append(
                f"Job deleted mid-flight: {'; '.join(left)}, "
                f"{time.monotonic() - deleted:.1f}s after the delete"
            )
        finally:
            await delete_quietly(manager, JOB, "gang-partial", namespace)
            for kube in workers.values():
                await drop_kept(kube, namespace)


#: The field manager of Kueue's own writes of a Workload's admission status.
KUEUE_ADMISSION = "kueue-admission"


async def nominate_cluster(kube: Kube, name: str, namespace: str, cluster: str) -> None:
    """As an external dispatcher must: a server-side apply of ``nominatedClusterNames`` as
    Kueue's admission field manager. Kueue v0.17 applies ``clusterName`` and drops the
    nomination in one apply when a worker admits; a nomination owned by another manager
    survives that apply, and the API server refuses the status ("clusterName and
    nominatedClusterNames are mutually exclusive"): the Workload never leaves Pending."""
    body = {
        "apiVersion": WORKLOAD.api_version,
        "kind": WORKLOAD.kind,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"nominatedClusterNames": [cluster]},
    }
    await kube.request(
        "PATCH",
        f"{WORKLOAD.object_path(name, namespace)}/status",
        query={"fieldManager": KUEUE_ADMISSION, "force": "true"},
        body=body,
        content_type=APPLY_PATCH,
    )


@pytest.mark.soak  # a restart of the manager's Kueue (3 s) and a race of its own (10 s); the
# worker's side is the same removal of its copy as in the AllAtOnce race above
@pytest.mark.timeout(180)
async def test_an_external_dispatcher_moving_on_leaves_nothing_in_the_worker_it_left(
    bed: Bed, kubes: dict[str, Kube]
) -> None:
    """Kueue started with a dispatcher name it does not own copies a Workload only into the
    workers in its ``status.nominatedClusterNames`` (the test plays the dispatcher): worker-1
    first, where one node arrives for the gang and no more; then worker-2 alone. Kueue
    removes worker-1's copy, worker-1's gangcheck reclaims the node, the gang runs in
    worker-2."""
    bed.clusters.set_dispatcher(DISPATCHER)
    manager, loser, winner = kubes[MANAGER], kubes[STOCKED_OUT], kubes[WITH_ROOM]
    namespace = await fresh_namespace(kubes)
    async with queues(kubes, namespace):
        await manager.create(JOB, gang_job("gang"), namespace)
        try:

            async def reserved() -> Obj | None:
                wl = await manager_workload(manager, namespace)
                return wl if wl is not None and is_true(wl, "QuotaReserved") else None

            wl = await eventually(reserved, timeout=30, what="quota reserved in the manager")
            name = wl["metadata"]["name"]

            async def nominate(cluster: str) -> None:
                await nominate_cluster(manager, name, namespace, cluster)

            await nominate(STOCKED_OUT)

            async def one_arrived() -> list[str]:
                return (await holding(loser, namespace))["arrived"]

            await eventually(one_arrived, timeout=30, what=f"{STOCKED_OUT}: a node arrived")
            assert not await items(winner, WORKLOAD, namespace), "a copy where none was asked"
            moved = time.monotonic()
            await nominate(WITH_ROOM)
            await until_given_back(loser, namespace, f"{STOCKED_OUT} holding no node")
            emptied = time.monotonic()
            wl = await admitted_in_a_worker(manager, namespace)
            assert wl["status"]["clusterName"] == WITH_ROOM
            assert not wl["status"].get("nominatedClusterNames")
            scaled = await delivered(loser, namespace)
            assert scaled, f"{STOCKED_OUT}'s cloud brought up no node"
            await told_reclaimed(loser, namespace, scaled)
            bed.measurements.append(
                f"external dispatcher moved from {STOCKED_OUT} to {WITH_ROOM}: {STOCKED_OUT} "
                f"had scaled up {len(scaled)} node(s) and held 0 "
                f"{emptied - moved:.1f}s after the move"
            )
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(winner, namespace)
            await drop_kept(loser, namespace)
