"""DRA's values and objects as the fit sees them: devices, pools, the inventory, what a
member claims (see the package doc)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gangcheck.logic.placement.raw import dict_at, list_at
from gangcheck.logic.placement.reasons import Rejection
from gangcheck.logic.placement.taints import Taint, Toleration

if TYPE_CHECKING:
    from gangcheck.logic.placement.dra.cel import Selector

from gangcheck.model.objects import ReadOnlyObj as Obj

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
class Shortfall(Rejection):
    """Why a node's devices cannot serve a member: a `Rejection` (`short` groups alike
    nodes, `detail` names values) that may be `fatal`: the same on every node (an error, a
    missing class), so no alternative is tried."""

    fatal: bool = False


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
class DeviceCapacity:
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
    capacity: Mapping[str, DeviceCapacity] = field(default_factory=dict)
    consumes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    multiple: bool = False
    taints: tuple[Taint, ...] = ()
    scope: NodeScope = field(default_factory=NodeScope)

    @functools.cached_property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    @functools.cached_property
    def shape(self) -> tuple[object, ...]:
        """All that allocation reads of the device but its identity (pool and name, which CEL
        cannot see): devices of one shape, alike in use, serve the same claims."""
        consumes = tuple(sorted((k, tuple(sorted(v.items()))) for k, v in self.consumes.items()))
        return (
            self.driver,
            tuple(sorted(self.attributes.items())),
            tuple(sorted(self.capacity.items())),
            consumes,
            self.multiple,
            self.taints,
        )

    def attribute(self, domain: str, name: str) -> AttributeValue | None:
        return self.attributes.get(f"{domain}/{name}")

    def capacity_of(self, domain: str, name: str) -> DeviceCapacity | None:
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
    allow multiple allocations (in use while listed), counters consumed from counter sets.
    Allocation never changes one (it returns a new one); a fit attempt adds to its own copy."""

    taken: Set[DeviceId] = frozenset()
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
    _reach: dict[str, tuple[object, NodeDevices]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _problem_pools: tuple[Pool, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_problem_pools", tuple(p for p in self.pools if p.problem))

    """Devices of usable pools by the one node they name (built on first use), and under ""
    those whose scope is every node or a selector: a node looks only at its own and those."""

    def on_node(
        self, node: str, reaches: Callable[[NodeScope], bool], *, of: object = None
    ) -> NodeDevices:
        """The devices `node` reaches; `reaches` tells whether a scope includes the node.

        `of`: what `reaches` was made of (the node's view): the answer is kept, and given
        again while it is asked for with that very object."""
        if of is not None:
            kept = self._reach.get(node)
            if kept is not None and kept[0] is of:
                return kept[1]
        found = self._on_node(node, reaches)
        if of is not None:
            self._reach[node] = (of, found)
        return found

    def _on_node(self, node: str, reaches: Callable[[NodeScope], bool]) -> NodeDevices:
        seen: dict[int, bool] = {}

        def reached(scope: NodeScope) -> bool:
            if id(scope) not in seen:
                seen[id(scope)] = reaches(scope)
            return seen[id(scope)]

        index = self._device_index()
        candidates = sorted([*index.get(node, ()), *index.get("", ())], key=lambda e: e[:2])
        devices = tuple(d for _, _, d in candidates if reached(d.scope))
        pending = tuple(str(pool) for pool in self._unusable() if any(map(reached, pool.scopes)))
        return NodeDevices(node, devices, pending, reaches, self)

    def _unusable(self) -> tuple[Pool, ...]:
        """The pools offering nothing right now."""
        return self._problem_pools

    def nodes_reaching(self) -> frozenset[str] | None:
        """The nodes a device of a usable pool names; None when some device reaches nodes by
        a selector or all of them (then any node may reach one), or a pool offers nothing
        right now (the nodes it reaches are told apart from those reaching nothing)."""
        index = self._device_index()
        return None if "" in index or self._problem_pools else frozenset(index)

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

    @functools.cached_property
    def layout(self) -> tuple[object, ...]:
        """What allocation reads of the node's devices that use does not change: each
        device's shape, which of the node's pools it is in (counters are shared within a
        pool), its counter sets' totals; and whether a pool reaching it offers nothing now."""
        pools: dict[tuple[str, str], int] = {}
        parts = []
        for device in self.devices:
            pool = pools.setdefault((device.driver, device.pool), len(pools))
            totals = tuple(
                (name, tuple(sorted(self.inventory.counter_total(counter_set).items())))
                for name, counter_set in _counter_sets(device)
            )
            parts.append((device.shape, pool, totals))
        return (tuple(parts), bool(self.pending))

    @functools.cached_property
    def device_ids(self) -> frozenset[DeviceId]:
        return frozenset(device.id for device in self.devices)

    @functools.cached_property
    def counter_sets(self) -> tuple[CounterSetId, ...]:
        """The counter sets the node's devices consume from."""
        return tuple({cs: None for d in self.devices for _, cs in _counter_sets(d)})

    def use(self, usage: Usage) -> tuple[object, ...] | None:
        """What of `usage` allocation reads on this node, per device (taken, capacity
        consumed, its counters' use); None when none of it touches the node's devices; the
        positions of the devices taken when that is all."""
        shared, counters, taken = usage.shared, usage.counters, usage.taken
        if not (shared and any(i in shared for i in self.device_ids)) and not (
            counters and any(cs in counters for cs in self.counter_sets)
        ):
            # Only whole devices taken, if any: which of them says it all (the rest of each
            # device's part below follows from the layout).
            if self.device_ids.isdisjoint(taken):
                return None
            return tuple(i for i, device in enumerate(self.devices) if device.id in taken)
        parts = []
        for device in self.devices:
            spent = shared.get(device.id)
            used = tuple(
                (name, tuple(sorted(counters.get(counter_set, {}).items())))
                for name, counter_set in _counter_sets(device)
            )
            spent_items = None if spent is None else tuple(sorted(spent.items()))
            parts.append((device.id in usage.taken, spent_items, used))
        return tuple(parts)


def _counter_sets(device: Device) -> Iterable[tuple[str, CounterSetId]]:
    return ((name, (device.driver, device.pool, name)) for name in device.consumes)


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
    def needs_a_device(self) -> bool:
        """Whether a node reaching no device surely cannot serve it: some request of a claim
        needs at least one device whichever alternative is taken."""
        return any(
            alts and all(alt.mode == ALL or alt.count > 0 for alt in alts)
            for claim in self.claims
            for alts in claim.requests
        )

    @property
    def device_count(self) -> int:
        """Devices asked for (an `All` request or a `firstAvailable` one counts its first)."""
        return sum(alts[0].count for claim in self.claims for alts in claim.requests if alts)


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
    return [str(dict_at(s, "cel").get("expression") or "") for s in list_at(spec, "selectors")]


def _by_name(objects: Iterable[Obj]) -> dict[str, Obj]:
    return {str(dict_at(o, "metadata").get("name") or ""): o for o in objects}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
