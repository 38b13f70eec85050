"""Table tests of a PodGroup's diagnosis: which link blocks the gang, in one line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.diagnose.as_json import to_json
from gangcheck.diagnose.earlier import group_attempts
from gangcheck.diagnose.reports import GroupReport
from gangcheck.diagnose.text import render_text
from gangcheck.logic.attempt.explain import World, human_duration
from gangcheck.logic.podgroups.group_diagnosis import (
    gather_group,
    group_row,
    group_verdict,
    in_flight,
    members_by_group,
    start_watch_of,
)
from gangcheck.logic.podgroups.podgroup import gang_from_pods
from gangcheck.logic.workloads.diagnosis import Ended, Target, parse_target
from gangcheck.model.names import CONSUME_ANNOTATION as CONSUME
from gangcheck.model.names import GATE, GATED_AT
from gangcheck.model.objects import pod_of, request_of
from gangcheck.model.podgroups import PLUGINS, UPSTREAM, pod_group_of
from gangcheck.model.provisioning_config import parse_spec, spec_record
from tests.builders import container, node, provisioning_request

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
LATER = "2026-11-30T10:20:00Z"
ARRIVED = "2026-11-30T10:00:01Z"
"""A node created a second after the request: proven younger, so it arrived for it."""
Obj = dict[str, Any]


def group(min_count: int = 3, *, plugins: bool = False, basic: bool = False, **notes: str) -> Obj:
    """A PodGroup `g`; keyword arguments are gangcheck's annotations, without the prefix."""
    annotations = {f"gangcheck.io/{k.replace('_', '-')}": v for k, v in notes.items()}
    meta = {
        "name": "g",
        "namespace": "default",
        "uid": "uid-g",
        "creationTimestamp": "2026-11-30T10:00:00Z",
        "annotations": annotations,
    }
    if plugins:
        spec: Obj = {"minMember": min_count}
        return {"apiVersion": f"{PLUGINS}/v1alpha1", "metadata": meta, "spec": spec}
    policy: Obj = {"basic": {}} if basic else {"gang": {"minCount": min_count}}
    return {
        "apiVersion": f"{UPSTREAM}/v1beta1",
        "metadata": meta,
        "spec": {"schedulingPolicy": policy},
    }


def member(i: int, *, gated: bool = True, gpu: int = 1, node_name: str = "", **meta: Any) -> Obj:
    spec: Obj = {"containers": [container(gpu=gpu)], "schedulingGroup": {"podGroupName": "g"}}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": f"m{i}", "namespace": "default", **meta}, "spec": spec}


def not_scheduled(pod: Obj, reason: str, message: str) -> Obj:
    """The pod with PodScheduled=False as the API server or kube-scheduler leaves it."""
    condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
    return {**pod, "status": {"phase": "Pending", "conditions": [condition]}}


def unschedulable(pod: Obj) -> Obj:
    """The pod as kube-scheduler leaves one it cannot place."""
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    return not_scheduled(pod, "Unschedulable", message)


def still_gated_condition(pod: Obj) -> Obj:
    """The pod as the API server leaves one created gated, until the scheduler looks."""
    message = "Scheduling is blocked due to non-empty scheduling gates"
    return not_scheduled(pod, "SchedulingGated", message)


def members(count: int, **kw: Any) -> list[Obj]:
    return [member(i, **kw) for i in range(count)]


def req(name: str = "g-pg-1", count: int = 3, **conditions: str) -> Obj:
    """A request as the provisioner makes one, made at 10:00 under a config whose
    deadlineSeconds (1200, recorded with the attempt) puts its deadline at LATER."""
    annotations = {
        "gangcheck.io/pod-group": "pg/g",
        "gangcheck.io/pod-group-uid": "uid-g",
        "gangcheck.io/fulfillment-deadline": LATER,
        "gangcheck.io/attempt-config": '{"fulfillment":{"deadlineSeconds":1200}}',
    }
    return provisioning_request(
        name,
        templates=[(f"{name}-ps-0", count)],
        conditions=conditions,
        annotations=annotations,
    )


PROVISIONING = {"state": "Provisioning", "request": "g-pg-1"}


def racked(pod_group: Obj, level: str = "rack") -> Obj:
    """The group with a required topology level: the whole gang inside one domain of it."""
    pod_group["spec"]["schedulingConstraints"] = {"topology": [{"key": level}]}
    return pod_group


NO_RACK = "none carries the required topology level rack: the gang cannot fit in one domain"
ROLLED_BACK = "rolled back g-pg-1 (deadline passed); 1 node reclaimed"
KEPT_WRITTEN = (
    "rolled back g-pg-4 (Deadline: x); reclaimed 1 node (1.0 node-minutes held); kept n1 (runs "
    "pod default/a), n2 (runs pod default/b)"
)
"""A rollback's message, written when both kept nodes were there."""
KEPT_NOW = KEPT_WRITTEN.replace(
    "kept n1 (runs pod default/a), n2", "kept n1 (runs pod default/a); kept then, gone since: n2"
)


GROW1 = "g-pg-grow-1"
RAN = {"state": "Released", "request": "g-pg-1", "gang_members": "4"}
"""A group released with 4 members, whose minCount was raised to 6 since: a growth."""
START_DEADLINE = (
    "StartDeadline: 1 of 2 members released together bound within 600s of their release "
    "(unbound: m5)"
)
GROWTH_OUTCOME = '{"draining": ["n2"], "kept": {}, "nodeSeconds": 60, "reclaimed": []}'
GROWTH_ROLLED_BACK = (
    f"growth {GROW1} was rolled back: {START_DEADLINE}; reclaimed 0 nodes (1.0 node-minutes "
    "held); 1 to reclaim once the gang's pods leave"
)


def ran() -> list[Obj]:
    """The 4 members released with the gang, bound."""
    return [
        member(i, gated=False, node_name="n0", annotations={CONSUME: "g-pg-1"}) for i in range(4)
    ]


def grown(*bound: int) -> list[Obj]:
    """The 2 members released onto growth g-pg-grow-1 (m4, m5), `bound` of them on n2."""
    return [
        member(i, gated=False, node_name="n2" if i in bound else "", annotations={CONSUME: GROW1})
        for i in (4, 5)
    ]


def started() -> Obj:
    """The gang's own request, its members all bound."""
    made = req(count=4, Provisioned="ok")
    made["metadata"]["annotations"]["gangcheck.io/phase"] = "Started"
    return made


def grow(conditions: dict[str, str] | None = None, **notes: str) -> Obj:
    """Growth g-pg-grow-1 for the 2 members minCount 6 added to the 4 running, Provisioned
    (`conditions`: the autoscaler's answer instead); `notes`: its record (gangcheck's
    annotations, without the prefix)."""
    annotations = {
        "gangcheck.io/pod-group": "pg/g",
        "gangcheck.io/pod-group-uid": "uid-g",
        "gangcheck.io/gang-members": "2",
        "gangcheck.io/grows-group": "4",
        **{f"gangcheck.io/{k.replace('_', '-')}": v for k, v in notes.items()},
    }
    return provisioning_request(
        GROW1,
        templates=[(f"{GROW1}-ps-0", 2)],
        conditions={"Provisioned": "ok"} if conditions is None else conditions,
        annotations=annotations,
    )


