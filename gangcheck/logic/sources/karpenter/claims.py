"""The NodeClaims of one attempt: their bodies, and what their conditions say.

gangcheck asks Karpenter for a gang's capacity by creating one NodeClaim per node the gang
needs, all at once, from the chosen NodePool's template (as Karpenter's static-capacity
controller does). Each claim carries the attempt's label, its index, how many claims the
attempt made, how many members it is for, the hold taint of the attempt and
``karpenter.sh/do-not-disrupt``; Karpenter copies labels, annotations and taints onto the Node
when it registers, so the node is born held and protected. A claim packed with several members
(``packing``) asks for their sum and names the instance types that hold it.

Claim names are derived from the attempt (not ``generateName``), so a create whose answer was
lost is answered ``AlreadyExists`` on the retry instead of launching a second machine.

A claim has arrived when Karpenter marks it ``Initialized`` and names its node; the attempt is
provisioned once every claim is launched. A claim that is gone (or being deleted) before it
arrived is lost: Karpenter deletes claims it cannot launch
(insufficient capacity, node class not ready) and claims not launched or registered in time.
One lost claim makes the attempt a partial delivery.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gangcheck.logic.attempt.hold import hold_taint, hold_value
from gangcheck.logic.attempt.naming import fit
from gangcheck.logic.attempt.scaledown import removal
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.packing import PackedClaim
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import Obj


@dataclass(frozen=True)
class ClaimAsk:
    """What one attempt asks Karpenter for: ``nodes`` machines of ``pool``, each able to carry
    ``requests``, carrying ``labels`` (the flavor's node labels); or, with ``packed``, one
    machine per packed claim, each asking for its own members' sum (``ClaimAsk.packing``)."""

    attempt: str
    nodes: int
    requests: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    packed: tuple[PackedClaim, ...] = ()
    uid: str = ""
    """The request's uid: in the claims' names and on them (``REQUEST_UID``)."""

    @classmethod
    def packing(
        cls,
        attempt: str,
        packed: Sequence[PackedClaim],
        labels: Mapping[str, str],
        uid: str = "",
    ) -> ClaimAsk:
        return cls(attempt, len(packed), {}, dict(labels), tuple(packed), uid)

    def requests_of(self, index: int) -> dict[str, str]:
        return self.packed[index].asked() if self.packed else dict(self.requests)

    def instance_types_of(self, index: int) -> tuple[str, ...]:
        return self.packed[index].instance_types if self.packed else ()

    def members_of(self, index: int) -> int:
        return len(self.packed[index].members) if self.packed else 1


def claim_name(pool: str, attempt: str, index: int, uid: str = "") -> str:
    """Deterministic per request and index: ``<pool>-<hash of the attempt and the request's
    uid>-<index>`` (a request made again under the same name names other claims)."""
    made_for = f"{attempt}/{uid}" if uid else attempt
    return fit(pool, f"-{hold_value(made_for)[1:13]}-{index}")


def claim_bodies(pool: Obj, ask: ClaimAsk) -> list[Obj]:
    """The NodeClaims of ``ask``, built from ``pool``'s template."""
    return [_claim(pool, ask, index) for index in range(ask.nodes)]


def _claim(pool: Obj, ask: ClaimAsk, index: int) -> Obj:
    meta = pool.get("metadata") or {}
    template = (pool.get("spec") or {}).get("template") or {}
    spec = template.get("spec") or {}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.NODE_CLAIM_KIND,
        "metadata": {
            "name": claim_name(meta["name"], ask.attempt, index, ask.uid),
            "labels": _labels(meta["name"], template, spec, ask),
            "annotations": _annotations(meta, template, ask, index),
            "ownerReferences": [_owner(meta)],
        },
        "spec": _claim_spec(spec, ask, index),
    }


