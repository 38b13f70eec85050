"""Why is this gang pending? The chain, and the one link that blocks it.

Pure: the edge (``gangcheck.diagnose``) fetches the objects; here ``gather`` reads one
Workload and the cluster objects around it into ``Facts`` (quota → check state → the current
attempt's ProvisioningRequest → arrived nodes → per-node fit), ``verdict`` names the first
broken link as one line, and ``gang_row`` condenses the same facts for ``gangcheck status``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    CONSUME_ANNOTATION,
    DEADLINE_ANNOTATION,
    FULFILLED,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    ROLLING_BACK,
    STARTED,
)
from gangcheck.logic.attempt.fulfillment import (
    Capacity,
    GangSpec,
    claim_of,
    gang_of,
    is_new_arrival,
    request_key,
    tolerating_hold,
)
from gangcheck.logic.attempt.reclaim import Outcome
from gangcheck.logic.placement.dra import DraContext, Inventory
from gangcheck.logic.placement.fit import (
    FitResult,
    Member,
    NodeView,
    Rejection,
    member_from_template,
    node_view,
)
from gangcheck.logic.placement.quantity import QuantityError
from gangcheck.logic.placement.topology import fit_in_domains
from gangcheck.logic.timefmt import parse_time
from gangcheck.logic.workloads import checkconfig
from gangcheck.logic.workloads.admission import Snapshot, gang_templates
from gangcheck.logic.workloads.podsets import pod_template_spec
from gangcheck.model.objects import (
    WORKLOAD_UID_ANNOTATION,
    CheckState,
    Condition,
    Flavor,
    ProvisioningRequest,
    Workload,
    conditions_of,
    is_true,
    request_of,
    workload_of,
)
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, FulfillmentMode

Obj = dict[str, Any]

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
REQUEST_CONDITIONS = ("Accepted", "Provisioned", "Failed", "BookingExpired", "CapacityRevoked")
# Reasons a node will not lose by waiting: the gang, its flavor or the node template is wrong.
STATIC_KINDS = frozenset({"taint", "selector", "affinity", "cordoned", "unusable"})


# ---- the target --------------------------------------------------------------------------

KINDS = {
    "job": "job",
    "jobs": "job",
    "job.batch": "job",
    "jobs.batch": "job",
    "workload": "workload",
    "workloads": "workload",
    "wl": "workload",
    "workload.kueue.x-k8s.io": "workload",
    "workloads.kueue.x-k8s.io": "workload",
    "pod": "pod",
    "pods": "pod",
    "po": "pod",
    "podgroup": "podgroup",
    "podgroups": "podgroup",
    "pg": "podgroup",
}
POD_GROUP_APIS = ("scheduling.k8s.io", "scheduling.x-k8s.io")
"""A podgroup target may name its API: `podgroup.scheduling.x-k8s.io/NS/NAME`."""


class TargetError(ValueError):
    """The target names no object gangcheck can diagnose; the message says why, in a line."""


@dataclass(frozen=True)
class Target:
    kind: str
    namespace: str
    name: str
    api_group: str = ""
    """Of a podgroup target, when named: scheduling.k8s.io or scheduling.x-k8s.io."""

    def __str__(self) -> str:
        kind = f"{self.kind}.{self.api_group}" if self.api_group else self.kind
        return f"{kind}/{self.namespace}/{self.name}"


def parse_target(text: str, *, default_namespace: str = "default") -> Target:
    """`KIND/NAMESPACE/NAME` (or `KIND/NAME` in the default namespace)."""
    parts = text.strip().split("/")
    if len(parts) == 2:
        parts = [parts[0], default_namespace, parts[1]]
    if len(parts) != 3 or not all(parts):
        raise TargetError(f"{text!r} is not KIND/NAMESPACE/NAME (for example job/team-a/train)")
    kind, api_group = KINDS.get(parts[0].lower()), ""
    if kind is None:
        base, _, api_group = parts[0].lower().partition(".")
        if KINDS.get(base) == "podgroup" and api_group in POD_GROUP_APIS:
            kind = "podgroup"
    if kind is None:
        raise TargetError(
            f"unknown kind {parts[0]!r}: use job, workload, pod or podgroup "
            "(podgroup.scheduling.k8s.io, podgroup.scheduling.x-k8s.io)"
        )
    return Target(kind, parts[1], parts[2], api_group)


# ---- facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """The objects around a Workload, as the edge fetched them."""

    admission_checks: Mapping[str, Obj] = field(default_factory=dict)
    configs: Mapping[str, Obj] = field(default_factory=dict)
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    requests: tuple[Obj, ...] = ()
    """ProvisioningRequests gangcheck manages, in every namespace (in-flight claims)."""
    nodes: tuple[Obj, ...] = ()
    pods: tuple[Obj, ...] = ()
    """Pods not finished: bound ones take room on nodes; members consume a request."""
    cluster_queues: Mapping[str, Obj] | None = None
    local_queues: Mapping[str, Obj] | None = None
    """Keyed `namespace/name`. None: not fetched (or not readable)."""
    device_classes: tuple[Obj, ...] = ()
    resource_slices: tuple[Obj, ...] = ()
    resource_claims: tuple[Obj, ...] = ()
    claim_templates: tuple[Obj, ...] = ()
    """The DRA objects (empty where the API is not served or not readable)."""

    def dra(self, namespace: str) -> tuple[DraContext, Inventory]:
        """The namespace's claim templates and claims, and the devices: as the controller."""
        return Capacity(
            device_classes=self.device_classes,
            resource_slices=self.resource_slices,
            resource_claims=self.resource_claims,
            claim_templates=self.claim_templates,
        ).dra(namespace)

    def our_checks(self) -> set[str]:
        return {n for n, ac in self.admission_checks.items() if checkconfig.is_ours(ac)}


