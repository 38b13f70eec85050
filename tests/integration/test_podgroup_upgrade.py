"""A PodGroup released by the previous release, growing after the upgrade, on a real API
server: the group and its members are written as that release left them (its members'
gates lifted alone, no gangcheck.io/released-by), and this version's controller takes them
up as a new leader would. The test plays kube-scheduler (it binds) and the autoscaler."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.kube.resources import POD
from gangcheck.logic.timefmt import format_time
from gangcheck.model.names import (
    GANG_MEMBERS_ANNOTATION,
    GATED_AT,
    MESSAGE_ANNOTATION,
    RELEASED_AT_ANNOTATION,
    STATE_ANNOTATION,
)
from tests.builders import container
from tests.integration.harness import eventually
from tests.integration.test_podgroup_growth import set_min_count
from tests.integration.test_podgroups import Groups
from tests.integration.test_podgroups import groups as groups  # noqa: PLC0414 (fixture)
from tests.integration.test_podgroups import provisioner as provisioner  # noqa: PLC0414

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
MARKED_SINCE = "gangcheck.io/releases-marked-since"
UNMARKED = "gangcheck.io/released-unmarked"


async def released_by_hand(groups: Groups, name: str, group: str, *, gpu: int = 1) -> Obj:
    """A member as the previous release left one it released onto room that exists: stamped
    by the webhook, its gate lifted alone (no mark, no request), not bound yet."""
    meta: Obj = {
        "name": name,
        "namespace": groups.ns,
        "annotations": {GATED_AT: format_time(datetime.now(UTC))},
    }
    spec: Obj = {
        "containers": [container(gpu=gpu)],
        "restartPolicy": "Never",
        "nodeSelector": dict(groups.cluster.pool),
        "schedulingGroup": {"podGroupName": group},
    }
    return await groups.kube.create(POD, {"metadata": meta, "spec": spec})


async def test_a_member_the_previous_release_released_onto_room_is_neither_said_nor_asked_for(
    groups: Groups,
    provisioner: Any,
) -> None:
    """The previous release released a gang of 2 (bound), then grew it to 3 at once onto a
    node that exists (old-2, not bound yet when the new leader looks). This version records
    old-2 as released on the group, says no MemberNotGated, and raised to 4 with a member that
    fits nowhere asks for that one only. Before, old-2 was said MemberNotGated (created since
    the release, no mark: 'its gate since removed') and the growth asked for 2."""
    nodes = await groups.cluster.add_nodes(3, gpu=1)
    for i in range(2):
        await groups.member(f"old-{i}", "old", gated=False)
        await groups.bind(f"old-{i}", nodes[i])
    await asyncio.sleep(1.1)  # the release's second, after its members' creation
    released_at = format_time(datetime.now(UTC))
    await asyncio.sleep(1.1)
    await released_by_hand(groups, "old-2", "old")
    await groups.upstream(
        "old",
        3,
        annotations={
            STATE_ANNOTATION: "Released",
            MESSAGE_ANNOTATION: (
                "released; minCount raised to 3: 1 member(s) added to 2 running: they fit on "
                "nodes that exist, released together"
            ),
            GANG_MEMBERS_ANNOTATION: "2",
            RELEASED_AT_ANNOTATION: released_at,
        },
    )

    async def adopted() -> Obj | None:
        notes = (await groups.group("old"))["metadata"].get("annotations") or {}
        return notes if MARKED_SINCE in notes else None

    notes = await eventually(adopted, timeout=20, what="the group's first look recorded")
    assert notes.get(UNMARKED) == "old-2", notes
    assert "gangcheck.io/ungated-members" not in notes

    await set_min_count(groups, "old", 4)
    await groups.member("old-3", "old", gpu=2)  # fits on no node
    req = await groups.cluster.wait_request("old-pg-grow-1")
    assert sum(p["count"] for p in req["spec"]["podSets"]) == 1
    assert await groups.cluster.events("MemberNotGated") == []
    got = await groups.pod("old-2")
    assert not got["spec"].get("nodeName") and not got["spec"].get("schedulingGates")
