"""How a gang's members are packed onto NodeClaims: as few claims as the pool's machines allow.

Karpenter's API does not say which instance types a NodePool may launch: the cloud provider
keeps its catalogue in memory (the kwok provider reads it from ``--instance-types-file-path``;
AWS from the EC2 API) and narrows it by the claim's ``spec.requirements`` and
``spec.resources.requests`` when it launches. So gangcheck packs only on what a NodePool
declares in its annotation ``gangcheck.io/instance-types``: a JSON object naming each instance
type the pool launches and what one such node offers to pods (its allocatable), e.g.
``{"gpu-8x": {"nvidia.com/gpu": "8", "cpu": "31", "memory": "250Gi", "pods": "110"}}``.
A resource a type does not list, it has none of; ``pods``, when listed, bounds the members
per node.

Of the declared types, those the pool's requirements on ``node.kubernetes.io/instance-type``
(and the flavor's node label of that key) admit are the ones a claim may name. The members are
then packed first-fit decreasing (largest first, by their largest share of what the biggest
admitted type offers; each onto the first claim some admitted type can still hold with it,
else onto a new claim). A claim asks for the sum of its members' requests and names, in its
``node.kubernetes.io/instance-type`` requirement, the admitted types that hold that sum. A
member no admitted type can hold fails the ask at once, naming the pool and the member.

Without the annotation nothing is known: each member gets a claim of its own, asking for its
requests, with the pool's requirements as they are (Karpenter chooses the machine). A bad
annotation makes the pool unusable, naming it.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangcheck.logic.placement.quantity import (
    QuantityError,
    format_resource,
    parse_quantity,
)
from gangcheck.logic.sources.karpenter import names
from gangcheck.model.objects import Obj

PODS = "pods"


def _quantities(amounts: Mapping[str, int]) -> str:
    return (
        ", ".join(f"{r}={format_resource(r, n)}" for r, n in sorted(amounts.items())) or "nothing"
    )


@dataclass(frozen=True)
class InstanceType:
    """A machine a pool may launch and what one of its nodes offers to pods."""

    name: str
    allocatable: Mapping[str, int]

    def holds(self, requests: Mapping[str, int], members: int) -> bool:
        """Whether one node takes ``members`` pods asking ``requests`` together."""
        if PODS in self.allocatable and members * parse_quantity(1) > self.allocatable[PODS]:
            return False
        return all(n <= self.allocatable.get(r, 0) for r, n in requests.items() if n > 0)


@dataclass(frozen=True)
class Member:
    """One member of the gang: ``name`` says which (for messages), ``requests`` its pod's."""

    name: str
    requests: Mapping[str, int]


@dataclass(frozen=True)
class PackedClaim:
    """One NodeClaim of a packing: the sum of its members' requests, the members, and the
    instance types that hold them (empty: none known, the pool's requirements decide)."""

    requests: Mapping[str, int]
    members: tuple[str, ...]
    instance_types: tuple[str, ...] = ()

    def asked(self) -> dict[str, str]:
        """``spec.resources.requests`` of the claim."""
        return {r: format_resource(r, n) for r, n in sorted(self.requests.items())}


@dataclass(frozen=True)
class Packing:
    """The claims a gang takes in one pool, or why the pool cannot take it."""

    claims: tuple[PackedClaim, ...] = ()
    problem: str = ""
    #: The problem is a member no instance type of the pool can take.
    too_big: bool = False


@dataclass
class _Bin:
    requests: dict[str, int] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)
    types: list[InstanceType] = field(default_factory=list)


def declared_types(pool: Obj) -> list[InstanceType] | str | None:
    """The instance types ``pool`` declares (None: it declares none; str: why the declaration
    cannot be read)."""
    meta = pool.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(names.INSTANCE_TYPES)
    if raw is None:
        return None
    where = f"NodePool {meta.get('name', '')!r} annotation {names.INSTANCE_TYPES}"
    try:
        parsed = json.loads(str(raw))
    except ValueError as e:
        return f"{where} is not JSON: {e}"
    if not isinstance(parsed, dict) or not parsed:
        return f"{where} must map instance type names to their allocatable resources"
    types = []
    for name, resources in sorted(parsed.items()):
        if not isinstance(resources, dict):
            return f"{where}: {name!r} must map resource names to quantities"
        try:
            allocatable = {str(r): parse_quantity(str(q)) for r, q in resources.items()}
        except QuantityError as e:
            return f"{where}: {name!r}: {e}"
        types.append(InstanceType(str(name), allocatable))
    return types


