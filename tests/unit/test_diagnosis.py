"""Table tests of the diagnosis: which link of the chain blocks a gang, in one line."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.diagnose import text as diagnose_text
from gangcheck.diagnose.as_json import to_json
from gangcheck.diagnose.reports import DiagnoseReport, StatusReport
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.explain import (
    NodeFit,
    Placement,
    RequestFacts,
    World,
    classify,
    human_duration,
    nodes_needed,
    place,
)
from gangcheck.logic.attempt.fulfillment import fit_words
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import Outcome
from gangcheck.logic.placement.fit import FitResult, Rejection, host_rejection, node_view
from gangcheck.logic.placement.topology import TopologyFit
from gangcheck.logic.workloads.admission import check_ended
from gangcheck.logic.workloads.admission import check_updated as check_updated_text
from gangcheck.logic.workloads.diagnosis import (
    RESET,
    CheckFacts,
    Ended,
    Facts,
    Replay,
    StartFacts,
    Target,
    TargetError,
    WorkloadState,
    earlier_attempts,
    gang_row,
    gather,
    parse_target,
    phase_of,
    verdict,
)
from gangcheck.model.objects import Condition, Flavor, request_of
from tests.builders import (
    CHECK,
    WorkloadBuilder,
    admission_check,
    node,
    pod_template,
    provisioning_request,
)
from tests.unit.test_fit import affinity as fit_affinity
from tests.unit.test_fit import expr as fit_expr
from tests.unit.test_fit import member as fit_member
from tests.unit.test_fit import node as fit_node
from tests.unit.test_fit import taint as fit_taint

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
REQ = "wl-gpu-1"
TAINT = "nvidia.com/gpu:NoSchedule"
RESERVED = WorkloadState(reserved=True, cluster_queue="cq", local_queue="lq")
QUEUED = WorkloadState(local_queue="lq")
OURS = CheckFacts("gpu", "Pending", message=f"provisioning request {REQ} created for 16 pods")
KARPENTER_POOL_MISSING = (
    "NodePool 'spot' named by spec.capacitySources[1].karpenter.nodePools[0] does not exist"
)
KUEUE_QUOTA = (
    "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu "
    "in flavor gpu, 8 more needed"
)


def cond(kind: str, message: str = "", status: str = "True") -> Condition:
    return Condition(kind, status, kind, message)


def request(*kinds: str, deadline_in: float | None = 42, **fields: Any) -> RequestFacts:
    conditions = {k.split("=")[0]: cond(*k.split("=", 1)) for k in kinds}
    deadline = NOW + timedelta(seconds=deadline_in) if deadline_in is not None else None
    return RequestFacts(REQ, 1, conditions=conditions, deadline=deadline, **fields)


def arrived(
    count: int, *, members: int = 0, kind: str = "", short: str = "", **kw: Any
) -> list[NodeFit]:
    return [
        NodeFit(f"n{i}", arrived=True, recorded=True, members=members, kind=kind, short=short, **kw)
        for i in range(count)
    ]


def tainted(count: int, taint: str = TAINT) -> list[NodeFit]:
    short = f"taint {taint} not tolerated"
    return arrived(count, kind="taint", short=short, subject=taint, reason=short)


def placement(nodes: list[NodeFit], placeable: int, total: int = 16) -> Placement:
    """The placement on `nodes` (named n0, n1, ... in order), its words made by the product
    (`fit_words`) from the fit those nodes describe: the members each takes, the reason of
    each that takes none."""
    nodes = [replace(n, name=f"n{i}") for i, n in enumerate(nodes)]
    result = FitResult(
        fits=placeable >= total,
        placeable=placeable,
        total=total,
        placements={n.name: ("workers",) * n.members for n in nodes if n.members},
        unplaced={"workers": total - placeable} if placeable < total else {},
        node_reasons={
            n.name: Rejection(n.short, "" if n.reason == n.short else n.reason)
            for n in nodes
            if n.short
        },
    )
    words = fit_words(TopologyFit(result))
    return Placement(placeable, total, placeable >= total, tuple(nodes), summary=words)


def gang(
    *,
    state: WorkloadState = RESERVED,
    checks: tuple[CheckFacts, ...] = (OURS,),
    req: RequestFacts | None = None,
    fit: Placement | None = None,
    start: StartFacts | None = None,
    mode: str = "NodesFit",
    progress: Progress | None = None,
    replay: Replay | None = None,
    turns: tuple[Ended, ...] = (),
) -> Facts:
    """`progress`: where the decision replayed on the objects says the attempt stands;
    `turns`: the check's turns to Retry or Rejected its Events tell."""
    return Facts(
        "team-a",
        "wl",
        state=state,
        checks=checks,
        focus=next((c.name for c in checks if c.ours), ""),
        mode=mode,
        request=req,
        placement=fit,
        start=start,
        replay=replay or Replay(progress, state="Pending"),
        turns=turns,
    )


@dataclass
class Case:
    id: str
    facts: Facts
    line: str
    step: str = ""


PROVISIONED = request("Accepted", "Provisioned=resize done")
WAITING, FITS = Progress.WAITING, Progress.FITS
ROLLED_BACK_1 = Ended(
    "Retry",
    "Retrying after rollback: rolled back wl-gpu-1 (Deadline: 1 of 2 members placeable); "
    "reclaimed 1 node (2.0 node-minutes held)",
    NOW - timedelta(minutes=3),
    1,
)
FAILED_2 = Ended(
    "Retry", "Retrying after failure: CapacityIsNotFound", NOW - timedelta(minutes=1), 2
)

