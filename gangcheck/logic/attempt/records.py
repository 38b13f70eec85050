"""What an attempt leaves on API objects, read back: the arrival ledger on nodes, and the
outcome of a rollback on its request. A leaf: imports nothing of logic/."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from gangcheck.model.names import ARRIVED_FOR
from gangcheck.model.objects import Obj


def arrived_for(nodes: Iterable[Obj], request: str) -> list[Obj]:
    """The nodes the arrival ledger records as arrived for the request (`namespace/name`)."""
    return [
        n
        for n in nodes
        if (n.get("metadata", {}).get("annotations") or {}).get(ARRIVED_FOR) == request
    ]


@dataclass(frozen=True)
class Outcome:
    """What one rollback did to the nodes that arrived for its request."""

    reclaimed: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    kept: dict[str, str] = field(default_factory=dict)
    """Kept by a safety rule, final: node -> reason."""
    node_seconds: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    """Not reclaimed because of an error, retried with backoff: node -> last error."""

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "reclaimed": list(self.reclaimed),
                "draining": list(self.draining),
                "kept": self.kept,
                "failed": self.failed,
                "nodeSeconds": self.node_seconds,
            },
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, raw: str) -> Outcome:
        try:
            data = json.loads(raw)
            return cls(
                reclaimed=tuple(data.get("reclaimed") or ()),
                draining=tuple(data.get("draining") or ()),
                kept=dict(data.get("kept") or {}),
                node_seconds=int(data.get("nodeSeconds") or 0),
                failed=dict(data.get("failed") or {}),
            )
        except (ValueError, TypeError, AttributeError):
            return cls(kept={"?": f"unreadable outcome {raw[:80]!r}"})

    def summary(self) -> str:
        parts = [
            f"reclaimed {len(self.reclaimed)} node{'s' * (len(self.reclaimed) != 1)}"
            f" ({self.node_seconds / 60:.1f} node-minutes held)"
        ]
        if self.draining:
            parts.append(f"{len(self.draining)} to reclaim once the gang's pods leave")
        if self.kept:
            parts.append(f"kept {_each(self.kept)}")
        if self.failed:
            parts.append(f"failed, retrying: {_each(self.failed)}")
        return "; ".join(parts)


def _each(reasons: dict[str, str]) -> str:
    """Every node with its reason: `n1 (why), n2 (why)`."""
    return ", ".join(f"{name} ({why})" for name, why in sorted(reasons.items()))