def asking(conditions: dict[str, str] | None = None, **notes: str) -> Obj:
    """The growth in flight, asked at 10:00, its deadline at LATER (10:20)."""
    return grow(conditions, fulfillment_deadline=LATER, **notes)


def waiting_growth(*numbers: int) -> list[Obj]:
    """The members minCount added since the release, gated (m4, m5 by default)."""
    return [member(i) for i in numbers or (4, 5)]


FULL_N0 = node("n0", gpu=4)
"""The node the 4 running members fill: the growth's members fit nowhere."""
GROWTH_ASKS = f"growth {GROW1} asks for the 2 gated members minCount 6 added (m4, m5)"
NO_ROOM = "0 of 2 members placeable; 1 node can take none: 1 × insufficient nvidia.com/gpu"  # noqa: RUF001


def start_rolled(**notes: str) -> Obj:
    """The growth its start watchdog rolls back (StartDeadline recorded)."""
    return grow(
        phase="RollingBack",
        rollback_reason=START_DEADLINE,
        rollback_nodes='{"n2": "2026-11-30T10:00:01Z"}',
        released_at="2026-11-30T09:50:00Z",
        **notes,
    )


@dataclass
class Case:
    id: str
    group: Obj | None
    members: list[Obj]
    line: str
    phase: str
    requests: list[Obj] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    served: bool = True
    opted_in: bool | None = True
    events: list[Obj] = field(default_factory=list)
    """The Events on the group."""


def rolled_back_event(message: str, at: str) -> Obj:
    """gangcheck's Event on the group as a rollback of one of its requests is done."""
    return {
        "reason": "RolledBack",
        "type": "Normal",
        "message": message,
        "involvedObject": {"kind": "PodGroup", "namespace": "default", "name": "g", "uid": "uid-g"},
        "firstTimestamp": at,
        "lastTimestamp": at,
    }


NONE_RECLAIMED = "reclaimed 0 nodes (0.0 node-minutes held)"
FIRST_ROLLED_BACK = f"rolled back g-pg-1 (Failed: no capacity in zone a); {NONE_RECLAIMED}"
SECOND_ROLLED_BACK = (
    "rolled back g-pg-2 (Deadline: the gang did not fit within 600s); reclaimed 1 node (1.0 "
    "node-minutes held)"
)
EARLIER_EVENTS = [
    rolled_back_event(SECOND_ROLLED_BACK, "2026-11-30T10:03:00Z"),
    rolled_back_event(FIRST_ROLLED_BACK, "2026-11-30T10:01:00Z"),
    # a growth's rollback: said with the growth, no attempt's
    rolled_back_event(f"rolled back g-pg-grow-1 (Deadline: x); {NONE_RECLAIMED}", LATER),
    rolled_back_event(f"rolled back other-pg-1 (Deadline: x); {NONE_RECLAIMED}", LATER),
]


