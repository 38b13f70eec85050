"""Property tests: the one-line diagnosis says where `decide` says the attempt stands.

Random live reads (a Workload's members and check, or a PodGroup's members and state; the
request's conditions, deadline and rollback record; the nodes that arrived: tainted, not
Ready, too small) are diagnosed, and the same objects are decided on the snapshot the
controller builds: the line's kind must be the progress's kind, both ways (waiting ⇔ says
waiting, and names why the arrivals take no member; fits ⇔ says it fits; a rollback or an
ended attempt ⇔ says so). While it waits on a fit, the line says the fit in the check
message's own words (the same function makes both)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from gangcheck.logic.attempt import lifecycle, naming, rollback
from gangcheck.logic.attempt.explain import World, until
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.podgroups import podgroup
from gangcheck.logic.podgroups.group_diagnosis import gather_group, group_verdict
from gangcheck.logic.podgroups.group_snapshot import group_snapshot_of
from gangcheck.logic.sources.world import capacity_of
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads.admission import decide
from gangcheck.logic.workloads.diagnosis import gather, verdict
from gangcheck.logic.workloads.snapshot import snapshot_of
from gangcheck.model.names import GATE
from gangcheck.model.objects import Flavor, Obj, ProvisioningRequest, pod_of, workload_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec
from tests.builders import (
    CHECK,
    WorkloadBuilder,
    admission_check,
    container,
    node,
    provisioning_request,
)

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
REQ = naming.request_name("wl", CHECK, 1)
REASON = "Deadline: the gang did not fit within 420s"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

ENDED = ("the autoscaler failed", "revoked the capacity of", "the booking of")
KINDS = {
    Progress.WAITING: "waiting",
    Progress.FITS: "fits",
    Progress.ROLLING_BACK: "rollback",
    Progress.ROLLED_BACK: "rollback",
    Progress.FAILED: "ended",
    Progress.REVOKED: "ended",
    Progress.EXPIRED: "ended",
}


@dataclass(frozen=True)
class Arrival:
    recorded: bool
    tainted: bool
    ready: bool
    gpu: int


@dataclass(frozen=True)
class Read:
    members: int
    mode: str
    exists: bool
    conditions: frozenset[str]
    deadline_in: int
    moved: bool
    rolling_back: bool
    outcome: bool
    arrivals: tuple[Arrival, ...]


arrivals = st.builds(
    Arrival,
    recorded=st.booleans(),
    tainted=st.sampled_from([False, False, True]),
    ready=st.sampled_from([True, True, False]),
    gpu=st.sampled_from([0, 1, 1, 2]),
)
conditions = st.tuples(
    st.frozensets(st.sampled_from(["Accepted", "Provisioned"])),
    st.sampled_from([(), (), (), ("Failed",), ("CapacityRevoked",), ("BookingExpired",)]),
).map(lambda t: t[0] | frozenset(t[1]))
reads = st.builds(
    Read,
    members=st.integers(min_value=1, max_value=4),
    mode=st.sampled_from(["NodesFit", "NodesFit", "TrustProvisioned"]),
    exists=st.sampled_from([True, True, True, False]),
    conditions=conditions,
    deadline_in=st.sampled_from([-30, 42, 600]),
    moved=st.sampled_from([False, False, True]),
    rolling_back=st.sampled_from([False, False, False, True]),
    outcome=st.booleans(),
    arrivals=st.lists(arrivals, max_size=5).map(tuple),
)


def created(deadline_in: int, moved: bool) -> str:
    """When the request was made: deadlineSeconds (420 s by default) before its deadline, as
    the controller keeps it; or (`moved`) long before, as under a config whose
    deadlineSeconds changed since: the decision moves the deadline, the diagnosis must too."""
    if moved:
        return "2026-11-30T09:59:00Z"
    return format_time(NOW + timedelta(seconds=deadline_in - 420))


def said_deadline(moved: bool, line: str, request: ProvisioningRequest, fit: bool = True) -> None:
    """The deadline the line says is the one the decision goes by: in fit mode moved when
    the request's creation and deadlineSeconds disagree with its annotation."""
    if "deadline" not in line:
        return  # said only while waiting for nodes to arrive, not of nodes that cannot serve
    decided = request
    if fit:
        decided, _ = lifecycle.current_deadline(request, AtomicProvisioningSpec())
    deadline = until("deadline", rollback.deadline_of(decided), NOW)
    assert deadline in line, (line, deadline)
    if moved and fit:
        assert deadline == ", deadline in 1m", deadline


NOT_USABLE = "capacity requested, not yet usable: "


def said_fit(message: str, summary: str, line: str) -> None:
    """The fit the check message says is, word for word, the fit the diagnosis explains
    node by node, and a part of its line: one function says a fit (`fit_words`)."""
    assert message.startswith(NOT_USABLE), message
    fit = message.removeprefix(NOT_USABLE).split("; pods not of this gang")[0]
    assert fit == summary, (message, summary)
    assert f": {fit}" in line, (message, line)
    if "taint" in fit:
        assert "not tolerated" in line, line  # the fit's failing reason is named


