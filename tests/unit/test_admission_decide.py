"""Table tests of the admission check's decision, one narrative case each."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.attempt import lifecycle, naming
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    ClaimNode,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    ReclaimArrivals,
    ReleaseHold,
)
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.logic.timefmt import parse_time
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.logic.workloads.snapshot import snapshot_of
from gangcheck.model.objects import Flavor, request_of, workload_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import (
    CHECK,
    T0,
    WorkloadBuilder,
    admission_check,
    node,
    pod_template,
    provisioning_request,
)

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
TRUST = {"fulfillment": {"mode": "TrustProvisioned"}}
GPU_FLAVOR = {"gpu": Flavor("gpu", {"pool": "gpu"}, ({"key": "gpu", "operator": "Exists"},))}
REQ1 = "wl-atomic-1"
FULFILLED = {"gangcheck.io/phase": "Fulfilled"}
LATER = datetime(2026, 11, 30, 10, 20, tzinfo=UTC)  # past the default 420 s deadline
ROLLING = {"gangcheck.io/phase": "RollingBack", "gangcheck.io/rollback-reason": "Failed: broke"}
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 600, "reclaimed": ["n1", "n2"]}'
DEADLINE_KEY = "gangcheck.io/fulfillment-deadline"
DEADLINE = {DEADLINE_KEY: "2026-11-30T10:07:00Z"}
MINE = {"gangcheck.io/arrived-for": f"default/{REQ1}"}
#: The config an attempt recorded when it was made: a fit-mode config reclaiming by DeleteNode.
MADE_UNDER = {"gangcheck.io/attempt-config": '{"fulfillment":{"reclaimer":"DeleteNode"}}'}
OLDER_GPU = Waiting("default/older-1", (pod_template(gpu=1, node_selector={"pool": "gpu"}),))


def inactive(builder: WorkloadBuilder) -> WorkloadBuilder:
    builder.obj["spec"]["active"] = False
    return builder


def unassigned(builder: WorkloadBuilder, pod_set: str) -> WorkloadBuilder:
    """Quota reserved, but the admission lacks the assignment of `pod_set`."""
    builder.reserve_quota().check()
    admission = builder.obj["status"]["admission"]
    admission["podSetAssignments"] = [
        a for a in admission["podSetAssignments"] if a["name"] != pod_set
    ]
    return builder


def without_assignments(builder: WorkloadBuilder) -> WorkloadBuilder:
    """Quota reserved, but the admission assigns no pod set at all."""
    builder.reserve_quota().check()
    builder.obj["status"]["admission"]["podSetAssignments"] = []
    return builder


def lost_quota() -> WorkloadBuilder:
    """Quota reserved once, then taken back without eviction (Kueue: the LocalQueue gone)."""
    builder = WorkloadBuilder().pod_set("workers", 4).check()
    builder.condition("QuotaReserved", "False", "Inadmissible")
    conds = builder.obj["status"]["conditions"]
    conds[-1]["message"] = "LocalQueue lq is terminating or missing"
    return builder


def gang(count: int = 4) -> WorkloadBuilder:
    return WorkloadBuilder().pod_set("workers", count).reserve_quota().check()


def req(name: str = REQ1, *, conditions: dict[str, str] | None = None, **kw: Any) -> Any:
    """A request as gangcheck makes one: its deadline recorded (created at T0 + 420 s)."""
    templates = kw.pop("templates", [(naming.template_name(name, "workers"), 4)])
    annotations = {**DEADLINE, **kw.pop("annotations", {})}
    return provisioning_request(
        name, conditions=conditions, templates=templates, annotations=annotations, **kw
    )


def member(
    name: str, *, bound: bool, namespace: str = "default", phase: str = "Running"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": REQ1},
        },
        "spec": {"nodeName": "n1" if bound else ""},
        "status": {"phase": phase if bound else "Pending"},
    }


def intruder(node_name: str, *, gpu: int) -> dict[str, Any]:
    """A pod of someone else that tolerates every taint, bound to the node."""
    return {
        "metadata": {"name": "intruder", "namespace": "other"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpu)}}}],
            "tolerations": [{"operator": "Exists"}],
        },
        "status": {"phase": "Running"},
    }


#: Requests in flight: this gang's and another's, other-1.
WITH_OTHER = frozenset({"default/other-1", f"default/{REQ1}"})


def other_arrival(**kw: Any) -> dict[str, Any]:
    """A node of the pool recorded as arrived for the other request in flight, other-1."""
    return node(
        "n1",
        gpu=8,
        labels={"pool": "gpu"},
        annotations={"gangcheck.io/arrived-for": "default/other-1"},
        **kw,
    )


def member_of_another(node_name: str, *, gpu: int) -> dict[str, Any]:
    """A member of another gang (it consumes request other-1), bound to the node."""
    pod = intruder(node_name, gpu=gpu)
    pod["metadata"] = {
        "name": "other-member",
        "namespace": "default",
        "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": "other-1"},
    }
    del pod["spec"]["tolerations"]
    return pod


def daemon(node_name: str) -> dict[str, Any]:
    """A DaemonSet's pod on the node: never a stray."""
    pod = intruder(node_name, gpu=0)
    pod["metadata"] = {
        "name": "agent",
        "namespace": "kube-system",
        "ownerReferences": [{"kind": "DaemonSet", "name": "agent", "controller": True}],
    }
    return pod


@dataclass
class Case:
    id: str
    workload: WorkloadBuilder
    config: dict[str, Any] | None = field(default_factory=lambda: dict(TRUST))
    requests: list[Any] = field(default_factory=list)
    templates: frozenset[str] | None = None  # None: those of the requests
    """PodTemplates that exist, by owner uids; None: each request's own, owned by it too."""
    nodes: list[Any] = field(default_factory=list)
    in_flight: frozenset[str] = frozenset()
    started: frozenset[str] = frozenset()
    """Requests of `in_flight` marked Started."""
    waiting: tuple[Waiting, ...] = ()
    competing: tuple[str, ...] = ()
    # expectations
    state: str | None = None  # None: no check write
    message: str = ""
    requeue_after_seconds: int | None = None
    creates: int = 0  # CreateTemplate count, when a request is created
    created_request: bool = False
    deletes: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    consume_pod_sets: tuple[str, ...] = ()
    pods: list[Any] = field(default_factory=list)
    now: datetime = NOW
    annotates: tuple[dict[str, str], ...] = ()
    reclaims: tuple[str, ...] | None = None
    reclaimer: str | None = None
    nodes_current: bool = True
    events: tuple[str, ...] = ()
    """Reasons of the Events emitted besides the check's own (AdmissionCheckUpdated)."""


def half_taken(id_: str, pod: dict[str, Any], **kw: Any) -> Case:
    """A fit-mode gang of 4 whose request was Provisioned, one node of 4 GPUs arrived for it,
    and `pod` bound there."""
    return Case(
        id_,
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=DEADLINE)],
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}, annotations=MINE)],
        pods=[pod],
        **kw,
    )


def stray_rollback(named: str) -> tuple[dict[str, str], ...]:
    """The rollback begun because pods not of the gang took its arrival (`named`)."""
    return (
        {
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "StrayPods: pods not of this gang took nodes "
            f"that arrived for it: {named}",
            "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:00:00Z"}',
        },
    )


def templates_of(case: Case) -> frozenset[str]:
    if case.templates is not None:
        return case.templates
    return frozenset(
        p["podTemplateRef"]["name"] for r in case.requests for p in r["spec"]["podSets"]
    )