CASES = [
    Case(
        "quota exhausted quotes Kueue's message and names the ClusterQueue",
        gang(
            state=replace(
                QUEUED,
                cluster_queue="cq",
                quota_condition=Condition("QuotaReserved", "False", "Pending", KUEUE_QUOTA),
            ),
            checks=(),
        ),
        f"blocked: quota: ClusterQueue cq: {KUEUE_QUOTA}",
        "quota",
    ),
    Case(
        "a quota message that names its ClusterQueue is not prefixed twice",
        gang(
            state=replace(
                QUEUED,
                cluster_queue="cq",
                quota_condition=cond("QuotaReserved", "ClusterQueue cq is inactive", "False"),
            ),
            checks=(),
        ),
        "blocked: quota: ClusterQueue cq is inactive",
    ),
    Case(
        "no QuotaReserved condition yet: Kueue has not placed it",
        gang(state=QUEUED, checks=()),
        "blocked: quota: not reserved yet; Kueue has not placed it (LocalQueue lq)",
    ),
    Case(
        "a LocalQueue that does not exist is named",
        gang(state=replace(QUEUED, local_queue_found=False), checks=()),
        "blocked: quota: LocalQueue lq does not exist in team-a",
    ),
    Case(
        "quota taken back mid-attempt: the attempt is kept until its deadline, then withdrawn",
        gang(
            state=replace(
                QUEUED,
                quota_condition=cond(
                    "QuotaReserved", "LocalQueue lq is terminating or missing", "False"
                ),
            ),
            req=PROVISIONED,
        ),
        "blocked: quota: LocalQueue lq is terminating or missing; its attempt in flight "
        f"({REQ}) is withdrawn at its deadline, what arrived for it reclaimed, deadline in 42s",
        "quota",
    ),
    Case(
        "after a retry the backoff says when Kueue requeues",
        gang(
            state=replace(QUEUED, requeue_at=NOW + timedelta(seconds=90)),
            checks=(replace(OURS, retry_count=1),),
        ),
        "blocked: backoff after attempt 1: Kueue requeues the Workload in 1m30s",
        "quota",
    ),
    Case(
        "an inactive check of ours blocks before quota, since its ClusterQueue is inactive",
        gang(
            state=replace(
                QUEUED,
                quota_condition=cond("QuotaReserved", "ClusterQueue cq is inactive", "False"),
            ),
            checks=(
                CheckFacts(
                    "gpu", "", active=False, problem="AtomicProvisioningConfig 'x' not found"
                ),
            ),
        ),
        "blocked: the AdmissionCheck gpu is inactive: AtomicProvisioningConfig 'x' not found",
        "check",
    ),
    Case(
        "an inactive check with quota reserved says why it is inactive",
        gang(
            checks=(replace(OURS, active=False, problem="AtomicProvisioningConfig 'x' not found"),)
        ),
        "blocked: the AdmissionCheck gpu is inactive: AtomicProvisioningConfig 'x' not found",
        "check",
    ),
    Case(
        "an inactive check over a gang with quota whose attempt goes on says both",
        gang(
            checks=(replace(OURS, active=False, problem=KARPENTER_POOL_MISSING),),
            req=request(),
            progress=Progress.WAITING,
        ),
        f"blocked: the AdmissionCheck gpu is inactive ({KARPENTER_POOL_MISSING}): no new gang "
        "gets quota on ClusterQueue cq; this gang keeps its quota and its attempt goes on: "
        f"waiting for the autoscaler to accept {REQ}, deadline in 42s",
        "request",
    ),
    Case(
        "an inactive check over a gang with quota that the decision would ask for now",
        gang(
            checks=(replace(OURS, active=False, problem=KARPENTER_POOL_MISSING),),
            req=RequestFacts(REQ, 1, found=False),
            replay=Replay(state="Pending", asks=True),
        ),
        f"blocked: the AdmissionCheck gpu is inactive ({KARPENTER_POOL_MISSING}): no new gang "
        "gets quota on ClusterQueue cq; this gang keeps its quota and its attempt goes on: "
        f"ProvisioningRequest {REQ} does not exist yet (is the gangcheck controller running?)",
        "request",
    ),
    Case(
        "a rejected check quotes its message",
        gang(checks=(replace(OURS, state="Rejected", message="capacity revoked by cloud"),)),
        "blocked: the check gpu rejected the gang: capacity revoked by cloud",
    ),
    Case(
        "a retry names the backoff and the check's message",
        gang(
            checks=(
                replace(
                    OURS,
                    state="Retry",
                    message="Retrying after failure: CapacityIsNotFound",
                    requeue_after_seconds=60,
                ),
            )
        ),
        "blocked: the check gpu asked Kueue to retry after 1m: "
        "Retrying after failure: CapacityIsNotFound",
    ),
    Case(
        "a retry after a rollback names what triggered it",
        gang(
            checks=(
                replace(
                    OURS,
                    state="Retry",
                    message="Retrying after rollback: ...",
                    requeue_after_seconds=10,
                ),
            ),
            req=request(
                "Provisioned",
                phase="RollingBack",
                rollback_reason="Deadline: the gang did not fit within 420s",
                outcome=Outcome(reclaimed=("n1",)),
            ),
        ),
        "blocked: attempt 1 rolled back (Deadline: the gang did not fit within 420s); "
        "Kueue requeues the gang after 10s",
        "check",
    ),
    Case(
        "no request yet and the check says why",
        gang(
            checks=(
                replace(
                    OURS,
                    message="waiting for ResourceFlavor gpu (named by the admission, not found)",
                ),
            ),
            req=RequestFacts(REQ, 1, found=False),
            replay=Replay(
                state="Pending",
                message="waiting for ResourceFlavor gpu (named by the admission, not found)",
            ),
        ),
        "blocked: the check gpu is Pending: waiting for ResourceFlavor gpu (named by the "
        "admission, not found)",
    ),
    Case(
        "no request, and the decision would ask for one now: is the controller running",
        gang(req=RequestFacts(REQ, 1, found=False), replay=Replay(state="Pending", asks=True)),
        f"blocked: ProvisioningRequest {REQ} does not exist yet (is the gangcheck controller "
        "running?)",
        "request",
    ),
    Case(
        "a request not yet accepted waits for the autoscaler, with the deadline",
        gang(req=request(), progress=Progress.WAITING),
        f"blocked: waiting for the autoscaler to accept {REQ}, deadline in 42s",
        "request",
    ),
    Case(
        "an accepted request shows the autoscaler's ETA",
        gang(
            req=RequestFacts(
                REQ,
                1,
                conditions={
                    "Accepted": cond("Accepted"),
                    "Provisioned": cond("Provisioned", "ETA 5m", "False"),
                },
            ),
            progress=Progress.WAITING,
        ),
        f"blocked: waiting for the autoscaler: {REQ} accepted, not provisioned yet (ETA 5m)",
    ),
    Case(
        "a failed request quotes the autoscaler",
        gang(req=request("Accepted", "Failed=CapacityIsNotFound"), progress=Progress.ROLLING_BACK),
        f"blocked: the autoscaler failed {REQ}: CapacityIsNotFound",
    ),
    Case(
        "revoked capacity is named",
        gang(
            req=request("Provisioned", "CapacityRevoked=zone lost"), progress=Progress.ROLLING_BACK
        ),
        f"blocked: the autoscaler revoked the capacity of {REQ}: zone lost",
    ),
    Case(
        "an expired booking is named",
        gang(
            req=request("Provisioned", "BookingExpired=booked 10m, unused"),
            progress=Progress.ROLLING_BACK,
        ),
        f"blocked: the booking of {REQ} expired: booked 10m, unused",
    ),
    Case(
        "rolling back names the trigger and what was reclaimed",
        gang(
            req=request(
                "Provisioned",
                phase="RollingBack",
                rollback_reason="Deadline: the gang did not fit within 420s",
                outcome=Outcome(reclaimed=("n1", "n2"), node_seconds=600),
            ),
            progress=Progress.ROLLED_BACK,
        ),
        "blocked: rolling back attempt 1: Deadline: the gang did not fit within 420s; "
        "reclaimed 2 nodes (10.0 node-minutes held)",
    ),
    Case(
        "provisioned, and the fit could not be computed: that is said",
        gang(req=PROVISIONED, progress=WAITING, fit=None),
        f"blocked: {REQ} is Provisioned; the fit could not be computed",
        "nodes",
    ),
    Case(
        "provisioned with nothing arrived waits for the autoscaler",
        gang(req=PROVISIONED, progress=WAITING, fit=placement([], 0)),
        "blocked: waiting for the autoscaler, no node has arrived yet: 0 of 16 members "
        "placeable; no nodes, deadline in 42s",
        "nodes",
    ),
    Case(
        "partial delivery: 11 of 16 members placeable, and the deadline",
        gang(req=PROVISIONED, progress=WAITING, fit=placement(arrived(11, members=1), 11)),
        "blocked: waiting for the autoscaler: 11 of 16 members placeable on 11 nodes; the nodes "
        "in use have no room for the rest, deadline in 42s",
        "nodes",
    ),
    Case(
        "past the deadline the decision starts the rollback: its trigger is named",
        gang(
            req=replace(PROVISIONED, deadline=NOW - timedelta(seconds=3)),
            fit=placement(arrived(11, members=1), 11),
            replay=Replay(
                Progress.ROLLING_BACK,
                "Deadline: the gang did not fit within 420s (11 of 16 members placeable)",
                "Pending",
            ),
        ),
        "blocked: rolling back attempt 1: Deadline: the gang did not fit within 420s (11 of 16 "
        "members placeable)",
        "request",
    ),
    Case(
        "every arrived node has a taint the gang does not tolerate: the taint is named",
        gang(req=PROVISIONED, progress=WAITING, fit=placement(tainted(3), 0, 2)),
        f"blocked: 3 nodes arrived, none usable: 0 of 2 members placeable; 3 nodes can take "
        f"none: 3 × taint {TAINT} not tolerated",  # noqa: RUF001
        "nodes",
    ),
    Case(
        "one tainted arrival reads in the singular",
        gang(req=PROVISIONED, progress=WAITING, fit=placement(tainted(1), 0, 2)),
        f"blocked: 1 node arrived, none usable: 0 of 2 members placeable; 1 node can take "
        f"none: 1 × taint {TAINT} not tolerated",  # noqa: RUF001
    ),
    Case(
        "arrivals with two different taints name both",
        gang(
            req=PROVISIONED,
            progress=WAITING,
            fit=placement(tainted(1) + tainted(1, "gpu:NoExecute"), 0, 2),
        ),
        "blocked: 2 nodes arrived, none usable: 0 of 2 members placeable; 2 nodes can take "
        f"none: 1 × taint gpu:NoExecute not tolerated, 1 × taint {TAINT} not tolerated",  # noqa: RUF001
    ),
    Case(
        "arrivals failing for different reasons are counted by reason",
        gang(
            req=PROVISIONED,
            progress=WAITING,
            fit=placement(tainted(2) + arrived(1, kind="not-ready", short="not Ready"), 0, 2),
        ),
        "blocked: 3 nodes arrived, none usable: 0 of 2 members placeable; 3 nodes can take "
        f"none: 2 × taint {TAINT} not tolerated, 1 × not Ready",  # noqa: RUF001
    ),
    Case(
        "some unusable arrivals are named beside the members placeable",
        gang(
            req=PROVISIONED,
            progress=WAITING,
            fit=placement(arrived(11, members=1) + tainted(2), 11),
        ),
        "blocked: 13 nodes arrived, 2 not usable: 11 of 16 members placeable on 11 nodes; "
        f"2 nodes can take none: 2 × taint {TAINT} not tolerated",  # noqa: RUF001
    ),
    Case(
        "arrivals not Ready yet are waited for",
        gang(
            req=PROVISIONED,
            progress=WAITING,
            fit=placement(
                arrived(11, members=1) + arrived(2, kind="not-ready", short="not Ready"), 11
            ),
        ),
        "blocked: waiting for the autoscaler: 11 of 16 members placeable on 11 nodes; 2 nodes "
        "can take none: 2 × not Ready, deadline in 42s",  # noqa: RUF001
    ),
    Case(
        "arrivals without the labels the gang selects name the labels",
        gang(
            req=PROVISIONED,
            progress=WAITING,
            fit=placement(
                arrived(
                    2,
                    kind="selector",
                    short="node selector mismatch (needs pool=a)",
                    subject="pool=a",
                ),
                0,
            ),
        ),
        "blocked: 2 nodes arrived, none usable: 0 of 16 members placeable; 2 nodes can take "
        "none: 2 × node selector mismatch (needs pool=a)",  # noqa: RUF001
    ),
    Case(
        "arrivals without room name the resource",
        gang(
            req=PROVISIONED,
            progress=WAITING,
            fit=placement(
                arrived(
                    2,
                    kind="resources",
                    short="insufficient nvidia.com/gpu",
                    reason="insufficient nvidia.com/gpu (requested 2, free 1)",
                ),
                0,
            ),
        ),
        "blocked: 2 nodes arrived, none usable: 0 of 16 members placeable; 2 nodes can take "
        "none: 2 × insufficient nvidia.com/gpu; node n0: insufficient nvidia.com/gpu "  # noqa: RUF001
        "(requested 2, free 1)",
    ),
    Case(
        "the gang fits but the check is still pending: is the controller running",
        gang(
            req=PROVISIONED,
            fit=placement(arrived(16, members=1), 16),
            progress=FITS,
        ),
        "blocked: the whole gang fits on nodes that exist; waiting for gangcheck to mark the "
        "check Ready (is the controller running?)",
        "check",
    ),
    Case(
        "trusting Provisioned, a provisioned request waits only for the controller",
        gang(req=PROVISIONED, mode="TrustProvisioned", progress=FITS),
        f"blocked: {REQ} is Provisioned; waiting for gangcheck to mark the check Ready (is the "
        "controller running?)",
    ),
    Case(
        "admitted with every member scheduled is running",
        gang(
            state=replace(RESERVED, admitted=True),
            checks=(replace(OURS, state="Ready"),),
            req=request("Provisioned", phase="Fulfilled"),
            start=StartFacts(4, 4),
        ),
        "not blocked: admitted and running",
        "start",
    ),
    Case(
        "admitted and marked started is running",
        gang(
            state=replace(RESERVED, admitted=True),
            checks=(replace(OURS, state="Ready"),),
            req=request("Provisioned", phase="Started"),
        ),
        "not blocked: admitted and running",
    ),
    Case(
        "running on attempt 2: attempt 1's rollback, as its Event tells, is said earlier",
        gang(
            state=replace(RESERVED, admitted=True),
            checks=(replace(OURS, state="Ready", retry_count=1),),
            req=request("Provisioned", phase="Started"),
            turns=(ROLLED_BACK_1,),
        ),
        "not blocked: admitted and running",
    ),
    Case(
        "attempt 3 in flight: attempts 1 and 2 said earlier, oldest first",
        gang(
            checks=(replace(OURS, retry_count=2),),
            req=PROVISIONED,
            mode="TrustProvisioned",
            progress=FITS,
            turns=(ROLLED_BACK_1, FAILED_2),
        ),
        f"blocked: {REQ} is Provisioned; waiting for gangcheck to mark the check Ready (is the "
        "controller running?)",
    ),
    Case(
        "a retry now: its own turn is the check's message, attempt 1's said earlier",
        gang(
            checks=(
                replace(
                    OURS,
                    state="Retry",
                    message=FAILED_2.message,
                    retry_count=1,
                    requeue_after_seconds=60,
                ),
            ),
            turns=(ROLLED_BACK_1, FAILED_2),
        ),
        f"blocked: the check gpu asked Kueue to retry after 1m: {FAILED_2.message}",
    ),
    Case(
        "admitted with members unscheduled names the start deadline",
        gang(
            state=replace(RESERVED, admitted=True),
            checks=(replace(OURS, state="Ready"),),
            req=request("Provisioned", phase="Fulfilled"),
            start=StartFacts(2, 4, NOW + timedelta(seconds=20)),
        ),
        "blocked: admitted, but only 2 of 4 members are scheduled, start deadline in 20s",
        "start",
    ),
    Case(
        "a finished Workload is not blocked",
        gang(state=replace(RESERVED, finished=cond("Finished", "Job finished successfully"))),
        "not blocked: finished (Job finished successfully)",
    ),
    Case(
        "a Workload deactivated after a rejection says so",
        gang(
            state=replace(QUEUED, active=False),
            checks=(replace(OURS, state="Rejected", message="no capacity"),),
        ),
        "blocked: the Workload is deactivated (spec.active=false): the check gpu rejected it: "
        "no capacity",
        "workload",
    ),
    Case(
        "every check Ready but not admitted waits for Kueue",
        gang(checks=(replace(OURS, state="Ready"),)),
        "blocked: quota reserved and every check Ready; waiting for Kueue to admit",
        "admission",
    ),
    Case(
        "another controller's pending check is named",
        gang(
            checks=(
                replace(OURS, state="Ready"),
                CheckFacts(
                    "mk",
                    "Pending",
                    "dispatching",
                    ours=False,
                    controller="kueue.x-k8s.io/multikueue",
                ),
            )
        ),
        "blocked: the admission check mk (kueue.x-k8s.io/multikueue) is Pending: dispatching",
    ),
    Case(
        "a request being deleted, within the grace: the gang waits for it to go",
        gang(req=request(deleting=True, deleted_at=NOW - timedelta(seconds=10))),
        f"blocked: ProvisioningRequest {REQ} is being deleted since 2026-11-30T10:04:50Z",
        "request",
    ),
    Case(
        "a request held in deletion past the grace: the finalizers and since when, as the "
        "check message says",
        gang(
            req=request(
                deleting=True,
                deleted_at=NOW - timedelta(minutes=5),
                finalizers=("example.com/keep", "other.io/audit"),
            )
        ),
        f"blocked: waiting for ProvisioningRequest {REQ} to be deleted: finalizers "
        "[example.com/keep, other.io/audit] remain since 2026-11-30T10:00:00Z",
        "request",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verdict(case: Case) -> None:
    found = verdict(case.facts, NOW)
    assert found.line == case.line
    if case.step:
        assert found.step == case.step


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_text_and_the_json_say_the_same(case: Case) -> None:
    """For every state above: the text ends in the verdict's line, the JSON's; each check's
    message, the request's outcome and deletion are in the text as the JSON has them."""
    text, as_json, line = report_of(case.facts)
    flat = " ".join(text.split())
    assert text.splitlines()[-1] == as_json["verdict"]["line"] == line
    for check in as_json["checks"]:
        assert " ".join(check["message"].split()) in flat
    earlier = as_json["earlierAttempts"]
    assert [(e["attempt"], e["state"], e["message"]) for e in earlier] == [
        (t.attempt, t.state, t.message) for t in earlier_attempts(case.facts)
    ]
    for each in earlier:
        assert f"{each['line']}" in flat
    assert ("earlier " in text) == bool(earlier)
    req = as_json["request"]
    if req is not None and req["outcome"] is not None:
        assert f"outcome: {req['outcome']['summary']}" in flat
    if req is not None and req["deletion"] is not None:
        assert req["deletion"]["line"] in flat


# ---- from the objects --------------------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
POOL = Flavor("gpu", {"pool": "gpu"}, ())
FIT_CONFIG = {"spec": {"fulfillment": {"mode": "NodesFit"}}}
LATER = "2026-11-30T10:01:00Z"
EARLIER = "2026-11-30T09:00:00Z"


def world(**kw: Any) -> World:
    base: dict[str, Any] = {
        "admission_checks": {CHECK: admission_check()},
        "configs": {"cfg": FIT_CONFIG},
        "flavors": {"gpu": POOL},
    }
    return World(**{**base, **kw})


def workload(members: int = 2) -> dict[str, Any]:
    return WorkloadBuilder().pod_set("workers", members).reserve_quota().check().build()


def our_request(**kw: Any) -> dict[str, Any]:
    name = naming.request_name("wl", CHECK, 1)
    deadline = {"gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z"}
    return provisioning_request(
        name,
        templates=[(naming.template_name(name, "workers"), 2)],
        conditions={"Accepted": "", "Provisioned": ""},
        annotations=deadline,
        **kw,
    )


def arrival(
    name: str, *, claimed_for: str = "default/wl-atomic-1", created: str = LATER, **kw: Any
) -> dict[str, Any]:
    notes = {"gangcheck.io/arrived-for": claimed_for} if claimed_for else {}
    return node(name, gpu=1, created=created, labels={"pool": "gpu"}, annotations=notes, **kw)


def test_tainted_arrivals_are_named_from_the_objects() -> None:
    nodes = tuple(arrival(f"gpu-{i}", taints=[GPU_TAINT]) for i in range(3))
    facts = gather(workload(), world(requests=(our_request(),), nodes=nodes), now=NOW)
    assert [n.kind for n in facts.placement.nodes] == ["taint"] * 3  # type: ignore[union-attr]
    assert verdict(facts, NOW).line == (
        "blocked: 3 nodes arrived, none usable: 0 of 2 members placeable; 3 nodes can take none: "
        f"3 × taint {TAINT} not tolerated; node gpu-0: taint nvidia.com/gpu=present:NoSchedule "  # noqa: RUF001
        "not tolerated"
    )


def test_the_json_says_the_decision_replayed_on_the_objects() -> None:
    nodes = tuple(arrival(f"gpu-{i}", taints=[GPU_TAINT]) for i in range(3))
    facts = gather(workload(), world(requests=(our_request(),), nodes=nodes), now=NOW)
    report = DiagnoseReport(Target("workload", "default", "wl"), facts, verdict(facts, NOW), NOW)
    decision = to_json(report)["decision"]
    assert (decision["progress"], decision["state"], decision["asks"]) == (
        "Waiting",
        "Pending",
        False,
    )
    assert decision["message"].startswith("capacity requested, not yet usable: 0 of 2 members")


def test_an_attempt_is_fitted_with_the_pod_sets_of_the_config_it_was_made_under() -> None:
    """managedResources narrowed to the GPU since the request asked for the driver too
    (under the config recorded on it): diagnose fits the 3 members it asked for, as the
    controller does, not the 2 GPU workers the config names now."""
    wl = (
        WorkloadBuilder()
        .pod_set("driver", 1, pod_template(cpu="16"))
        .pod_set("workers", 2)
        .reserve_quota()
        .check()
        .build()
    )
    name = naming.request_name("wl", CHECK, 1)
    req = provisioning_request(
        name,
        templates=[
            (naming.template_name(name, "driver"), 1),
            (naming.template_name(name, "workers"), 2),
        ],
        conditions={"Accepted": "", "Provisioned": ""},
        annotations={
            "gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z",
            "gangcheck.io/attempt-config": "{}",
        },
    )
    narrowed = {"spec": {"managedResources": ["nvidia.com/gpu"]}}
    nodes = tuple(arrival(f"gpu-{i}", cpu="8") for i in range(2))
    facts = gather(wl, world(configs={"cfg": narrowed}, requests=(req,), nodes=nodes), now=NOW)
    report = DiagnoseReport(Target("workload", "default", "wl"), facts, verdict(facts, NOW), NOW)
    decision = to_json(report)["decision"]
    assert (decision["progress"], decision["state"]) == ("Waiting", "Pending")
    assert decision["message"].startswith(
        "capacity requested, not yet usable: 2 of 3 members placeable"
    )
    assert facts.placement is not None
    assert (facts.placement.placeable, facts.placement.total) == (2, 3)
    assert "2 of 3 members placeable" in verdict(facts, NOW).line


LEVEL = "none carries the required topology level rack (pod set workers)"
NO_NODE_HAS_LEVEL = (
    "no node the gang may use carries the required topology level rack (pod set workers): the "
    "gang cannot fit in one domain; ignoring the level"
)


def racked_workload() -> dict[str, Any]:
    """Two members that must sit inside one rack (Kueue's required topology)."""
    template = pod_template(gpu=1)
    template["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": "rack"}}
    return WorkloadBuilder().pod_set("workers", 2, template).reserve_quota().check().build()


@pytest.mark.parametrize(
    ("nodes", "line", "head"),
    [
        pytest.param(
            (arrival("gpu-0"), arrival("gpu-1")),
            f"blocked: 2 nodes arrived for this attempt; {LEVEL}: the gang cannot fit in one "
            "domain; ignoring the level, 2 of 2 members placeable on 2 nodes; waiting until the "
            "deadline in case they are labelled, deadline in 2m",
            "2 arrived; none carries the required topology level rack; 2 of 2 members placeable "
            "ignoring it",
            id="arrived for this attempt, recorded",
        ),
        pytest.param(
            (arrival("gpu-0", claimed_for=""), arrival("gpu-1", claimed_for="")),
            f"blocked: 2 nodes arrived for this attempt; {LEVEL}: the gang cannot fit in one "
            "domain; ignoring the level, 2 of 2 members placeable on 2 nodes; waiting until the "
            "deadline in case they are labelled, deadline in 2m",
            "2 arrived (2 not recorded yet); none carries the required topology level rack; 2 of "
            "2 members placeable ignoring it",
            id="arrived for this attempt, not recorded yet",
        ),
        pytest.param(
            tuple(node(f"gpu-{i}", gpu=1, created=EARLIER, labels={"pool": "gpu"}) for i in (0, 1)),
            f"blocked: {NO_NODE_HAS_LEVEL}, 2 of 2 members placeable on 2 nodes, deadline in 2m",
            "0 arrived; none carries the required topology level rack; 2 of 2 members placeable "
            "ignoring it",
            id="nodes of an earlier attempt, none arrived for this one: not 'no node has arrived'",
        ),
        pytest.param(
            (),
            "blocked: waiting for the autoscaler, no node has arrived yet: "
            f"{NO_NODE_HAS_LEVEL}, 0 of 2 members placeable; no nodes, deadline in 2m",
            "0 arrived; no node carries the required topology level rack; 0 of 2 members "
            "placeable ignoring it",
            id="no node at all: waiting for the autoscaler",
        ),
    ],
)
def test_provisioned_nodes_without_the_required_level_are_said_so(
    nodes: tuple[dict[str, Any], ...], line: str, head: str
) -> None:
    """The level no node showed when asked: the autoscaler Provisioned, and what is there
    lacks the label. The verdict says so in the check message's words (the decision replayed
    says them too, minus where it leaves the attempt), text and JSON alike."""
    facts = gather(racked_workload(), world(requests=(our_request(),), nodes=nodes), now=NOW)
    found = verdict(facts, NOW)
    assert (found.line, found.step) == (line, "nodes")
    assert facts.replay is not None
    fit = (
        line.removeprefix("blocked: ")
        .removeprefix("waiting for the autoscaler, no node has arrived yet: ")
        .removesuffix(", deadline in 2m")
    )
    assert facts.replay.message == f"capacity requested, not yet usable: {fit}"
    report = DiagnoseReport(Target("workload", "default", "wl"), facts, found, NOW)
    text = diagnose_text.render_text(report).splitlines()
    assert f"nodes     {head}" in text
    assert text[-1] == line
    json_nodes = to_json(report)["nodes"]
    assert json_nodes["missingTopologyLevel"] == {"key": "rack", "podSet": "workers"}
    assert to_json(report)["verdict"]["line"] == line


def admitted_on_fulfilled() -> tuple[WorkloadBuilder, dict[str, Any]]:
    """A gang of 2 admitted, its check Ready, and its first attempt's request Fulfilled."""
    admitted = (
        WorkloadBuilder().pod_set("workers", 2).reserve_quota().check(CHECK, "Ready")
    ).condition("Admitted")
    name = naming.request_name("wl", CHECK, 1)
    fulfilled = provisioning_request(
        name,
        templates=[(naming.template_name(name, "workers"), 2)],
        conditions={"Accepted": "", "Provisioned": ""},
        annotations={"gangcheck.io/phase": "Fulfilled"},
    )
    return admitted, fulfilled


def test_an_admitted_gang_past_its_start_deadline_is_rolled_back_as_decide_does() -> None:
    """The start watchdog is replayed too: past startDeadlineSeconds with members
    unscheduled, the line says the rollback the decision starts, not a deadline passed."""
    admitted, fulfilled = admitted_on_fulfilled()
    config = {"spec": {"fulfillment": {"mode": "NodesFit", "startDeadlineSeconds": 60}}}
    facts = gather(admitted.build(), world(requests=(fulfilled,), configs={"cfg": config}), now=NOW)
    assert verdict(facts, NOW).line == (
        "blocked: admitted, but rolling back attempt 1: StartDeadline: 0 of 2 members "
        "scheduled within 60s of admission"
    )
    assert phase_of(facts) == "admitted"


def test_a_dangling_config_makes_the_check_inactive() -> None:
    facts = gather(workload(), world(configs={}), now=NOW)
    assert verdict(facts, NOW).line == (
        f"blocked: the AdmissionCheck {CHECK} is inactive: AtomicProvisioningConfig 'cfg' not found"
    )


def test_a_check_the_controller_has_not_activated_is_inactive() -> None:
    facts = gather(
        workload(), world(admission_checks={CHECK: admission_check(active=False)}), now=NOW
    )
    check = facts.focus_check
    assert check is not None and not check.active


def test_a_gang_in_flight_under_a_check_kueue_sees_inactive_is_said_to_go_on() -> None:
    """The check Active=False for a reason its config does not show (a Karpenter NodePool
    missing): the controller goes on with the attempt by the config, and the line says so
    beside the check being inactive; a gang without quota behind it stays blocked by it."""
    ac = admission_check(active=False)
    ac["status"]["conditions"][0]["message"] = KARPENTER_POOL_MISSING
    facts = gather(
        workload(), world(admission_checks={CHECK: ac}, requests=(our_request(),)), now=NOW
    )
    assert verdict(facts, NOW).line == (
        f"blocked: the AdmissionCheck {CHECK} is inactive ({KARPENTER_POOL_MISSING}): no new "
        "gang gets quota on ClusterQueue cq; this gang keeps its quota and its attempt goes "
        "on: waiting for the autoscaler, no node has arrived yet: 0 of 2 members placeable; "
        "no nodes, deadline in 2m"
    )
    queued = WorkloadBuilder().pod_set("workers", 2).check().build()
    facts = gather(queued, world(admission_checks={CHECK: ac}), now=NOW)
    assert verdict(facts, NOW).line == (
        f"blocked: the AdmissionCheck {CHECK} is inactive: {KARPENTER_POOL_MISSING}"
    )


def test_the_request_of_the_current_attempt_is_read() -> None:
    facts = gather(workload(), world(requests=(our_request(),)), now=NOW)
    req = facts.request
    assert req is not None and req.found and req.attempt == 1
    assert req.deadline == datetime(2026, 11, 30, 10, 7, tzinfo=UTC)
    assert set(req.conditions) == {"Accepted", "Provisioned"}


def test_the_cluster_queue_names_the_checks_before_the_workload_lists_them() -> None:
    wl = WorkloadBuilder().pod_set("workers", 2).build()
    lq = {"metadata": {"name": "lq", "namespace": "default"}, "spec": {"clusterQueue": "cq"}}
    cq = {
        "metadata": {"name": "cq"},
        "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}},
    }
    facts = gather(
        wl,
        world(configs={}, cluster_queues={"cq": cq}, local_queues={"default/lq": lq}),
        now=NOW,
    )
    assert facts.state.cluster_queue == "cq"
    assert verdict(facts, NOW).step == "check"


def test_arrivals_recorded_new_and_shared_nodes_are_told_apart() -> None:
    req = request_of(our_request())
    nodes = [
        arrival("recorded"),
        arrival("new", claimed_for=""),
        arrival("other-gang", claimed_for="default/other-1"),
        node("shared", gpu=1, labels={"pool": "gpu"}, created=EARLIER),
        node("elsewhere", gpu=1, labels={"pool": "cpu"}),
    ]
    template = pod_template(gpu=1, node_selector={"pool": "gpu"})
    result = place(
        [("workers", 4, template)],
        nodes,
        [],
        request=req,
        in_flight=frozenset({"default/other-1", "default/wl-atomic-1"}),
    )
    assert result is not None
    seen = {n.name: (n.arrived, n.recorded, n.members) for n in result.nodes}
    assert seen == {
        "recorded": (True, True, 1),
        "new": (True, False, 1),
        "shared": (False, False, 1),
    }
    assert (result.placeable, result.total, result.fits) == (3, 4, False)


def test_bound_pods_take_room_on_nodes() -> None:
    bound = {
        "spec": {
            "nodeName": "recorded",
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        }
    }
    result = place(
        [("workers", 1, pod_template(gpu=1))],
        [arrival("recorded")],
        [bound],
        request=request_of(our_request()),
    )
    assert result is not None and result.nodes[0].kind == "resources"


@pytest.mark.parametrize(
    ("spec", "raw", "expected"),
    [
        ({"gpu": 1}, fit_node("n", gpu=8, taints=[fit_taint()]), ("taint", TAINT)),
        (
            {"selector": {"pool": "a", "zone": "b"}},
            fit_node("n", labels={"pool": "a"}),
            ("selector", "zone=b"),
        ),
        (
            {"affinity": fit_affinity({"matchExpressions": [fit_expr("zone", "In", "a")]})},
            fit_node("n", labels={"zone": "b"}),
            ("affinity", "zone In [a]"),
        ),
        ({}, fit_node("n", ready=False), ("not-ready", "")),
        ({}, fit_node("n", unschedulable=True), ("cordoned", "")),
        ({"gpu": 2, "cpu": "64"}, fit_node("n", gpu=1), ("resources", "cpu, nvidia.com/gpu")),
        ({}, fit_node("n", allocatable={}), ("unusable", "no allocatable resources reported")),
    ],
    ids=["taint", "selector", "affinity", "not ready", "cordoned", "resources", "other"],
)
def test_rejections_are_classified_as_the_fit_made_them(
    spec: dict[str, Any], raw: dict[str, Any], expected: tuple[str, str]
) -> None:
    rejection = host_rejection(fit_member(**spec), node_view(raw))
    assert rejection is not None
    assert classify(rejection) == expected


# ---- targets, durations, status rows -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("job/team-a/train", Target("job", "team-a", "train")),
        ("Jobs.batch/team-a/train", Target("job", "team-a", "train")),
        ("workload/ns/wl", Target("workload", "ns", "wl")),
        ("po/ns/p-0", Target("pod", "ns", "p-0")),
        ("pod/p-0", Target("pod", "default", "p-0")),
        ("podgroup/ns/pg", Target("podgroup", "ns", "pg")),
    ],
)
def test_targets_parse(text: str, expected: Target) -> None:
    assert parse_target(text) == expected


