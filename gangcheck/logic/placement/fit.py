"""Does a gang fit, whole, on the nodes that exist, as kube-scheduler would see them?

Inputs are raw API dicts: Node objects, bound Pod objects, and pod template specs.

What is checked, per member and node, in the order the reasons are reported:
- the node is usable: not being deleted (`metadata.deletionTimestamp`), nor its Karpenter
  NodeClaim (`node_view`'s `deleting_claim`: Karpenter deletes the Node only after the claim,
  and taints it `karpenter.sh/disrupted:NoSchedule` only after that, so until then the Node
  itself looks usable though it is going), allocatable present and well formed, every taint
  effect known, condition Ready=True, not cordoned (`spec.unschedulable`; a member tolerating
  the `node.kubernetes.io/unschedulable` taint is not let through, unlike kube-scheduler);
- `nodeSelector` labels; required node affinity (`nodeSelectorTerms` ORed, requirements
  in a term ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt on labels; In, NotIn on the
  `metadata.name` field; a term with nothing in it, or anything invalid, matches nothing);
- NoSchedule and NoExecute taints tolerated (Equal and Exists; PreferNoSchedule never
  blocks; toleration operators newer than Equal/Exists tolerate nothing);
- requests, resource by resource, against allocatable minus what bound pods request; the
  `pods` count included;
- DRA claims (when the member was built with a `DraContext`): every claim allocatable from
  the devices the node reaches, given what allocated ResourceClaims and the members placed
  before hold (see `gangcheck.logic.placement.dra`).

A member's requests are kube-scheduler's: limits copied into missing requests (as Kueue
does for its templates), then max(sum of containers + restartable "sidecar" init
containers, peak of the init sequence), pod-level `spec.resources` overriding the resources
it names, plus `spec.overhead`, plus one `pods`. Not modelled: topology, host ports, volumes,
pod (anti-)affinity, resized pods' allocated resources.

Placement is a heuristic: it never reports a placement that is not feasible, but may miss
one that is. Pod sets are taken in descending order of demand (extended resources, then
cpu, then memory: an order fixed by the members alone); each pod set's members go to the
eligible nodes best fit first (least room left after one member, as shares of allocatable;
ties by node name), each node filled as far as it goes. When that order leaves members over
and the gang has at most four pod sets, every other order is tried too, and the first that
fits, or else the one placing most, is reported. What this guarantees: with one pod set
the count placed is the exact maximum; with one or two pod sets, adding a node never
places fewer. Lifting a constraint (a taint, a selector) can, with two or more pod sets,
place fewer: a member newly allowed on a node may take the room another pod set had there.

With DRA claims, a pod set's members are allocated devices one by one, node by node, and its
nodes are taken fewest members first (then best fit as above): devices a node reaches may be
reachable from other nodes too (`allNodes`, node selectors), so what one node takes another
no longer has. Devices count in the demand order as extended resources do. When such a gang
does not fit, the nodes in use are named too (`in_use_reasons`): devices are not on the
Node, so "no room" alone would not say which claim is short.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field

from gangcheck.logic.placement.dra import (
    ClaimNeeds,
    DeviceRoom,
    DraContext,
    Inventory,
    NodeDevices,
    NodeScope,
    Shortfall,
    Usage,
    allocate,
    most_members,
)
from gangcheck.logic.placement.quantity import (
    NANO,
    QuantityError,
    format_resource,
    parse_quantity,
)
from gangcheck.logic.placement.raw import dict_at, list_at
from gangcheck.logic.placement.reasons import Rejection
from gangcheck.logic.placement.taints import Taint, Toleration, taint_of, toleration_of
from gangcheck.model.objects import ReadOnlyObj as Obj
from gangcheck.model.objects import is_finished

Resources = Mapping[str, int]

PODS = "pods"
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
KNOWN_EFFECTS = BLOCKING_EFFECTS | {"PreferNoSchedule"}
STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", PODS})
SUMMARY_LIMIT = 300
MAX_ORDERS_TRIED_POD_SETS = 4


# --- taints, tolerations, selectors ----------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One NodeSelectorRequirement: `key operator values`."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator in ("Gt", "Lt"):
            return self._compares(value)
        return {
            "In": value is not None and value in self.values,
            "NotIn": value is None or value not in self.values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }.get(self.operator, False)

    def _compares(self, value: str | None) -> bool:
        if value is None or len(self.values) != 1:
            return False
        have, bound = _as_int(value), _as_int(self.values[0])
        if have is None or bound is None:
            return False
        return have > bound if self.operator == "Gt" else have < bound

    def __str__(self) -> str:
        values = f" [{', '.join(self.values)}]" if self.values else ""
        return f"{self.key} {self.operator}{values}"


@dataclass(frozen=True)
class SelectorTerm:
    """One nodeSelectorTerm: all its expressions (labels) and fields (node name) must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def first_failure(self, node: NodeView) -> Requirement | None:
        """The first requirement `node` fails; an empty term fails everything."""
        if not self.expressions and not self.fields:
            return Requirement("(empty term)", "matches nothing")
        names = {"metadata.name": node.name}
        for req in self.expressions:
            if not req.matches(node.labels):
                return req
        for req in self.fields:
            if req.key not in names or req.operator not in ("In", "NotIn"):
                return req
            if not req.matches(names):
                return req
        return None