def run(case: Case) -> Decision:
    wl = workload_of(case.workload.build())
    snap = Snapshot(
        workload=wl,
        check=CHECK,
        config=parse_spec(case.config) if case.config is not None else None,
        config_problem="AtomicProvisioningConfig 'gpu' not found",
        flavors=GPU_FLAVOR,
        requests=tuple(request_of(r) for r in case.requests),
        templates=templates_of(case),
        capacity=ClusterView(
            nodes=tuple(case.nodes),
            pods=tuple(case.pods),
            in_flight=case.in_flight | frozenset(w.key for w in case.waiting),
            started=case.started.__contains__,
            waiting=case.waiting,
            nodes_current=case.nodes_current,
        ),
        competing=case.competing,
    )
    return decide(snap, case.now)


CASES = [
    Case(
        "quota lost outside eviction before the deadline: no write, the request is kept (as Kueue)",
        WorkloadBuilder().pod_set("workers", 4).check(),
        requests=[req()],
    ),
    Case(
        "quota lost outside eviction past the deadline: the attempt is withdrawn, what arrived "
        "reclaimed, and the check says so",
        lost_quota(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        now=LATER,
        state="Pending",
        message="Workload quota lost (Inadmissible: LocalQueue lq is terminating or missing) "
        f"past the attempt's deadline: provisioning request {REQ1} withdrawn, the 1 node(s) "
        "that arrived for it reclaimed safely; asked for again once Kueue reserves quota",
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "quota lost (Inadmissible: LocalQueue lq is "
                "terminating or missing) past the attempt's deadline",
                "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:02:00Z"}',
            },
        ),
        reclaims=("n1",),
        deletes=(REQ1,),
        events=("ReclaimingArrivals", "ProvisioningRequestDeleted"),
    ),
    Case(
        "quota lost outside eviction mid-rollback: the rollback goes on, the request withdrawn",
        lost_quota(),
        config={},
        requests=[req(annotations=ROLLING)],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        state="Pending",
        message=f"Workload quota lost (Inadmissible: LocalQueue lq is terminating or missing) "
        f"past the attempt's deadline: provisioning request {REQ1} withdrawn, the 1 node(s)",
        reclaims=("n1",),
        deletes=(REQ1,),
    ),
    Case(
        "quota lost outside eviction with the check Ready: the attempt is kept",
        WorkloadBuilder().pod_set("workers", 4).check(state="Ready"),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=FULFILLED)],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        now=LATER,
    ),
    Case(
        "quota reserved and pending: templates first, then one request",
        gang(),
        state="Pending",
        message=f"provisioning request {REQ1} created for 4 pods",
        creates=1,
        created_request=True,
    ),
    Case(
        "two pod sets, one request carrying both",
        WorkloadBuilder()
        .pod_set("driver", 1, pod_template(cpu="2"))
        .pod_set("workers", 8)
        .reserve_quota()
        .check(),
        state="Pending",
        creates=2,
        created_request=True,
        message=f"provisioning request {REQ1} created for 9 pods",
    ),
    Case(
        "partial admission: counts come from the admitted assignment",
        WorkloadBuilder().pod_set("workers", 8).reserve_quota(counts={"workers": 6}).check(),
        state="Pending",
        creates=1,
        created_request=True,
        message=f"provisioning request {REQ1} created for 6 pods",
    ),
    Case(
        "config missing: check pending and says why",
        gang(),
        config=None,
        state="Pending",
        message="the check is not active: AtomicProvisioningConfig 'gpu' not found; "
        "no provisioning request is made",
    ),
    Case(
        # Kueue deletes it; nothing provisioned is lost here (docs/kueue-differences.md)
        "config missing with a request in flight that recorded no config: the request is kept",
        gang(),
        config=None,
        requests=[req(conditions={"Accepted": ""})],
        state="Pending",
        message="the check is not active: AtomicProvisioningConfig 'gpu' not found; no "
        f"provisioning request is made (provisioning request {REQ1} is kept as it is",
    ),
    Case(
        "config missing: the attempt in flight goes on under the config it recorded",
        gang(),
        config=None,
        requests=[req(conditions={"Provisioned": ""}, annotations={**DEADLINE, **MADE_UNDER})],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        state="Pending",
        message="capacity requested, not yet usable",
    ),
    Case(
        "config missing: past its deadline the attempt rolls back under the config it recorded",
        gang(),
        config=None,
        now=LATER,
        requests=[req(conditions={"Provisioned": ""}, annotations={**DEADLINE, **MADE_UNDER})],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "Deadline: the gang did not fit within 420s "
                "(0 of 4 members placeable; no node could take a member even empty: node "
                "selector mismatch (needs pool=gpu))",
                "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:02:00Z"}',
            },
        ),
    ),
    Case(
        "config missing: a rollback under way reclaims with the reclaimer the attempt recorded",
        gang(),
        config=None,
        requests=[
            req(
                conditions={"Provisioned": ""},
                annotations={
                    **MADE_UNDER,
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "Deadline: x",
                    "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:02:00Z"}',
                },
            )
        ],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        reclaims=("n1",),
        reclaimer="DeleteNode",
    ),
    Case(
        "config missing: an admitted gang's check stays Ready and its request is kept",
        WorkloadBuilder()
        .pod_set("workers", 4)
        .reserve_quota()
        .condition("Admitted")
        .check(state="Ready"),
        config=None,
        requests=[req(conditions={"Provisioned": ""}, annotations={**FULFILLED})],
        pods=[member("p0", bound=True)],
    ),
    Case(
        "config missing: an admitted gang whose request recorded its config keeps its watchdog",
        WorkloadBuilder()
        .pod_set("workers", 4)
        .reserve_quota()
        .condition("Admitted")
        .check(state="Ready"),
        config=None,
        requests=[req(conditions={"Provisioned": ""}, annotations={**FULFILLED, **MADE_UNDER})],
        pods=[member(f"p{i}", bound=True) for i in range(4)],
        annotates=({"gangcheck.io/phase": "Started"},),
    ),
    Case(
        "managedResources leaves no pod set: ready, no request needed",
        gang(),
        config={**TRUST, "managedResources": ["example.com/fpga"]},
        state="Ready",
        message="the provisioning request is not needed",
    ),
    Case(
        "managedResources edited to exclude every pod set: the request in flight is deleted",
        gang(),
        config={**TRUST, "managedResources": ["example.com/fpga"]},
        requests=[req(conditions={"Accepted": ""})],
        state="Ready",
        deletes=(REQ1,),
        message="the provisioning request is not needed",
    ),
    Case(
        "all counts admitted as zero: the request in flight is deleted",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota(counts={"workers": 0}).check(),
        requests=[req()],
        state="Ready",
        deletes=(REQ1,),
        message="the provisioning request is not needed",
    ),
    Case(
        "the check removed from the Workload: its request is deleted",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota(),
        requests=[req(conditions={"Accepted": ""})],
        deletes=(REQ1,),
    ),
    Case(
        "another provisioning check on the Workload: said so, no request made, job kept",
        gang(),
        competing=("atomic-b",),
        state="Pending",
        message="the Workload also lists admission check atomic-b, which provisions capacity"
        " too; a pod can consume only one ProvisioningRequest",
    ),
    Case(
        "inconsistent admission: reported, no request made from spec counts",
        unassigned(WorkloadBuilder().pod_set("driver", 1).pod_set("workers", 4), "workers"),
        state="Pending",
        message="the admission is inconsistent: no podSetAssignment for pod set workers",
    ),
    Case(
        "an admission with no assignment at all: reported, no request made from spec counts",
        without_assignments(WorkloadBuilder().pod_set("driver", 1).pod_set("workers", 4)),
        state="Pending",
        message="the admission is inconsistent: no podSetAssignment for pod set driver, workers",
    ),
    Case(
        "request not yet accepted: pending, nothing new created",
        gang(),
        requests=[req()],
        state="Pending",
        message=f"waiting for provisioning request {REQ1} to be accepted",
    ),
    Case(
        "accepted with an ETA: the ETA is the message",
        gang(),
        requests=[req(conditions={"Accepted": "ok"})],
        state="Pending",
        message=f"provisioning request {REQ1} accepted",
    ),
    Case(
        "failed attempt under the limit retries after the base backoff",
        gang(),
        requests=[req(conditions={"Failed": "CapacityIsNotFound"})],
        state="Retry",
        message="Retrying after failure: CapacityIsNotFound",
        requeue_after_seconds=60,
    ),
    Case(
        "second failure backs off twice as long",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(retry_count=1),
        requests=[req("wl-atomic-2", conditions={"Failed": "no capacity"})],
        state="Retry",
        requeue_after_seconds=120,
        message="Retrying after failure: no capacity",
    ),
    Case(
        "failure past the backoff limit rejects",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(retry_count=3),
        requests=[req("wl-atomic-4", conditions={"Failed": "no capacity"})],
        state="Rejected",
        message="no capacity",
    ),
    Case(
        "booking expired before admission retries",
        gang(),
        requests=[req(conditions={"BookingExpired": "booking ran out"})],
        state="Retry",
        message="Retrying after booking expired: booking ran out",
        requeue_after_seconds=60,
    ),
    Case(
        "booking expired after admission changes nothing",
        WorkloadBuilder()
        .pod_set("workers", 4)
        .reserve_quota()
        .condition("Admitted")
        .check(state="Ready"),
        requests=[req(conditions={"Provisioned": "", "BookingExpired": "x"})],
    ),
    Case(
        "capacity revoked while pending rejects",
        gang(),
        requests=[req(conditions={"CapacityRevoked": "revoked by cloud"})],
        state="Rejected",
        message="revoked by cloud",
    ),
    Case(
        "capacity revoked on a deactivated Workload not yet evicted: not rejected (as Kueue)",
        inactive(gang()),
        requests=[req(conditions={"CapacityRevoked": "revoked by cloud"})],
        state="Pending",
        message="revoked by cloud; the Workload is deactivated, so the check is not rejected",
    ),
    Case(
        "failure past the limit with no message says so, never 'Retrying'",
        gang(),
        config={**TRUST, "retryStrategy": {"backoffLimitCount": 0}},
        requests=[req(conditions={"Failed": ""})],
        state="Rejected",
        message="provisioning ended by failure, with no message from the autoscaler, "
        "on attempt 1; backoffLimitCount 0 allows no more retries",
    ),
    Case(
        "ready, not yet admitted, booking expired: Retry (as Kueue)",
        gang().check(state="Ready"),
        requests=[req(conditions={"Provisioned": "", "BookingExpired": "over"})],
        state="Retry",
        requeue_after_seconds=60,
        message="Retrying after booking expired: over",
    ),
    Case(
        "ready, not yet admitted, request failed: Retry (as Kueue)",
        gang().check(state="Ready"),
        requests=[req(conditions={"Provisioned": "", "Failed": "broke"})],
        state="Retry",
        requeue_after_seconds=60,
        message="Retrying after failure: broke",
    ),
    Case(
        "fit mode, ready, not yet admitted, booking expired: the attempt rolls back",
        gang().check(state="Ready"),
        config={},
        requests=[
            req(conditions={"Provisioned": "", "BookingExpired": "over"}, annotations=FULFILLED)
        ],
        nodes=[node("n1", annotations=MINE)],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "BookingExpired: over",
                "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:00:00Z"}',
            },
        ),
    ),
    Case(
        "made in fit mode, TrustProvisioned now, ready, not yet admitted, booking expired: the "
        "attempt rolls back as it was made, what arrived for it reclaimed",
        gang().check(state="Ready"),
        config=dict(TRUST),
        requests=[
            req(
                conditions={"Provisioned": "", "BookingExpired": "over"},
                annotations={**FULFILLED, **MADE_UNDER},
            )
        ],
        nodes=[node("n1", annotations=MINE)],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "BookingExpired: over",
                "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:00:00Z"}',
            },
        ),
    ),
    Case(
        "capacity revoked after ready rejects",
        WorkloadBuilder()
        .pod_set("workers", 4)
        .reserve_quota()
        .condition("Admitted")
        .check(state="Ready"),
        requests=[req(conditions={"Provisioned": "", "CapacityRevoked": "gone"})],
        state="Rejected",
        message="gone",
    ),
    Case(
        "failed outranks provisioned",
        gang(),
        requests=[req(conditions={"Provisioned": "", "Failed": "broke"})],
        state="Retry",
        requeue_after_seconds=60,
        message="Retrying after failure: broke",
    ),
    Case(
        "trusting Provisioned: ready with consume and class annotations",
        gang(),
        requests=[req(conditions={"Provisioned": "resize done"})],
        state="Ready",
        message="resize done",
        consume_pod_sets=("workers",),
        annotates=(FULFILLED,),
    ),
    Case(
        "merged pod sets each get the consume annotation",
        WorkloadBuilder().pod_set("a", 2).pod_set("b", 2).reserve_quota().check(),
        config={**TRUST, "podSetMergePolicy": "IdenticalPodTemplates"},
        requests=[
            req(conditions={"Provisioned": ""}, templates=[(naming.template_name(REQ1, "a"), 4)])
        ],
        state="Ready",
        consume_pod_sets=("a", "b"),
        message="capacity provisioned",
        annotates=(FULFILLED,),
    ),
    Case(
        "fit mode, provisioned but no node exists: pending with progress",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        state="Pending",
        message="capacity requested, not yet usable: 0 of 4 members placeable",
    ),
    Case(
        "fit mode, new nodes fit the gang: ready, and the nodes are claimed",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[
            node("n1", gpu=2, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
            node("n2", gpu=2, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
        state="Ready",
        claims=("n1", "n2"),
        consume_pod_sets=("workers",),
        message="the whole gang fits on nodes that exist",
        annotates=(FULFILLED,),
    ),
    Case(
        "fit mode, only as many new nodes as the gang needs are claimed",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[
            node(f"n{i}", gpu=2, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z")
            for i in (1, 2, 3)
        ],
        state="Ready",
        claims=("n1", "n2"),
        consume_pod_sets=("workers",),
        message="the whole gang fits on nodes that exist",
        annotates=(FULFILLED,),
    ),
    Case(
        "fit mode, a younger request leaves new nodes to the older one waiting",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", gpu=8, labels={"pool": "gpu"}, created="2026-11-30T10:04:55Z")],
        waiting=(OLDER_GPU, Waiting(f"default/{REQ1}")),
        state="Pending",
        message="capacity requested, not yet usable: 0 of 4 members placeable",
    ),
    Case(
        "fit mode, an older request of another node group does not hold back a new node",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", gpu=8, labels={"pool": "gpu"}, created="2026-11-30T10:04:55Z")],
        waiting=(
            Waiting("default/older-1", (pod_template(gpu=1, node_selector={"pool": "cpu"}),)),
            Waiting(f"default/{REQ1}"),
        ),
        state="Ready",
        claims=("n1",),
        consume_pod_sets=("workers",),
        message="the whole gang fits",
        annotates=(FULFILLED,),
    ),
    Case(
        "fit mode, after the grace period any waiting request may claim a new node",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", gpu=8, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z")],
        waiting=(OLDER_GPU, Waiting(f"default/{REQ1}")),
        state="Ready",
        claims=("n1",),
        consume_pod_sets=("workers",),
        message="the whole gang fits",
        annotates=(FULFILLED,),
    ),
    Case(
        "fit mode, a node another in-flight request claimed is not counted",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[other_arrival()],
        in_flight=WITH_OTHER,
        state="Pending",
        message="capacity requested, not yet usable: 0 of 4 members placeable",
    ),
    Case(
        "fit mode, a node another in-flight request claimed counts once that request's gang "
        "started: what its members leave is free",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[other_arrival()],
        in_flight=WITH_OTHER,
        started=frozenset({"default/other-1"}),
        state="Ready",
        consume_pod_sets=("workers",),
        message="the whole gang fits",
        annotates=(FULFILLED,),
    ),
    Case(
        "fit mode, a node of a started gang still held for it (the hold not lifted yet) is "
        "not counted",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[other_arrival(taints=[hold_taint("default/other-1")])],
        in_flight=WITH_OTHER,
        started=frozenset({"default/other-1"}),
        state="Pending",
        message="capacity requested, not yet usable: 0 of 4 members placeable",
    ),
    Case(
        "fit mode, a node outside the flavor's pool does not count",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", gpu=8, created="2026-11-30T10:01:00Z")],
        state="Pending",
        message="capacity requested, not yet usable: 0 of 4 members placeable",
    ),
    Case(
        "evicted workload never gets Retry; its requests are deleted",
        gang().condition("Evicted"),
        requests=[req(conditions={"Failed": "x"})],
        deletes=(REQ1,),
    ),
    Case(
        "evicted mid-provisioning with arrivals: they are reclaimed, and the check says so",
        gang().condition("Evicted"),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[node("n1", gpu=8, annotations=MINE, created="2026-11-30T10:02:00Z")],
        state="Pending",
        message=f"Workload evicted: provisioning request {REQ1} withdrawn; the 1 node(s) that "
        "arrived for it are reclaimed safely",
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "Workload evicted",
                "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:02:00Z"}',
            },
        ),
        reclaims=("n1",),
        deletes=(REQ1,),
        events=("ReclaimingArrivals",),
    ),
    Case(
        "finished workload: requests deleted",
        gang().condition("Finished"),
        requests=[req()],
        deletes=(REQ1,),
    ),
    Case(
        "check in Retry waits for Kueue",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(state="Retry"),
        requests=[req(conditions={"Failed": "x"})],
    ),
    Case(
        "a template left by an interrupted reconcile is reused, not created again",
        gang(),
        templates=frozenset({naming.template_name(REQ1, "workers")}),
        state="Pending",
        created_request=True,
        creates=0,
        message=f"provisioning request {REQ1} created for 4 pods",
    ),
    Case(
        "a request in flight whose templates exist: nothing is written but the check",
        gang(),
        requests=[req()],
        state="Pending",
        message=f"waiting for provisioning request {REQ1} to be accepted",
    ),
    Case(
        "a template lost while its request is in flight is recreated",
        gang(),
        requests=[req()],
        templates=frozenset(),
        creates=1,
        state="Pending",
        message=f"waiting for provisioning request {REQ1} to be accepted",
    ),
    Case(
        "config class changed before provisioning: Retry, the next attempt uses the new class",
        gang(),
        config={**TRUST, "provisioningClassName": "check-capacity.autoscaling.x-k8s.io"},
        requests=[req(conditions={"Accepted": ""})],
        state="Retry",
        requeue_after_seconds=60,
        message="Retrying after config change: class 'best-effort-atomic-scale-up."
        "autoscaling.x-k8s.io' -> 'check-capacity.autoscaling.x-k8s.io'",
    ),
    Case(
        "fit mode, config parameters changed before provisioning: the attempt rolls back",
        gang(),
        config={"parameters": {"a": "2"}},
        requests=[req(conditions={"Accepted": ""})],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "ConfigChanged: the request parameters changed",
                "gangcheck.io/rollback-nodes": "{}",
            },
        ),
    ),
    Case(
        "a config-change rollback past the retry limit still retries (it is no failure)",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(retry_count=3),
        config={},
        requests=[
            req(
                "wl-atomic-4",
                conditions={"Accepted": ""},
                annotations={
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "ConfigChanged: x",
                    "gangcheck.io/outcome": OUTCOME,
                },
            )
        ],
        state="Retry",
        requeue_after_seconds=480,
        message="Retrying after config change: rolled back wl-atomic-4 (ConfigChanged: x)",
    ),
    Case(
        "config class changed after provisioning: the request is kept",
        gang(),
        config={**TRUST, "provisioningClassName": "check-capacity.autoscaling.x-k8s.io"},
        requests=[req(conditions={"Provisioned": ""})],
        state="Ready",
        consume_pod_sets=("workers",),
        message="capacity provisioned",
        annotates=(FULFILLED,),
    ),
    Case(
        "a new attempt deletes the old request and creates its own",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(retry_count=1),
        requests=[req(conditions={"Failed": "x"})],
        deletes=(REQ1,),
        creates=1,
        created_request=True,
        state="Pending",
        message="provisioning request wl-atomic-2 created for 4 pods",
    ),
]


