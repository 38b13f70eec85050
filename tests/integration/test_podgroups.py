"""The PodGroup provisioner on a real API server (1.37, GenericWorkload on, scheduler-plugins
PodGroup CRD installed). The test plays the webhook (members are created gated, as it makes
them; test_webhook.py proves the webhook itself and one test here runs both) and the
autoscaler (it sets the request's conditions and adds the nodes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from gangcheck.app import Controller
from gangcheck.diagnose import diagnose
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import InvalidError, NotFoundError
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    EVENT,
    NAMESPACE,
    NODE,
    PLUGINS_POD_GROUP,
    POD,
    PROVISIONING_REQUEST,
    RESOURCE_CLAIM_TEMPLATE,
    UPSTREAM_POD_GROUP_V1BETA1,
)
from gangcheck.logic.attempt import deletion
from gangcheck.logic.attempt.hold import HOLD_TAINT
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE
from gangcheck.model.names import (
    ARRIVED_FOR,
    ATTEMPT_ANNOTATION,
    CONFIG_ANNOTATION,
    CONSUME_ANNOTATION,
    GANG_MEMBERS_ANNOTATION,
    GATE,
    MESSAGE_ANNOTATION,
    OPT_IN_LABEL,
    STATE_ANNOTATION,
    UNGATED_ANNOTATION,
)
from gangcheck.model.provisioning_config import recorded_spec
from gangcheck.reconcile.podgroup import PodGroupOptions
from tests.builders import container
from tests.integration.harness import PROGRESS_DELAY, Cluster, eventually
from tests.integration.test_dra_api import Devices, claim_template, devices, gpu  # noqa: F401
from tests.integration.test_webhook import (  # the webhook's fixtures, reused
    Certs,
    Pods,
    Running,
    certs,  # noqa: F401
    registered,
    until_the_webhook_gates,
    webhook,  # noqa: F401
)
from tests.waiting import cancelled

Obj = dict[str, Any]
RACK = "topology.example.com/rack"


class Groups:
    """PodGroups and their members in the test's namespace (opted in to gating)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kube: Kube = cluster.kube
        self.ns = cluster.ns

    async def opt_in(self) -> None:
        patch = {"metadata": {"labels": {OPT_IN_LABEL: OPT_IN_VALUE}}}
        await self.kube.merge_patch(NAMESPACE, self.ns, patch)

    async def upstream(
        self, name: str, min_count: int, *, topology: str = "", annotations: Obj | None = None
    ) -> Obj:
        spec: Obj = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
        if topology:
            spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
        meta: Obj = {"name": name, "namespace": self.ns, "annotations": annotations or {}}
        return await self.kube.create(UPSTREAM_POD_GROUP_V1BETA1, {"metadata": meta, "spec": spec})

    async def basic(self, name: str) -> Obj:
        body = {
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"schedulingPolicy": {"basic": {}}},
        }
        return await self.kube.create(UPSTREAM_POD_GROUP_V1BETA1, body)

    async def coscheduling(self, name: str, min_member: int) -> Obj:
        body = {"metadata": {"name": name, "namespace": self.ns}, "spec": {"minMember": min_member}}
        return await self.kube.create(PLUGINS_POD_GROUP, body)

    async def member(
        self, name: str, group: str, *, plugins: bool = False, gated: bool = True, gpu: int = 1
    ) -> Obj:
        """A member pod, as the webhook leaves it: gated (unless told otherwise)."""
        spec: Obj = {
            "containers": [container(gpu=gpu)],
            "restartPolicy": "Never",
            "nodeSelector": dict(self.cluster.pool),
        }
        meta: Obj = {"name": name, "namespace": self.ns}
        if plugins:
            meta["labels"] = {"scheduling.x-k8s.io/pod-group": group}
        else:
            spec["schedulingGroup"] = {"podGroupName": group}
        if gated:
            spec["schedulingGates"] = [{"name": GATE}]
        return await self.kube.create(POD, {"metadata": meta, "spec": spec})

    async def pod(self, name: str) -> Obj:
        return await self.kube.get(POD, name, self.ns)

    async def group(self, name: str, *, plugins: bool = False) -> Obj:
        res = PLUGINS_POD_GROUP if plugins else UPSTREAM_POD_GROUP_V1BETA1
        return await self.kube.get(res, name, self.ns)

    async def wait_state(
        self, name: str, state: str, *, plugins: bool = False, timeout: float = 20
    ) -> Obj:
        async def probe() -> Obj | None:
            obj = await self.group(name, plugins=plugins)
            notes = obj["metadata"].get("annotations") or {}
            return obj if notes.get(STATE_ANNOTATION) == state else None

        return await eventually(probe, timeout=timeout, what=f"PodGroup {name} {state}")

    async def bind(self, pod: str, node: str) -> None:
        """As kube-scheduler would (none runs here): the pod's binding to the node."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": self.ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.kube.request(
            "POST", f"/api/v1/namespaces/{self.ns}/pods/{pod}/binding", body=body
        )

    async def gated(self, *names: str) -> list[bool]:
        pods = [await self.pod(n) for n in names]
        return [
            any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or []) for p in pods
        ]


@pytest.fixture
async def groups(cluster: Cluster) -> Groups:
    g = Groups(cluster)
    await g.opt_in()
    return g


@pytest.fixture
async def provisioner(control_plane: Any) -> AsyncIterator[Controller]:
    """gangcheck's controller with the PodGroup provisioner, once it knows the served APIs."""
    async with controller_running(str(control_plane.kubeconfig)) as c:
        yield c


@contextlib.asynccontextmanager
async def controller_running(
    kubeconfig: str, options: PodGroupOptions | None = None
) -> AsyncIterator[Controller]:
    kube = await Kube.connect(kubeconfig)
    controller = Controller(
        kube,
        workers=2,
        watch_timeout=30,
        pod_groups=options or PodGroupOptions(),
        progress_delay_seconds=PROGRESS_DELAY,
    )
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.wait_for(controller.caches.wait_synced(), 60)

        async def discovered() -> bool:
            return controller.served_pod_groups is not None

        await eventually(discovered, what="PodGroup APIs discovered")
        yield controller
    finally:
        await cancelled(task)
        await kube.close()


