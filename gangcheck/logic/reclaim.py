"""Safe reclaim, as invariants: which arrived node may be taken back, and what a rollback did.

A node is reclaimed only if it was recorded as arrived for this very request, is proven
younger than the request (``proven_younger``: created in a later second), carries no opt-out
label, and runs no pod other than DaemonSet pods. Pods of the
gang itself (those consuming the request) make the node wait ("drain") rather than stay: they
leave when Kueue evicts the gang. The edge asks again right before acting.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from gangcheck.logic.actions import CONSUME_ANNOTATION
from gangcheck.logic.fulfillment import ARRIVED_FOR, OPT_OUT_LABEL, claim_of, proven_younger
from gangcheck.logic.timefmt import parse_time

Obj = dict[str, Any]

RECLAIM_WHEN_IDLE = "gangcheck.io/reclaim-when-idle"
RECLAIM_TAINT = "gangcheck.io/reclaiming"

Verdict = Literal["reclaim", "drain", "keep"]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str = ""


def is_daemonset_pod(pod: Obj) -> bool:
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("kind") == "DaemonSet" and r.get("controller") for r in refs)


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_name(pod: Obj) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def judge(
    node: Obj, pods_on_node: Iterable[Obj], *, request: str, request_created: datetime | None
) -> Judgement:
    """May this node, arrived for `request` (`ns/name`), be reclaimed now?"""
    meta = node.get("metadata", {})
    if (meta.get("labels") or {}).get(OPT_OUT_LABEL) is not None:
        return Judgement("keep", f"carries the opt-out label {OPT_OUT_LABEL}")
    if claim_of(node) != request:
        owner = claim_of(node) or "no request"
        return Judgement("keep", f"recorded for {owner}, not {request}")
    if not proven_younger(node, request_created):
        return Judgement(
            "keep", "not proven younger than the request (created the same second or before)"
        )
    return _judge_pods(pods_on_node, request.split("/", 1)[-1])


def _judge_pods(pods: Iterable[Obj], request_name: str) -> Judgement:
    gang_pods = []
    for pod in pods:
        if is_terminal(pod) or is_daemonset_pod(pod):
            continue
        annotations = pod.get("metadata", {}).get("annotations") or {}
        if annotations.get(CONSUME_ANNOTATION) != request_name:
            return Judgement("keep", f"runs pod {pod_name(pod)}")
        gang_pods.append(pod)
    if gang_pods:
        return Judgement("drain", f"{len(gang_pods)} gang pods still on it")
    return Judgement("reclaim")


@dataclass(frozen=True)
class Outcome:
    """What one rollback did to the nodes that arrived for its request."""

    reclaimed: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    kept: dict[str, str] = field(default_factory=dict)
    node_seconds: int = 0

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "reclaimed": list(self.reclaimed),
                "draining": list(self.draining),
                "kept": self.kept,
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
            name, why = sorted(self.kept.items())[0]
            more = f" and {len(self.kept) - 1} more" if len(self.kept) > 1 else ""
            parts.append(f"kept {name} ({why}){more}")
        return "; ".join(parts)


def held_seconds(node: Obj, now: datetime) -> int:
    born = parse_time(node.get("metadata", {}).get("creationTimestamp", ""))
    return max(0, int((now - born).total_seconds())) if born else 0


def arrived_for(nodes: Iterable[Obj], request: str) -> list[Obj]:
    return [
        n
        for n in nodes
        if (n.get("metadata", {}).get("annotations") or {}).get(ARRIVED_FOR) == request
    ]
