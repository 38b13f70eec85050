"""InOrder tops up instead of throwing away (issue 32) on a real kube-apiserver: a capacity
source that stops short after part of the gang arrived keeps its nodes for the attempt and the
next source is asked only for the rest; the gang turns Ready on both sources' nodes; when the
attempt ends without the gang, the kept nodes are reclaimed by their own request's record.
While kept, those nodes carry cluster-autoscaler's scale-down-disabled with gangcheck's record,
taken off (only where gangcheck set it) when the gang starts or the attempt is rolled back.
A source removed from the config mid-attempt (the attempt follows the source it was made
with): rolled back naming it before Provisioned, kept and pinned to its nodes after.

The test plays Kueue core and the cloud (it creates the Nodes); gangcheck runs as its process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gangcheck.kube.resources import NODE, PROVISIONING_REQUEST
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.hold import hold_toleration
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, RunningController, eventually, now

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
ARRIVED = "gangcheck.io/arrived-for"
CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"


def sources(deadline_a: int = 8, *, third: bool = False) -> dict[str, Any]:
    """Sources a (its deadline `deadline_a` s from its request's creation) and b (and c, with
    `third`). The tests make a's nodes before that deadline: 8 s leaves room for a loaded
    machine's round trips (4 s was overrun once with three test workers on two cores)."""
    return {
        "capacitySources": [
            {"name": "a", "nodeSelector": {"src": "a"}, "deadlineSeconds": deadline_a},
            {"name": "b", "nodeSelector": {"src": "b"}},
            *([{"name": "c", "nodeSelector": {"src": "c"}}] if third else []),
        ],
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 60, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
    }


def gang() -> WorkloadBuilder:
    return WorkloadBuilder("wl").pod_set("workers", 4, pod_template(gpu=1)).reserve_quota().check()


async def kept_then_topped_up(
    cluster: Cluster, config: dict[str, Any] | None = None
) -> tuple[str, str, list[str]]:
    """Source a delivers 2 of 4 nodes and no more; past its deadline it is kept and source b
    asked for the other 2 (under `config`, else `sources()`). Returns (a's request, b's
    request, a's nodes)."""
    await cluster.install_check(config or sources())
    await cluster.submit(gang())
    a = naming.request_name("wl", cluster.check, 1)
    b = naming.request_name("wl", cluster.check, 1, 1)
    await cluster.set_request_conditions(a, {"Accepted": "", "Provisioned": "resize done"})
    from_a = await cluster.add_nodes(2, labels={"src": "a"})
    made = await cluster.wait_request(b, timeout=30)
    assert [p["count"] for p in made["spec"]["podSets"]] == [2]
    notes = made["metadata"]["annotations"]
    assert notes["gangcheck.io/kept-from"] == a
    assert notes["gangcheck.io/kept-members"] == "2"
    kept = await cluster.request(a)
    assert kept is not None, "the source left is not withdrawn while its nodes are kept"
    record = kept["metadata"]["annotations"]
    assert record["gangcheck.io/phase"] == "Kept"
    assert sorted(json.loads(record["gangcheck.io/rollback-nodes"])) == sorted(from_a)
    assert record["gangcheck.io/rollback-reason"].startswith("Deadline: ")
    return a, b, from_a


async def test_a_source_that_stops_short_is_topped_up_and_the_gang_fits_on_both(
    cluster: Cluster, controller: RunningController
) -> None:
    a, b, from_a = await kept_then_topped_up(cluster)
    nodes = {n["metadata"]["name"]: n for n in await cluster.nodes()}
    assert sorted(nodes) == sorted(from_a), "nothing of source a is reclaimed"
    assert all(nodes[n]["metadata"]["annotations"][ARRIVED] == f"{cluster.ns}/{a}" for n in from_a)

    await cluster.set_request_conditions(b, {"Accepted": "", "Provisioned": "resize done"})
    from_b = await cluster.add_nodes(2, labels={"src": "b"})
    check = await cluster.wait_check("wl", "Ready", timeout=30)
    update = check["podSetUpdates"][0]
    assert update["annotations"][CONSUME] == b
    assert "src" not in (update.get("nodeSelector") or {})
    for request in (a, b):
        assert hold_toleration(f"{cluster.ns}/{request}") in update["tolerations"]
    for request in (a, b):
        req = await cluster.request(request)
        assert req is not None
        assert req["metadata"]["annotations"]["gangcheck.io/phase"] == "Fulfilled"
    assert sorted(n["metadata"]["name"] for n in await cluster.nodes()) == sorted(from_a + from_b)
    topped = await cluster.wait_events("CapacityToppedUp", about="wl")
    assert b in topped[0]["message"] and all(n in topped[0]["message"] for n in from_a)


