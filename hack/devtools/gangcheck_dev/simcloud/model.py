"""The simulated cloud's behaviour and every decision it takes, as pure functions.

``SimConfig`` is the behaviour spec read from the ConfigMap. For each new request the engine
calls ``choose_scenario`` (which rule applies), ``size_request`` (which node group, how many
nodes, within ``maxNodes``) and ``build_plan`` (what happens when). The ``Plan`` is stored on
the request as JSON, so a restarted sim resumes it; ``due_steps`` says what is due at a given
time and not yet done, judged from the request's conditions and the plan's delivered list.

Plan times are seconds after ``startedAt`` (epoch seconds, when the sim first saw the request):
``acceptAfterSeconds`` and ``provisionAfterSeconds`` count from then; node delays,
``failAfterSeconds``, ``revokeAfterSeconds`` and ``bookingSeconds`` count from the resize
(the Provisioned condition). Nothing arrives once the request has failed or been revoked.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gangcheck.logic.placement.quantity import parse_quantity
from gangcheck.model.provisioning_config import BEST_EFFORT_ATOMIC

Obj = Mapping[str, Any]

GPU = "nvidia.com/gpu"
NODEGROUP_LABEL = "gangcheck.io/nodegroup"
SIM_ANNOTATION = "gangcheck.io/sim-cloud"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
PLAN_ANNOTATION = "gangcheck.io/sim-plan"
CREATED_AT_ANNOTATION = "gangcheck.io/sim-created-at"
REQUEST_ANNOTATION = "gangcheck.io/sim-request"
RULE_USES_ANNOTATION = "gangcheck.io/sim-rule-uses"
NO_RETRY = "noRetry"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"

# Condition types, reasons and messages, as cluster-autoscaler writes them.
ACCEPTED, PROVISIONED, FAILED = "Accepted", "Provisioned", "Failed"
BOOKING_EXPIRED, CAPACITY_REVOKED = "BookingExpired", "CapacityRevoked"
ACCEPTED_MSG = "ProvisioningRequest is accepted by ClusterAutoscaler"
PROVISIONED_MSG = "Capacity is found in the cluster"
NOT_FOUND = "CapacityIsNotFound"
NOT_FOUND_MSG = "Capacity is not found, CA will try to find it later."
NOT_FOUND_FAILED_MSG = "CA could not find requested capacity"
BOOKING_MSG = "Capacity reservation time is expired"

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # as apiserver's generateName
_GROUP_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


# --- the behaviour spec --------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def _quantity(text: str) -> str:
    parse_quantity(text)  # raises ValueError when malformed
    return text


def _regex(text: str | None) -> str | None:
    try:
        re.compile(text or "")
    except re.error as e:
        raise ValueError(f"bad regex {text!r}: {e}") from e
    return text


Quantity = Annotated[str, BeforeValidator(str), AfterValidator(_quantity)]
Seconds = Annotated[float, Field(ge=0)]


class Taint(_Spec):
    key: Annotated[str, Field(min_length=1)]
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeGroup(_Spec):
    """One kind of node the cloud can add, up to ``maxNodes`` of them."""

    name: Annotated[str, Field(pattern=f"^{_GROUP_NAME}$", max_length=57)]
    max_nodes: Annotated[int, Field(ge=0)] = 100
    cpu: Quantity = "8"
    memory: Quantity = "32Gi"
    gpus: Annotated[int, Field(ge=0)] = 0
    pods: Annotated[int, Field(ge=1)] = 110
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def capacity(self) -> dict[str, str]:
        """The node's capacity (and allocatable), as the API writes quantities."""
        held = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        return {**held, GPU: str(self.gpus)} if self.gpus else held

    def capacity_nanos(self) -> dict[str, int]:
        return {key: parse_quantity(value) for key, value in self.capacity().items()}


class Match(_Spec):
    """Which requests a rule takes: the whole name matches ``name`` (a regex); exact namespace."""

    name: Annotated[str | None, AfterValidator(_regex)] = None
    namespace: str | None = None

    def fits(self, namespace: str, name: str) -> bool:
        if self.namespace is not None and self.namespace != namespace:
            return False
        return self.name is None or re.fullmatch(self.name, name) is not None