def _labels(pool_name: str, template: Obj, spec: Obj, ask: ClaimAsk) -> dict[str, str]:
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update(ask.labels)
    ref = spec.get("nodeClassRef") or {}
    if ref.get("group") and ref.get("kind"):
        labels[f"{ref['group']}/{str(ref['kind']).lower()}"] = str(ref.get("name", ""))
    labels[names.NODE_POOL_LABEL] = pool_name
    labels[names.ATTEMPT_LABEL] = hold_value(ask.attempt)
    return labels


def _annotations(meta: Obj, template: Obj, ask: ClaimAsk, index: int) -> dict[str, str]:
    annotations = dict((template.get("metadata") or {}).get("annotations") or {})
    if annotations.get(names.DO_NOT_DISRUPT) == "true":
        annotations[names.POOL_PROTECTED] = "true"  # the pool's word: never taken off
    pool_annotations = meta.get("annotations") or {}
    for key in (names.POOL_HASH, names.POOL_HASH_VERSION):
        if key in pool_annotations:
            annotations[key] = str(pool_annotations[key])
    annotations[names.DO_NOT_DISRUPT] = "true"
    annotations[names.REQUESTED_FOR] = ask.attempt
    if ask.uid:
        annotations[names.REQUEST_UID] = ask.uid
    annotations[names.GANG_NODES] = str(ask.nodes)
    annotations[names.CLAIM_INDEX] = str(index)
    annotations[names.CLAIM_MEMBERS] = str(ask.members_of(index))
    return annotations


def _owner(meta: Obj) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.NODE_POOL_KIND,
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "blockOwnerDeletion": True,
    }


_COPIED = ("nodeClassRef", "startupTaints", "expireAfter", "terminationGracePeriod")


def _claim_spec(spec: Obj, ask: ClaimAsk, index: int) -> Obj:
    body: Obj = {key: spec[key] for key in _COPIED if key in spec}
    requirements = [dict(r) for r in spec.get("requirements") or []]
    for key, value in sorted(ask.labels.items()):
        requirements.append({"key": key, "operator": "In", "values": [value]})
    types = ask.instance_types_of(index)
    if types:
        requirements = _narrowed(requirements, types)
    body["requirements"] = requirements
    body["taints"] = [*(spec.get("taints") or []), hold_taint(ask.attempt)]
    body["resources"] = {"requests": ask.requests_of(index)}
    return body


def _narrowed(requirements: list[Obj], types: Sequence[str]) -> list[Obj]:
    """``requirements`` with the instance types that hold the claim first, in place of the
    ``In`` requirements of that key (the types are among what those admit). First: a cloud
    provider may read only the first requirement of the key (the kwok provider's ``toNode``
    does)."""
    key = names.INSTANCE_TYPE_LABEL
    kept = [r for r in requirements if not (r.get("key") == key and r.get("operator") == "In")]
    return [{"key": key, "operator": "In", "values": list(types)}, *kept]


# -- following ---------------------------------------------------------------------------


class ClaimPhase(StrEnum):
    REQUESTED = "Requested"
    LAUNCH_FAILING = "LaunchFailing"
    LAUNCHED = "Launched"
    REGISTERED = "Registered"
    ARRIVED = "Initialized"
    LOST = "Lost"


@dataclass(frozen=True)
class ClaimState:
    name: str
    index: int | None
    phase: ClaimPhase
    node_name: str = ""
    message: str = ""


def _conditions(claim: Obj) -> dict[str, Obj]:
    return {c.get("type", ""): c for c in (claim.get("status") or {}).get("conditions") or []}


def _is_true(conditions: Mapping[str, Obj], kind: str) -> bool:
    return (conditions.get(kind) or {}).get("status") == "True"


