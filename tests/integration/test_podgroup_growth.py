"""A released PodGroup whose minCount is raised and lowered, on a real API server (1.37,
GenericWorkload on). The test plays the webhook (members created gated), kube-scheduler (it
binds the released members) and the autoscaler (request conditions, nodes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    NODE,
    PLUGINS_POD_GROUP,
    POD,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from gangcheck.logic.attempt.hold import HOLD_TAINT
from gangcheck.logic.podgroups import growth
from gangcheck.model.names import (
    ARRIVED_FOR,
    CONFIG_ANNOTATION,
    CONSUME_ANNOTATION,
    MESSAGE_ANNOTATION,
    PHASE_ANNOTATION,
    STARTED,
)
from tests.integration.harness import eventually
from tests.integration.test_podgroups import Groups
from tests.integration.test_podgroups import groups as groups  # noqa: PLC0414 (fixture)
from tests.integration.test_podgroups import provisioner as provisioner  # noqa: PLC0414

pytestmark = pytest.mark.integration
Obj = dict[str, Any]


async def released_and_bound(groups: Groups, name: str, members: int) -> dict[str, str]:
    """A group of `members` released onto nodes that arrived for it, its members bound (as
    kube-scheduler would): pod -> node."""
    for i in range(members):
        await groups.member(f"{name}-{i}", name)
    first = f"{name}-pg-1"
    await groups.cluster.set_request_conditions(first, {"Provisioned": "ok"})
    nodes = await groups.cluster.add_nodes(members, gpu=1)
    await groups.wait_state(name, "Released")
    placed = {f"{name}-{i}": node for i, node in enumerate(nodes)}
    for pod, node in placed.items():
        await groups.bind(pod, node)
    return placed


async def set_min_count(groups: Groups, name: str, count: int) -> None:
    patch = {"spec": {"schedulingPolicy": {"gang": {"minCount": count}}}}
    await groups.kube.merge_patch(UPSTREAM_POD_GROUP_V1BETA1, name, patch, groups.ns)


async def growing(
    groups: Groups, name: str, config: str | None = None
) -> tuple[dict[str, str], Obj]:
    """A group of 2 released and bound, then raised to minCount 4 with its 2 added members
    created (gated): the members placed (pod -> node) and the growth's request once asked."""
    annotations = {CONFIG_ANNOTATION: config} if config else None
    await groups.upstream(name, 2, annotations=annotations)
    placed = await released_and_bound(groups, name, 2)
    await set_min_count(groups, name, 4)
    await groups.member(f"{name}-2", name)
    await groups.member(f"{name}-3", name)
    return placed, await groups.cluster.wait_request(f"{name}-pg-grow-1")


async def said(groups: Groups, name: str, text: str) -> Obj | None:
    obj = await groups.group(name)
    notes = obj["metadata"].get("annotations") or {}
    return obj if text in notes.get(MESSAGE_ANNOTATION, "") else None


async def untouched(groups: Groups, placed: dict[str, str]) -> None:
    for pod, node in placed.items():
        got = await groups.pod(pod)
        assert got["spec"]["nodeName"] == node
        n = await groups.kube.get(NODE, node)
        assert not n["spec"].get("unschedulable")


