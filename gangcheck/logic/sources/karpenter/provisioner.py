"""gangcheck serving ProvisioningRequests of the class ``KARPENTER_CLASS`` with NodeClaims.

The attempt core asks, follows and withdraws through the ProvisioningRequest backend whatever
the capacity is: the request is the attempt's durable record (its number, deadline, rollback
steps, what arrived). With ``spec.backend: Karpenter`` the request's class is
``KARPENTER_CLASS``, which no autoscaler serves; gangcheck serves it here, as
cluster-autoscaler serves its classes: it creates the gang's NodeClaims (all at once, the
members packed onto as few as the pool's declared instance types allow, in the first NodePool
of ``nodePools`` that can take them all) and writes what they say
onto the request's conditions (``Accepted``, ``Provisioned``, ``Failed``). From there on the
attempt runs as on any other backend: arrival ledger, hold, fit, deadline rollback, reclaim.

What this module decides for one request (``serve``):

- not yet asked: choose the pool (labels, instance types, limits) and create the claims, or
  fail the request naming the pool and the limit, the member, or the config field, that
  stand in the way (``spec.karpenter.nodePools[j]``, or the capacity source's
  ``spec.capacitySources[i].karpenter.nodePools[j]``: ``pools_field``, from what the attempt
  recorded on its request). The room a pool's
  limits leave is charged with every claim of the pool known (``pool_claims``: listed, and
  those created earlier in the same pass for other requests), not only with what Karpenter's
  lagging ``status.resources`` says (``pools.pool_use``). Claims are made
  only in a second later than the request's ``creationTimestamp``: their nodes are then
  provably younger than the request (creationTimestamp has whole seconds), the age rule the
  arrival ledger records a node by;
- asked: ``Failed`` when a claim was lost (gone, or being deleted before it arrived) before the
  gang started (partial delivery; the note says when its NodePool was deleted), ``Provisioned``
  once every claim is launched (the ledger then records the nodes as they arrive and the fit
  says when the gang can start, as with any autoscaler), with a note of how many arrived;
  claims the request never recorded as made (``Accepted``: gangcheck stopped, or a create
  failed, between creating and recording them) are recorded when all are there; a creation
  cut short (some never made) is completed, the missing claims made as the others were and
  then recorded, unless they cannot be (the request fails saying why, ``NodeClaimsIncomplete``);
  claims are asked or completed only while the attempt is open (``waiting.is_open``): one
  rolling back or kept takes no new node; once the gang started nothing more is followed
  (its nodes are Karpenter's), and a claim of the attempt it does not run on is surplus:
  one with no node is deleted, one whose node is still held for the request and recorded by
  no one (made and never recorded, or its node never taken by the ledger) is withdrawn the
  safe way, as an ended request's (below); its node found running the gang's pods is handed
  over to the gang (``gang_started``), its hold lifted, not left to drain;
- rolling back, or rolled back (its outcome recorded) while the request stays as the record
  (a PodGroup's backoff): delete every claim of the attempt not yet arrived, as below; those
  that arrived are the rollback's to reclaim, never deleted here; no condition is written.
  A kept request (its source stopped short after it said ``Provisioned``: every claim
  launched) keeps its claims still coming up until it ends: it is the record of what was
  kept for the attempt;
- ended (failed, being deleted, gone): withdraw every claim of the attempt not yet arrived
  (``Initialized``), and those that arrived but that the ledger did not record while their
  node is still held for the request; the nodes recorded as arrived (some before their claim
  is ``Initialized``) or not seen yet are left to the reclaim rules (reclaimer
  ``DeleteNodeClaim``). Only a claim with no node (none named, none registering with its
  providerID) is deleted here; one whose node exists is withdrawn through the reclaim's safe
  path (``Served.reclaim``: fenced, its pods read live, deleted only if none but DaemonSet
  pods are there), never on a cached view of its node (``_withdrawal``). A node so kept has
  its hold lifted, whichever reclaim keeps it: the withdrawal's own at once, the
  draining-node reconciler's later (after a drain, a failed try, or a restart between the
  mark and the reclaim) by the next pass (``Served.lift``: a node recorded for the request,
  held, owing no reclaim, once the holds of the request are released: ``_holds_released``);
- an earlier request's of the same name (made again under it): its claims with no node are
  withdrawn at once; those with a node wait while the live request's gang may use the hold
  they carry (by name: it tolerates it), and are withdrawn as above once that request ends
  for the hold (``_hold_ended``: failed, being deleted, rolling back or rolled back, started);
- protection: ``karpenter.sh/do-not-disrupt`` comes off a claim and its node once the node
  is no longer held for the request (the gang started, or a rollback kept the node), or the
  request is gone; never when the NodePool's template sets it on every node itself (a claim
  of an older version naming no such mark: read from the pool's template, ``reads_pools``;
  the pool not read, it stays).

How members are packed onto claims is ``packing``'s: by the instance types the NodePool
declares (``gangcheck.io/instance-types``), first-fit decreasing, each claim asking for its
members' sum; without a declaration, one claim per member asking for its requests. A member
no declared type can take fails the request at once (``NoInstanceTypeFits``), naming the pool
and the member. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from gangcheck.logic.attempt.fulfillment import claim_of
from gangcheck.logic.attempt.hold import HOLD_TAINT, hold_value, is_held
from gangcheck.logic.attempt.records import AttemptPhase as RecordPhase
from gangcheck.logic.attempt.records import Record
from gangcheck.logic.placement.quantity import QuantityError, parse_quantity
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import (
    AttemptPhase,
    ClaimAsk,
    ClaimPhase,
    attempt_claims,
    claim_bodies,
    claim_state,
    claims_made,
    claims_status,
    created_message,
    made_for_another,
    made_of,
    pool_made_in,
)
from gangcheck.logic.sources.karpenter.packing import Member, PackedClaim, pack
from gangcheck.logic.sources.karpenter.pools import (
    choose_pool,
    claims_room,
    labels_problem,
    limit_names,
    source_field,
)
from gangcheck.logic.sources.waiting import is_open
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import ATTEMPT_CONFIG_ANNOTATION, RECLAIM_WHEN_IDLE
from gangcheck.model.objects import Obj
from gangcheck.model.provisioning_config import (
    KARPENTER_CLASS,
    NODE_POOLS_PARAMETER,
    recorded_spec,
)


@dataclass(frozen=True)
class Served:
    """What serving one request takes: claims to create and delete (none with a node: it
    names none, nor is one registering for it), claims withdrawn through the reclaim's safe
    path (``reclaim``: their node recorded as arrived for the request with the reclaim's mark,
    then reclaimed, its pods read live, the claim deleted only if none but DaemonSet pods are
    there), the request's conditions to set, the objects whose ``do-not-disrupt`` comes
    off (``("node"|"claim", name)``), and the nodes whose hold for the request comes off
    (``lift``: recorded for it, held, owing no reclaim: kept, once its holds are released)."""

    create: tuple[Obj, ...] = ()
    delete: tuple[Obj, ...] = ()
    conditions: tuple[Obj, ...] = ()
    release: tuple[tuple[str, str], ...] = ()
    reclaim: tuple[Obj, ...] = ()
    lift: tuple[str, ...] = ()


def is_served_here(request: Obj) -> bool:
    return bool((request.get("spec") or {}).get("provisioningClassName") == KARPENTER_CLASS)


def request_key(request: Obj) -> str:
    meta = request.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _conditions(request: Obj) -> dict[str, Obj]:
    return {c.get("type", ""): c for c in (request.get("status") or {}).get("conditions") or []}


def _true(request: Obj, kind: str) -> bool:
    return (_conditions(request).get(kind) or {}).get("status") == "True"


def serve(
    request: Obj | None,
    key: str,
    *,
    templates: Mapping[str, Obj],
    claims: Sequence[Obj],
    pools: Mapping[str, Obj | None],
    nodes: Mapping[str, Obj],
    now: datetime,
    pool_claims: Sequence[Obj] = (),
) -> Served:
    """One request (None: gone) and everything its attempt's claims say, at ``now``.
    ``pool_claims``: every NodeClaim of the pools, read only when the request asks
    (``is_asking``)."""
    mine, earlier = _of_request(claims, key, request)
    served = _serve(
        request,
        key,
        mine,
        templates=templates,
        pools=pools,
        nodes=nodes,
        now=now,
        pool_claims=pool_claims,
    )
    if not earlier:
        return served
    # An earlier request's of the same name: those with no node are withdrawn at once, as any
    # attempt's are (``_withdrawal``). Those with a node are held under the name the live
    # request has too (its gang tolerates the hold, its ledger may record the node): they
    # wait while that request's gang may use them, and once it ends for the hold they are
    # withdrawn the safe way (a held unrecorded node reclaimed; one kept has its hold lifted
    # once the request's holds are released), not once it is deleted: a request Failed, or
    # Started and running for days, stays as it is.
    stale = _withdrawal(earlier, key, nodes, lift=_holds_released(request))
    release = (*served.release, *_releases(earlier, key, nodes, pools, request_live=True))
    if request is None or not _hold_ended(request):
        return replace(served, delete=(*stale.delete, *served.delete), release=release)
    return replace(
        served,
        delete=(*stale.delete, *served.delete),
        reclaim=(*stale.reclaim, *served.reclaim),
        lift=(*stale.lift, *served.lift),
        release=release,
    )


def _of_request(
    claims: Sequence[Obj], key: str, request: Obj | None
) -> tuple[list[Obj], list[Obj]]:
    """The claims of ``key``'s attempt made for ``request``, and those made for an earlier
    request of that name (``made_for_another``)."""
    labelled = attempt_claims(claims, key)
    if request is None:
        return labelled, []
    earlier = [c for c in labelled if made_for_another(c, request)]
    mine = [c for c in labelled if not made_for_another(c, request)]
    if not mine and _true(request, "Accepted"):
        # Recorded as made, none of its own left by uid or by second: claims naming no uid
        # are the ones an older version made for it, on a kube-apiserver whose clock was
        # behind the request's (an earlier request's would leave this one's there too).
        mine = [c for c in earlier if not _uid_of(c)]
        earlier = [c for c in earlier if _uid_of(c)]
    return mine, earlier


def _uid_of(claim: Obj) -> str:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(names.REQUEST_UID) or "")


def _serve(
    request: Obj | None,
    key: str,
    mine: list[Obj],
    *,
    templates: Mapping[str, Obj],
    pools: Mapping[str, Obj | None],
    nodes: Mapping[str, Obj],
    now: datetime,
    pool_claims: Sequence[Obj],
) -> Served:
    release = _releases(mine, key, nodes, pools, request_live=request is not None)
    lift = _holds_released(request)
    if request is None or _has_ended(request):
        return replace(_withdrawal(mine, key, nodes, lift=lift), release=release)
    if _rolled_back(request):
        # Its attempt takes no node any more, and its request may stay as the record long
        # after (a PodGroup's backoff): the claims still launching are withdrawn now, not once
        # the request ends. Those that arrived are the rollback's to reclaim (the ledger's safe
        # path), never deleted here; no condition is written (a claim withdrawn is no loss).
        withdrawn = _withdrawal(mine, key, nodes, rolling_back=True, lift=lift)
        return replace(withdrawn, release=release)
    if not mine and not _true(request, "Accepted"):
        if not _second_passed(request, now) or not is_open(request):
            return Served()
        return _ask(request, key, templates, pools, pool_claims)
    if _started(request):
        # The gang runs: its nodes are ordinary Karpenter nodes now (consolidation, drift,
        # expiry apply), so a claim gone is no partial delivery and the request stays as is.
        # A claim it does not run on is surplus: one with no node, and one whose node is
        # still held for it and recorded by no one (made and never recorded, or whose node
        # the ledger never took), withdrawn as an ended request's are: its pods read live,
        # a node running the gang's handed over to it (``gang_started``), one running
        # anyone else's kept. Left alone, such a node stayed held and protected from
        # disruption (its hold is lifted only from the nodes recorded for the request) for
        # as long as the request lived.
        return replace(_withdrawal(mine, key, nodes, lift=lift), release=release)
    if not _true(request, "Accepted"):
        found = _found(
            request, key, mine, templates=templates, pools=pools, pool_claims=pool_claims
        )
        return replace(found, release=release)
    status = claims_status(mine, key, _claims_asked(request))
    message = status.message
    if status.phase is AttemptPhase.FAILED:
        message += _pool_gone(request, mine, pools)
    return Served(conditions=_follow(request, status.phase, message), release=release)


def _pool_gone(request: Obj, mine: Sequence[Obj], pools: Mapping[str, Obj | None]) -> str:
    """A note when the NodePool the claims were made in is gone or being deleted: its claims
    go with it (their ownerReference), which is then why they were lost."""
    accepted = str((_conditions(request).get("Accepted") or {}).get("message") or "")
    name = pool_made_in(accepted) or (made_of(mine).pool if mine else "")
    if not name:
        return ""
    pool = pools.get(name)
    if pool is not None and not (pool.get("metadata") or {}).get("deletionTimestamp"):
        return ""
    return f"; NodePool {name!r} was deleted (its NodeClaims go with it)"


def _started(request: Obj) -> bool:
    notes = (request.get("metadata") or {}).get("annotations") or {}
    return Record.of(notes).phase is RecordPhase.STARTED


def _found(
    request: Obj,
    key: str,
    mine: Sequence[Obj],
    *,
    templates: Mapping[str, Obj],
    pools: Mapping[str, Obj | None],
    pool_claims: Sequence[Obj],
) -> Served:
    """Claims of the attempt the request never recorded as made (``Accepted``): gangcheck
    stopped, a create's answer was lost or failed (a 500), or the ``Accepted`` write was
    refused as stale, between creating them and recording them. The claims say how many were
    made (``made_of``): all there, the creation is recorded and they are followed; some never
    made (``_cut_short``), the missing ones are made as the others were (the same pool, the
    same packing, the names the attempt gives them, or an older release's claims the names
    it gives them: a create whose answer was lost, or still in flight, is AlreadyExists) and
    the creation recorded; one being deleted is a claim lost, as after
    ``Accepted``. When the missing ones cannot be made as the others were (the pool gone or
    full, the gang's pods changed), the request fails saying so, which withdraws the ones
    made. A claim refused for what it is fails the request quoting the refusal (the
    reconciler's ``NodeClaimRefused``), at each try alike."""
    made = made_of(mine)
    status = claims_status(mine, key, made.nodes)
    if not status.lost:
        accepted = created_message(made.nodes, made.members, made.pool)
        return Served(
            conditions=(
                _condition("Accepted", "True", "NodeClaimsFound", accepted),
                *_follow(request, status.phase, status.message),
            )
        )
    missing = _cut_short(mine, key)
    if not missing:
        message = status.message + _pool_gone(request, mine, pools)
        return Served(conditions=_follow(request, AttemptPhase.FAILED, message))
    if not is_open(request):
        return Served()  # kept: nothing more is made for it (``is_asking``)
    remade = _remake(
        request, key, mine, missing, templates=templates, pools=pools, pool_claims=pool_claims
    )
    if isinstance(remade, Served):
        return remade
    there = made.nodes - len(status.lost)
    message = (
        f"{there} of the {made.nodes} NodeClaims of this attempt exist and none was "
        "recorded as made: their creation was cut short (gangcheck stopped, or a create "
        f"failed), and the missing ones cannot be made as the others were: {remade}; the ones "
        "made are withdrawn"
    )
    return Served(conditions=(_condition("Failed", "True", "NodeClaimsIncomplete", message),))


def _cut_short(mine: Sequence[Obj], key: str) -> tuple[int, ...]:
    """The indexes an unrecorded creation made no claim for: none of its claims is being
    deleted (that is a loss: Karpenter deletes a claim it cannot launch), some are absent
    (never made, or made and gone without a trace: asked again, once)."""
    status = claims_status(mine, key, made_of(mine).nodes)
    if any(c.phase is ClaimPhase.LOST for c in status.claims):
        return ()
    return status.lost


def _remake(
    request: Obj,
    key: str,
    mine: Sequence[Obj],
    missing: Sequence[int],
    *,
    templates: Mapping[str, Obj],
    pools: Mapping[str, Obj | None],
    pool_claims: Sequence[Obj],
) -> Served | str:
    """The missing claims of a creation cut short, made as the ones there were (their pool,
    the gang's packing in it), with room for them in the pool's limits (charged with every
    claim of the pool, those of this attempt there included); or why they cannot be."""
    gang = _members(request, templates)
    if isinstance(gang, str):
        return gang
    members, labels = gang
    name = made_of(mine).pool
    pool = pools.get(name)
    if pool is None or (pool.get("metadata") or {}).get("deletionTimestamp"):
        return f"NodePool {name!r} not found"
    problem = labels_problem(pool, labels)
    if problem:
        return problem
    packed = pack(members, pool, labels)
    if packed.problem:
        return packed.problem
    if not _as_made(mine, packed.claims, name):
        return (
            "the gang's pods no longer ask what they were made for (their requests, or how "
            f"NodePool {name!r} packs them, changed)"
        )
    uid = str((request.get("metadata") or {}).get("uid") or "")
    if any(not _uid_of(c) for c in mine):
        # Made by a release before request uids (named from the attempt alone): the missing
        # ones are made as it makes them, under the names it gives them, so a create of it
        # still in flight meets them (AlreadyExists) and never makes a second claim for one.
        uid = ""
    ask = ClaimAsk.packing(key, packed.claims, labels, uid)
    wanted = set(missing)
    bodies = [b for b in claim_bodies(pool, ask) if _index_of(b) in wanted]
    asks = [b["spec"]["resources"]["requests"] for b in bodies]
    left = claims_room(pool, asks, pool_claims)
    if left is not None and left < len(bodies):
        return (
            f"NodePool {name!r}: limits {limit_names(pool)} leave room for {left} of "
            f"{len(bodies)} nodes"
        )
    message = created_message(ask.nodes, len(members), name)
    return Served(
        create=tuple(bodies),
        conditions=(_condition("Accepted", "True", "NodeClaimsCompleted", message),),
    )


def _as_made(mine: Sequence[Obj], packed: Sequence[PackedClaim], pool: str) -> bool:
    """Whether the claims there are those ``packed`` makes: as many in all, each of its
    index in ``pool``, for as many members, asking for as much."""
    if made_of(mine).nodes != len(packed):
        return False
    for claim in mine:
        meta = claim.get("metadata") or {}
        index = _index_of(claim)
        if index is None or not 0 <= index < len(packed):
            return False
        members = str((meta.get("annotations") or {}).get(names.CLAIM_MEMBERS) or "1")
        asked = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
        if (
            (meta.get("labels") or {}).get(names.NODE_POOL_LABEL) != pool
            or members != str(len(packed[index].members))
            or dict(asked) != packed[index].asked()
        ):
            return False
    return True


def _index_of(claim: Obj) -> int | None:
    return claim_state(claim).index


def is_asking(request: Obj | None, key: str, claims: Sequence[Obj], now: datetime) -> bool:
    """Whether serving ``request`` now chooses a pool and creates claims, or makes those a
    creation cut short did not (and so needs every claim of the pools to know their room).
    Only while its attempt is open (``waiting.is_open``): one rolling back (its deadline, its
    gang gone, a growth's start watchdog) or kept takes no new node."""
    if request is None or _has_ended(request) or _true(request, "Accepted"):
        return False
    if not is_open(request):
        return False
    mine = _of_request(claims, key, request)[0]
    if mine:
        return not _started(request) and bool(_cut_short(mine, key))
    return _second_passed(request, now)


def _second_passed(request: Obj, now: datetime) -> bool:
    created = parse_time(str((request.get("metadata") or {}).get("creationTimestamp") or ""))
    return created is not None and now.replace(microsecond=0) > created.replace(microsecond=0)


def _withdrawal(
    claims: Sequence[Obj],
    key: str,
    nodes: Mapping[str, Obj],
    *,
    rolling_back: bool = False,
    lift: bool = False,
) -> Served:
    """What withdrawing ``key``'s ``claims`` takes. A claim naming no node, whose node is not
    registering either (none of ``nodes`` carries its providerID), is deleted here: nothing
    can run where there is no node (the delete is conditional on the claim as read, so a
    registration since fails it). A claim whose node exists is never deleted here: held for
    the request and recorded by no one, it is withdrawn through the reclaim's safe path
    (``Served.reclaim``: the node recorded for the request with the reclaim's mark, fenced,
    the pods bound or nominated to it listed live, the claim deleted only if none but
    DaemonSet pods are there, at the node judged), unless a reclaim is owed it already (a
    mark: the draining-node reconciler's); recorded as arrived (the
    ledger may record a node before its claim is ``Initialized``), for this request or any
    other, it is the reclaim rules' (never recorded over);
    no longer held for the request (pods may run there) it is kept; with ``rolling_back``
    (its rollback reclaims what arrived) a claim that arrived is the rollback's too. One
    registering (its node not linked yet) or whose node is not seen yet waits.

    With ``lift`` (the request's holds released: ``_holds_released``), a node recorded for
    the request, still held for it and owing no reclaim (no mark: kept, by whichever reclaim)
    has its hold lifted (``Served.lift``): what lifted the request's holds did so before it
    was recorded or kept (a withdrawal's reclaim that drained, failed, or was cut short
    between its mark and its reclaim, kept later by the draining-node reconciler), and
    nothing else would: the node would stay closed to every pod but a dead gang's."""
    delete: list[Obj] = []
    reclaim: list[Obj] = []
    lifts: list[str] = []
    registering = {_provider_of_node(n) for n in nodes.values()} - {""}
    for claim in attempt_claims(claims, key):
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            continue
        state = claim_state(claim)
        if not state.node_name:
            if _provider_of_claim(claim) not in registering:
                delete.append(claim)
            continue
        node = nodes.get(state.node_name)
        if node is None or not held_for(node, key):
            continue  # not seen yet; not held (pods may run there)
        if claim_of(node):  # recorded (for it or another: that one's): the reclaim rules'
            if lift and claim_of(node) == key and not marked(node):
                lifts.append(state.node_name)
            continue
        if rolling_back and state.phase is ClaimPhase.ARRIVED:
            continue
        if not marked(node):
            reclaim.append(claim)
    return Served(delete=tuple(delete), reclaim=tuple(reclaim), lift=tuple(lifts))


def _provider_of_claim(claim: Obj) -> str:
    return str((claim.get("status") or {}).get("providerID") or "") or "-"


def _provider_of_node(node: Obj) -> str:
    return str((node.get("spec") or {}).get("providerID") or "")


def marked(node: Obj) -> bool:
    """The node carries a reclaim's mark: the draining-node reconciler owes it a reclaim."""
    return RECLAIM_WHEN_IDLE in ((node.get("metadata") or {}).get("annotations") or {})


def gang_started(request: Obj | None) -> bool:
    """Whether a node whose withdrawal found the gang's own pods on it (the reclaim's
    ``drain``) is handed over to the gang rather than left to drain: the request's gang
    started (every member scheduled), so those pods run there for as long as the gang does,
    and the node is one of its nodes, as the ones recorded for it are (its hold lifted, its
    protection gone, Karpenter's from then on). Before the start (failed, rolling back,
    gone) the gang's pods there are on their way out: the draining-node reconciler reclaims
    the node once they are gone."""
    return request is not None and _started(request)


def kept_since(old: Obj | None, new: Obj | None) -> bool:
    """A node change that may let a pass lift a hold (``Served.lift``): a reclaim's mark came
    off a node recorded for a request and still held (the draining-node reconciler kept it,
    or a reclaim undid its fence). What the lift also waits for (the request's holds
    released) is a change of the request, which wakes a pass of its own."""
    if old is None or new is None or not marked(old) or marked(new):
        return False
    return bool(claim_of(new)) and is_held(new)


def _rolled_back(request: Obj) -> bool:
    """Its attempt is rolling back, or its rollback recorded what it did (``Record``)."""
    record = Record.of((request.get("metadata") or {}).get("annotations") or {})
    return record.phase is RecordPhase.ROLLING_BACK or bool(record.raw_outcome)


def _has_ended(request: Obj) -> bool:
    meta = request.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) or _true(request, "Failed")


def _hold_ended(request: Obj) -> bool:
    """No gang waits any more on nodes held under the request's name: it failed or is being
    deleted, its attempt rolls back or rolled back, or its gang started (every member
    scheduled). Open or kept (for a top-up), its gang may still use a node held so."""
    return _has_ended(request) or _rolled_back(request) or _started(request)


def _holds_released(request: Obj | None) -> bool:
    """What lifts the holds of the request's gang (``lifecycle.release_hold``,
    ``release_holds_of_gone``) has done so: the request is gone or being deleted (withdrawn),
    its rollback recorded what it did (the rollback done), or its gang started. A node
    recorded for it, held and kept after that is held for a gang that is no more. Before
    (failed, rolling back), a rollback is still to judge the nodes recorded for it, and
    lifts their hold once done."""
    if request is None:
        return True
    meta = request.get("metadata") or {}
    record = Record.of(meta.get("annotations") or {})
    return (
        bool(meta.get("deletionTimestamp"))
        or bool(record.raw_outcome)
        or record.phase is RecordPhase.STARTED
    )


def _asked(request: Obj) -> int:
    return sum(int(p.get("count", 0)) for p in (request.get("spec") or {}).get("podSets") or [])


def _claims_asked(request: Obj) -> int:
    """How many claims the request was served with: what its ``Accepted`` message says (a
    packed gang has fewer claims than members), else one per member."""
    accepted = _conditions(request).get("Accepted") or {}
    made = claims_made(str(accepted.get("message") or ""))
    return _asked(request) if made is None else made


def _ask(
    request: Obj,
    key: str,
    templates: Mapping[str, Obj],
    pools: Mapping[str, Obj | None],
    pool_claims: Sequence[Obj],
) -> Served:
    gang = _members(request, templates)
    if isinstance(gang, str):
        return Served(conditions=(_condition("Failed", "True", "NodeClaimsNotPossible", gang),))
    members, labels = gang
    wanted = _pool_names(request)
    choice = choose_pool(
        pools,
        wanted,
        labels=labels,
        claims=pool_claims,
        packing=lambda pool: pack(members, pool, labels),
        field=pools_field(request),
    )
    if choice.pool is None or choice.packing is None:
        reason = "NodePoolNotUsable"
        if choice.no_room:
            reason = "NodePoolLimits"
        elif choice.too_big:
            reason = "NoInstanceTypeFits"
        return Served(conditions=(_condition("Failed", "True", reason, choice.problem),))
    uid = str((request.get("metadata") or {}).get("uid") or "")
    ask = ClaimAsk.packing(key, choice.packing.claims, labels, uid)
    message = created_message(ask.nodes, len(members), choice.pool["metadata"]["name"])
    return Served(
        create=tuple(claim_bodies(choice.pool, ask)),
        conditions=(_condition("Accepted", "True", "NodeClaimsCreated", message),),
    )


def pools_field(request: Obj) -> str:
    """The config field the request's NodePools come from, as the attempt recorded it: the
    capacity source it asks (``SOURCE_ANNOTATION``, absent for the first) when the config it
    was made under (``ATTEMPT_CONFIG_ANNOTATION``) lists ``capacitySources``, else the
    top-level ``spec.karpenter.nodePools``. A record without the config (an older version):
    a source after the first is a capacity source; the first is taken as the top level."""
    notes = (request.get("metadata") or {}).get("annotations") or {}
    index = Record.of(notes).source
    config = recorded_spec(notes.get(ATTEMPT_CONFIG_ANNOTATION))
    if config is not None:
        return source_field(index if config.capacity_sources is not None else None)
    return source_field(index or None)


def _pool_names(request: Obj) -> list[str]:
    raw = ((request.get("spec") or {}).get("parameters") or {}).get(NODE_POOLS_PARAMETER, "")
    return [p.strip() for p in str(raw).split(",") if p.strip()]


def _members(
    request: Obj, templates: Mapping[str, Obj]
) -> tuple[list[Member], dict[str, str]] | str:
    """Every member of the gang with its pod's requests, and the node labels they select
    (every pod set must agree: one NodePool takes the whole gang)."""
    members: list[Member] = []
    selected: list[dict[str, str]] = []
    for pod_set in (request.get("spec") or {}).get("podSets") or []:
        name = (pod_set.get("podTemplateRef") or {}).get("name", "")
        template = templates.get(name)
        if template is None:
            return f"PodTemplate {name!r} of the request not found"
        requests, labels = _shape_of((template.get("template") or {}).get("spec") or {})
        selected.append(labels)
        count = int(pod_set.get("count", 0))
        members += [Member(f"member {i} of PodTemplate {name!r}", requests) for i in range(count)]
    if not selected:
        return "the request has no pod sets"
    if any(s != selected[0] for s in selected):
        return "pod sets select different node labels: one NodePool takes the whole gang"
    return members, selected[0]


def _shape_of(spec: Obj) -> tuple[dict[str, int], dict[str, str]]:
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for resource, amount in ((container.get("resources") or {}).get("requests") or {}).items():
            try:
                total[resource] = total.get(resource, 0) + parse_quantity(amount)
            except QuantityError:
                continue
    labels = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    return total, labels


def _follow(request: Obj, phase: AttemptPhase, message: str) -> tuple[Obj, ...]:
    if phase is AttemptPhase.FAILED:
        wanted = _condition("Failed", "True", "NodeClaimLost", message)
    elif phase is AttemptPhase.PROVISIONED:
        wanted = _condition("Provisioned", "True", "NodeClaimsLaunched", message)
    else:
        wanted = _condition("Provisioned", "False", "NodeClaimsPending", message)
    now = _conditions(request).get(wanted["type"]) or {}
    same = all(now.get(k) == wanted[k] for k in ("status", "reason", "message"))
    return () if same else (wanted,)


def _condition(kind: str, status: str, reason: str, message: str) -> Obj:
    return {"type": kind, "status": status, "reason": reason, "message": message[:32768]}


def _releases(
    claims: Sequence[Obj],
    key: str,
    nodes: Mapping[str, Obj],
    pools: Mapping[str, Obj | None],
    *,
    request_live: bool,
) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for claim in claims:
        state = claim_state(claim)
        node = nodes.get(state.node_name) if state.phase is ClaimPhase.ARRIVED else None
        if node is None or (request_live and held_for(node, key)) or _pools_own(claim, pools):
            continue
        if _protected(node):
            out.append(("node", state.node_name))
        if _protected(claim):
            out.append(("claim", state.name))
    return tuple(out)


def _pools_own(claim: Obj, pools: Mapping[str, Obj | None]) -> bool:
    """The claim's NodePool protects every node of the pool itself (``POOL_PROTECTED``): the
    protection is the admin's, never gangcheck's to lift. A claim an older version made
    (``_by_template``) carries no such mark: its pool's template says it; a pool not read
    (or gone, its claims with it) says nothing, and the protection stays."""
    meta = claim.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if annotations.get(names.POOL_PROTECTED) == "true":
        return True
    if not _by_template(claim):
        return False
    pool = pools.get(str((meta.get("labels") or {}).get(names.NODE_POOL_LABEL) or ""))
    if pool is None:
        return True
    template = (pool.get("spec") or {}).get("template") or {}
    said = (template.get("metadata") or {}).get("annotations") or {}
    return said.get(names.DO_NOT_DISRUPT) == "true"


def _by_template(claim: Obj) -> bool:
    """A claim an older version made (naming no request uid, no ``POOL_PROTECTED``): whether
    its protection is the pool's is read from the pool's template."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return annotations.get(names.POOL_PROTECTED) != "true" and not annotations.get(
        names.REQUEST_UID
    )


def reads_pools(claims: Sequence[Obj]) -> bool:
    """Whether serving ``claims`` needs their NodePools read even with no request to ask for:
    one was made by an older version (``_by_template``), its pool's template saying whether
    its protection is the admin's."""
    return any(_by_template(c) for c in claims)


def held_for(node: Obj, key: str) -> bool:
    """The node carries the hold of ``key``'s request (its claims' taint)."""
    value = hold_value(key)
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == HOLD_TAINT and t.get("value") == value for t in taints)


def _protected(obj: Obj) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(names.DO_NOT_DISRUPT) == "true"