@pytest.mark.parametrize("text", ["job", "job/a/b/c", "job//x", "deployment/ns/x"])
def test_bad_targets_say_why(text: str) -> None:
    with pytest.raises(TargetError):
        parse_target(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (42.9, "42s"),
        (60, "1m"),
        (390, "6m30s"),
        (7500, "2h5m"),
        (3 * 86400 + 4 * 3600 + 7, "3d4h"),
    ],
)
def test_durations_read_short(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    ("facts", "phase"),
    [
        (gang(state=QUEUED), "queued"),
        (gang(req=RequestFacts(REQ, 1, found=False)), "pending"),
        (gang(req=request()), "requested"),
        (gang(req=PROVISIONED, fit=placement([], 0)), "provisioned"),
        (gang(req=PROVISIONED, fit=placement(arrived(3, members=1), 3)), "fulfilling"),
        (gang(req=request("Provisioned", phase="RollingBack")), "rolling back"),
        (gang(req=PROVISIONED, progress=Progress.ROLLING_BACK), "rolling back"),
        (gang(checks=(replace(OURS, state="Retry"),)), "retrying"),
        (gang(checks=(replace(OURS, state="Ready"),), req=request(phase="Fulfilled")), "ready"),
        (
            gang(state=replace(RESERVED, admitted=True), req=request(phase="Started")),
            "started",
        ),
    ],
    ids=[
        "queued",
        "pending",
        "requested",
        "provisioned",
        "fulfilling",
        "rolling back",
        "a rollback the decision starts now",
        "retrying",
        "ready",
        "started",
    ],
)
def test_phases(facts: Facts, phase: str) -> None:
    assert phase_of(facts) == phase