@pytest.fixture
async def short_deadline(groups: Groups) -> Any:
    config = f"grow-{groups.ns}"
    spec = {
        "fulfillment": {"deadlineSeconds": 3, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 4},
    }
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    yield config
    await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_raised_on_a_running_group_the_added_members_are_provisioned_all_or_nothing(
    groups: Groups,
    provisioner: Any,
    short_deadline: str,
) -> None:
    """minCount 2 -> 4 on a running group: one request for the 2 added; a node for 1 of them
    is rolled back at the deadline (the 2 running untouched, the 2 added still gated); the
    next growth attempt gets both nodes and releases the 2 together, consuming it."""
    placed, first = await growing(groups, "grow", short_deadline)
    assert sum(p["count"] for p in first["spec"]["podSets"]) == 2
    assert first["metadata"]["annotations"][growth.GROWS_ANNOTATION] == "2"
    await groups.cluster.set_request_conditions("grow-pg-grow-1", {"Provisioned": "ok"})
    (one,) = await groups.cluster.add_nodes(1, gpu=1)

    await groups.cluster.wait_events("GrowthRolledBack", timeout=30)
    with pytest.raises(NotFoundError):
        await groups.kube.get(NODE, one)
    assert await groups.gated("grow-2", "grow-3") == [True, True]
    await untouched(groups, placed)
    assert (await groups.group("grow"))["metadata"]["annotations"]["gangcheck.io/state"] == (
        "Released"
    )

    # The next attempt must not race the short deadline: a deadline change applies at once.
    config = await groups.kube.get(ATOMIC_CONFIG, short_deadline)
    config["spec"]["fulfillment"]["deadlineSeconds"] = 60
    await groups.kube.replace(ATOMIC_CONFIG, config)
    await groups.cluster.set_request_conditions("grow-pg-grow-2", {"Provisioned": "ok"})
    await groups.cluster.wait_request_gone("grow-pg-grow-1")
    await groups.cluster.add_nodes(2, gpu=1)

    async def released_together() -> bool | None:
        return True if await groups.gated("grow-2", "grow-3") == [False, False] else None

    await eventually(released_together, timeout=20, what="the 2 added released together")
    for pod in ("grow-2", "grow-3"):
        annotations = (await groups.pod(pod))["metadata"].get("annotations") or {}
        assert annotations.get(CONSUME_ANNOTATION) == "grow-pg-grow-2"
        assert annotations[CONSUME_ANNOTATION] == "grow-pg-grow-2"
    await groups.cluster.wait_events("GangGrown")
    await untouched(groups, placed)

    # Lowered again: nothing members use is withdrawn.
    await set_min_count(groups, "grow", 2)
    await groups.member("grow-4", "grow")  # a member beyond minCount: a late one, no request
    await eventually(lambda: said(groups, "grow", "wait for room"), what="the late one waits")
    assert await groups.cluster.request("grow-pg-grow-2") is not None
    await untouched(groups, placed)


async def test_lowered_before_the_growth_is_delivered_the_request_is_withdrawn(
    groups: Groups,
    provisioner: Any,
) -> None:
    placed, _ = await growing(groups, "shrink")

    await set_min_count(groups, "shrink", 2)
    await groups.cluster.wait_request_gone("shrink-pg-grow-1")
    await groups.cluster.wait_events("GrowthWithdrawn")
    await untouched(groups, placed)


async def test_min_count_above_the_members_that_exist_is_said_and_nothing_asked(
    groups: Groups,
    provisioner: Any,
) -> None:
    await groups.upstream("short", 2)
    placed = await released_and_bound(groups, "short", 2)
    await groups.member("short-2", "short")
    await set_min_count(groups, "short", 6)
    await eventually(
        lambda: said(groups, "short", "minCount 6 is above the members that exist"),
        what="the group saying so",
    )
    await groups.cluster.wait_events("MinCountAboveMembers")
    assert [r["metadata"]["name"] for r in await groups.cluster.requests()] == ["short-pg-1"]
    await untouched(groups, placed)


