"""The PodGroup reconciler against a fake API server, driven only through `reconcile(key)`:
a handful of narrative cases, the test playing the webhook, the autoscaler and a person."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import (
    EVENT,
    NODE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from gangcheck.logic.attempt.actions import ClaimNode, DeleteRequest, Event
from gangcheck.logic.attempt.fulfillment import ARRIVED_FOR
from gangcheck.logic.podgroups import growth
from gangcheck.logic.podgroups.gating import GATE, OPT_IN_VALUE
from gangcheck.logic.podgroups.podgroup import (
    MESSAGE_ANNOTATION,
    STATE_ANNOTATION,
    GroupDecision,
)
from gangcheck.model.names import GROUP_UID_ANNOTATION, OPT_IN_LABEL, RECLAIM_TAINT
from gangcheck.reconcile import podgroup as podgroup_module
from gangcheck.reconcile.podgroup import PodGroupReconciler
from gangcheck.reconcile.progress import PROGRESS_DELAY_SECONDS
from tests import worlds
from tests.builders import container, node
from tests.worlds import NOW, Obj, stamp

KEY = "pg/default/g"
GROUPS = UPSTREAM_POD_GROUP_V1BETA1


def namespace() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "default", "labels": {OPT_IN_LABEL: OPT_IN_VALUE}},
    }


def pod_group(min_count: int = 3) -> Obj:
    return {
        "apiVersion": GROUPS.api_version,
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "default", "uid": "uid-g"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def member(i: int) -> Obj:
    """A one-GPU member the webhook gated a minute ago."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"m{i}",
            "namespace": "default",
            "creationTimestamp": stamp(NOW - timedelta(minutes=1)),
        },
        "spec": {
            "containers": [container(gpu=1)],
            "schedulingGroup": {"podGroupName": "g"},
            "schedulingGates": [{"name": GATE}],
        },
    }


class World(worlds.World[PodGroupReconciler]):
    """The fake server, the caches the controller reads, and the PodGroup reconciler."""

    key = KEY

    def __init__(self, *objs: Obj) -> None:
        super().__init__((namespace(), *objs), pod_groups=(GROUPS,))
        self.reconciler = PodGroupReconciler(
            self.kube, self.caches, self.events, self.applier, clock=self.clock
        )

    def request(self) -> Obj:
        (req,) = self.requests()
        return req

    def group_says(self) -> dict[str, str]:
        group = self.kube.stored(GROUPS, "g", "default")
        assert group is not None
        return dict(group["metadata"].get("annotations") or {})

    def gated(self) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self.kube.all_of(POD)
            if (p["spec"].get("schedulingGates") or [])
        ]


def gang() -> list[Obj]:
    return [pod_group(), member(0), member(1), member(2)]


async def test_a_gated_gang_gets_a_request_and_says_so_on_the_group() -> None:
    world = World(*gang())
    await world.settle()
    (req,) = world.requests()
    assert req["spec"]["podSets"][0]["count"] == 3
    assert len(world.kube.all_of(POD_TEMPLATE)) == 1
    assert world.group_says().get(STATE_ANNOTATION)
    assert world.gated() == ["m0", "m1", "m2"]


