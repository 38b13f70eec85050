"""Why a node cannot take a member, as the fit and the DRA allocation both say it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rejection:
    """Why a node cannot take a member: `short` groups alike nodes, `detail` names values;
    `kind` says which check failed (taint, selector, affinity, not-ready, cordoned,
    deleting, claim-deleting, resources; empty: any other) and `subject` what it names (the
    taint, the labels, the resources short, the NodeClaim), for the words of a diagnosis."""

    short: str
    detail: str = ""
    kind: str = field(default="", kw_only=True)
    subject: str = field(default="", kw_only=True)

    def __str__(self) -> str:
        return self.detail or self.short