async def test_a_top_up_whose_source_stocks_out_too_is_withdrawn_and_the_next_asked(
    cluster: Cluster, controller: RunningController
) -> None:
    """a kept with 2 of 4 nodes, b asked for the other 2 says CapacityIsNotFound: b, which
    delivered nothing, is withdrawn (the autoscaler stops retrying it), a stays kept with its
    nodes, and c is asked for the 2, topping a up. (Before: b was marked Kept for a's nodes
    and left in flight, and c topped up both.)"""
    a, b, from_a = await kept_then_topped_up(cluster, sources(third=True))
    when = now()
    refused = {
        "conditions": [
            {
                "type": "Accepted",
                "status": "True",
                "reason": "Accepted",
                "message": "",
                "lastTransitionTime": when,
            },
            {
                "type": "Provisioned",
                "status": "False",
                "reason": "CapacityIsNotFound",
                "message": "Capacity is not found, CA will try to find it later.",
                "lastTransitionTime": when,
            },
        ]
    }
    await cluster.update_request_status(b, lambda status: status.update(refused))
    c = naming.request_name("wl", cluster.check, 1, 2)
    made = await cluster.wait_request(c, timeout=30)
    assert [p["count"] for p in made["spec"]["podSets"]] == [2]
    assert made["metadata"]["annotations"]["gangcheck.io/kept-from"] == a

    async def b_gone() -> bool:
        return await cluster.request(b) is None

    await eventually(b_gone, what=f"{b}, which delivered nothing, withdrawn")
    kept = await cluster.request(a)
    assert kept is not None and kept["metadata"]["annotations"]["gangcheck.io/phase"] == "Kept"
    assert sorted(n["metadata"]["name"] for n in await cluster.nodes()) == sorted(from_a)
    failed = await cluster.wait_events("CapacitySourceFailed", about="wl")
    assert any(b in e["message"] and "CapacityIsNotFound" in e["message"] for e in failed)


async def test_the_attempt_ending_without_the_gang_reclaims_the_kept_nodes_too(
    cluster: Cluster, controller: RunningController
) -> None:
    a, b, from_a = await kept_then_topped_up(cluster)
    await cluster.set_request_conditions(b, {"Accepted": "", "Provisioned": "resize done"})
    from_b = await cluster.add_nodes(1, labels={"src": "b"})

    async def recorded() -> bool:
        nodes = await cluster.nodes()
        return any(
            (n["metadata"].get("annotations") or {}).get(ARRIVED) == f"{cluster.ns}/{b}"
            for n in nodes
        )

    await eventually(recorded, what=f"{from_b[0]} recorded for {b}")
    assert {n["metadata"]["name"] for n in await cluster.nodes()} == {*from_a, *from_b}
    await cluster.set_request_conditions(b, {"Failed": "the cloud gave up"})
    check = await cluster.wait_check("wl", "Retry", timeout=30)
    assert "Failed" in check["message"]

    async def gone() -> bool:
        return not await cluster.nodes()

    await eventually(gone, what="every node of the attempt reclaimed")
    for request in (a, b):
        req = await cluster.request(request)
        if req is not None:  # withdrawn once the outcome is written
            assert "gangcheck.io/outcome" in req["metadata"]["annotations"]
    rolled = await cluster.wait_events("RollbackStarted")
    assert {e["involvedObject"]["name"] for e in rolled} >= {"wl"}