@dataclass(frozen=True)
class WorkloadState:
    """The Workload itself and its quota: the first links of the chain."""

    reserved: bool = False
    cluster_queue: str = ""
    local_queue: str = ""
    local_queue_found: bool | None = None
    quota_condition: Condition | None = None
    admitted: bool = False
    admitted_at: datetime | None = None
    finished: Condition | None = None
    active: bool = True
    deleting: bool = False
    evicted: Condition | None = None
    requeue_at: datetime | None = None
    created: datetime | None = None


@dataclass(frozen=True)
class CheckFacts:
    """One admission check of the Workload (or of its ClusterQueue, not yet listed)."""

    name: str
    state: str = PENDING
    """"" when the ClusterQueue requires it but the Workload does not list it yet."""
    message: str = ""
    retry_count: int = 0
    requeue_after_seconds: int | None = None
    ours: bool = True
    exists: bool = True
    active: bool = True
    problem: str = ""
    """Why the check is not active."""
    controller: str = ""

    @property
    def attempt(self) -> int:
        return self.retry_count + 1


@dataclass(frozen=True)
class RequestFacts:
    """The ProvisioningRequest of the current attempt of the check being diagnosed."""

    name: str
    attempt: int
    found: bool = True
    conditions: dict[str, Condition] = field(default_factory=dict)
    phase: str = ""
    created: datetime | None = None
    deadline: datetime | None = None
    rollback_reason: str = ""
    outcome: Outcome | None = None
    deleting: bool = False
    members: int = 0


@dataclass(frozen=True)
class NodeFit:
    """One node the gang could use, and what it would take or why it takes none."""

    name: str
    arrived: bool = False
    recorded: bool = False
    """Arrived and recorded on the node (`gangcheck.io/arrived-for`); else a new arrival the
    controller has not recorded yet."""
    members: int = 0
    reason: str = ""
    short: str = ""
    kind: str = ""
    """taint | selector | affinity | not-ready | cordoned | resources | unusable | ""."""
    subject: str = ""


@dataclass(frozen=True)
class Placement:
    """The gang on the nodes it may use: the arrived ones, and shared ones its selectors match."""

    placeable: int
    total: int
    fits: bool
    nodes: tuple[NodeFit, ...] = ()
    summary: str = ""

    @property
    def arrived(self) -> tuple[NodeFit, ...]:
        return tuple(n for n in self.nodes if n.arrived)


@dataclass(frozen=True)
class StartFacts:
    """After admission: members scheduled, and when the start watchdog gives up."""

    scheduled: int
    total: int
    deadline: datetime | None = None


@dataclass(frozen=True)
class Facts:
    namespace: str
    name: str
    state: WorkloadState = WorkloadState()
    checks: tuple[CheckFacts, ...] = ()
    focus: str = ""
    """The check of ours diagnosed: the first not Ready, else the first."""
    mode: str = FulfillmentMode.FIT.value
    request: RequestFacts | None = None
    placement: Placement | None = None
    start: StartFacts | None = None

    @property
    def focus_check(self) -> CheckFacts | None:
        return next((c for c in self.checks if c.name == self.focus), None)


def gather(workload: Obj, world: World) -> Facts:
    """Everything the chain needs about one Workload, read from the objects."""
    wl = workload_of(workload)
    state = workload_state(workload, wl, world)
    checks = check_facts(wl, world, _cluster_queue_checks(state, world))
    focus = _focus(checks)
    resolution = _resolution(world, focus)
    spec = resolution.spec if resolution else None
    req = _find_request(world, wl, focus, checks)
    request = _request_facts(req, focus, checks, wl) if focus else None
    gang = _gang(wl, focus, spec, world.flavors)
    placement = None
    if gang.pod_sets and (state.reserved or req is not None) and not state.admitted:
        placement = place_in(world, gang, wl.ref.namespace, req)
    return Facts(
        namespace=wl.ref.namespace,
        name=wl.ref.name,
        state=state,
        checks=checks,
        focus=focus,
        mode=(spec.fulfillment.mode.value if spec else FulfillmentMode.FIT.value),
        request=request,
        placement=placement,
        start=_start_facts(state, req, world, spec),
    )