async def test_provisioned_and_fitting_on_the_arrived_nodes_releases_every_member() -> None:
    world = World(*gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    assert world.gated() == []
    claimed = [n for n in ("n1", "n2") if ARRIVED_FOR in (node_annotations(world, n))]
    assert claimed == ["n1", "n2"]


def node_annotations(world: World, name: str) -> dict[str, str]:
    stored = world.kube.stored(NODE, name)
    assert stored is not None
    return dict(stored["metadata"].get("annotations") or {})


async def test_provisioned_but_not_yet_fitting_keeps_every_member_gated() -> None:
    world = World(*gang())
    await world.settle()
    world.provision("n1")  # room for two of the three
    await world.settle()
    assert world.gated() == ["m0", "m1", "m2"]


async def test_an_api_error_on_the_request_create_is_retried_and_nothing_is_lost() -> None:
    world = World(*gang())
    world.kube.fail("create", "ProvisioningRequest", error=500)
    with pytest.raises(ApiError):
        await world.reconcile()
    assert world.requests() == []
    await world.settle()
    assert len(world.requests()) == 1
    assert len(world.kube.all_of(POD_TEMPLATE)) == 1
    world.provision("n1", "n2")
    await world.settle()
    assert world.gated() == []


async def test_a_conflict_on_the_group_write_is_retried_and_written() -> None:
    world = World(*gang())
    world.kube.fail("patch", "PodGroup", "g", 409)
    with pytest.raises(ApiError):
        await world.reconcile()
    await world.settle()
    assert world.group_says().get(STATE_ANNOTATION)
    assert len(world.requests()) == 1


async def test_a_member_changed_while_being_released_is_read_again_and_released() -> None:
    world = World(*gang())
    await world.settle()
    world.provision("n1", "n2")
    world.kube.fail("patch", "Pod", "m1", 409)
    await world.settle()
    assert world.gated() == []


async def test_a_group_deleted_has_its_request_and_template_deleted() -> None:
    world = World(*gang())
    await world.settle()
    world.kube.remove(GROUPS, "g", "default")
    await world.settle()
    assert world.requests() == []
    assert world.kube.all_of(POD_TEMPLATE) == []


async def test_a_member_of_a_group_that_does_not_exist_is_told_why_it_waits() -> None:
    world = World(member(0))
    await world.settle()
    pod = world.kube.stored(POD, "m0", "default")
    assert pod is not None
    assert "g" in pod["metadata"]["annotations"][MESSAGE_ANNOTATION]
    assert [w.body["reason"] for w in world.kube.writes_of("Event")] == ["PodGroupNotFound"]
    assert world.requests() == []


async def test_before_discovery_has_answered_a_member_is_not_told_its_group_is_not_served() -> None:
    """At a start, the members' events come before discovery has said which PodGroup APIs
    the server serves: no PodGroupNotFound then; said once discovery has answered."""
    world = World(member(0))
    world.caches.pod_groups.clear()
    world.caches.pod_groups_discovered = False
    await world.settle()
    assert world.kube.writes_of("Event") == []
    pod = world.kube.stored(POD, "m0", "default")
    assert pod is not None and MESSAGE_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    world.caches.pod_groups_discovered = True  # discovery answered: no PodGroup API served
    await world.settle()
    event = world.kube.writes_of("Event")[0].body
    assert event["reason"] == "PodGroupNotFound"
    assert "does not serve" in event["message"]


GROUP_PATCH = ("PodGroup", "patch")


async def flush(world: World) -> None:
    """Let every held message fall due and be written."""
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert len(world.reconciler.held_messages) == 0


async def test_a_progress_message_alone_is_held_then_written_with_what_it_says_by_then() -> None:
    """As for a Workload's check (`progress`): a new message with nothing else changed waits
    up to the delay; the group asks to be looked at again when it falls due."""
    world = World(*gang())
    await world.settle()
    await flush(world)  # what the request's creation left held ("waiting ... accepted")
    state = world.group_says()[STATE_ANNOTATION]
    writes = len(world.kube.writes_of(*GROUP_PATCH))
    said = world.group_says()[MESSAGE_ANNOTATION]
    world.provision("n1")  # room for two of the three: a new message, the same state
    result = await world.reconcile()
    assert result.requeue_after is not None and 0 < result.requeue_after <= PROGRESS_DELAY_SECONDS
    await world.settle()
    assert len(world.kube.writes_of(*GROUP_PATCH)) == writes
    assert world.group_says()[MESSAGE_ANNOTATION] == said
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert len(world.kube.writes_of(*GROUP_PATCH)) == writes + 1
    assert world.group_says()[STATE_ANNOTATION] == state
    assert world.group_says()[MESSAGE_ANNOTATION] != said
    assert len(world.reconciler.held_messages) == 0


async def test_a_gang_released_before_its_held_message_was_written_has_the_group_written_once() -> (
    None
):
    world = World(*gang())
    await world.settle()
    await flush(world)
    writes = len(world.kube.writes_of(*GROUP_PATCH))
    world.provision("n1")  # a new message alone: held
    await world.settle()
    world.kube.add(node("n2", gpu=2, created=stamp(world.now)))  # now the gang fits
    await world.settle()
    assert world.gated() == []
    assert len(world.kube.writes_of(*GROUP_PATCH)) == writes + 1  # the new state, at once
    assert len(world.reconciler.held_messages) == 0
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert len(world.kube.writes_of(*GROUP_PATCH)) == writes + 1  # nothing held written late


async def test_the_group_is_written_though_what_comes_after_it_meets_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a decision does after the group's own record (a lost racer's withdrawal) does
    not hold that record back: it is written, and the group looked at again soon for the
    rest."""
    world = World(*gang(), node("n1", gpu=2))
    await world.settle()
    (req,) = world.requests()
    late = ClaimNode("n1", resource_version="not-its-version", request=req["metadata"]["name"])
    decided = GroupDecision(status={STATE_ANNOTATION: "Released"}, after=(late,))
    monkeypatch.setattr(growth, "decide", lambda _snap, _now: decided)
    result = await world.reconcile()
    assert world.group_says()[STATE_ANNOTATION] == "Released"
    assert result.requeue_after == podgroup_module.STALE_RETRY_SECONDS
    assert ARRIVED_FOR not in node_annotations(world, "n1")


async def test_the_events_of_a_group_written_are_sent_though_what_comes_after_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group's record is written, then a lost racer's withdrawal fails (the API server
    answers 500): the Events of the decision that wrote it are sent all the same; the next
    pass finds the group released and could not say them again."""
    world = World(*gang(), node("n1", gpu=2))
    await world.settle()
    (req,) = world.requests()
    gone = DeleteRequest(req["metadata"]["name"], req["metadata"]["uid"], (), "lost the race")
    won = Event("CapacityRaceWon", "source b delivered the whole gang first")
    decided = GroupDecision(status={STATE_ANNOTATION: "Released"}, after=(gone,), events=(won,))
    monkeypatch.setattr(growth, "decide", lambda _snap, _now: decided)
    world.kube.fail("delete", "ProvisioningRequest", error=500)
    with pytest.raises(ApiError):
        await world.reconcile()
    assert world.group_says()[STATE_ANNOTATION] == "Released"
    assert "CapacityRaceWon" in [e["reason"] for e in world.kube.all_of(EVENT)]