CASES = [
    Case(
        "no group, no member",
        None,
        [],
        "blocked: PodGroup not found",
        "missing",
    ),
    Case(
        "no group, gated members wait for it",
        None,
        members(2),
        "blocked: PodGroup not found; 2 gated members name it and wait for it (pods m0, m1)",
        "missing",
    ),
    Case(
        "API not served",
        None,
        members(1),
        "blocked: this cluster does not serve scheduling.k8s.io PodGroups; 1 gated member "
        "names it (pod m0)",
        "missing",
        served=False,
    ),
    Case(
        "API not served, 2 gated members",
        None,
        members(2),
        "blocked: this cluster does not serve scheduling.k8s.io PodGroups; 2 gated members "
        "name it (pods m0, m1)",
        "missing",
        served=False,
    ),
    Case(
        "no group, one gated member waits for it",
        None,
        members(1),
        "blocked: PodGroup not found; 1 gated member names it and waits for it (pod m0)",
        "missing",
    ),
    Case(
        "no group, one member without the gate names it",
        None,
        members(1, gated=False),
        "blocked: PodGroup not found; 1 member names it (pod m0)",
        "missing",
    ),
    Case(
        "deleting",
        {**group(), "metadata": {**group()["metadata"], "deletionTimestamp": LATER}},
        members(3),
        "not blocked: the PodGroup is being deleted",
        "new",
    ),
    Case(
        "malformed gang size",
        group(0),
        members(3),
        "blocked: invalid PodGroup: schedulingPolicy.gang.minCount 0 is not a positive integer",
        "not a gang",
    ),
    Case(
        "basic policy",
        group(basic=True, state="NotAGang"),
        members(2, gated=False),
        "not blocked: not a gang (no gang policy): its members are released as they come",
        "not a gang",
    ),
    Case(
        "two of four",
        group(4, state="WaitingForMembers", message="waiting for members: 2 of 4 exist"),
        members(2),
        "blocked: waiting for members: 2 of 4 exist",
        "waiting",
    ),
    Case(
        "none exists yet",
        group(4),
        [],
        "blocked: waiting for members: 0 of 4 exist",
        "waiting",
    ),
    Case(
        "finished and deleted members do not count",
        group(3, state="WaitingForMembers"),
        [
            *members(2),
            {**member(2), "status": {"phase": "Succeeded"}},
            member(3, deletionTimestamp=LATER),
        ],
        "blocked: waiting for members: 2 of 3 exist",
        "waiting",
    ),
    Case(
        "webhook down: no member gated",
        group(2),
        members(2, gated=False),
        "blocked: members not gated: the webhook may be down (pods m0, m1)",
        "not gated",
    ),
    Case(
        "namespace not opted in",
        group(2),
        members(2, gated=False),
        "blocked: members not gated: namespace default is not opted in, no label "
        "gangcheck.io/gang-provisioning=enabled (pods m0, m1)",
        "not gated",
        opted_in=False,
    ),
    Case(
        "one member's gate removed after the webhook added it, one never gated: each said",
        group(2),
        [
            member(0, gated=False, annotations={GATED_AT: "2026-11-30T10:00:00Z"}),
            member(1, gated=False),
        ],
        "blocked: members not gated: the webhook may be down (pod m1); the gate removed after "
        "the webhook added it (pod m0)",
        "not gated",
    ),
    Case(
        "one member missed the gate: said after the reason",
        group(4, state="WaitingForMembers"),
        [*members(2), member(2, gated=False)],
        "blocked: waiting for members: 3 of 4 exist; members not gated: the webhook may be "
        "down (pod m2)",
        "waiting",
    ),
    Case(
        "complete, but the controller never acted",
        group(3),
        members(3),
        "blocked: gangcheck has not acted on the PodGroup yet (no gangcheck.io/state "
        "annotation); is the controller running with the PodGroup provisioner?",
        "new",
    ),
    Case(
        "fits now, not released",
        group(2, state="WaitingForMembers"),
        members(2),
        "blocked: the whole gang fits on nodes that exist; waiting for gangcheck to release it "
        "(is the controller running?)",
        "waiting",
        nodes=[node("n0", gpu=2)],
    ),
    Case(
        "members created a second ago: being read, not a controller that is down",
        group(4, state="WaitingForMembers"),
        [member(i, creationTimestamp="2026-11-30T10:04:59Z") for i in range(6)],
        "blocked: reading the members: 6 exist (minCount 4); gangcheck acts once none has been "
        "created for 2s",
        "waiting",
    ),
    Case(
        "request missing",
        group(3, **PROVISIONING),
        members(3),
        "blocked: ProvisioningRequest g-pg-1 does not exist yet (is the gangcheck controller "
        "running?)",
        "pending",
    ),
    Case(
        "not accepted yet",
        group(3, **PROVISIONING),
        members(3),
        "blocked: capacity requested (g-pg-1, not accepted yet, deadline in 15m): 0 of 3 "
        "members placeable; no nodes",
        "requested",
        requests=[req()],
    ),
    Case(
        "its request held in deletion past the grace: the finalizer and since when, as the "
        "group's message says",
        group(3, **PROVISIONING),
        members(3),
        "blocked: waiting for ProvisioningRequest g-pg-1 to be deleted: finalizers "
        "[example.com/keep] remain since 2026-11-30T10:00:00Z",
        "requested",
        requests=[
            {
                **req(),
                "metadata": {
                    **req()["metadata"],
                    "deletionTimestamp": "2026-11-30T10:00:00Z",
                    "finalizers": ["example.com/keep"],
                },
            }
        ],
    ),
    Case(
        "accepted, partly placeable on existing nodes",
        group(4, **PROVISIONING),
        members(4),
        "blocked: capacity requested (g-pg-1, accepted, not provisioned yet, deadline in 15m): "
        "3 of 4 members placeable on 1 node; the nodes in use have no room for the rest",
        "requested",
        requests=[req(count=4, Accepted="")],
        nodes=[node("n0", gpu=3, created="2026-11-30T09:00:00Z"), node("n1", gpu=0)],
    ),
    Case(
        "provisioned, one of two nodes arrived",
        group(2, **PROVISIONING),
        members(2, gpu=2),
        "blocked: waiting for the autoscaler: 1 of 2 members placeable on 1 node; the nodes in "
        "use have no room for the rest, deadline in 15m",
        "fulfilling",
        requests=[req(count=2, Provisioned="ok")],
        nodes=[node("n0", gpu=2, created=ARRIVED)],
    ),
    Case(
        "provisioned, arrived with a taint",
        group(1, **PROVISIONING),
        members(1),
        "blocked: 1 node arrived, none usable: 0 of 1 members placeable; 1 node can take none: "
        "1 × taint nvidia.com/gpu:NoSchedule not tolerated; node n0: taint "  # noqa: RUF001
        "nvidia.com/gpu=x:NoSchedule not tolerated",
        "fulfilling",
        requests=[req(count=1, Provisioned="ok")],
        nodes=[
            node(
                "n0",
                taints=[{"key": "nvidia.com/gpu", "value": "x", "effect": "NoSchedule"}],
                created=ARRIVED,
            )
        ],
    ),
    Case(
        "provisioned, the nodes that arrived carry no rack: said so, not 'no node has arrived'",
        racked(group(2, **PROVISIONING)),
        members(2),
        f"blocked: 2 nodes arrived for this attempt; {NO_RACK}; ignoring the level, 2 of 2 "
        "members placeable on 2 nodes; waiting until the deadline in case they are labelled, "
        "deadline in 15m",
        "fulfilling",
        requests=[req(count=2, Provisioned="ok")],
        nodes=[node(f"n{i}", gpu=1, created=ARRIVED) for i in range(2)],
    ),
    Case(
        "provisioned, none arrived for it and the nodes there carry no rack",
        racked(group(2, **PROVISIONING)),
        members(2),
        "blocked: no node the gang may use carries the required topology level rack: the gang "
        "cannot fit in one domain; ignoring the level, 2 of 2 members placeable on 2 nodes, "
        "deadline in 15m",
        "provisioned",
        requests=[req(count=2, Provisioned="ok")],
        nodes=[node(f"n{i}", gpu=1, created="2026-11-30T09:00:00Z") for i in range(2)],
    ),
    Case(
        "provisioned and fits, not released",
        group(2, **PROVISIONING),
        members(2),
        "blocked: g-pg-1 is Provisioned and the whole gang fits; waiting for gangcheck to "
        "release the members (is the controller running?)",
        "fulfilling",
        requests=[req(count=2, Provisioned="ok")],
        nodes=[node("n0", gpu=2, created=ARRIVED)],
    ),
    Case(
        "the autoscaler failed",
        group(2, **PROVISIONING),
        members(2),
        "blocked: the autoscaler failed g-pg-1: out of quota in zone a",
        "rolling back",  # the provisioner starts the rollback at once
        requests=[req(count=2, Failed="out of quota in zone a")],
    ),
    Case(
        "booking expired",
        group(2, **PROVISIONING),
        members(2),
        "blocked: the booking of g-pg-1 expired: booked for 10m",
        "rolling back",
        requests=[req(count=2, Provisioned="ok", BookingExpired="booked for 10m")],
    ),
    Case(
        "rolling back",
        group(2, **PROVISIONING),
        members(2),
        "blocked: rolling back attempt 1: deadline passed",
        "rolling back",
        requests=[
            {
                **req(count=2, Provisioned="ok"),
                "metadata": {
                    **req()["metadata"],
                    "annotations": {
                        **req()["metadata"]["annotations"],
                        "gangcheck.io/phase": "RollingBack",
                        "gangcheck.io/rollback-reason": "deadline passed",
                    },
                },
            }
        ],
    ),
    Case(
        "backing off",
        group(
            2,
            state="BackingOff",
            attempt="2",
            next_attempt_at="2026-11-30T10:06:30Z",
            message=f"attempt 2 at 2026-11-30T10:06:30Z: {ROLLED_BACK}",
        ),
        members(2),
        f"blocked: backing off: attempt 2 starts in 1m30s; {ROLLED_BACK}",
        "backoff",
    ),
    Case(
        "backoff over, next request not made",
        group(
            2,
            state="BackingOff",
            attempt="2",
            next_attempt_at="2026-11-30T10:04:00Z",
            message=f"attempt 2 at 2026-11-30T10:04:00Z: {ROLLED_BACK}",
        ),
        members(2),
        "blocked: ProvisioningRequest g-pg-2 does not exist yet (is the gangcheck controller "
        "running?)",
        "backoff",
    ),
    Case(
        "a request of an earlier group of the same name is not this one's",
        group(2, **PROVISIONING),
        members(2),
        "blocked: ProvisioningRequest g-pg-1 does not exist yet (is the gangcheck controller "
        "running?)",
        "pending",
        requests=[
            {
                **req(count=2),
                "metadata": {
                    **req()["metadata"],
                    "annotations": {"gangcheck.io/pod-group-uid": "uid-old"},
                },
            }
        ],
    ),
    Case(
        "gave up",
        group(
            2,
            state="GaveUp",
            attempt="4",
            message="gave up after attempt 4: rolled back g-pg-4 (deadline passed)",
        ),
        members(2),
        "blocked: gave up after attempt 4: rolled back g-pg-4 (deadline passed)",
        "gave up",
    ),
    Case(
        "gave up after a rollback that kept a node deleted since: said gone, not kept",
        group(2, state="GaveUp", attempt="4", message=f"gave up after attempt 4: {KEPT_WRITTEN}"),
        members(2),
        f"blocked: gave up after attempt 4: {KEPT_NOW}",
        "gave up",
        nodes=[node("n1")],
    ),
    Case(
        "backing off after a rollback that kept a node deleted since: said gone, not kept",
        group(
            2,
            state="BackingOff",
            attempt="2",
            next_attempt_at="2026-11-30T10:06:30Z",
            message=f"attempt 2 at 2026-11-30T10:06:30Z: {KEPT_WRITTEN}",
        ),
        members(2),
        f"blocked: backing off: attempt 2 starts in 1m30s; {KEPT_NOW}",
        "backoff",
        nodes=[node("n1")],
    ),
    Case(
        "gave up after a rollback that kept a node still there: as written",
        group(2, state="GaveUp", attempt="4", message=f"gave up after attempt 4: {KEPT_WRITTEN}"),
        members(2),
        f"blocked: gave up after attempt 4: {KEPT_WRITTEN}",
        "gave up",
        nodes=[node("n1"), node("n2")],
    ),
    Case(
        "failed",
        group(2, state="Failed", message="minCount 9000 exceeds the 5000 members"),
        members(2),
        "blocked: failed: minCount 9000 exceeds the 5000 members",
        "failed",
    ),
    Case(
        "blocked by a missing config",
        group(2, state="Blocked", message="AtomicProvisioningConfig 'x' not found"),
        members(2),
        "blocked: blocked by the config: AtomicProvisioningConfig 'x' not found",
        "blocked",
    ),
    Case(
        "released and bound",
        group(4, state="Released", request="g-pg-1"),
        members(4, gated=False, node_name="n0"),
        "not blocked: released: 4 members released together, all bound",
        "started",
        requests=[req(count=4, Provisioned="ok")],
    ),
    Case(
        "released, its members unbound past the start deadline: the watchdog's rollback",
        group(2, state="Released", request="g-pg-1", released_at="2026-11-30T09:00:00Z"),
        [member(i, gated=False, annotations={CONSUME: "g-pg-1"}) for i in range(2)],
        "blocked: released, but rolling back attempt 1: StartDeadline: 0 of 2 members released "
        "together bound within 600s of their release (unbound: m0, m1)",
        "released",
        requests=[req(count=2, Provisioned="ok")],
    ),
    Case(
        "a growth delivered, its members binding: how long its start watchdog leaves them",
        group(6, **RAN),
        [*ran(), *grown()],
        "not blocked: released: 4 members released together, 2 more since; 4 of 6 bound so "
        f"far (kube-scheduler's turn); growth {GROW1}: 0 of the 2 members released onto it "
        "bound, start deadline in 6m, rolled back unless all are by then",
        "released",
        requests=[started(), grow(phase="Fulfilled", released_at="2026-11-30T10:01:00Z")],
    ),
    Case(
        "a growth delivered by an older version (no release time): counted from the next look",
        group(6, **RAN),
        [*ran(), *grown(4)],
        "not blocked: released: 4 members released together, 2 more since; 5 of 6 bound so "
        f"far (kube-scheduler's turn); growth {GROW1}: 1 of the 2 members released onto it "
        "bound, its start deadline counted from gangcheck's next look, rolled back unless all "
        "are by then",
        "released",
        requests=[started(), grow(phase="Fulfilled")],
    ),
    Case(
        "a growth past its start deadline: the watchdog's rollback begins",
        group(6, **RAN),
        [*ran(), *grown(4)],
        f"blocked: released, but rolling back growth {GROW1}: {START_DEADLINE}",
        "released",
        requests=[started(), grow(phase="Fulfilled", released_at="2026-11-30T09:50:00Z")],
        nodes=[
            node("n0"),
            node("n2", annotations={"gangcheck.io/arrived-for": f"default/{GROW1}"}),
        ],
    ),
    Case(
        "a growth its start watchdog rolls back",
        group(6, **RAN),
        [*ran(), *grown(4)],
        f"blocked: released, but rolling back growth {GROW1}: {START_DEADLINE}",
        "released",
        requests=[started(), start_rolled()],
    ),
    Case(
        "a growth its start watchdog rolled back, a member of it unbound: said, with its outcome",
        group(6, **RAN),
        [*ran(), *grown(4)],
        "blocked: released: 4 members released together, 2 more since; "
        f"{GROWTH_ROLLED_BACK}; 5 of 6 bound so far (kube-scheduler's turn)",
        "released",
        requests=[started(), start_rolled(outcome=GROWTH_OUTCOME)],
        nodes=[node("n0"), node("n2")],
    ),
    Case(
        "a growth its start watchdog rolled back, its members bound since: said",
        group(6, **RAN),
        [*ran(), *grown(4, 5)],
        "not blocked: released: 4 members released together, 2 more since, all bound; "
        f"{GROWTH_ROLLED_BACK}",
        "started",
        requests=[started(), start_rolled(outcome=GROWTH_OUTCOME)],
        nodes=[node("n0"), node("n2")],
    ),
    Case(
        "a growth started: nothing more said of it",
        group(6, **RAN),
        [*ran(), *grown(4, 5)],
        "not blocked: released: 4 members released together, 2 more since, all bound",
        "started",
        requests=[started(), grow(phase="Started", released_at="2026-11-30T10:01:00Z")],
    ),
    Case(
        "a growth asked, not answered yet: its request and its state, not 'is the controller "
        "running?'",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; {GROWTH_ASKS}: capacity requested "
        f"({GROW1}, not accepted yet, deadline in 15m): {NO_ROOM}",
        "released",
        requests=[started(), asking({})],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth accepted, not provisioned yet: the autoscaler's word",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; {GROWTH_ASKS}: capacity requested "
        f"({GROW1}, accepted, not provisioned yet, deadline in 15m): "
        f"{NO_ROOM}",
        "released",
        requests=[started(), asking({"Accepted": "scaling up 2 nodes"})],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth provisioned, its members not fitting yet: the fit, the deadline",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; {GROWTH_ASKS}: waiting for the "
        f"autoscaler, no node has arrived yet: {NO_ROOM}, deadline in 15m",
        "released",
        requests=[started(), asking()],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth provisioned whose members fit: gangcheck's turn to release them",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; {GROWTH_ASKS}: {GROW1} is "
        "Provisioned and they fit; waiting for gangcheck to release them (is the controller "
        "running?)",
        "released",
        requests=[started(), asking()],
        nodes=[node("n0")],
    ),
    Case(
        "a growth the autoscaler failed: its word, the rollback it begins",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; {GROWTH_ASKS}: rolling back: the "
        f"autoscaler failed {GROW1}: no capacity",
        "released",
        requests=[started(), asking({"Failed": "no capacity"})],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth rolling back past its deadline: the reason recorded",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; {GROWTH_ASKS}: rolling back: "
        "Deadline: not provisioned within 1200s",
        "released",
        requests=[
            started(),
            asking(
                {"Accepted": "ok"},
                phase="RollingBack",
                rollback_reason="Deadline: not provisioned within 1200s",
            ),
        ],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth rolled back, the next in its backoff: when it is asked",
        group(6, **RAN),
        [*ran(), *waiting_growth()],
        f"blocked: released: 4 members released together; growth {GROW1} asked for the 2 "
        "gated members minCount 6 added (m4, m5) and was rolled back (Deadline: not "
        "provisioned within 1200s): the next growth asks for them in 16m, after its backoff",
        "released",
        requests=[
            started(),
            asking(
                {"Accepted": "ok"},
                phase="RollingBack",
                rollback_reason="Deadline: not provisioned within 1200s",
                outcome=GROWTH_OUTCOME,
            ),
        ],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth provisioned, minCount raised beyond it: the members it asks for, the rest "
        "after it has started",
        group(7, **RAN),
        [*ran(), *waiting_growth(4, 5, 6)],
        f"blocked: released: 4 members released together; growth {GROW1} asks for 2 of the 3 "
        "gated members minCount 7 added (m4, m5; m6 once it has started): waiting for the "
        f"autoscaler, no node has arrived yet: {NO_ROOM}, deadline in 15m",
        "released",
        requests=[started(), asking()],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth delivered, minCount raised beyond it: the members beyond wait for its "
        "members, not 'released at once'",
        group(7, **RAN),
        [*ran(), *grown(4), *waiting_growth(6)],
        "blocked: released: 4 members released together, 2 more since; growth "
        f"{GROW1}: 1 of the 2 members released onto it bound, start deadline in 6m, rolled "
        "back unless all are by then; 1 gated member beyond it (m6) waits until they are all "
        "bound, then the next growth asks for it",
        "released",
        requests=[started(), grow(phase="Fulfilled", released_at="2026-11-30T10:01:00Z")],
        nodes=[node("n0")],
    ),
    Case(
        "a growth its start watchdog rolled back, minCount raised since: the next growth after "
        "the backoff, not 'released at once'",
        group(7, **RAN),
        [*ran(), *grown(4), *waiting_growth(6)],
        "blocked: released: 4 members released together, 2 more since; "
        f"{GROWTH_ROLLED_BACK}; 1 gated member minCount added since (m6): the next growth "
        "asks for it in 16m, after its backoff",
        "released",
        requests=[started(), start_rolled(outcome=GROWTH_OUTCOME, fulfillment_deadline=LATER)],
        nodes=[node("n0"), node("n2")],
    ),
    Case(
        "a growth started, minCount raised beyond it: the next growth is asked now",
        group(7, **RAN),
        [*ran(), *grown(4, 5), *waiting_growth(6)],
        "blocked: released: 4 members released together, 2 more since; 1 gated member beyond "
        f"growth {GROW1} (m6): the next growth asks for it now (is the controller running?)",
        "released",
        requests=[started(), grow(phase="Started", released_at="2026-11-30T10:01:00Z")],
        nodes=[FULL_N0],
    ),
    Case(
        "a growth started, a late member minCount did not add: released once it fits, as any",
        group(6, **RAN),
        [*ran(), *grown(4, 5), *waiting_growth(6)],
        "blocked: released: 4 members released together, 2 more since; 1 member(s) created "
        "since are still gated (m6); gangcheck releases each once the gang is bound and it "
        "fits on nodes that exist (is the controller running?)",
        "released",
        requests=[started(), grow(phase="Started", released_at="2026-11-30T10:01:00Z")],
        nodes=[FULL_N0],
    ),
    Case(
        "released, its gang binding: its start deadline, as a Workload's",
        group(2, state="Released", request="g-pg-1", released_at="2026-11-30T10:01:00Z"),
        [
            member(0, gated=False, node_name="n0", annotations={CONSUME: "g-pg-1"}),
            member(1, gated=False, annotations={CONSUME: "g-pg-1"}),
        ],
        "not blocked: released: 2 members released together; 1 of 2 bound so far "
        "(kube-scheduler's turn), start deadline in 6m, rolled back unless all are by then",
        "released",
        requests=[req(count=2, Provisioned="ok")],
    ),
    Case(
        "released, its gang binding, a late member released since: the start deadline of "
        "those released together",
        group(
            2,
            state="Released",
            request="g-pg-1",
            gang_members="2",
            released_at="2026-11-30T10:01:00Z",
        ),
        [
            member(0, gated=False, node_name="n0", annotations={CONSUME: "g-pg-1"}),
            member(1, gated=False, annotations={CONSUME: "g-pg-1"}),
            member(2, gated=False),
        ],
        "not blocked: released: 2 members released together, 1 more since; 1 of 3 bound so "
        "far (kube-scheduler's turn); 1 of the 2 members released together bound, start "
        "deadline in 6m, rolled back unless all are by then",
        "released",
        requests=[req(count=2, Provisioned="ok")],
    ),
    Case(
        "released, its gang binding while a late member is gated: the start deadline too",
        group(
            2,
            state="Released",
            request="g-pg-1",
            gang_members="2",
            released_at="2026-11-30T10:01:00Z",
        ),
        [
            member(0, gated=False, node_name="n0", annotations={CONSUME: "g-pg-1"}),
            member(1, gated=False, annotations={CONSUME: "g-pg-1"}),
            member(2),
        ],
        "blocked: released: 2 members released together; 1 of the 2 members released together "
        "bound, start deadline in 6m, rolled back unless all are by then; kube-scheduler starts "
        "a PodGroup only when none of its members is gated, and 1 still is (m2): gangcheck "
        "releases it at once while the gang binds (is the controller running?)",
        "released",
        requests=[req(count=2, Provisioned="ok")],
    ),
    Case(
        "released, scheduler still placing",
        group(3, state="Released"),
        [*members(2, gated=False, node_name="n0"), member(2, gated=False)],
        "not blocked: released: 3 members released together; 2 of 3 bound so far "
        "(kube-scheduler's turn)",
        "released",
    ),
    Case(
        "released, a late member still gated",
        group(2, state="Released"),
        [*members(2, gated=False, node_name="n0"), member(2)],
        "blocked: released: 2 members released together; 1 member(s) created since are still "
        "gated (m2); gangcheck releases each once the gang is bound and it fits on nodes that "
        "exist (is the controller running?)",
        "released",
    ),
    Case(
        "released, the gang still binding while a member is gated: the gate is the blocker",
        group(3, state="Released"),
        [member(0, gated=False, node_name="n0"), member(1, gated=False), member(2)],
        "blocked: released: 2 members released together; kube-scheduler starts a PodGroup "
        "only when none of its members is gated, and 1 still is (m2): gangcheck releases "
        "it at once while the gang binds (is the controller running?)",
        "released",
    ),
    Case(
        "released, a member kube-scheduler cannot place: its word is the blocker",
        group(2, state="Released"),
        [member(0, gated=False, node_name="n0"), unschedulable(member(1, gated=False))],
        "blocked: released: 2 members released together; 1 of 2 bound so far (kube-scheduler's "
        "turn): kube-scheduler says m1: Unschedulable: 0/3 nodes are available: 3 Insufficient "
        "nvidia.com/gpu.",
        "released",
    ),
    Case(
        "released, a member whose PodScheduled still says SchedulingGated: kube-scheduler's turn",
        group(2, state="Released"),
        [member(0, gated=False, node_name="n0"), still_gated_condition(member(1, gated=False))],
        "not blocked: released: 2 members released together; 1 of 2 bound so far "
        "(kube-scheduler's turn)",
        "released",
    ),
    Case(
        "released 4 of 6, two late members waiting for room: the count released and why",
        group(
            4,
            state="Released",
            gang_members="4",
            message="released; 2 member(s) created after the gang was read wait for room on "
            "nodes that exist (no request is made for them): 0 of 2 members placeable",
        ),
        [*members(4, gated=False, node_name="n0"), member(4), member(5)],
        "blocked: released: 4 members released together; 2 member(s) created after the gang "
        "was read wait for room on nodes that exist (no request is made for them): 0 of 2 "
        "members placeable (pods m4, m5)",
        "released",
    ),
    Case(
        "released, a late member held since the gang's domain is not known: why, not 'is the "
        "controller running?'",
        group(
            2,
            state="Released",
            gang_members="2",
            message="released; 1 member(s) created after the gang was read stay gated, not "
            "released outside the gang's topology domain: the group's record of its domain "
            "(gangcheck.io/topology-domain) is gone and its running members are in 2 'rack' "
            "domains: a, b",
        ),
        [*members(2, gated=False, node_name="n0"), member(2)],
        "blocked: released: 2 members released together; 1 member(s) created after the gang "
        "was read stay gated, not released outside the gang's topology domain: the group's "
        "record of its domain (gangcheck.io/topology-domain) is gone and its running members "
        "are in 2 'rack' domains: a, b (pod m2)",
        "released",
    ),
    Case(
        "released 4 together, 2 more released later and pending: not 'all 6 together'",
        group(4, state="Released", gang_members="4"),
        [*members(4, gated=False, node_name="n0"), *[member(i, gated=False) for i in (4, 5)]],
        "not blocked: released: 4 members released together, 2 more since; 4 of 6 bound so "
        "far (kube-scheduler's turn)",
        "released",
    ),
    Case(
        "coscheduling group",
        group(3, plugins=True, state="WaitingForMembers"),
        [
            {
                "metadata": {
                    "name": "c0",
                    "namespace": "default",
                    "labels": {"scheduling.x-k8s.io/pod-group": "g"},
                },
                "spec": {"containers": [container()], "schedulingGates": [{"name": GATE}]},
            }
        ],
        "blocked: waiting for members: 1 of 3 exist",
        "waiting",
    ),
]