def objects(read: Read) -> tuple[Obj, World]:
    workload = (
        WorkloadBuilder().pod_set("workers", read.members).reserve_quota().check(CHECK).build()
    )
    notes = {
        "gangcheck.io/fulfillment-deadline": format_time(NOW + timedelta(seconds=read.deadline_in))
    }
    if read.rolling_back:
        notes["gangcheck.io/phase"] = "RollingBack"
        notes["gangcheck.io/rollback-reason"] = REASON
        if read.outcome:
            notes["gangcheck.io/outcome"] = '{"reclaimed": [], "kept": {}, "nodeSeconds": 0}'
    requests = ()
    if read.exists:
        template = naming.template_name(REQ, "workers")
        made = provisioning_request(
            REQ,
            templates=[(template, read.members)],
            conditions={c: f"said {c}" for c in read.conditions},
            annotations=notes,
            created=created(read.deadline_in, read.moved),
        )
        requests = (made,)
    nodes = tuple(
        node(
            f"gpu-{i}",
            gpu=a.gpu,
            created="2026-11-30T10:01:00Z",
            labels={"pool": "gpu"},
            taints=[TAINT] if a.tainted else None,
            ready=a.ready,
            annotations={"gangcheck.io/arrived-for": f"default/{REQ}"} if a.recorded else None,
        )
        for i, a in enumerate(read.arrivals)
    )
    check = admission_check(config="cfg")
    world = World(
        admission_checks={CHECK: check},
        configs={"cfg": {"spec": {"fulfillment": {"mode": read.mode}}}},
        flavors={"gpu": Flavor("gpu", {"pool": "gpu"}, ())},
        requests=requests,
        nodes=nodes,
    )
    return workload, world


def kind_of(line: str) -> str:
    """What the line says of the attempt."""
    if "rolling back" in line:
        return "rollback"
    if any(said in line for said in ENDED):
        return "ended"
    if "mark the check Ready" in line:
        return "fits"
    if (
        "waiting for the autoscaler" in line
        or " arrived, " in line
        or "could not be computed" in line
    ):
        return "waiting"
    return "other"


def expected(progress: Progress | None, line: str) -> set[str]:
    """The kinds of line that say `progress`: a rollback starting because the backend ended
    the attempt is said in the backend's words."""
    if progress is None:
        return {"other"}
    kind = KINDS[progress]
    return {"rollback", "ended"} if kind == "rollback" else {kind}


@settings(max_examples=120, derandomize=True, deadline=None)
@given(read=reads)
def test_the_one_line_diagnosis_says_what_decide_says(read: Read) -> None:
    workload, world = objects(read)
    wl = workload_of(workload)
    snap = snapshot_of(
        wl,
        CHECK,
        admission_check=world.admission_checks.get,
        config=world.configs.get,
        requests=world.requests,
        flavors=world.flavors,
        capacity=capacity_of(world),
    )
    step = decide(snap, NOW).step
    progress = step.progress if step is not None else None
    event(f"progress {progress}")
    facts = gather(workload, world, now=NOW)
    line = verdict(facts, NOW).line
    assert line.startswith("blocked: ")
    assert kind_of(line) in expected(progress, line), (progress, line)
    if progress is Progress.WAITING:
        said_deadline(read.moved, line, snap.requests[0], read.mode == "NodesFit")
    if progress is Progress.WAITING and "Provisioned" in read.conditions:
        placement = facts.placement
        assert placement is not None and step is not None
        said_fit(step.message, placement.summary, line)
    if progress in (Progress.ROLLING_BACK, Progress.ROLLED_BACK) and read.rolling_back:
        assert f"rolling back attempt 1: {REASON}" in line


# ---- PodGroups ---------------------------------------------------------------------------

GROUP_REQ = "g-pg-1"


@dataclass(frozen=True)
class GroupRead:
    min_count: int
    members: int
    state: str
    exists: bool
    conditions: frozenset[str]
    deadline_in: int
    moved: bool
    rolling_back: bool
    outcome: bool
    arrivals: tuple[Arrival, ...]


@st.composite
def group_reads(draw: st.DrawFn) -> GroupRead:
    min_count = draw(st.integers(min_value=1, max_value=3))
    return GroupRead(
        min_count=min_count,
        members=max(0, min_count + draw(st.sampled_from([0, 0, 0, 1, -1]))),
        state=draw(st.sampled_from(["Provisioning", "Provisioning", "WaitingForMembers", ""])),
        exists=draw(st.sampled_from([True, True, True, False])),
        conditions=draw(conditions),
        deadline_in=draw(st.sampled_from([-30, 42, 600, 600])),
        moved=draw(st.sampled_from([False, False, True])),
        rolling_back=draw(st.sampled_from([False, False, False, True])),
        outcome=draw(st.booleans()),
        arrivals=tuple(draw(st.lists(arrivals, max_size=4))),
    )