# --- members ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """What one member of a pod set asks of a node. `affinity` None: no required affinity.
    `devices`: its DRA claims (empty: none, or not modelled)."""

    requests: Resources
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[SelectorTerm, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    devices: ClaimNeeds = field(default_factory=ClaimNeeds)


@dataclass(frozen=True)
class GangPodSet:
    """A pod set of the gang: `count` identical members. A (name, count, member) tuple works."""

    name: str
    count: int
    member: Member


def member_from_template(template: Obj, dra: DraContext | None = None) -> Member:
    """The member a PodTemplateSpec (`{metadata, spec}`) describes (see member_from_pod_spec)."""
    return member_from_pod_spec(dict_at(template, "spec"), dra)


def member_from_pod_spec(spec: Obj, dra: DraContext | None = None) -> Member:
    """The member a pod spec describes; QuantityError on a malformed request.

    `dra`: the namespace's ResourceClaimTemplates and ResourceClaims; without it the pod's
    `resourceClaims` are not modelled (the member asks for no device).
    """
    return Member(
        requests=pod_requests(spec),
        node_selector={str(k): str(v) for k, v in dict_at(spec, "nodeSelector").items()},
        affinity=_required_affinity(spec),
        tolerations=tuple(toleration_of(t) for t in list_at(spec, "tolerations")),
        devices=dra.needs(spec) if dra is not None else ClaimNeeds(),
    )


def pod_requests(spec: Obj) -> dict[str, int]:
    """Effective requests of a pod spec, as kube-scheduler counts them (see module doc)."""
    containers = _total(_container_requests(c) for c in list_at(spec, "containers"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in list_at(spec, "initContainers"):
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            sidecars = _total([sidecars, requests])
            init_peak = _peak([init_peak, sidecars])
        else:
            init_peak = _peak([init_peak, _total([sidecars, requests])])
    effective = _peak([_total([containers, sidecars]), init_peak])
    effective.update(_container_requests(spec))
    return _total([effective, _parse_resources(dict_at(spec, "overhead")), {PODS: NANO}])


def _container_requests(container: Obj) -> dict[str, int]:
    """Requests of a container (or of a pod's `spec.resources`), limits filling the gaps."""
    resources = dict_at(container, "resources")
    return _parse_resources({**dict_at(resources, "limits"), **dict_at(resources, "requests")})


def _required_affinity(spec: Obj) -> tuple[SelectorTerm, ...] | None:
    node_affinity = dict_at(dict_at(spec, "affinity"), "nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    return tuple(_selector_term(t) for t in list_at(required, "nodeSelectorTerms"))


def _selector_term(term: Obj) -> SelectorTerm:
    return SelectorTerm(
        expressions=tuple(_requirement(r) for r in list_at(term, "matchExpressions")),
        fields=tuple(_requirement(r) for r in list_at(term, "matchFields")),
    )


def _requirement(raw: Obj) -> Requirement:
    values = raw.get("values")
    values = tuple(str(v) for v in values) if isinstance(values, list) else ()
    return Requirement(str(raw.get("key") or ""), str(raw.get("operator") or ""), values)


# --- nodes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """What fit needs of a Node. `problem` set: unusable for everyone, and why."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Resources = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    created: str = ""
    problem: Rejection | None = None

    @property
    def is_usable(self) -> bool:
        return self.problem is None

    @property
    def is_going(self) -> bool:
        """Being deleted, or its Karpenter NodeClaim is (`node_view`'s `deleting_claim`):
        capacity on its way out, whatever else is said of it."""
        return self.problem is not None and self.problem.kind in (DELETING, CLAIM_DELETING)


def node_view(node: Obj, *, deleting_claim: str = "") -> NodeView:
    """A NodeView of a Node dict; malformed data makes it unusable, never usable.

    `deleting_claim`: the name of the node's Karpenter NodeClaim when that claim is being
    deleted (`gangcheck.logic.placement.usage.deleting_claim_of`): the node is going too.
    """
    meta, spec, status = dict_at(node, "metadata"), dict_at(node, "spec"), dict_at(node, "status")
    taints = tuple(taint_of(t) for t in list_at(spec, "taints"))
    allocatable, malformed = _parse_allocatable(dict_at(status, "allocatable"))
    ready, unschedulable = _is_ready(status), bool(spec.get("unschedulable"))
    problem = (
        _deletion_problem(meta, deleting_claim)
        or malformed
        or _node_problem(status, taints, ready=ready, cordoned=unschedulable)
    )
    return NodeView(
        name=str(meta.get("name") or ""),
        labels=_strings(dict_at(meta, "labels")),
        annotations=_strings(dict_at(meta, "annotations")),
        taints=taints,
        allocatable=allocatable,
        ready=ready,
        unschedulable=unschedulable,
        created=str(meta.get("creationTimestamp") or ""),
        problem=problem,
    )


def _parse_allocatable(raw: Obj) -> tuple[dict[str, int], Rejection | None]:
    parsed: dict[str, int] = {}
    for name, value in raw.items():
        try:
            parsed[str(name)] = parse_quantity(value)
        except QuantityError:
            detail = f"malformed allocatable {_quoted(name)}: {_quoted(value)}"
            return parsed, Rejection("malformed allocatable", detail)
    return parsed, None


DELETING = "deleting"
"""Rejection kind: the Node has a deletionTimestamp."""
CLAIM_DELETING = "claim-deleting"
"""Rejection kind: the Node's Karpenter NodeClaim has a deletionTimestamp."""


def _deletion_problem(meta: Obj, deleting_claim: str) -> Rejection | None:
    """A node on its way out: capacity that is going, never counted (the fit would place a
    gang there and Karpenter would drain it). The Node's own deletion first: it is the later
    step of the two (Karpenter deletes the Node once its claim is being deleted)."""
    if meta.get("deletionTimestamp"):
        return Rejection("being deleted", kind=DELETING)
    if deleting_claim:
        short = "its NodeClaim is being deleted"
        detail = f"its NodeClaim {_quoted(deleting_claim)} is being deleted"
        return Rejection(short, detail, kind=CLAIM_DELETING, subject=deleting_claim)
    return None


def _node_problem(
    status: Obj, taints: Sequence[Taint], *, ready: bool, cordoned: bool
) -> Rejection | None:
    if not dict_at(status, "allocatable"):
        return Rejection("no allocatable resources reported")
    unknown = [t for t in taints if t.effect not in KNOWN_EFFECTS]
    if unknown:
        return Rejection(
            f"unknown taint effect {_quoted(unknown[0].effect)}",
            f"taint {unknown[0]} has unknown effect {_quoted(unknown[0].effect)}",
        )
    if not ready:
        return Rejection("not Ready", kind="not-ready")
    return Rejection("unschedulable (cordoned)", kind="cordoned") if cordoned else None


def _is_ready(status: Obj) -> bool:
    for condition in list_at(status, "conditions"):
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


# --- one member on one node ------------------------------------------------------------------


def host_rejection(
    member: Member, node: NodeView, free: Resources | None = None, devices: DeviceRoom | None = None
) -> Rejection | None:
    """Why `node` cannot take one `member` given `free` room (default: all allocatable) and,
    when given, the `devices` it reaches (without: the member's DRA claims are not checked)."""
    return _Reasons(member).of(node, free, devices)


class _Reasons:
    """`host_rejection` and `could_be_made_for` of one member, asked of many nodes: what
    depends only on amounts (the room left; the devices reached and their use) is worked
    out once per amount, so the alike nodes of a large cluster share one answer."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self._wanted = _wanted(member.requests)
        self._short: dict[tuple[int, ...], Rejection | None] = {}
        self._devices: dict[tuple[object, ...], Rejection | None] = {}

    def of(
        self, node: NodeView, free: Resources | None = None, devices: DeviceRoom | None = None
    ) -> Rejection | None:
        member = self.member
        if devices is not None and member.devices.problem is not None:
            problem = member.devices.problem
            return node.problem or static_rejection(member, node) or _rejection(problem)
        return (
            node.problem
            or static_rejection(member, node)
            or self._resources(node.allocatable if free is None else free)
            or self._device(devices)
        )

    def in_use(
        self, node: NodeView, free: Resources, devices: DeviceRoom | None
    ) -> Rejection | None:
        """For a node that took members: why it takes no more of this member, when the
        member's devices may be what is short there (its selectors and tolerations allow it)."""
        member = self.member
        if not member.devices or devices is None or static_rejection(member, node) is not None:
            return None
        return self.of(node, free, devices)

    def related(self, node: NodeView, room: DeviceRoom | None) -> bool:
        """Whether the member is of the kind `node` serves: `made_for`, and when the member
        needs a device (and devices are counted), the node reaches one, or a pool that offers
        nothing yet."""
        if not self.made_for(node):
            return False
        if room is None or not self.member.devices.needs_a_device:
            return True
        return bool(room.devices.devices or room.devices.pending)

    def made_for(self, node: NodeView) -> bool:
        """See `could_be_made_for`."""
        member = self.member
        return (
            _selector_rejection(member.node_selector, node) is None
            and _affinity_rejection(member.affinity, node) is None
            and self._resources(node.allocatable) is None
        )

    def _resources(self, free: Resources) -> Rejection | None:
        amounts = tuple(free.get(name, 0) for name in self._wanted)
        if amounts not in self._short:
            self._short[amounts] = _resource_rejection(self.member.requests, free)
        return self._short[amounts]

    def _device(self, room: DeviceRoom | None) -> Rejection | None:
        needs = self.member.devices
        if not needs or room is None:
            return None
        shape = (_device_shape(room.devices, room.usage, needs), room.devices.pending)
        if shape in self._devices:
            return self._devices[shape]
        outcome = room.take(needs)
        if not isinstance(outcome, Shortfall):
            self._devices[shape] = None
            return None
        if not outcome.fatal:  # a fatal one names the device it failed on: not shared
            self._devices[shape] = _rejection(outcome)
        return _rejection(outcome)


def node_could_host(member: Member, node: NodeView) -> bool:
    """Whether `node`, empty, could take one `member`: is it relevant to this request?"""
    return host_rejection(member, node) is None


def static_rejection(member: Member, node: NodeView) -> Rejection | None:
    """The reason from labels, affinity and taints alone, capacity aside."""
    return (
        _selector_rejection(member.node_selector, node)
        or _affinity_rejection(member.affinity, node)
        or _taint_rejection(member.tolerations, node.taints)
    )


def _selector_rejection(selector: Mapping[str, str], node: NodeView) -> Rejection | None:
    if not selector:
        return None
    missing = [f"{k}={v}" for k, v in sorted(selector.items()) if node.labels.get(k) != v]
    if not missing:
        return None
    needs = ", ".join(missing)
    return Rejection(f"node selector mismatch (needs {needs})", kind="selector", subject=needs)


def _affinity_rejection(terms: tuple[SelectorTerm, ...] | None, node: NodeView) -> Rejection | None:
    if terms is None:
        return None
    failures = [term.first_failure(node) for term in terms]
    if any(failure is None for failure in failures):
        return None
    short = "required node affinity not satisfied"
    one = f"{failures[0]}" if len(failures) == 1 else ""
    return Rejection(short, f"{short} ({one})" if one else short, kind="affinity", subject=one)


def _taint_rejection(
    tolerations: Sequence[Toleration], taints: Sequence[Taint]
) -> Rejection | None:
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in tolerations):
            return Rejection(
                f"taint {taint.short} not tolerated",
                f"taint {taint} not tolerated",
                kind="taint",
                subject=taint.short,
            )
    return None


def _rejection(shortfall: Shortfall) -> Rejection:
    return Rejection(shortfall.short, shortfall.detail)


def _resource_rejection(requests: Resources, free: Resources) -> Rejection | None:
    short = [name for name in _wanted(requests) if requests[name] > free.get(name, 0)]
    if not short:
        return None
    detail = "; ".join(
        f"insufficient {name} (requested {format_resource(name, requests[name])}, "
        f"free {format_resource(name, max(free.get(name, 0), 0))})"
        for name in short
    )
    names = ", ".join(short)
    return Rejection(f"insufficient {names}", detail, kind="resources", subject=names)


def capacity(requests: Resources, free: Resources) -> int:
    """How many members with `requests` fit in `free` room (only positive requests count)."""
    return _fits(requests, _wanted(requests), free)


def _wanted(requests: Resources) -> list[str]:
    """Resources actually asked for, `pods` first, then by name."""
    return sorted((n for n, v in requests.items() if v > 0), key=lambda n: (n != PODS, n))


# --- DRA devices on nodes ---------------------------------------------------------------------


def scope_reaches(scope: NodeScope, node: NodeView) -> bool:
    """Whether a device's NodeScope includes `node`: by name, all nodes, or a NodeSelector
    (its terms ORed, as in required node affinity)."""
    if scope.node_name:
        return scope.node_name == node.name
    if scope.all_nodes:
        return True
    if scope.node_selector is None:
        return False
    terms = [_selector_term(t) for t in list_at(scope.node_selector, "nodeSelectorTerms")]
    return any(term.first_failure(node) is None for term in terms)


def node_devices(inventory: Inventory, node: NodeView) -> NodeDevices:
    """The devices of `inventory` that `node` reaches, in kube-scheduler's order (kept by the
    inventory for this very view: a node's reach changes only with the node)."""
    return inventory.on_node(node.name, lambda scope: scope_reaches(scope, node), of=node)


def _device_shape(reach: NodeDevices, usage: Usage, needs: ClaimNeeds) -> tuple[object, ...]:
    """What allocating `needs` on a node reads: its devices' layout (`NodeDevices.layout`),
    their use (`NodeDevices.use`), and which of the member's already allocated claims the
    node can use. Nodes of one shape get the same allocation."""
    reached = tuple(reach.reaches(claim.scope) for claim in needs.shared)
    return (reach.layout, reach.use(usage), reached)


class _Devices:
    """One attempt's devices: what each node reaches, and what is in use so far.

    Members go on many nodes alike (in devices and in their use): the devices one node of a
    shape gives `count` members are worked out once (`_trial`) and, by position in the node's
    device list, stand for those of every node of that shape. The attempt's `usage` is its
    own copy, added to in place: a new copy per placement would cost the whole cluster's use
    each time."""

    def __init__(self, nodes: Mapping[str, NodeDevices], usage: Usage) -> None:
        self.nodes = nodes
        self._taken, self._shared = set(usage.taken), dict(usage.shared)
        self._counters = dict(usage.counters)
        self.usage = Usage(self._taken, self._shared, self._counters)
        self._trials: dict[tuple[object, ...], tuple[int, _Added]] = {}

    def room(self, node: str, needs: ClaimNeeds, most: int) -> int:
        """How many members with `needs` (up to `most`) `node` could take now, nothing
        committed. (The `needs` are told apart by identity: the gang holding them outlives
        this object.)"""
        return self._trial(node, needs, most)[0]

    def place(self, node: str, needs: ClaimNeeds, most: int) -> int:
        """How many members with `needs` (up to `most`) get devices on `node`, one after the
        other; their devices are then in use."""
        placed, added = self._trial(node, needs, most)
        reach = self.nodes[node]
        for index in added.taken:
            self._taken.add(reach.devices[index].id)
        for index, spent in added.shared:
            self._shared[reach.devices[index].id] = spent
        for index, used in added.counters:
            self._counters[reach.counter_sets[index]] = used
        return placed

    def _trial(self, node: str, needs: ClaimNeeds, most: int) -> tuple[int, _Added]:
        reach = self.nodes[node]
        key = (id(needs), _device_shape(reach, self.usage, needs), most)
        found = self._trials.get(key)
        if found is None:
            usage, placed = self.usage, 0
            bound = most_members(needs, reach, usage)
            most = most if bound is None else min(most, bound)
            while placed < most:
                outcome = allocate(needs, reach, usage)
                if isinstance(outcome, Shortfall):
                    break
                usage, placed = outcome, placed + 1
            found = self._trials[key] = (placed, _Added.between(reach, self.usage, usage))
        return found


@dataclass(frozen=True)
class _Added:
    """What placing members on a node added to the use of its devices, by position: the
    devices taken, the capacity consumed on shared ones, and the counters consumed (totals),
    by position in `NodeDevices.counter_sets`."""

    taken: tuple[int, ...]
    shared: tuple[tuple[int, Mapping[str, int]], ...]
    counters: tuple[tuple[int, Mapping[str, int]], ...]

    @staticmethod
    def between(reach: NodeDevices, before: Usage, after: Usage) -> _Added:
        if after is before:
            return _Added((), (), ())
        devices = reach.devices
        taken = tuple(
            i for i, d in enumerate(devices) if d.id in after.taken and d.id not in before.taken
        )
        shared = tuple(
            (i, after.shared[d.id])
            for i, d in enumerate(devices)
            if after.shared.get(d.id) is not before.shared.get(d.id)
        )
        counters = tuple(
            (i, after.counters[cs])
            for i, cs in enumerate(reach.counter_sets)
            if after.counters.get(cs) is not before.counters.get(cs)
        )
        return _Added(taken, shared, counters)


# --- bound pods ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BoundUsage:
    """What bound pods use per node, as `used_resources` gives it, kept current from events
    (`gangcheck.logic.placement.usage`), and the nodes `indexed`, by the extended
    resources they offer (`offering`): a fit given it parses no pod and, when it can, reads
    only the nodes that could host a member."""

    by_node: Mapping[str, Resources]
    offering: Mapping[str, Set[str]] = field(default_factory=dict)
    indexed: Set[str] = frozenset()
    room: Callable[[NodeView], Resources] | None = field(default=None, compare=False)
    """A node view's room as `node_room` gives it, kept between fits (not to be changed)."""


Bound = Iterable[Obj] | BoundUsage
"""Bound Pod objects, or what they use per node already summed."""


def used_resources(bound_pods: Bound) -> Mapping[str, Resources]:
    """Node name -> requests of the pods bound to it and not finished, `pods` counted."""
    if isinstance(bound_pods, BoundUsage):
        return bound_pods.by_node
    used: dict[str, dict[str, int]] = {}
    for pod in bound_pods:
        node_name = dict_at(pod, "spec").get("nodeName")
        if not node_name or is_finished(pod):
            continue
        requests = pod_requests(dict_at(pod, "spec"))
        used[str(node_name)] = _total([used.get(str(node_name), {}), requests])
    return used


# --- the gang --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitResult:
    """Where the gang's members would go, and why the nodes left empty could take none.

    `placements`: node -> pod set name per member placed there (only nodes taking some).
    `unplaced`: pod set -> members left over. `node_reasons`: for every unusable node, and
    when the gang does not fit, for every node that took nothing: the reason it could not
    take a member of the first pod set left over (`blocking_pod_set`). `in_use_reasons`:
    when that pod set has DRA claims, the same for the nodes that took some and that its
    selectors and tolerations allow.
    """

    fits: bool
    placeable: int
    total: int
    placements: Mapping[str, tuple[str, ...]]
    unplaced: Mapping[str, int]
    node_reasons: Mapping[str, Rejection]
    blocking_pod_set: str | None = None
    pod_sets: int = 1
    in_use_reasons: Mapping[str, Rejection] = field(default_factory=dict)
    unrelated: frozenset[str] = frozenset()
    """Nodes in `node_reasons` that could not take a member of `blocking_pod_set` even empty:
    its node selector or required affinity rule them out, they are too small (another pool,
    the control plane), or it needs a device and they reach none. Messages do not count them
    among the nodes that fail the gang. (Given a `BoundUsage`, the reasons of the nodes that
    could host no member at all are worked out when read: read them before the capacity it
    was given changes, as a reconcile does, in one go.)"""


def fit_gang(
    pod_sets: Sequence[GangPodSet | tuple[str, int, Member]],
    nodes: Iterable[NodeView],
    bound_pods: Bound = (),
    devices: Inventory | None = None,
) -> FitResult:
    """Whether every member of every pod set can be placed at once (see module doc).

    `devices`: the DRA devices members' claims are allocated from (default: none at all).
    `bound_pods` as a `BoundUsage`: the fit is tried first on the nodes that could host a
    member (and the unusable ones, whose reasons it reports); when the gang fits there, that
    is the fit on all nodes (no other node could have taken a member), else all are read.
    """
    gang = [ps if isinstance(ps, GangPodSet) else GangPodSet(*ps) for ps in pod_sets]
    gang = [ps for ps in gang if ps.count > 0]
    views = _by_name(nodes)
    return _fit(gang, views, _placing(gang, views, bound_pods, devices), bound_pods, devices)


def _by_name(nodes: Iterable[NodeView]) -> list[NodeView]:
    """The nodes by name, once each (the last view of a name counts)."""
    views = list(nodes)
    names = [view.name for view in views]
    if all(a < b for a, b in itertools.pairwise(names)):
        return views  # as kept (`NodeUsage.node_views`): nothing to do
    by_name = {view.name: view for view in views}
    return [by_name[name] for name in sorted(by_name)]


def _placing(
    gang: Sequence[GangPodSet], views: list[NodeView], bound: Bound, devices: Inventory | None
) -> list[NodeView]:
    """The nodes placement has to look at: those that could host a member of some pod set,
    the unusable ones (their reasons are reported), and the ones the index does not know;
    all of them when any node could host a member."""
    wanted = _candidates(gang, bound, devices)
    if wanted is None or not isinstance(bound, BoundUsage):
        return views
    indexed = bound.indexed
    return [n for n in views if n.name in wanted or not n.is_usable or n.name not in indexed]


def _candidates(
    gang: Sequence[GangPodSet], bound: Bound, devices: Inventory | None
) -> Set[str] | None:
    """The nodes that could host a member of some pod set; None: any node could."""
    if not isinstance(bound, BoundUsage):
        return None
    found: set[str] = set()
    for pod_set in gang:
        member = pod_set.member
        extended = [r for r, v in member.requests.items() if v > 0 and r not in STANDARD_RESOURCES]
        if extended:
            found |= set.intersection(*(set(bound.offering.get(r, ())) for r in extended))
        elif member.devices.needs_a_device and devices is not None:
            reaching = devices.nodes_reaching()
            if reaching is None:
                return None
            found |= reaching
        else:
            return None
    return found


def _fit(
    gang: list[GangPodSet],
    views: list[NodeView],
    placing: list[NodeView],
    bound_pods: Bound,
    devices: Inventory | None,
) -> FitResult:
    """Placement on the `placing` nodes (no other node could take a member, so it is the
    placement on all `views`); the reasons over all of them when the gang does not fit (when
    it does, only the unusable nodes have one, and those are among `placing`). The other
    nodes' reasons are worked out when read (`_NodeReasons`)."""
    used = used_resources(bound_pods)
    room_of = _rooms(bound_pods, used)
    start = {view.name: room_of(view) for view in placing}
    inventory = devices or Inventory()
    reach = None
    if any(ps.member.devices for ps in gang):
        reach = {view.name: node_devices(inventory, view) for view in placing}
    plans = [_plan(ps, placing) for ps in gang]
    attempts = (
        _attempt(order, start, None if reach is None else _Devices(reach, inventory.used))
        for order in _orders(plans)
    )
    best = _best(attempts)
    if not best.unplaced or len(placing) == len(views):
        return _result(gang, placing, best, reach)
    others = [view for view in views if view.name not in start]
    return _result(gang, placing, best, reach, _Elsewhere(others, room_of, inventory))


@dataclass(frozen=True)
class _Elsewhere:
    """The nodes a fit left out (the index says they could host no member: they offer none
    of the extended resources asked for, or reach no device), and what their reasons read."""

    views: Sequence[NodeView]
    room: Callable[[NodeView], Resources]
    inventory: Inventory


class _NodeReasons(Mapping[str, Rejection]):
    """Every node's reason when a gang does not fit: those of the nodes placement looked at,
    and those of the nodes left out, worked out when read (as for the others, on their room):
    telling why a gang does not fit costs the nodes that could host it, however many others
    the cluster has."""

    def __init__(
        self, known: dict[str, Rejection], elsewhere: _Elsewhere, why: _Reasons, usage: Usage | None
    ) -> None:
        self._known = known
        self._elsewhere, self._why, self._usage = elsewhere, why, usage
        self._others = {view.name: view for view in elsewhere.views}
        self._worked: dict[str, Rejection] = {}
        self._names: list[str] | None = None

    def __getitem__(self, name: str) -> Rejection:
        found = self._known.get(name) or self._worked.get(name)
        if found is None:
            found = self._worked[name] = self._worked_out(self._others[name])
        return found

    def _worked_out(self, view: NodeView) -> Rejection:
        elsewhere, usage = self._elsewhere, self._usage
        room = None if usage is None else DeviceRoom(node_devices(elsewhere.inventory, view), usage)
        return self._why.of(view, elsewhere.room(view), room) or _RECOUNTED

    def __iter__(self) -> Iterator[str]:
        if self._names is None:  # by name, as the nodes are (both parts are in that order)
            self._names = sorted(itertools.chain(self._known, self._others))
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._known) + len(self._others)

    def __contains__(self, name: object) -> bool:
        return name in self._known or name in self._others


