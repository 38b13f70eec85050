"""DRA devices (resource.k8s.io/v1) in the gang fit: what a member claims, what nodes offer.

A member whose pod spec names ResourceClaimTemplates fits on a node only when kube-scheduler
could allocate every one of its claims from the devices that node reaches. Inputs are raw API
dicts; `gangcheck.logic.placement.fit` asks `allocate` member by member, node by node.

The inventory (`build_inventory`) takes ResourceSlices, DeviceClasses and ResourceClaims:
- slices form pools (driver, pool name); only a pool's newest generation counts. A pool that
  misses some of its slices, or whose device names or counter references clash, offers no
  device (kube-scheduler allocates nothing from it, and a request for `All` devices fails on
  a node it reaches);
- a slice (or, with `perDeviceNodeSelection`, each device) reaches nodes by `nodeName`,
  `nodeSelector` or `allNodes`: a `NodeScope` that fit resolves against its NodeView;
- counter sets (`sharedCounters`, in slices of their own since 1.37) belong to the pool;
- the devices in `status.allocation` of ResourceClaims are in use: taken, or for a device
  that allows multiple allocations, its `consumedCapacity` spent (admin access takes none);
- `problems` lists what a caller may want to emit an Event about: drivers no DeviceClass
  names, pools being updated or invalid, class selectors not evaluable, malformed values.

Allocation (`allocate`) goes claim by claim in pod order, request by request in claim order,
device by device in kube-scheduler's order (pools by driver and name, slices by name, devices
as listed). It is greedy: a request takes the first devices that qualify; a `firstAvailable`
request takes the first subrequest that can be satisfied then; nothing is revisited, except
that a claim with `matchAttribute` constraints is tried once per value of the attributes on
the node. So it never reports an allocation that is not feasible, but may miss one that
kube-scheduler's search would find. A device qualifies for a request when:
- it is not in use (a device allowing multiple allocations: while its capacity lasts; one
  claim never takes a device twice);
- the class's CEL selectors, then the request's, are true for it;
- its NoSchedule and NoExecute taints are tolerated by the request;
- its capacity covers the request's `capacity.requests` (after the device's request policy,
  which also says what an allocation consumes when nothing is asked);
- its pool's counter sets still hold the counters it consumes (partitionable devices);
- the claim's `matchAttribute` / `distinctAttribute` constraints hold.
`allocationMode: All` takes every device of the node that matches (at least one), and fails
if any of them does not qualify. `adminAccess` requests need matching devices but take none.

CEL selectors: the subset `compile_selector` documents is evaluated with CEL's semantics for
errors (a missing attribute is an error; `false && error` is false, `true && error` an
error). An error on a device stops the allocation on that node, as it stops kube-scheduler.
An expression outside the subset is not evaluable: a member that needs it fits nowhere, and
the reason quotes it.

Not modelled: TaintRules, binding conditions, compatibility groups and partition types
of counters, derived attributes, list-valued attributes in selectors (they compare unequal),
DeviceClass `extendedResourceName`, node-allocatable resources of devices, claims a PodGroup
shares, the limit of 32 devices per claim. A named (shared) ResourceClaim counts only once
allocated: it takes nothing more and limits the member to the nodes its allocation allows.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangcheck.logic.placement.quantity import QuantityError, parse_quantity
from gangcheck.logic.placement.taints import Taint, Toleration, taint_of, toleration_of

Obj = Mapping[str, Any]
DeviceId = tuple[str, str, str]
"""(driver, pool, device): a device's identity."""
CounterSetId = tuple[str, str, str]
"""(driver, pool, counter set)."""

EXACT_COUNT = "ExactCount"
ALL = "All"
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
MAX_CONSTRAINT_CHOICES = 64
"""At most this many combinations of `matchAttribute` values are tried per claim and node."""
SHORT_EXPRESSION = 100
"""Longer CEL expressions are cut in a reason's short form (the detail keeps them whole)."""


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """A `version` attribute: semver text, compared for equality with other versions only."""

    text: str


@dataclass(frozen=True)
class Quantity:
    """A capacity in CEL, in nano-units."""

    nanos: int


Scalar = bool | int | str | Version
AttributeValue = Scalar | tuple[Scalar, ...]
CelValue = AttributeValue | Quantity


@dataclass(frozen=True)
class CelError:
    """A CEL runtime error: kube-scheduler stops allocating on the node when it meets one."""

    message: str


@dataclass(frozen=True)
class Shortfall:
    """Why a node's devices cannot serve a member: `short` groups alike nodes.

    `fatal`: the same on every node (an error, a missing class), so no alternative is tried.
    """

    short: str
    detail: str = ""
    fatal: bool = False

    def __str__(self) -> str:
        return self.detail or self.short


@dataclass(frozen=True)
class Problem:
    """Something wrong with the DRA objects themselves, worth an Event."""

    kind: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {_quoted(self.name)}: {self.message}"


# --- devices ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeScope:
    """The nodes that reach a device: one by name, all, or those a NodeSelector (raw API
    dict) matches; none set: no node. `gangcheck.logic.placement.fit.scope_reaches` resolves it."""

    node_name: str = ""
    all_nodes: bool = False
    node_selector: Obj | None = None