CASES += [
    Case(
        "attempt 3 in flight after two rollbacks: both said, oldest first",
        group(2, state="Provisioning", request="g-pg-3", attempt="3"),
        members(2),
        "blocked: ProvisioningRequest g-pg-3 does not exist yet (is the gangcheck controller "
        "running?)",
        "pending",
        events=EARLIER_EVENTS,
    ),
    Case(
        "backing off after attempt 2: attempt 1 earlier, attempt 2 said by the state",
        group(
            2,
            state="BackingOff",
            attempt="3",
            next_attempt_at="2026-11-30T10:06:30Z",
            message=f"attempt 3 at 2026-11-30T10:06:30Z: {SECOND_ROLLED_BACK}",
        ),
        members(2),
        f"blocked: backing off: attempt 3 starts in 1m30s; {SECOND_ROLLED_BACK}",
        "backoff",
        events=EARLIER_EVENTS,
    ),
]


def facts_of(case: Case) -> Any:
    pods = tuple(case.members)
    world = World(requests=tuple(case.requests), nodes=tuple(case.nodes), pods=pods)
    api_group = PLUGINS if case.group and case.group["apiVersion"].startswith(PLUGINS) else UPSTREAM
    return gather_group(
        case.group,
        [pod_of(p) for p in case.members],
        world,
        namespace="default",
        name="g",
        api_group=api_group,
        served=case.served,
        opted_in=case.opted_in,
        now=NOW,
    )