async def test_a_restart_between_the_keep_and_the_next_ask_asks_it_from_the_record(
    control_plane: Any, cluster: Cluster
) -> None:
    """The keep is written on a's request before the next ask is made: a controller that
    stops in between (killed, its answer lost) leaves a Kept request and no next one. A fresh
    controller reads the keep from the record and asks b for the rest, once; nothing of a is
    reclaimed, and a's nodes are kept from the autoscaler's scale-down. (The stop is played
    by stopping the controller and writing the keep's record as it leaves it: the harness's
    CrashingController, tried first, did not count the keep's own write among those it cuts
    after, so it could not stop right there.)"""
    await cluster.install_check(sources(deadline_a=60))
    first = RunningController(str(control_plane.kubeconfig))
    await first.start()
    await cluster.submit(gang())
    a = naming.request_name("wl", cluster.check, 1)
    b = naming.request_name("wl", cluster.check, 1, 1)
    await cluster.set_request_conditions(a, {"Accepted": "", "Provisioned": "resize done"})
    from_a = await cluster.add_nodes(2, labels={"src": "a"})

    async def recorded() -> list[Obj]:
        nodes = await cluster.nodes()
        mine = [n for n in nodes if (n["metadata"].get("annotations") or {}).get(ARRIVED)]
        return mine if len(mine) == 2 else []

    arrived = await eventually(recorded, what="a's arrivals recorded")
    await first.stop()
    # as the keep leaves it: a ended, Kept with its nodes, the next ask not made
    await cluster.set_request_conditions(a, {"Failed": "the cloud gave up"})
    nodes = {n["metadata"]["name"]: n["metadata"]["creationTimestamp"] for n in arrived}
    keep = {
        "gangcheck.io/phase": "Kept",
        "gangcheck.io/rollback-reason": "Failed: the cloud gave up",
        "gangcheck.io/rollback-nodes": json.dumps(nodes, sort_keys=True),
    }
    await cluster.kube.merge_patch(
        PROVISIONING_REQUEST, a, {"metadata": {"annotations": keep}}, namespace=cluster.ns
    )
    assert await cluster.request(b) is None

    fresh = RunningController(str(control_plane.kubeconfig))
    await fresh.start()
    try:
        made = await cluster.wait_request(b, timeout=30)
        assert [p["count"] for p in made["spec"]["podSets"]] == [2]
        assert made["metadata"]["annotations"]["gangcheck.io/kept-from"] == a
        await guarded(cluster, from_a, a)  # from the record too: kept from scale-down
        await cluster.set_request_conditions(b, {"Accepted": "", "Provisioned": "resize done"})
        from_b = await cluster.add_nodes(2, labels={"src": "b"})
        await cluster.wait_check("wl", "Ready", timeout=30)
    finally:
        await fresh.stop()
    names = sorted(n["metadata"]["name"] for n in await cluster.nodes())
    assert names == sorted(from_a + from_b), "nothing of source a reclaimed"
    asks = sorted(r["metadata"]["name"] for r in await cluster.requests())
    assert asks == sorted([a, b]), "the next source asked once"


# ---- kept nodes and cluster-autoscaler's scale-down (logic/attempt/scaledown.py) ---------

SDD = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
GUARD = "gangcheck.io/scale-down-disabled-for"


async def annotations_of(cluster: Cluster, name: str) -> dict[str, str]:
    return dict((await cluster.kube.get(NODE, name))["metadata"].get("annotations") or {})


async def guarded(cluster: Cluster, nodes: list[str], request: str) -> None:
    """Wait until each of `nodes` carries the guard gangcheck sets for `request`."""

    async def all_guarded() -> bool:
        for n in nodes:
            notes = await annotations_of(cluster, n)
            if notes.get(SDD) != "true" or notes.get(GUARD) != f"{cluster.ns}/{request}":
                return False
        return True

    await eventually(all_guarded, what=f"{', '.join(nodes)} kept from scale-down for {request}")


async def test_a_kept_requests_nodes_are_kept_from_scale_down_until_the_gang_starts(
    cluster: Cluster, controller: RunningController
) -> None:
    """While a is kept, its nodes carry cluster-autoscaler's scale-down-disabled with
    gangcheck's record; a node that carried it already (someone else's) is left as it is,
    never recorded as ours; once the gang's pods are bound (b Started), gangcheck takes off
    what it set and nothing else."""
    await cluster.install_check(sources())
    await cluster.submit(gang())
    a = naming.request_name("wl", cluster.check, 1)
    b = naming.request_name("wl", cluster.check, 1, 1)
    await cluster.set_request_conditions(a, {"Accepted": "", "Provisioned": "resize done"})
    # an administrator's own opt-out, on the node from its creation (before a is kept)
    (theirs,) = await cluster.add_nodes(1, labels={"src": "a"}, annotations={SDD: "true"})
    (ours,) = await cluster.add_nodes(1, labels={"src": "a"})
    await cluster.wait_request(b, timeout=30)
    await guarded(cluster, [ours], a)
    notes = await annotations_of(cluster, theirs)
    assert notes.get(SDD) == "true" and GUARD not in notes, "someone else's is not ours"

    await cluster.set_request_conditions(b, {"Accepted": "", "Provisioned": "resize done"})
    from_b = await cluster.add_nodes(2, labels={"src": "b"})
    await cluster.wait_check("wl", "Ready", timeout=30)
    for n in from_b:  # b's own nodes are booked by the autoscaler: no guard
        assert SDD not in await annotations_of(cluster, n)
    assert (await annotations_of(cluster, ours)).get(GUARD) == f"{cluster.ns}/{a}"

    # As Kueue admitting and kube-scheduler binding the gang onto a's and b's nodes.
    await cluster.set_workload_condition("wl", "Admitted")
    for i, n in enumerate([theirs, ours, *from_b]):
        await cluster.create_pod(f"member-{i}", node_name=n, consume=b)

    async def started() -> bool:
        req = await cluster.request(b)
        notes = (req or {}).get("metadata", {}).get("annotations") or {}
        return notes.get("gangcheck.io/phase") == "Started"

    # Started is the decision's last write, after the guard is taken off (a poll of the guard
    # alone could read b in between, still Fulfilled)
    await eventually(started, what="b marked Started once the gang's pods are bound")
    notes = await annotations_of(cluster, ours)
    assert SDD not in notes and GUARD not in notes, f"the guard taken off {ours}"
    notes = await annotations_of(cluster, theirs)
    assert notes.get(SDD) == "true" and GUARD not in notes, "someone else's stays"