async def test_raised_again_mid_growth_and_after_it_started_every_member_added_is_asked_for(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 3 -> 4 before the first growth is provisioned: the growth of 1 is
    replaced by one of 2 (both added released together, consuming it); once they run,
    4 -> 5: a third growth asks for the 1 added, the delivered growth kept, nothing running
    touched. Before, the raise mid-growth said 'minCount 4 is above the members that exist'
    with 2 gated members there, and a raise after a growth started asked for nothing."""
    await groups.upstream("twice", 2)
    placed = await released_and_bound(groups, "twice", 2)

    await set_min_count(groups, "twice", 3)
    await groups.member("twice-2", "twice")
    first = await groups.cluster.wait_request("twice-pg-grow-1")
    assert sum(p["count"] for p in first["spec"]["podSets"]) == 1

    await set_min_count(groups, "twice", 4)
    await groups.member("twice-3", "twice")
    second = await groups.cluster.wait_request("twice-pg-grow-2")
    assert sum(p["count"] for p in second["spec"]["podSets"]) == 2
    assert second["metadata"]["annotations"][growth.GROWS_ANNOTATION] == "2"
    await groups.cluster.wait_request_gone("twice-pg-grow-1")
    await groups.cluster.wait_events("ProvisioningRequestReplaced")
    assert await groups.gated("twice-2", "twice-3") == [True, True]

    await groups.cluster.set_request_conditions("twice-pg-grow-2", {"Provisioned": "ok"})
    added = await groups.cluster.add_nodes(2, gpu=1)

    async def released_together() -> bool | None:
        return True if await groups.gated("twice-2", "twice-3") == [False, False] else None

    await eventually(released_together, timeout=20, what="the 2 added released together")
    for pod, node in zip(("twice-2", "twice-3"), added, strict=True):
        annotations = (await groups.pod(pod))["metadata"].get("annotations") or {}
        assert annotations.get(CONSUME_ANNOTATION) == "twice-pg-grow-2"
        await groups.bind(pod, node)
        placed[pod] = node

    async def started() -> bool | None:
        req = await groups.cluster.request("twice-pg-grow-2")
        phase = ((req or {}).get("metadata") or {}).get("annotations", {}).get(PHASE_ANNOTATION)
        return True if phase == STARTED else None

    await eventually(started, timeout=20, what="the second growth marked started")

    await set_min_count(groups, "twice", 5)
    await groups.member("twice-4", "twice")
    third = await groups.cluster.wait_request("twice-pg-grow-3")
    assert sum(p["count"] for p in third["spec"]["podSets"]) == 1
    assert third["metadata"]["annotations"][growth.GROWS_ANNOTATION] == "4"
    assert await groups.cluster.request("twice-pg-grow-2") is not None
    assert await groups.gated("twice-4") == [True]
    await untouched(groups, placed)


async def test_a_coscheduling_gang_whose_size_is_removed_mid_attempt_withdraws_its_request(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minMember removed (the CRD allows it: omitempty) while the gang's request has 2 of its
    3 nodes: no longer a gang, its members are released as they come, the request is
    withdrawn and the 2 nodes that arrived for it reclaimed (DeleteNode). Before, the request
    was left standing, its nodes held, for as long as the group lived."""
    config = f"cut-{groups.ns}"
    spec = {"fulfillment": {"deadlineSeconds": 120, "reclaimer": "DeleteNode"}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        meta = {"name": "cut", "namespace": groups.ns, "annotations": {CONFIG_ANNOTATION: config}}
        await groups.kube.create(PLUGINS_POD_GROUP, {"metadata": meta, "spec": {"minMember": 3}})
        for i in range(3):
            await groups.member(f"cut-{i}", "cut", plugins=True)
        await groups.cluster.wait_request("cut-coscheduling-1")
        await groups.cluster.set_request_conditions("cut-coscheduling-1", {"Provisioned": "ok"})
        arrived = await groups.cluster.add_nodes(2, gpu=1)

        async def recorded() -> bool:
            for name in arrived:
                notes = (await groups.kube.get(NODE, name))["metadata"].get("annotations") or {}
                if ARRIVED_FOR not in notes:
                    return False
            return True

        await eventually(recorded, what="the 2 nodes recorded as arrived for the request")
        patch = {"spec": {"minMember": None}}
        await groups.kube.merge_patch(PLUGINS_POD_GROUP, "cut", patch, groups.ns)
        await groups.wait_state("cut", "NotAGang", plugins=True)
        await groups.cluster.wait_request_gone("cut-coscheduling-1")
        assert await groups.gated("cut-0", "cut-1", "cut-2") == [False, False, False]

        async def reclaimed() -> bool:
            names = {n["metadata"]["name"] for n in await groups.cluster.nodes()}
            return not names & set(arrived)

        await eventually(reclaimed, timeout=30, what="the 2 arrived nodes reclaimed")
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_lowered_after_part_of_the_growth_arrived_withdraws_it_and_reclaims_the_arrival(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 4, the growth Provisioned and 1 of its 2 nodes arrived, then lowered
    back to 2: the growth's request is withdrawn (GrowthWithdrawn) and the node that arrived
    for it reclaimed (DeleteNode); the 2 running members and their nodes untouched."""
    config = f"lower-{groups.ns}"
    spec = {"fulfillment": {"deadlineSeconds": 120, "reclaimer": "DeleteNode"}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        placed, _ = await growing(groups, "lower", config)
        await groups.cluster.set_request_conditions("lower-pg-grow-1", {"Provisioned": "ok"})
        (one,) = await groups.cluster.add_nodes(1, gpu=1)

        async def recorded() -> bool:
            notes = (await groups.kube.get(NODE, one))["metadata"].get("annotations") or {}
            return notes.get(ARRIVED_FOR) == f"{groups.ns}/lower-pg-grow-1"

        await eventually(recorded, what="the node recorded as arrived for the growth")
        await eventually(
            lambda: said(groups, "lower", "1 of 2 members placeable"), what="the growth waiting"
        )

        await set_min_count(groups, "lower", 2)
        await groups.cluster.wait_request_gone("lower-pg-grow-1")
        await groups.cluster.wait_events("GrowthWithdrawn")

        async def reclaimed() -> bool:
            return one not in {n["metadata"]["name"] for n in await groups.cluster.nodes()}

        await eventually(reclaimed, timeout=30, what="the arrived node reclaimed")
        await untouched(groups, placed)
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_config_that_stops_serving_the_namespace_asks_no_new_growth(
    groups: Groups,
    provisioner: Any,
    short_deadline: str,
) -> None:
    """minCount 2 -> 4 on a running group: its growth asked; the admin then takes the
    namespace off the config (spec.podGroups.namespaceSelector). The growth in flight is
    followed under the config it recorded (rolled back at its deadline, nothing arrived), but
    no next growth is asked under that record once the backoff is over: said on the group,
    Event ConfigProblem, the 2 added still gated, the 2 running untouched. The selector
    removed, the next growth is asked. (Before, grow-2 was asked under grow-1's record.)"""
    placed, _ = await growing(groups, "unserved", short_deadline)
    selector = {"matchLabels": {"team": "someone-else"}}
    patch = {"spec": {"podGroups": {"namespaceSelector": selector}}}
    await groups.kube.merge_patch(ATOMIC_CONFIG, short_deadline, patch)

    await eventually(
        lambda: said(groups, "unserved", "no growth is asked"),
        timeout=30,
        what="the group says no growth is asked",
    )
    said_on = await groups.group("unserved")
    assert (
        f"does not serve namespace '{groups.ns}'"
        in (said_on["metadata"]["annotations"][MESSAGE_ANNOTATION])
    )
    await groups.cluster.wait_events("ConfigProblem", about="unserved")
    rolled = await groups.cluster.request("unserved-pg-grow-1")
    assert rolled is not None  # the record of the growth rolled back, kept until the next
    # past grow-1's backoff (4 s base, from its 3 s deadline): still nothing asked
    await asyncio.sleep(10)
    assert await groups.cluster.request("unserved-pg-grow-2") is None
    assert await groups.gated("unserved-2", "unserved-3") == [True, True]
    assert (await groups.group("unserved"))["metadata"]["annotations"]["gangcheck.io/state"] == (
        "Released"
    )
    await untouched(groups, placed)

    # the namespace served again (the selector removed): the next growth is asked
    config = await groups.kube.get(ATOMIC_CONFIG, short_deadline)
    del config["spec"]["podGroups"]
    await groups.kube.replace(ATOMIC_CONFIG, config)
    grown = await groups.cluster.wait_request("unserved-pg-grow-2", timeout=30)
    assert sum(p["count"] for p in grown["spec"]["podSets"]) == 2
    await untouched(groups, placed)


async def test_a_delivered_growth_whose_members_all_left_before_binding_is_withdrawn(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 4: the growth's 2 members are released onto the 2 nodes that came for
    it, then both are deleted before they are bound, and the Job makes 2 again (gated).
    The growth, consumed by no one, is withdrawn (GrowthWithdrawn), the hold lifted from its
    nodes (not reclaimed), and the 2 made again are released onto them together. Before:
    the group said 'asked for once the members of growth left-pg-grow-1 are all bound' for
    ever, the 2 made again gated, the 2 nodes held."""
    placed, _ = await growing(groups, "left")
    await groups.cluster.set_request_conditions("left-pg-grow-1", {"Provisioned": "ok"})
    nodes = await groups.cluster.add_nodes(2, gpu=1)

    async def released() -> bool | None:
        return True if await groups.gated("left-2", "left-3") == [False, False] else None

    await eventually(released, timeout=20, what="the growth's 2 members released")
    for pod in ("left-2", "left-3"):
        await groups.kube.delete(POD, pod, groups.ns)
    await groups.member("left-4", "left")
    await groups.member("left-5", "left")

    async def again() -> bool | None:
        return True if await groups.gated("left-4", "left-5") == [False, False] else None

    await eventually(again, timeout=30, what="the 2 made again released together")
    (event,) = await groups.cluster.wait_events("GrowthWithdrawn")
    assert "left-pg-grow-1" in event["message"], event["message"]
    for node in nodes:  # not reclaimed, its hold lifted
        got = await groups.kube.get(NODE, node)
        assert not got["spec"].get("unschedulable")
        assert not [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]
    await untouched(groups, placed)


async def test_a_growth_whose_members_fell_short_is_withdrawn_past_its_deadline(
    groups: Groups,
    provisioner: Any,
    short_deadline: str,
) -> None:
    """minCount 2 -> 4: the growth asks for 2, a node arrives for it, then one of the 2 is
    deleted: none is released alone, and past the growth's deadline (3 s) it is withdrawn,
    the node that came for it reclaimed (DeleteNode), Event GrowthWithdrawn; the other
    member stays gated, the running ones untouched. Before: the request stayed and the
    node held for ever, the group saying 'nothing is asked until 1 more exist'."""
    placed, _ = await growing(groups, "few", short_deadline)
    await groups.cluster.set_request_conditions("few-pg-grow-1", {"Provisioned": "ok"})
    (one,) = await groups.cluster.add_nodes(1, gpu=1)
    await groups.kube.delete(POD, "few-3", groups.ns)

    (event,) = await groups.cluster.wait_events("GrowthWithdrawn", timeout=30)
    assert "few-pg-grow-1" in event["message"], event["message"]
    await groups.cluster.wait_request_gone("few-pg-grow-1")

    async def reclaimed() -> bool | None:
        try:
            await groups.kube.get(NODE, one)
        except NotFoundError:
            return True
        return None

    await eventually(reclaimed, timeout=30, what="the node that came for it reclaimed")
    assert await groups.gated("few-2") == [True]
    await untouched(groups, placed)


async def test_a_growth_whose_record_of_its_release_is_lost_is_kept_as_delivered(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 4: the growth's 2 members are released onto the 2 nodes that came for
    it; the record of that release on its request (its phase Fulfilled, written right after
    the members) is lost (taken off here, as a refused or lost write leaves it). The growth
    is still delivered: its record is written again, nothing withdrawn, its nodes neither
    fenced nor reclaimed, and once its members are bound it is started and the hold lifted.
    Before, the next decision counted its members running, withdrew it as 'minCount
    lowered' (GrowthWithdrawn) and reclaimed its nodes under its members."""
    placed, _ = await growing(groups, "lost")
    name = "lost-pg-grow-1"
    await groups.cluster.set_request_conditions(name, {"Provisioned": "ok"})
    nodes = await groups.cluster.add_nodes(2, gpu=1)

    async def fulfilled() -> bool | None:
        req = await groups.cluster.request(name)
        notes = (req or {}).get("metadata", {}).get("annotations") or {}
        return True if notes.get(PHASE_ANNOTATION) == "Fulfilled" else None

    await eventually(fulfilled, timeout=20, what="the growth's members released onto it")
    assert await groups.gated("lost-2", "lost-3") == [False, False]
    patch = {"metadata": {"annotations": {PHASE_ANNOTATION: None}}}
    await groups.kube.merge_patch(PROVISIONING_REQUEST, name, patch, groups.ns)
    await eventually(fulfilled, timeout=20, what="the record of the release written again")
    for pod, node in zip(("lost-2", "lost-3"), nodes, strict=True):
        await groups.bind(pod, node)

    async def started() -> bool | None:
        req = await groups.cluster.request(name)
        notes = (req or {}).get("metadata", {}).get("annotations") or {}
        return True if notes.get(PHASE_ANNOTATION) == STARTED else None

    await eventually(started, timeout=20, what="the growth started once its members are bound")
    assert await groups.cluster.events("GrowthWithdrawn") == []
    for node in nodes:  # neither fenced nor reclaimed; its hold lifted at the start
        got = await groups.kube.get(NODE, node)
        assert not got["spec"].get("unschedulable")
        assert not [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]
    await untouched(groups, placed)


async def test_a_growth_member_whose_gate_is_removed_by_hand_is_released_onto_the_growth(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 4 on a running group, one of the 2 added has its gate removed by hand
    while it waits: it is one of the growth (asked for with the other), and once the growth
    fits whole it is given the growth's request and its hold's toleration with the gated
    one, named in GangGrown. Before, it was counted running: the growth asked for, and
    released onto, the gated one alone, and the one ungated was never given what lets it
    onto the held node (KeyError on its consume annotation here)."""
    await groups.upstream("bare", 2)
    placed = await released_and_bound(groups, "bare", 2)
    await set_min_count(groups, "bare", 4)
    await groups.member("bare-2", "bare")
    await groups.member("bare-3", "bare")
    await groups.kube.merge_patch(POD, "bare-3", {"spec": {"schedulingGates": None}}, groups.ns)
    name = "bare-pg-grow-1"
    req = await groups.cluster.wait_request(name)
    assert sum(p["count"] for p in req["spec"]["podSets"]) == 2
    await groups.cluster.set_request_conditions(name, {"Provisioned": "ok"})
    await groups.cluster.add_nodes(2, gpu=1)
    (event,) = await groups.cluster.wait_events("GangGrown")
    assert "whose gate was lifted before (bare-3)" in event["message"], event["message"]
    for pod in ("bare-2", "bare-3"):
        got = await groups.pod(pod)
        assert (got["metadata"].get("annotations") or {})[CONSUME_ANNOTATION] == name
        holds = [t for t in got["spec"].get("tolerations") or [] if t.get("key") == HOLD_TAINT]
        assert len(holds) == 1, got["spec"]
    assert await groups.gated("bare-2", "bare-3") == [False, False]
    await untouched(groups, placed)


async def test_a_growth_member_released_onto_room_and_still_binding_is_not_asked_for_again(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 3: the member added fits on a node that exists and is released at once,
    marked released by gangcheck (GangGrown); raised again to 4 while it is still unbound,
    with a member added that fits nowhere: the growth asks for that one only. Before, the
    member still binding was counted as missing with the gated one (as one whose gate was
    removed by hand), and the growth asked for 2."""
    await groups.upstream("room", 2)
    placed = await released_and_bound(groups, "room", 2)
    await groups.cluster.add_nodes(1, gpu=1)
    await set_min_count(groups, "room", 3)
    await groups.member("room-2", "room")
    await groups.cluster.wait_events("GangGrown")
    got = await groups.pod("room-2")
    assert (got["metadata"].get("annotations") or {})["gangcheck.io/released-by"] == "GangGrown"
    assert not got["spec"].get("nodeName")

    await set_min_count(groups, "room", 4)
    await groups.member("room-3", "room", gpu=2)
    req = await groups.cluster.wait_request("room-pg-grow-1")
    assert sum(p["count"] for p in req["spec"]["podSets"]) == 1
    assert req["metadata"]["annotations"][growth.GROWS_ANNOTATION] == "3"
    await untouched(groups, placed)


async def test_a_growth_member_created_without_the_gate_is_said(
    groups: Groups,
    provisioner: Any,
) -> None:
    """minCount 2 -> 3 on a running group, the member added created without the gate (the
    webhook down): MemberNotGated on the group and on the pod, its name kept on the group.
    Before, a released group said nothing of it."""
    await groups.upstream("open", 2)
    placed = await released_and_bound(groups, "open", 2)
    await set_min_count(groups, "open", 3)
    await groups.member("open-2", "open", gated=False)
    await groups.cluster.wait_events("MemberNotGated", about="open-2")
    (said,) = await groups.cluster.wait_events("MemberNotGated", about="open")
    assert "before their growth is released: open-2 created without" in said["message"], said
    obj = await groups.group("open")
    assert obj["metadata"]["annotations"]["gangcheck.io/ungated-members"] == "open-2"
    await untouched(groups, placed)


@pytest.fixture
async def short_start(groups: Groups) -> Any:
    config = f"start-{groups.ns}"
    spec = {"fulfillment": {"startDeadlineSeconds": 4, "reclaimer": "DeleteNode"}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    yield config
    await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_growth_whose_members_do_not_all_bind_in_time_is_rolled_back(
    groups: Groups,
    provisioner: Any,
    short_start: str,
) -> None:
    """minCount 2 -> 4: the growth's 2 members are released onto the 2 nodes that came for
    it; one binds, the other never does. startDeadlineSeconds (4 s here) after their release
    the growth is rolled back: the node nothing runs on is reclaimed (DeleteNode), the one
    its bound member runs on is kept (draining), no member is touched or gated again, the
    running ones untouched; the group says why (StartDeadline) with a GrowthRolledBack
    Warning and stays Released. Before, the growth held both nodes for ever."""
    placed, _ = await growing(groups, "late", short_start)
    name = "late-pg-grow-1"
    await groups.cluster.set_request_conditions(name, {"Provisioned": "ok"})
    nodes = await groups.cluster.add_nodes(2, gpu=1)

    async def released() -> bool | None:
        return True if await groups.gated("late-2", "late-3") == [False, False] else None

    await eventually(released, timeout=20, what="the growth's 2 members released")
    req = await groups.cluster.request(name)
    assert (req or {})["metadata"]["annotations"].get("gangcheck.io/released-at")
    await groups.bind("late-2", nodes[0])

    (event,) = await groups.cluster.wait_events("GrowthRolledBack", timeout=40)
    assert event["type"] == "Warning"
    assert f"rolled back {name} (StartDeadline: 1 of 2 members" in event["message"], event

    async def reclaimed() -> bool | None:
        try:
            await groups.kube.get(NODE, nodes[1])
        except NotFoundError:
            return True
        return None

    await eventually(reclaimed, timeout=30, what="the node nothing runs on reclaimed")
    assert (await groups.pod("late-2"))["spec"]["nodeName"] == nodes[0]
    await groups.kube.get(NODE, nodes[0])  # kept: a member of the growth runs there
    assert await groups.gated("late-2", "late-3") == [False, False]
    obj = await groups.wait_state("late", "Released")
    assert "StartDeadline" in obj["metadata"]["annotations"][MESSAGE_ANNOTATION]
    assert [r["metadata"]["name"] for r in await groups.cluster.requests()] == [
        "late-pg-1",
        name,
    ]
    await untouched(groups, placed)