def test_nodes_needed_extrapolates_from_the_nodes_in_use() -> None:
    assert nodes_needed(placement(arrived(11, members=1), 11)) == 16
    assert nodes_needed(placement(arrived(2, members=4), 8)) == 4
    assert nodes_needed(placement(arrived(4, members=4), 16)) == 4
    assert nodes_needed(placement(tainted(3), 0)) is None


def test_a_status_row_carries_the_verdict() -> None:
    facts = replace(
        gang(req=PROVISIONED, fit=placement(arrived(11, members=1), 11), progress=WAITING),
        state=replace(RESERVED, created=NOW - timedelta(minutes=3)),
    )
    row = gang_row(facts, NOW)
    assert (row.phase, row.attempt, row.arrived, row.needed, row.age_seconds) == (
        "fulfilling",
        1,
        11,
        16,
        180,
    )
    assert row.verdict.startswith("blocked: waiting for the autoscaler: 11 of 16")


def test_a_status_row_of_an_admitted_gang_says_its_members_scheduled() -> None:
    """The demo's running gangs showed MEMBERS `-`, though diagnose said "4 of 4 members
    scheduled"; as a released PodGroup's row says `4/4 bound`."""
    running = gang(
        state=replace(RESERVED, admitted=True),
        checks=(replace(OURS, state="Ready"),),
        req=request("Provisioned", phase="Started"),
        start=StartFacts(3, 4),
    )
    assert gang_row(running, NOW).members_cell == "3/4 scheduled"
    assert gang_row(replace(running, start=None), NOW).members_cell == "-"
    listed = StatusReport(None, (gang_row(running, NOW),), NOW)
    (item,) = to_json(listed)["items"]
    assert (item["membersNote"], item["given"], item["membersPlaceable"]) == (
        "3/4 scheduled",
        True,
        None,
    )
    assert "3/4 scheduled" in diagnose_text.render_text(listed)