_RECOUNTED = Rejection("changed since its capacity was counted")
"""A left-out node that could take a member after all: it changed after the index counted it
(the next event brings it in)."""


@dataclass(frozen=True)
class _Plan:
    """A pod set with what every attempt needs of it: resources asked, nodes it may use."""

    pod_set: GangPodSet
    wanted: tuple[str, ...]
    eligible: tuple[NodeView, ...]


@dataclass(frozen=True)
class _Attempt:
    """One pass over the pod sets in one order: what went where, what room is left."""

    order: tuple[_Plan, ...]
    free: Mapping[str, Resources]
    placements: Mapping[str, list[str]]
    unplaced: Mapping[str, int]
    usage: Usage | None = None

    @property
    def placed(self) -> int:
        return sum(len(members) for members in self.placements.values())


def _best(attempts: Iterable[_Attempt]) -> _Attempt:
    """The first attempt that fits, else the first placing most."""
    best: _Attempt | None = None
    for attempt in attempts:
        if not attempt.unplaced:
            return attempt
        if best is None or attempt.placed > best.placed:
            best = attempt
    return best or _Attempt((), {}, {}, {})


def _plan(pod_set: GangPodSet, views: Sequence[NodeView]) -> _Plan:
    member = pod_set.member
    eligible = tuple(n for n in views if n.is_usable and static_rejection(member, n) is None)
    if member.devices.problem is not None:
        eligible = ()  # it fits nowhere: the reason is the member's, said for every node
    return _Plan(pod_set, tuple(_wanted(member.requests)), eligible)


