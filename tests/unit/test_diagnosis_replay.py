"""Property tests: the one-line diagnosis says where `decide` says the attempt stands.

Random live reads (a Workload's members and check, its request's conditions, deadline and
rollback record, the nodes that arrived: tainted, not Ready, too small) are diagnosed, and
the same objects are decided on the Snapshot the controller builds: the line's kind must be
the progress's kind, both ways (waiting ⇔ says waiting, and names why the arrivals take no
member; fits ⇔ says it fits; a rollback or an ended attempt ⇔ says so)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.explain import World, capacity_of
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.timefmt import format_time
from gangcheck.logic.workloads.admission import decide
from gangcheck.logic.workloads.diagnosis import gather, verdict
from gangcheck.logic.workloads.snapshot import snapshot_of
from gangcheck.model.objects import Flavor, Obj, workload_of
from tests.builders import CHECK, CONTROLLER, WorkloadBuilder, node, provisioning_request

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
reads = st.builds(
    Read,
    members=st.integers(min_value=1, max_value=4),
    mode=st.sampled_from(["NodesFit", "NodesFit", "TrustProvisioned"]),
    exists=st.sampled_from([True, True, True, False]),
    conditions=st.tuples(
        st.frozensets(st.sampled_from(["Accepted", "Provisioned"])),
        st.sampled_from([(), (), (), ("Failed",), ("CapacityRevoked",), ("BookingExpired",)]),
    ).map(lambda t: t[0] | frozenset(t[1])),
    deadline_in=st.sampled_from([-30, 42, 600]),
    rolling_back=st.sampled_from([False, False, False, True]),
    outcome=st.booleans(),
    arrivals=st.lists(arrivals, max_size=5).map(tuple),
)


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
            # as the controller keeps it: created + deadlineSeconds (420 s by default)
            created=format_time(NOW + timedelta(seconds=read.deadline_in - 420)),
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
    check = {
        "metadata": {"name": CHECK},
        "spec": {
            "controllerName": CONTROLLER,
            "parameters": {
                "apiGroup": "gangcheck.io",
                "kind": "AtomicProvisioningConfig",
                "name": "cfg",
            },
        },
        "status": {"conditions": [{"type": "Active", "status": "True"}]},
    }
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
        or " arrived " in line
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


@settings(max_examples=150, derandomize=True, deadline=None)
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
    if progress is Progress.WAITING and "Provisioned" in read.conditions:
        placement = facts.placement
        arrived = placement.arrived if placement is not None else ()
        idle = [n for n in arrived if not n.members]
        if arrived and len(idle) == len(arrived) and all(n.kind == "taint" for n in idle):
            assert "tolerate" in line, line  # the fit's failing reason is named
    if progress in (Progress.ROLLING_BACK, Progress.ROLLED_BACK) and read.rolling_back:
        assert f"rolling back attempt 1: {REASON}" in line