@pytest.mark.parametrize(
    ("phase", "said"),
    [
        ("", "  phase -; deadline 2026-"),
        ("Fulfilled", "  phase Fulfilled"),
        ("Started", "  phase Started"),
        ("RollingBack", "  phase RollingBack"),
    ],
)
def test_the_request_line_gives_the_deadline_only_while_it_can_roll_the_attempt_back(
    phase: str, said: str
) -> None:
    """A fulfilled or started request's deadline holds nothing any more (the demo showed
    "phase Started; deadline … (in 5s)" beside a running gang): said only while the attempt is
    in flight."""
    lines = diagnose_text._lines_of_request("default", request("Provisioned", phase=phase), NOW)
    (line,) = [x for x in lines if x.startswith("  phase")]
    assert line.startswith(said), line
    assert ("deadline" in line) == (phase == ""), line


def test_an_admitted_gang_counts_the_nodes_recorded_for_its_request() -> None:
    """`gangcheck status` after admission: no fit is computed, and NODES says how many
    nodes arrived for the request the gang was given (another request's are not counted)."""
    admitted, fulfilled = admitted_on_fulfilled()
    nodes = (arrival("gpu-0"), arrival("gpu-1"), arrival("gpu-2", claimed_for="default/other-1"))
    facts = gather(admitted.build(), world(requests=(fulfilled,), nodes=nodes), now=NOW)
    assert facts.placement is None
    assert gang_row(facts, NOW).nodes_cell == "2 arrived"