def _orders(plans: Sequence[_Plan]) -> Iterable[tuple[_Plan, ...]]:
    """Biggest members first; for small gangs then every other order of the pod sets."""
    by_demand = tuple(sorted(plans, key=lambda plan: _demand_order(plan.pod_set)))
    if len(by_demand) > MAX_ORDERS_TRIED_POD_SETS:
        return [by_demand]
    return itertools.permutations(by_demand)


def _attempt(
    order: tuple[_Plan, ...], start: Mapping[str, Resources], devices: _Devices | None
) -> _Attempt:
    free = dict(start)  # a node's room is copied when members go there (`_place`)
    placements: dict[str, list[str]] = {}
    unplaced: dict[str, int] = {}
    for plan in order:
        left = _place(plan, free, placements, devices)
        if left:
            unplaced[plan.pod_set.name] = left
    return _Attempt(order, free, placements, unplaced, devices.usage if devices else None)


def _rooms(bound: Bound, used: Mapping[str, Resources]) -> Callable[[NodeView], Resources]:
    """How a fit gets a node's room: as kept with the bound usage, or worked out now."""
    if isinstance(bound, BoundUsage) and bound.room is not None:
        return bound.room
    return lambda view: node_room(view, used)


def node_room(node: NodeView, used: Mapping[str, Resources]) -> dict[str, int]:
    """The node's room: allocatable less what its bound pods request (`used`, per node)."""
    room = dict(node.allocatable)
    for name, amount in used.get(node.name, {}).items():
        room[name] = room.get(name, 0) - amount
    return room