def report_of(case: Case) -> GroupReport:
    """The diagnosis as `diagnose_group` makes it: with the earlier attempts its Events say."""
    facts = facts_of(case)
    earlier = ()
    if case.group is not None:
        exists = {n["metadata"]["name"] for n in case.nodes}
        group = pod_group_of(case.group)
        earlier = group_attempts(case.events, group, facts.attempt, facts.message, exists)
    found = group_verdict(facts, NOW)
    return GroupReport(Target("podgroup", "default", "g"), facts, found, NOW, earlier=earlier)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_verdict_names_what_blocks(case: Case) -> None:
    facts = facts_of(case)
    assert group_verdict(facts, NOW).line == case.line
    row = group_row(facts, NOW)
    assert (row.phase, row.verdict) == (case.phase, case.line)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_text_and_the_json_say_the_same(case: Case) -> None:
    """For every state above: the text ends in the verdict's line, the JSON's; the group's
    message, the request's outcome and deletion are in the text as the JSON has them."""
    report = report_of(case)
    found = report.verdict
    text, as_json = render_text(report), to_json(report)
    flat = " ".join(text.split())
    assert text.splitlines()[-1] == as_json["verdict"]["line"] == found.line
    assert " ".join(as_json["state"]["message"].split()) in flat
    earlier = as_json["earlierAttempts"]  # as a Workload's diagnosis says its own
    assert [(e["attempt"], e["state"], e["message"]) for e in earlier] == [
        (t.attempt, t.state, t.message) for t in report.earlier
    ]
    for each in earlier:
        assert each["line"] in flat
    assert ("earlier " in text) == bool(earlier)
    req = as_json["request"]
    if req is not None and req["outcome"] is not None:
        assert f"outcome: {req['outcome']['summary']}" in flat
    if req is not None and req["deletion"] is not None:
        assert req["deletion"]["line"] in flat
    grown = as_json["growth"]
    if grown is not None:  # the latest growth delivered: its record, members, start deadline
        said = grown["request"]
        assert f"growth default/{said['name']} (attempt {said['attempt']})" in flat
        assert f"phase {said['phase']}" in flat
        if said["rollbackReason"]:
            assert f"rollback: {said['rollbackReason']}" in flat
        if said["outcome"] is not None:
            assert f"outcome: {said['outcome']['summary']}" in flat
        if grown["rolledBack"]:
            assert grown["rolledBack"] in found.line
        if grown["delivered"]:
            count = len(grown["members"])
            released = f" at {grown['releasedAt']}" if grown["releasedAt"] else ""
            said = f"{count} members released onto it{released}: {len(grown['bound'])} bound"
            assert said in flat
        _says_start_deadline(grown, flat, found.line)
        if grown["gated"]:  # in flight, waiting for its next, or beyond it: named
            assert ", ".join(grown["gated"]) in flat
            assert all(name in found.line for name in grown["gated"])
        if grown["nextAt"]:
            assert f"next growth asked at {grown['nextAt']}" in flat
    _says_start_deadline(as_json["start"], flat, found.line)


