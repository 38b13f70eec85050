"""Fulfillment, not promises: does the gang fit, whole, on nodes that exist right now?

Nodes are attributed to at most one in-flight request (the arrival ledger, kept on the Node as
``gangcheck.io/arrived-for: <namespace>/<request>``): a node proven younger than a request
(created in a later second, ``proven_younger``), unclaimed, that could host one of its
members is claimed for it. A request counts the nodes claimed for
it and the nodes no other in-flight request claims, so two gangs never count one node twice.
Once a request's gang has started (every member scheduled, the request marked ``Started``,
its hold lifted), what arrived for it and its members do not use is free capacity, counted
as capacity that predates a request is (never claimed again: the ledger keeps its first
record).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from gangcheck.logic.attempt.backend import AttemptRecord
from gangcheck.logic.attempt.hold import (
    as_opened,
    held_for_another,
    hold_toleration,
    is_arriving,
)
from gangcheck.logic.attempt.records import Record
from gangcheck.logic.attempt.status import AttemptStatus
from gangcheck.logic.placement.dra import DraContext, Inventory, build_inventory
from gangcheck.logic.placement.fit import (
    Bound,
    BoundUsage,
    GangPodSet,
    Member,
    NodeView,
    could_be_made_for,
    fit_gang,
    member_from_template,
    node_view,
    used_resources,
)
from gangcheck.logic.placement.reservations import Reservation, ReservedSplit, split_gang
from gangcheck.logic.placement.taints import toleration_of
from gangcheck.logic.placement.topology import (
    MissingLevel,
    TopologyFit,
    by_domain,
    fit_in_domains,
    pinned,
)
from gangcheck.logic.placement.usage import NodeUsage, deleting_claim_of
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import ARRIVED_FOR, HOLD_AS, PHASE_ANNOTATION, STARTED
from gangcheck.model.objects import Obj, Pod, pod_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec


@dataclass(frozen=True)
class Waiting:
    """An in-flight request still waiting for capacity, with its pod templates."""

    key: str
    templates: tuple[Obj, ...] = ()
    created: str = ""
    """The request's creationTimestamp: only nodes younger than it arrived for it."""
    gone: bool = False
    """Kept open after its gang went (lifecycle.promise, GANG_GONE_ANNOTATION): it claims
    last, after every live gang, whatever its age."""


class DeviceSource(Protocol):
    """Where a fit's DRA inputs come from when kept current from events."""

    def dra(self, namespace: str) -> tuple[DraContext, Inventory]: ...


@dataclass(frozen=True)
class ClusterView:
    """The nodes and pods the caches hold, and which requests are in flight (`ns/name`)."""

    nodes: Collection[Obj] = ()
    pods: Collection[Obj] = ()
    in_flight: Set[str] = frozenset()
    started: Callable[[str], bool] = lambda _key: False
    """Whether the in-flight request `ns/name` is marked ``Started`` (its gang's every member
    scheduled once): the nodes that arrived for it are no longer its alone (`_partition`)."""
    waiting: tuple[Waiting, ...] = ()
    """In-flight requests not yet fulfilled, oldest first: the order new nodes are claimed in."""
    claim_grace_seconds: float = 15.0
    device_classes: tuple[Obj, ...] = ()
    resource_slices: tuple[Obj, ...] = ()
    resource_claims: tuple[Obj, ...] = ()
    claim_templates: tuple[Obj, ...] = ()
    """DRA objects: what a gang's ResourceClaimTemplates ask is counted against the devices
    the ResourceSlices publish, less what allocated claims hold."""
    node_claims: tuple[Obj, ...] = ()
    """Karpenter NodeClaims: a node whose claim is being deleted is going (read when
    `cluster` is not set; `cluster` keeps them itself)."""
    cluster: NodeUsage | None = None
    """Node views and what bound pods use, kept current from events: when set, fits read
    them instead of parsing `nodes` and `pods` again."""
    devices: DeviceSource | None = None
    """When set, the DRA inputs kept current from events, instead of the objects above."""
    nodes_current: bool = True
    """Whether `nodes` can be taken to hold every node that exists: false while the node
    cache may miss changes (its watch failed and has not been answered again long enough)."""

    def keeps(self, owner: str) -> bool:
        """Whether the nodes recorded as arrived for the request `owner` (`ns/name`) are its
        gang's alone: the request is in flight and its gang has not started."""
        return owner in self.in_flight and not self.started(owner)

    def view(self, node: Obj) -> NodeView:
        if self.cluster is not None:
            return self.cluster.view_of(node)
        return node_view(node, deleting_claim=self.deleting_claim(node))

    def deleting_claim(self, node: Obj) -> str:
        """The node's Karpenter NodeClaim being deleted ("": none)."""
        if self.cluster is not None:
            return self.cluster.deleting_claim_of(node)
        return deleting_claim_of(node, self.node_claims) if self.node_claims else ""

    def views(self) -> Collection[NodeView]:
        """Views of all `nodes`: the ones kept, or parsed now."""
        if self.cluster is not None:
            return self.cluster.node_views()
        return [self.view(n) for n in self.nodes]

    def bound(self) -> Bound:
        """What the bound pods use: kept current, or the pods to sum."""
        return self.cluster.usage() if self.cluster is not None else self.pods

    def dra(self, namespace: str) -> tuple[DraContext, Inventory]:
        """The namespace's claim templates and claims, and the cluster's devices."""
        if self.devices is not None:
            return self.devices.dra(namespace)

        def here(objs: Collection[Obj]) -> list[Obj]:
            return [o for o in objs if (o.get("metadata") or {}).get("namespace") == namespace]

        context = DraContext.of(here(self.claim_templates), here(self.resource_claims))
        inventory = build_inventory(self.resource_slices, self.device_classes, self.resource_claims)
        return context, inventory