async def test_a_group_made_again_under_its_name_withdraws_the_old_attempt_first() -> None:
    """The group is deleted and made again under the same name (a new uid) before a
    reconcile saw it gone, its members still gated: the old group's request, waiting with
    one node arrived, is not the new group's. It is withdrawn, what arrived for it
    reclaimed, and the new group asked for under its own uid; before, the old request
    stayed for ever, its node held, and the new group's ask collided with its name."""
    world = World(*gang())
    await world.settle()
    world.provision("n1")  # room for two of the three: waiting, n1 claimed
    await world.settle()
    (old,) = world.requests()
    assert node_annotations(world, "n1")[ARRIVED_FOR] == f"default/{old['metadata']['name']}"
    world.kube.remove(GROUPS, "g", "default")
    again = pod_group()
    again["metadata"]["uid"] = "uid-g-again"
    world.kube.add(again)
    await world.settle()
    (req,) = world.requests()
    assert req["metadata"]["annotations"][GROUP_UID_ANNOTATION] == "uid-g-again"
    assert world.kube.writes_of("ProvisioningRequest", "delete") != []
    assert "FailedCreate" not in [e["reason"] for e in world.kube.all_of(EVENT)]
    assert "already exists" not in world.group_says().get(MESSAGE_ANNOTATION, "")
    assert world.gated() == ["m0", "m1", "m2"]
    fenced = world.kube.stored(NODE, "n1")  # reclaimed for the old attempt, not the new one's
    assert fenced is not None and fenced["spec"]["unschedulable"] is True
    assert [t["key"] for t in fenced["spec"]["taints"]] == [RECLAIM_TAINT]


