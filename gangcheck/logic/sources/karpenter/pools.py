"""Which NodePool can take a gang: its labels and requirements, and the room its limits leave.

A flavor's node labels must be labels the pool's nodes can carry: set by its template, allowed
by its requirements, or well known (zone, instance type, arch, os, capacity type), which is
what Karpenter itself demands of a pod's node selector.

Karpenter enforces a NodePool's ``spec.limits`` only on the claims it creates; a claim created
through the API launches whatever the limits. So gangcheck checks the room first and asks for
nothing when the whole gang does not fit. The room is ``spec.limits`` minus what the pool's
claims use (``pool_use``), worked out as Karpenter's counter counts, without waiting for it:

- ``status.resources`` is written by Karpenter's counter (``nodepool/counter``, every few
  seconds) from its cluster state (``state/cluster.go``, ``updateNodePoolResources``): the
  capacity of every *launched* claim (one with a provider id) of the pool plus one node each,
  leaving out claims being deleted or whose instance is terminating. It lags: a claim
  launched since its last write is missing, one deleted since is still there;
- a claim not launched yet is never in ``status.resources``: counted here by what it asks
  (``spec.resources.requests``), one node each. Claims gangcheck has just created (in this
  pass, not yet listed) are passed in with the listed ones and count the same way;
- launched claims may or may not be in ``status.resources`` yet: counted once, by whichever
  of ``status.resources`` and their own sum (their ``status.capacity``, else what they ask)
  is larger, so a claim is never counted twice and the count never drops below what
  Karpenter reported;
- claims being deleted (``deletionTimestamp``, or ``InstanceTerminating``) count nothing, as
  in Karpenter.

A node's use of a limited resource is estimated by what the claim requests of it; ``nodes``
counts one per claim.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gangcheck.logic.placement.quantity import QuantityError, format_quantity, parse_quantity
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.packing import Packing, admits
from gangcheck.model.objects import Obj
from gangcheck.model.provisioning_config import AtomicProvisioningSpec

NODES = "nodes"


def _template(pool: Obj) -> Obj:
    return ((pool.get("spec") or {}).get("template")) or {}


def label_problem(pool: Obj, key: str, value: str) -> str | None:
    """Why nodes of ``pool`` cannot carry ``key=value`` (None: they can)."""
    name = (pool.get("metadata") or {}).get("name", "")
    fixed = (_template(pool).get("metadata") or {}).get("labels") or {}
    if key in fixed and fixed[key] != value:
        return f"NodePool {name!r} sets {key}={fixed[key]}, not {value}"
    requirements = [
        r
        for r in (_template(pool).get("spec") or {}).get("requirements") or []
        if r.get("key") == key
    ]
    refused = [r for r in requirements if not admits(r, value)]
    if refused:
        r = refused[0]
        return f"NodePool {name!r} requires {key} {r.get('operator')} {r.get('values', [])}"
    if key in fixed or requirements or key in names.WELL_KNOWN_LABELS:
        return None
    return (
        f"NodePool {name!r} does not define label {key} "
        "(neither its template labels nor its requirements)"
    )


def labels_problem(pool: Obj, labels: Mapping[str, str]) -> str | None:
    problems = [label_problem(pool, k, v) for k, v in sorted(labels.items())]
    found = [p for p in problems if p]
    return "; ".join(found) if found else None


def _is_of_pool(claim: Obj, name: str) -> bool:
    labels = (claim.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(names.NODE_POOL_LABEL) == name)


def _is_going(claim: Obj) -> bool:
    """Being deleted, or its instance terminating: Karpenter counts it no more."""
    if (claim.get("metadata") or {}).get("deletionTimestamp"):
        return True
    conditions = (claim.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "InstanceTerminating" and c.get("status") == "True" for c in conditions
    )


def is_launched(claim: Obj) -> bool:
    """Has a provider id: from then on Karpenter's cluster state counts it."""
    return bool((claim.get("status") or {}).get("providerID"))


def _amount(claim: Obj, resource: str) -> int:
    """What one claim takes of ``resource``: its capacity once launched, else what it asks."""
    if resource == NODES:
        return parse_quantity("1")
    capacity = (claim.get("status") or {}).get("capacity") or {}
    asked = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    amount = capacity.get(resource) if is_launched(claim) else None
    try:
        return parse_quantity(amount if amount is not None else asked.get(resource, "0"))
    except QuantityError:
        return 0


