"""Capacity that arrives for a gang is held for it, on a real kube-apiserver.

The test plays Kueue core and the cloud (it creates the Node objects) and, where pods are
bound, the scheduler (nodeName set at creation). What the hold does to kube-scheduler itself
is proven end to end (tests/e2e/test_hold.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.kube.resources import NODE, PROVISIONING_REQUEST
from gangcheck.logic.attempt.hold import ARRIVING_TAINT, HOLD_TAINT, hold_taint, hold_toleration
from tests.integration.harness import Cluster, RunningController, eventually
from tests.integration.test_fulfillment import arrived_for, fit, gang, req_name

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
DEDICATED = {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"}


def holds(node: Obj) -> list[Obj]:
    return [t for t in node["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]


async def taints_of(cluster: Cluster, name: str) -> list[Obj]:
    return list((await cluster.kube.get(NODE, name))["spec"].get("taints") or [])


async def test_arrived_nodes_are_held_for_the_gang_until_every_member_is_scheduled(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=60))
    builder = gang(members=2, tolerations=[{**DEDICATED, "operator": "Equal"}])
    await cluster.submit(builder)
    name = req_name(cluster)
    key = f"{cluster.ns}/{name}"
    await cluster.set_request_conditions(name, {"Accepted": "", "Provisioned": "resize done"})
    nodes = await cluster.add_nodes(2, gpu=1, taints=[DEDICATED])
    check = await cluster.wait_check("wl", "Ready")
    assert await arrived_for(cluster, name) == sorted(nodes)
    for node in nodes:
        # Held, in the same write that recorded the arrival; another controller's taint kept.
        assert await taints_of(cluster, node) == [DEDICATED, hold_taint(key)]
    # The gang's pods tolerate the hold on exactly its nodes.
    for update in check["podSetUpdates"]:
        assert update["tolerations"] == [hold_toleration(key)]

    # As Kueue admitting and kube-scheduler binding the gang onto its nodes.
    await cluster.set_workload_condition("wl", "Admitted")
    for i, node in enumerate(nodes):
        await cluster.create_pod(f"member-{i}", node_name=node, consume=name)

    async def started() -> Obj | None:
        req = await cluster.request(name)
        notes = (req or {}).get("metadata", {}).get("annotations") or {}
        return req if notes.get("gangcheck.io/phase") == "Started" else None

    await eventually(started, what="the request marked Started")

    async def released() -> bool:
        return all([await taints_of(cluster, n) == [DEDICATED] for n in nodes])

    await eventually(released, what="the hold lifted, the other taint kept")


async def test_a_node_held_for_one_gang_is_not_counted_for_another(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=60))
    await cluster.submit(gang("first", members=1))
    first = req_name(cluster, "first")
    await cluster.set_request_conditions(first, {"Accepted": "", "Provisioned": "done"})
    (node,) = await cluster.add_nodes(1, gpu=1)
    await cluster.wait_check("first", "Ready")
    assert holds(await cluster.kube.get(NODE, node)) == [hold_taint(f"{cluster.ns}/{first}")]

    # A second gang that would fit on that node were it free: it waits for its own capacity.
    await cluster.submit(gang("second", members=1))
    second = req_name(cluster, "second")
    await cluster.set_request_conditions(second, {"Accepted": "", "Provisioned": "done"})
    entry = await eventually(
        lambda: _message(cluster, "second", "0 of 1"), what="the second gang not placeable"
    )
    assert entry["state"] == "Pending"
    assert await arrived_for(cluster, second) == []


async def test_a_rollback_lifts_the_hold_from_a_node_it_keeps(
    cluster: Cluster, controller: RunningController
) -> None:
    # The deadline is shortened to 4 s only once the arrival is recorded and the pod bound to
    # it: from the request's creation, those steps raced it on a loaded machine (about 3 s of
    # slack on two cores). A deadline change applies at once: it has passed, the rollback
    # follows.
    await cluster.install_check(fit(deadline=60))
    await cluster.submit(gang(members=4))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (node,) = await cluster.add_nodes(1, gpu=1)
    await eventually(lambda: _arrived(cluster, name, node), what="the arrival recorded")
    # A pod bound to it anyway (nodeName set directly, past every taint): the node is kept.
    await cluster.create_pod("someone-else", node_name=node)
    await cluster.set_config(fit(deadline=4))
    check = await cluster.wait_check("wl", "Retry", timeout=20)
    assert "kept" in check["message"], check["message"]

    async def unheld() -> bool:
        return holds(await cluster.kube.get(NODE, node)) == []

    await eventually(unheld, what="the hold lifted from the kept node")


async def _arrived(cluster: Cluster, request: str, node: str) -> bool:
    return node in await arrived_for(cluster, request)


async def _message(cluster: Cluster, workload: str, text: str) -> Any:
    entry = await cluster.check_state(workload)
    return entry if text in entry["message"] else None


ARRIVING = {"key": ARRIVING_TAINT, "value": "true", "effect": "NoSchedule"}


async def test_a_node_registering_closed_is_recorded_and_held_for_the_gang_it_came_for(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=60))
    await cluster.submit(gang(members=1))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Accepted": "", "Provisioned": "resize done"})
    (node,) = await cluster.add_nodes(1, gpu=1, taints=[ARRIVING])
    await cluster.wait_check("wl", "Ready")
    assert await arrived_for(cluster, name) == [node]
    # The arrival taint gave way to the hold, in the write that recorded the node.
    assert await taints_of(cluster, node) == [hold_taint(f"{cluster.ns}/{name}")]


async def test_a_node_registering_closed_that_no_gang_may_record_is_opened(
    cluster: Cluster, controller: RunningController
) -> None:
    """Opened at once when no request in flight could use it (the rule's table is in
    tests/unit/test_hold.py); requests other tests left in this shared control plane may be
    such a request, so the backstop is shortened here to keep the outcome certain."""
    assert controller.controller is not None
    controller.controller.arrival_reconciler.open_after_seconds = 3.0
    (node,) = await cluster.add_nodes(1, gpu=1, taints=[ARRIVING, DEDICATED])

    async def opened() -> bool:
        return await taints_of(cluster, node) == [DEDICATED]

    await eventually(opened, what="the node opened, its other taint kept")


async def test_a_ready_gangs_request_deleted_by_hand_has_its_hold_lifted(
    cluster: Cluster, controller: RunningController
) -> None:
    """The request a Ready gang was given capacity by is deleted outside gangcheck: the hold
    naming it is lifted from its nodes (no request is left whose record would lift it), the
    other taint kept, and a HoldLifted Warning Event on the Workload names the nodes; the
    check stays Ready and nothing is asked again."""
    await cluster.install_check(fit(deadline=60))
    await cluster.submit(gang(members=2, tolerations=[{**DEDICATED, "operator": "Equal"}]))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Accepted": "", "Provisioned": "resize done"})
    nodes = await cluster.add_nodes(2, gpu=1, taints=[DEDICATED])
    await cluster.wait_check("wl", "Ready")
    await cluster.kube.delete(PROVISIONING_REQUEST, name, cluster.ns)
    await cluster.wait_request_gone(name)

    async def released() -> bool:
        return all([await taints_of(cluster, n) == [DEDICATED] for n in nodes])

    await eventually(released, what="the hold lifted, the other taint kept")
    (event,) = await cluster.wait_events("HoldLifted", about="wl")
    assert event["type"] == "Warning"
    assert all(n in event["message"] for n in nodes), event["message"]
    assert (await cluster.check_state("wl"))["state"] == "Ready"
    assert await cluster.request(name) is None