class Scenario(_Spec):
    """What the cloud does with a request this rule matches; the defaults deliver all in ~1 s."""

    name: str = ""
    match: Match = Field(default_factory=Match)
    times: Annotated[int | None, Field(ge=1)] = None
    accept_after_seconds: Seconds = 0.0
    provision_after_seconds: Seconds = 0.5
    node_delay_seconds: Seconds | tuple[Seconds, ...] = 0.5
    deliver: Annotated[int | None, Field(ge=0)] = None
    stockout: bool = False
    fail_after_seconds: Seconds | None = None
    revoke_after_seconds: Seconds | None = None
    booking_seconds: Seconds = 600.0

    def node_delay(self, index: int) -> float:
        """Delay of the index-th node after the resize; a list staggers, its last value repeats."""
        delays = self.node_delay_seconds
        if isinstance(delays, tuple):
            return delays[min(index, len(delays) - 1)] if delays else 0.0
        return delays


DEFAULT_SCENARIO = Scenario(name="default")


class SimConfig(_Spec):
    provisioning_class_names: tuple[str, ...] = (BEST_EFFORT_ATOMIC,)
    #: Only requests in these namespaces are seen at all (empty: every namespace).
    namespaces: tuple[str, ...] = ()
    node_groups: tuple[NodeGroup, ...] = ()
    scenarios: tuple[Scenario, ...] = ()

    @model_validator(mode="after")
    def _unique_groups(self) -> SimConfig:
        names = [g.name for g in self.node_groups]
        if len(names) != len(set(names)):
            raise ValueError(f"node group names must be unique: {names}")
        return self

    def watches(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def answers(self, request: Obj) -> bool:
        """A new request this sim takes on: its namespace is watched and its class answered."""
        meta, spec = request.get("metadata") or {}, request.get("spec") or {}
        wanted = spec.get("provisioningClassName") in self.provisioning_class_names
        return wanted and self.watches(str(meta.get("namespace", "")))


def parse_config(text: str) -> SimConfig:
    """The config from the ConfigMap's ``config`` key (YAML or JSON); ValueError if invalid."""
    data = yaml.safe_load(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("the sim-cloud config must be a mapping")
    return SimConfig.model_validate(data)


# --- which rule ----------------------------------------------------------------------------


def rule_key(index: int, scenario: Scenario) -> str:
    """Counts ``times`` per rule: its position and content, so an edited rule starts afresh."""
    digest = hashlib.sha256(scenario.model_dump_json(by_alias=True).encode()).hexdigest()
    return f"{index}-{digest[:10]}"


def choose_scenario(
    config: SimConfig, *, namespace: str, name: str, uses: Mapping[str, int]
) -> tuple[str | None, Scenario]:
    """The first rule that fits and is not used up, with its key; else the default rule."""
    for index, scenario in enumerate(config.scenarios):
        key = rule_key(index, scenario)
        used_up = scenario.times is not None and uses.get(key, 0) >= scenario.times
        if scenario.match.fits(namespace, name) and not used_up:
            return key, scenario
    return None, DEFAULT_SCENARIO


# --- sizing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """What one member of a pod set asks of a node."""

    requests: Mapping[str, int]
    node_selector: Mapping[str, str]
    tolerations: tuple[Obj, ...]


@dataclass(frozen=True)
class PodSetDemand:
    template: str
    count: int
    member: Member | None  # None: the PodTemplate is missing


def member_of(template: Obj) -> Member:
    """The member a PodTemplate object describes; ValueError on a malformed quantity."""
    spec = (template.get("template") or {}).get("spec") or {}
    containers = [_container_requests(c) for c in spec.get("containers") or []]
    inits = [_container_requests(c) for c in spec.get("initContainers") or []]
    total = Counter[str]()
    for requests in containers:
        total.update(requests)
    for requests in inits:
        for key, value in requests.items():
            total[key] = max(total[key], value)
    total["pods"] = parse_quantity("1")
    tolerations = tuple(spec.get("tolerations") or [])
    return Member(dict(total), dict(spec.get("nodeSelector") or {}), tolerations)


def _container_requests(container: Obj) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: parse_quantity(v) for k, v in merged.items() if k in ("cpu", "memory", GPU)}


#: Taints cluster-autoscaler leaves out of a node group's template (utils/taints): nodes
#: register with them and lose them once running, so they never decide where pods can go.
TEMPLATE_IGNORED_PREFIXES = (
    "ignore-taint.cluster-autoscaler.kubernetes.io/",
    "startup-taint.cluster-autoscaler.kubernetes.io/",
    "status-taint.cluster-autoscaler.kubernetes.io/",
)


def tolerates(tolerations: Sequence[Obj], taint: Taint) -> bool:
    if taint.effect == "PreferNoSchedule" or taint.key.startswith(TEMPLATE_IGNORED_PREFIXES):
        return True
    return any(_toleration_matches(t, taint) for t in tolerations)


def _toleration_matches(toleration: Obj, taint: Taint) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.effect:
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.key
    return bool(
        toleration.get("key") == taint.key and (toleration.get("value") or "") == taint.value
    )


def members_per_node(member: Member, group: NodeGroup) -> int:
    """How many members fit on one empty node of the group (0 when not one does)."""
    capacity = group.capacity_nanos()
    wanted = [(r, q) for r, q in member.requests.items() if q > 0]
    return min((capacity.get(r, 0) // q for r, q in wanted), default=group.pods)


def can_host(member: Member, group: NodeGroup) -> bool:
    labels_fit = all(group.labels.get(k) == v for k, v in member.node_selector.items())
    taints_fit = all(tolerates(member.tolerations, t) for t in group.taints)
    return labels_fit and taints_fit and members_per_node(member, group) > 0


@dataclass(frozen=True)
class Sizing:
    """Nodes to add per group, in pod-set order; ``problem`` says why not when it is set."""

    nodes: tuple[tuple[str, int], ...] = ()
    problem: str = ""
    invalid: bool = False

    @property
    def needed(self) -> int:
        return sum(count for _, count in self.nodes)


def size_request(
    demands: Sequence[PodSetDemand], groups: Sequence[NodeGroup], used: Mapping[str, int]
) -> Sizing:
    """Per pod set, the first group that can host its members and still has room for them.

    ``used`` counts the group's nodes that exist or are on their way; a group never exceeds
    ``maxNodes``. Missing templates make the request invalid, as CA fails it at once.
    """
    missing = [d.template for d in demands if d.member is None]
    if missing:
        return Sizing(problem=f"pod templates not found: {', '.join(missing)}", invalid=True)
    taken = Counter[str](used)
    nodes: list[tuple[str, int]] = []
    for demand in demands:
        choice = _place(demand, groups, taken)
        if isinstance(choice, str):
            return Sizing(problem=choice)
        taken[choice[0]] += choice[1]
        nodes.append(choice)
    return Sizing(nodes=tuple(nodes))


def _place(
    demand: PodSetDemand, groups: Sequence[NodeGroup], taken: Mapping[str, int]
) -> tuple[str, int] | str:
    assert demand.member is not None
    member = demand.member
    hosts = [g for g in groups if can_host(member, g)]
    if not hosts:
        return f"no node group can host a member of {demand.template}"
    for group in hosts:
        needed = math.ceil(demand.count / members_per_node(member, group))
        if taken.get(group.name, 0) + needed <= group.max_nodes:
            return group.name, needed
    first = hosts[0]
    needed = math.ceil(demand.count / members_per_node(member, first))
    room = max(0, first.max_nodes - taken.get(first.name, 0))
    return f"{demand.template} needs {needed} nodes of {first.name}, which has room for {room}"


# --- the plan ------------------------------------------------------------------------------


class Outcome(StrEnum):
    PROVISION = "Provision"
    NOT_FOUND = "NotFound"
    INVALID = "Invalid"


class PlannedNode(_Spec):
    name: str
    group: str
    at: float


class Plan(_Spec):
    """What the cloud decided for one request; stored as JSON in PLAN_ANNOTATION."""

    version: int = 1
    rule: str
    rule_key: str | None = None
    started_at: float
    outcome: Outcome
    message: str = ""
    needed: int = 0
    accept_at: float = 0.0
    provision_at: float = 0.0
    nodes: tuple[PlannedNode, ...] = ()
    fail_at: float | None = None
    fail_reason: str = NOT_FOUND
    fail_message: str = NOT_FOUND_FAILED_MSG
    revoke_at: float | None = None
    booking_expires_at: float | None = None
    groups: dict[str, NodeGroup] = Field(default_factory=dict)
    delivered: tuple[str, ...] = ()
    revoked: bool = False

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    def with_delivered(self, name: str) -> Plan:
        if name in self.delivered:
            return self
        return self.model_copy(update={"delivered": (*self.delivered, name)})

    def undelivered(self) -> Counter[str]:
        """Nodes still on their way, per group."""
        if self.revoked:
            return Counter()
        return Counter(n.group for n in self.nodes if n.name not in self.delivered)


def plan_from_annotations(obj: Obj) -> Plan | None:
    """The plan recorded on a request, or None (none yet, or unreadable)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(PLAN_ANNOTATION)
    if not raw:
        return None
    try:
        return Plan.model_validate_json(raw)
    except ValueError:
        return None


def build_plan(
    scenario: Scenario,
    sizing: Sizing,
    *,
    groups: Sequence[NodeGroup],
    started_at: float,
    no_retry: bool,
    rng: random.Random,
    rule_key: str | None = None,
) -> Plan:
    """Resolve a rule and a sizing into a timeline of what will happen to the request."""
    accept_at = scenario.accept_after_seconds
    base = Plan(
        rule=scenario.name or rule_key or "default",
        rule_key=rule_key,
        started_at=round(started_at, 3),
        outcome=Outcome.PROVISION,
        needed=sizing.needed,
        accept_at=accept_at,
        provision_at=max(accept_at, scenario.provision_after_seconds),
    )
    if sizing.invalid:
        return _invalid(base, sizing)
    if sizing.problem or scenario.stockout:
        return _not_found(base, scenario, sizing, no_retry=no_retry)
    return _provision(base, scenario, sizing, groups=groups, rng=rng)


def _invalid(base: Plan, sizing: Sizing) -> Plan:
    return base.model_copy(
        update={
            "outcome": Outcome.INVALID,
            "message": sizing.problem,
            "fail_at": base.accept_at,
            "fail_reason": "FailedToCreatePods",
            "fail_message": f"Failed to get pods for ProvisioningRequest: {sizing.problem}",
        }
    )


def _not_found(base: Plan, scenario: Scenario, sizing: Sizing, *, no_retry: bool) -> Plan:
    fail_at: float | None = base.provision_at if no_retry else None
    if scenario.fail_after_seconds is not None:
        fail_at = base.provision_at + scenario.fail_after_seconds
    message = sizing.problem or "stockout: the cloud has no capacity"
    return base.model_copy(
        update={"outcome": Outcome.NOT_FOUND, "message": message, "fail_at": fail_at}
    )


def _provision(
    base: Plan,
    scenario: Scenario,
    sizing: Sizing,
    *,
    groups: Sequence[NodeGroup],
    rng: random.Random,
) -> Plan:
    at = base.provision_at
    fail_at = _after(at, scenario.fail_after_seconds)
    revoke_at = _after(at, scenario.revoke_after_seconds)
    end = min((t for t in (fail_at, revoke_at) if t is not None), default=math.inf)
    wanted = [g for g, count in sizing.nodes for _ in range(count)]
    arriving = wanted[: scenario.deliver] if scenario.deliver is not None else wanted
    nodes = [
        PlannedNode(name=node_name(group, rng), group=group, at=at + scenario.node_delay(i))
        for i, group in enumerate(arriving)
    ]
    nodes = [n for n in nodes if n.at < end]
    booking = at + scenario.booking_seconds
    by_name = {g.name: g for g in groups}
    return base.model_copy(
        update={
            "message": f"{len(nodes)} of {sizing.needed} nodes will arrive",
            "nodes": tuple(nodes),
            "fail_at": fail_at,
            "fail_message": _late_failure_message(len(nodes), sizing.needed),
            "revoke_at": revoke_at,
            "booking_expires_at": booking if booking < end else None,
            "groups": {g: by_name[g] for g in {n.group for n in nodes}},
        }
    )


def _after(start: float, delay: float | None) -> float | None:
    return None if delay is None else start + delay


def _late_failure_message(arrived: int, needed: int) -> str:
    return f"The cloud failed to create the requested nodes: {arrived} of {needed} arrived"


def node_name(group: str, rng: random.Random) -> str:
    return f"{group}-{''.join(rng.choice(_NAME_CHARS) for _ in range(5))}"


# --- the timeline --------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Step:
    """One thing to do at ``at`` seconds after the plan started: a condition, a node, a revoke."""

    at: float
    condition: Condition | None = None
    node: PlannedNode | None = None
    revoke: bool = False


def steps(plan: Plan) -> list[Step]:
    """Everything the plan will do, in time order (ties keep this order)."""
    if plan.outcome is Outcome.INVALID:
        return [Step(plan.fail_at or 0.0, _failed(plan))]
    timeline = [Step(plan.accept_at, Condition(ACCEPTED, "True", "Accepted", ACCEPTED_MSG))]
    if plan.outcome is Outcome.NOT_FOUND:
        not_found = Condition(PROVISIONED, "False", NOT_FOUND, NOT_FOUND_MSG)
        timeline.append(Step(plan.provision_at, not_found))
    else:
        timeline.extend(_provision_steps(plan))
    if plan.fail_at is not None:
        timeline.append(Step(plan.fail_at, _failed(plan)))
    return sorted(timeline, key=lambda step: step.at)


def _provision_steps(plan: Plan) -> list[Step]:
    provisioned = Condition(PROVISIONED, "True", "CapacityIsProvisioned", PROVISIONED_MSG)
    timeline = [Step(plan.provision_at, provisioned)]
    timeline.extend(Step(node.at, node=node) for node in plan.nodes)
    if plan.revoke_at is not None:
        timeline.append(Step(plan.revoke_at, revoke=True))
    if plan.booking_expires_at is not None:
        expired = Condition(BOOKING_EXPIRED, "True", "CapacityReservationTimeExpired", BOOKING_MSG)
        timeline.append(Step(plan.booking_expires_at, expired))
    return timeline


def _failed(plan: Plan) -> Condition:
    return Condition(FAILED, "True", plan.fail_reason, plan.fail_message)


def revoked_condition(delivered: int) -> Condition:
    message = f"The cloud revoked the capacity and deleted the {delivered} nodes it delivered"
    return Condition(CAPACITY_REVOKED, "True", "CapacityRevoked", message)


def is_done(step: Step, plan: Plan, conditions: Sequence[Obj]) -> bool:
    if step.node is not None:
        return step.node.name in plan.delivered
    if step.revoke:
        return plan.revoked
    assert step.condition is not None
    return any(_same(c, step.condition) for c in conditions)


def _same(existing: Obj, wanted: Condition) -> bool:
    return (existing.get("type"), existing.get("status"), existing.get("reason")) == (
        wanted.type,
        wanted.status,
        wanted.reason,
    )


def due_steps(plan: Plan, conditions: Sequence[Obj], now: float) -> tuple[list[Step], float | None]:
    """Steps due by ``now`` and not done yet, and the epoch time of the next one after that."""
    elapsed = now - plan.started_at
    waiting = [s for s in steps(plan) if not is_done(s, plan, conditions)]
    due = [s for s in waiting if s.at <= elapsed]
    later = [s.at for s in waiting if s.at > elapsed]
    return due, (plan.started_at + min(later)) if later else None


# --- writing conditions and nodes ----------------------------------------------------------


def set_condition(
    conditions: Sequence[Obj], wanted: Condition, *, now: str, generation: int
) -> list[dict[str, Any]]:
    """The conditions with ``wanted`` set; lastTransitionTime kept while the status holds."""
    old = next((c for c in conditions if c.get("type") == wanted.type), None)
    keep_time = old is not None and old.get("status") == wanted.status
    fresh = {
        "type": wanted.type,
        "status": wanted.status,
        "reason": wanted.reason,
        "message": wanted.message,
        "lastTransitionTime": old["lastTransitionTime"] if old and keep_time else now,
        "observedGeneration": generation,
    }
    others = [dict(c) for c in conditions if c.get("type") != wanted.type]
    return [*others, fresh]


def node_object(
    name: str, group: NodeGroup, *, request: str, created_at: str, now: str
) -> dict[str, Any]:
    """A Node of the group as the cloud registers it; ``created_at`` has microseconds."""
    labels = {**group.labels, NODEGROUP_LABEL: group.name, "kubernetes.io/hostname": name}
    annotations = {
        KWOK_ANNOTATION: "fake",
        SIM_ANNOTATION: "true",
        CREATED_AT_ANNOTATION: created_at,
        REQUEST_ANNOTATION: request,
    }
    spec: dict[str, Any] = {"providerID": f"sim://{name}"}
    if group.taints:
        spec["taints"] = [t.model_dump() for t in group.taints]
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": node_status(group, now=now),
    }


def node_status(group: NodeGroup, *, now: str) -> dict[str, Any]:
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    capacity = group.capacity()
    return {"capacity": capacity, "allocatable": dict(capacity), "conditions": [ready]}


def rule_uses(raw: str | None) -> dict[str, int]:
    """The ``times`` counters kept on the ConfigMap; empty when absent or unreadable."""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int)}
