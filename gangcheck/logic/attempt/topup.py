"""InOrder tops up instead of throwing away (issue 32).

When a capacity source stops short (its deadline passes, or it ends its request: ``Failed``,
a booking expired, ``StrayPods``) after part of the gang arrived from it, and the gang may sit
on nodes of two sources (no required topology, no domain scoped ask), what arrived is *kept*
for the attempt instead of reclaimed: its request is marked ``Kept`` (``PHASE_ANNOTATION``)
with the nodes it holds and why it stopped (``ROLLBACK_NODES_ANNOTATION``,
``ROLLBACK_REASON_ANNOTATION``), in the same write that a rollback would start with. The next
source is then asked only for the members the kept nodes cannot hold (``split``); its request
records the requests it tops up (``KEPT_FROM_ANNOTATION``) and the members placed on their
nodes (``KEPT_MEMBERS_ANNOTATION``). The gang is ready when it fits, whole, on the kept nodes
and the new ones.

Why the kept request is not withdrawn: it is the record of its nodes. Each node stays recorded
as arrived for it (``gangcheck.io/arrived-for``), held for it, younger than it, so every rule
that protects or reclaims arrivals keeps working unchanged: another gang never counts them
(the request is in flight), the reclaim's safety checks (recorded for that request, younger
than it, fenced, read again) hold, and a rollback of the attempt reclaims them through the
kept request's own record. A kept request no longer claims new nodes (it is not open), and it
is kept only after the source said ``Provisioned``: gangcheck claims no arrival before that.
cluster-autoscaler does nothing more for a ``Provisioned`` or ``Failed`` request (its pods are
injected only while neither is true, processors/provreq/injector.go) and books the capacity of
a ``Provisioned`` one only (processors/provreq/processor.go), until the booking expires: a
kept request that ended ``Failed`` has none, so its held, empty nodes would be scaled down
under the gang. While a request is kept its nodes carry the autoscaler's
``scale-down-disabled`` with gangcheck's record (scaledown.py), taken off when the attempt
ends. A source that never said ``Provisioned`` has nothing kept: it is withdrawn as before,
so the autoscaler stops retrying it.

The kept requests follow the attempt: marked fulfilled with the request the gang turns Ready
on (its nodes are the gang's), their hold lifted when the gang has started, rolled back
(recorded, fenced, read again, reclaimed) when the attempt ends without the gang, and
withdrawn with the gang's other requests.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gangcheck.logic.attempt import driver, lifecycle, naming, places, rollback
from gangcheck.logic.attempt.actions import Action, AnnotateRequest, ClaimNode, Event
from gangcheck.logic.attempt.fulfillment import (
    ClusterView,
    GangSpec,
    arrived_for,
    gang_of,
    is_arrival_of,
)
from gangcheck.logic.attempt.hold import hold_toleration
from gangcheck.logic.attempt.lifecycle import made_under
from gangcheck.logic.attempt.records import AttemptPhase, RollbackCause, count_of
from gangcheck.logic.placement.fit import fit_gang
from gangcheck.model.names import (
    ARRIVED_FOR,
    KEPT,
    KEPT_FROM_ANNOTATION,
    KEPT_MEMBERS_ANNOTATION,
    PHASE_ANNOTATION,
    ROLLBACK_NODES_ANNOTATION,
    ROLLING_BACK,
)
from gangcheck.model.objects import Obj, ProvisioningRequest
from gangcheck.model.provisioning_config import KARPENTER_CLASS, AtomicProvisioningSpec


def key_of(req: ProvisioningRequest) -> str:
    return f"{req.ref.namespace}/{req.name}"


def is_kept(req: ProvisioningRequest) -> bool:
    return rollback.record_of(req).phase is AttemptPhase.KEPT


def kept_of(requests: Iterable[ProvisioningRequest]) -> tuple[ProvisioningRequest, ...]:
    """The requests of an attempt whose arrivals are kept for it (not being deleted)."""
    return tuple(r for r in requests if is_kept(r) and not r.deleting)


def kept_for(
    requests: Iterable[ProvisioningRequest], req: ProvisioningRequest
) -> tuple[ProvisioningRequest, ...]:
    """The requests whose kept arrivals `req` tops up (its record names them), those that
    exist."""
    found = {r.name: r for r in requests}
    return tuple(found[n] for n in _kept_names(req) if n in found)


def kept_gone(requests: Iterable[ProvisioningRequest], req: ProvisioningRequest) -> list[str]:
    """The requests `req` tops up (its record names them) that are gone: deleted outside
    gangcheck, their nodes still held and guarded for the gang by a record no longer there."""
    found = {r.name for r in requests}
    return [n for n in _kept_names(req) if n not in found]


def _kept_names(req: ProvisioningRequest) -> list[str]:
    return [n for n in req.annotations.get(KEPT_FROM_ANNOTATION, "").split(",") if n]


def allowed(
    config: AtomicProvisioningSpec, gang: GangSpec, place: places.Place, following: places.Place
) -> bool:
    """Whether nodes of the place left and of the place asked next may carry one gang:
    InOrder, no required topology (a domain is never mixed), no reservations (their split
    is made on the whole gang), and ProvisioningRequest sources on both sides (a Karpenter
    source's NodeClaims are withdrawn with it)."""
    if config.racing > 1 or config.reservations or places.level_of(gang) is not None:
        return False
    if place.domain is not None or following.domain is not None:
        return False
    for index in (place.source, following.source):
        source = config.source(index)
        if source is None or source.class_name == KARPENTER_CLASS:
            return False
    return True


def common_labels(selectors: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The node labels every one of these node selectors pins to (same key, same value):
    what a gang on nodes of all of their sources can still be pinned to."""
    listed = [dict(s) for s in selectors]
    if not listed:
        return {}
    first, *rest = listed
    return {k: v for k, v in first.items() if all(r.get(k) == v for r in rest)}


def shared_labels(
    config: AtomicProvisioningSpec,
    place: places.Place | ProvisioningRequest,
    kept: Iterable[ProvisioningRequest],
) -> dict[str, str]:
    """The node labels a gang on the nodes of `place`'s source and of the kept requests'
    sources is pinned to: those all of them share. `place`: the request topping the kept
    ones up, or the place about to be asked (its source in the config now). A request's
    source is the one it asked (`lifecycle.asked_source`), so a source that left or moved in
    the config since is not taken for the one now at its index; a request without a
    recorded config is read by its index, as before (a source gone from there pins nothing).
    """
    return common_labels(s for one in (place, *kept) for s in _labels_of(config, one))


def _labels_of(
    config: AtomicProvisioningSpec, one: places.Place | ProvisioningRequest
) -> list[Mapping[str, str]]:
    if isinstance(one, ProvisioningRequest):
        asked = lifecycle.asked_source(one, config)
        return [asked.node_selector] if asked.source is not None else []
    source = config.source(one.source)
    return [source.node_selector] if source is not None else []


def tolerating(gang: GangSpec, kept: Sequence[ProvisioningRequest]) -> GangSpec:
    """The gang's templates tolerating the hold on the kept requests' nodes."""
    if not kept:
        return gang
    wanted = [hold_toleration(key_of(r)) for r in kept]

    def tolerant(tpl: Obj) -> Obj:
        spec = dict(tpl.get("spec") or {})
        have = list(spec.get("tolerations") or [])
        spec["tolerations"] = [*have, *(t for t in wanted if t not in have)]
        return {**tpl, "spec": spec}

    pod_sets = tuple((name, count, tolerant(tpl)) for name, count, tpl in gang.pod_sets)
    return replace(gang, pod_sets=pod_sets)


def view(capacity: ClusterView | None, kept: Sequence[ProvisioningRequest]) -> ClusterView | None:
    """The cluster as the request topping `kept` up counts it: the kept requests' nodes are
    not another gang's (they are older than it, so it counts them as capacity that was
    there, and never claims them)."""
    if capacity is None or not kept:
        return capacity
    keys = {key_of(r) for r in kept}
    return replace(capacity, in_flight=frozenset(k for k in capacity.in_flight if k not in keys))


@dataclass(frozen=True)
class Split:
    """How the gang divides between the kept nodes and the next ask."""

    on_kept: dict[str, int]
    remainder: dict[str, int]
    nodes: tuple[str, ...]

    @property
    def kept_members(self) -> int:
        return sum(self.on_kept.values())

    @property
    def remainder_members(self) -> int:
        return sum(self.remainder.values())


def split(
    capacity: ClusterView | None, gang: GangSpec, kept: Sequence[ProvisioningRequest]
) -> Split:
    """Place the gang (tolerating the kept holds) on the nodes recorded for the kept
    requests, as far as it goes (the fit's best partial placement); the rest is asked for."""
    wanted = {name: count for name, count, _ in gang.pod_sets if count > 0}
    capacity = capacity or ClusterView()
    nodes = [
        n
        for n in capacity.nodes
        if any(is_arrival_of(n, key_of(r), r.creation_timestamp) for r in kept)
    ]
    if not nodes or not wanted:
        return Split({}, wanted, ())
    context, devices = capacity.dra(gang.namespace)
    pod_sets = gang_of(tolerating(gang, kept).pod_sets, context)
    views = [capacity.view(n) for n in nodes]
    result = fit_gang(pod_sets, views, capacity.bound(), devices)
    placed: Counter[str] = Counter()
    for members in result.placements.values():
        placed.update(members)
    on_kept = {name: placed[name] for name in wanted if placed[name] > 0}
    remainder = {name: count - placed[name] for name, count in wanted.items()}
    names = tuple(sorted(str(n["metadata"]["name"]) for n in nodes))
    return Split(on_kept, {k: v for k, v in remainder.items() if v > 0}, names)


def keeping(step_actions: Sequence[Action], req: ProvisioningRequest) -> tuple[Action, ...] | None:
    """A rollback starting on `req` (its arrivals recorded and the phase set in one write)
    turned into keeping them: the same write with the phase ``Kept``; None when the actions
    do not start one (a rollback waiting for the node cache, or one already under way)."""
    if rollback.is_rolling_back(req):
        return None
    out: list[Action] = []
    started = False
    for action in step_actions:
        notes = getattr(action, "annotations", None)
        if (
            isinstance(action, AnnotateRequest)
            and action.name == req.name
            and isinstance(notes, Mapping)
            and notes.get(PHASE_ANNOTATION) == ROLLING_BACK
        ):
            out.append(AnnotateRequest(req.name, {**notes, PHASE_ANNOTATION: KEPT}))
            started = True
        else:
            out.append(action)
    return tuple(out) if started else None


def keep_write(step: lifecycle.Step, req: ProvisioningRequest) -> tuple[Action, ...] | None:
    """The write that keeps `req` in place of the rollback `step` starts on it; None when
    this rollback goes on as before: a cause that never falls back, revoked capacity, or
    actions that start no rollback (`keeping`)."""
    cause = RollbackCause.of(step.message)
    if cause in driver.NO_FALLBACK or cause is RollbackCause.REVOKED:
        return None
    return keeping(step.actions, req)


def may_ask_next(
    config: AtomicProvisioningSpec,
    gang: GangSpec,
    place: places.Place,
    following: places.Place | None,
    asks: int,
) -> places.Place | None:
    """The place to top `place` up from: the next one, while the attempt may still ask and
    nodes of both may carry one gang (`allowed`); None: no top-up."""
    if following is None or asks + 1 >= naming.MAX_ASKS:
        return None
    return following if allowed(config, gang, place, following) else None


def _left(config: AtomicProvisioningSpec, req: ProvisioningRequest) -> str:
    place = places.of_request(req)
    return place.describe(config) or driver.source_name(config, place.source)


def stopped_short(
    config: AtomicProvisioningSpec, req: ProvisioningRequest, why: str, on: Split
) -> str:
    """What the next ask's check message begins with: what stopped short, and what is kept."""
    total = on.kept_members + on.remainder_members
    return (
        f"{_left(config, req)} stopped short ({why}); {on.kept_members} of {total} members are "
        f"kept on the {len(on.nodes)} node(s) that arrived; "
    )


def topped_up(
    config: AtomicProvisioningSpec,
    req: ProvisioningRequest,
    why: str,
    on: Split,
    *,
    following: places.Place,
    name: str,
) -> Event:
    """The Event of a top-up: `req` kept, `following` asked with request `name`."""
    text = (
        f"{_left(config, req)} stopped short for {req.name} ({why}): kept {len(on.nodes)} "
        f"node(s) for {on.kept_members} member(s) ({', '.join(on.nodes)}); asking "
        f"{following.describe(config)} for the other {on.remainder_members} with {name}"
    )
    return Event("CapacityToppedUp", text[:1].upper() + text[1:])


def as_kept(req: ProvisioningRequest, actions: Sequence[Action]) -> ProvisioningRequest:
    """The request as the keep's write leaves it (to split the gang in the same decision)."""
    notes = dict(req.annotations)
    for action in actions:
        if isinstance(action, AnnotateRequest) and action.name == req.name:
            notes.update(action.annotations)
    return replace(req, annotations=notes)


def with_claims(capacity: ClusterView | None, actions: Sequence[Action]) -> ClusterView | None:
    """The cluster as it will be once the nodes these actions claim are recorded."""
    claims = {a.name: a.request for a in actions if isinstance(a, ClaimNode)}
    if capacity is None or not claims:
        return capacity

    def claimed(node: Obj) -> Obj:
        meta = node.get("metadata") or {}
        owner = claims.get(str(meta.get("name")))
        if owner is None:
            return node
        notes = {**(meta.get("annotations") or {}), ARRIVED_FOR: owner}
        return {**node, "metadata": {**meta, "annotations": notes}}

    return replace(capacity, nodes=tuple(claimed(n) for n in capacity.nodes))


#: Why a request kept with no node of its own is withdrawn (`holds_nothing`).
HOLDS_NOTHING = (
    "kept with no node of its own (a top-up that delivered nothing, kept by an earlier "
    "version for the nodes it topped up): the ask after it asks for its members"
)


def holds_nothing(req: ProvisioningRequest, capacity: ClusterView | None) -> bool:
    """`req` is recorded Kept with no node of its own and none has arrived for it since: a
    top-up that delivered nothing, which a release before this rule kept for the nodes it
    topped up (this one rolls such a top-up back instead: `flow.keep`), left in flight, its
    autoscaler retrying it beside the ask made after it for the same members. Unknown
    capacity: not said."""
    return (
        is_kept(req)
        and not kept_nodes(req)
        and capacity is not None
        and not arrived_for(capacity.nodes, key_of(req), req.creation_timestamp)
    )


def kept_nodes(req: ProvisioningRequest) -> tuple[str, ...]:
    """The nodes the keep recorded on `req`."""
    return tuple(sorted(rollback.record_of(req).rollback_nodes))


def record(kept: Sequence[ProvisioningRequest], members: int) -> dict[str, str]:
    """What the request topping `kept` up records: which requests, how many members there."""
    if not kept:
        return {}
    return {
        KEPT_FROM_ANNOTATION: ",".join(r.name for r in kept),
        KEPT_MEMBERS_ANNOTATION: str(members),
    }


def kept_members(req: ProvisioningRequest) -> int:
    return count_of(req.annotations.get(KEPT_MEMBERS_ANNOTATION)) or 0


def roll_back(
    kept: Sequence[ProvisioningRequest],
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    why: str,
) -> tuple[Action, ...]:
    """The attempt ends without the gang (or the gang had them and did not start): what was
    kept goes back by the safe path of a rollback, each under its own record (started, its
    nodes recorded, then reclaimed; once its outcome is recorded, nothing)."""
    actions: list[Action] = []
    for req in kept:
        record = rollback.record_of(req)
        if record.raw_outcome:
            continue
        if record.phase is not AttemptPhase.ROLLING_BACK:
            annotate, _ = rollback.start(req, capacity, why, also=kept_nodes(req))
            notes = dict(annotate.annotations)
            merged = {**record.rollback_nodes, **json.loads(notes[ROLLBACK_NODES_ANNOTATION])}
            notes[ROLLBACK_NODES_ANNOTATION] = json.dumps(merged, sort_keys=True)
            actions.append(AnnotateRequest(req.name, notes))
        reclaimer = rollback.reclaimer_of(made_under(req, config))
        actions.append(rollback.reclaim(req, capacity, reclaimer))
    return tuple(actions)


def outstanding(kept: Sequence[ProvisioningRequest]) -> bool:
    """Whether a kept request's rollback has not recorded its outcome yet."""
    return any(not rollback.record_of(r).raw_outcome for r in kept)
