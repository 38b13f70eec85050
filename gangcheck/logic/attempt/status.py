"""An attempt's status, whatever backend asked for its capacity: parsed once, read everywhere.

The phases are Kueue's words for a ProvisioningRequest's conditions; gangcheck records them
(rollback reasons, metrics) whatever the backend, so a backend maps what it sees onto them.
Precedence (Kueue's): Failed > CapacityRevoked > BookingExpired (until the gang started) >
Provisioned > Accepted > Pending.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gangcheck.model.objects import Condition

CAPACITY_NOT_FOUND = "CapacityIsNotFound"
"""The reason cluster-autoscaler gives when no node group can host the pods."""


class Phase(StrEnum):
    PENDING = "Pending"
    """Asked for; the backend has not taken the ask yet."""
    ACCEPTED = "Accepted"
    """The backend took the ask; the capacity is not there yet."""
    PROVISIONED = "Provisioned"
    """The backend says the capacity is there (booked for the gang)."""
    FAILED = "Failed"
    """The backend gave up on the ask."""
    REVOKED = "CapacityRevoked"
    """Capacity once provisioned was taken back."""
    EXPIRED = "BookingExpired"
    """The booking lapsed before the gang used it."""


PRECEDENCE = (Phase.FAILED, Phase.REVOKED, Phase.EXPIRED, Phase.PROVISIONED, Phase.ACCEPTED)
ENDED = frozenset({Phase.FAILED, Phase.REVOKED, Phase.EXPIRED})


@dataclass(frozen=True)
class Signal:
    """One thing the backend says of the attempt: why, in its words, and since when."""

    reason: str = ""
    message: str = ""
    since: str = ""

    @property
    def text(self) -> str:
        """The message, else the reason."""
        return self.message or self.reason


@dataclass(frozen=True)
class AttemptStatus:
    """What the backend says of one attempt: the phases it asserts now, and its word on
    capacity not there yet (an ETA, or why not)."""

    signals: Mapping[Phase, Signal] = field(default_factory=dict)
    """Each phase the backend asserts now (a true condition), with its signal."""
    note: Signal | None = None
    """The backend's word while the capacity is not provisioned (ETA or why not)."""
    capacity_not_found: bool = False
    """The backend found no capacity of the kind asked for (said while pending or failed)."""
    created: str = ""
    """When the attempt's ask was made (RFC 3339)."""
    asked: int = 0
    """Members the ask is for."""

    def has(self, phase: Phase) -> bool:
        return phase in self.signals

    def signal(self, phase: Phase) -> Signal:
        return self.signals.get(phase, Signal())

    def phase(self, *, started: bool = False) -> Phase:
        """The phase that rules, by precedence; once the gang `started`, an expired booking
        no longer matters (its pods hold the capacity)."""
        for phase in PRECEDENCE:
            if phase in self.signals and not (phase is Phase.EXPIRED and started):
                return phase
        return Phase.PENDING

    @property
    def has_ended(self) -> bool:
        """Failed, revoked or expired: no capacity will come for this attempt."""
        return any(p in self.signals for p in ENDED)

    @property
    def note_text(self) -> str:
        return self.note.message if self.note else ""


def status_from(conds: Mapping[str, Condition]) -> AttemptStatus:
    """Conditions of a request as an attempt status: the one place they are read."""
    provisioned = conds.get(Phase.PROVISIONED.value)
    failed = conds.get(Phase.FAILED.value)
    return AttemptStatus(
        signals={
            phase: _signal(c)
            for phase in Phase
            if (c := conds.get(phase.value)) is not None and c.is_true
        },
        note=_signal(provisioned) if provisioned and not provisioned.is_true else None,
        capacity_not_found=any(
            c is not None and c.reason == CAPACITY_NOT_FOUND for c in (provisioned, failed)
        ),
    )


CONDITION_TYPES = tuple(p.value for p in Phase if p is not Phase.PENDING)
"""The request conditions gangcheck reads (shown by diagnose)."""


def _signal(condition: Condition) -> Signal:
    return Signal(condition.reason, condition.message, condition.last_transition_time)