async def test_a_kept_node_given_back_by_the_rollback_does_not_keep_the_guard(
    cluster: Cluster, controller: RunningController
) -> None:
    """The attempt ends without the gang: a's nodes go back by the safe reclaim, which takes
    the guard off first; one the reclaim keeps (opted out of reclaim) stays in the pool
    without it, the other is reclaimed."""
    a, b, from_a = await kept_then_topped_up(cluster)
    await guarded(cluster, from_a, a)
    kept, reclaimed = from_a
    opt_out = {"metadata": {"labels": {"gangcheck.io/do-not-reclaim": "true"}}}
    await cluster.kube.merge_patch(NODE, kept, opt_out)
    await cluster.set_request_conditions(b, {"Accepted": "", "Failed": "the cloud gave up"})
    await cluster.wait_check("wl", "Retry", timeout=30)

    async def given_back() -> bool:
        names = {n["metadata"]["name"] for n in await cluster.nodes()}
        return names == {kept}

    await eventually(given_back, what=f"{reclaimed} reclaimed, {kept} kept")
    notes = await annotations_of(cluster, kept)
    assert SDD not in notes and GUARD not in notes, "a node back in the pool is not guarded"


# ---- the source an attempt was made with, removed from the config mid-attempt -------------

CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"


def three_sources(*, without_b: bool = False) -> dict[str, Any]:
    """a; b and c asking the same class and parameters, on other nodes (b: a DWS-like pool,
    c: spot). Without b, c moves into its index."""
    b = {
        "name": "b",
        "provisioningClassName": CHECK_CAPACITY,
        "parameters": {"x": "1"},
        "nodeSelector": {"src": "b"},
    }
    c = {**b, "name": "c", "nodeSelector": {"src": "c"}}
    listed = [{"name": "a", "nodeSelector": {"src": "a"}}, *([] if without_b else [b]), c]
    return {
        "capacitySources": listed,
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 60, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
    }


async def asking_b(cluster: Cluster) -> str:
    """Source a fails at once: the attempt asks b (index 1). Returns b's request."""
    await cluster.install_check(three_sources())
    await cluster.submit(gang())
    a = naming.request_name("wl", cluster.check, 1)
    b = naming.request_name("wl", cluster.check, 1, 1)
    await cluster.wait_request(a, timeout=30)
    await cluster.set_request_conditions(a, {"Failed": "no capacity in a"})
    made = await cluster.wait_request(b, timeout=30)
    assert made["metadata"]["annotations"]["gangcheck.io/capacity-source"] == "1"
    return b


async def test_a_source_removed_before_provisioned_ends_the_attempt_naming_it(
    cluster: Cluster, controller: RunningController
) -> None:
    """b removed while its request waits: c, now at index 1 with b's class and parameters, is
    not taken for it; the attempt is rolled back and retried under the new list."""
    b = await asking_b(cluster)
    await cluster.set_request_conditions(b, {"Accepted": ""})
    await cluster.set_config(three_sources(without_b=True))
    check = await cluster.wait_check("wl", "Retry", timeout=30)
    said = "ConfigChanged: spec.capacitySources[1] (b) left the config"
    assert said in check["message"]
    rolled = await cluster.wait_events("RollbackStarted", about="wl")
    assert any(said in e["message"] for e in rolled)


async def test_a_source_removed_after_provisioned_keeps_the_gang_on_its_nodes(
    cluster: Cluster, controller: RunningController
) -> None:
    """b removed once its request is Provisioned: the attempt is kept, its nodes arrive in
    b's pool, and the gang is pinned there (not to c's, now at b's index)."""
    b = await asking_b(cluster)
    await cluster.set_request_conditions(b, {"Accepted": "", "Provisioned": "resize done"})

    async def waiting_on_nodes() -> bool:
        state = await cluster.check_state("wl")
        return str(state.get("message", "")).startswith("capacity requested, not yet usable")

    await eventually(waiting_on_nodes, what=f"{b} seen Provisioned")
    await cluster.set_config(three_sources(without_b=True))
    await cluster.add_nodes(4, labels={"src": "b"})
    check = await cluster.wait_check("wl", "Ready", timeout=30)
    for update in check["podSetUpdates"]:
        assert update["nodeSelector"]["src"] == "b"
        assert update["annotations"][CONSUME] == b
