"""The capacity seam: ask for capacity for one gang attempt, follow it, withdraw it.

The attempt core (lifecycle.py, driver.py) and the gang sources talk to capacity only through
this contract; the backends live in logic/sources/ and import the core, never the reverse.
A decision never builds a backend's objects itself: it says what it wants in the neutral terms
below (an `Ask`, a withdrawal, the status it reads), and the backend turns that into its
actions, which the edge applies (reconcile/apply.py).

Today there is one backend, the ProvisioningRequest (sources/provreq.py): one request per
attempt, with a PodTemplate per pod set; whoever serves the request's class answers it with
conditions. cluster-autoscaler serves its classes; gangcheck's own Karpenter provisioner
(sources/karpenter/, reconcile/karpenter.py) serves ``karpenter.gangcheck.io`` by creating
the gang's NodeClaims. So a new place to ask is, first, a new class and a provisioner
answering its requests: the request stays the attempt's record, and nothing here changes.
One attempt may ask several places (spec.capacitySources, in order or in a race; topology
domains within a source): each ask is a request of its own, named by its number in the
attempt and carrying its place (places.py), followed by the same core.

A source that cannot be a request class implements:
1. `CapacityBackend` (below), pure: ``ask`` (the actions creating what a new attempt asks
   for), ``status_of`` (what its objects say, as an `AttemptStatus`: Accepted, Provisioned,
   Failed, ...; the record it reads, `AttemptRecord`, is anchored on an object it makes),
   ``follow`` (upkeep in flight: what was lost, made again) and ``withdraw`` (the actions
   ending the ask); its new action types go into logic/attempt/actions.py;
2. at the edge, a `SourceEdge` (reconcile/apply.py): a handler for each of its action types
   and how it writes a record on its attempt's object, registered in ``app.SOURCES`` beside
   reconcile/provreq.py's; the applier dispatches through that registry, which refuses an
   action type claimed twice.
The attempt core never imports a source. Reclaiming what arrived for a rolled-back attempt is
a seam of its own (gangcheck/reclaim/).
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