def admitted(retry_count: int = 0) -> WorkloadBuilder:
    return (
        WorkloadBuilder()
        .pod_set("workers", 4)
        .reserve_quota()
        .condition("Admitted")
        .check(state="Ready", retry_count=retry_count)
    )


CASES += [
    Case(
        "fit mode: a failed request starts a rollback, recorded on the request first",
        gang(),
        config={},
        requests=[req(conditions={"Failed": "broke"})],
        nodes=[node("n1", annotations=MINE)],
        annotates=({**ROLLING, "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:00:00Z"}'},),
    ),
    Case(
        "fit mode: before the deadline a provisioned gang that does not fit waits",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=DEADLINE)],
        state="Pending",
        message="capacity requested, not yet usable",
    ),
    Case(
        "fit mode: past the deadline a gang that does not fit rolls back",
        gang(),
        config={},
        now=LATER,
        requests=[req(conditions={"Provisioned": ""}, annotations=DEADLINE)],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "Deadline: the gang did not fit within 420s"
                " (0 of 4 members placeable; no nodes)",
                "gangcheck.io/rollback-nodes": "{}",
            },
        ),
    ),
    Case(
        "fit mode: past the deadline a gang that fits but was never provisioned rolls back, "
        "saying so",
        gang(),
        config={},
        now=LATER,
        requests=[req(conditions={"Accepted": ""}, annotations=DEADLINE)],
        nodes=[node("n1", gpu=8, labels={"pool": "gpu"})],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": f"Deadline: {REQ1} was not provisioned within "
                "420s, though the gang fits on nodes that exist (4 of 4 members placeable on "
                "1 node)",
                "gangcheck.io/rollback-nodes": "{}",
            },
        ),
    ),
    Case(
        "fit mode: a deadlineSeconds change moves the deadline of the attempt in flight",
        gang(),
        config={"fulfillment": {"deadlineSeconds": 900}},
        requests=[req(conditions={"Accepted": ""}, annotations=DEADLINE)],
        annotates=({"gangcheck.io/fulfillment-deadline": "2026-11-30T10:15:00Z"},),
        state="Pending",
        message=f"provisioning request {REQ1} accepted",
    ),
    Case(
        "fit mode: a shorter deadlineSeconds applies at once and rolls the attempt back",
        gang(),
        config={"fulfillment": {"deadlineSeconds": 60}},
        requests=[req(conditions={"Accepted": ""}, annotations=DEADLINE)],
        annotates=(
            {"gangcheck.io/fulfillment-deadline": "2026-11-30T10:01:00Z"},
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "Deadline: the gang did not fit within 60s"
                " (0 of 4 members placeable; no nodes)",
                "gangcheck.io/rollback-nodes": "{}",
            },
        ),
    ),
    Case(
        "fit mode: past the deadline a gang that fits is still made ready",
        gang(),
        config={},
        now=LATER,
        requests=[req(conditions={"Provisioned": ""}, annotations=DEADLINE)],
        nodes=[node("n1", gpu=4, labels={"pool": "gpu"}, annotations=MINE)],
        state="Ready",
        consume_pod_sets=("workers",),
        message="the whole gang fits",
        annotates=(FULFILLED,),
    ),
    half_taken(
        "a pod not of the gang took a node that arrived for it, and the gang would fit but "
        "for it: rolled back at once, not at the deadline",
        intruder("n1", gpu=2),
        annotates=stray_rollback("other/intruder on n1"),
    ),
    half_taken(
        "a member of another gang not started yet took a node that arrived for it, and the "
        "gang would fit but for it: not rolled back, it looks again soon (what that gang "
        "leaves counts once it starts)",
        member_of_another("n1", gpu=2),
        in_flight=WITH_OTHER,
        state="Pending",
        message="capacity requested, not yet usable: 2 of 4 members placeable on 1 node; the "
        "nodes in use have no room for the rest; pods not of this gang took nodes that arrived "
        "for it: default/other-member on n1 (members of gangs starting: what those leave "
        "counts once started)",
    ),
    half_taken(
        "a member of another gang already started took a node that arrived for it, and the "
        "gang would fit but for it: rolled back at once, as for any pod",
        member_of_another("n1", gpu=2),
        in_flight=WITH_OTHER,
        started=frozenset({"default/other-1"}),
        annotates=stray_rollback("default/other-member on n1"),
    ),
    Case(
        "a pod not of the gang on a node that arrived for it, more capacity still to come: "
        "named in the message at once",
        gang(),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=DEADLINE)],
        nodes=[node("n1", gpu=2, labels={"pool": "gpu"}, annotations=MINE)],
        pods=[intruder("n1", gpu=1), daemon("n1")],
        state="Pending",
        message="capacity requested, not yet usable: 1 of 4 members placeable on 1 node; the "
        "nodes in use have no room for the rest; pods not of this gang took nodes that arrived "
        "for it: other/intruder on n1",
    ),
    Case(
        "rollback under way: only the nodes that arrived for this request are reclaimed",
        gang(),
        config={},
        requests=[req(conditions={"Failed": "broke"}, annotations=ROLLING)],
        nodes=[
            node("n1", annotations=MINE),
            node("n2", annotations=MINE),
            node("n3", annotations={"gangcheck.io/arrived-for": "default/other-1"}),
            node("n4"),
        ],
        reclaims=("n1", "n2"),
    ),
    Case(
        "rollback done: Retry with backoff, the message says what was reclaimed",
        gang(),
        config={},
        requests=[
            req(
                conditions={"Failed": "broke"},
                annotations={**ROLLING, "gangcheck.io/outcome": OUTCOME},
            )
        ],
        state="Retry",
        requeue_after_seconds=60,
        message=f"Retrying after rollback: rolled back {REQ1} (Failed: broke);"
        " reclaimed 2 nodes (10.0 node-minutes held)",
    ),
    Case(
        "rollback done past the retry limit: Rejected",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(retry_count=3),
        config={},
        requests=[
            req(
                "wl-atomic-4",
                conditions={"Failed": "x"},
                annotations={**ROLLING, "gangcheck.io/outcome": OUTCOME},
            )
        ],
        state="Rejected",
        message="rolled back wl-atomic-4 (Failed: broke)",
    ),
    Case(
        "revoked capacity rolls back to Rejected",
        gang(),
        config={},
        requests=[
            req(
                conditions={"CapacityRevoked": "gone"},
                annotations={
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "CapacityRevoked: gone",
                    "gangcheck.io/outcome": OUTCOME,
                },
            )
        ],
        state="Rejected",
        message=f"rolled back {REQ1} (CapacityRevoked: gone)",
    ),
    Case(
        "with the verdict written, the rolled-back request is deleted",
        WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(state="Retry"),
        config={},
        requests=[
            req(
                conditions={"Failed": "x"}, annotations={**ROLLING, "gangcheck.io/outcome": OUTCOME}
            )
        ],
        deletes=(REQ1,),
    ),
    Case(
        "trusting Provisioned, a failure retries at once with no reclaim (Kueue's behaviour)",
        gang(),
        requests=[req(conditions={"Failed": "broke"})],
        state="Retry",
        requeue_after_seconds=60,
        message="Retrying after failure: broke",
    ),
    Case(
        "watchdog: every member scheduled marks the attempt started",
        admitted(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        pods=[member(f"p{i}", bound=True) for i in range(4)],
        annotates=({"gangcheck.io/phase": "Started"},),
    ),
    Case(
        "watchdog: pods of another namespace consuming a request of that name do not count",
        admitted(),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=FULFILLED)],
        pods=[
            *(member(f"p{i}", bound=True) for i in range(3)),
            member("p3", bound=True, namespace="elsewhere"),
        ],
    ),
    Case(
        "watchdog: a finished member does not count as scheduled",
        admitted(),
        config={},
        requests=[req(conditions={"Provisioned": ""}, annotations=FULFILLED)],
        pods=[
            *(member(f"p{i}", bound=True) for i in range(3)),
            member("p3", bound=True, phase="Failed"),
        ],
    ),
    Case(
        "watchdog: within the start deadline a half-scheduled gang waits",
        admitted(),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        pods=[member("p0", bound=True), member("p1", bound=False)],
    ),
    Case(
        "watchdog: past the start deadline a half-scheduled gang rolls back",
        admitted(),
        config={},
        now=datetime(2026, 11, 30, 10, 11, tzinfo=UTC),
        requests=[req(conditions={"Provisioned": ""})],
        pods=[member("p0", bound=True), member("p1", bound=True), member("p2", bound=False)],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "StartDeadline: 2 of 4 members scheduled"
                " within 600s of admission",
                "gangcheck.io/rollback-nodes": "{}",
            },
        ),
    ),
    Case(
        "watchdog rollback done: the admitted gang is set to Retry (Kueue evicts it)",
        admitted(),
        config={},
        requests=[
            req(
                conditions={"Provisioned": ""},
                annotations={
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "StartDeadline: x",
                    "gangcheck.io/outcome": OUTCOME,
                },
            )
        ],
        state="Retry",
        requeue_after_seconds=60,
        message="Retrying after rollback",
    ),
]