def test_an_admitted_gang_counts_the_nodes_of_the_request_it_consumes_not_a_later_ask() -> None:
    """A race won by the first ask, a later one (the loser) not withdrawn yet: NODES counts
    the nodes of the request the gang consumes (its podSetUpdates say which), not those of
    the latest ask."""
    won, lost = naming.request_name("wl", CHECK, 1), naming.request_name("wl", CHECK, 1, 1)
    consumes = [
        {
            "name": "workers",
            "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": won},
        }
    ]
    admitted = (
        WorkloadBuilder()
        .pod_set("workers", 2)
        .reserve_quota()
        .check(CHECK, "Ready", pod_set_updates=consumes)
    ).condition("Admitted")
    requests = tuple(
        provisioning_request(
            name,
            templates=[(naming.template_name(name, "workers"), 2)],
            conditions={"Accepted": "", "Provisioned": ""},
        )
        for name in (won, lost)
    )
    nodes = (arrival("gpu-0"), arrival("gpu-1"), arrival("gpu-2", claimed_for=f"default/{lost}"))
    facts = gather(admitted.build(), world(requests=requests, nodes=nodes), now=NOW)
    assert gang_row(facts, NOW).nodes_cell == "2 arrived"


def test_an_admitted_gang_counts_no_node_older_than_its_request_recorded_under_its_name() -> None:
    """Names come again (an attempt Kueue admits again after an eviction has the earlier
    one's name): a node recorded under the request's name but older than the request
    arrived for the earlier one (`fulfillment.is_arrival_of`), and is not counted as given."""
    admitted, fulfilled = admitted_on_fulfilled()
    fulfilled["metadata"]["creationTimestamp"] = LATER
    nodes = (arrival("gpu-0"), arrival("gpu-1", created=EARLIER))
    facts = gather(admitted.build(), world(requests=(fulfilled,), nodes=nodes), now=NOW)
    assert facts.given_nodes == 1
    assert gang_row(facts, NOW).nodes_cell == "1 arrived"


