"""Explaining an attempt, for any gang source: the facts a diagnosis reads (the request, the
placement of the gang on the nodes it may use) and the words for where the attempt stands.

Pure. The gang sources' diagnoses (logic/workloads/diagnosis.py, logic/podgroups/
group_diagnosis.py) replay their source's `decide` on a live read (logic/sources/world.py
makes the read the capacity a decision reads) and say the step it returns with
`step_verdict`; a fit that leaves the gang waiting is said in the check message's own words
(`fulfillment.fit_words`, made on the nodes `assess` judges), then node by node (`fit_verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from gangcheck.logic.attempt import deletion, places
from gangcheck.logic.attempt.actions import Action, AnnotateRequest
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    arrived_for,
    claim_of,
    counted,
    fit_words,
    gang_of,
    hold_key,
    is_arrival_of,
    judged_views,
    level_wait,
    request_key,
    tolerating_hold,
)
from gangcheck.logic.attempt.hold import is_arriving
from gangcheck.logic.attempt.lifecycle import Progress, recorded_config
from gangcheck.logic.attempt.records import Outcome, Record
from gangcheck.logic.attempt.status import AttemptStatus, Phase, status_from
from gangcheck.logic.placement.dra import DraContext, Inventory
from gangcheck.logic.placement.fit import FitResult, Member, NodeView, member_from_template
from gangcheck.logic.placement.quantity import QuantityError
from gangcheck.logic.placement.reasons import Rejection
from gangcheck.logic.placement.topology import MissingLevel, fit_in_domains
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.model.names import (
    DEADLINE_ANNOTATION,
    DOMAIN_ANNOTATION,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    ROLLING_BACK,
)
from gangcheck.model.objects import (
    Condition,
    Flavor,
    Obj,
    ProvisioningRequest,
)

STATIC_KINDS = frozenset({"taint", "selector", "affinity", "cordoned", "unusable"})


@dataclass(frozen=True)
class World(ClusterView):
    """What a diagnosis reads, as the edge fetched it once: the capacity a decision reads
    (`ClusterView`: the nodes, the pods not finished, the DRA objects) and the objects around
    a gang (a Workload's or a PodGroup's)."""

    admission_checks: Mapping[str, Obj] = field(default_factory=dict)
    configs: Mapping[str, Obj] = field(default_factory=dict)
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    requests: tuple[Obj, ...] = ()
    """ProvisioningRequests gangcheck manages, in every namespace (in-flight claims)."""
    cluster_queues: Mapping[str, Obj] | None = None
    local_queues: Mapping[str, Obj] | None = None
    """Keyed `namespace/name`. None: not fetched (or not readable)."""


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
    class_name: str = ""
    """The request's provisioningClassName (which backend serves it)."""
    source: int = 0
    """Which of spec.capacitySources its ask went to."""
    source_name: str = ""
    """That source's name in the config its attempt recorded ("" when none is recorded)."""
    domain: str = ""
    """The topology domain its ask is scoped to (``level=value``), if any."""
    domains_tried: tuple[str, ...] = ()
    deleted_at: datetime | None = None
    """Its metadata.deletionTimestamp (None: not being deleted, or not readable)."""
    finalizers: tuple[str, ...] = ()
    kept_gone: tuple[str, ...] = ()
    """The nodes its rollback's outcome kept that no longer exist (`request_facts` with the
    nodes read)."""

    @property
    def status(self) -> AttemptStatus:
        """What the request's conditions say, as the decision reads them."""
        return status_from(self.conditions)

    @property
    def outcome_line(self) -> str:
        """What its rollback did, kept nodes gone since said gone ("" before it is done)."""
        return self.outcome.summary(gone=self.kept_gone) if self.outcome is not None else ""

    def deletion(self, now: datetime) -> str:
        """Its deletion, as the gang's message says it once past the grace (`deletion.line`:
        the finalizers that hold it, since when); within it, since when (or that it is being
        deleted); "" when it is not."""
        if not self.deleting:
            return ""
        stuck = deletion.line(self.name, self.finalizers, self.deleted_at, now)
        if stuck:
            return stuck
        since = f" since {format_time(self.deleted_at)}" if self.deleted_at else ""
        return f"ProvisioningRequest {self.name} is being deleted{since}"


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
    missing_level: MissingLevel | None = None
    """A required topology level none of the nodes carries (`summary` says it)."""

    @property
    def arrived(self) -> tuple[NodeFit, ...]:
        return tuple(n for n in self.nodes if n.arrived)