def _demand_order(pod_set: GangPodSet) -> tuple[int, int, int, str]:
    """Biggest members first, an order fixed by the members alone."""
    req = pod_set.member.requests
    extended = sum(v for n, v in req.items() if n not in STANDARD_RESOURCES)
    extended += pod_set.member.devices.device_count * NANO
    return (-extended, -req.get("cpu", 0), -req.get("memory", 0), pod_set.name)


def _place(
    plan: _Plan,
    free: dict[str, Resources],
    placements: dict[str, list[str]],
    devices: _Devices | None,
) -> int:
    """Fill the eligible nodes, best fit first; returns how many members are left over."""
    requests, left = plan.pod_set.member.requests, plan.pod_set.count
    needs = plan.pod_set.member.devices
    known = _by_shape(requests, plan.wanted, plan.eligible, free)
    room = {name: fits for name, (fits, _) in known.items()}
    if needs and devices is not None:
        room = {
            name: devices.room(name, needs, min(most, left)) if most else 0
            for name, most in room.items()
        }

    def best_fit(node: NodeView) -> tuple[int, float, str]:
        return (room[node.name] if needs and devices else 0, known[node.name][1], node.name)

    for node in sorted((n for n in plan.eligible if room[n.name] > 0), key=best_fit):
        take = min(left, room[node.name])
        if needs and devices is not None:
            take = devices.place(node.name, needs, take)
            if not take:
                continue
        room_left = free[node.name] = dict(free[node.name])  # others start from the one there
        for name in plan.wanted:
            room_left[name] = room_left.get(name, 0) - take * requests[name]
        placements.setdefault(node.name, []).extend([plan.pod_set.name] * take)
        left -= take
        if left == 0:
            break
    return left