def _annotations(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


async def test_the_server_serves_both_podgroup_apis(provisioner: Controller) -> None:
    served = provisioner.served_pod_groups
    assert served is not None
    assert served.upstream == UPSTREAM_POD_GROUP_V1BETA1
    assert served.plugins == PLUGINS_POD_GROUP


async def test_a_gang_that_fits_on_existing_nodes_is_released_together_without_a_request(
    groups: Groups, provisioner: Controller
) -> None:
    await groups.cluster.add_nodes(2, gpu=2)
    await groups.upstream("train", 3)
    for i in range(2):
        await groups.member(f"train-{i}", "train")

    async def two_of_three() -> Obj | None:
        obj = await groups.group("train")
        return obj if "2 of 3 exist" in _annotations(obj).get(MESSAGE_ANNOTATION, "") else None

    waiting = await eventually(two_of_three, what="waiting for the third member")
    assert _annotations(waiting)[STATE_ANNOTATION] == "WaitingForMembers"
    assert await groups.gated("train-0", "train-1") == [True, True]

    await groups.member("train-2", "train")
    released = await groups.wait_state("train", "Released")
    assert "fits on nodes that exist" in _annotations(released)[MESSAGE_ANNOTATION]
    assert await groups.gated("train-0", "train-1", "train-2") == [False, False, False]
    assert await groups.cluster.requests() == []
    await eventually(lambda: groups.cluster.events("GangReleased"), what="GangReleased")


async def test_coscheduling_gang_gets_one_request_and_is_released_when_nodes_exist(
    groups: Groups, provisioner: Controller
) -> None:
    await groups.coscheduling("ddp", 3)
    for i in range(3):
        await groups.member(f"ddp-{i}", "ddp", plugins=True)
    request = await groups.cluster.wait_request("ddp-coscheduling-1")
    assert [p["count"] for p in request["spec"]["podSets"]] == [3]  # identical: one pod set
    templates = await groups.cluster.templates()
    assert len(templates) == 1
    assert GATE not in str(templates[0]["template"]["spec"].get("schedulingGates"))
    await groups.wait_state("ddp", "Provisioning", plugins=True)

    # As the autoscaler: Provisioned, and the nodes arrive.
    await groups.cluster.set_request_conditions("ddp-coscheduling-1", {"Provisioned": "ok"})
    assert await groups.gated("ddp-0", "ddp-1", "ddp-2") == [True, True, True]
    await groups.cluster.add_nodes(3, gpu=1)
    await groups.wait_state("ddp", "Released", plugins=True)
    pods = [await groups.pod(f"ddp-{i}") for i in range(3)]
    assert all(_annotations(p)[CONSUME_ANNOTATION] == "ddp-coscheduling-1" for p in pods)
    assert await groups.gated("ddp-0", "ddp-1", "ddp-2") == [False, False, False]
    nodes = await groups.cluster.nodes()
    assert {_annotations(n).get(ARRIVED_FOR) for n in nodes} == {f"{groups.ns}/ddp-coscheduling-1"}


async def test_members_created_together_beyond_min_count_are_one_request_and_one_fit(
    groups: Groups, provisioner: Controller
) -> None:
    """minCount 4, then 6 members within a second: one request for all 6 (recorded on it),
    and the gang is released when those 6 fit: never a request for 4 that a fit for 6 dooms."""
    await groups.upstream("six", 4)
    for i in range(4):
        await groups.member(f"six-{i}", "six")
    await asyncio.sleep(0.5)  # time enough for a controller that reads at minCount to act
    for i in range(4, 6):
        await groups.member(f"six-{i}", "six")
    request = await groups.cluster.wait_request("six-pg-1")
    assert [p["count"] for p in request["spec"]["podSets"]] == [6]
    assert _annotations(request)[GANG_MEMBERS_ANNOTATION] == "6"

    await groups.cluster.set_request_conditions("six-pg-1", {"Provisioned": "ok"})
    await groups.cluster.add_nodes(6, gpu=1)
    released = await groups.wait_state("six", "Released")
    assert _annotations(released)[GANG_MEMBERS_ANNOTATION] == "6"
    assert _annotations(released).get(ATTEMPT_ANNOTATION, "1") == "1"
    names = [f"six-{i}" for i in range(6)]
    pods = [await groups.pod(n) for n in names]
    assert {_annotations(p)[CONSUME_ANNOTATION] for p in pods} == {"six-pg-1"}
    assert await groups.gated(*names) == [False] * 6


async def test_late_members_are_released_with_the_gang_and_later_ones_only_onto_room(
    groups: Groups, provisioner: Controller
) -> None:
    """minCount 2; 2 more members come after the request was made for the first 2. The fit
    demands the 2 it was made for, and the late ones are released with them (kube-scheduler
    starts a PodGroup only when none of its members is gated), consuming no request and not
    tolerating the hold on the gang's nodes. A member that comes once the gang is bound stays
    gated, with the reason on the group, until a node with room for it exists."""
    await groups.upstream("late", 2)
    for i in range(2):
        await groups.member(f"late-{i}", "late")
    await groups.cluster.wait_request("late-pg-1")
    for i in range(2, 4):
        await groups.member(f"late-{i}", "late")
    await groups.cluster.set_request_conditions("late-pg-1", {"Provisioned": "ok"})
    arrived = await groups.cluster.add_nodes(2, gpu=1)
    released = await groups.wait_state("late", "Released")
    assert _annotations(released)[GANG_MEMBERS_ANNOTATION] == "2"

    async def all_released() -> list[bool] | None:
        gates = await groups.gated("late-0", "late-1", "late-2", "late-3")
        return gates if not any(gates) else None

    await eventually(all_released, what="the late members released with the gang")
    await eventually(lambda: groups.cluster.events("LateMembersReleased"), what="the Event")
    for name in ("late-2", "late-3"):
        late = await groups.pod(name)
        assert CONSUME_ANNOTATION not in _annotations(late)
        tolerations = late["spec"].get("tolerations") or []
        assert not [t for t in tolerations if t.get("key") == HOLD_TAINT], name
    for pod, node in zip(("late-0", "late-1"), arrived, strict=True):
        await groups.bind(pod, node)

    await groups.member("late-4", "late")  # the gang is bound: this one waits for room

    async def told_why() -> Obj | None:
        obj = await groups.group("late")
        text = _annotations(obj).get(MESSAGE_ANNOTATION, "")
        return obj if "1 member(s) created after the gang was read wait for room" in text else None

    await eventually(told_why, what="the late member's reason on the group")
    await eventually(lambda: groups.cluster.events("LateMembersWaiting"), what="the Event")
    assert await groups.gated("late-4") == [True]
    (request,) = await groups.cluster.requests()
    assert request["metadata"]["name"] == "late-pg-1"  # no rollback, no second attempt

    await groups.cluster.add_nodes(1, gpu=1)  # room for it

    async def released_onto_room() -> bool | None:
        return True if await groups.gated("late-4") == [False] else None

    await eventually(released_onto_room, what="the member released onto the room")
    assert CONSUME_ANNOTATION not in _annotations(await groups.pod("late-4"))


async def test_late_members_waiting_are_said_once_with_their_real_count(
    groups: Groups, provisioner: Controller
) -> None:
    """Two members come once the gang is bound, with no room for them: one LateMembersWaiting
    Event names both (2 waiting, 0 of 2 placeable), and it is not said again while the same
    members wait, however often the group is reconciled and the fit worded anew (a node that
    does not help comes meanwhile), until room for both comes and they are released."""
    await groups.upstream("wait", 2)
    for i in range(2):
        await groups.member(f"wait-{i}", "wait")
    await groups.cluster.set_request_conditions("wait-pg-1", {"Provisioned": "ok"})
    arrived = await groups.cluster.add_nodes(2, gpu=1)
    await groups.wait_state("wait", "Released")
    for pod, node in zip(("wait-0", "wait-1"), arrived, strict=True):
        await groups.bind(pod, node)

    async def gang_started() -> bool:
        request = await groups.cluster.request("wait-pg-1")
        return request is not None and (
            request["metadata"]["annotations"].get("gangcheck.io/phase") == "Started"
        )

    await eventually(gang_started, what="the gang's request marked started")
    await groups.member("wait-2", "wait")
    await groups.member("wait-3", "wait")
    two = "released; 2 member(s) created after the gang was read wait for room"

    async def group_says(text: str) -> Obj | None:
        obj = await groups.group("wait")
        return obj if text in _annotations(obj).get(MESSAGE_ANNOTATION, "") else None

    async def said_for_two() -> list[Obj]:
        return [e for e in await groups.cluster.events("LateMembersWaiting") if two in e["message"]]

    await eventually(lambda: group_says(two), what="both late members said to wait")
    # (The first may have been read alone: "1 member(s)" waiting is said then, rightly.)
    told = await eventually(said_for_two, what="a LateMembersWaiting Event for both")
    assert len(told) == 1, [(e["metadata"]["creationTimestamp"], e["message"]) for e in told]
    (said,) = told
    assert "0 of 2 members placeable" in said["message"]
    before = _annotations(await groups.group("wait"))[MESSAGE_ANNOTATION]
    untolerated = {"key": "example.com/other", "value": "x", "effect": "NoSchedule"}
    await groups.cluster.add_nodes(1, gpu=2, taints=[untolerated])  # no help: reworded fit

    async def reworded() -> Obj | None:
        obj = await groups.group("wait")
        return obj if _annotations(obj).get(MESSAGE_ANNOTATION, "") != before else None

    await eventually(reworded, timeout=30, what="the late members' fit worded anew")
    await groups.cluster.add_nodes(1, gpu=2)  # room for both
    await groups.cluster.wait_events("LateMembersReleased", timeout=30)
    await eventually(
        lambda: group_says("2 member(s) created later released onto nodes that exist"),
        what="the late members released",
    )
    assert await groups.gated("wait-2", "wait-3") == [False, False]
    # The durable record: one Event for the two that waited, none for the rewording; at most
    # one more, for the first alone if it was read before the second came.
    told = await said_for_two()
    assert len(told) == 1, [(e["metadata"]["creationTimestamp"], e["message"]) for e in told]
    assert told[0]["metadata"]["name"] == said["metadata"]["name"]
    others = [
        e
        for e in await groups.cluster.events("LateMembersWaiting")
        if e["metadata"]["name"] != said["metadata"]["name"]
    ]
    assert len(others) <= 1, [e["message"] for e in others]
    assert all("released; 1 member(s) created after" in e["message"] for e in others)


async def test_partial_delivery_is_rolled_back_and_retried_with_backoff(
    groups: Groups, provisioner: Controller
) -> None:
    config = f"pg-{groups.ns}"
    spec = {
        "fulfillment": {"deadlineSeconds": 3, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 1},
    }
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.upstream("big", 2, annotations={CONFIG_ANNOTATION: config})
        await groups.member("big-0", "big", gpu=2)
        await groups.member("big-1", "big", gpu=2)
        await groups.cluster.set_request_conditions("big-pg-1", {"Provisioned": "ok"})
        arrived = await groups.cluster.add_nodes(1, gpu=2)  # one of two

        async def second_attempt() -> Obj | None:
            obj = await groups.group("big")
            return obj if _annotations(obj).get(ATTEMPT_ANNOTATION) == "2" else None

        backing_off = await eventually(second_attempt, timeout=30, what="attempt 2")
        assert "rolled back big-pg-1" in _annotations(backing_off)[MESSAGE_ANNOTATION]
        await groups.cluster.wait_request_gone("big-pg-1")
        with pytest.raises(NotFoundError):
            await groups.kube.get(NODE, arrived[0])  # the node that came for it: reclaimed
        assert await groups.gated("big-0", "big-1") == [True, True]
        second = await groups.cluster.wait_request("big-pg-2", timeout=20)
        assert second["metadata"]["annotations"][ATTEMPT_ANNOTATION] == "2"
        await eventually(lambda: groups.cluster.events("RolledBack"), what="RolledBack")
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_required_rack_topology_refuses_a_spread_gang_and_pins_the_rack(
    groups: Groups, provisioner: Controller
) -> None:
    await groups.cluster.add_nodes(2, gpu=1, labels={RACK: "a"})
    await groups.cluster.add_nodes(2, gpu=1, labels={RACK: "b"})
    await groups.upstream("tp", 3, topology=RACK)
    for i in range(3):
        await groups.member(f"tp-{i}", "tp")
    # 4 free GPUs, but no rack has 3: not released; capacity is requested instead.
    await groups.cluster.wait_request("tp-pg-1")
    await groups.cluster.set_request_conditions("tp-pg-1", {"Provisioned": "ok"})

    async def says_rack() -> Obj | None:
        # (the message on asking names the rack asked in too: wait for the fit's verdict)
        obj = await groups.group("tp")
        said = _annotations(obj).get(MESSAGE_ANNOTATION, "")
        return obj if f"one {RACK} domain" in said else None

    refused = await eventually(says_rack, what="the rack named in the message")
    assert "one topology.example.com/rack domain" in _annotations(refused)[MESSAGE_ANNOTATION]
    assert await groups.gated("tp-0", "tp-1", "tp-2") == [True, True, True]

    await groups.cluster.add_nodes(1, gpu=1, labels={RACK: "b"})  # rack b now has room
    await groups.wait_state("tp", "Released")
    pods = [await groups.pod(f"tp-{i}") for i in range(3)]
    assert {p["spec"]["nodeSelector"][RACK] for p in pods} == {"b"}
    assert await groups.gated("tp-0", "tp-1", "tp-2") == [False, False, False]


async def test_a_member_created_without_the_gate_is_reported(
    groups: Groups, provisioner: Controller
) -> None:
    await groups.upstream("leaky", 2)
    await groups.member("leaky-0", "leaky")
    await groups.member("leaky-1", "leaky", gated=False)  # as if the webhook was down

    async def reported() -> Obj | None:
        obj = await groups.group("leaky")
        return obj if _annotations(obj).get(UNGATED_ANNOTATION) == "leaky-1" else None

    await eventually(reported, what="the ungated member recorded")

    async def both() -> list[Obj] | None:
        events = await groups.cluster.events("MemberNotGated")
        kinds = {e["involvedObject"]["kind"] for e in events}
        return events if kinds == {"PodGroup", "Pod"} else None

    events = await eventually(both, what="MemberNotGated on the group and the pod")
    assert {e["involvedObject"]["kind"] for e in events} == {"PodGroup", "Pod"}
    assert any("leaky-1" in e["message"] for e in events)


async def test_a_member_whose_gate_is_removed_by_hand_is_released_onto_the_held_capacity(
    groups: Groups, provisioner: Controller
) -> None:
    """A member of a gang waiting for its request has its gate removed by hand: it is said
    (MemberNotGated), and at release it is given the request and the hold's toleration with
    the others, so it may take the room asked for it on the held nodes. Before, only the
    gated members were: the gang was fitted onto the held nodes with it, which it could not
    take, so it stayed pending until the start watchdog rolled the gang back."""
    await groups.coscheduling("bare", 3)
    for i in range(3):
        await groups.member(f"bare-{i}", "bare", plugins=True)
    await groups.cluster.wait_request("bare-coscheduling-1")
    await groups.wait_state("bare", "Provisioning", plugins=True)
    await groups.kube.merge_patch(POD, "bare-1", {"spec": {"schedulingGates": None}}, groups.ns)

    async def said() -> Obj | None:
        obj = await groups.group("bare", plugins=True)
        return obj if _annotations(obj).get(UNGATED_ANNOTATION) == "bare-1" else None

    await eventually(said, what="the member without its gate said")
    await groups.cluster.set_request_conditions("bare-coscheduling-1", {"Provisioned": "ok"})
    await groups.cluster.add_nodes(3, gpu=1)
    await groups.wait_state("bare", "Released", plugins=True)
    for i in range(3):
        pod = await groups.pod(f"bare-{i}")
        assert _annotations(pod)[CONSUME_ANNOTATION] == "bare-coscheduling-1", pod["metadata"]
        holds = [t for t in pod["spec"].get("tolerations") or [] if t.get("key") == HOLD_TAINT]
        assert len(holds) == 1, pod["spec"]
    assert await groups.gated("bare-0", "bare-1", "bare-2") == [False, False, False]
    events = await groups.cluster.events("GangReleased")
    assert any("whose gate was lifted before (bare-1)" in e["message"] for e in events)


async def test_members_already_gated_at_a_start_are_never_told_their_group_is_not_served(
    groups: Groups, control_plane: Any
) -> None:
    """A PodGroup and its gated members made while no controller runs: at its start the
    members' events come before discovery has said which PodGroup APIs the server serves.
    None is told its group does not exist or is not served (no PodGroupNotFound Event, no
    such reason on a member); the group is provisioned as any other (its request made)."""
    await groups.upstream("early", 2)
    for i in range(2):
        await groups.member(f"early-{i}", "early")
    async with controller_running(str(control_plane.kubeconfig)):
        await groups.cluster.wait_request("early-pg-1")
        await groups.wait_state("early", "Provisioning")
    assert await groups.cluster.events("PodGroupNotFound") == []
    for name in ("early-0", "early-1"):
        said = _annotations(await groups.pod(name)).get(MESSAGE_ANNOTATION, "")
        assert "does not serve" not in said and "does not exist" not in said, said


async def test_a_member_naming_a_missing_podgroup_says_why_it_waits(
    groups: Groups, provisioner: Controller
) -> None:
    await groups.member("lost-0", "nowhere")

    async def noted() -> Obj | None:
        pod = await groups.pod("lost-0")
        return pod if MESSAGE_ANNOTATION in _annotations(pod) else None

    pod = await eventually(noted, what="a reason on the pod")
    assert "'nowhere'" in _annotations(pod)[MESSAGE_ANNOTATION]
    assert "does not exist" in _annotations(pod)[MESSAGE_ANNOTATION]
    await eventually(lambda: groups.cluster.events("PodGroupNotFound"), what="the Event")

    await groups.cluster.add_nodes(1, gpu=1)
    await groups.upstream("nowhere", 1)  # the group appears: the gang goes ahead
    await groups.wait_state("nowhere", "Released")


async def test_a_basic_podgroup_is_no_gang_and_its_members_are_released(
    groups: Groups, provisioner: Controller
) -> None:
    await groups.basic("solo")
    await groups.member("solo-0", "solo")
    await groups.wait_state("solo", "NotAGang")
    assert await groups.gated("solo-0") == [False]


async def test_a_gang_larger_than_one_request_may_carry_fails_with_a_reason(
    groups: Groups, control_plane: Any
) -> None:
    options = PodGroupOptions(max_members=4)
    async with controller_running(str(control_plane.kubeconfig), options):
        await groups.upstream("huge", 5)
        await groups.member("huge-0", "huge")
        failed = await groups.wait_state("huge", "Failed")
        await eventually(lambda: groups.cluster.events("GangTooLarge"), what="the Event")
    assert "minCount 5 exceeds the 4 members" in _annotations(failed)[MESSAGE_ANNOTATION]
    assert await groups.cluster.requests() == []


async def test_a_missing_config_blocks_with_a_reason_until_it_exists(
    groups: Groups, provisioner: Controller
) -> None:
    config = f"late-{groups.ns}"
    await groups.cluster.add_nodes(1, gpu=1)
    await groups.upstream("cfg", 1, annotations={CONFIG_ANNOTATION: config})
    await groups.member("cfg-0", "cfg")
    blocked = await groups.wait_state("cfg", "Blocked")
    assert f"'{config}' not found" in _annotations(blocked)[MESSAGE_ANNOTATION]
    assert await groups.gated("cfg-0") == [True]

    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": {}})
    try:
        await groups.wait_state("cfg", "Released")  # nothing else changed: the config did
        assert await groups.gated("cfg-0") == [False]
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_config_serves_only_the_namespaces_its_selector_selects(
    groups: Groups, provisioner: Controller
) -> None:
    """A config whose spec.podGroups.namespaceSelector does not select the group's namespace:
    the group is Blocked saying so (and diagnose says it), nothing is asked; the namespace
    labelled, the gang is asked for; relabelled mid-attempt, the attempt goes on under the
    config it recorded and the gang is released on what arrived."""
    config = f"tenant-{groups.ns}"
    selector = {"matchLabels": {"example.com/tenant": "a"}}
    spec = {"podGroups": {"namespaceSelector": selector}, "fulfillment": {"reclaimer": "None"}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.upstream("tenant", 1, annotations={CONFIG_ANNOTATION: config})
        await groups.member("tenant-0", "tenant")
        blocked = await groups.wait_state("tenant", "Blocked")
        said = (
            f"AtomicProvisioningConfig '{config}' does not serve namespace '{groups.ns}' "
            "(spec.podGroups.namespaceSelector)"
        )
        assert _annotations(blocked)[MESSAGE_ANNOTATION] == said
        (event,) = await groups.cluster.wait_events("ConfigProblem")
        assert event["message"] == said
        report = await diagnose(groups.kube, f"podgroup/{groups.ns}/tenant")
        assert report.verdict.line == f"blocked: blocked by the config: {said}"
        assert await groups.cluster.request("tenant-pg-1") is None
        assert await groups.gated("tenant-0") == [True]

        await label_namespace(groups, "a")
        await groups.cluster.wait_request("tenant-pg-1")
        await groups.wait_state("tenant", "Provisioning")

        await label_namespace(groups, "b")  # no longer served: the attempt in flight goes on
        await groups.cluster.set_request_conditions("tenant-pg-1", {"Provisioned": "ok"})
        await groups.cluster.add_nodes(1, gpu=1)
        await groups.wait_state("tenant", "Released")
        assert await groups.gated("tenant-0") == [False]
        assert await groups.cluster.request("tenant-pg-2") is None
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_the_crd_refuses_a_namespace_selector_requirement_without_its_values(
    groups: Groups,
) -> None:
    """In and NotIn need values, Exists and DoesNotExist take none (the CRD's rule, as
    Kubernetes validates a LabelSelector); the model says the same of a config stored before."""
    bad = {"matchExpressions": [{"key": "example.com/tenant", "operator": "In"}]}
    body = {
        "metadata": {"name": f"bad-{groups.ns}"},
        "spec": {"podGroups": {"namespaceSelector": bad}},
    }
    with pytest.raises(InvalidError) as refused:
        await groups.kube.create(ATOMIC_CONFIG, body)
    assert "values are required with In and NotIn" in str(refused.value)


async def label_namespace(groups: Groups, tenant: str) -> None:
    patch = {"metadata": {"labels": {"example.com/tenant": tenant}}}
    await groups.kube.merge_patch(NAMESPACE, groups.ns, patch)


async def test_reserved_capacity_is_used_before_new_capacity_is_requested(
    groups: Groups, provisioner: Controller
) -> None:
    reservation = {"reservation.example.com/name": f"r-{groups.ns}"}
    config = f"res-{groups.ns}"
    spec = {"reservations": [{"name": "r1", "nodeLabels": reservation, "nodes": 2}]}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.cluster.add_nodes(3, gpu=1, labels=reservation)  # only 2 are reserved
        await groups.upstream("res", 5, annotations={CONFIG_ANNOTATION: config})
        for i in range(5):
            await groups.member(f"res-{i}", "res")
        request = await groups.cluster.wait_request("res-pg-1")
        # 5 members: 2 on the reservation, 1 on the third labelled node (there, not reserved)
        # is not counted as reserved, so 3 are asked for.
        assert [p["count"] for p in request["spec"]["podSets"]] == [3]
        assert _annotations(request)["gangcheck.io/reserved-members"] == "2"
        created = [
            e["message"]
            for e in await eventually(
                lambda: groups.cluster.events("Provisioning"), what="the Provisioning Event"
            )
        ]
        assert created == [
            "provisioning request res-pg-1 created for 3 pods (2 more placed on reserved capacity)"
        ]

        await groups.cluster.set_request_conditions("res-pg-1", {"Provisioned": "ok"})
        await groups.cluster.add_nodes(2, gpu=1)
        await groups.wait_state("res", "Released")
        scraped = provisioner.metrics.render()
        assert 'gangcheck_gang_members_total{capacity="reserved"} 2' in scraped
        assert 'gangcheck_gang_members_total{capacity="new"} 3' in scraped
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_the_webhook_gates_members_at_creation_and_the_gang_is_released_together(
    groups: Groups,
    provisioner: Controller,
    webhook: Running,  # noqa: F811 (the fixture imported above)
    certs: Certs,  # noqa: F811
) -> None:
    """The whole path: the API server calls the webhook (registered by URL), the members are
    created gated, the controller lifts every gate at once when the gang is complete."""
    await groups.cluster.add_nodes(3, gpu=1)
    await groups.coscheduling("hooked", 3)
    async with registered(groups.kube, webhook.url, certs.ca.cert_pem):
        await until_the_webhook_gates(Pods(groups.kube), groups.ns)
        first = [
            await groups.member(f"hooked-{i}", "hooked", plugins=True, gated=False)
            for i in range(2)
        ]
        assert [GATE in str(p["spec"].get("schedulingGates")) for p in first] == [True, True]
        await groups.wait_state("hooked", "WaitingForMembers", plugins=True)
        assert await groups.gated("hooked-0", "hooked-1") == [True, True]
        await groups.member("hooked-2", "hooked", plugins=True, gated=False)
    await groups.wait_state("hooked", "Released", plugins=True)
    assert await groups.gated("hooked-0", "hooked-1", "hooked-2") == [False, False, False]
    assert webhook.gated.count("scheduling.x-k8s.io") >= 3


async def test_dra_devices_decide_the_fit_and_a_claim_that_does_not_fit_is_named(
    groups: Groups,
    provisioner: Controller,
    devices: Devices,  # noqa: F811 (the fixture imported above)
) -> None:
    """Members asking for a GPU through a ResourceClaimTemplate fit only where a ResourceSlice
    publishes a free device: CPU and memory to spare are not enough."""
    (node_name,) = await groups.cluster.add_nodes(1, gpu=0)
    klass = await devices.device_class("gpus", f'device.driver == "{devices.driver}"')
    await devices.resource_slice(
        "node",
        {
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node_name,
            "devices": [gpu("gpu-0", "full"), gpu("gpu-1", "full")],
        },
    )
    body = claim_template(
        "one-gpu", klass, f'device.attributes["{devices.driver}"].model == "a100"'
    )
    body["metadata"]["namespace"] = groups.ns
    await groups.kube.create(RESOURCE_CLAIM_TEMPLATE, body)

    async def member_with_claim(name: str, group: str) -> None:
        spec: Obj = {
            "containers": [{**container(), "resources": {"claims": [{"name": "gpu"}]}}],
            "restartPolicy": "Never",
            "nodeSelector": dict(groups.cluster.pool),
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "schedulingGroup": {"podGroupName": group},
            "schedulingGates": [{"name": GATE}],
        }
        await groups.kube.create(
            POD, {"metadata": {"name": name, "namespace": groups.ns}, "spec": spec}
        )

    await groups.upstream("two", 2)
    for i in range(2):
        await member_with_claim(f"two-{i}", "two")
    # Two members, two free devices: released at once, no request. (No scheduler runs here,
    # so they stay unbound and hold no device: the next gang sees both free too.)
    await groups.wait_state("two", "Released")
    assert await groups.cluster.requests() == []

    await groups.upstream("three", 3)
    for i in range(3):
        await member_with_claim(f"three-{i}", "three")
    request = await groups.cluster.wait_request("three-pg-1")  # two devices for three members
    template = (await groups.cluster.templates())[0]
    assert template["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == (
        "one-gpu"
    )
    assert request["spec"]["podSets"][0]["count"] == 3
    await groups.cluster.set_request_conditions("three-pg-1", {"Provisioned": "ok"})

    async def names_the_claim() -> Obj | None:
        obj = await groups.group("three")
        return obj if 'claim "gpu"' in _annotations(obj).get(MESSAGE_ANNOTATION, "") else None

    waiting = await eventually(names_the_claim, what="the claim named in the message")
    assert "2 of 3 members placeable" in _annotations(waiting)[MESSAGE_ANNOTATION]


async def test_a_resource_slice_of_a_driver_no_device_class_selects_gets_an_event(
    groups: Groups,
    provisioner: Controller,
    devices: Devices,  # noqa: F811 (the fixture imported above)
) -> None:
    await devices.device_class("known", f'device.driver == "{devices.driver}"')
    stray = await devices.resource_slice(
        "stray",
        {
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [gpu("gpu-0", "full")],
        },
        driver=f"unknown-{groups.ns}.example.com",
    )
    name = stray["metadata"]["name"]

    async def event() -> list[Obj]:
        items = (await groups.kube.list_objects(EVENT, "default")).get("items") or []
        return [
            e
            for e in items
            if e["reason"] == "DeviceProblem" and e["involvedObject"]["name"] == name
        ]

    (said,) = await eventually(event, what="an Event on the stray ResourceSlice")
    assert said["involvedObject"]["kind"] == "ResourceSlice"
    assert "is not selected by any DeviceClass" in said["message"]


async def test_a_podgroup_attempt_in_flight_follows_its_config_as_a_workloads_does(
    groups: Groups, provisioner: Controller
) -> None:
    """The config a group names changes under its attempt in flight: a new deadlineSeconds
    moves the attempt's deadline; a new class before Provisioned replaces the attempt at once
    (no backoff) by one made under the new config (before, a PodGroup's attempt ignored both)."""
    config = f"drift-{groups.ns}"
    spec = {"fulfillment": {"deadlineSeconds": 600}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.upstream("drift", 2, annotations={CONFIG_ANNOTATION: config})
        for i in range(2):
            await groups.member(f"drift-{i}", "drift")
        first = await groups.cluster.wait_request("drift-pg-1")
        deadline = first["metadata"]["annotations"]["gangcheck.io/fulfillment-deadline"]

        async def set_spec(new: dict[str, Any]) -> None:
            obj = await groups.kube.get(ATOMIC_CONFIG, config)
            obj["spec"] = new
            await groups.kube.replace(ATOMIC_CONFIG, obj)

        await set_spec({"fulfillment": {"deadlineSeconds": 900}})

        async def moved() -> str | None:
            req = await groups.cluster.request("drift-pg-1")
            now = (req or {}).get("metadata", {}).get("annotations", {})
            said = now.get("gangcheck.io/fulfillment-deadline")
            return said if said and said != deadline else None

        later = await eventually(moved, what="the attempt's deadline moved")
        assert later > deadline  # RFC 3339 UTC times sort as text

        queued = "queued-provisioning.gke.io"
        await set_spec({"fulfillment": {"deadlineSeconds": 900}, "provisioningClassName": queued})
        second = await groups.cluster.wait_request("drift-pg-2", timeout=30)
        assert second["spec"]["provisioningClassName"] == queued
        await groups.cluster.wait_request_gone("drift-pg-1")
        (replaced,) = await groups.cluster.wait_events("RollbackStarted")
        assert "ConfigChanged: class" in replaced["message"]
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def race_config(groups: Groups, name: str, sources: Sequence[str]) -> tuple[str, str]:
    """An AtomicProvisioningConfig racing `sources` (each pinned by a node label of its own
    name's value; raceWidth at its default, 2). Returns (config, the sources' label key)."""
    config, src = f"{name}-{groups.ns}", f"{name}.example.com/source"
    spec = {
        "capacitySources": [{"name": n, "nodeSelector": {src: n}} for n in sources],
        "capacitySourcePolicy": "Race",
        "fulfillment": {"deadlineSeconds": 600, "reclaimer": "DeleteNode"},
    }
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    return config, src


async def racing_group(groups: Groups, name: str, config: str) -> tuple[Obj, Obj]:
    """A PodGroup `name` of 2 members under `config`; returns its first two asks (the race's
    two first racers)."""
    await groups.upstream(name, 2, annotations={CONFIG_ANNOTATION: config})
    for i in range(2):
        await groups.member(f"{name}-{i}", name, gpu=2)
    first = await groups.cluster.wait_request(f"{name}-pg-1")
    return first, await groups.cluster.wait_request(f"{name}-pg-1-s1")


async def test_a_podgroup_race_is_won_by_the_first_source_to_deliver_and_the_loser_reclaimed(
    groups: Groups, provisioner: Controller
) -> None:
    """capacitySourcePolicy Race for a PodGroup (issue 32): both sources asked at once, each
    request pinned to its source's nodes; source a delivers one node of two, source b the
    whole gang: the members are released onto b's request (consuming it), the group records
    b as the winner, and a's request is withdrawn with the node that arrived for it
    reclaimed by the safe path (DeleteNode)."""
    config, src = await race_config(groups, "race", ["a", "b"])
    try:
        first, second = await racing_group(groups, "race", config)
        assert second["metadata"]["annotations"]["gangcheck.io/capacity-source"] == "1"
        racing = await groups.wait_state("race", "Provisioning")
        assert _annotations(racing)[MESSAGE_ANNOTATION].startswith("racing: ")
        pinned = {
            t["metadata"]["name"]: t["template"]["spec"]["nodeSelector"][src]
            for t in await groups.cluster.templates()
        }
        named = {p["podTemplateRef"]["name"] for p in first["spec"]["podSets"]}
        assert {pinned[n] for n in named} == {"a"}

        # As the autoscaler of source a: Provisioned, one node of the two the gang needs.
        await groups.cluster.set_request_conditions("race-pg-1", {"Provisioned": "ok"})
        (partial,) = await groups.cluster.add_nodes(1, gpu=2, labels={src: "a"})

        async def recorded() -> bool:
            obj = await groups.kube.get(NODE, partial)
            return _annotations(obj).get(ARRIVED_FOR) == f"{groups.ns}/race-pg-1"

        await eventually(recorded, what="the partial delivery recorded for race-pg-1")
        assert await groups.gated("race-0", "race-1") == [True, True]

        # As the autoscaler of source b: the whole gang.
        await groups.cluster.set_request_conditions("race-pg-1-s1", {"Provisioned": "ok"})
        await groups.cluster.add_nodes(2, gpu=2, labels={src: "b"})
        released = await groups.wait_state("race", "Released", timeout=30)
        notes = _annotations(released)
        assert notes["gangcheck.io/request"] == "race-pg-1-s1"
        assert notes["gangcheck.io/race-won-by"] == "b"
        pods = [await groups.pod(f"race-{i}") for i in range(2)]
        assert {_annotations(p)[CONSUME_ANNOTATION] for p in pods} == {"race-pg-1-s1"}
        assert {p["spec"]["nodeSelector"][src] for p in pods} == {"b"}
        assert await groups.gated("race-0", "race-1") == [False, False]

        await groups.cluster.wait_request_gone("race-pg-1")
        assert await groups.cluster.request("race-pg-1-s1") is not None

        async def reclaimed() -> bool:
            try:
                await groups.kube.get(NODE, partial)
            except NotFoundError:
                return True
            return False

        await eventually(reclaimed, what="the node that arrived for the loser reclaimed")
        (won,) = await groups.cluster.wait_events("CapacityRaceWon")
        assert "race-pg-1-s1" in won["message"]
        said = await groups.cluster.wait_events("ReclaimingArrivals")
        assert any(partial in e["message"] and "race-pg-1" in e["message"] for e in said)
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_racer_deleted_by_hand_has_the_hold_it_left_lifted_and_the_race_goes_on(
    groups: Groups, provisioner: Controller
) -> None:
    """Race: source a delivers one node of two, then its request is deleted by hand. The node
    is recorded and held for a request that is gone, which nothing would ever lift: gangcheck
    lifts the hold (a HoldLifted Warning Event on the group names it) and does not reclaim
    the node; the race goes on with b, which delivers the whole gang and is released."""
    config, src = await race_config(groups, "byhand", ["a", "b"])
    try:
        await racing_group(groups, "byhand", config)
        await groups.cluster.set_request_conditions("byhand-pg-1", {"Provisioned": "ok"})
        (partial,) = await groups.cluster.add_nodes(1, gpu=2, labels={src: "a"})

        async def held() -> bool:
            obj = await groups.kube.get(NODE, partial)
            taints = obj["spec"].get("taints") or []
            return _annotations(obj).get(ARRIVED_FOR) == f"{groups.ns}/byhand-pg-1" and any(
                t["key"] == HOLD_TAINT for t in taints
            )

        await eventually(held, what="the partial delivery recorded and held for byhand-pg-1")
        await groups.kube.delete(PROVISIONING_REQUEST, "byhand-pg-1", groups.ns)

        async def lifted() -> bool:
            obj = await groups.kube.get(NODE, partial)
            return not any(t["key"] == HOLD_TAINT for t in obj["spec"].get("taints") or [])

        await eventually(lifted, what="the hold of the deleted racer lifted")
        (event,) = await groups.cluster.wait_events("HoldLifted", about="byhand")
        assert partial in event["message"] and "byhand-pg-1" in event["message"]
        await groups.cluster.set_request_conditions("byhand-pg-1-s1", {"Provisioned": "ok"})
        await groups.cluster.add_nodes(2, gpu=2, labels={src: "b"})
        released = await groups.wait_state("byhand", "Released", timeout=30)
        assert _annotations(released)["gangcheck.io/request"] == "byhand-pg-1-s1"
        await groups.kube.get(NODE, partial)  # not reclaimed: nothing proves it the racer's
        assert await groups.cluster.request("byhand-pg-1") is None
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_in_order_a_source_that_stops_short_is_topped_up_and_the_gang_released_on_both(
    groups: Groups, provisioner: Controller
) -> None:
    """InOrder (issue 32): source a delivers one of the two nodes the gang needs and no more;
    past its deadline its node is kept for the attempt (its request marked Kept, not
    withdrawn) and source b is asked for the other member only; the gang is released onto
    both sources' nodes, consuming b's request and tolerating both holds."""
    config = f"topup-{groups.ns}"
    src = "topup.example.com/source"
    spec = {
        "capacitySources": [
            {"name": "a", "nodeSelector": {src: "a"}, "deadlineSeconds": 4},
            {"name": "b", "nodeSelector": {src: "b"}},
        ],
        "fulfillment": {"deadlineSeconds": 600, "reclaimer": "DeleteNode"},
    }
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.upstream("topup", 2, annotations={CONFIG_ANNOTATION: config})
        for i in range(2):
            await groups.member(f"topup-{i}", "topup", gpu=2)
        await groups.cluster.wait_request("topup-pg-1")
        await groups.cluster.set_request_conditions("topup-pg-1", {"Provisioned": "ok"})
        (partial,) = await groups.cluster.add_nodes(1, gpu=2, labels={src: "a"})

        made = await groups.cluster.wait_request("topup-pg-1-s1", timeout=30)
        assert [p["count"] for p in made["spec"]["podSets"]] == [1]
        assert _annotations(made)["gangcheck.io/kept-from"] == "topup-pg-1"
        kept = await groups.cluster.request("topup-pg-1")
        assert kept is not None and _annotations(kept)["gangcheck.io/phase"] == "Kept"
        assert await groups.gated("topup-0", "topup-1") == [True, True]

        await groups.cluster.set_request_conditions("topup-pg-1-s1", {"Provisioned": "ok"})
        await groups.cluster.add_nodes(1, gpu=2, labels={src: "b"})
        released = await groups.wait_state("topup", "Released", timeout=30)
        assert _annotations(released)["gangcheck.io/request"] == "topup-pg-1-s1"
        pods = [await groups.pod(f"topup-{i}") for i in range(2)]
        assert {_annotations(p)[CONSUME_ANNOTATION] for p in pods} == {"topup-pg-1-s1"}
        assert all(src not in (p["spec"].get("nodeSelector") or {}) for p in pods)
        values = {
            t.get("value")
            for p in pods
            for t in p["spec"].get("tolerations") or []
            if t.get("key") == HOLD_TAINT
        }
        assert len(values) == 2, values  # the holds of both sources' nodes
        assert await groups.gated("topup-0", "topup-1") == [False, False]
        node = await groups.kube.get(NODE, partial)  # kept: not reclaimed
        assert _annotations(node)[ARRIVED_FOR] == f"{groups.ns}/topup-pg-1"
        (topped,) = await groups.cluster.wait_events("CapacityToppedUp")
        assert partial in topped["message"] and "topup-pg-1-s1" in topped["message"]
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_podgroup_whose_source_left_after_provisioned_is_released_onto_its_nodes(
    groups: Groups, provisioner: Controller
) -> None:
    """The attempt asks b of [a, b, c] (c asks b's class and parameters on other nodes), b
    is Provisioned, then b is removed from the config: c, now at b's index, is not taken for
    it. The attempt is kept, b's nodes arrive, and the gang is released pinned to them
    (before, it was pinned to c's nodes, and did not fit on b's)."""
    config = f"left-{groups.ns}"
    src = "left.example.com/source"
    listed = [{"name": name, "nodeSelector": {src: name}} for name in ("a", "b", "c")]
    spec = {"capacitySources": listed, "fulfillment": {"deadlineSeconds": 600}}
    await groups.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    try:
        await groups.upstream("left", 2, annotations={CONFIG_ANNOTATION: config})
        for i in range(2):
            await groups.member(f"left-{i}", "left", gpu=2)
        await groups.cluster.wait_request("left-pg-1")
        await groups.cluster.set_request_conditions("left-pg-1", {"Failed": "no capacity in a"})
        asked = await groups.cluster.wait_request("left-pg-1-s1", timeout=30)
        assert _annotations(asked)["gangcheck.io/capacity-source"] == "1"
        await groups.cluster.set_request_conditions("left-pg-1-s1", {"Provisioned": "ok"})

        async def seen_provisioned() -> bool:
            said = _annotations(await groups.group("left")).get(MESSAGE_ANNOTATION, "")
            return said.startswith("capacity requested, not yet usable")

        await eventually(seen_provisioned, what="left-pg-1-s1 seen Provisioned")
        obj = await groups.kube.get(ATOMIC_CONFIG, config)
        obj["spec"] = {**spec, "capacitySources": [listed[0], listed[2]]}
        await groups.kube.replace(ATOMIC_CONFIG, obj)
        await groups.cluster.add_nodes(2, gpu=2, labels={src: "b"})
        released = await groups.wait_state("left", "Released", timeout=30)
        assert _annotations(released)["gangcheck.io/request"] == "left-pg-1-s1"
        pods = [await groups.pod(f"left-{i}") for i in range(2)]
        assert {p["spec"]["nodeSelector"][src] for p in pods} == {"b"}
        assert {_annotations(p)[CONSUME_ANNOTATION] for p in pods} == {"left-pg-1-s1"}
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_podgroup_race_gives_a_place_to_a_source_put_first_while_it_ran(
    groups: Groups, provisioner: Controller
) -> None:
    """Race over [a, b]: a fails and its request is withdrawn (no source left to give its
    place to); then x is put first ([x, a, b]). b, not yet Provisioned, now sits at another
    index: it ends as a config change (rolled back) and gives its place to x, the one source
    the attempt has not asked, read by identity: a third ask of the same attempt, pinned to
    x's nodes, records the sources the race asked (x, a, b). Before, the race gave no place
    once a racer's source had moved, and the attempt ended as every source failed (the next
    after the backoff)."""
    config, src = await race_config(groups, "relist", ["a", "b"])
    a, b, x = ({"name": n, "nodeSelector": {src: n}} for n in ("a", "b", "x"))
    try:
        await racing_group(groups, "relist", config)
        await groups.cluster.set_request_conditions("relist-pg-1", {"Failed": "no capacity in a"})
        await groups.cluster.wait_request_gone("relist-pg-1", timeout=30)
        assert await groups.cluster.request("relist-pg-1-s2") is None

        obj = await groups.kube.get(ATOMIC_CONFIG, config)
        obj["spec"] = {**obj["spec"], "capacitySources": [x, a, b]}
        await groups.kube.replace(ATOMIC_CONFIG, obj)
        third = await groups.cluster.wait_request("relist-pg-1-s2", timeout=30)
        notes = _annotations(third)
        assert "gangcheck.io/capacity-source" not in notes  # source 0: x
        assert notes["gangcheck.io/sources-raced"] == "0,1,2"
        pinned = {
            t["metadata"]["name"]: t["template"]["spec"]["nodeSelector"][src]
            for t in await groups.cluster.templates()
        }
        named = {p["podTemplateRef"]["name"] for p in third["spec"]["podSets"]}
        assert {pinned[n] for n in named} == {"x"}
        await groups.cluster.wait_request_gone("relist-pg-1-s1", timeout=30)
        rolled = await groups.cluster.wait_events("RollbackStarted")
        assert any("ConfigChanged: spec.capacitySources[1] (b)" in e["message"] for e in rolled)
        group = _annotations(await groups.wait_state("relist", "Provisioning"))
        assert group.get("gangcheck.io/attempt", "1") == "1"  # the same attempt races on
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_podgroup_race_does_not_ask_again_a_source_whose_racer_was_withdrawn(
    groups: Groups, control_plane: Any
) -> None:
    """Race over [a, b, c], width 2: a fails, c is asked in its place (recording a, b, c);
    c fails with no source left and is withdrawn, b told first that every source was asked
    (gangcheck.io/sources-raced-all). gangcheck restarts; then b fails: the attempt ends as
    every source failed (BackingOff), c not asked again. Before, b's record knew only a and
    b, and b's failure asked c again (thrice-pg-1-s2 made anew)."""
    config, _ = await race_config(groups, "thrice", ["a", "b", "c"])
    kubeconfig = str(control_plane.kubeconfig)
    try:
        async with controller_running(kubeconfig):
            await racing_group(groups, "thrice", config)
            await groups.cluster.set_request_conditions("thrice-pg-1", {"Failed": "none in a"})
            third = await groups.cluster.wait_request("thrice-pg-1-s2", timeout=30)
            assert _annotations(third)["gangcheck.io/sources-raced"] == "0,1,2"
            await groups.cluster.wait_request_gone("thrice-pg-1", timeout=30)
            await groups.cluster.set_request_conditions("thrice-pg-1-s2", {"Failed": "none in c"})
            await groups.cluster.wait_request_gone("thrice-pg-1-s2", timeout=30)
            b = await groups.cluster.request("thrice-pg-1-s1")
            assert b is not None
            told = recorded_spec(_annotations(b)["gangcheck.io/sources-raced-all"])
            assert told is not None and [s.name for s in told.sources()] == ["a", "b", "c"]
        async with controller_running(kubeconfig):  # a restart: nothing in memory
            await groups.cluster.set_request_conditions("thrice-pg-1-s1", {"Failed": "none in b"})
            ended = _annotations(await groups.wait_state("thrice", "BackingOff", timeout=30))
            assert "every capacity source failed" in ended[MESSAGE_ANNOTATION]
            assert ended["gangcheck.io/attempt"] == "2"  # the next, after the backoff
            assert await groups.cluster.request("thrice-pg-1-s2") is None
            assert await groups.cluster.request("thrice-pg-1-s3") is None
    finally:
        await groups.kube.delete(ATOMIC_CONFIG, config)


async def test_a_groups_request_held_in_deletion_by_a_finalizer_is_said_on_the_group(
    groups: Groups, provisioner: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's request is deleted while another controller's finalizer holds it: the
    group waits (its next ask is made under the same name). Past the grace its message says
    so, naming the request, its finalizer and since when, its state kept; one
    RequestStuckDeleting Warning; diagnose says the same line; the finalizer is left alone.
    Before, it was polled every second for ever with nothing said."""
    monkeypatch.setattr(deletion, "GRACE_SECONDS", 2.0)  # 30 s in production
    await groups.coscheduling("ddp", 3)
    for i in range(3):
        await groups.member(f"ddp-{i}", "ddp", plugins=True)
    name = "ddp-coscheduling-1"
    await groups.cluster.wait_request(name)
    await groups.wait_state("ddp", "Provisioning", plugins=True)
    kube, ns = groups.kube, groups.ns
    await kube.merge_patch(
        PROVISIONING_REQUEST, name, {"metadata": {"finalizers": ["example.com/keep"]}}, ns
    )
    try:
        await kube.delete(PROVISIONING_REQUEST, name, ns)
        held = await groups.cluster.wait_request(name)
        said = (
            f"waiting for ProvisioningRequest {name} to be deleted: finalizers "
            f"[example.com/keep] remain since {held['metadata']['deletionTimestamp']}"
        )

        async def saying() -> Obj | None:
            group = await groups.group("ddp", plugins=True)
            return group if _annotations(group).get(MESSAGE_ANNOTATION) == said else None

        group = await eventually(saying, what="the group to say the request is held")
        assert _annotations(group)[STATE_ANNOTATION] == "Provisioning"
        (event,) = await groups.cluster.wait_events("RequestStuckDeleting", about="ddp")
        assert event["type"] == "Warning" and event["message"] == said
        report = await diagnose(kube, f"podgroup/{ns}/ddp")
        assert report.verdict.line == f"blocked: {said}"
        assert await groups.gated("ddp-0", "ddp-1", "ddp-2") == [True, True, True]
        still = await groups.cluster.request(name)
        assert still is not None and still["metadata"]["finalizers"] == ["example.com/keep"]
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.merge_patch(
                PROVISIONING_REQUEST, name, {"metadata": {"finalizers": None}}, ns
            )
    assert len(await groups.cluster.events("RequestStuckDeleting")) == 1