def workload_state(obj: Obj, wl: Workload, world: World) -> WorkloadState:
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    conds = wl.conditions
    local_queue = str(spec.get("queueName") or "")
    lq_key = f"{wl.ref.namespace}/{local_queue}"
    lq = world.local_queues.get(lq_key) if world.local_queues is not None else None
    cq = str((status.get("admission") or {}).get("clusterQueue") or "")
    if not cq and lq is not None:
        cq = str((lq.get("spec") or {}).get("clusterQueue") or "")
    requeue = (status.get("requeueState") or {}).get("requeueAt")
    admitted = conds.get("Admitted")
    return WorkloadState(
        reserved=wl.has_quota_reservation,
        cluster_queue=cq,
        local_queue=local_queue,
        local_queue_found=(
            None if world.local_queues is None or not local_queue else lq is not None
        ),
        quota_condition=conds.get("QuotaReserved"),
        admitted=wl.is_admitted,
        admitted_at=parse_time(admitted.last_transition_time)
        if wl.is_admitted and admitted
        else None,
        finished=conds["Finished"] if wl.is_finished else None,
        active=wl.active,
        deleting=wl.deleting,
        evicted=conds["Evicted"] if wl.is_evicted else None,
        requeue_at=parse_time(str(requeue)) if requeue else None,
        created=parse_time(str((obj.get("metadata") or {}).get("creationTimestamp") or "")),
    )