def node_names(world: ClusterView) -> set[str]:
    """The names of the nodes read: every node there is, as a diagnosis reads them."""
    return {str((n.get("metadata") or {}).get("name", "")) for n in world.nodes}


def request_facts(
    req: ProvisioningRequest | None,
    name: str,
    attempt: int,
    exists: Collection[str] | None = None,
) -> RequestFacts:
    """What the request named `name` says (found=False when there is none); with `exists`
    (the names of every node there is, `node_names`), which nodes its rollback kept are
    gone since."""
    if req is None:
        return RequestFacts(name=name, attempt=attempt, found=False)
    notes = req.annotations
    raw_outcome = notes.get(OUTCOME_ANNOTATION)
    outcome = Outcome.from_annotation(raw_outcome) if raw_outcome else None
    index, made = Record.of(notes).source, recorded_config(req)
    asked = made.source(index) if made is not None and made.capacity_sources else None
    return RequestFacts(
        name=name,
        attempt=attempt,
        conditions=dict(req.conditions),
        phase=notes.get(PHASE_ANNOTATION, ""),
        created=parse_time(req.creation_timestamp),
        deadline=parse_time(notes.get(DEADLINE_ANNOTATION, "")),
        rollback_reason=notes.get(ROLLBACK_REASON_ANNOTATION, ""),
        outcome=outcome,
        deleting=req.deleting,
        members=sum(p.count for p in req.pod_sets),
        class_name=req.class_name,
        source=index,
        source_name=asked.name if asked is not None else "",
        domain=notes.get(DOMAIN_ANNOTATION, ""),
        domains_tried=places.of_request(req).tried,
        deleted_at=parse_time(req.deletion_timestamp) if req.deleting else None,
        finalizers=req.finalizers,
        kept_gone=outcome.kept_gone(exists) if outcome and exists is not None else (),
    )


def place(
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    nodes: Collection[Obj],
    pods: Collection[Obj],
    *,
    request: ProvisioningRequest | None = None,
    in_flight: frozenset[str] = frozenset(),
    dra: tuple[DraContext, Inventory] | None = None,
    capacity: ClusterView | None = None,
    now: datetime | None = None,
) -> Placement | None:
    """Fit the gang on the nodes arrived for `request` (recorded, or new and unrecorded) and
    on the nodes its selectors match that no other in-flight request holds; with `dra`, its
    members' resource claims against the devices, as the controller fits them. With a
    request, the nodes are those the controller judges its fit on (`fulfillment.counted`,
    on `capacity`, else on `nodes` and `in_flight`)."""
    spec = GangSpec.of(gang)
    context, devices = dra if dra is not None else (None, None)
    try:
        members = [member_from_template(t, context) for _, _, t in spec.pod_sets]
        pod_sets = gang_of(spec.pod_sets, context)
        if request is not None:
            pod_sets = tolerating_hold(pod_sets, hold_key(request))
    except QuantityError:
        return None
    capacity = capacity or ClusterView(nodes=nodes, pods=pods, in_flight=in_flight)
    considered, views = _considered(capacity, members, request, now)
    fitted = fit_in_domains(
        pod_sets, views, capacity.bound(), spec.topology, together=spec.together, devices=devices
    )
    result = fitted.result
    fits = [_node_fit(node, arrived, recorded, result) for node, arrived, recorded in considered]
    fits.sort(key=lambda n: (not n.arrived, n.name))
    return Placement(
        placeable=result.placeable,
        total=result.total,
        fits=fitted.fits,
        nodes=tuple(fits),
        summary=fit_words(fitted, devices, sum(1 for n in fits if n.arrived)),
        missing_level=fitted.missing,
    )


