"""The capacity-backend seam: ask for capacity for one gang attempt, follow it, withdraw it.

A decision never builds a backend's objects itself: it says what it wants in the
backend-neutral terms below (an `Ask`, a withdrawal, the status it reads), and the backend
turns that into its actions (for ProvisioningRequest: PodTemplates and a request to create;
the request to delete). The edge applies those actions (reconcile/apply.py).

What a second backend implements (Karpenter, say: one NodeClaim per node of the gang, each
labelled with the attempt and naming a NodePool):
- ``ask``: the objects to create for a new attempt (NodeClaims sized for the pod sets);
- ``status_of``: its objects' state as an `AttemptStatus` (all Launched/Registered ->
  Provisioned; a claim failing with InsufficientCapacity -> Failed, a partial delivery);
- ``follow``: upkeep while the attempt is in flight (nothing, or re-creating a lost claim);
- ``withdraw``: the actions that end the ask (delete the NodeClaims).
Reclaiming what arrived for a rolled-back attempt is a seam of its own (gangcheck/reclaim/).

At the edge, a second backend adds its action types (logic/attempt/actions.py) with their
handlers (reconcile/apply.py), and hands the snapshots of both gang sources its records
(`AttemptRecord`, e.g. read from an object it anchors each attempt on) and itself as
``backend`` (an instance may hold what ``status_of`` reads, such as the attempt's NodeClaims).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gangcheck.logic.attempt.actions import Action
from gangcheck.logic.attempt.status import AttemptStatus
from gangcheck.model.objects import Obj, ObjectRef, RequestPodSet


@dataclass(frozen=True)
class AskedPodSet:
    """Members of a gang with identical requirements: how many, and the pod they stand for."""

    name: str
    count: int
    template: Obj
    """The PodTemplateSpec every member of the pod set stands for."""


@dataclass(frozen=True)
class Ask:
    """Ask for capacity for one gang attempt, in no backend's terms."""

    attempt: str
    """The attempt's name: unique per gang and attempt number."""
    namespace: str
    pod_sets: tuple[AskedPodSet, ...]
    identity: Mapping[str, str]
    """Annotations naming the gang, on every object made for the attempt."""
    record: Mapping[str, str]
    """gangcheck's record of the attempt (number, deadline, …), on the object that anchors it."""
    capacity_class: str
    """What kind of capacity (a provisioning class; for Karpenter, a NodePool)."""
    parameters: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[Obj, ...] = ()
    """Owner references of the per-pod-set objects (the gang's own object)."""
    existing: frozenset[str] = frozenset()
    """Names of the attempt's objects that exist already (an interrupted reconcile)."""


class AttemptRecord(Protocol):
    """The object anchoring an attempt, as the attempt core reads it: its identity, when it
    was made, what it asks for, and gangcheck's record of it (annotations: number, deadline,
    phase, rollback). A ProvisioningRequest is one (model/objects.py); a backend without a
    request object of its own anchors the record on an object it makes for the attempt."""

    @property
    def ref(self) -> ObjectRef: ...

    @property
    def name(self) -> str: ...

    @property
    def annotations(self) -> dict[str, str]: ...

    @property
    def creation_timestamp(self) -> str: ...

    @property
    def deleting(self) -> bool: ...

    @property
    def pod_sets(self) -> tuple[RequestPodSet, ...]: ...


class CapacityBackend(Protocol):
    """Ask for capacity for a gang attempt, follow it, withdraw it. Pure: returns actions."""

    kind: str
    """The backend's name, as said to people (``ProvisioningRequest``)."""

    def ask(self, ask: Ask) -> tuple[Action, ...]:
        """The actions that make the ask (create what does not exist yet)."""
        ...

    def status_of(self, attempt: AttemptRecord) -> AttemptStatus:
        """What the backend says of the attempt now."""
        ...

    def follow(self, attempt: AttemptRecord, ask: Ask) -> tuple[Action, ...]:
        """Upkeep while the attempt is in flight: the objects of `ask` that are gone, made
        again."""
        ...

    def withdraw(self, attempt: AttemptRecord, reason: str) -> tuple[Action, ...]:
        """The actions that end the ask: its capacity is no longer wanted."""
        ...
