"""Why a node cannot take a member, as the fit and the DRA allocation both say it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rejection:
    """Why a node cannot take a member: `short` groups alike nodes, `detail` names values."""

    short: str
    detail: str = ""

    def __str__(self) -> str:
        return self.detail or self.short