@dataclass(frozen=True)
class GangSpec:
    """What a gang asks of nodes: its pod sets as (name, count, pod template), and the
    pod sets that must sit inside one domain of a topology level (pod set -> label key)."""

    pod_sets: tuple[tuple[str, int, Obj], ...]
    topology: Mapping[str, str] = field(default_factory=dict)
    together: str = ""
    namespace: str = ""
    """Where the gang's pods live: their ResourceClaimTemplates are looked up there."""
    """A level key the whole gang must sit inside one domain of (a PodGroup's topology)."""

    @classmethod
    def of(cls, gang: Sequence[tuple[str, int, Obj]] | GangSpec) -> GangSpec:
        return gang if isinstance(gang, GangSpec) else cls(tuple(gang))


@dataclass(frozen=True)
class Fulfillment:
    fits: bool
    summary: str
    placeable: int
    total: int
    claims: tuple[tuple[str, str], ...] = ()
    """(name, resourceVersion) of nodes to record as arrived for this request now."""
    arrived: tuple[str, ...] = ()
    """Nodes recorded (or being recorded) as arrived for this request."""
    domains: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """The topology domain each constrained pod set is pinned to: (label key, value)."""
    missing_level: MissingLevel | None = None
    """A required topology level no node the gang may use carries (`summary` says it)."""
    arrivals: int = 0
    """How many nodes arrived for the request, recorded or not (`summary` counts them)."""