async def test_a_released_gangs_request_deleted_by_hand_has_the_hold_it_left_lifted() -> None:
    """The request whose capacity a released gang was given is deleted outside gangcheck
    before its members are bound: no request is left whose record would ever lift the hold
    on its nodes (Started, a rollback), so they stayed closed to every pod but the gang's
    for ever, nothing said. Once the API server confirms the request gone, the hold is
    lifted and a HoldLifted Warning Event names the nodes; nothing is asked again."""
    world = World(*gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    assert world.gated() == []
    (req,) = world.requests()
    world.kube.remove(PROVISIONING_REQUEST, req["metadata"]["name"], "default")
    await world.settle()
    for name in ("n1", "n2"):
        stored = world.kube.stored(NODE, name)
        assert stored is not None and not stored["spec"].get("taints"), stored["spec"]
    (event,) = [e for e in world.kube.all_of(EVENT) if e["reason"] == "HoldLifted"]
    assert event["type"] == "Warning" and "n1, n2" in event["message"]
    assert world.requests() == []


async def test_a_released_gang_whose_members_all_left_before_binding_lifts_its_hold() -> None:
    """Every member of a released gang is deleted before one is bound: its request is
    withdrawn (the gang has no members left), and the hold on what arrived for it is lifted
    with it, as a started gang's is. Before, the request went and the hold stayed, naming a
    request that no longer exists: the nodes closed to every pod for ever."""
    world = World(*gang())
    await world.settle()
    world.provision("n1", "n2")
    await world.settle()
    assert world.gated() == []
    for i in range(3):
        world.kube.remove(POD, f"m{i}", "default")
    await world.settle()
    assert world.requests() == []
    for name in ("n1", "n2"):
        stored = world.kube.stored(NODE, name)
        assert stored is not None and not stored["spec"].get("taints"), stored["spec"]
    assert not [e for e in world.kube.all_of(EVENT) if e["reason"] == "HoldLifted"]


async def test_a_group_gone_has_the_template_its_request_left_deleted() -> None:
    """The group is gone; its sweep deleted the request, then met a 500 on the template's
    delete. By the retry the request has left the cache: the template is still swept (no
    garbage collector is assumed), as a Workload's is; before, a group's sweep looked at
    its requests only, so the template stayed for ever."""
    world = World(*gang())
    await world.settle()
    assert world.kube.all_of(POD_TEMPLATE) != []
    world.kube.remove(GROUPS, "g", "default")
    world.kube.fail("delete", "PodTemplate")
    with pytest.raises(ApiError):
        await world.reconcile()
    assert world.requests() == []
    await world.settle()
    assert world.kube.all_of(POD_TEMPLATE) == []


async def test_a_group_gone_before_discovery_has_answered_is_swept_once_it_has() -> None:
    """At a leader's start the key of a group deleted while gangcheck was down (routed by
    the request and template it left; no member left to route it again) is reconciled
    before discovery has answered: nothing can be confirmed then, so the key comes back
    and the sweep runs once discovery has answered. Before, the key was dropped and
    nothing routed it again: the request, and what it held, stayed for ever."""
    world = World(*gang())
    await world.settle()
    world.kube.remove(GROUPS, "g", "default")
    for i in range(3):
        world.kube.remove(POD, f"m{i}", "default")
    world.caches.pod_groups_discovered = False
    result = await world.reconcile()
    assert result.requeue_after is not None
    assert world.requests() != []
    world.caches.pod_groups_discovered = True
    await world.settle()
    assert world.requests() == []
    assert world.kube.all_of(POD_TEMPLATE) == []


async def test_a_group_made_again_since_the_read_is_not_given_the_old_ones_state() -> None:
    """The group is deleted and made again under its name (a job run again by a script)
    between the caches' read and the reconcile's write: the state decided for the one before
    is not merged into the new one (Released would let its members go with nothing asked)."""
    world = World(*gang())
    world.kube.sync(world.caches)  # the caches see the group of uid-g
    again = pod_group()
    again["metadata"]["uid"] = "uid-g-again"
    world.kube.add(again)  # the server has another one now, the caches not yet
    await world.reconciler.reconcile(KEY)
    stored = world.kube.stored(GROUPS, "g", "default")
    assert stored is not None and stored["metadata"]["uid"] == "uid-g-again"
    assert STATE_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    assert MESSAGE_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    await world.settle()  # its own events decide it
    assert world.group_says().get(STATE_ANNOTATION)