def group_objects(read: GroupRead) -> tuple[Obj, list[Obj], World]:
    notes = {"gangcheck.io/state": read.state} if read.state else {}
    if read.state == "Provisioning":
        notes["gangcheck.io/request"] = GROUP_REQ
    group = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "metadata": {
            "name": "g",
            "namespace": "default",
            "uid": "uid-g",
            "creationTimestamp": "2026-11-30T09:00:00Z",
            "annotations": notes,
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": read.min_count}}},
    }
    members = [
        {
            "metadata": {
                "name": f"m{i}",
                "namespace": "default",
                "creationTimestamp": "2026-11-30T09:00:00Z",
            },
            "spec": {
                "containers": [container(gpu=1)],
                "schedulingGroup": {"podGroupName": "g"},
                "schedulingGates": [{"name": GATE}],
            },
        }
        for i in range(read.members)
    ]
    record = {
        "gangcheck.io/pod-group": "pg/g",
        "gangcheck.io/pod-group-uid": "uid-g",
        "gangcheck.io/gang-members": str(read.members),
        "gangcheck.io/fulfillment-deadline": format_time(NOW + timedelta(seconds=read.deadline_in)),
    }
    if read.rolling_back:
        record["gangcheck.io/phase"] = "RollingBack"
        record["gangcheck.io/rollback-reason"] = REASON
        if read.outcome:
            record["gangcheck.io/outcome"] = '{"reclaimed": [], "kept": {}, "nodeSeconds": 0}'
    requests: tuple[Obj, ...] = ()
    if read.exists:
        made = provisioning_request(
            GROUP_REQ,
            templates=[(f"{GROUP_REQ}-ps-0", read.members)],
            conditions={c: f"said {c}" for c in read.conditions},
            annotations=record,
            created=created(read.deadline_in, read.moved),
        )
        requests = (made,)
    nodes = tuple(
        node(
            f"gpu-{i}",
            gpu=a.gpu,
            created="2026-11-30T10:01:00Z",
            taints=[TAINT] if a.tainted else None,
            ready=a.ready,
            annotations={"gangcheck.io/arrived-for": f"default/{GROUP_REQ}"}
            if a.recorded
            else None,
        )
        for i, a in enumerate(read.arrivals)
    )
    return group, members, World(requests=requests, nodes=nodes, pods=tuple(members))


def group_kind_of(line: str) -> str:
    """What a PodGroup's line says of its attempt."""
    if "rolling back" in line:
        return "rollback"
    if any(said in line for said in ENDED):
        return "ended"
    if "and the whole gang fits" in line:
        return "fits"
    waiting = (
        "capacity requested (",
        "waiting for the autoscaler",
        " arrived, ",
        "not be computed",
    )
    if any(said in line for said in waiting):
        return "waiting"
    return "other"


FITTING = (Arrival(recorded=True, tainted=False, ready=True, gpu=2),)


def provisioned(*also: str, **kw: Any) -> GroupRead:
    """A gang of 2 whose request is provisioned (and whatever `also` says)."""
    fields: dict[str, Any] = {
        "min_count": 2,
        "members": 2,
        "state": "Provisioning",
        "exists": True,
        "conditions": frozenset({"Accepted", "Provisioned", *also}),
        "deadline_in": 600,
        "moved": False,
        "rolling_back": False,
        "outcome": False,
        "arrivals": FITTING,
    }
    return GroupRead(**{**fields, **kw})


@settings(max_examples=120, derandomize=True, deadline=None)
@given(read=group_reads())
@example(read=provisioned())  # fits
@example(read=provisioned(arrivals=()))  # waits for nodes
@example(read=provisioned("Failed"))
@example(read=provisioned("CapacityRevoked"))
@example(read=provisioned("BookingExpired"))
@example(read=provisioned(rolling_back=True, outcome=True))  # rolled back
def test_a_podgroups_one_line_diagnosis_says_what_decide_says(read: GroupRead) -> None:
    obj, pods, world = group_objects(read)
    group, members = pod_group_of(obj), [pod_of(p) for p in pods]
    snap = group_snapshot_of(
        group,
        members,
        config=(AtomicProvisioningSpec(), ""),
        requests=world.requests,
        capacity=capacity_of(world),
        max_members=5000,
        opted_in=True,
    )
    step = podgroup.decide(snap, NOW).step
    progress = step.progress if step is not None else None
    event(f"progress {progress}")
    facts = gather_group(obj, members, world, namespace="default", name="g", now=NOW)
    line = group_verdict(facts, NOW).line
    assert group_kind_of(line) in expected(progress, line), (progress, line)
    if progress is Progress.WAITING:
        said_deadline(read.moved, line, snap.requests[0])
    if progress is Progress.WAITING and "Provisioned" in read.conditions:
        placement = facts.placement
        assert placement is not None and step is not None
        said_fit(step.message, placement.summary, line)
    if progress in (Progress.ROLLING_BACK, Progress.ROLLED_BACK) and read.rolling_back:
        assert f"rolling back attempt 1: {REASON}" in line
