"""What a member claims: its pod's ResourceClaimTemplates and ResourceClaims read into
`ClaimNeeds`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gangcheck.logic.placement.dra.cel import compile_selector
from gangcheck.logic.placement.dra.model import (
    ALL,
    EXACT_COUNT,
    Claim,
    ClaimNeeds,
    Constraint,
    NodeScope,
    Request,
    SharedClaim,
    Shortfall,
    _by_name,
    _expressions,
    _fatal,
    _not_evaluable,
    _quoted,
    _where,
)
from gangcheck.logic.placement.quantity import QuantityError, parse_quantity
from gangcheck.logic.placement.raw import dict_at, list_at
from gangcheck.logic.placement.taints import toleration_of
from gangcheck.model.objects import ReadOnlyObj as Obj


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
    for entry in list_at(pod_spec, "resourceClaims"):
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
    devices = dict_at(dict_at(dict_at(obj, "spec"), "spec"), "devices")
    requests: list[tuple[Request, ...]] = []
    for raw in list_at(devices, "requests"):
        request_name = str(raw.get("name") or "")
        exactly = raw.get("exactly")
        subrequests = list_at(raw, "firstAvailable")
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
    for raw in list_at(devices, "constraints"):
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
            str(k): parse_quantity(v)
            for k, v in dict_at(dict_at(raw, "capacity"), "requests").items()
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
        tolerations=tuple(toleration_of(t) for t in list_at(raw, "tolerations")),
        admin=raw.get("adminAccess") is True,
    )


def _shared_claim(name: str, claim: str, obj: Obj | None) -> SharedClaim | Shortfall:
    if obj is None:
        return _fatal(f"claim {_quoted(name)}: ResourceClaim {_quoted(claim)} not found")
    allocation = dict_at(dict_at(obj, "status"), "allocation")
    if not allocation:
        return _fatal(
            f"claim {_quoted(name)}: ResourceClaim {_quoted(claim)} is not allocated yet "
            "(gangcheck counts a shared claim only once allocated)"
        )
    selector = allocation.get("nodeSelector")
    if isinstance(selector, Mapping):
        return SharedClaim(name, claim, NodeScope(node_selector=selector))
    return SharedClaim(name, claim)