def admits(requirement: Mapping[str, Any], value: str) -> bool:
    """Whether a node label `value` meets one NodePool requirement on its key."""
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return True
    if operator in ("Gt", "Lt") and values:
        try:
            number, bound = int(value), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False  # DoesNotExist, or an operator this model does not know


def admitted(
    pool: Obj, types: Sequence[InstanceType], labels: Mapping[str, str]
) -> list[InstanceType]:
    """The ``types`` the pool's requirements on ``node.kubernetes.io/instance-type`` and the
    flavor's ``labels`` admit."""
    key = names.INSTANCE_TYPE_LABEL
    spec = ((pool.get("spec") or {}).get("template") or {}).get("spec") or {}
    requirements = [r for r in spec.get("requirements") or [] if r.get("key") == key]
    if key in labels:
        requirements.append({"key": key, "operator": "In", "values": [labels[key]]})
    return [t for t in types if all(admits(r, t.name) for r in requirements)]


def _share(member: Member, biggest: Mapping[str, int]) -> tuple[float, float]:
    """A member's size: its largest share of what the biggest type offers, then their sum."""
    shares = [n / biggest[r] if biggest.get(r) else float(n) for r, n in member.requests.items()]
    return (max(shares, default=0.0), sum(shares))


def _plus(requests: Mapping[str, int], more: Mapping[str, int]) -> dict[str, int]:
    total = dict(requests)
    for resource, amount in more.items():
        total[resource] = total.get(resource, 0) + amount
    return total


def pack(members: Sequence[Member], pool: Obj, labels: Mapping[str, str]) -> Packing:
    """The claims ``members`` take in ``pool`` (see the module doc)."""
    name = (pool.get("metadata") or {}).get("name", "")
    declared = declared_types(pool)
    if isinstance(declared, str):
        return Packing(problem=declared)
    if declared is None:
        return Packing(tuple(PackedClaim(dict(m.requests), (m.name,)) for m in members))
    types = admitted(pool, declared, labels)
    if not types:
        return Packing(
            problem=(
                f"NodePool {name!r}: none of the instance types its annotation "
                f"{names.INSTANCE_TYPES} declares ({', '.join(t.name for t in declared)}) is "
                f"admitted by its {names.INSTANCE_TYPE_LABEL} requirements"
            ),
            too_big=True,
        )
    return _first_fit_decreasing(members, types, name)


def _first_fit_decreasing(
    members: Sequence[Member], types: Sequence[InstanceType], pool_name: str
) -> Packing:
    biggest: dict[str, int] = {}
    for t in types:
        for resource, amount in t.allocatable.items():
            biggest[resource] = max(biggest.get(resource, 0), amount)
    bins: list[_Bin] = []
    for member in sorted(members, key=lambda m: _share(m, biggest), reverse=True):
        for b in bins:
            total = _plus(b.requests, member.requests)
            holding = [t for t in b.types if t.holds(total, len(b.members) + 1)]
            if holding:
                b.requests, b.types = total, holding
                b.members.append(member.name)
                break
        else:
            holding = [t for t in types if t.holds(member.requests, 1)]
            if not holding:
                return Packing(problem=_too_big(pool_name, member, types), too_big=True)
            bins.append(_Bin(dict(member.requests), [member.name], holding))
    return Packing(
        tuple(
            PackedClaim(b.requests, tuple(b.members), tuple(t.name for t in b.types)) for b in bins
        )
    )


def _too_big(pool_name: str, member: Member, types: Sequence[InstanceType]) -> str:
    offered = "; ".join(f"{t.name}: {_quantities(t.allocatable)}" for t in types)
    return (
        f"NodePool {pool_name!r}: no instance type it may launch can take {member.name} "
        f"({_quantities(member.requests)}); it may launch {offered}"
    )