# ---- what a rollback kept, gone since; a request held in deletion --------------------------

KEPT_OUTCOME = Outcome(("n0",), (), {"n1": "runs pod ns/x", "n2": "runs pod ns/y"}, 60)
KEPT_NOW = "kept n1 (runs pod ns/x); kept then, gone since: n2 (runs pod ns/y)"


def report_of(facts: Facts) -> tuple[str, dict[str, Any], str]:
    """The text, the JSON and the verdict's line of the diagnosis on `facts`."""
    found = verdict(facts, NOW)
    report = DiagnoseReport(Target("workload", "default", "wl"), facts, found, NOW)
    return diagnose_text.render_text(report), to_json(report), found.line


def test_a_rejection_quoting_a_rollback_says_the_kept_node_deleted_since_is_gone() -> None:
    """The check Rejected with the rollback's message (written once, kept as long as the
    Workload): n2, kept then because it ran a pod, was deleted since. The verdict, the text
    and the JSON say it gone, not kept; n1, still there, is said kept."""
    written = f"rolled back {REQ} (Deadline: 1 of 2 members placeable); {KEPT_OUTCOME.summary()}"
    wl = WorkloadBuilder().pod_set("workers", 2).check(CHECK, "Rejected", message=written).build()
    wl["spec"]["active"] = False
    facts = gather(wl, world(nodes=(arrival("n1"),)), now=NOW)
    restated = written.replace(KEPT_OUTCOME.summary(), KEPT_OUTCOME.summary(gone={"n2"}))
    assert KEPT_NOW in restated
    text, as_json, line = report_of(facts)
    assert line == (
        f"blocked: the Workload is deactivated (spec.active=false): the check {CHECK} rejected "
        f"it: {restated}"
    )
    assert as_json["checks"][0]["message"] == restated
    assert " ".join(text.split()).count(restated) == 2  # the check's message, the verdict
    assert "kept n2" not in text


def rolling_back(outcome: Outcome, **meta: Any) -> dict[str, Any]:
    """The attempt's request, its rollback recorded and done (the outcome written)."""
    req = our_request()
    req["metadata"]["annotations"].update(
        {
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "Deadline: 1 of 2 members placeable",
            "gangcheck.io/outcome": outcome.to_annotation(),
        }
    )
    req["metadata"].update(meta)
    return req


def test_a_recorded_outcome_says_the_kept_node_deleted_since_is_gone() -> None:
    """The request still there with its outcome (its deletion not done yet): the request's
    outcome, the verdict and the decision replayed say n2 gone; the JSON names it in
    keptGone, its summary the line the text says."""
    nodes = (arrival("n1"),)
    facts = gather(workload(), world(requests=(rolling_back(KEPT_OUTCOME),), nodes=nodes), now=NOW)
    text, as_json, line = report_of(facts)
    outcome = as_json["request"]["outcome"]
    assert (outcome["kept"], outcome["keptGone"]) == (KEPT_OUTCOME.kept, ["n2"])
    assert outcome["summary"] == KEPT_OUTCOME.summary(gone={"n2"})
    assert f"outcome: {outcome['summary']}" in " ".join(text.split())
    assert KEPT_NOW in line
    assert KEPT_NOW in as_json["decision"]["message"]
    assert "kept n2" not in text + json.dumps(as_json)


def test_a_kept_node_still_there_is_said_kept_as_recorded() -> None:
    nodes = (arrival("n1"), arrival("n2"))
    facts = gather(workload(), world(requests=(rolling_back(KEPT_OUTCOME),), nodes=nodes), now=NOW)
    text, as_json, line = report_of(facts)
    assert as_json["request"]["outcome"]["keptGone"] == []
    assert KEPT_OUTCOME.summary() in line
    assert "gone since" not in text + json.dumps(as_json)


OURS_1 = naming.request_name("wl", CHECK, 1)


@pytest.mark.parametrize(
    ("deleted", "said", "stuck"),
    [
        (
            "2026-11-30T10:00:00Z",
            f"waiting for ProvisioningRequest {OURS_1} to be deleted: finalizers "
            "[example.com/keep] remain since 2026-11-30T10:00:00Z",
            True,
        ),
        (
            "2026-11-30T10:04:50Z",
            f"ProvisioningRequest {OURS_1} is being deleted since 2026-11-30T10:04:50Z",
            False,
        ),
    ],
    ids=["past the grace: stuck", "within the grace"],
)
def test_a_request_in_deletion_is_said_alike_in_text_and_json(
    deleted: str, said: str, stuck: bool
) -> None:
    """What the check message says of a request held in deletion (its finalizers, since
    when), said by the request's section of the text and by the JSON's request.deletion,
    as the verdict says it."""
    held = our_request()
    held["metadata"].update(deletionTimestamp=deleted, finalizers=["example.com/keep"])
    facts = gather(workload(), world(requests=(held,)), now=NOW)
    text, as_json, line = report_of(facts)
    assert line == f"blocked: {said}"
    assert as_json["request"]["deletion"] == {
        "since": deleted,
        "finalizers": ["example.com/keep"],
        "stuck": stuck,
        "line": said,
    }
    request_section = text.split("\nrequest", 1)[1].split("\n\n", 1)[0]
    assert said in " ".join(request_section.split())


def test_what_the_text_says_of_an_eviction_and_the_class_asked_the_json_says() -> None:
    """The text's quota section names the eviction (reason, Kueue's message) and its request
    section the class the request asks; the JSON has both."""
    evicted = Condition("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout")
    facts = gang(
        state=replace(QUEUED, evicted=evicted),
        req=request("Accepted", class_name="queued-provisioning.gke.io", source=1),
    )
    text, as_json, _ = report_of(facts)
    assert "evicted (PodsReadyTimeout): Exceeded the PodsReady timeout" in text
    assert as_json["quota"]["evicted"] == {
        "reason": "PodsReadyTimeout",
        "message": "Exceeded the PodsReady timeout",
    }
    assert "asks capacity source #2 (queued-provisioning.gke.io)" in text
    assert (as_json["request"]["className"], as_json["request"]["capacitySource"]) == (
        "queued-provisioning.gke.io",
        1,
    )


# ---- why the check was Retry or Rejected, once Kueue reset it: the Workload's Events ------

ROLLED_BACK_WITH_KEPT = (
    "Retrying after rollback: rolled back wl-atomic-1 (Deadline: 1 of 2 members placeable); "
    "reclaimed 1 node (1.0 node-minutes held); kept n1 (runs pod ns/x), n2 (runs pod ns/y)"
)


def check_updated(old: str, new: str, message: str, at: str, check: str = CHECK) -> dict[str, Any]:
    """gangcheck's Event on the Workload as its check changes state."""
    return {
        "reason": "AdmissionCheckUpdated",
        "message": f"Admission check {check} updated state from {old} to {new} with message: "
        f"{message}",
        "involvedObject": {"kind": "Workload", "uid": "uid-wl"},
        "firstTimestamp": at,
        "lastTimestamp": at,
    }


def reset_by_kueue(previously: str, *, active: bool = True, evicted: str = "") -> dict[str, Any]:
    """The Workload as Kueue leaves it after evicting it for its check's Retry (requeued on
    backoff) or Rejected (deactivated): the check reset to Pending, its message gone."""
    wl = (
        WorkloadBuilder()
        .pod_set("workers", 2)
        .check(CHECK, "Pending", retry_count=1, message=f"{RESET}{previously}")
        .condition("Evicted", reason="AdmissionCheck")
        .build()
    )
    wl["status"]["conditions"][-1]["message"] = evicted
    wl["spec"]["active"] = active
    if active:
        wl["status"]["requeueState"] = {"requeueAt": "2026-11-30T10:06:30Z", "count": 1}
    return wl