def _considered(
    capacity: ClusterView,
    members: list[Member],
    request: ProvisioningRequest | None,
    now: datetime | None,
) -> tuple[list[tuple[Obj, bool, bool]], list[NodeView]]:
    """(node, arrived, recorded) for every node the gang may count, and the views the fit is
    judged on. With a request, those it counts or may claim as the controller partitions them
    (`fulfillment.judged_views`: a node still closed on arrival only once recorded, a new
    arrival as recording opens it, as `assess` fits them); without, every node no in-flight
    request keeps for its gang (as `fits_now`). Listed: shared nodes only where its selectors
    match (the others take no member, and the fit's words leave them out)."""

    def selected(node: Obj) -> bool:
        return any(is_selected(m, capacity.view(node)) for m in members)

    if request is None:
        free = [n for n in capacity.nodes if not (claim_of(n) and capacity.keeps(claim_of(n)))]
        return [(n, False, False) for n in free if selected(n)], [capacity.view(n) for n in free]
    key = request_key(request)
    base, candidates = counted(capacity, request, members, now)
    out = []
    for node in (n for n in base if not is_arriving(n)):
        if is_arrival_of(node, key, request.creation_timestamp):
            out.append((node, True, True))
        elif selected(node):
            out.append((node, False, False))
    listed = out + [(node, True, False) for node in candidates]
    return listed, judged_views(capacity, base, candidates)


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
    """(kind, subject) of a fit rejection, as the fit made it: `taint
    nvidia.com/gpu:NoSchedule not tolerated` is (taint, nvidia.com/gpu:NoSchedule); any
    other rejection is (unusable, its words)."""
    if rejection.kind:
        return rejection.kind, rejection.subject
    return "unusable", str(rejection)


@dataclass(frozen=True)
class Verdict:
    blocked: bool
    step: str
    """Where the chain breaks: workload, quota, check, request, nodes, start, admission."""
    reason: str

    @property
    def line(self) -> str:
        return f"{'blocked' if self.blocked else 'not blocked'}: {self.reason}"


def ended_verdict(req: RequestFacts, hint: str = "") -> Verdict | None:
    """The request failed, was revoked, or its booking expired: the autoscaler's word."""
    status = req.status
    phase = status.phase()
    if phase in (Phase.FAILED, Phase.REVOKED):
        what = "failed" if phase is Phase.FAILED else "revoked the capacity of"
        why = status.signal(phase).text
        return Verdict(True, "request", f"the autoscaler {what} {req.name}: {why}{hint}")
    if phase is Phase.EXPIRED:
        why = status.signal(phase).message or "booking expired"
        return Verdict(True, "request", f"the booking of {req.name} expired: {why}")
    return None


def moved_deadlines(actions: Sequence[Action]) -> dict[str, datetime]:
    """The deadlines a decision moves requests to, by request (a changed deadlineSeconds
    applies to the attempt in flight)."""
    out = {}
    for action in actions:
        if isinstance(action, AnnotateRequest):
            moved = parse_time(action.annotations.get(DEADLINE_ANNOTATION, ""))
            if moved is not None:
                out[action.name] = moved
    return out


def as_decided(req: RequestFacts | None, moved: Mapping[str, datetime]) -> RequestFacts | None:
    """The request as the decision goes by it: with the deadline it moved it to, if any."""
    if req is None or req.name not in moved:
        return req
    return replace(req, deadline=moved[req.name])


def deleting_verdict(req: RequestFacts, now: datetime) -> Verdict:
    """The attempt's request is being deleted: the gang waits for it to be gone (its next ask
    is made under its name); past the grace, in the line the gang's message says
    (deletion.line: the finalizers that hold it, since when)."""
    return Verdict(True, "request", req.deletion(now))


def step_verdict(
    progress: Progress | None,
    message: str,
    req: RequestFacts,
    now: datetime,
    *,
    hint: str = "",
    fits: Callable[[], Verdict],
    provisioned: Callable[[str], Verdict],
    waiting: Callable[[bool, str, str], Verdict],
) -> Verdict | None:
    """Where the decision replayed on the live read says the attempt stands (the lifecycle's
    progress, and the step's message), in one line; None when it followed no attempt.

    ROLLING_BACK / ROLLED_BACK: a rollback under way names its trigger and what it reclaimed;
    one that starts now names what triggers it (the backend's word when it ended the attempt).
    FAILED / REVOKED / EXPIRED: the backend's word. FITS: `fits()`. WAITING: provisioned, the
    fit (`provisioned(deadline)`), else `waiting(accepted, eta, deadline)` for the backend."""
    if progress in (Progress.ROLLING_BACK, Progress.ROLLED_BACK):
        if req.phase == ROLLING_BACK:
            done = f"; {req.outcome_line}" if req.outcome else ""
            why = req.rollback_reason or message
            return Verdict(True, "request", f"rolling back attempt {req.attempt}: {why}{done}")
        return ended_verdict(req, hint) or Verdict(
            True, "request", f"rolling back attempt {req.attempt}: {message}"
        )
    if progress in (Progress.FAILED, Progress.REVOKED, Progress.EXPIRED):
        return ended_verdict(req, hint) or Verdict(True, "request", f"{req.name}: {message}")
    if progress is Progress.FITS:
        return fits()
    if progress is None:
        return None
    deadline = until("deadline", req.deadline, now)
    phase = req.status.phase()
    if phase is Phase.PROVISIONED:
        return provisioned(deadline)
    return waiting(phase is Phase.ACCEPTED, req.status.note_text, deadline)