@dataclass(frozen=True)
class Capacity:
    """One capacity of a device, in nano-units, with its request policy (if any)."""

    value: int
    default: int | None = None
    valid_values: tuple[int, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    step: int | None = None

    def consumed(self, requested: int | None) -> int | None:
        """What one allocation asking `requested` (None: not asked) consumes; None when the
        request policy refuses the amount."""
        if requested is None:
            return self.value if self.default is None else self.default
        amount = requested
        if self.minimum is not None:
            amount = max(amount, self.minimum)
            if self.step:
                steps = -(-(amount - self.minimum) // self.step)
                amount = self.minimum + steps * self.step
        elif self.valid_values:
            amount = next((v for v in self.valid_values if v >= requested), requested)
            if amount not in self.valid_values:
                return None
        if self.maximum is not None and amount > self.maximum and amount != self.default:
            return None
        return amount


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice. `attributes` by fully qualified name (`domain/id`);
    `capacity` by name as published; `consumes`: counter set -> counter -> nano-units."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    consumes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    multiple: bool = False
    taints: tuple[Taint, ...] = ()
    scope: NodeScope = field(default_factory=NodeScope)

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    def attribute(self, domain: str, name: str) -> AttributeValue | None:
        return self.attributes.get(f"{domain}/{name}")

    def capacity_of(self, domain: str, name: str) -> Capacity | None:
        found = self.capacity.get(f"{domain}/{name}")
        if found is None and domain == self.driver:
            found = self.capacity.get(name)
        return found

    def __str__(self) -> str:
        return "/".join(self.id)


@dataclass(frozen=True)
class Pool:
    """A driver's pool: its devices, counter sets, the reach of its slices, and `problem`
    when it offers nothing right now (being updated, or invalid)."""

    driver: str
    name: str
    devices: tuple[Device, ...] = ()
    counters: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    scopes: tuple[NodeScope, ...] = ()
    problem: str = ""

    def __str__(self) -> str:
        return f"{self.driver}/{self.name}"


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[Selector, ...] = ()


@dataclass(frozen=True)
class Usage:
    """What is in use, cluster-wide: devices taken whole, capacity consumed on devices that
    allow multiple allocations (in use while listed), counters consumed from counter sets."""

    taken: frozenset[DeviceId] = frozenset()
    shared: Mapping[DeviceId, Mapping[str, int]] = field(default_factory=dict)
    counters: Mapping[CounterSetId, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Inventory:
    """The devices of the cluster (see module doc); `used`: what allocated claims hold."""

    pools: tuple[Pool, ...] = ()
    classes: Mapping[str, DeviceClass] = field(default_factory=dict)
    used: Usage = field(default_factory=Usage)
    problems: tuple[Problem, ...] = ()
    _matches: dict[tuple[DeviceId, str, tuple[str, ...]], bool | CelError] = field(
        default_factory=dict, compare=False, repr=False
    )
    _counter_sets: dict[CounterSetId, Mapping[str, int]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _by_node: dict[str, list[tuple[int, int, Device]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Devices of usable pools by the one node they name (built on first use), and under ""
    those whose scope is every node or a selector: a node looks only at its own and those."""

    def on_node(self, node: str, reaches: Callable[[NodeScope], bool]) -> NodeDevices:
        """The devices `node` reaches; `reaches` tells whether a scope includes the node."""
        seen: dict[int, bool] = {}

        def reached(scope: NodeScope) -> bool:
            if id(scope) not in seen:
                seen[id(scope)] = reaches(scope)
            return seen[id(scope)]

        index = self._device_index()
        candidates = sorted([*index.get(node, ()), *index.get("", ())], key=lambda e: e[:2])
        devices = tuple(d for _, _, d in candidates if reached(d.scope))
        pending = tuple(
            str(pool) for pool in self.pools if pool.problem and any(map(reached, pool.scopes))
        )
        return NodeDevices(node, devices, pending, reaches, self)

    def _device_index(self) -> dict[str, list[tuple[int, int, Device]]]:
        """The devices by the node their scope names ("" for all other scopes), in the
        inventory's order (pool, then device) so that a node sees them as before."""
        if not self._by_node and any(not p.problem and p.devices for p in self.pools):
            for p_index, pool in enumerate(self.pools):
                if pool.problem:
                    continue
                for d_index, device in enumerate(pool.devices):
                    key = device.scope.node_name
                    self._by_node.setdefault(key, []).append((p_index, d_index, device))
        return self._by_node

    def counter_total(self, counter_set: CounterSetId) -> Mapping[str, int]:
        """The counters a counter set holds, nothing consumed."""
        if not self._counter_sets:
            for pool in self.pools:
                for name, counters in pool.counters.items():
                    self._counter_sets[(pool.driver, pool.name, name)] = counters
        return self._counter_sets.get(counter_set, {})


@dataclass(frozen=True)
class NodeDevices:
    """The devices one node reaches, in kube-scheduler's order; `pending`: pools reaching it
    that offer nothing right now."""

    node: str
    devices: tuple[Device, ...]
    pending: tuple[str, ...]
    reaches: Callable[[NodeScope], bool] = field(compare=False, repr=False)
    inventory: Inventory = field(compare=False, repr=False)


@dataclass(frozen=True)
class DeviceRoom:
    """A node's devices and what is in use: what is left once one more member is placed."""

    devices: NodeDevices
    usage: Usage

    def take(self, needs: ClaimNeeds) -> DeviceRoom | Shortfall:
        outcome = allocate(needs, self.devices, self.usage)
        return outcome if isinstance(outcome, Shortfall) else DeviceRoom(self.devices, outcome)


# --- what a member claims --------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request (or subrequest, named `request/sub`) of a claim."""

    name: str
    device_class: str
    selectors: tuple[Selector, ...] = ()
    mode: str = EXACT_COUNT
    count: int = 1
    capacity: Mapping[str, int] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    admin: bool = False


@dataclass(frozen=True)
class Constraint:
    """`matchAttribute` (or, `distinct`, `distinctAttribute`) over some requests (none: all)."""

    requests: tuple[str, ...]
    attribute: str
    distinct: bool = False

    def covers(self, request: str) -> bool:
        return not self.requests or request in self.requests or _base(request) in self.requests


@dataclass(frozen=True)
class Claim:
    """One claim of the pod, from a template: per request, its alternatives (one, unless
    the request lists `firstAvailable` subrequests)."""

    name: str
    template: str
    requests: tuple[tuple[Request, ...], ...] = ()
    constraints: tuple[Constraint, ...] = ()


@dataclass(frozen=True)
class SharedClaim:
    """A claim naming an allocated ResourceClaim: usable only where `scope` reaches."""

    name: str
    claim: str
    scope: NodeScope = field(default_factory=lambda: NodeScope(all_nodes=True))


@dataclass(frozen=True)
class ClaimNeeds:
    """What one member needs of DRA devices; `problem`: it cannot be served anywhere."""

    claims: tuple[Claim, ...] = ()
    shared: tuple[SharedClaim, ...] = ()
    problem: Shortfall | None = None

    def __bool__(self) -> bool:
        return bool(self.claims or self.shared or self.problem)

    @property
    def device_count(self) -> int:
        """Devices asked for (an `All` request or a `firstAvailable` one counts its first)."""
        return sum(alts[0].count for claim in self.claims for alts in claim.requests if alts)


@dataclass(frozen=True)
class DraContext:
    """The ResourceClaimTemplates and ResourceClaims of the pods' namespace, by name."""

    templates: Mapping[str, Obj] = field(default_factory=dict)
    claims: Mapping[str, Obj] = field(default_factory=dict)

    @classmethod
    def of(cls, templates: Iterable[Obj] = (), claims: Iterable[Obj] = ()) -> DraContext:
        return cls(_by_name(templates), _by_name(claims))

    def needs(self, pod_spec: Obj) -> ClaimNeeds:
        return claim_needs(pod_spec, self.templates, self.claims)


def claim_needs(
    pod_spec: Obj, templates: Mapping[str, Obj], claims: Mapping[str, Obj] | None = None
) -> ClaimNeeds:
    """The device needs of a pod spec's `resourceClaims`; templates and claims by name, from
    the pod's namespace. Containers' `resources.claims` do not matter: kube-scheduler
    allocates every claim of the pod."""
    parsed: list[Claim] = []
    shared: list[SharedClaim] = []
    for entry in _list(pod_spec, "resourceClaims"):
        name = str(entry.get("name") or "")
        template, named = entry.get("resourceClaimTemplateName"), entry.get("resourceClaimName")
        outcome: Claim | SharedClaim | Shortfall
        if template:
            outcome = _from_template(name, str(template), templates.get(str(template)))
        elif named:
            outcome = _shared_claim(name, str(named), (claims or {}).get(str(named)))
        else:
            outcome = _fatal(f"claim {_quoted(name)}: names no ResourceClaim or template")
        if isinstance(outcome, Shortfall):
            return ClaimNeeds(problem=outcome)
        if isinstance(outcome, Claim):
            parsed.append(outcome)
        else:
            shared.append(outcome)
    return ClaimNeeds(tuple(parsed), tuple(shared))


def _from_template(name: str, template: str, obj: Obj | None) -> Claim | Shortfall:
    if obj is None:
        return _fatal(f"claim {_quoted(name)}: ResourceClaimTemplate {_quoted(template)} not found")
    devices = _dict(_dict(_dict(obj, "spec"), "spec"), "devices")
    requests: list[tuple[Request, ...]] = []
    for raw in _list(devices, "requests"):
        request_name = str(raw.get("name") or "")
        exactly = raw.get("exactly")
        subrequests = _list(raw, "firstAvailable")
        if isinstance(exactly, Mapping):
            alternatives = [_request(name, request_name, exactly)]
        elif subrequests:
            alternatives = [
                _request(name, f"{request_name}/{sub.get('name') or ''}", sub)
                for sub in subrequests
            ]
        else:
            return _fatal(
                f"{_where(name, request_name)}: neither `exactly` nor `firstAvailable` is set"
            )
        for alternative in alternatives:
            if isinstance(alternative, Shortfall):
                return alternative
        requests.append(tuple(a for a in alternatives if isinstance(a, Request)))
    constraints = []
    for raw in _list(devices, "constraints"):
        names = tuple(str(r) for r in raw.get("requests") or ())
        if raw.get("matchAttribute"):
            constraints.append(Constraint(names, str(raw["matchAttribute"])))
        elif raw.get("distinctAttribute"):
            constraints.append(Constraint(names, str(raw["distinctAttribute"]), distinct=True))
    return Claim(name, template, tuple(requests), tuple(constraints))


def _request(claim: str, name: str, raw: Obj) -> Request | Shortfall:
    mode = str(raw.get("allocationMode") or EXACT_COUNT)
    if mode not in (EXACT_COUNT, ALL):
        return _fatal(f"{_where(claim, name)}: allocation mode {_quoted(mode)} is unknown")
    count = raw.get("count", 1) if mode == EXACT_COUNT else 1
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return _fatal(f"{_where(claim, name)}: count {_quoted(count)} is not a positive integer")
    selectors = []
    for expression in _expressions(raw):
        selector = compile_selector(expression)
        if not selector.evaluable:
            return _not_evaluable(f"claim {_quoted(claim)}", expression)
        selectors.append(selector)
    try:
        capacity = {
            str(k): parse_quantity(v) for k, v in _dict(_dict(raw, "capacity"), "requests").items()
        }
    except QuantityError as exc:
        return _fatal(f"{_where(claim, name)}: {exc}")
    return Request(
        name=name,
        device_class=str(raw.get("deviceClassName") or ""),
        selectors=tuple(selectors),
        mode=mode,
        count=count,
        capacity=capacity,
        tolerations=tuple(toleration_of(t) for t in _list(raw, "tolerations")),
        admin=raw.get("adminAccess") is True,
    )


def _shared_claim(name: str, claim: str, obj: Obj | None) -> SharedClaim | Shortfall:
    if obj is None:
        return _fatal(f"claim {_quoted(name)}: ResourceClaim {_quoted(claim)} not found")
    allocation = _dict(_dict(obj, "status"), "allocation")
    if not allocation:
        return _fatal(
            f"claim {_quoted(name)}: ResourceClaim {_quoted(claim)} is not allocated yet "
            "(gangcheck counts a shared claim only once allocated)"
        )
    selector = allocation.get("nodeSelector")
    if isinstance(selector, Mapping):
        return SharedClaim(name, claim, NodeScope(node_selector=selector))
    return SharedClaim(name, claim)


# --- the inventory ---------------------------------------------------------------------------


def build_inventory(
    slices: Iterable[Obj], device_classes: Iterable[Obj] = (), claims: Iterable[Obj] = ()
) -> Inventory:
    """The devices of `slices`, with `device_classes` to select them and the allocations of
    `claims` (ResourceClaims, any namespace) in use; see the module doc."""
    problems: list[Problem] = []
    classes = {}
    for obj in device_classes:
        name = str(_dict(obj, "metadata").get("name") or "")
        selectors = tuple(compile_selector(e) for e in _expressions(_dict(obj, "spec")))
        for selector in selectors:
            if not selector.evaluable:
                message = f"CEL selector gangcheck cannot evaluate: {selector.expression}"
                problems.append(Problem("DeviceClass", name, message))
        classes[name] = DeviceClass(name, selectors)
    slices = list(slices)
    problems.extend(_unknown_drivers(slices, classes.values()))
    pools = []
    for (driver, pool_name), members in sorted(_newest_slices(slices).items()):
        pool = _pool(driver, pool_name, members, problems)
        if pool.problem:
            problems.append(Problem("ResourcePool", str(pool), pool.problem))
        pools.append(pool)
    inventory = Inventory(tuple(pools), classes, Usage(), ())
    used = _allocated(inventory, claims)
    return Inventory(inventory.pools, classes, used, tuple(problems))


def _newest_slices(slices: Iterable[Obj]) -> dict[tuple[str, str], list[Obj]]:
    pools: dict[tuple[str, str], list[Obj]] = {}
    for obj in slices:
        spec = _dict(obj, "spec")
        pool = _dict(spec, "pool")
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        kept = pools.setdefault(key, [])
        generation = _int(pool.get("generation"))
        newest = _int(_dict(_dict(kept[0], "spec"), "pool").get("generation")) if kept else None
        if newest is None or generation == newest:
            kept.append(obj)
        elif generation > newest:
            kept[:] = [obj]
    return pools


def _pool(driver: str, name: str, slices: list[Obj], problems: list[Problem]) -> Pool:
    slices = sorted(slices, key=lambda s: str(_dict(s, "metadata").get("name") or ""))
    expected = _int(_dict(_dict(slices[0], "spec"), "pool").get("resourceSliceCount"))
    scopes = tuple(
        scope
        for spec in (_dict(s, "spec") for s in slices)
        for scope in (
            map(_scope, _list(spec, "devices"))
            if spec.get("perDeviceNodeSelection") is True
            else (_scope(spec),)
        )
    )
    if len(slices) != expected:
        problem = f"being updated: {len(slices)} of {expected} ResourceSlices seen"
        return Pool(driver, name, scopes=scopes, problem=problem)
    devices: list[Device] = []
    counters: dict[str, Mapping[str, int]] = {}
    problem = ""
    for obj in slices:
        spec, slice_name = _dict(obj, "spec"), str(_dict(obj, "metadata").get("name") or "")
        for counter_set in _list(spec, "sharedCounters"):
            set_name = str(counter_set.get("name") or "")
            if set_name in counters:
                problem = problem or f"invalid: counter set {_quoted(set_name)} is defined twice"
            counters[set_name] = _counters(counter_set)
        per_device = spec.get("perDeviceNodeSelection") is True
        for raw in _list(spec, "devices"):
            try:
                scope = _scope(raw) if per_device else _scope(spec)
                devices.append(_device(driver, name, raw, scope))
            except QuantityError as exc:
                what = f"device {_quoted(raw.get('name') or '')}: {exc}"
                problems.append(Problem("ResourceSlice", slice_name, what))
    names = Counter(d.name for d in devices)
    duplicate = next((n for n, count in names.items() if count > 1), None)
    if duplicate is not None:
        problem = problem or f"invalid: device name {_quoted(duplicate)} is used twice"
    for device in devices:
        unknown = _unknown_counter(device, counters)
        if unknown:
            problem = (
                problem or f"invalid: device {_quoted(device.name)} consumes unknown {unknown}"
            )
    if problem:
        return Pool(driver, name, scopes=scopes, problem=problem)
    return Pool(driver, name, tuple(devices), counters, scopes)


def _unknown_counter(device: Device, counters: Mapping[str, Mapping[str, int]]) -> str:
    for set_name, consumed in device.consumes.items():
        if set_name not in counters:
            return f"counter set {_quoted(set_name)}"
        missing = [c for c in consumed if c not in counters[set_name]]
        if missing:
            return f"counter {_quoted(missing[0])} of counter set {_quoted(set_name)}"
    return ""


def _device(driver: str, pool: str, raw: Obj, scope: NodeScope) -> Device:
    """A Device of a slice's device entry; QuantityError on a malformed quantity."""
    attributes = {}
    for key, value in _dict(raw, "attributes").items():
        parsed = _attribute(value)
        if parsed is not None:
            attributes[key if "/" in key else f"{driver}/{key}"] = parsed
    return Device(
        driver=driver,
        pool=pool,
        name=str(raw.get("name") or ""),
        attributes=attributes,
        capacity={str(k): _capacity(v) for k, v in _dict(raw, "capacity").items()},
        consumes={
            str(c.get("counterSet") or ""): _counters(c) for c in _list(raw, "consumesCounters")
        },
        multiple=raw.get("allowMultipleAllocations") is True,
        taints=tuple(taint_of(t) for t in _list(raw, "taints")),
        scope=scope,
    )


def _attribute(raw: object) -> AttributeValue | None:
    if not isinstance(raw, Mapping):
        return None
    if isinstance(raw.get("bool"), bool):
        return bool(raw["bool"])
    if isinstance(raw.get("int"), int):
        return int(raw["int"])
    if isinstance(raw.get("string"), str):
        return str(raw["string"])
    if isinstance(raw.get("version"), str):
        return Version(str(raw["version"]))
    for key, kind in (("bools", bool), ("ints", int), ("strings", str)):
        if isinstance(raw.get(key), list):
            return tuple(kind(v) for v in raw[key])
    if isinstance(raw.get("versions"), list):
        return tuple(Version(str(v)) for v in raw["versions"])
    return None


def _capacity(raw: object) -> Capacity:
    raw = raw if isinstance(raw, Mapping) else {}
    policy = _dict(raw, "requestPolicy")
    limits = _dict(policy, "validRange")

    def optional(obj: Obj, key: str) -> int | None:
        return None if obj.get(key) is None else parse_quantity(obj[key])

    return Capacity(
        value=parse_quantity(raw.get("value", "0")),
        default=optional(policy, "default"),
        valid_values=tuple(parse_quantity(v) for v in policy.get("validValues") or ()),
        minimum=optional(limits, "min"),
        maximum=optional(limits, "max"),
        step=optional(limits, "step"),
    )


def _counters(raw: Obj) -> dict[str, int]:
    counters = _dict(raw, "counters")
    return {str(name): parse_quantity(_dict(counters, name).get("value", "0")) for name in counters}


def _scope(raw: Obj) -> NodeScope:
    selector = raw.get("nodeSelector")
    return NodeScope(
        node_name=str(raw.get("nodeName") or ""),
        all_nodes=raw.get("allNodes") is True,
        node_selector=selector if isinstance(selector, Mapping) else None,
    )


def _unknown_drivers(slices: Sequence[Obj], classes: Iterable[DeviceClass]) -> list[Problem]:
    """Slices whose driver no DeviceClass names (`device.driver == "..."` in a selector);
    none when some class names no driver at all (it may select any)."""
    named: set[str] = set()
    for device_class in classes:
        drivers = {s.driver for s in device_class.selectors if s.driver is not None}
        if not drivers:
            return []
        named |= drivers
    problems = []
    for obj in slices:
        driver = str(_dict(obj, "spec").get("driver") or "")
        if driver not in named:
            name = str(_dict(obj, "metadata").get("name") or "")
            message = f"driver {_quoted(driver)} is not selected by any DeviceClass"
            problems.append(Problem("ResourceSlice", name, message))
    return problems


def _allocated(inventory: Inventory, claims: Iterable[Obj]) -> Usage:
    devices = {d.id: d for pool in inventory.pools for d in pool.devices}
    ledger = _Ledger(inventory, Usage())
    seen: set[tuple[str, str]] = set()
    for claim in claims:
        meta = _dict(claim, "metadata")
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if key in seen:
            continue
        seen.add(key)
        allocation = _dict(_dict(claim, "status"), "allocation")
        for result in _list(_dict(allocation, "devices"), "results"):
            if result.get("adminAccess") is True:
                continue
            device_id = (
                str(result.get("driver") or ""),
                str(result.get("pool") or ""),
                str(result.get("device") or ""),
            )
            consumed = {}
            for name, value in _dict(result, "consumedCapacity").items():
                try:
                    consumed[str(name)] = parse_quantity(value)
                except QuantityError:
                    continue
            device = devices.get(device_id) or Device(*device_id)
            shared = bool(result.get("shareID") or consumed or device.multiple)
            ledger.use(device, consumed, shared=shared)
    return ledger.freeze()


# --- allocation ------------------------------------------------------------------------------


def allocate(needs: ClaimNeeds, devices: NodeDevices, usage: Usage) -> Usage | Shortfall:
    """What is in use once one member with `needs` is placed on `devices`' node, or why it
    cannot be (see the module doc for how devices are chosen)."""
    if needs.problem is not None:
        return needs.problem
    for shared in needs.shared:
        if not devices.reaches(shared.scope):
            return Shortfall(
                f"claim {_quoted(shared.name)}: allocated ResourceClaim "
                f"{_quoted(shared.claim)} is not usable on this node"
            )
    ledger = _Ledger(devices.inventory, usage)
    for claim in needs.claims:
        outcome = _allocate_claim(claim, devices, ledger)
        if isinstance(outcome, Shortfall):
            return outcome
        ledger = outcome
    return ledger.freeze()


class _Ledger:
    """What is in use while one member's claims are allocated: the Usage it started from,
    untouched, and what this allocation added (copied cheaply when a choice is tried)."""

    def __init__(self, inventory: Inventory, usage: Usage) -> None:
        self.inventory = inventory
        self.base = usage
        self.taken: set[DeviceId] = set()
        self.shared: dict[DeviceId, dict[str, int]] = {}
        """Capacity consumed on the devices this allocation touched (totals, base included)."""
        self.counters: dict[CounterSetId, dict[str, int]] = {}
        """Counters consumed in the sets this allocation touched (totals, base included)."""
        self.claimed: set[DeviceId] = set()

    def copy(self) -> _Ledger:
        other = _Ledger(self.inventory, self.base)
        other.taken = set(self.taken)
        other.shared = {k: dict(v) for k, v in self.shared.items()}
        other.counters = {k: dict(v) for k, v in self.counters.items()}
        other.claimed = set(self.claimed)
        return other

    def freeze(self) -> Usage:
        """The usage now: the base with this allocation's additions."""
        base = self.base
        return Usage(
            base.taken | self.taken if self.taken else base.taken,
            {**base.shared, **self.shared} if self.shared else base.shared,
            {**base.counters, **self.counters} if self.counters else base.counters,
        )

    def _is_taken(self, device: Device) -> bool:
        return device.id in self.taken or device.id in self.base.taken

    def _is_shared(self, device: Device) -> bool:
        return device.id in self.shared or device.id in self.base.shared

    def _spent(self, device: Device) -> Mapping[str, int]:
        found = self.shared.get(device.id)
        return found if found is not None else self.base.shared.get(device.id, {})

    def _used(self, set_id: CounterSetId) -> Mapping[str, int]:
        found = self.counters.get(set_id)
        return found if found is not None else self.base.counters.get(set_id, {})

    def in_use(self, device: Device) -> bool:
        return self._is_taken(device) or self._is_shared(device)

    def available(self, device: Device, request: Request) -> bool:
        """Usable by `request`: not in this claim yet, and unused or allowing more allocations
        (admin access ignores other claims)."""
        if device.id in self.claimed:
            return False
        if request.admin:
            return True
        if self._is_taken(device):
            return False
        return device.multiple or not self._is_shared(device)

    def counters_left(self, device: Device) -> bool:
        if device.multiple and self._is_shared(device):
            return True  # counted when it was first allocated
        for set_name, needed in device.consumes.items():
            set_id = (device.driver, device.pool, set_name)
            total = self.inventory.counter_total(set_id)
            used = self._used(set_id)
            if any(total.get(c, 0) - used.get(c, 0) < v for c, v in needed.items()):
                return False
        return True

    def capacity_left(self, device: Device, consumed: Mapping[str, int]) -> bool:
        spent = self._spent(device) if device.multiple else {}
        return all(
            spent.get(name, 0) + amount <= device.capacity[name].value
            for name, amount in consumed.items()
        )

    def use(
        self, device: Device, consumed: Mapping[str, int], *, shared: bool, claim: bool = False
    ) -> None:
        if not self.in_use(device):
            for set_name, needed in device.consumes.items():
                set_id = (device.driver, device.pool, set_name)
                used = self.counters.setdefault(set_id, dict(self._used(set_id)))
                for counter, value in needed.items():
                    used[counter] = used.get(counter, 0) + value
        if shared:
            spent = self.shared.setdefault(device.id, dict(self._spent(device)))
            for name, amount in consumed.items():
                spent[name] = spent.get(name, 0) + amount
        else:
            self.taken.add(device.id)
        if claim:
            self.claimed.add(device.id)


def _allocate_claim(claim: Claim, devices: NodeDevices, ledger: _Ledger) -> _Ledger | Shortfall:
    choices = _constraint_choices(claim, devices)
    if isinstance(choices, Shortfall):
        return choices
    first: Shortfall | None = None
    for choice in choices:
        run = _ClaimRun(claim, devices, choice, ledger.copy())
        run.ledger.claimed = set()
        outcome = run.allocate()
        if outcome is None:
            return run.ledger
        if outcome.fatal:
            return outcome
        first = first or outcome
    assert first is not None
    return first


def _constraint_choices(
    claim: Claim, devices: NodeDevices
) -> list[tuple[Scalar | None, ...]] | Shortfall:
    """One value per `matchAttribute` constraint (None for distinct ones), combinations in
    device order; a Shortfall when no device of the node has a matched attribute."""
    options: list[list[Scalar | None]] = []
    for constraint in claim.constraints:
        if constraint.distinct:
            options.append([None])
            continue
        values: list[Scalar | None] = []
        for device in devices.devices:
            for value in _scalars(device.attributes.get(constraint.attribute)):
                if not any(_same(value, v) for v in values):
                    values.append(value)
        if not values:
            return Shortfall(
                f"claim {_quoted(claim.name)}: no device of the node has attribute "
                f"{_quoted(constraint.attribute)} (matchAttribute)"
            )
        options.append(values)
    return list(itertools.islice(itertools.product(*options), MAX_CONSTRAINT_CHOICES))


class _ClaimRun:
    """One claim allocated on one node, for one choice of `matchAttribute` values."""

    def __init__(
        self,
        claim: Claim,
        devices: NodeDevices,
        choice: tuple[Scalar | None, ...],
        ledger: _Ledger,
    ) -> None:
        self.claim, self.devices, self.choice, self.ledger = claim, devices, choice, ledger
        self.seen: dict[int, list[AttributeValue]] = {}
        """Values taken so far, per `distinctAttribute` constraint."""

    def allocate(self) -> Shortfall | None:
        """Every request of the claim into `ledger` (None), or why not."""
        for alternatives in self.claim.requests:
            failures: list[Shortfall] = []
            for request in alternatives:
                ledger, seen = self.ledger, self.seen
                self.ledger, self.seen = ledger.copy(), {k: list(v) for k, v in seen.items()}
                outcome = self._request(request)
                if outcome is None:
                    break
                self.ledger, self.seen = ledger, seen
                if outcome.fatal:
                    return outcome
                failures.append(outcome)
            else:
                return self._no_alternative(alternatives, failures)
        return None

    def _no_alternative(
        self, alternatives: Sequence[Request], failures: Sequence[Shortfall]
    ) -> Shortfall:
        if len(failures) == 1:
            return failures[0]
        parent = _where(self.claim.name, _base(alternatives[0].name))
        return Shortfall(
            f"{parent}: no subrequest can be satisfied",
            f"{parent}: no subrequest can be satisfied ({'; '.join(map(str, failures))})",
        )

    def _request(self, request: Request) -> Shortfall | None:
        where = _where(self.claim.name, request.name)
        device_class = self.devices.inventory.classes.get(request.device_class)
        if device_class is None:
            return _fatal(f"{where}: DeviceClass {_quoted(request.device_class)} not found")
        for selector in device_class.selectors:
            if not selector.evaluable:
                owner = (
                    f"claim {_quoted(self.claim.name)}: DeviceClass {_quoted(device_class.name)}"
                )
                return _not_evaluable(owner, selector.expression)
        if request.mode == ALL:
            return self._all(request, device_class, where)
        kind = f"class {_quoted(request.device_class)}"
        got = 0
        for device in self.devices.devices:
            if got == request.count:
                break
            if not self.ledger.available(device, request):
                continue  # kube-scheduler checks this first, selectors next
            selected = _selected(self.devices.inventory, device, device_class, request)
            if isinstance(selected, CelError):
                return _cel_failure(where, device, selected)
            consumed = self._qualifies(request, device) if selected else None
            if consumed is not None:
                self._take(request, device, consumed)
                got += 1
        if got < request.count:
            return Shortfall(
                f"{where}: too few free devices of {kind}",
                f"{where}: {_plural(request.count, 'device')} of {kind} needed, {got} free",
            )
        return None

    def _all(self, request: Request, device_class: DeviceClass, where: str) -> Shortfall | None:
        kind = f"class {_quoted(request.device_class)}"
        if self.devices.pending:
            pool = _quoted(self.devices.pending[0])
            text = f"{where}: all devices of {kind} needed, pool {pool} is being updated or invalid"
            return Shortfall(text)
        matching = []
        for device in self.devices.devices:
            selected = _selected(self.devices.inventory, device, device_class, request)
            if isinstance(selected, CelError):
                return _cel_failure(where, device, selected)
            if selected and _consumption(device, request) is not None:
                matching.append(device)
        if not matching:
            return Shortfall(f"{where}: all devices of {kind} needed, none on the node")
        free = 0
        for device in matching:
            available = self.ledger.available(device, request)
            consumed = self._qualifies(request, device) if available else None
            if consumed is not None:
                self._take(request, device, consumed)
                free += 1
        if free < len(matching):
            return Shortfall(
                f"{where}: not all devices of {kind} are free",
                f"{where}: all {_plural(len(matching), 'device')} of {kind} needed, {free} free",
            )
        return None

    def _qualifies(self, request: Request, device: Device) -> dict[str, int] | None:
        """What `device` would consume for `request`, or None when it does not qualify:
        taints, constraints, capacity, counters (selectors and use are checked before)."""
        for taint in device.taints:
            if taint.effect in BLOCKING_TAINT_EFFECTS and not any(
                t.tolerates(taint) for t in request.tolerations
            ):
                return None
        for index, constraint in enumerate(self.claim.constraints):
            if not constraint.covers(request.name):
                continue
            value = device.attributes.get(constraint.attribute)
            if value is None:
                return None
            if constraint.distinct:
                if any(_same(value, v) for v in self.seen.get(index, [])):
                    return None
            elif not any(_same(self.choice[index], v) for v in _scalars(value)):
                return None
        consumed = _consumption(device, request)
        if consumed is None or not self.ledger.capacity_left(device, consumed):
            return None
        return consumed if self.ledger.counters_left(device) else None

    def _take(self, request: Request, device: Device, consumed: Mapping[str, int]) -> None:
        for index, constraint in enumerate(self.claim.constraints):
            value = device.attributes.get(constraint.attribute)
            if constraint.distinct and constraint.covers(request.name) and value is not None:
                self.seen.setdefault(index, []).append(value)
        if request.admin:
            self.ledger.claimed.add(device.id)
        else:
            self.ledger.use(device, consumed, shared=device.multiple, claim=True)


def _selected(
    inventory: Inventory, device: Device, device_class: DeviceClass, request: Request
) -> bool | CelError:
    """Whether the class's, then the request's, selectors hold (memoised per inventory)."""
    key = (device.id, device_class.name, tuple(s.expression for s in request.selectors))
    if key not in inventory._matches:
        inventory._matches[key] = _evaluate(device, (*device_class.selectors, *request.selectors))
    return inventory._matches[key]


def _cel_failure(where: str, device: Device, error: CelError) -> Shortfall:
    return Shortfall(
        f"{where}: CEL selector fails: {error.message}",
        f"{where}: CEL selector fails on device {_quoted(device)}: {error.message}",
        fatal=True,
    )


def _evaluate(device: Device, selectors: Sequence[Selector]) -> bool | CelError:
    for selector in selectors:
        outcome = selector.matches(device)
        if isinstance(outcome, CelError):
            return CelError(f"{outcome.message} (in {_short_expression(selector.expression)})")
        if not outcome:
            return False
    return True


def _consumption(device: Device, request: Request) -> dict[str, int] | None:
    """Capacity one allocation of `request` consumes on `device`; None if it cannot have it."""
    if any(name not in device.capacity for name in request.capacity):
        return None
    consumed = {}
    for name, capacity in device.capacity.items():
        amount = capacity.consumed(request.capacity.get(name))
        if amount is None or amount > capacity.value:
            return None
        consumed[name] = amount
    return consumed


# --- CEL -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """A compiled CEL device selector; `node` None: outside the subset gangcheck evaluates."""

    expression: str
    node: _Node | None = None

    @property
    def evaluable(self) -> bool:
        return self.node is not None

    @property
    def driver(self) -> str | None:
        """The driver the selector requires (`device.driver == "x"`, at the top level)."""
        return _named_driver(self.node) if self.node is not None else None

    def matches(self, device: Device) -> bool | CelError:
        if self.node is None:
            return CelError("not evaluable")
        value = self.node.eval(device)
        if isinstance(value, CelError) or type(value) is bool:
            return value
        return CelError(f"result is {_type_name(value)}, not bool")


def compile_selector(expression: str) -> Selector:
    """Compile a CEL selector of the subset below; anything else is not evaluable.

    Operands: `device.driver`, `device.allowMultipleAllocations`,
    `device.attributes["domain"].name` (or `["name"]`), `device.capacity["domain"].name` (or
    `["name"]`); literals: strings, integers, `true`, `false`, `quantity("40Gi")`.
    Operators: `==`, `!=` (any values; different types are unequal), `<`, `<=`, `>`, `>=`
    (integers, strings, booleans), `!`, `&&`, `||`, parentheses; `has(device.attributes[
    "domain"].name)` (and capacity); on capacities `.compareTo(quantity(...))` (an integer),
    `.isGreaterThan(...)`, `.isLessThan(...)`. kube-apiserver refuses `<` and friends
    between quantities, so they are not in the subset either.
    """
    try:
        node = _Parser(_tokens(expression)).parse()
    except _Unsupported:
        return Selector(expression)
    return Selector(expression, node)


class _Unsupported(Exception):
    """The expression is outside the evaluated subset."""


_TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
    r"|(?P<int>[0-9]+)(?![0-9A-Za-z_.])"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!.\[\](),-])"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))",
    re.ASCII,
)
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r"}
_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
_QUANTITY_METHODS = frozenset({"compareTo", "isGreaterThan", "isLessThan"})


def _tokens(expression: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    text = expression.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise _Unsupported
        kind = match.lastgroup or ""
        value = match.group(kind)
        tokens.append((kind, _unescape(value) if kind == "string" else value))
        position = match.end()
    return tokens


def _unescape(literal: str) -> str:
    body, out, index = literal[1:-1], [], 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            escaped = body[index + 1 : index + 2]
            if escaped not in _ESCAPES:
                raise _Unsupported
            out.append(_ESCAPES[escaped])
            index += 2
        else:
            out.append(char)
            index += 1
    return "".join(out)


class _Node:
    def eval(self, device: Device) -> CelValue | CelError:
        raise NotImplementedError


@dataclass(frozen=True)
class _Literal(_Node):
    value: CelValue

    def eval(self, device: Device) -> CelValue | CelError:
        return self.value


@dataclass(frozen=True)
class _Field(_Node):
    """`device.driver` or `device.allowMultipleAllocations`."""

    name: str

    def eval(self, device: Device) -> CelValue | CelError:
        return device.driver if self.name == "driver" else device.multiple


@dataclass(frozen=True)
class _Lookup(_Node):
    """`device.attributes[domain].name` or `device.capacity[domain].name`."""

    capacity: bool
    domain: str
    name: str

    def eval(self, device: Device) -> CelValue | CelError:
        if self.capacity:
            found = device.capacity_of(self.domain, self.name)
            return Quantity(found.value) if found is not None else _no_key(self.name)
        value = device.attribute(self.domain, self.name)
        return value if value is not None else _no_key(self.name)


@dataclass(frozen=True)
class _Has(_Node):
    lookup: _Lookup

    def eval(self, device: Device) -> CelValue | CelError:
        return not isinstance(self.lookup.eval(device), CelError)


@dataclass(frozen=True)
class _Not(_Node):
    operand: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        value = self.operand.eval(device)
        if isinstance(value, CelError):
            return value
        return (not value) if type(value) is bool else _no_overload("!_", value)


@dataclass(frozen=True)
class _Logic(_Node):
    """`&&` (`conjunction`) or `||`, commutative over errors as in CEL."""

    conjunction: bool
    left: _Node
    right: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        decisive = not self.conjunction
        values = [self.left.eval(device), self.right.eval(device)]
        if any(type(v) is bool and v is decisive for v in values):
            return decisive
        for value in values:
            if isinstance(value, CelError):
                return value
            if type(value) is not bool:
                return _no_overload("_&&_" if self.conjunction else "_||_", value)
        return not decisive


@dataclass(frozen=True)
class _Relation(_Node):
    operator: str
    left: _Node
    right: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        left, right = self.left.eval(device), self.right.eval(device)
        if isinstance(left, CelError):
            return left
        if isinstance(right, CelError):
            return right
        if self.operator in ("==", "!="):
            return _same(left, right) == (self.operator == "==")
        if type(left) is not type(right) or not isinstance(left, bool | int | str):
            return _no_overload(f"_{self.operator}_", left, right)
        return {
            "<": left < right,  # type: ignore[operator]
            "<=": left <= right,  # type: ignore[operator]
            ">": left > right,  # type: ignore[operator]
            ">=": left >= right,  # type: ignore[operator]
        }[self.operator]


@dataclass(frozen=True)
class _Method(_Node):
    """`quantity.compareTo(q)`, `.isGreaterThan(q)`, `.isLessThan(q)`."""

    target: _Node
    method: str
    argument: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        target, argument = self.target.eval(device), self.argument.eval(device)
        if isinstance(target, CelError):
            return target
        if isinstance(argument, CelError):
            return argument
        if not isinstance(target, Quantity) or not isinstance(argument, Quantity):
            return _no_overload(self.method, target, argument)
        order = (target.nanos > argument.nanos) - (target.nanos < argument.nanos)
        return {"compareTo": order, "isGreaterThan": order > 0, "isLessThan": order < 0}[
            self.method
        ]


class _Parser:
    """Recursive descent over the subset; raises _Unsupported on anything else."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.index = 0

    def parse(self) -> _Node:
        node = self._or()
        if self.index != len(self.tokens):
            raise _Unsupported
        return node

    def _peek(self) -> str:
        """The next operator, or ""."""
        if self.index < len(self.tokens) and self.tokens[self.index][0] == "op":
            return self.tokens[self.index][1]
        return ""

    def _next(self, kind: str | None = None) -> str:
        if self.index >= len(self.tokens):
            raise _Unsupported
        token_kind, value = self.tokens[self.index]
        if kind is not None and token_kind != kind:
            raise _Unsupported
        self.index += 1
        return value

    def _expect(self, text: str) -> None:
        if self._next() != text:
            raise _Unsupported

    def _take(self, text: str) -> bool:
        if self._peek() == text:
            self.index += 1
            return True
        return False

    def _or(self) -> _Node:
        node = self._and()
        while self._take("||"):
            node = _Logic(False, node, self._and())
        return node

    def _and(self) -> _Node:
        node = self._relation()
        while self._take("&&"):
            node = _Logic(True, node, self._relation())
        return node

    def _relation(self) -> _Node:
        left = self._unary()
        operator = self._peek()
        if operator not in _RELATIONS:
            return left
        self.index += 1
        right = self._unary()
        if _is_quantity(left) or _is_quantity(right) or self._peek() in _RELATIONS:
            raise _Unsupported
        return _Relation(operator, left, right)

    def _unary(self) -> _Node:
        if self._take("!"):
            return _Not(self._unary())
        return self._operand()

    def _operand(self) -> _Node:
        kind, value = self.tokens[self.index] if self.index < len(self.tokens) else ("", "")
        if kind == "string":
            self.index += 1
            return _Literal(value)
        if kind == "int":
            self.index += 1
            return _Literal(int(value))
        if (kind, value) == ("op", "-"):
            self.index += 1
            return _Literal(-int(self._next("int")))
        if (kind, value) == ("op", "("):
            self.index += 1
            node = self._or()
            self._expect(")")
            return node
        if kind != "ident":
            raise _Unsupported
        self.index += 1
        if value in ("true", "false"):
            return _Literal(value == "true")
        if value == "quantity":
            return self._quantity()
        if value == "has":
            self._expect("(")
            lookup = self._device(dotted_only=True)
            self._expect(")")
            if not isinstance(lookup, _Lookup):
                raise _Unsupported
            return _Has(lookup)
        if value == "device":
            return self._methods(self._device_rest(dotted_only=False))
        raise _Unsupported

    def _quantity(self) -> _Literal:
        self._expect("(")
        text = self._next("string")
        self._expect(")")
        try:
            return _Literal(Quantity(parse_quantity(text)))
        except QuantityError as exc:
            raise _Unsupported from exc

    def _device(self, *, dotted_only: bool) -> _Node:
        if self._next("ident") != "device":
            raise _Unsupported
        return self._device_rest(dotted_only=dotted_only)

    def _device_rest(self, *, dotted_only: bool) -> _Node:
        self._expect(".")
        name = self._next("ident")
        if name in ("driver", "allowMultipleAllocations"):
            return _Field(name)
        if name not in ("attributes", "capacity"):
            raise _Unsupported
        self._expect("[")
        domain = self._next("string")
        self._expect("]")
        if self._take("."):
            return _Lookup(name == "capacity", domain, self._next("ident"))
        if dotted_only:
            raise _Unsupported
        self._expect("[")
        key = self._next("string")
        self._expect("]")
        return _Lookup(name == "capacity", domain, key)

    def _methods(self, node: _Node) -> _Node:
        if not (isinstance(node, _Lookup) and node.capacity and self._peek() == "."):
            return node
        self._expect(".")
        method = self._next("ident")
        if method not in _QUANTITY_METHODS:
            raise _Unsupported
        self._expect("(")
        argument = self._operand()
        self._expect(")")
        if not _is_quantity(argument):
            raise _Unsupported
        return _Method(node, method, argument)


def _is_quantity(node: _Node) -> bool:
    return (isinstance(node, _Lookup) and node.capacity) or (
        isinstance(node, _Literal) and isinstance(node.value, Quantity)
    )


def _named_driver(node: _Node) -> str | None:
    if isinstance(node, _Logic) and node.conjunction:
        return _named_driver(node.left) or _named_driver(node.right)
    if isinstance(node, _Relation) and node.operator == "==":
        for one, other in ((node.left, node.right), (node.right, node.left)):
            if one == _Field("driver") and isinstance(other, _Literal):
                return other.value if isinstance(other.value, str) else None
    return None


def _no_key(name: str) -> CelError:
    return CelError(f"no such key: {name}")


def _no_overload(operator: str, *values: CelValue) -> CelError:
    kinds = ", ".join(_type_name(v) for v in values)
    return CelError(f"no matching overload for {operator!r} applied to ({kinds})")


def _type_name(value: CelValue) -> str:
    if type(value) is bool:
        return "bool"
    if isinstance(value, tuple):
        return "list"
    return {int: "int", str: "string", Version: "semver", Quantity: "quantity"}.get(
        type(value), type(value).__name__
    )


# --- small helpers ---------------------------------------------------------------------------


def _same(left: object, right: object) -> bool:
    """CEL equality: values of different types are unequal (so `1 != true`)."""
    return type(left) is type(right) and left == right


def _scalars(value: AttributeValue | None) -> tuple[Scalar, ...]:
    if value is None:
        return ()
    return value if isinstance(value, tuple) else (value,)


def _base(request: str) -> str:
    return request.split("/", 1)[0]


def _where(claim: str, request: str) -> str:
    return f"claim {_quoted(claim)} request {_quoted(request)}"


def _fatal(text: str) -> Shortfall:
    return Shortfall(text, text, fatal=True)


def _not_evaluable(owner: str, expression: str) -> Shortfall:
    head = f"{owner}: CEL selector gangcheck cannot evaluate: "
    return Shortfall(head + _short_expression(expression), head + expression, fatal=True)


def _short_expression(expression: str) -> str:
    flat = " ".join(expression.split())
    return flat if len(flat) <= SHORT_EXPRESSION else flat[: SHORT_EXPRESSION - 1] + "…"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _quoted(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _expressions(spec: Obj) -> list[str]:
    return [str(_dict(s, "cel").get("expression") or "") for s in _list(spec, "selectors")]


def _by_name(objects: Iterable[Obj]) -> dict[str, Obj]:
    return {str(_dict(o, "metadata").get("name") or ""): o for o in objects}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _dict(obj: Obj, key: str) -> Obj:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(obj: Obj, key: str) -> list[Obj]:
    value = obj.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]
