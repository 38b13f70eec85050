"""Capacity sources in order, end to end on the full local stack with the real
cluster-autoscaler: two node groups of one flavor, the first too small for the gang. The
gang's first source (pinned to the small group) says CapacityIsNotFound; gangcheck leaves it
inside the same attempt, asks the second (pinned to the big group), and the gang runs there,
with no node in the first group and no retry of Kueue's used. On the simulated cloud: Race,
and InOrder topping up a pool that delivered part of the gang from the next one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from gangcheck_dev.testbed.deploy import ManagedProcess

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import JOB, NODE, POD_TEMPLATE, PROVISIONING_REQUEST
from gangcheck.logic.attempt.scaledown import SCALE_DOWN_DISABLED
from gangcheck.model.names import SCALE_DOWN_GUARD
from tests.e2e.conftest import E2E_NODE_GROUPS, KEPT_TAINT, Cluster
from tests.e2e.helpers import (
    container,
    delete_quietly,
    events_with,
    eventually,
    is_true,
    messages,
    unique,
)
from tests.e2e.test_gangcheck import (  # noqa: F401 (fixtures)
    ARRIVED_FOR,
    ATOMIC,
    BIG,
    GPU,
    GPU_TYPE,
    NODE_GROUP_LABEL,
    SIM_CLASS,
    SIM_POOL,
    SMALL,
    SimCloud,
    Timeline,
    _drain_and_delete_new_nodes,
    attempt_record,
    check_state,
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
    until,
    workdir,
    workload_of,
)

Obj = dict[str, Any]
#: The autoscaler's group of the kept-nodes test alone (tests/e2e/conftest.py): no other test
#: selects its label or tolerates its taint, and it holds 2 nodes at most.
KEPT = E2E_NODE_GROUPS[2]


def in_order(small_deadline: int) -> Obj:
    """The small group first, the big one next; Kueue's retries left at none, so only a
    fallback inside the attempt can start the gang."""
    return {
        "managedResources": [GPU],
        "capacitySources": [
            {
                "name": "small-pool",
                "nodeSelector": {NODE_GROUP_LABEL: SMALL.name},
                "deadlineSeconds": small_deadline,
            },
            {"name": "big-pool", "nodeSelector": {NODE_GROUP_LABEL: BIG.name}},
        ],
        "retryStrategy": {"backoffLimitCount": 0, "backoffBaseSeconds": 1},
        "fulfillment": {
            "mode": "NodesFit",
            "deadlineSeconds": 120,
            "startDeadlineSeconds": 120,
            "reclaimer": "DeleteNode",
        },
    }


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("controller")
async def test_in_order_the_gang_runs_from_the_second_source_when_the_first_cannot_hold_it(
    kube: Kube, namespace: str, cluster: Cluster
) -> None:
    count = SMALL.max + 1
    assert BIG.max >= count
    small, big = f"{NODE_GROUP_LABEL}={SMALL.name}", f"{NODE_GROUP_LABEL}={BIG.name}"
    assert await nodes_with(kube, small) == []
    before = {n["metadata"]["name"] for n in await nodes_with(kube, big)}
    timeline = Timeline()
    # the flavor leaves the node group open: each source's node labels choose it
    async with gpu_queue(kube, namespace, {GPU_TYPE: "e2e"}, ours=in_order(60)) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, SMALL.gpus), namespace)
        try:

            async def all_running() -> list[Obj] | None:
                workload = await workload_of(kube, namespace, job)
                timeline.see(check_state(workload, queue.check))
                pods = running(await job_pods(kube, namespace, "gang"))
                return pods if len(pods) == count else None

            pods = await until(all_running, timeout=180, what="the gang Running", timeline=timeline)
            started_after = time.monotonic() - began
            workload = await workload_of(kube, namespace, job)
            assert workload is not None and is_true(workload, "Admitted")
            name = workload["metadata"]["name"]
            first, second = f"{name}-{queue.check}-1", f"{name}-{queue.check}-1-s1"
            # the gang runs on the second source's nodes, pinned there by its podSetUpdates
            on_big = {n["metadata"]["name"] for n in await nodes_with(kube, big)} - before
            assert {p["spec"]["nodeName"] for p in pods} <= on_big, (pods, on_big)
            assert await nodes_with(kube, small) == [], "a node was left in the first source"
            # durable records: one attempt, two requests, the first source left with a reason
            record = await attempt_record(kube, workload, queue.check)
            assert record.requests == sorted([first, second]), record
            assert not record.went_to("Retry"), record
            events = await events_with(kube, workload, "CapacitySourceFailed")
            (left,) = messages(events, "CapacitySourceFailed")
            assert "'small-pool'" in left and "'big-pool'" in left, left
            assert "CapacityIsNotFound" in left, left
            assert (workload["status"].get("admissionChecks") or [{}])[0].get("retryCount", 0) == 0

            async def first_gone() -> bool:
                listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
                return first not in {r["metadata"]["name"] for r in listing["items"]}

            await eventually(first_gone, timeout=30, what=f"{first} withdrawn")
            cluster.record(
                f"g. capacity sources InOrder, real CA, {count} pods x {SMALL.gpus} GPUs, "
                f"{SMALL.name} (max {SMALL.max}) then {BIG.name}: Running after "
                f"{started_after:.1f}s on {len(on_big)} {BIG.name} nodes, 0 nodes in "
                f"{SMALL.name}, no Kueue retry; left the first: {left}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            await _drain_and_delete_new_nodes(kube, namespace, big, before)


def race(slow: str, fast: str) -> Obj:
    return {
        "managedResources": [GPU],
        "allowCustomProvisioningClass": True,
        "capacitySources": [
            {"name": "slow", "provisioningClassName": SIM_CLASS, "nodeSelector": {SIM_POOL: slow}},
            {"name": "fast", "provisioningClassName": SIM_CLASS, "nodeSelector": {SIM_POOL: fast}},
        ],
        "capacitySourcePolicy": "Race",
        "retryStrategy": {"backoffLimitCount": 0, "backoffBaseSeconds": 1},
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 120, "reclaimer": "DeleteNode"},
    }


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("controller")
async def test_race_the_fast_source_wins_and_the_slow_ones_arrivals_are_reclaimed(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    sim: SimCloud,  # noqa: F811
) -> None:
    """Simulated cloud (it creates real Node objects): the slow pool delivers one node at
    once and the rest a minute later; the fast pool the whole gang in about a second."""
    count = 3
    slow, fast = unique("slow"), unique("fast")
    sim.configure(
        sim_group(slow, 4),
        {"name": f"slow-{slow}", "match": {"name": ".*-1"}, "nodeDelaySeconds": [0, 60, 60]},
    )
    sim.configure(
        sim_group(fast, 4),
        {"name": f"fast-{fast}", "match": {"name": ".*-1-s1"}, "nodeDelaySeconds": 3},
    )
    async with gpu_queue(kube, namespace, {GPU_TYPE: "e2e"}, ours=race(slow, fast)) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, 8), namespace)
        try:
            pods = await job_running(kube, namespace, "gang", count)
            started_after = time.monotonic() - began
            on_fast = {n["metadata"]["name"] for n in await nodes_with(kube, f"{SIM_POOL}={fast}")}
            assert {p["spec"]["nodeName"] for p in pods} <= on_fast, (pods, on_fast)

            workload = await workload_of(kube, namespace, job)
            assert workload is not None
            loser = f"{workload['metadata']['name']}-{queue.check}-1"

            async def slow_gone() -> bool:
                listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
                left = {r["metadata"]["name"] for r in listing["items"]}
                return loser not in left and await nodes_with(kube, f"{SIM_POOL}={slow}") == []

            # the slow pool's early node is reclaimed, and no more come: its request is gone
            # (withdrawn once the winner is written: the gang may run before it is)
            await eventually(slow_gone, timeout=60, what="the slow request and arrivals gone")
            events = await events_with(kube, workload, "CapacityRaceWon", "ReclaimingArrivals")
            (won,) = messages(events, "CapacityRaceWon")
            assert "'fast'" in won, won
            # the slow pool's first node had arrived: the withdrawal reclaimed it, and said so
            reclaiming = messages(events, "ReclaimingArrivals")
            assert any(slow in m for m in reclaiming), reclaiming
            cluster.record(
                f"i. capacity sources Race, sim cloud, {count} x 8 GPUs, a slow pool (1 node at "
                f"once, the rest after 60 s) and a fast one (all after 3 s): Running after "
                f"{started_after:.1f}s on the fast pool; the slow pool's arrival reclaimed, 0 "
                f"nodes left there; {won}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            for pool in (slow, fast):
                await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))


def in_order_sim(first: str, second: str, first_deadline: int) -> Obj:
    return {
        "managedResources": [GPU],
        "allowCustomProvisioningClass": True,
        "capacitySources": [
            {
                "name": "first",
                "provisioningClassName": SIM_CLASS,
                "nodeSelector": {SIM_POOL: first},
                "deadlineSeconds": first_deadline,
            },
            {
                "name": "second",
                "provisioningClassName": SIM_CLASS,
                "nodeSelector": {SIM_POOL: second},
            },
        ],
        "retryStrategy": {"backoffLimitCount": 0, "backoffBaseSeconds": 1},
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 120, "reclaimer": "DeleteNode"},
    }


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("controller")
async def test_in_order_a_source_that_stops_short_is_topped_up_and_the_gang_runs_on_both(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    sim: SimCloud,  # noqa: F811
) -> None:
    """Simulated cloud (it creates real Node objects): the first pool delivers one node of the
    three the gang needs and no more; past its 10 s deadline that node is kept, the second
    pool is asked for the other two, and kube-scheduler runs the gang on both pools' nodes."""
    count = 3
    first, second = unique("first"), unique("second")
    sim.configure(
        sim_group(first, 4), {"name": f"short-{first}", "match": {"name": ".*-1"}, "deliver": 1}
    )
    sim.configure(sim_group(second, 4))
    spec = in_order_sim(first, second, 10)
    async with gpu_queue(kube, namespace, {GPU_TYPE: "e2e"}, ours=spec) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, 8), namespace)
        try:
            pods = await job_running(kube, namespace, "gang", count)
            started_after = time.monotonic() - began
            on_first = {
                n["metadata"]["name"] for n in await nodes_with(kube, f"{SIM_POOL}={first}")
            }
            on_second = {
                n["metadata"]["name"] for n in await nodes_with(kube, f"{SIM_POOL}={second}")
            }
            assert len(on_first) == 1 and len(on_second) == 2, (on_first, on_second)
            # the first pool's node was kept and runs a member: nothing of it was reclaimed
            assert {p["spec"]["nodeName"] for p in pods} == on_first | on_second, pods
            workload = await workload_of(kube, namespace, job)
            assert workload is not None
            name = workload["metadata"]["name"]
            kept, topped = f"{name}-{queue.check}-1", f"{name}-{queue.check}-1-s1"
            listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
            by_name = {r["metadata"]["name"]: r for r in listing["items"]}
            assert set(by_name) == {kept, topped}, set(by_name)
            assert [p["count"] for p in by_name[topped]["spec"]["podSets"]] == [2]
            assert by_name[topped]["metadata"]["annotations"]["gangcheck.io/kept-from"] == kept
            events = await events_with(kube, workload, "CapacityToppedUp")
            (said,) = messages(events, "CapacityToppedUp")
            assert all(n in said for n in on_first), said
            assert not messages(events, "ReclaimingArrivals")
            cluster.record(
                f"j. capacity sources InOrder topped up, sim cloud, {count} x 8 GPUs, the first "
                f"pool delivering 1 node and no more (deadline 10 s), the second all: Running "
                f"after {started_after:.1f}s on 1 + 2 nodes, nothing reclaimed; {said}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            for pool in (first, second):
                await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))