def _by_shape(
    requests: Resources,
    wanted: Sequence[str],
    nodes: Iterable[NodeView],
    free: Mapping[str, Resources],
) -> dict[str, tuple[int, float]]:
    """Per node, how many members fit and the room left after one (`_fits`, `_room_after`),
    worked out once per node shape (free and allocatable amounts of the wanted resources):
    nodes alike in a large cluster share one answer."""
    known: dict[tuple[int, ...], tuple[int, float]] = {}
    out: dict[str, tuple[int, float]] = {}
    for node in nodes:
        room, allocatable = free[node.name], node.allocatable
        shape = (*[room.get(r, 0) for r in wanted], *[allocatable.get(r, 0) for r in wanted])
        answer = known.get(shape)
        if answer is None:
            answer = known[shape] = (
                _fits(requests, wanted, room),
                _room_after(requests, wanted, node, room),
            )
        out[node.name] = answer
    return out


def _fits(requests: Resources, wanted: Sequence[str], free: Resources) -> int:
    if not wanted:
        return 0
    return max(0, min(free.get(name, 0) // requests[name] for name in wanted))


def _room_after(
    requests: Resources, wanted: Sequence[str], node: NodeView, free: Resources
) -> float:
    """Room left after one member, summed over requested resources as shares of allocatable.

    A float: it only orders the nodes (deterministically); capacity is integer arithmetic.
    """
    return sum(
        (free.get(r, 0) - requests[r]) / (node.allocatable.get(r) or 1) for r in wanted if r != PODS
    )


def _result(
    gang: Sequence[GangPodSet],
    views: Sequence[NodeView],
    best: _Attempt,
    reach: Mapping[str, NodeDevices] | None,
    elsewhere: _Elsewhere | None = None,
) -> FitResult:
    order = [plan.pod_set for plan in best.order]
    blocking = next((ps for ps in order if ps.name in best.unplaced), None)
    reasons: dict[str, Rejection] = {}
    in_use: dict[str, Rejection] = {}
    unrelated: set[str] = set()
    why = _Reasons(blocking.member) if blocking is not None else None
    for node in views:
        room = None
        if reach is not None and best.usage is not None:
            room = DeviceRoom(reach[node.name], best.usage)
        if node.name in best.placements:
            reason = why.in_use(node, best.free[node.name], room) if why is not None else None
            if reason is not None:
                in_use[node.name] = reason
            continue
        reason = node.problem
        if reason is None and why is not None:
            reason = why.of(node, best.free[node.name], room)
        if reason is not None:
            reasons[node.name] = reason
            if why is not None and not why.related(node, room):
                unrelated.add(node.name)
    node_reasons: Mapping[str, Rejection] = reasons
    if elsewhere is not None and why is not None:
        node_reasons = _NodeReasons(reasons, elsewhere, why, best.usage)
        unrelated.update(view.name for view in elsewhere.views)
    total = sum(ps.count for ps in gang)
    return FitResult(
        fits=not best.unplaced,
        placeable=best.placed,
        total=total,
        placements={name: tuple(best.placements[name]) for name in sorted(best.placements)},
        unplaced=dict(best.unplaced),
        node_reasons=node_reasons,
        blocking_pod_set=blocking.name if blocking else None,
        pod_sets=len(gang),
        in_use_reasons=in_use,
        unrelated=frozenset(unrelated),
    )


# --- words -----------------------------------------------------------------------------------


def reason_lines(result: FitResult) -> list[str]:
    """`node "gpu-3": taint nvidia.com/gpu=present:NoSchedule not tolerated`, one per node."""
    return [f"node {_quoted(name)}: {reason}" for name, reason in result.node_reasons.items()]


def summarize(result: FitResult, limit: int = SUMMARY_LIMIT) -> str:
    """One line for a check message: how much fits and why the empty nodes take none."""
    head = f"{result.placeable} of {result.total} members placeable"
    used = len(result.placements)
    if used:
        head += f" on {_plural(used, 'node')}"
    if result.fits:
        return head
    head += _left_over(result)
    reasons = result.node_reasons
    blocked = [reasons[name] for name in reasons if name not in result.unrelated]
    if not blocked:
        if reasons and not used:
            text = f"{head}; no node could take a member even empty: "
            return _truncate(text, limit, list(reasons.values()), 0)
        tail = "; no nodes" if not used else "; the nodes in use have no room for the rest"
        in_use = list(result.in_use_reasons.values())
        if in_use:
            return _truncate(f"{head}{tail}: ", limit, in_use)
        return _truncate(head + tail, limit)
    return _truncate(f"{head}; {_plural(len(blocked), 'node')} can take none: ", limit, blocked)


def _left_over(result: FitResult) -> str:
    if result.pod_sets < 2:
        return ""
    parts = [f"{name} {count}" for name, count in sorted(result.unplaced.items())]
    return f" (left over: {', '.join(parts)})"


def _truncate(head: str, limit: int, reasons: Sequence[Rejection] = (), counted: int = 1) -> str:
    """`head` and the reasons, alike ones grouped (with their count unless `counted` is 0)."""
    groups = Counter(r.short for r in reasons).most_common()
    groups.sort(key=lambda g: (-g[1], g[0]))
    text, shown = head, 0
    for short, count in groups:
        times = f"{count} × " if counted else ""  # noqa: RUF001
        piece = f"{', ' if shown else ''}{times}{short}"
        if len(text) + len(piece) > limit - 12:
            break
        text, shown = text + piece, shown + 1
    if shown < len(groups):
        text += f"{', ' if shown else ''}+{len(groups) - shown} more"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# --- small helpers ---------------------------------------------------------------------------


def _quoted(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _as_int(text: str) -> int | None:
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(text)


def _parse_resources(raw: Obj) -> dict[str, int]:
    """Requests by resource; a negative one (which the API server refuses) counts as 0."""
    return {str(name): max(0, parse_quantity(value)) for name, value in raw.items()}


def _total(parts: Iterable[Resources]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for name, value in part.items():
            out[name] = out.get(name, 0) + value
    return out


def _peak(parts: Iterable[Resources]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for name, value in part.items():
            out[name] = max(out.get(name, value), value)
    return out


def _strings(raw: Obj) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()}


def could_be_made_for(member: Member, node: NodeView) -> bool:
    """Whether an autoscaler could have added `node` for `member`: its labels, affinity and
    room fit, whatever its taints, readiness or cordon (those come and go after it registers;
    a node the gang cannot use because of them is still one that arrived for it)."""
    return _Reasons(member).made_for(node)