def fit_verdict(placement: Placement | None, req: RequestFacts, deadline: str = "") -> Verdict:
    """Provisioned (`req`), yet the gang does not fit: the fit in the words the check message
    says it in (`Placement.summary`, made by `fulfillment.fit_words`), after where it leaves
    the attempt: blocked on nodes that carry no required topology level (the fit's words say
    so first, counting the arrivals; the attempt waits its deadline, as the check message
    says), on arrived nodes that can take no member for a reason more time does not lift
    (every arrival takes none, or some fail on a taint, labels, affinity, a cordon), else
    waiting for the autoscaler (the deadline then). No placement: it could not be computed
    (a malformed quantity in the gang)."""
    if placement is None:
        return Verdict(True, "nodes", f"{req.name} is Provisioned; the fit could not be computed")
    arrived = placement.arrived
    idle = [n for n in arrived if n.members == 0 and n.kind]
    fit = placement.summary
    if placement.missing_level is not None and placement.nodes:
        wait = level_wait(placement.missing_level, len(arrived))
        return Verdict(True, "nodes", f"{fit}{_detail(idle)}{wait}{deadline}")
    if arrived and len(idle) == len(arrived):
        said = f"{_nodes(len(arrived))} arrived, none usable: {fit}{_detail(idle)}"
        return Verdict(True, "nodes", said)
    stuck = [n for n in idle if n.kind in STATIC_KINDS]
    if stuck:
        said = f"{_nodes(len(arrived))} arrived, {len(stuck)} not usable: {fit}{_detail(stuck)}"
        return Verdict(True, "nodes", said)
    waiting = "waiting for the autoscaler" + ("" if arrived else ", no node has arrived yet")
    return Verdict(True, "nodes", f"{waiting}: {fit}{deadline}")


def _detail(nodes: Sequence[NodeFit]) -> str:
    """The first of `nodes` whose reason says more than the fit's words group it by (the
    taint's value, the amounts short): `; node gpu-3: insufficient nvidia.com/gpu
    (requested 2, free 1)`."""
    said = next((n for n in nodes if n.reason and n.reason != n.short), None)
    return f"; node {said.name}: {said.reason}" if said else ""


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
    given: bool = False
    """The gang was given its capacity (admitted, released): no fit is computed, and
    `arrived` counts the nodes recorded for its request, the ones it was given."""
    claims_arrived: int | None = None
    claims_asked: int | None = None
    """Of an attempt served with NodeClaims (Karpenter), when they could be read."""

    @property
    def nodes_cell(self) -> str:
        """Arrived of needed nodes (of asked NodeClaims for a Karpenter attempt: ``1/4
        claims``); what is known when the need is not ("-": nothing)."""
        if self.claims_asked is not None:
            return f"{self.claims_arrived or 0}/{self.claims_asked} claims"
        if self.needed is not None:
            return f"{self.arrived}/{self.needed}"
        if self.given:
            return f"{self.arrived} arrived" if self.arrived else "-"
        return f"{self.arrived} arrived, none usable" if self.arrived else "-"

    @property
    def members_cell(self) -> str:
        """Placeable of the gang's members when a fit was computed, else what is known."""
        if self.placeable is not None and self.total is not None:
            return f"{self.placeable}/{self.total}"
        return self.members_note or "-"


def attempt_phase(
    req: RequestFacts | None, placement: Placement | None, progress: Progress | None = None
) -> str:
    """pending, rolling back, provisioned, fulfilling or requested: where the attempt is;
    `progress`: where the decision replayed on the read says it stands (a rollback it starts
    now is one)."""
    if req is None or not req.found:
        return "pending"
    if req.phase == ROLLING_BACK or progress in (Progress.ROLLING_BACK, Progress.ROLLED_BACK):
        return "rolling back"
    if req.status.has(Phase.PROVISIONED):
        return "fulfilling" if placement is not None and placement.arrived else "provisioned"
    return "requested"


def recorded_for(
    nodes: Collection[Obj], namespace: str, request: str, created: str | None = None
) -> int:
    """The nodes recorded as arrived for the request (``ARRIVED_FOR``, `arrived_for`: made
    at `created`, its creationTimestamp; None: unknown, every node recorded under its name)."""
    return len(arrived_for(nodes, f"{namespace}/{request}", created))


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