def _says_start_deadline(watch: dict[str, Any] | None, flat: str, line: str) -> None:
    """A start watchdog counting (the gang's release or a growth's): its deadline in the
    text's section and in the verdict."""
    if watch is not None and watch["watched"] and watch["startDeadline"]:
        left = human_duration(watch["secondsLeft"])
        assert f"start deadline {watch['startDeadline']} (in {left}," in flat
        assert f"start deadline in {left}," in line


def test_member_facts_count_gated_bound_and_ungated() -> None:
    pods = [*members(2), member(2, gated=False), member(3, gated=False, node_name="n0")]
    facts = facts_of(Case("x", group(4, state="Provisioning"), pods, "", ""))
    m = facts.members
    assert (m.exist, m.min_count, m.gated, m.bound, m.ungated) == (
        4,
        4,
        ("m0", "m1"),
        ("m3",),
        ("m2", "m3"),
    )
    assert facts.placement is not None and facts.placement.total == 3  # the unbound ones


def test_a_status_row_is_a_podgroup_row() -> None:
    case = Case("x", group(4, **PROVISIONING), members(4), "", "", requests=[req(count=4)])
    row = group_row(facts_of(case), NOW)
    assert (row.kind, row.namespace, row.name, row.check, row.state, row.attempt) == (
        "PodGroup",
        "default",
        "g",
        "",
        "Provisioning",
        1,
    )
    assert (row.request, row.age_seconds, row.placeable, row.total) == ("g-pg-1", 300, 0, 4)
    plugins = group_row(facts_of(Case("y", group(2, plugins=True), [], "", "")), NOW)
    assert plugins.kind == "PodGroup.scheduling.x-k8s.io"


