"""What a decision asks the edge to do: typed, ordered, applied once each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gangcheck.model import objects

Obj = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gangcheck"
WORKLOAD_ANNOTATION = "gangcheck.io/workload"
WORKLOAD_UID_ANNOTATION = objects.WORKLOAD_UID_ANNOTATION
CHECK_ANNOTATION = "gangcheck.io/check"
ATTEMPT_ANNOTATION = "gangcheck.io/attempt"
DEADLINE_ANNOTATION = "gangcheck.io/fulfillment-deadline"
PHASE_ANNOTATION = "gangcheck.io/phase"
OUTCOME_ANNOTATION = "gangcheck.io/outcome"
ROLLBACK_REASON_ANNOTATION = "gangcheck.io/rollback-reason"
ROLLBACK_NODES_ANNOTATION = "gangcheck.io/rollback-nodes"
ROLLING_BACK = "RollingBack"
FULFILLED = "Fulfilled"
STARTED = "Started"

CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"


@dataclass(frozen=True)
class CreateTemplate:
    body: Obj


@dataclass(frozen=True)
class CreateRequest:
    body: Obj


@dataclass(frozen=True)
class AdoptTemplate:
    """Hand a PodTemplate from the Workload to the request that uses it."""

    name: str
    request: str
    request_uid: str


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
    """Record a node as arrived for a request, and hold it for the request's gang (logic/hold),
    if it is still at this resourceVersion."""

    name: str
    resource_version: str
    request: str


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
    """Lift the hold (logic/hold) from these nodes: their gang has started, or a rollback
    kept them."""

    nodes: tuple[str, ...]


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
    | AdoptTemplate
    | DeleteRequest
    | DeleteTemplate
    | AnnotateRequest
    | ClaimNode
    | ReclaimArrivals
    | ReleaseMembers
    | ReleaseHold
)