@dataclass(frozen=True)
class PoolUse:
    """What a pool's limits are charged with (see the module doc)."""

    reported: Mapping[str, str]
    """``status.resources``: Karpenter's count as of its last write."""
    launched: tuple[Obj, ...]
    """Live launched claims: in ``reported`` already, or not yet."""
    unlaunched: tuple[Obj, ...]
    """Live claims without a provider id (listed, or created a moment ago): never reported."""

    @property
    def claims(self) -> int:
        return len(self.launched) + len(self.unlaunched)

    def used(self, resource: str) -> int:
        try:
            reported = parse_quantity(self.reported.get(resource, "0"))
        except QuantityError:
            reported = 0
        launched = sum(_amount(c, resource) for c in self.launched)
        return max(reported, launched) + sum(_amount(c, resource) for c in self.unlaunched)


def pool_use(pool: Obj, claims: Iterable[Obj]) -> PoolUse:
    """The use of ``pool`` by ``claims`` (every NodeClaim known, of any pool: those listed
    and those just created) and by what Karpenter reported."""
    name = (pool.get("metadata") or {}).get("name", "")
    live = [c for c in claims if _is_of_pool(c, name) and not _is_going(c)]
    return PoolUse(
        reported=(pool.get("status") or {}).get("resources") or {},
        launched=tuple(c for c in live if is_launched(c)),
        unlaunched=tuple(c for c in live if not is_launched(c)),
    )


