"""What `gangcheck diagnose` and `gangcheck status` say of a Karpenter attempt's NodeClaims.

An attempt whose ProvisioningRequest has gangcheck's Karpenter class is served with NodeClaims
labelled with the attempt (``claims.py``). The edge lists them (one list, optional: a cluster
without Karpenter's CRDs, or a reader without the right to list them, gets ``unreadable``);
here they become facts: one line per claim (name, NodePool, phase, node, message) and the
summary the provisioner writes onto the request (``ClaimsStatus.message``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gangcheck.logic.attempt.explain import RequestFacts
from gangcheck.logic.attempt.hold import hold_value
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import (
    attempt_claims,
    claims_made,
    claims_status,
    made_of,
)
from gangcheck.model.objects import Obj
from gangcheck.model.provisioning_config import KARPENTER_CLASS

HEADER = ("NAME", "NODEPOOL", "PHASE", "NODE")


@dataclass(frozen=True)
class ClaimFacts:
    """One NodeClaim of the attempt, as a person reads it."""

    name: str
    node_pool: str
    phase: str
    """A ``ClaimPhase``: Requested, LaunchFailing, Launched, Registered, Initialized, Lost."""
    node: str = ""
    message: str = ""


@dataclass(frozen=True)
class NodeClaimFacts:
    """The NodeClaims of one attempt that asked for ``asked`` nodes (``readable`` False: they
    could not be listed, ``problem`` says why)."""

    asked: int
    readable: bool = True
    problem: str = ""
    claims: tuple[ClaimFacts, ...] = ()
    arrived: int = 0
    summary: str = ""

    @property
    def line(self) -> str:
        """The first line of the section: the summary, or why there is none."""
        if not self.readable:
            return f"NodeClaims: not readable ({self.problem})"
        if not self.claims and not self.summary:
            return "no NodeClaims for this attempt"
        return self.summary


def is_karpenter(request: RequestFacts | None) -> bool:
    """The attempt's request exists and gangcheck serves it with NodeClaims."""
    return request is not None and request.found and request.class_name == KARPENTER_CLASS


def attempt_key(namespace: str, request: RequestFacts) -> str:
    """The attempt the claims are labelled with: the request's ``namespace/name``."""
    return f"{namespace}/{request.name}"


def attempt_selector(key: str) -> str:
    """The label selector listing the claims of the attempt ``key`` only."""
    return f"{names.ATTEMPT_LABEL}={hold_value(key)}"


#: The label selector listing the claims of every attempt (for `gangcheck status`).
ANY_ATTEMPT = names.ATTEMPT_LABEL


def node_claim_facts(
    claims: Iterable[Obj], key: str, asked: int, *, accepted: bool = True
) -> NodeClaimFacts:
    """The claims of the attempt ``key`` among ``claims``, with the request's summary.
    Without a claim, the summary counts them lost only once the request was ``accepted``
    (claims were made); before that there is none to show yet."""
    mine = attempt_claims(claims, key)
    pools = {_name(c): _pool(c) for c in mine}
    status = claims_status(mine, key, asked)
    facts = tuple(
        ClaimFacts(
            name=s.name,
            node_pool=pools.get(s.name, ""),
            phase=s.phase.value,
            node=s.node_name,
            message=s.message,
        )
        for s in status.claims
    )
    summary = status.message if mine or (accepted and asked) else ""
    return NodeClaimFacts(asked, claims=facts, arrived=len(status.arrived), summary=summary)


def unreadable(asked: int, problem: str) -> NodeClaimFacts:
    return NodeClaimFacts(asked, readable=False, problem=problem)


def claim_rows(facts: NodeClaimFacts) -> list[list[str]]:
    """The claims as table rows, header first, in the order of ``facts.claims`` (none when
    there is no claim to show; each claim's message goes on a line of its own)."""
    if not facts.claims:
        return []
    rows = [list(HEADER)]
    rows += [[c.name, c.node_pool or "-", c.phase, c.node or "-"] for c in facts.claims]
    return rows


def request_claims(claims: Iterable[Obj], namespace: str, request: RequestFacts) -> NodeClaimFacts:
    """The facts of the claims of ``request``'s attempt (a Karpenter-class request)."""
    accepted = request.conditions.get("Accepted")
    made = claims_made(accepted.message) if accepted is not None else None
    key = attempt_key(namespace, request)
    if made is None:  # not recorded (yet): what the claims say, as the provisioner counts
        mine = attempt_claims(claims, key)
        made = made_of(mine).nodes if mine else request.members
    return node_claim_facts(claims, key, made, accepted=accepted is not None and accepted.is_true)


def _name(claim: Obj) -> str:
    return str((claim.get("metadata") or {}).get("name") or "")


def _pool(claim: Obj) -> str:
    labels = (claim.get("metadata") or {}).get("labels") or {}
    return str(labels.get(names.NODE_POOL_LABEL) or "")
