"""Table tests of PodGroups released by a version before gangcheck marked the members it
releases (gangcheck.io/released-by), growing after the upgrade.

That version released members onto room that exists (a gang's release with nothing asked, a
growth released at once, late members) by lifting the gate alone: no mark, no request
consumed, the webhook's gated-at stamp kept; the shape of a member whose gate was removed by
hand. One still binding when the new version first looks is taken as released
(gangcheck.io/released-unmarked, written with gangcheck.io/releases-marked-since), never said
MemberNotGated nor asked for again by a growth."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gangcheck.logic.attempt.actions import CreateRequest
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.podgroups import growth
from gangcheck.logic.podgroups.podgroup import GroupDecision, GroupSnapshot
from gangcheck.model.objects import pod_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import node
from tests.unit.test_podgroup_growth import (
    NOW,
    OLD_NODE,
    later,
    never_gated,
    pod,
    running,
    said_not_gated,
    stripped,
)
from tests.unit.test_podgroup_growth import group as growth_group

Obj = dict[str, Any]
MARKED_SINCE = "gangcheck.io/releases-marked-since"
UNMARKED = "gangcheck.io/released-unmarked"
STAMP = "2026-11-30T10:05:00Z"  # NOW, as written


def earlier_group(min_count: int) -> Obj:
    """A group released by the earlier version: no gangcheck.io/releases-marked-since."""
    obj = group(min_count)
    obj["metadata"]["annotations"].pop(MARKED_SINCE, None)
    return obj


def group(min_count: int, *, unmarked: str = "") -> Obj:
    """A group this version looked at (or released): releases marked since it was released;
    `unmarked`, what the earlier version released that was binding at the first look."""
    obj = growth_group(min_count)
    obj["metadata"]["annotations"][MARKED_SINCE] = "2026-11-30T10:01:00Z"
    if unmarked:
        obj["metadata"]["annotations"][UNMARKED] = unmarked
    return obj


def released_unmarked(name: str) -> Obj:
    """A member the earlier version released onto room that exists (GangGrown at once, or
    LateMembersReleased), still binding: its gate lifted alone, as that version's
    ReleaseMembers(annotations={}, node_selector={}) left it."""
    return stripped(name)


@dataclass
class Case:
    id: str
    group: Obj
    members: list[Obj]
    asked: int | None = None
    said: tuple[str, ...] = ()
    marking: dict[str, str] | None = field(default_factory=dict)
    """The annotations the decision writes of the marking (None: none written)."""


CASES = [
    Case(
        "a growth the earlier version released at once, binding: taken as released, not said",
        earlier_group(5),
        [*running(), released_unmarked("new0")],
        marking={MARKED_SINCE: STAMP, UNMARKED: "new0"},
    ),
    Case(
        "raised again with a gated member waiting: the growth asks for that one only",
        earlier_group(6),
        [*running(), released_unmarked("new0"), *later(1)],
        asked=1,
        marking={MARKED_SINCE: STAMP, UNMARKED: "new0"},
    ),
    Case(
        "a member the webhook never stamped was never gated (no release lifted a gate): said",
        earlier_group(7),
        [*running(), released_unmarked("new0"), never_gated("new1"), *later(1)],
        asked=2,
        said=("new1",),
        marking={MARKED_SINCE: STAMP, UNMARKED: "new0"},
    ),
    Case(
        "nothing binding: only the time from which releases are marked",
        earlier_group(5),
        [*running(), *later(1)],
        asked=1,
        marking={MARKED_SINCE: STAMP},
    ),
    Case(
        "after the first look: one ungated by hand since is said and asked for, not the "
        "earlier version's, still binding",
        group(7, unmarked="new0"),
        [*running(), released_unmarked("new0"), stripped("new1"), *later(1)],
        asked=2,
        said=("new1",),
        marking=None,
    ),
]


def run(case: Case) -> GroupDecision:
    snap = GroupSnapshot(
        group=pod_group_of(case.group),
        members=tuple(map(pod_of, case.members)),
        config=parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}}),
        capacity=ClusterView(nodes=(OLD_NODE,), pods=tuple(case.members)),
        opted_in=True,
    )
    return growth.decide(snap, NOW)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_group_an_earlier_version_released_grows(case: Case) -> None:
    d = run(case)
    asks = [
        sum(p["count"] for p in a.body["spec"]["podSets"])
        for a in d.actions
        if isinstance(a, CreateRequest)
    ]
    assert asks == ([] if case.asked is None else [case.asked])
    assert sorted(n for n in said_not_gated(d) if n != "g") == list(case.said)
    status = d.status or {}
    written = {k: v for k, v in status.items() if k in (MARKED_SINCE, UNMARKED)}
    assert written == (case.marking or {})


def test_a_gang_this_version_releases_records_that_its_releases_are_marked() -> None:
    """Released by this version: the time is written with the release, so that no member
    ungated by hand later is ever taken for an earlier version's release."""
    obj = group(2)
    obj["metadata"]["annotations"] = {}
    members = [pod("a", gated=True), pod("b", gated=True)]
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, members)),
        config=parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}}),
        capacity=ClusterView(nodes=(node("free", gpu=4),), pods=tuple(members)),
        opted_in=True,
    )
    status = growth.decide(snap, NOW).status or {}
    assert status["gangcheck.io/state"] == "Released"
    assert status[MARKED_SINCE] == STAMP
    assert UNMARKED not in status


def test_the_time_releases_are_marked_since_is_written_once() -> None:
    """A group that records it keeps it, whatever its state's writes."""
    obj = group(2)
    obj["metadata"]["annotations"]["gangcheck.io/state"] = "Provisioning"
    members = [pod("a", gated=True), pod("b", gated=True)]
    snap = GroupSnapshot(
        group=pod_group_of(obj),
        members=tuple(map(pod_of, members)),
        config=parse_spec({"fulfillment": {"reclaimer": "DeleteNode"}}),
        capacity=ClusterView(nodes=(node("free", gpu=4),), pods=tuple(members)),
        opted_in=True,
    )
    status = growth.decide(snap, NOW).status or {}
    assert status["gangcheck.io/state"] == "Released"
    assert MARKED_SINCE not in status


def test_the_members_recorded_at_the_first_look_stay_within_the_budget() -> None:
    """A group's annotations are 256 KiB in all: the names are kept within
    growth.UNMARKED_BUDGET, the growth's (created since the release) first."""
    gang = [released_unmarked(f"gang-{i:04}-{'x' * 40}") for i in range(800)]
    for member in gang:
        member["metadata"]["creationTimestamp"] = "2026-11-30T10:00:30Z"  # before the release
    case = Case("budget", earlier_group(5), [*running(), released_unmarked("new0"), *gang])
    written = (run(case).status or {})[UNMARKED]
    assert len(written) <= growth.UNMARKED_BUDGET
    names = written.split(",")
    assert "new0" in names and 600 < len(names) < 800