def booking(name: str, count: int) -> tuple[Obj, Obj]:
    """Someone else's ProvisioningRequest of cluster-autoscaler's own class, for ``count``
    nodes of the kept-nodes test's group (a PodTemplate and the request): what makes the
    autoscaler add nodes to that group here. Its pods tolerate every taint, gangcheck's hold
    among them, so that while it stands its booking sits on the nodes it got (held or not)."""
    template = {
        "metadata": {"name": name},
        "template": {
            "spec": {
                "containers": [container({"cpu": "1", "memory": "1Gi", GPU: "8"}, {GPU: "8"})],
                "nodeSelector": {**KEPT.labels, NODE_GROUP_LABEL: KEPT.name},
                "tolerations": [{"operator": "Exists"}],
            }
        },
    }
    request = {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name},
        "spec": {
            "provisioningClassName": ATOMIC,
            "podSets": [{"podTemplateRef": {"name": name}, "count": count}],
        },
    }
    return template, request


async def kept_nodes_story(
    kube: Kube,
    namespace: str,
    *,
    group: str,
    first: str,
    other: Obj,
    gangcheck: ManagedProcess | None,
) -> str:
    """What the autoscaler and gangcheck did with the kept-nodes test's group, for its failure
    message: each node's age, record, taints and readiness, both requests' conditions, and
    gangcheck's log lines naming a node of the group or the gang's request."""

    def conditions(req: Obj | None) -> list[tuple[str, str, str, str]]:
        found = (req or {}).get("status", {}).get("conditions") or []
        return [
            (c["type"], c["status"], c.get("reason", ""), c.get("lastTransitionTime", ""))
            for c in found
        ]

    nodes = await nodes_with(kube, group)
    seen = [
        (
            n["metadata"]["name"],
            n["metadata"]["creationTimestamp"],
            (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR),
            [t["key"] for t in (n.get("spec") or {}).get("taints") or []],
            [
                (c["type"], c["status"], c.get("lastTransitionTime", ""))
                for c in (n.get("status") or {}).get("conditions") or []
                if c.get("type") == "Ready"
            ],
        )
        for n in nodes
    ]
    ours = await kube.get_if_exists(PROVISIONING_REQUEST, first, namespace)
    theirs = await kube.get_if_exists(PROVISIONING_REQUEST, other["metadata"]["name"], namespace)
    names = {first, *(n["metadata"]["name"] for n in nodes)}
    lines = []
    if gangcheck is not None:
        lines = [
            line
            for line in gangcheck.log_path.read_text(errors="replace").splitlines()
            if any(name in line for name in names)
        ][-12:]
    made = (ours or {}).get("metadata", {}).get("creationTimestamp")
    return (
        f"nodes of {KEPT.name} (name, created, arrived-for, taints, Ready): {seen}; "
        f"{first} created {made}: {conditions(ours)}; "
        f"{other['metadata']['name']}: {conditions(theirs)}; gangcheck said: {lines}"
    )