def test_a_released_gang_counts_no_node_older_than_its_request_recorded_under_its_name() -> None:
    """Names come again (a group made again under its name asks as g-pg-1 again): a node
    recorded under the request's name but older than the request (made at 10:00) arrived for
    the earlier one (`fulfillment.is_arrival_of`), and is not counted as given."""
    noted = {"gangcheck.io/arrived-for": "default/g-pg-1"}
    case = Case(
        "x",
        group(4, **RAN),
        ran(),
        "",
        "",
        requests=[started()],
        nodes=[
            node("n0", created=ARRIVED, annotations=noted),
            node("n1", created="2026-11-30T09:00:00Z", annotations=noted),
        ],
    )
    facts = facts_of(case)
    assert facts.given_nodes == 1
    assert group_row(facts, NOW).arrived == 1


@pytest.mark.parametrize(
    ("obj", "pods", "opted_in", "listed"),
    [
        (group(2, state="Provisioning"), members(2), True, True),
        (group(2), members(2), True, True),  # holds gated members
        (group(2), members(2, gated=False), False, False),  # gangcheck never asked
        (group(2), members(2, gated=False), True, True),  # should hold them, cannot
        (group(2, ungated_members="m0,m1"), members(2, gated=False), None, True),  # reported
        (group(2), members(2, gated=False, node_name="n0"), True, False),  # running anyway
        (group(basic=True, state="NotAGang"), members(2, gated=False), True, False),
        (group(2, state="Released"), members(2, gated=False, node_name="n0"), True, True),
        (group(2, state="Released"), [], True, False),  # done: no members left
        (None, members(1), True, True),  # gated, naming a group that does not exist
        (None, members(1, gated=False), True, False),
    ],
    ids=[
        "managed",
        "holds",
        "never-asked",
        "blocked-by-ungated-members",
        "reported-ungated",
        "ungated-but-running",
        "not-a-gang",
        "running",
        "done",
        "missing",
        "plain",
    ],
)
def test_status_lists_the_groups_gangcheck_holds_or_manages(
    obj: Obj | None, pods: list[Obj], opted_in: bool | None, listed: bool
) -> None:
    case = Case("x", obj, pods, "", "", opted_in=opted_in)
    assert in_flight(facts_of(case)) is listed


def test_members_are_found_by_either_api() -> None:
    upstream = member(0)
    plugins = {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "labels": {"scheduling.x-k8s.io/pod-group": "g"},
        }
    }
    plain = {"metadata": {"name": "p", "namespace": "default"}, "spec": {}}
    assert members_by_group([upstream, plugins, plain]) == {
        ("default", UPSTREAM, "g"): [pod_of(upstream)],
        ("ns", PLUGINS, "g"): [pod_of(plugins)],
    }


def test_members_with_the_same_requirements_share_a_pod_set() -> None:
    pods = [pod_of(member(0)), pod_of(member(1, gpu=2)), pod_of(member(2))]
    gang = gang_from_pods(pod_group_of(group(3)), pods)
    assert [(name, count) for name, count, _ in gang.pod_sets] == [("ps-0", 2), ("ps-1", 1)]
    assert gang.namespace == "default"
    assert "schedulingGates" not in gang.pod_sets[0][2]["spec"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("podgroup/ns/g", Target("podgroup", "ns", "g")),
        ("pg/ns/g", Target("podgroup", "ns", "g")),
        ("podgroup.scheduling.x-k8s.io/ns/g", Target("podgroup", "ns", "g", PLUGINS)),
        ("PodGroups.scheduling.k8s.io/ns/g", Target("podgroup", "ns", "g", UPSTREAM)),
    ],
)
def test_podgroup_targets_may_name_their_api(text: str, expected: Target) -> None:
    assert parse_target(text) == expected


def test_a_podgroup_of_another_api_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("podgroup.scheduling.x-k8s.io")):
        parse_target("podgroup.example.com/ns/g")


def test_the_group_says_its_arrivals_carry_no_rack_as_its_diagnosis_does() -> None:
    """The group's message (the decision replayed: what the provisioner writes) says it in
    the diagnosis' words, minus where it leaves the attempt."""
    case = next(c for c in CASES if c.id.startswith("provisioned, the nodes that arrived"))
    facts = facts_of(case)
    assert facts.replay is not None
    assert facts.replay.state == "Provisioning"
    assert facts.replay.message == (
        f"capacity requested, not yet usable: 2 nodes arrived for this attempt; {NO_RACK}; "
        "ignoring the level, 2 of 2 members placeable on 2 nodes; waiting until the deadline in "
        "case they are labelled"
    )


def test_in_flight_the_fit_is_for_the_members_the_request_was_made_for() -> None:
    """Members created after the gang was read are named, not fitted."""
    made_for_4 = req(count=4, Accepted="ok")
    made_for_4["metadata"]["annotations"]["gangcheck.io/gang-members"] = "4"
    pods = [member(i, creationTimestamp=f"2026-11-30T10:00:0{i // 4}Z") for i in range(6)]
    facts = facts_of(Case("x", group(4, **PROVISIONING), pods, "", "", requests=[made_for_4]))
    assert facts.placement is not None and facts.placement.total == 4
    assert facts.late == ("m4", "m5")


RACE_CONFIG = (
    '{"capacitySourcePolicy": "Race", "capacitySources": ['
    '{"name": "a", "nodeSelector": {"pool": "a"}}, {"name": "b", "nodeSelector": {"pool": "b"}}, '
    '{"name": "c", "nodeSelector": {"pool": "c"}}], "fulfillment": {"deadlineSeconds": 1200}}'
)


