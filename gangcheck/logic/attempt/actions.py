"""What a decision asks the edge to do: typed, ordered, applied once each."""

from __future__ import annotations

from dataclasses import dataclass

from gangcheck.model import objects
from gangcheck.model.objects import Obj


@dataclass(frozen=True)
class CreateTemplate:
    body: Obj


@dataclass(frozen=True)
class CreateRequest:
    body: Obj


@dataclass(frozen=True)
class DeleteRequest:
    """Delete a request and the PodTemplates it points at."""

    name: str
    uid: str
    templates: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class DeleteTemplate:
    name: str


@dataclass(frozen=True)
class AnnotateRequest:
    name: str
    annotations: dict[str, str]


@dataclass(frozen=True)
class ClaimNode:
    """Record a node as arrived for a request, and hold it for the request's gang (hold.py),
    if it is still at this resourceVersion."""

    name: str
    resource_version: str
    request: str
    hold: str = ""
    """The request whose hold the node is given, when not `request` (fulfillment.hold_key)."""


@dataclass(frozen=True)
class ReclaimArrivals:
    """Reclaim, safely, the nodes that arrived for a rolled-back request; record the outcome."""

    request: str
    request_key: str
    request_created: str
    nodes: tuple[str, ...]
    reclaimer: str
    node_created: tuple[str, ...] = ()
    """creationTimestamp of each node, to count the time held of one already gone."""
    earlier: str = ""
    """The outcome an earlier reclaim of the same request recorded (its annotation), for a
    request kept open after its gang went: the outcome recorded is both (`Outcome.after`),
    so it names every node that came for it."""


@dataclass(frozen=True)
class ReleaseMembers:
    """Lift gangcheck's scheduling gate from these pods of a gang, together, after writing
    the annotations and node selector entries on each (a gated pod accepts both)."""

    pods: tuple[str, ...]
    annotations: dict[str, str]
    node_selector: dict[str, str]
    gate: str
    tolerations: tuple[Obj, ...] = ()
    """Added to each member's own: the toleration of the hold on its gang's nodes."""


@dataclass(frozen=True)
class ReleaseHold:
    """Lift the hold (hold.py) from these nodes: their gang has started, or a rollback
    kept them; or (`gone`, a request's name in the gang's namespace) the request they are
    held for is gone, deleted outside gangcheck: lifted only once the API server confirms
    it is, never on its absence from a cache alone (a lagging list)."""

    nodes: tuple[str, ...]
    gone: str = ""
    unconsumed: str = ""
    """A request's name in the gang's namespace, withdrawn (with what follows this action)
    because no member consumes it as the pod cache shows: lifted, and the rest of the
    decision applied, only once the API server confirms no pod there consumes it, never on
    the pod cache alone (one older than the request's record: a member released onto it
    shows still gated there)."""


@dataclass(frozen=True)
class GuardScaleDown:
    """Set cluster-autoscaler's ``scale-down-disabled`` on these nodes, with gangcheck's record
    naming `request` (``namespace/name``), where neither is there (`on`); or take both off
    where that record names `request` (not `on`). scaledown.py decides each node's patch."""

    request: str
    nodes: tuple[str, ...]
    on: bool = True


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on the object reconciled, or on `about` when set (a member pod)."""

    reason: str
    message: str
    warning: bool = False
    about: objects.ObjectRef | None = None


Action = (
    CreateTemplate
    | CreateRequest
    | DeleteRequest
    | DeleteTemplate
    | AnnotateRequest
    | ClaimNode
    | ReclaimArrivals
    | ReleaseMembers
    | ReleaseHold
    | GuardScaleDown
)