def claim_state(claim: Obj) -> ClaimState:
    """Where one claim stands (a claim being deleted before it arrived is lost)."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    conditions = _conditions(claim)
    index = _int((meta.get("annotations") or {}).get(names.CLAIM_INDEX))
    node = str(status.get("nodeName") or "")
    arrived = _is_true(conditions, "Initialized") and bool(node)
    phase, message = _phase(
        conditions, arrived=arrived, deleting=bool(meta.get("deletionTimestamp"))
    )
    return ClaimState(str(meta.get("name", "")), index, phase, node, message)


def _phase(
    conditions: Mapping[str, Obj], *, arrived: bool, deleting: bool
) -> tuple[ClaimPhase, str]:
    if arrived:
        return ClaimPhase.ARRIVED, ""
    if deleting:
        return ClaimPhase.LOST, "being deleted before it arrived"
    if _is_true(conditions, "Registered"):
        return ClaimPhase.REGISTERED, ""
    if _is_true(conditions, "Launched"):
        return ClaimPhase.LAUNCHED, ""
    launched = conditions.get("Launched") or {}
    if launched.get("reason") not in (None, "", "AwaitingReconciliation", "Unknown"):
        return ClaimPhase.LAUNCH_FAILING, f"{launched['reason']}: {launched.get('message', '')}"
    return ClaimPhase.REQUESTED, ""


def _int(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


class AttemptPhase(StrEnum):
    PENDING = "Pending"
    PROVISIONED = "Provisioned"
    FAILED = "Failed"


@dataclass(frozen=True)
class ClaimsStatus:
    """The claims of one attempt that asked for ``asked`` nodes, taken together."""

    asked: int
    claims: tuple[ClaimState, ...]

    @property
    def arrived(self) -> tuple[str, ...]:
        """Node names of the claims that arrived, in index order."""
        return tuple(c.node_name for c in self.claims if c.phase is ClaimPhase.ARRIVED)

    @property
    def lost(self) -> tuple[int, ...]:
        """Indexes asked for whose claim is gone, or going, before it arrived."""
        present = {c.index for c in self.claims if c.phase is not ClaimPhase.LOST}
        return tuple(i for i in range(self.asked) if i not in present)

    @property
    def launched(self) -> bool:
        """Every claim asked for is launched (the cloud took it), or further."""
        done = {ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED, ClaimPhase.ARRIVED}
        indexes = {c.index for c in self.claims if c.phase in done}
        return all(i in indexes for i in range(self.asked))

    @property
    def failing(self) -> tuple[ClaimState, ...]:
        return tuple(c for c in self.claims if c.phase is ClaimPhase.LAUNCH_FAILING)

    @property
    def phase(self) -> AttemptPhase:
        """Failed on a lost claim (gone, or being deleted before it arrived); Provisioned once
        every claim is launched (as an autoscaler says Provisioned once it scaled up: the
        ledger then records the nodes as they come, and the fit, not this phase, says when
        the gang can start)."""
        if self.lost:
            return AttemptPhase.FAILED
        if self.launched:
            return AttemptPhase.PROVISIONED
        return AttemptPhase.PENDING

    @property
    def message(self) -> str:
        """One line for the gang's message: what arrived, what was lost and why it may be."""
        parts = [f"{len(self.arrived)} of {self.asked} NodeClaims arrived"]
        if self.lost:
            parts.append(
                f"{len(self.lost)} lost (gone before the gang started: Karpenter deletes a "
                "claim it cannot launch, e.g. InsufficientCapacityError, see the claim's "
                "Events; one deleted by hand or with its NodePool is lost too)"
            )
        parts.extend(f"{c.name}: {c.message}" for c in self.failing)
        return "; ".join(parts)


def attempt_claims(claims: Iterable[Obj], attempt: str) -> list[Obj]:
    """The claims labelled with ``attempt`` (only these are ever deleted by a withdrawal)."""
    value = hold_value(attempt)
    return [
        c
        for c in claims
        if ((c.get("metadata") or {}).get("labels") or {}).get(names.ATTEMPT_LABEL) == value
        and ((c.get("metadata") or {}).get("annotations") or {}).get(names.REQUESTED_FOR) == attempt
    ]