def racer(name: str, source: int) -> Obj:
    """A racer of attempt 1, made under the race config (the group names none)."""
    made = req(name, Accepted="ok")
    made["metadata"]["annotations"]["gangcheck.io/attempt-config"] = RACE_CONFIG
    if source:
        made["metadata"]["annotations"]["gangcheck.io/capacity-source"] = str(source)
    return made


@pytest.mark.parametrize(
    ("racers", "said", "latest"),
    [
        ([racer("g-pg-1", 0), racer("g-pg-1-s1", 1)], ["g-pg-1", "g-pg-1-s1"], "g-pg-1-s1"),
        # the first racer failed and was withdrawn, its place given to source c: read from the
        # first racer alone, the replay ran under the default config and named no racer
        ([racer("g-pg-1-s1", 1), racer("g-pg-1-s2", 2)], ["g-pg-1-s1", "g-pg-1-s2"], "g-pg-1-s2"),
    ],
    ids=["both racers", "the first racer gone"],
)
def test_a_pod_group_race_is_diagnosed_with_every_racer(
    racers: list[Obj], said: list[str], latest: str
) -> None:
    pods = members(3)
    world = World(requests=tuple(racers), pods=tuple(pods))
    obj = group(3, state="Provisioning", attempt="1", message="racing: …")
    facts = gather_group(
        obj, [pod_of(p) for p in pods], world, namespace="default", name="g", now=NOW
    )
    line = group_verdict(facts, NOW).line
    assert line.startswith("blocked: Provisioning: racing: "), line
    for name in said:
        assert f"provisioning request {name} accepted" in line
    assert "left the config" not in line
    assert group_row(facts, NOW).request == latest


@pytest.mark.parametrize("raw", ["²", "1" * 5000])
def test_a_groups_counts_written_by_hand_make_a_row_not_an_error(raw: str) -> None:
    """A PodGroup's owner may write any `gangcheck.io/*` annotation on it. A count no
    int() reads ('²' is a digit to str.isdigit; 5000 digits are past int()'s limit) is
    read as unset (the attempt as 1), so `gangcheck status`, which gathers every group,
    lists it and the others instead of failing on it."""
    notes = {"state": "Released", "request": "g-pg-1", "attempt": raw, "gang_members": raw}
    pods = members(3, gated=False, node_name="n0")
    facts = facts_of(Case("x", group(3, **notes), pods, "", "", requests=[req()]))
    row = group_row(facts, NOW)
    assert (row.state, row.attempt, facts.released_together) == ("Released", 1, None)


def test_the_next_attempt_is_said_only_while_the_group_backs_off() -> None:
    """The group keeps gangcheck.io/next-attempt-at once the backoff is over and the next
    attempt runs (Provisioning, attempt 2): diagnose said 'next attempt at … (2m34s ago)'
    under a state that waits on a request, not on a backoff."""
    notes = {"state": "Provisioning", "attempt": "2", "next_attempt_at": "2026-11-30T10:02:00Z"}
    running = facts_of(
        Case("x", group(2, **notes), members(2), "", "", requests=[req("g-pg-2", 2)])
    )
    assert running.next_attempt_at is None
    notes = {**notes, "state": "BackingOff", "next_attempt_at": "2026-11-30T10:06:00Z"}
    waiting = facts_of(Case("x", group(2, **notes), members(2), "", ""))
    assert waiting.next_attempt_at == datetime(2026, 11, 30, 10, 6, tzinfo=UTC)


def test_a_groups_earlier_attempts_are_its_rollbacks_before_the_attempt_in_flight() -> None:
    """Why is the gang still pending: attempt 1's request failed, attempt 2's rolled back at
    its deadline, attempt 3 is asked. Its Events say each rollback (no annotation keeps
    them), in the lines a Workload's earlier attempts are said in; a growth's rollback and
    another group's are no attempt of this one."""
    report = report_of(next(c for c in CASES if c.id.startswith("attempt 3 in flight")))
    first = datetime(2026, 11, 30, 10, 1, tzinfo=UTC)
    second = datetime(2026, 11, 30, 10, 3, tzinfo=UTC)
    assert report.earlier == (
        Ended("RolledBack", FIRST_ROLLED_BACK, first, 1),
        Ended("RolledBack", SECOND_ROLLED_BACK, second, 2),
    )
    text, as_json = render_text(report), to_json(report)
    line = f"attempt 1: RolledBack at 2026-11-30T10:01:00Z: {FIRST_ROLLED_BACK}"
    assert as_json["earlierAttempts"][0] == {
        "attempt": 1,
        "state": "RolledBack",
        "message": FIRST_ROLLED_BACK,
        "at": "2026-11-30T10:01:00Z",
        "line": line,
    }
    flat = " ".join(text.split())
    assert f"earlier {line} attempt 2: RolledBack at 2026-11-30T10:03:00Z: " in flat
    assert "g-pg-grow-1" not in text and "other-pg-1" not in text


def test_a_group_backing_off_says_its_last_rollback_once() -> None:
    """Backing off after attempt 2: the group's message says attempt 2's rollback; the
    Events add attempt 1's, not attempt 2's again."""
    report = report_of(next(c for c in CASES if c.id.startswith("backing off after attempt 2")))
    assert [(t.attempt, t.message) for t in report.earlier] == [(1, FIRST_ROLLED_BACK)]


def test_a_rollback_that_kept_a_node_deleted_since_reads_as_it_is_now() -> None:
    """A node an earlier attempt's rollback kept and that is gone since is said gone, as
    the group's own message says it."""
    said = KEPT_WRITTEN.replace("g-pg-4", "g-pg-1")
    notes = {"state": "Provisioning", "request": "g-pg-2", "attempt": "2"}
    case = Case("x", group(2, **notes), members(2), "", "", nodes=[node("n1")])
    case.events.append(rolled_back_event(said, "2026-11-30T10:01:00Z"))
    (earlier,) = report_of(case).earlier
    assert earlier.message == KEPT_NOW.replace("g-pg-4", "g-pg-1")


def test_without_the_events_a_group_says_no_earlier_attempt() -> None:
    """Events expire (about an hour): none left, none said, not guessed from the attempt."""
    notes = {"state": "Provisioning", "request": "g-pg-3", "attempt": "3"}
    assert report_of(Case("x", group(2, **notes), members(2), "", "")).earlier == ()


@pytest.mark.parametrize(
    ("made", "now", "said"),
    [(900, 250, 250), (250, 900, 900), (900, None, 900)],
    ids=["shortened-since", "lengthened-since", "config-gone"],
)
def test_the_start_deadline_said_is_the_one_the_controller_judges_by(
    made: int, now: int | None, said: int
) -> None:
    """diagnose says the start deadline of the config the gang follows now (deadlines follow
    an edit mid-flight: lifecycle.following), the one it was made under once its config is
    gone, as the PodGroup's start watchdog judges it."""
    obj = req()
    obj["metadata"]["annotations"]["gangcheck.io/attempt-config"] = spec_record(
        parse_spec({"fulfillment": {"startDeadlineSeconds": made}})
    )
    config = parse_spec({"fulfillment": {"startDeadlineSeconds": now}}) if now else None
    watch = start_watch_of(request_of(obj), [], config, released_at=None)
    assert watch.start_deadline_seconds == said
