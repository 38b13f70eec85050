"""Which NodePool can take a gang: its labels and requirements, and the room its limits leave.

A flavor's node labels must be labels the pool's nodes can carry: set by its template, allowed
by its requirements, or well known (zone, instance type, arch, os, capacity type), which is
what Karpenter itself demands of a pod's node selector.

Karpenter enforces a NodePool's ``spec.limits`` only on the claims it creates; a claim created
through the API launches whatever the limits. So gangcheck checks the room first
(``spec.limits`` minus ``status.resources``, which counts every claim labelled with the pool,
gangcheck's included) and asks for nothing when the whole gang does not fit. A node's use of a
limited resource is estimated by what the claim requests of it; ``nodes`` counts one per claim.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gangcheck.logic.capacity.karpenter import names
from gangcheck.logic.placement.quantity import QuantityError, parse_quantity
from gangcheck.model.objects import Obj

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
    refused = [r for r in requirements if not _admits(r, value)]
    if refused:
        r = refused[0]
        return f"NodePool {name!r} requires {key} {r.get('operator')} {r.get('values', [])}"
    if key in fixed or requirements or key in names.WELL_KNOWN_LABELS:
        return None
    return (
        f"NodePool {name!r} does not define label {key} "
        "(neither its template labels nor its requirements)"
    )


def _admits(requirement: Mapping[str, Any], value: str) -> bool:
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


def labels_problem(pool: Obj, labels: Mapping[str, str]) -> str | None:
    problems = [label_problem(pool, k, v) for k, v in sorted(labels.items())]
    found = [p for p in problems if p]
    return "; ".join(found) if found else None


def room(pool: Obj, per_node: Mapping[str, str]) -> int | None:
    """How many more nodes of ``per_node`` the pool's limits allow (None: no limit applies)."""
    spec = pool.get("spec") or {}
    limits = spec.get("limits") or {}
    used = (pool.get("status") or {}).get("resources") or {}
    fits: list[int] = []
    for resource, limit in limits.items():
        each = "1" if resource == NODES else per_node.get(resource)
        if each is None:
            continue  # the claim asks nothing of it: the instance's share is unknown here
        try:
            left = parse_quantity(limit) - parse_quantity(used.get(resource, "0"))
            need = parse_quantity(each)
        except QuantityError:
            continue
        if need > 0:
            fits.append(max(0, left // need))
    return min(fits) if fits else None


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


FIELD = "spec.karpenter.nodePools"


def choose_pool(
    pools: Mapping[str, Obj | None],
    wanted: Sequence[str],
    *,
    labels: Mapping[str, str],
    per_node: Mapping[str, str],
    nodes: int,
) -> PoolChoice:
    """The first pool of ``wanted`` (in config order) that exists, can carry ``labels`` and has
    room for ``nodes`` nodes. ``pools``: every pool by name (absent: not found)."""
    problems: list[str] = []
    rooms: list[str] = []
    for i, name in enumerate(wanted):
        pool = pools.get(name)
        if pool is None:
            problems.append(f"{FIELD}[{i}]: NodePool {name!r} not found")
            continue
        problem = labels_problem(pool, labels)
        if problem:
            problems.append(f"{FIELD}[{i}]: {problem}")
            continue
        left = room(pool, per_node)
        if left is None or left >= nodes:
            return PoolChoice(pool)
        rooms.append(
            f"NodePool {name!r}: limits {limit_names(pool)} leave room for {left} of {nodes} nodes"
        )
    if rooms:
        return PoolChoice(None, "; ".join(rooms), no_room=True)
    return PoolChoice(None, "; ".join(problems) or f"{FIELD}: no NodePool named")


def unusable_pools(wanted: Sequence[str], served: Mapping[str, Obj] | None) -> str | None:
    """Why a config's NodePools cannot be used at all (None: all exist). ``served``: the
    cluster's NodePools by name, None when Karpenter's API is not served."""
    if served is None:
        return (
            "the Karpenter backend is unavailable: the API server does not serve "
            "karpenter.sh/v1 NodePools (install Karpenter's CRDs)"
        )
    missing = [
        f"{FIELD}[{i}]: NodePool {n!r} not found" for i, n in enumerate(wanted) if n not in served
    ]
    return "; ".join(missing) or None