def made_for_another(claim: Obj, request: Obj) -> bool:
    """Whether ``claim``, labelled with ``request``'s name, was made for an earlier request of
    that name: it names another request uid; or, naming none (made by an older version), it
    was made in an earlier second than the request (a claim is made only after its request;
    both times are the API server's). A claim naming the request's own uid is its own,
    whatever second it carries (the kube-apiserver that made it may keep another clock)."""
    meta = claim.get("metadata") or {}
    asked = request.get("metadata") or {}
    uid = str((meta.get("annotations") or {}).get(names.REQUEST_UID) or "")
    if uid and asked.get("uid"):
        return uid != str(asked["uid"])
    made = parse_time(str(meta.get("creationTimestamp") or ""))
    born = parse_time(str(asked.get("creationTimestamp") or ""))
    return (
        made is not None
        and born is not None
        and made.replace(microsecond=0) < born.replace(microsecond=0)
    )


def claims_status(claims: Iterable[Obj], attempt: str, asked: int) -> ClaimsStatus:
    """The attempt's claims taken together, ``asked`` claims made (``claims_made``: a packed
    attempt makes fewer claims than it has members)."""
    mine = attempt_claims(claims, attempt)
    states = sorted((claim_state(c) for c in mine), key=lambda s: (s.index is None, s.index or 0))
    return ClaimsStatus(asked, tuple(states))


_CREATED = re.compile(r"^created (\d+) NodeClaims? ")


def claims_made(accepted_message: str) -> int | None:
    """How many claims the ``Accepted`` condition's message says were made (None: it does not
    say): what a request whose claims are all gone was asked with."""
    found = _CREATED.match(accepted_message or "")
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Made:
    """What an attempt's claims say of the creation they came from (their annotations): how
    many claims it made, for how many members, in which NodePool."""

    nodes: int
    members: int
    pool: str


def made_of(claims: Sequence[Obj]) -> Made:
    """What the attempt's ``claims`` say was made: the most claims any of them says the
    attempt made (``GANG_NODES``; one past the highest index, or how many are here, when none
    says), the members they are for, the pool they are in."""
    notes = [(c.get("metadata") or {}).get("annotations") or {} for c in claims]
    said = [n for n in (_int(a.get(names.GANG_NODES)) for a in notes) if n is not None]
    indexes = [i for i in (_int(a.get(names.CLAIM_INDEX)) for a in notes) if i is not None]
    nodes = max([*said, *(i + 1 for i in indexes), len(claims)])
    members = sum(_int(a.get(names.CLAIM_MEMBERS)) or 1 for a in notes)
    labels = [(c.get("metadata") or {}).get("labels") or {} for c in claims]
    pool = next(
        (str(lb[names.NODE_POOL_LABEL]) for lb in labels if lb.get(names.NODE_POOL_LABEL)), ""
    )
    return Made(nodes, members, pool)


_CREATED_IN = re.compile(r" in NodePool '([^']*)'$")


def pool_made_in(accepted_message: str) -> str | None:
    """The NodePool the ``Accepted`` condition's message says the claims were made in."""
    found = _CREATED_IN.search(accepted_message or "")
    return found.group(1) if found else None


def created_message(claims: int, members: int, pool: str) -> str:
    """The ``Accepted`` condition's message (``claims_made`` reads it back)."""
    packed = f" for {members} members" if members != claims else ""
    return f"created {claims} NodeClaims{packed} in NodePool {pool!r}"


def release_protection_patch(obj: Obj) -> list[Obj]:
    """JSON patch removing ``karpenter.sh/do-not-disrupt: "true"`` from a Node or NodeClaim
    once the gang has started (empty when it is not there: someone else's value is kept), as
    a kept node's cluster-autoscaler guard is taken off (logic/attempt/scaledown.py)."""
    return removal(obj, names.DO_NOT_DISRUPT)