def _cluster_queue_checks(state: WorkloadState, world: World) -> tuple[str, ...]:
    if world.cluster_queues is None or not state.cluster_queue:
        return ()
    cq = world.cluster_queues.get(state.cluster_queue) or {}
    spec = cq.get("spec") or {}
    names = [str(n) for n in spec.get("admissionChecks") or []]
    strategy = (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    names += [str(rule.get("name", "")) for rule in strategy]
    return tuple(dict.fromkeys(n for n in names if n))


def check_facts(wl: Workload, world: World, required: Sequence[str] = ()) -> tuple[CheckFacts, ...]:
    """The checks the Workload lists, then those its ClusterQueue requires and it lacks."""
    listed = [_check(world, name, wl.checks[name]) for name in wl.checks]
    missing = [_check(world, name, None) for name in required if name not in wl.checks]
    return tuple(listed + missing)


def _check(world: World, name: str, entry: CheckState | None) -> CheckFacts:
    ac = world.admission_checks.get(name)
    controller = str(((ac or {}).get("spec") or {}).get("controllerName") or "")
    problem = _inactive_because(world, name, ac)
    return CheckFacts(
        name=name,
        state=entry.state if entry else "",
        message=entry.message if entry else "",
        retry_count=entry.retry_count if entry else 0,
        requeue_after_seconds=entry.requeue_after_seconds if entry else None,
        ours=ac is not None and checkconfig.is_ours(ac),
        exists=ac is not None,
        active=problem is None,
        problem=problem or "",
        controller=controller,
    )


def _inactive_because(world: World, name: str, ac: Obj | None) -> str | None:
    """Why the AdmissionCheck is not active (None when it is): for ours, the config as this
    code resolves it first, then the Active condition Kueue goes by."""
    if ac is None:
        return f"the AdmissionCheck {name} does not exist"
    if checkconfig.is_ours(ac):
        resolution = checkconfig.resolve(ac, world.configs.get)
        if not resolution.active:
            return resolution.message
    active = _active_condition(ac)
    if active is None:
        return _NO_ACTIVE if checkconfig.is_ours(ac) else "no Active condition"
    if active.status != "True":
        return active.message or active.reason or "Active is not True"
    return None


_NO_ACTIVE = "no Active condition yet (is the gangcheck controller running?)"


def _active_condition(ac: Obj) -> Condition | None:
    return conditions_of(ac).get("Active")


def _focus(checks: Sequence[CheckFacts]) -> str:
    ours = [c for c in checks if c.ours]
    pick = next((c for c in ours if c.state != READY), ours[0] if ours else None)
    return pick.name if pick else ""


def _resolution(world: World, check: str) -> checkconfig.Resolution | None:
    if not check:
        return None
    return checkconfig.resolve(world.admission_checks.get(check), world.configs.get)


def _attempt_name(wl: Workload, check: str, checks: Sequence[CheckFacts]) -> tuple[str, int]:
    facts = next((c for c in checks if c.name == check), None)
    attempt = facts.attempt if facts else 1
    return naming.request_name(wl.ref.name, check, attempt), attempt


def _find_request(
    world: World, wl: Workload, check: str, checks: Sequence[CheckFacts]
) -> ProvisioningRequest | None:
    if not check:
        return None
    name, _ = _attempt_name(wl, check, checks)
    for obj in world.requests:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") == wl.ref.namespace and meta.get("name") == name:
            return request_of(obj)
    return None


def _request_facts(
    req: ProvisioningRequest | None, check: str, checks: Sequence[CheckFacts], wl: Workload
) -> RequestFacts:
    name, attempt = _attempt_name(wl, check, checks)
    return request_facts(req, name, attempt)


def request_facts(req: ProvisioningRequest | None, name: str, attempt: int) -> RequestFacts:
    """What the request named `name` says (found=False when there is none)."""
    if req is None:
        return RequestFacts(name=name, attempt=attempt, found=False)
    notes = req.annotations
    raw_outcome = notes.get(OUTCOME_ANNOTATION)
    return RequestFacts(
        name=name,
        attempt=attempt,
        conditions=dict(req.conditions),
        phase=notes.get(PHASE_ANNOTATION, ""),
        created=parse_time(req.creation_timestamp),
        deadline=parse_time(notes.get(DEADLINE_ANNOTATION, "")),
        rollback_reason=notes.get(ROLLBACK_REASON_ANNOTATION, ""),
        outcome=Outcome.from_annotation(raw_outcome) if raw_outcome else None,
        deleting=req.deleting,
        members=sum(p.count for p in req.pod_sets),
    )


def _gang(
    wl: Workload, check: str, spec: AtomicProvisioningSpec | None, flavors: Mapping[str, Flavor]
) -> GangSpec:
    """(pod set, count, template) as the controller assesses them; every pod set without a
    config to say which need capacity."""
    if spec is not None:
        return gang_templates(Snapshot(workload=wl, check=check, config=spec, flavors=flavors))
    return GangSpec(
        tuple(
            (ps.name, ps.count, pod_template_spec(wl, ps.name, ps.template, flavors))
            for ps in wl.pod_sets
        )
    )


def in_flight_keys(world: World) -> frozenset[str]:
    """`namespace/name` of every request gangcheck manages: nodes arrived for them are theirs."""
    keys = set()
    for req in world.requests:
        meta = req.get("metadata") or {}
        keys.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return frozenset(keys)


def _start_facts(
    state: WorkloadState,
    req: ProvisioningRequest | None,
    world: World,
    spec: AtomicProvisioningSpec | None,
) -> StartFacts | None:
    if not state.admitted or req is None:
        return None
    members = [
        p
        for p in world.pods
        if (p.get("metadata") or {}).get("namespace") == req.ref.namespace
        and ((p.get("metadata") or {}).get("annotations") or {}).get(CONSUME_ANNOTATION) == req.name
    ]
    scheduled = sum(1 for p in members if (p.get("spec") or {}).get("nodeName"))
    deadline = None
    if spec is not None and state.admitted_at is not None:
        seconds = spec.fulfillment.start_deadline_seconds
        deadline = datetime.fromtimestamp(
            state.admitted_at.timestamp() + seconds, state.admitted_at.tzinfo
        )
    return StartFacts(
        scheduled=scheduled, total=sum(p.count for p in req.pod_sets), deadline=deadline
    )


# ---- per-node fit ------------------------------------------------------------------------


def place_in(
    world: World, gang: GangSpec, namespace: str, request: ProvisioningRequest | None
) -> Placement | None:
    """`place` on what the world holds: its nodes, pods, in-flight requests and devices."""
    return place(
        gang,
        world.nodes,
        world.pods,
        request=request,
        in_flight=in_flight_keys(world),
        dra=world.dra(namespace),
    )


def place(
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    *,
    request: ProvisioningRequest | None = None,
    in_flight: frozenset[str] = frozenset(),
    dra: tuple[DraContext, Inventory] | None = None,
) -> Placement | None:
    """Fit the gang on the nodes arrived for `request` (recorded, or new and unrecorded) and
    on the nodes its selectors match that no other in-flight request holds; with `dra`, its
    members' resource claims against the devices, as the controller fits them."""
    spec = GangSpec.of(gang)
    context, devices = dra if dra is not None else (None, None)
    try:
        members = [member_from_template(t, context) for _, _, t in spec.pod_sets]
        pod_sets = gang_of(spec.pod_sets, context)
        if request is not None:
            pod_sets = tolerating_hold(pod_sets, request_key(request))
    except QuantityError:
        return None
    considered = _considered(nodes, members, request, in_flight)
    views = [node_view(n) for n, _, _ in considered]
    fitted = fit_in_domains(
        pod_sets, views, pods, spec.topology, together=spec.together, devices=devices
    )
    result = fitted.result
    fits = [_node_fit(node, arrived, recorded, result) for node, arrived, recorded in considered]
    fits.sort(key=lambda n: (not n.arrived, n.name))
    return Placement(
        placeable=result.placeable,
        total=result.total,
        fits=fitted.fits,
        nodes=tuple(fits),
        summary=fitted.summary(),
    )


def _considered(
    nodes: Sequence[Obj],
    members: list[Member],
    request: ProvisioningRequest | None,
    in_flight: frozenset[str],
) -> list[tuple[Obj, bool, bool]]:
    """(node, arrived, recorded) for every node the gang may count."""
    key = request_key(request) if request else ""
    created = parse_time(request.creation_timestamp) if request else None
    out = []
    for node in nodes:
        owner = claim_of(node)
        if key and owner == key:
            out.append((node, True, True))
        elif owner and owner in in_flight:
            continue  # another gang's arrival
        elif request is not None and is_new_arrival(node, created, members):
            out.append((node, True, False))
        elif any(is_selected(m, node_view(node)) for m in members):
            out.append((node, False, False))
    return out


def is_selected(member: Member, node: NodeView) -> bool:
    """The node's labels satisfy the member's nodeSelector and required affinity."""
    if any(node.labels.get(k) != v for k, v in member.node_selector.items()):
        return False
    if member.affinity is None:
        return True
    return any(term.first_failure(node) is None for term in member.affinity)


def _node_fit(node: Obj, arrived: bool, recorded: bool, result: FitResult) -> NodeFit:
    name = str((node.get("metadata") or {}).get("name", ""))
    rejection = result.node_reasons.get(name)
    kind, subject = classify(rejection) if rejection else ("", "")
    return NodeFit(
        name=name,
        arrived=arrived,
        recorded=recorded,
        members=len(result.placements.get(name, ())),
        reason=str(rejection) if rejection else "",
        short=rejection.short if rejection else "",
        kind=kind,
        subject=subject,
    )


def classify(rejection: Rejection) -> tuple[str, str]:
    """(kind, subject) of a fit rejection: `taint nvidia.com/gpu:NoSchedule not tolerated`
    is (taint, nvidia.com/gpu:NoSchedule)."""
    short = rejection.short
    if short.startswith("taint ") and short.endswith(" not tolerated"):
        return "taint", short.removeprefix("taint ").removesuffix(" not tolerated")
    if short.startswith("node selector mismatch"):
        return "selector", _inside(short).removeprefix("needs ")
    if short.startswith("required node affinity"):
        return "affinity", _inside(rejection.detail) if rejection.detail else ""
    if short == "not Ready":
        return "not-ready", ""
    if short.startswith("unschedulable"):
        return "cordoned", ""
    if short.startswith("insufficient "):
        return "resources", short.removeprefix("insufficient ")
    return "unusable", str(rejection)


def _inside(text: str) -> str:
    start, end = text.find("("), text.rfind(")")
    return text[start + 1 : end] if 0 <= start < end else ""


# ---- the verdict -------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    blocked: bool
    step: str
    """Where the chain breaks: workload, quota, check, request, nodes, start, admission."""
    reason: str

    @property
    def line(self) -> str:
        return f"{'blocked' if self.blocked else 'not blocked'}: {self.reason}"


def verdict(facts: Facts, now: datetime) -> Verdict:
    """THE reason the gang is not running: the first broken link of the chain."""
    return (
        _workload_verdict(facts, now)
        or _quota_verdict(facts, now)
        or _check_verdict(facts, now)
        or Verdict(
            True, "admission", "quota reserved and every check Ready; waiting for Kueue to admit"
        )
    )


def _workload_verdict(facts: Facts, now: datetime) -> Verdict | None:
    st = facts.state
    if st.finished is not None:
        detail = f" ({st.finished.message})" if st.finished.message else ""
        return Verdict(False, "workload", f"finished{detail}")
    if st.deleting:
        return Verdict(False, "workload", "the Workload is being deleted")
    if not st.active:
        why = st.evicted.message if st.evicted and st.evicted.message else _rejection(facts)
        detail = f": {why}" if why else ""
        return Verdict(True, "workload", f"the Workload is deactivated (spec.active=false){detail}")
    if st.admitted:
        return _start_verdict(facts, now)
    return None


def _rejection(facts: Facts) -> str:
    rejected = next((c for c in facts.checks if c.state == REJECTED), None)
    if rejected is None:
        return ""
    return f"the check {rejected.name} rejected it" + (
        f": {rejected.message}" if rejected.message else ""
    )


def _start_verdict(facts: Facts, now: datetime) -> Verdict:
    start, req = facts.start, facts.request
    if req is not None and req.phase == STARTED:
        return Verdict(False, "start", "admitted and running")
    if start is None or start.total == 0:
        return Verdict(False, "start", "admitted")
    if start.scheduled >= start.total:
        return Verdict(False, "start", "admitted and running")
    when = until("start deadline", start.deadline, now)
    return Verdict(
        True,
        "start",
        f"admitted, but only {start.scheduled} of {start.total} members are scheduled{when}",
    )


def _quota_verdict(facts: Facts, now: datetime) -> Verdict | None:
    st = facts.state
    if st.reserved:
        return None
    inactive = next((c for c in facts.checks if c.ours and not c.active), None)
    if inactive is not None:
        return _inactive(inactive)
    if st.requeue_at is not None and st.requeue_at > now:
        retried = max((c.retry_count for c in facts.checks if c.ours), default=0)
        after = f" after attempt {retried}" if retried else ""
        wait = human_duration((st.requeue_at - now).total_seconds())
        return Verdict(True, "quota", f"backoff{after}: Kueue requeues the Workload in {wait}")
    cond = st.quota_condition
    if cond is not None and cond.message:
        cq = st.cluster_queue
        prefix = f"ClusterQueue {cq}: " if cq and cq not in cond.message else ""
        return Verdict(True, "quota", f"quota: {prefix}{cond.message}")
    if st.local_queue_found is False:
        return Verdict(
            True, "quota", f"quota: LocalQueue {st.local_queue} does not exist in {facts.namespace}"
        )
    queue = f" (LocalQueue {st.local_queue})" if st.local_queue else ""
    return Verdict(True, "quota", f"quota: not reserved yet; Kueue has not placed it{queue}")


def _inactive(check: CheckFacts) -> Verdict:
    return Verdict(True, "check", f"the AdmissionCheck {check.name} is inactive: {check.problem}")


def _check_verdict(facts: Facts, now: datetime) -> Verdict | None:
    focus = facts.focus_check
    if focus is None or focus.state == READY:
        return _other_checks(facts)
    if not focus.active:
        return _inactive(focus)
    if focus.state == REJECTED:
        return Verdict(True, "check", f"the check {focus.name} rejected the gang: {focus.message}")
    if focus.state == RETRY:
        return _retry_verdict(focus, facts.request)
    return _attempt_verdict(facts, focus, now)


def _retry_verdict(check: CheckFacts, req: RequestFacts | None) -> Verdict:
    after = (
        f" after {human_duration(check.requeue_after_seconds)}"
        if check.requeue_after_seconds
        else ""
    )
    if req is not None and req.rollback_reason:
        return Verdict(
            True,
            "check",
            f"attempt {req.attempt} rolled back ({req.rollback_reason}); "
            f"Kueue requeues the gang{after}",
        )
    return Verdict(
        True, "check", f"the check {check.name} asked Kueue to retry{after}: {check.message}"
    )


def _other_checks(facts: Facts) -> Verdict | None:
    waiting = next((c for c in facts.checks if c.state != READY), None)
    if waiting is None:
        return None
    if not waiting.active:
        return _inactive(waiting)
    whose = "" if waiting.ours else f" ({waiting.controller or 'not gangcheck'})"
    state = waiting.state or "not listed yet"
    message = f": {waiting.message}" if waiting.message else ""
    return Verdict(True, "check", f"the admission check {waiting.name}{whose} is {state}{message}")


def _attempt_verdict(facts: Facts, check: CheckFacts, now: datetime) -> Verdict:
    req = facts.request
    if req is None or not req.found:
        name = req.name if req else "?"
        if check.message and name not in check.message:
            return Verdict(True, "check", f"the check {check.name} is Pending: {check.message}")
        return Verdict(
            True,
            "request",
            f"ProvisioningRequest {name} does not exist yet (is the gangcheck controller running?)",
        )
    if req.phase == ROLLING_BACK:
        done = f"; {req.outcome.summary()}" if req.outcome else ""
        return Verdict(
            True, "request", f"rolling back attempt {req.attempt}: {req.rollback_reason}{done}"
        )
    if req.deleting:
        return Verdict(True, "request", f"ProvisioningRequest {req.name} is being deleted")
    return _conditions_verdict(facts, req, now)


def ended_verdict(req: RequestFacts, hint: str = "") -> Verdict | None:
    """The request failed, was revoked, or its booking expired: the autoscaler's word."""
    conds = req.conditions
    for kind, what in (("Failed", "failed"), ("CapacityRevoked", "revoked the capacity of")):
        if is_true(conds, kind):
            why = conds[kind].message or conds[kind].reason
            return Verdict(True, "request", f"the autoscaler {what} {req.name}: {why}{hint}")
    if is_true(conds, "BookingExpired"):
        why = conds["BookingExpired"].message or "booking expired"
        return Verdict(True, "request", f"the booking of {req.name} expired: {why}")
    return None


def _conditions_verdict(facts: Facts, req: RequestFacts, now: datetime) -> Verdict:
    conds = req.conditions
    ended = ended_verdict(req)
    if ended is not None:
        return ended
    deadline = until("deadline", req.deadline, now)
    if is_true(conds, "Provisioned"):
        return _provisioned_verdict(facts, req, deadline)
    if is_true(conds, "Accepted"):
        eta = conds["Provisioned"].message if "Provisioned" in conds else ""
        eta = f" ({eta})" if eta else ""
        return Verdict(
            True,
            "request",
            f"waiting for the autoscaler: {req.name} accepted, not provisioned yet{eta}{deadline}",
        )
    return Verdict(True, "request", f"waiting for the autoscaler to accept {req.name}{deadline}")


def _provisioned_verdict(facts: Facts, req: RequestFacts, deadline: str) -> Verdict:
    placement = facts.placement
    if facts.mode == FulfillmentMode.TRUST_PROVISIONED.value:
        return Verdict(True, "check", f"{req.name} is Provisioned; {_MARK_READY}")
    if placement is None:
        return Verdict(True, "nodes", f"{req.name} is Provisioned; the fit could not be computed")
    if placement.fits or req.phase == FULFILLED:
        return Verdict(True, "check", f"the whole gang fits on nodes that exist; {_MARK_READY}")
    return fit_verdict(placement, deadline)


_MARK_READY = "waiting for gangcheck to mark the check Ready (is the controller running?)"


def fit_verdict(placement: Placement, deadline: str = "") -> Verdict:
    """Provisioned, yet the gang does not fit: bad nodes, or too few of them so far."""
    arrived = placement.arrived
    idle = [n for n in arrived if n.members == 0 and n.kind]
    if arrived and len(idle) == len(arrived):
        return Verdict(True, "nodes", f"{_nodes(len(arrived))} arrived but {_none_can(idle)}")
    placeable = f"{placement.placeable} of {placement.total} members placeable"
    stuck = [n for n in idle if n.kind in STATIC_KINDS]
    if stuck:
        return Verdict(
            True,
            "nodes",
            f"{len(stuck)} of {len(arrived)} arrived nodes {_they_fail(stuck)}; {placeable}",
        )
    waiting = placeable if arrived else f"no node has arrived yet ({placeable})"
    not_ready = sum(1 for n in idle if n.kind == "not-ready")
    unready = f"; {_nodes(not_ready)} not Ready yet" if not_ready else ""
    return Verdict(True, "nodes", f"waiting for the autoscaler: {waiting}{unready}{deadline}")


def _none_can(idle: Sequence[NodeFit]) -> str:
    """How a group of nodes that took no member fails the gang, as the end of a sentence."""
    kinds = {n.kind for n in idle}
    one = len(idle) == 1
    if len(kinds) > 1:
        return f"none can take a member: {_reasons(idle)}"
    kind, first = kinds.pop(), idle[0]
    subjects = ", ".join(sorted({n.subject for n in idle if n.subject}))
    if kind == "taint":
        if len({n.subject for n in idle}) > 1:
            return f"none tolerates its taints ({subjects})"
        return f"it does not tolerate {subjects}" if one else f"none tolerates {subjects}"
    phrases = {
        "selector": (f"it lacks the labels the gang selects ({subjects})",
                     f"none has the labels the gang selects ({subjects})"),
        "affinity": ("it does not satisfy the gang's required node affinity",
                     "none satisfies the gang's required node affinity"),
        "not-ready": ("it is not Ready yet", "none is Ready yet"),
        "cordoned": ("it is cordoned", "all are cordoned"),
        "resources": (f"it has no room for a member ({first.reason})",
                      f"none has room for a member ({first.reason})"),
    }  # fmt: skip
    singular, plural = phrases.get(kind, (f"it is not usable: {first.reason}", ""))
    if kind == "affinity" and subjects:
        singular, plural = f"{singular} ({subjects})", f"{plural} ({subjects})"
    return singular if one else plural or f"none is usable: {_reasons(idle)}"


def _they_fail(nodes: Sequence[NodeFit]) -> str:
    """How some of the arrived nodes fail the gang, as a verb phrase in the plural."""
    kinds = {n.kind for n in nodes}
    subjects = ", ".join(sorted({n.subject for n in nodes if n.subject}))
    if len(kinds) > 1:
        return f"can take no member: {_reasons(nodes)}"
    phrases = {
        "taint": f"do not tolerate {subjects}",
        "selector": f"lack the labels the gang selects ({subjects})",
        "affinity": "fail the gang's required node affinity",
        "cordoned": "are cordoned",
    }
    return phrases.get(kinds.pop(), f"are not usable: {_reasons(nodes)}")


def _reasons(nodes: Sequence[NodeFit]) -> str:
    counts = Counter(n.short for n in nodes).most_common()
    counts.sort(key=lambda c: (-c[1], c[0]))
    return ", ".join(f"{short} ({count})" if count > 1 else short for short, count in counts)


def _nodes(count: int) -> str:
    return f"{count} node{'' if count == 1 else 's'}"


def until(what: str, when: datetime | None, now: datetime) -> str:
    """`, deadline in 4m` or `, deadline passed 10s ago` ("" without a time)."""
    if when is None:
        return ""
    left = (when - now).total_seconds()
    if left >= 0:
        return f", {what} in {human_duration(left)}"
    return f", {what} passed {human_duration(-left)} ago"


def human_duration(seconds: float) -> str:
    """42s, 6m30s, 2h5m, 3d4h: at most two units, rounded down."""
    total = max(0, math.floor(seconds))
    parts: list[str] = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        value, total = divmod(total, size)
        if value or parts:
            parts.append(f"{value}{unit}")
        if len(parts) == 2:
            break
    if len(parts) == 2 and parts[1].startswith("0"):
        parts.pop()
    return "".join(parts) or "0s"


# ---- one row of `gangcheck status` -------------------------------------------------------


@dataclass(frozen=True)
class GangRow:
    namespace: str
    name: str
    check: str
    state: str
    phase: str
    attempt: int
    request: str
    age_seconds: int | None
    arrived: int
    needed: int | None
    placeable: int | None
    total: int | None
    verdict: str
    kind: str = "Workload"
    """What declares the gang: Workload, PodGroup (scheduling.k8s.io) or
    PodGroup.scheduling.x-k8s.io."""
    members_note: str = ""
    """What the members column says when no fit was computed (a PodGroup's "2/4 exist")."""

    @property
    def nodes_cell(self) -> str:
        """Arrived of needed nodes; what is known when the need is not ("-": nothing)."""
        if self.needed is not None:
            return f"{self.arrived}/{self.needed}"
        return f"{self.arrived} arrived, none usable" if self.arrived else "-"

    @property
    def members_cell(self) -> str:
        """Placeable of the gang's members when a fit was computed, else what is known."""
        if self.placeable is not None and self.total is not None:
            return f"{self.placeable}/{self.total}"
        return self.members_note or "-"


def is_gang(workload: Obj, world: World) -> bool:
    """A Workload one of our checks cares about, or one a request of ours was made for."""
    wl = workload_of(workload)
    if set(wl.checks) & world.our_checks():
        return True
    return any(_request_of_workload(r, wl) for r in world.requests)


def _request_of_workload(req: Obj, wl: Workload) -> bool:
    meta = req.get("metadata") or {}
    owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
    annotated = (meta.get("annotations") or {}).get(WORKLOAD_UID_ANNOTATION)
    return meta.get("namespace") == wl.ref.namespace and wl.ref.uid in {annotated, *owners}


def gang_row(facts: Facts, now: datetime) -> GangRow:
    check = facts.focus_check
    placement, req = facts.placement, facts.request
    arrived = len(placement.arrived) if placement else 0
    created = facts.state.created
    return GangRow(
        namespace=facts.namespace,
        name=facts.name,
        check=facts.focus,
        state=check.state if check else "",
        phase=phase_of(facts),
        attempt=check.attempt if check else 0,
        request=req.name if req and req.found else "",
        age_seconds=int((now - created).total_seconds()) if created else None,
        arrived=arrived,
        needed=nodes_needed(placement),
        placeable=placement.placeable if placement else None,
        total=placement.total if placement else (req.members if req and req.found else None),
        verdict=verdict(facts, now).line,
    )


def phase_of(facts: Facts) -> str:
    """requested, provisioned, fulfilling, rolling back, ready, started (and the states
    around them: queued, backoff, pending, retrying, rejected, admitted, finished)."""
    st, check, req = facts.state, facts.focus_check, facts.request
    if st.finished is not None:
        return "finished"
    if st.admitted:
        return "started" if req is not None and req.phase == STARTED else "admitted"
    if not st.reserved:
        return "queued"
    if check is not None and check.state in (RETRY, REJECTED):
        return "retrying" if check.state == RETRY else "rejected"
    if req is not None and req.phase == ROLLING_BACK:
        return "rolling back"
    if (check is not None and check.state == READY) or (req is not None and req.phase == FULFILLED):
        return "ready"
    if req is None or not req.found:
        return "pending"
    if is_true(req.conditions, "Provisioned"):
        arrived = facts.placement.arrived if facts.placement else ()
        return "fulfilling" if arrived else "provisioned"
    return "requested"


def nodes_needed(placement: Placement | None) -> int | None:
    """Nodes the gang takes when it fits; else the nodes in use plus as many more of the
    same yield as the members left over need. None when no node takes a member."""
    if placement is None:
        return None
    used = [n.members for n in placement.nodes if n.members]
    if placement.fits:
        return len(used)
    if not used:
        return None
    left = placement.total - placement.placeable
    return len(used) + math.ceil(left / max(used))