def marked_started(request: Obj | None) -> bool:
    """Whether a request (as the API holds it) is marked ``Started``: its gang's every member
    was scheduled (`ClusterView.started`)."""
    meta = (request or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(PHASE_ANNOTATION) == STARTED


def started_keys(requests: Iterable[Obj]) -> frozenset[str]:
    """`ns/name` of the requests marked ``Started``."""
    return frozenset(
        f"{r['metadata'].get('namespace', '')}/{r['metadata'].get('name', '')}"
        for r in requests
        if marked_started(r)
    )


def request_key(req: AttemptRecord) -> str:
    return f"{req.ref.namespace}/{req.name}"


def held_as(req: AttemptRecord) -> str:
    """The other request whose hold this request's arrivals carry (``HOLD_AS``: a workload
    slice's arrivals are held as the Job's pods tolerate), or '' for its own."""
    return req.annotations.get(HOLD_AS, "")


def hold_key(req: AttemptRecord) -> str:
    """The request whose hold this request's arrivals carry: `held_as`, else its own."""
    return held_as(req) or request_key(req)


def claim_of(node: Obj) -> str:
    return str((node.get("metadata", {}).get("annotations") or {}).get(ARRIVED_FOR, ""))


def arrived_for(nodes: Iterable[Obj], request: str, created: str | datetime | None) -> list[Obj]:
    """The nodes that arrived for the request (`namespace/name`, made at `created`, its
    creationTimestamp): those the arrival ledger records for it (`is_arrival_of`)."""
    return [n for n in nodes if is_arrival_of(n, request, created)]


def is_arrival_of(node: Obj, request: str, created: str | datetime | None) -> bool:
    """Did the node arrive for the request (`namespace/name`, made at `created`)?

    The ledger records a request's name, and names come again: an attempt Kueue admits
    again after an eviction has the name of the earlier one (attempt/naming.py). A node
    recorded under the name arrived for this request only if it is not older than it
    (`proven_older`, whole seconds; a time unknown proves nothing): one that arrived for an
    earlier request of the name, kept by a safety rule or still being deleted, is not this
    one's to count, record for its rollback, or say reclaimed. The one reading of the ledger
    for a request (`arrived_for`); the reclaim's own rule (`proven_younger`) stays beside it."""
    if claim_of(node) != request:
        return False
    when = parse_time(created) if isinstance(created, str) else created
    return not proven_older(node, when)


def gang_of(
    pod_sets: Sequence[tuple[str, int, Obj]], dra: DraContext | None = None
) -> list[GangPodSet]:
    return [
        GangPodSet(name, count, member_from_template(tpl, dra)) for name, count, tpl in pod_sets
    ]


def assess(
    capacity: ClusterView | None,
    req: AttemptRecord,
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    now: datetime | None = None,
) -> Fulfillment:
    """Whether the gang fits on the nodes this request may count, and which nodes to claim.

    New arrivals are claimed one at a time, only until the gang fits, so a node the gang does
    not need stays free for the next one. An arrival not usable yet (not Ready, no allocatable
    reported) is claimed once it is, and one that can take no member as it is (a taint the
    gang does not tolerate, such as the not-ready taint not lifted yet, or pods of others bound
    to it already) is not claimed: claimed, it would take none of the gang's members and the
    next arrival, perhaps another gang's, would be claimed in its place. It still counts in
    the message, which says why it takes none. A rollback records every arrival left
    (`unrecorded_arrivals`).
    """
    capacity, spec = capacity or ClusterView(), GangSpec.of(gang)
    context, devices = capacity.dra(req.ref.namespace)
    pod_sets = tolerating_hold(gang_of(spec.pod_sets, context), hold_key(req))
    base, candidates = _partition(capacity, req, [g.member for g in pod_sets], now)
    views = judged_views(capacity, base)
    bound = capacity.bound()

    def fit() -> TopologyFit:
        return fit_in_domains(
            pod_sets, views, bound, spec.topology, together=spec.together, devices=devices
        )

    result = fit()
    claims: list[Obj] = []
    passed_over = False
    for node in candidates:
        if result.fits:
            break
        view = arrival_view(node, capacity)
        views.append(view)  # one passed over takes no member: there, only to say why not
        if not view.is_usable or not takes_a_member(pod_sets, view, bound, devices):
            passed_over = True
            continue
        claims.append(node)
        result = fit()
    if passed_over and not result.fits:
        result = fit()  # the message names why the arrivals passed over take no member
    key = request_key(req)
    created = req.creation_timestamp
    arrived = {n["metadata"]["name"] for n in base if is_arrival_of(n, key, created)}
    came = arrived | {n["metadata"]["name"] for n in candidates}
    return _fulfillment(
        result,
        devices,
        claims=tuple(
            (n["metadata"]["name"], n["metadata"].get("resourceVersion", "")) for n in claims
        ),
        arrived=tuple(sorted(arrived | {n["metadata"]["name"] for n in claims})),
        arrivals=len(came),
    )


def strays(
    capacity: ClusterView | None, req: AttemptRecord, nodes: Collection[str]
) -> tuple[Pod, ...]:
    """Pods of others bound to nodes that arrived for this request: neither consuming it (the
    gang's own members do) nor a DaemonSet's, not finished. A pod tolerating every taint can
    land on a held node (docs/capacity-hold.md)."""
    if capacity is None or not nodes:
        return ()
    found = []
    for obj in capacity.pods:
        if (obj.get("spec") or {}).get("nodeName") not in nodes:
            continue
        pod = pod_of(obj)
        if pod.live and not pod.daemonset and pod.consumes != req.name:
            found.append(pod)
    return tuple(sorted(found, key=lambda p: (p.node_name, p.ref.namespace, p.name)))


def fits_without(
    capacity: ClusterView,
    req: AttemptRecord,
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    others: Collection[Pod],
    now: datetime | None = None,
) -> bool:
    """Whether the gang would fit on the nodes this request counts were `others` not bound
    there (read from the pods themselves: a case rare enough to parse them)."""
    gone = {(p.ref.namespace, p.name) for p in others}
    pods = tuple(
        p
        for p in capacity.pods
        if ((p.get("metadata") or {}).get("namespace"), (p.get("metadata") or {}).get("name"))
        not in gone
    )
    return assess(replace(capacity, pods=pods, cluster=None), req, gang, now).fits


def takes_a_member(
    pod_sets: Sequence[GangPodSet], view: NodeView, bound: Bound, devices: Inventory
) -> bool:
    """Whether the node, with what is bound to it already, can take a member of the gang."""
    return fit_gang(pod_sets, [view], bound, devices).placeable > 0


def unrecorded_arrivals(
    capacity: ClusterView | None,
    req: AttemptRecord,
    gang: Sequence[tuple[str, int, Obj]] | GangSpec,
    now: datetime | None = None,
) -> tuple[tuple[str, str], ...]:
    """(name, resourceVersion) of every arrival this request may claim and has not recorded,
    usable or not (a node going, being deleted or its NodeClaim, is none: `_partition`):
    what a rollback records before it reclaims."""
    capacity, spec = capacity or ClusterView(), GangSpec.of(gang)
    context, _ = capacity.dra(req.ref.namespace)
    members = [g.member for g in gang_of(spec.pod_sets, context)]
    _, candidates = _partition(capacity, req, members, now)
    return tuple(
        (n["metadata"]["name"], n["metadata"].get("resourceVersion", "")) for n in candidates
    )


def tolerating_hold(pod_sets: list[GangPodSet], key: str) -> list[GangPodSet]:
    """The gang's members as they will run: tolerating the hold on the nodes held for them."""
    hold = toleration_of(hold_toleration(key))
    return [
        replace(p, member=replace(p.member, tolerations=(*p.member.tolerations, hold)))
        for p in pod_sets
    ]


def fits_now(capacity: ClusterView | None, gang: GangSpec) -> Fulfillment:
    """Whether the gang fits, with no request, on the nodes no in-flight request claims."""
    capacity = capacity or ClusterView()
    free, pod_sets, devices = _unclaimed(capacity, gang)
    fitted = fit_in_domains(
        pod_sets, free, capacity.bound(), gang.topology, together=gang.together, devices=devices
    )
    return _fulfillment(fitted, devices)


def placeable_by_domain(
    capacity: ClusterView | None, gang: GangSpec, level: str, values: Collection[str]
) -> dict[str, int] | None:
    """How many of the gang's members fit now in each domain (`values`) of `level`, every pod
    set kept inside it: the `placeable` of `fits_now` of the gang pinned there, each domain
    read on its own unclaimed nodes (the usable ones, `by_domain`), since no other node may
    take a member pinned to it.
    Read so, a level with one domain per node (``kubernetes.io/hostname``, a tenant's
    choice) costs one read of each node, not one of every node per domain (nodes² a look:
    seconds of the controller's one event loop at a thousand nodes). None when a pod set
    with members is not kept inside the level (a Workload's pod set that names none): its
    members may go to any node, so only the fit over all of them tells."""
    kept = {n for n, _, _ in gang.pod_sets} if gang.together == level else set()
    kept |= {name for name, key in gang.topology.items() if key == level}
    if any(count > 0 and name not in kept for name, count, _ in gang.pod_sets):
        return None
    capacity = capacity or ClusterView()
    free, pod_sets, devices = _unclaimed(capacity, gang)
    bound = capacity.bound()
    if not isinstance(bound, BoundUsage):  # the pods summed once, not once per domain
        bound = BoundUsage(by_node=used_resources(bound))
    by_value = by_domain(free, level)
    return {
        value: fit_gang(
            [pinned(ps, level, value) for ps in pod_sets], by_value.get(value, []), bound, devices
        ).placeable
        for value in values
    }


def judged_views(
    capacity: ClusterView, base: Collection[Obj], arrivals: Collection[Obj] = ()
) -> list[NodeView]:
    """The nodes a request's fit is judged on: those it counts already (`counted`), but for
    one still closed on arrival (it counts only once this request records it, which opens
    it), then the new `arrivals` as they will be once recorded. `assess` adds the arrivals
    one at a time while the gang does not fit: one that does not fit in the end has them all."""
    views = [capacity.view(n) for n in base if not is_arriving(n)]
    return views + [arrival_view(n, capacity) for n in arrivals]


def arrival_view(node: Obj, capacity: ClusterView | None = None) -> NodeView:
    """A new arrival as a fit sees it: opened, as recording it for the request will leave it
    (and going, as any node, when its NodeClaim is being deleted)."""
    claim = capacity.deleting_claim(node) if capacity is not None else ""
    return node_view(as_opened(node), deleting_claim=claim)


def fit_words(result: TopologyFit, devices: Inventory | None = None, arrived: int = 0) -> str:
    """The words of a fit, the one place they are made: how many members are placeable (on
    how many nodes, in which topology domains), and why the nodes that take none take none
    (a taint not tolerated, labels missing, not Ready, cordoned, being deleted or its NodeClaim
    being deleted, no room), then the first
    device problem of a gang that does not fit. The check message (the Workload's, the
    PodGroup's) says a fit in these words, and `gangcheck diagnose` says the same fit in them
    (explain.fit_verdict) before its node-by-node detail. A required topology level no node
    carries is said first, with how many of the nodes `arrived` for the attempt (the
    autoscaler delivered them without it)."""
    words = result.summary(arrived)
    if not result.fits and devices is not None and devices.problems:
        words += f"; {devices.problems[0]}"
    return words


def level_wait(missing: MissingLevel | None, arrivals: int) -> str:
    """What a Provisioned attempt whose `arrivals` all lack a required topology level says
    it does: it waits out its deadline, as any fit that does not pass, since a node labeller
    may add the label shortly after a node registers ("" when none arrived or no level is
    missing)."""
    return "; waiting until the deadline in case they are labelled" if missing and arrivals else ""


def _fulfillment(
    result: TopologyFit,
    devices: Inventory,
    claims: tuple[tuple[str, str], ...] = (),
    arrived: tuple[str, ...] = (),
    arrivals: int = 0,
) -> Fulfillment:
    return Fulfillment(
        fits=result.fits,
        summary=fit_words(result, devices, arrivals),
        placeable=result.result.placeable,
        total=result.result.total,
        claims=claims,
        arrived=arrived,
        domains=dict(result.domains) if result.fits else {},
        missing_level=result.missing,
        arrivals=arrivals,
    )


def counted(
    capacity: ClusterView, req: AttemptRecord, members: list[Member], now: datetime | None
) -> tuple[list[Obj], list[Obj]]:
    """(nodes the request counts already, new arrivals it may claim in order): the nodes a
    fit of its gang is judged on (`assess`), and a diagnosis explains (explain.place)."""
    return _partition(capacity, req, members, now)


def _partition(
    capacity: ClusterView, req: AttemptRecord, members: list[Member], now: datetime | None
) -> tuple[list[Obj], list[Obj]]:
    """(nodes the request counts already, new arrivals it may claim in order)."""
    key, created = request_key(req), parse_time(req.creation_timestamp)
    base, candidates = [], []
    for node in capacity.nodes:
        owner = claim_of(node)
        if is_arrival_of(node, key, created):
            base.append(node)
        elif owner and owner != key and capacity.keeps(owner):
            continue  # another gang's arrival
        elif owner and owner != key and owner in capacity.in_flight:
            # a started gang's arrival: what its members leave is free, as capacity that
            # predates the request is (never claimed again); not while its hold is still on
            if not held_for_another(node, key):
                base.append(node)
        elif not is_new_arrival(node, created, members, view=capacity.view):
            # capacity that predates the request, shared by all (one recorded for an earlier
            # request of this name too: older than this one, not its arrival)
            base.append(node)
        elif held_for_another(node, key):
            continue  # another gang's arrival, not recorded yet: never this one's to claim
        elif capacity.view(node).is_going:
            base.append(node)  # going (reclaimed, scaled down): no arrival, the fit says why
        elif _may_claim(capacity, key, node, now):
            candidates.append(node)
    return base, sorted(candidates, key=_arrival_order)


def _may_claim(capacity: ClusterView, key: str, node: Obj, now: datetime | None) -> bool:
    """Older waiting requests the node could serve claim it first; after a grace, anyone may.
    A request kept for a gang that is gone is no older one: its gang claims last."""
    view = capacity.view(node)
    for older in capacity.waiting:
        if older.key == key:
            return True
        if older.gone:
            continue
        if any(could_be_made_for(member_from_template(t), view) for t in older.templates):
            born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
            waited = (now - born).total_seconds() if born and now else 0.0
            return waited >= capacity.claim_grace_seconds
    return True


def _arrival_order(node: Obj) -> tuple[str, str]:
    meta = node.get("metadata", {})
    return (str(meta.get("creationTimestamp", "")), str(meta.get("name", "")))


def proven_younger(node: Obj, request_created: datetime | None) -> bool:
    """Was the node created after the request, provably?

    creationTimestamp has whole-second resolution: a node stamped in the same second as the
    request may predate it by most of a second, so only a strictly later second proves it
    younger. The one age rule for claiming a node as arrived and for reclaiming it.
    """
    return _seconds_apart(node, request_created) > 0


def proven_older(node: Obj, request_created: datetime | None) -> bool:
    """Was the node created before the request, provably (a strictly earlier second)?"""
    return _seconds_apart(node, request_created) < 0


def _seconds_apart(node: Obj, request_created: datetime | None) -> int:
    """The node's creation second against the request's: > 0 later, < 0 earlier, 0 the same
    second or either unknown (whole seconds: creationTimestamp's resolution)."""
    born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
    if born is None or request_created is None:
        return 0
    apart = born.replace(microsecond=0) - request_created.replace(microsecond=0)
    return (apart.total_seconds() > 0) - (apart.total_seconds() < 0)


def is_new_arrival(
    node: Obj,
    request_created: datetime | None,
    members: list[Member],
    *,
    view: Callable[[Obj], NodeView] = node_view,
) -> bool:
    """Proven younger than the request, and made of what one of its members needs."""
    if not proven_younger(node, request_created):
        return False
    view_of: NodeView = view(node)
    return any(could_be_made_for(m, view_of) for m in members)


def reserved_split(
    capacity: ClusterView | None, gang: GangSpec, reservations: Sequence[Reservation]
) -> ReservedSplit:
    """How much of the gang the reserved nodes no in-flight request claims can take now."""
    capacity = capacity or ClusterView()
    free, pod_sets, devices = _unclaimed(capacity, gang)
    return split_gang(pod_sets, free, capacity.bound(), reservations, devices)


def _unclaimed(
    capacity: ClusterView, gang: GangSpec
) -> tuple[list[NodeView], list[GangPodSet], Inventory]:
    """The nodes no in-flight request keeps for its gang (`ClusterView.keeps`), the gang's
    pod sets, and the devices."""
    free = list(capacity.views())
    if capacity.in_flight:  # else no node can be claimed: nothing to look for
        free = [
            view
            for view in free
            if not (owner := view.annotations.get(ARRIVED_FOR)) or not capacity.keeps(owner)
        ]
    context, devices = capacity.dra(gang.namespace)
    return free, gang_of(gang.pod_sets, context), devices


def reservations_of(config: AtomicProvisioningSpec) -> tuple[Reservation, ...]:
    return tuple(Reservation(r.name, r.node_labels, r.nodes) for r in config.reservations)


def capacity_used(req: AttemptRecord) -> dict[str, int]:
    """A fulfilled request's gang by capacity: reserved (placed before asking) and new."""
    reserved = Record.of(req.annotations).reserved
    used = {"new": sum(p.count for p in req.pod_sets)}
    return {**used, "reserved": reserved} if reserved else used


DRA_HINT = (
    "; the gang uses DRA resource claims, which cluster-autoscaler cannot size for a "
    "ProvisioningRequest (kubernetes/autoscaler#10065): capacity must come from nodes that "
    "exist or another provisioner"
)


def dra_hint(status: AttemptStatus, gang: GangSpec) -> str:
    """Said when the autoscaler found no capacity for a gang that uses DRA claims: it cannot
    size them (kubernetes/autoscaler#10065), so waiting would be silent and endless."""
    not_found = status.capacity_not_found
    uses_dra = any((tpl.get("spec") or {}).get("resourceClaims") for _, _, tpl in gang.pod_sets)
    return DRA_HINT if not_found and uses_dra else ""