EARLIER_RETRY = check_updated("Pending", "Retry", "Retrying after failure: an earlier one", LATER)
THIS_RETRY = check_updated("Pending", "Retry", ROLLED_BACK_WITH_KEPT, "2026-11-30T10:04:00Z")


def test_a_gang_requeued_after_a_retry_says_why_from_the_events() -> None:
    """Kueue resets the Retry to Pending at once: the check's message then says only that.
    The backoff's line says why the attempt ended, as gangcheck's latest Event of the check's
    turn to Retry says it (its kept node n2, deleted since, said gone); text and JSON alike."""
    events = [
        EARLIER_RETRY | {"firstTimestamp": EARLIER, "lastTimestamp": EARLIER},
        THIS_RETRY,
        check_updated("Pending", "Retry", "another check's", "2026-11-30T10:04:30Z", "other"),
        check_updated("Retry", "Pending", "next attempt", EARLIER),
    ]
    facts = gather(reset_by_kueue("Retry"), world(nodes=(arrival("n1"),)), now=NOW, events=events)
    said = ROLLED_BACK_WITH_KEPT.replace(
        "kept n1 (runs pod ns/x), n2", "kept n1 (runs pod ns/x); kept then, gone since: n2"
    )
    text, as_json, line = report_of(facts)
    assert line == (
        f"blocked: backoff after attempt 1: Kueue requeues the Workload in 1m30s; the check "
        f"{CHECK} turned Retry: {said}"
    )
    ended = {"state": "Retry", "message": said, "at": "2026-11-30T10:04:00Z"}
    assert as_json["checkEnded"] == ended
    assert f"Retry at 2026-11-30T10:04:00Z: {said}" in " ".join(text.split())
    # said once, where the check is; the earlier one (naming no request) said earlier
    earlier = "an earlier attempt: Retry at 2026-11-30T09:00:00Z: Retrying after failure: an "
    assert [e["line"] for e in as_json["earlierAttempts"]] == [f"{earlier}earlier one"]


def test_a_gang_running_on_attempt_2_says_attempt_1s_rollback_from_the_events() -> None:
    """Why did the gang take minutes: attempt 1 was rolled back (Kueue reset its Retry, and
    attempt 2 turned the check Ready since, so no state says it any more). The Event of the
    check's turn to Retry is read, in one line: which attempt (the request its message names),
    why, what it reclaimed and kept (n2, kept then, deleted since, said gone); text and JSON
    alike. The turn to Ready is no attempt's end."""
    admitted = (
        WorkloadBuilder().pod_set("workers", 2).reserve_quota().check(CHECK, "Ready", retry_count=1)
    ).condition("Admitted")
    _, fulfilled = admitted_on_fulfilled()
    events = [THIS_RETRY, check_updated("Pending", "Ready", "fits", "2026-11-30T10:04:50Z")]
    facts = gather(
        admitted.build(),
        world(requests=(fulfilled,), nodes=(arrival("n1"),)),
        now=NOW,
        events=events,
    )
    said = ROLLED_BACK_WITH_KEPT.replace(
        "kept n1 (runs pod ns/x), n2", "kept n1 (runs pod ns/x); kept then, gone since: n2"
    )
    at = datetime(2026, 11, 30, 10, 4, tzinfo=UTC)
    assert earlier_attempts(facts) == (Ended("Retry", said, at, 1),)
    text, as_json, _ = report_of(facts)
    line = f"attempt 1: Retry at 2026-11-30T10:04:00Z: {said}"
    assert as_json["earlierAttempts"] == [
        {
            "attempt": 1,
            "state": "Retry",
            "message": said,
            "at": "2026-11-30T10:04:00Z",
            "line": line,
        }
    ]
    assert f"earlier {line}" in " ".join(text.split())


def test_without_the_events_no_earlier_attempt_is_said() -> None:
    """Events expire (about an hour): with none left, nothing is said of attempt 1, not
    guessed from the check's retry count."""
    admitted = (
        WorkloadBuilder().pod_set("workers", 2).reserve_quota().check(CHECK, "Ready", retry_count=1)
    ).condition("Admitted")
    _, fulfilled = admitted_on_fulfilled()
    facts = gather(admitted.build(), world(requests=(fulfilled,)), now=NOW, events=[])
    text, as_json, _ = report_of(facts)
    assert earlier_attempts(facts) == ()
    assert as_json["earlierAttempts"] == []
    assert "earlier" not in text


def test_a_gang_deactivated_after_a_rejection_says_why_from_the_events() -> None:
    """Kueue deactivates the Workload, its Evicted message naming the check; the check reset
    to Pending. The line adds what the check said as it turned Rejected."""
    rejected = "provisioning ended by rollback ...; backoffLimitCount 1 allows no more retries"
    events = [THIS_RETRY, check_updated("Pending", "Rejected", rejected, "2026-11-30T10:04:40Z")]
    kueue = f"The workload is deactivated due to Admission check(s): [{CHECK}], were rejected"
    wl = reset_by_kueue("Rejected", active=False, evicted=kueue)
    facts = gather(wl, world(), now=NOW, events=events)
    _, as_json, line = report_of(facts)
    assert line == (
        f"blocked: the Workload is deactivated (spec.active=false): {kueue}; the check {CHECK} "
        f"turned Rejected: {rejected}"
    )
    assert as_json["checkEnded"]["state"] == "Rejected"


@pytest.mark.parametrize(
    ("previously", "events"),
    [("Retry", []), ("Ready", [THIS_RETRY])],
    ids=["no Event left (expired)", "reset from Ready: an eviction, not the check's Retry"],
)
def test_without_the_event_of_the_reset_state_the_backoff_says_what_it_knows(
    previously: str, events: list[dict[str, Any]]
) -> None:
    facts = gather(reset_by_kueue(previously), world(), now=NOW, events=events)
    _, as_json, line = report_of(facts)
    assert line == "blocked: backoff after attempt 1: Kueue requeues the Workload in 1m30s"
    assert as_json["checkEnded"] is None


@pytest.mark.parametrize(
    ("old", "new", "message", "read"),
    [
        ("Pending", "Retry", "failed: a to b", ("Retry", "failed: a to b")),
        ("Pending", "Rejected", "", ("Rejected", "")),
        ("Pending", "Ready", "fits", None),
        ("Retry", "Pending", "next", None),
    ],
)  # fmt: skip
def test_the_check_updated_event_reads_back_as_written(
    old: str, new: str, message: str, read: tuple[str, str] | None
) -> None:
    text = check_updated_text(CHECK, old, new, message)
    assert check_ended(text, CHECK) == read
    assert check_ended(text, "other") is None


def test_a_status_row_in_kueues_requeue_backoff_is_in_phase_backoff() -> None:
    """As a PodGroup backing off: PHASE backoff while Kueue's requeue is not due (the
    verdict says when), queued once it is (the gang waits for quota)."""
    facts = gather(reset_by_kueue("Retry"), world(), now=NOW)
    assert gang_row(facts, NOW).phase == "backoff"
    later = NOW + timedelta(minutes=2)
    assert gang_row(facts, later).phase == "queued"
    assert gang_row(facts, later).verdict.startswith("blocked: quota: ")


def test_an_elastic_job_scaled_down_in_place_is_counted_as_the_watchdog_counts_it() -> None:
    """An admitted gang of 2 scaled down to 1 in place (Kueue v0.17 lowers the spec's count;
    the admission's stays): the start line counts the 1 member the Job has, as the start
    watchdog does (admission.start_total), not the 2 its request asked for."""
    admitted, fulfilled = admitted_on_fulfilled()
    admitted.obj["spec"]["podSets"][0]["count"] = 1
    facts = gather(admitted.build(), world(requests=(fulfilled,)), now=NOW)
    assert facts.start is not None
    assert (facts.start.scheduled, facts.start.total) == (0, 1)