def room(pool: Obj, per_node: Mapping[str, str], claims: Iterable[Obj] = ()) -> int | None:
    """How many more nodes of ``per_node`` the pool's limits allow, charged with its use by
    ``claims`` (None: no limit applies)."""
    limits = (pool.get("spec") or {}).get("limits") or {}
    use = pool_use(pool, claims)
    fits: list[int] = []
    for resource, limit in limits.items():
        each = "1" if resource == NODES else per_node.get(resource)
        if each is None:
            continue  # the claim asks nothing of it: the instance's share is unknown here
        try:
            left = parse_quantity(limit) - use.used(resource)
            need = parse_quantity(each)
        except QuantityError:
            continue
        if need > 0:
            fits.append(max(0, left // need))
    return min(fits) if fits else None


def claims_room(
    pool: Obj, asks: Sequence[Mapping[str, str]], claims: Iterable[Obj] = ()
) -> int | None:
    """How many of ``asks`` (each a claim's requests, one node each), taken in order, the
    pool's limits allow, charged with its use by ``claims`` (None: no limit applies). For
    claims all alike, what ``room`` says, capped at their number."""
    limits = (pool.get("spec") or {}).get("limits") or {}
    use = pool_use(pool, claims)
    left: dict[str, int] = {}
    for resource, limit in limits.items():
        try:
            left[resource] = parse_quantity(limit) - use.used(resource)
        except QuantityError:
            continue
    if not left:
        return None
    taken = 0
    for ask in asks:
        need = {r: _need(ask, r) for r in left}
        if any(n > 0 and n > left[r] for r, n in need.items()):
            break
        for resource, amount in need.items():
            left[resource] -= amount
        taken += 1
    return taken


def _need(ask: Mapping[str, str], resource: str) -> int:
    """What one claim asks of a limited resource (nothing it does not ask for: the machine's
    share is unknown here, as in ``room``)."""
    try:
        return parse_quantity("1" if resource == NODES else ask.get(resource, "0"))
    except QuantityError:
        return 0


def _use_note(pool: Obj, claims: Iterable[Obj]) -> str:
    """Says what the limits are charged with, when claims count (empty: only reported use)."""
    use = pool_use(pool, claims)
    if not use.claims:
        return ""
    limits = (pool.get("spec") or {}).get("limits") or {}
    used = ", ".join(f"{r}={format_quantity(use.used(r))}" for r in sorted(limits))
    return f" (in use or asked, {use.claims} NodeClaims counted: {used})"


def limit_names(pool: Obj) -> str:
    limits = (pool.get("spec") or {}).get("limits") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(limits.items()))


@dataclass(frozen=True)
class PoolChoice:
    """The pool the gang's claims go to, or why none can take them (naming the config field)."""

    pool: Obj | None
    problem: str = ""
    #: The gang cannot be whole in any pool now (limits), but may be later: a failed attempt,
    #: not a bad config.
    no_room: bool = False
    #: The claims the gang takes in ``pool`` (with ``packing``).
    packing: Packing | None = None
    #: A member no instance type of any usable pool can take.
    too_big: bool = False


#: The field of ``spec.backend: Karpenter``'s NodePools.
FIELD = "spec.karpenter.nodePools"


def source_field(index: int | None) -> str:
    """The field naming a place's NodePools: ``spec.karpenter.nodePools`` for the top-level
    ``spec.karpenter`` (``index`` None), else capacity source ``index``'s."""
    if index is None:
        return FIELD
    return f"spec.capacitySources[{index}].karpenter.nodePools"


def named_pools(spec: AtomicProvisioningSpec) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Every list of NodePools ``spec`` names, each with its field (``source_field``): the
    top-level ``spec.karpenter``, or each Karpenter capacity source's, in order."""
    if spec.capacity_sources is None:
        return ((FIELD, spec.karpenter.node_pools),) if spec.karpenter is not None else ()
    return tuple(
        (source_field(i), source.karpenter.node_pools)
        for i, source in enumerate(spec.capacity_sources)
        if source.karpenter is not None
    )


def choose_pool(
    pools: Mapping[str, Obj | None],
    wanted: Sequence[str],
    *,
    labels: Mapping[str, str],
    per_node: Mapping[str, str] | None = None,
    nodes: int = 0,
    claims: Sequence[Obj] = (),
    packing: Callable[[Obj], Packing] | None = None,
    field: str = FIELD,
) -> PoolChoice:
    """The first pool of ``wanted`` (in config order) that exists, can carry ``labels`` and has
    room for the gang's claims: ``nodes`` claims of ``per_node`` each, or those ``packing``
    makes of the gang in that pool (a pool it cannot pack the gang into is passed over, saying
    why). ``pools``: every pool by name (absent: not found); ``claims``: every NodeClaim known,
    those just created included (their use is charged to the room); ``field``: where the config
    names ``wanted`` (``source_field``), as the problems say."""
    problems: list[str] = []
    rooms: list[str] = []
    too_big = False
    for i, name in enumerate(wanted):
        pool = pools.get(name)
        if pool is None:
            problems.append(f"{field}[{i}]: NodePool {name!r} not found")
            continue
        problem = labels_problem(pool, labels)
        if problem:
            problems.append(f"{field}[{i}]: {problem}")
            continue
        packed = packing(pool) if packing is not None else None
        if packed is not None and packed.problem:
            problems.append(f"{field}[{i}]: {packed.problem}")
            too_big = too_big or packed.too_big
            continue
        asks = (
            [c.asked() for c in packed.claims] if packed is not None else [per_node or {}] * nodes
        )
        left = claims_room(pool, asks, claims)
        if left is None or left >= len(asks):
            return PoolChoice(pool, packing=packed)
        rooms.append(
            f"NodePool {name!r}: limits {limit_names(pool)} leave room for {left} of "
            f"{len(asks)} nodes{_use_note(pool, claims)}"
        )
    if rooms:
        return PoolChoice(None, "; ".join(rooms), no_room=True)
    problem = "; ".join(problems) or f"{field}: no NodePool named"
    return PoolChoice(None, problem, too_big=too_big)


def unusable_pools(
    named: Sequence[tuple[str, Sequence[str]]], served: Mapping[str, Obj] | None
) -> str | None:
    """Why a config's NodePools cannot be used at all (None: all exist). ``named``: each list
    of NodePools the config names with its field (``named_pools``); ``served``: the cluster's
    NodePools by name, None when Karpenter's API is not served."""
    if served is None:
        return (
            "the Karpenter backend is unavailable: the API server does not serve "
            "karpenter.sh/v1 NodePools (install Karpenter's CRDs)"
        )
    missing = [
        f"{field}[{i}]: NodePool {n!r} not found"
        for field, wanted in named
        for i, n in enumerate(wanted)
        if n not in served
    ]
    return "; ".join(missing) or None