def scaled_down_in_place(b: WorkloadBuilder, now: int) -> WorkloadBuilder:
    """An elastic Job's admitted Workload scaled down as Kueue v0.17 does it
    (EnsureWorkloadSlices: the spec's count lowered by a plain Update; the admission's count
    left as admitted); the Job controller deletes the members beyond it."""
    b.obj["spec"]["podSets"][0]["count"] = now
    return b


CASES += [
    Case(
        "watchdog: an elastic Job scaled down in place (4 admitted, 3 now) whose 3 members are "
        "scheduled has started (no rollback, whose Retry would have Kueue stop the Job)",
        scaled_down_in_place(admitted(), 3),
        config={},
        now=datetime(2026, 11, 30, 10, 11, tzinfo=UTC),
        requests=[req(conditions={"Provisioned": ""})],
        pods=[member(f"p{i}", bound=True) for i in range(3)],
        annotates=({"gangcheck.io/phase": "Started"},),
    ),
    Case(
        "an elastic Job scaled down in place (4 admitted, 3 now) while its request for 4 is "
        "in flight: judged on the 3 it has, Ready once they fit",
        scaled_down_in_place(gang(), 3),
        config={},
        requests=[req(conditions={"Provisioned": ""})],
        nodes=[
            node("n1", gpu=2, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
            node("n2", gpu=1, labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z"),
        ],
        state="Ready",
        claims=("n1", "n2"),
        consume_pod_sets=("workers",),
        message="the whole gang fits on nodes that exist",
        annotates=(FULFILLED,),
    ),
    Case(
        "watchdog: scaled down in place (3 now) with 2 scheduled past the start deadline: "
        "rolls back, counting the 3 the Job has",
        scaled_down_in_place(admitted(), 3),
        config={},
        now=datetime(2026, 11, 30, 10, 11, tzinfo=UTC),
        requests=[req(conditions={"Provisioned": ""})],
        pods=[member("p0", bound=True), member("p1", bound=True), member("p2", bound=False)],
        annotates=(
            {
                "gangcheck.io/phase": "RollingBack",
                "gangcheck.io/rollback-reason": "StartDeadline: 2 of 3 members scheduled"
                " within 600s of admission",
                "gangcheck.io/rollback-nodes": "{}",
            },
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    d = run(case)
    if case.state is None:
        assert d.check is None
    else:
        assert d.check is not None
        assert d.check.state == case.state
        assert d.check.message.startswith(case.message)
        assert d.check.requeue_after_seconds == case.requeue_after_seconds
    assert sum(isinstance(a, CreateTemplate) for a in d.actions) == case.creates
    assert any(isinstance(a, CreateRequest) for a in d.actions) == case.created_request
    assert tuple(a.name for a in d.actions if isinstance(a, DeleteRequest)) == case.deletes
    assert tuple(a.name for a in d.actions if isinstance(a, ClaimNode)) == case.claims
    assert (
        tuple(a.annotations for a in d.actions if isinstance(a, AnnotateRequest)) == case.annotates
    )
    reclaims = [a.nodes for a in d.actions if isinstance(a, ReclaimArrivals)]
    assert reclaims == ([] if case.reclaims is None else [case.reclaims])
    emitted = tuple(e.reason for e in d.events if e.reason != "AdmissionCheckUpdated")
    assert emitted == case.events or not case.events
    if case.reclaimer is not None:
        assert [a.reclaimer for a in d.actions if isinstance(a, ReclaimArrivals)] == [
            case.reclaimer
        ]
    if case.consume_pod_sets:
        assert d.check is not None
        updates = {u["name"]: u["annotations"] for u in d.check.pod_set_updates}
        assert sorted(updates) == sorted(case.consume_pod_sets)
        for annotations in updates.values():
            assert annotations["autoscaling.x-k8s.io/consume-provisioning-request"].startswith(
                "wl-atomic-"
            )
            assert annotations["autoscaling.x-k8s.io/provisioning-class-name"]


def test_a_request_in_flight_with_its_templates_costs_no_write_but_the_check() -> None:
    """Kueue hands each template to its request (a patch per gang); gangcheck leaves them
    owned by the Workload, which is what keeps them from the garbage collector anyway."""
    d = run(Case("", gang(), requests=[req()]))
    assert d.actions == ()
    assert d.check is not None


def test_a_recreated_template_is_owned_by_nothing_and_names_the_workload_uid() -> None:
    d = run(Case("", gang(), requests=[req()], templates=frozenset()))
    body = next(a for a in d.actions if isinstance(a, CreateTemplate)).body
    assert "ownerReferences" not in body["metadata"]
    assert body["metadata"]["annotations"]["gangcheck.io/workload-uid"] == "uid-wl"


def test_templates_are_created_before_the_request() -> None:
    d = run(Case("", gang()))
    kinds = [type(a).__name__ for a in d.actions]
    assert kinds == ["CreateTemplate", "CreateRequest"]


def test_request_carries_flavor_labels_owner_and_overlaid_parameters() -> None:
    wl = gang().annotation("provreq.kueue.x-k8s.io/ValidUntilSeconds", "60")
    d = run(Case("", wl, config={**TRUST, "parameters": {"a": "1", "ValidUntilSeconds": "30"}}))
    template = next(a for a in d.actions if isinstance(a, CreateTemplate)).body
    request = next(a for a in d.actions if isinstance(a, CreateRequest)).body
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert {"key": "gpu", "operator": "Exists"} in template["template"]["spec"]["tolerations"]
    assert request["spec"]["parameters"] == {"a": "1", "ValidUntilSeconds": "60"}
    assert request["spec"]["podSets"] == [
        {"podTemplateRef": {"name": f"ppt-{REQ1}-workers"}, "count": 4}
    ]
    assert request["metadata"]["annotations"]["gangcheck.io/workload-uid"] == "uid-wl"
    assert "ownerReferences" not in request["metadata"]  # Kueue would delete it otherwise
    assert (
        request["metadata"]["annotations"]["gangcheck.io/fulfillment-deadline"]
        == "2026-11-30T10:12:00Z"
    )


def test_limits_are_copied_into_missing_requests() -> None:
    wl = (
        WorkloadBuilder()
        .pod_set("w", 2, pod_template(gpu=1, limits_only=True))
        .reserve_quota()
        .check()
    )
    d = run(Case("", wl))
    template = next(a for a in d.actions if isinstance(a, CreateTemplate)).body
    assert (
        template["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
        == "1"
    )


def test_more_pod_sets_than_a_request_carries_is_rejected() -> None:
    wl = WorkloadBuilder()
    for i in range(33):
        wl.pod_set(f"ps{i}", 1, pod_template(cpu=str(i + 1)))
    d = run(Case("", wl.reserve_quota().check()))
    assert d.check is not None and d.check.state == "Rejected"
    assert "33 distinct pod sets" in d.check.message
    assert not d.actions


def test_names_past_253_characters_are_cut_and_hashed() -> None:
    wl = WorkloadBuilder(name="w" * 250).pod_set("workers", 2).reserve_quota().check()
    d = run(Case("", wl))
    names = [
        a.body["metadata"]["name"]
        for a in d.actions
        if isinstance(a, CreateTemplate | CreateRequest)
    ]
    assert all(len(n) <= 253 for n in names)
    assert len(set(names)) == 2


def test_node_selector_from_class_details() -> None:
    config = {
        **TRUST,
        "podSetUpdates": {
            "nodeSelector": [
                {
                    "key": "cloud.example/reservation",
                    "valueFromProvisioningClassDetail": "reservation",
                }
            ]
        },
    }
    request = req(conditions={"Provisioned": ""})
    request["status"]["provisioningClassDetails"] = {"reservation": "r-123"}
    d = run(Case("", gang(), config=config, requests=[request]))
    assert d.check is not None
    assert d.check.pod_set_updates[0]["nodeSelector"] == {"cloud.example/reservation": "r-123"}


def test_no_write_when_nothing_changes() -> None:
    wl = gang().check(message=f"waiting for provisioning request {REQ1} to be accepted")
    assert run(Case("", wl, requests=[req()])).check is None


def test_state_change_records_an_event() -> None:
    d = run(Case("", gang(), requests=[req(conditions={"Failed": "x"})]))
    assert [e.reason for e in d.events] == ["AdmissionCheckUpdated"]
    assert d.events[0].warning


@pytest.mark.parametrize("current", [False, True], ids=["node cache behind", "node cache current"])
def test_a_finished_gangs_waiting_attempt_is_withdrawn_once_the_node_cache_is_current(
    current: bool,
) -> None:
    """Withdrawing an attempt still waiting in fit mode records the arrivals it passed over
    first (lifecycle.abandon); with a node cache that may miss some (its watch failed), it
    writes nothing and looks again shortly, as a rollback does. Before: it withdrew at once."""
    decision = run(
        Case(
            "finished, waiting, fit mode",
            gang().condition("Finished"),
            config={"fulfillment": {"mode": "NodesFit"}},
            requests=[req(conditions={"Provisioned": ""})],
            waiting=(Waiting(f"default/{REQ1}", (pod_template(gpu=8),)),),
            nodes_current=current,
        )
    )
    deleted = [a.name for a in decision.actions if isinstance(a, DeleteRequest)]
    if current:
        assert deleted == [REQ1]
    else:
        assert decision.actions == () and decision.check is None
        assert decision.requeue_after == 1.0


def test_an_attempt_that_lost_its_quota_is_looked_at_again_at_its_deadline() -> None:
    """Kueue took the reservation back without evicting (its queue stopped or gone): nothing
    is written, and the decision asks to look again when the attempt's deadline falls due."""
    decision = run(Case("quota lost", lost_quota(), config={}, requests=[req()]))
    assert decision.actions == () and decision.check is None
    assert decision.requeue_after == (parse_time(DEADLINE[DEADLINE_KEY]) - NOW).total_seconds()


def test_a_gang_waiting_for_its_members_is_looked_at_again_at_its_start_deadline() -> None:
    """Its members' binds requeue it (the controller routes them); the watchdog itself asks
    only for its deadline, not for a poll every few seconds."""
    decision = run(
        Case(
            "watchdog",
            admitted(),
            config={},
            requests=[req(conditions={"Provisioned": ""})],
            pods=[member("p0", bound=True), member("p1", bound=False)],
        )
    )
    assert decision.actions == ()
    admitted_at = parse_time(T0)
    assert admitted_at is not None
    assert decision.requeue_after == pytest.approx(600 - (NOW - admitted_at).total_seconds())


#: The pod sets an attempt made under MADE_UNDER asked for: the driver's and the workers'.
MADE_UNDER_POD_SETS = (("driver", 1), ("workers", 4))


def driver_and_workers(*, driver_cpu: str) -> WorkloadBuilder:
    """A driver (CPU only, `driver_cpu` cores) and 4 GPU workers, quota reserved."""
    return (
        WorkloadBuilder()
        .pod_set("driver", 1, pod_template(cpu=driver_cpu))
        .pod_set("workers", 4, pod_template(gpu=1))
        .reserve_quota()
    )


def made_under(
    id: str, workload: WorkloadBuilder, *, request_conditions: dict[str, str], **kw: Any
) -> Case:
    """managedResources narrowed since the attempt was made: `workload`'s request (with
    `request_conditions`) made under MADE_UNDER for both MADE_UNDER_POD_SETS, the config now
    naming the GPU (the workers) alone."""
    templates = [(naming.template_name(REQ1, ps), count) for ps, count in MADE_UNDER_POD_SETS]
    request = req(conditions=request_conditions, annotations=MADE_UNDER, templates=templates)
    return Case(
        id,
        workload,
        config={"managedResources": ["nvidia.com/gpu"]},
        requests=[request],
        **kw,
    )


def test_the_watchdog_counts_the_members_under_the_config_the_attempt_was_made_under() -> None:
    """managedResources narrowed since the attempt was made (now the GPU only, where the
    request asked for the driver too, under the config recorded on it): the watchdog still
    waits for the 5 members its request asked for. Before, it counted the 4 GPU workers the
    config names now, and with those 4 scheduled and the driver not, marked the attempt
    Started and lifted its holds."""
    decision = run(
        made_under(
            "watchdog under its own config",
            driver_and_workers(driver_cpu="2").condition("Admitted").check(state="Ready"),
            request_conditions={"Provisioned": ""},
            pods=[*(member(f"w{i}", bound=True) for i in range(4)), member("d0", bound=False)],
        )
    )
    assert not [a for a in decision.actions if isinstance(a, AnnotateRequest)]
    admitted_at = parse_time(T0)
    assert admitted_at is not None
    assert decision.requeue_after == pytest.approx(600 - (NOW - admitted_at).total_seconds())


def test_the_fit_checks_the_pod_sets_of_the_config_the_attempt_was_made_under() -> None:
    """managedResources narrowed since the attempt was made (now the GPU only, where the
    request asked for the driver too, under the config recorded on it), the request
    Provisioned, room for the 4 GPU workers and none for the driver: the check stays Pending,
    the fit still counting the 5 members its request asked for. Before, the fit counted the
    4 workers the config names now and turned the check Ready, the driver's capacity not
    there (and its podSetUpdates left it unpinned and unconsumed)."""
    decision = run(
        made_under(
            "fit under its own config",
            driver_and_workers(driver_cpu="16").check(),
            request_conditions={"Provisioned": ""},
            nodes=[
                node("n1", gpu=8, cpu="8", labels={"pool": "gpu"}, created="2026-11-30T10:01:00Z")
            ],
        )
    )
    assert decision.check is not None
    assert decision.check.state == "Pending"
    assert decision.check.message.startswith(
        "capacity requested, not yet usable: 4 of 5 members placeable"
    )
    assert not [a for a in decision.actions if isinstance(a, AnnotateRequest)]


def test_a_template_lost_is_made_again_for_the_pod_sets_the_attempt_was_made_under() -> None:
    """managedResources narrowed since the attempt was made (now the GPU only, where the
    request asked for the driver too, under the config recorded on it), and the driver's
    PodTemplate deleted by hand while the request waits: it is made again, with the
    workers' kept. Before, the templates were made again from the pod sets the config names
    now, which have no driver: its template stayed missing under the request."""
    driver, workers = (naming.template_name(REQ1, ps) for ps, _ in MADE_UNDER_POD_SETS)
    decision = run(
        made_under(
            "template made again under its own config",
            driver_and_workers(driver_cpu="16").check(),
            request_conditions={"Accepted": ""},
            templates=frozenset({workers}),
        )
    )
    made = [a.body for a in decision.actions if isinstance(a, CreateTemplate)]
    assert [b["metadata"]["name"] for b in made] == [driver]


def test_a_gang_made_in_fit_mode_has_its_holds_lifted_once_started_under_trust_now() -> None:
    """fulfillment.mode switched to TrustProvisioned after a NodesFit attempt turned Ready
    on nodes it claimed and held: once every member is scheduled the attempt is marked
    Started and the hold lifted, as under the mode it was made under. Before, the start
    watchdog ran only in fit mode now, and an attempt not yet Started did nothing: the hold
    stayed on the nodes (closed to every other pod) for the gang's whole life."""
    workload = gang().condition("Admitted").check(state="Ready")
    held = node(
        "n1",
        gpu=8,
        labels={"pool": "gpu"},
        annotations=MINE,
        created="2026-11-30T10:01:00Z",
        taints=[hold_taint(f"default/{REQ1}")],
    )
    decision = run(
        Case(
            "fit-made attempt, trusted now",
            workload,
            config=dict(TRUST),
            requests=[req(conditions={"Provisioned": ""}, annotations={**FULFILLED, **MADE_UNDER})],
            nodes=[held],
            pods=[member(f"p{i}", bound=True) for i in range(4)],
        )
    )
    assert AnnotateRequest(REQ1, {"gangcheck.io/phase": "Started"}) in decision.actions
    lifted = [a for a in decision.actions if isinstance(a, ReleaseHold)]
    assert [a.nodes for a in lifted] == [("n1",)]


def test_the_requeue_delay_is_retrys_alone() -> None:
    """Kueue resets a Retry check to Pending keeping its requeueAfterSeconds; gangcheck's next
    entry (here Ready) drops it, as Kueue's own check writes its entries (before, a Ready check
    still said "requeue after 30s" in diagnose)."""
    builder = gang()
    builder.obj["status"]["admissionChecks"][0].update(
        state="Pending", requeueAfterSeconds=30, message="Reset to Pending after eviction"
    )
    d = run(Case("reset", builder, config={**TRUST, "managedResources": ["example.com/fpga"]}))
    assert d.check is not None and d.check.state == "Ready"
    assert d.check.requeue_after_seconds is None


# ---- a check Kueue sees inactive though its config resolves: the attempt goes on, noted ----

POOL_MISSING = "spec.capacitySources[1].karpenter.nodePools[0]: NodePool 'spot' not found"
GOES_ON = f" (the check is not active: {POOL_MISSING}; the attempt in flight goes on)"


@dataclass
class InactiveCase:
    id: str
    active: bool
    said: str
    """The check's message before this decision."""
    message: str | None
    """The check's message written (None: no write)."""


INACTIVE_CASES = [
    InactiveCase(
        "Active=False, a config that resolves: the Pending message notes it",
        active=False,
        said=f"provisioning request {REQ1} created for 4 pods",
        message="capacity requested, not yet usable: 0 of 4 members placeable; no nodes" + GOES_ON,
    ),
    InactiveCase(
        "Active=False, the note already written: nothing written again",
        active=False,
        said="capacity requested, not yet usable: 0 of 4 members placeable; no nodes" + GOES_ON,
        message=None,
    ),
    InactiveCase(
        "Active=False, the message unchanged without the note: the note is added",
        active=False,
        said="capacity requested, not yet usable: 0 of 4 members placeable; no nodes",
        message="capacity requested, not yet usable: 0 of 4 members placeable; no nodes" + GOES_ON,
    ),
    InactiveCase(
        "active again: the note goes",
        active=True,
        said="capacity requested, not yet usable: 0 of 4 members placeable; no nodes" + GOES_ON,
        message="capacity requested, not yet usable: 0 of 4 members placeable; no nodes",
    ),
]


@pytest.mark.parametrize("case", INACTIVE_CASES, ids=lambda c: c.id)
def test_a_gang_in_flight_under_a_check_kueue_sees_inactive(case: InactiveCase) -> None:
    """A NodePool a Karpenter source names is missing: the AdmissionCheck is Active=False
    (its condition's message), its config still resolves and the attempt in flight goes on
    by it; its Pending message says the check is not active, as with an invalid config."""
    ac = admission_check(active=case.active, message=POOL_MISSING)
    wl = WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(CHECK, "Pending")
    obj = wl.build()
    obj["status"]["admissionChecks"][0]["message"] = case.said
    snap = snapshot_of(
        workload_of(obj),
        CHECK,
        admission_check={CHECK: ac}.get,
        config={"cfg": {"spec": {}}}.get,
        requests=[req(conditions={"Accepted": "", "Provisioned": ""}, annotations=DEADLINE)],
        flavors=GPU_FLAVOR,
        capacity=ClusterView(),
        templates=frozenset({naming.template_name(REQ1, "workers")}),
    )
    d = decide(snap, NOW)
    assert (d.check.message if d.check is not None else None) == case.message


@pytest.mark.parametrize("noted", [False, True], ids=["note missing", "note written"])
def test_an_invalid_configs_note_is_written_once_on_an_unchanged_message(noted: bool) -> None:
    """The config gone, the attempt in flight goes on under the one it recorded: a message
    that did not change gets the note (before, only a changed message did), and is not
    written again once it has it."""
    said = "capacity requested, not yet usable: 0 of 4 members placeable; no nodes"
    note = "the check is not active: AtomicProvisioningConfig 'gpu' not found; "
    note += "the attempt in flight goes on under the config it was made with"
    obj = WorkloadBuilder().pod_set("workers", 4).reserve_quota().check(CHECK, "Pending").build()
    obj["status"]["admissionChecks"][0]["message"] = said + (f" ({note})" if noted else "")
    made = req(
        conditions={"Accepted": "", "Provisioned": ""}, annotations={**DEADLINE, **MADE_UNDER}
    )
    snap = Snapshot(
        workload=workload_of(obj),
        check=CHECK,
        config=None,
        config_problem="AtomicProvisioningConfig 'gpu' not found",
        flavors=GPU_FLAVOR,
        requests=(request_of(made),),
        templates=frozenset({naming.template_name(REQ1, "workers")}),
        capacity=ClusterView(),
    )
    d = decide(snap, NOW)
    assert (d.check.message if d.check is not None else None) == (
        None if noted else f"{said} ({note})"
    )


def test_an_elastic_job_scaled_down_in_place_before_its_first_ask_asks_for_what_it_has() -> None:
    """Kueue v0.17 lowers the spec's count of a Workload with quota in place (its admission
    still says 4): the ask is for the 3 members the Job has, as Kueue's quota counts them."""
    d = run(Case("", scaled_down_in_place(gang(), 3), config={}))
    (body,) = (a.body for a in d.actions if isinstance(a, CreateRequest))
    assert [p["count"] for p in body["spec"]["podSets"]] == [3]


def test_an_attempt_whose_arrival_a_starting_gang_took_looks_again_within_seconds() -> None:
    (case,) = (c for c in CASES if c.id.startswith("a member of another gang not started"))
    assert run(case).requeue_after == lifecycle.STRAYS_STARTING_RECHECK


@pytest.mark.parametrize(
    ("starts", "on_nodes"),
    [
        ("fit mode, a younger request leaves new nodes to the older one waiting", True),
        ("a member of another gang not started", True),
        ("fit mode, an older request of another node group does not hold back a new node", False),
    ],
)
def test_an_attempt_says_when_it_waits_on_what_other_requests_leave_it(
    starts: str, on_nodes: bool
) -> None:
    """Provisioned and waiting on nodes that exist (an older request's claim, a starting
    gang's members): the controller has it decide again when those change (`Step.on_nodes`)."""
    (case,) = (c for c in CASES if c.id.startswith(starts))
    step = run(case).step
    assert step is not None and step.on_nodes is on_nodes


def test_an_attempt_waiting_on_its_source_does_not_wait_on_nodes() -> None:
    step = run(Case("", gang(), config={}, requests=[req()])).step
    assert step is not None and step.progress is lifecycle.Progress.WAITING
    assert not step.on_nodes