async def fail_request(kube: Kube, name: str, namespace: str, message: str) -> None:
    """As the cloud giving up on a request: its Failed condition set, the others kept."""
    current = await kube.get(PROVISIONING_REQUEST, name, namespace)
    conditions = [
        c for c in (current.get("status") or {}).get("conditions") or [] if c["type"] != "Failed"
    ]
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "CapacityIsNotFound",
        "message": message,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    patch = {
        "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
        "status": {"conditions": [*conditions, failed]},
    }
    await kube.merge_patch(PROVISIONING_REQUEST, name, patch, namespace, subresource="status")


@pytest.mark.timeout(300)
async def test_in_order_kept_nodes_outlive_the_autoscalers_unneeded_time_until_the_gang_runs(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    sim: SimCloud,  # noqa: F811
    controller: ManagedProcess | None,  # noqa: F811
) -> None:
    """Real cluster-autoscaler (scale-down-unneeded-time 10 s in the test bed): the gang's
    first source stops short after two of its three nodes arrived in an autoscaler group, and
    fails; the two are kept, and the second source (the simulated cloud) delivers the third
    node only 45 s later. While kept, gangcheck marks the two
    ``cluster-autoscaler.kubernetes.io/scale-down-disabled`` (with its record), so they are
    still there and the gang runs on them; once it runs the mark is taken off.

    Before that mark, the failed request had no booking in the autoscaler (it books only
    Provisioned requests of its own classes) and the two held, empty nodes were scale-down
    candidates: the autoscaler deleted them within the 45 s, the third node arrived to a gang
    that no longer fitted, and the gang never ran (run with the guard left out: "timed out
    after 150s waiting for gang Running"; gangcheck later rolled the top-up back, "the gang
    did not fit within 120s (1 of 3 members placeable on 1 node)").

    The first source is the simulated cloud's class pinned to the group, saying Provisioned
    and delivering nothing itself; the two nodes come from the autoscaler, scaled up for
    someone else's request of its own class, as nodes of a group gangcheck asked for arrive.
    That request is deleted once the mark is on both nodes: from then on only the mark keeps
    them.

    The group is this test's own (``e2e-gpu-kept``, max 2, docs/testing.md): on the shared
    ``e2e-gpu`` (max 4) the autoscaler's first write of ``Provisioned`` on someone else's
    request often loses a conflict (docs/testbed.md), and its next loop, 2 s later, sizes the
    request again. Unless the test had deleted the request by then, gangcheck's hold had
    taken the two nodes from it (its pods tolerated only the GPU taint), the autoscaler added
    two more, gangcheck rightly claimed a third for the gang of three, and never exactly two
    were recorded ("timed out after 90s waiting for 2 nodes recorded", once in a loaded full
    run)."""
    count = 3
    group = f"{NODE_GROUP_LABEL}={KEPT.name}"
    gpu_type = KEPT.labels[GPU_TYPE]

    async def group_empty() -> bool:  # a cluster of GANGCHECK_E2E_KUBECONFIG may have had a run
        return not await nodes_with(kube, group)

    await eventually(group_empty, timeout=90, what=f"no node in {KEPT.name}")
    ghost, second = unique("ghost"), unique("second")
    # this test's rules first: an earlier test's rule (any namespace) may match its names too
    sim.scenarios[:0] = [
        {"name": f"nothing-{ghost}", "match": {"namespace": namespace, "name": ".*-1"},
         "deliver": 0},
        {"name": f"late-{second}", "match": {"namespace": namespace, "name": ".*-1-s1"},
         "provisionAfterSeconds": 45},
    ]  # fmt: skip
    sim.groups.append(
        {**sim_group(ghost, 4), "labels": {**KEPT.labels, NODE_GROUP_LABEL: KEPT.name}}
    )
    sim.configure({**sim_group(second, 4), "labels": {**KEPT.labels, SIM_POOL: second}})
    spec = in_order_sim(ghost, second, 240)
    spec["capacitySources"][0]["nodeSelector"] = {NODE_GROUP_LABEL: KEPT.name}
    gang = gang_job("gang", count, 8, {GPU_TYPE: gpu_type})
    gang["spec"]["template"]["spec"]["tolerations"].append(KEPT_TAINT.toleration())
    async with gpu_queue(kube, namespace, {GPU_TYPE: gpu_type}, ours=spec) as queue:
        job = await kube.create(JOB, gang, namespace)
        template, other = booking("someone-else", 2)
        try:

            async def made() -> Obj | None:
                return await workload_of(kube, namespace, job)

            workload = await eventually(made, timeout=60, what="the Workload")
            first = f"{workload['metadata']['name']}-{queue.check}-1"
            topped = f"{first}-s1"
            key = f"{namespace}/{first}"

            async def provisioned() -> bool:  # made once Kueue reserves quota: maybe not yet
                req = await kube.get_if_exists(PROVISIONING_REQUEST, first, namespace)
                return req is not None and is_true(req, "Provisioned")

            await eventually(provisioned, timeout=60, what=f"{first} Provisioned")
            # the autoscaler adds two nodes to the group, for someone else's request
            made = await kube.create(POD_TEMPLATE, template, namespace)
            # A node counts as arrived for the request only when created in a later second than
            # the request (creationTimestamp has whole seconds: fulfillment.proven_younger); the
            # simulated cloud says Provisioned 0.5 s after the request and the autoscaler may
            # scale up within that same second: its nodes then count as capacity that was there
            # before and are never recorded (the likely cause of CI's one "timed out waiting for
            # 2 nodes recorded": its reason, CapacityIsFound at the first write that held, says
            # the nodes came from the autoscaler's loop before). The API server's own stamp on
            # the template says whether its clock has left the request's second.
            asked = (await kube.get(PROVISIONING_REQUEST, first, namespace))["metadata"]
            if made["metadata"]["creationTimestamp"] <= asked["creationTimestamp"]:
                await asyncio.sleep(1.0)
            await kube.create(PROVISIONING_REQUEST, other, namespace)

            async def arrived() -> list[str] | None:
                nodes = await nodes_with(kube, group)
                mine = [
                    n["metadata"]["name"]
                    for n in nodes
                    if (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR) == key
                ]
                return sorted(mine) if len(mine) == 2 else None

            try:
                kept = await eventually(arrived, timeout=90, what=f"2 nodes recorded for {first}")
            except AssertionError as e:  # what the autoscaler and gangcheck did instead
                said = await kept_nodes_story(
                    kube, namespace, group=group, first=first, other=other, gangcheck=controller
                )
                raise AssertionError(f"{e}; {said}") from e
            await fail_request(kube, first, namespace, "the cloud gave up")

            async def marked() -> bool:
                for name in kept:
                    notes = (await kube.get(NODE, name))["metadata"].get("annotations") or {}
                    if (
                        notes.get(SCALE_DOWN_DISABLED) != "true"
                        or notes.get(SCALE_DOWN_GUARD) != key
                    ):
                        return False
                return True

            await eventually(marked, timeout=30, what="the kept nodes marked")
            # from here only the mark keeps them: someone else's booking goes
            await delete_quietly(kube, PROVISIONING_REQUEST, other["metadata"]["name"], namespace)
            kept_at = time.monotonic()

            pods = await job_running(kube, namespace, "gang", count, timeout=150)
            ran_after = time.monotonic() - kept_at
            on_second = {
                n["metadata"]["name"] for n in await nodes_with(kube, f"{SIM_POOL}={second}")
            }
            assert len(on_second) == 1, on_second
            # the kept nodes outlived the autoscaler's unneeded time and run two members
            assert {p["spec"]["nodeName"] for p in pods} == {*kept, *on_second}, pods
            req = await kube.get(PROVISIONING_REQUEST, topped, namespace)
            assert req["metadata"]["annotations"]["gangcheck.io/kept-from"] == first
            events = await events_with(kube, workload, "CapacityToppedUp")
            (said,) = messages(events, "CapacityToppedUp")
            assert all(n in said for n in kept), said

            async def unguarded() -> bool:
                for name in kept:
                    notes = (await kube.get(NODE, name))["metadata"].get("annotations") or {}
                    if SCALE_DOWN_DISABLED in notes or SCALE_DOWN_GUARD in notes:
                        return False
                return True

            await eventually(unguarded, timeout=30, what="the mark taken off the kept nodes")
            cluster.record(
                f"k. capacity sources InOrder topped up, real CA (unneeded time 10 s), "
                f"{count} x 8 GPUs, 2 nodes of {KEPT.name} kept after the first source failed, "
                f"the third from the second source 45 s later: Running {ran_after:.1f}s after "
                f"someone else's booking went, on the kept nodes and the new one"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            await delete_quietly(kube, PROVISIONING_REQUEST, other["metadata"]["name"], namespace)

            async def withdrawn() -> bool:  # gangcheck done in the namespace before it goes
                listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
                return not listing["items"]

            await eventually(withdrawn, timeout=90, what="gangcheck's requests withdrawn")
            await _drain_and_delete_new_nodes(kube, namespace, group, set())
            await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={second}"))
