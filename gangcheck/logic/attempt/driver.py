"""The attempt driver: what every gang source does around one attempt, once.

A gang source (a Kueue Workload's check, a PodGroup) is an adapter. It builds the view of its
gang (the attempt's name and requests, the demand, the config), calls the driver, and maps
what comes back onto its own state (the check entry; the group's annotations), plus what is
truly its own (podSetUpdates and the start watchdog; gating and late members). The driver
owns the steps that must not differ between sources:

- ``ask``: a new attempt's ask, its one-line message and the Event saying it was made;
- ``in_flight``: following the attempt in flight: a rollback under way, the config changed
  under it (``lifecycle.source_drift``: the capacity source it was made with left the config
  or changed, or the class or parameters did; rolled back before Provisioned, and the next
  attempt made at once under the new config), a moved ``deadlineSeconds``, then
  ``lifecycle.follow``;
- ``withdraw``: every attempt of a gang that is gone, what arrived for each reclaimed (after
  the node cache has caught up), each said in an Event;
- ``fall_back``: InOrder, a place (capacity source, topology domain) that could not deliver
  left for the next inside the same attempt: where, under which ask, the one left withdrawn;
- Race: ``race.py`` beside this module.

The plumbing around these calls, which each adapter would otherwise write over its own
snapshot (the InOrder attempt in flight, top-ups, the fall-back, the race's entry), is
``flow.py``: one function for both, over the facts the adapter gives of its gang.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from gangcheck.logic.attempt import lifecycle, naming, places, rollback
from gangcheck.logic.attempt.actions import Action, Event
from gangcheck.logic.attempt.backend import Ask, CapacityBackend
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.records import RollbackCause
from gangcheck.logic.attempt.status import AttemptStatus, Phase
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.objects import ProvisioningRequest
from gangcheck.model.provisioning_config import AtomicProvisioningSpec

#: The most pod sets one ProvisioningRequest carries (the API's limit).
MAX_REQUEST_POD_SETS = 32


@dataclass(frozen=True)
class Asked:
    """A new attempt: what to say, the backend's actions making it, and its Event."""

    message: str
    actions: tuple[Action, ...]
    events: tuple[Event, ...]


def ask(backend: CapacityBackend, asked: Ask, *, reserved: int) -> Asked:
    """Make the attempt `asked` describes; `reserved`: members placed on reserved capacity,
    not asked for."""
    total = sum(p.count for p in asked.pod_sets)
    message = f"provisioning request {asked.attempt} created for {total} pods"
    if reserved:
        message += f" ({reserved} more placed on reserved capacity)"
    return Asked(message, backend.ask(asked), (lifecycle.asked(backend, asked.attempt),))


#: Rollbacks after which an attempt does not ask its next capacity source: the config
#: changed (the next attempt follows it), or the gang had its capacity and did not start.
NO_FALLBACK = frozenset({RollbackCause.CONFIG_CHANGED, RollbackCause.START_DEADLINE})


def falls_back(done: rollback.RolledBack) -> bool:
    """Whether the next place of the attempt is asked after this rollback: not after revoked
    capacity, nor a cause that never falls back (`NO_FALLBACK`)."""
    return not done.revoked and done.cause not in NO_FALLBACK


def next_in_line(
    config: AtomicProvisioningSpec,
    place: places.Place,
    gang_of: places.GangOf,
    capacity: ClusterView | None,
) -> str | None:
    """The place asked next should `place` fail, by name (lifecycle.Attempt.fallback)."""
    following = places.next_place(config, place, gang_of, capacity)
    return (following.describe(config) or "next") if following is not None else None


@dataclass(frozen=True)
class SourceNote:
    """What happened at one capacity source, for its metrics and what gangcheck publishes of
    it (`published.seen`): asked, delivered (the whole gang fits; `seconds` since it was
    asked), failed (`reason`: the rollback's cause; `seconds`: node-seconds held by what
    arrived from it and went back), or refused (it says it cannot find the capacity while
    the attempt waits on it: published, not counted)."""

    source: str
    outcome: str
    reason: str = ""
    seconds: float = 0.0


def asked_note(config: AtomicProvisioningSpec, index: int) -> SourceNote:
    return SourceNote(source_name(config, index), "asked")


def delivered_note(
    config: AtomicProvisioningSpec | None, req: ProvisioningRequest, now: datetime
) -> tuple[SourceNote, ...]:
    """The attempt's source (the one it asked, `lifecycle.asked_source`) delivered: how long
    after it was asked."""
    if config is None:
        return ()
    created = parse_time(req.creation_timestamp)
    seconds = max(0.0, (now - created).total_seconds()) if created else 0.0
    name = lifecycle.asked_source(req, config).name
    return (SourceNote(name, "delivered", seconds=seconds),)


def failed_note(
    config: AtomicProvisioningSpec | None, req: ProvisioningRequest, reason: str
) -> tuple[SourceNote, ...]:
    """The attempt's source could not deliver: why, and the node time it held."""
    if config is None:
        return ()
    record = rollback.record_of(req)
    held = float(record.outcome.node_seconds) if record.outcome else 0.0
    cause = RollbackCause.of(reason).value if reason else "Failed"
    return (SourceNote(lifecycle.asked_source(req, config).name, "failed", cause, held),)


def refused_note(
    config: AtomicProvisioningSpec | None, req: ProvisioningRequest, status: AttemptStatus
) -> tuple[SourceNote, ...]:
    """The attempt's source says it cannot find the capacity now (cluster-autoscaler's
    `CapacityIsNotFound`, not `Provisioned`), while the attempt waits on it (nothing next:
    it tries again later, until the deadline): no failure yet, so no metric, but published
    as its latest outcome (`published.seen`)."""
    if config is None or not status.capacity_not_found or status.has(Phase.PROVISIONED):
        return ()
    return (SourceNote(lifecycle.asked_source(req, config).name, "refused"),)


def source_name(config: AtomicProvisioningSpec, index: int) -> str:
    source = config.source(index)
    return source.name if source is not None else f"source-{index}"


def source_changed(config: AtomicProvisioningSpec, req: ProvisioningRequest) -> bool:
    """The capacity source `req` asked left the config, moved, or asks other nodes
    (`lifecycle.asked_source`): an attempt kept under it (it was Provisioned) asks no next
    place (falling back, topping up), since its recorded index no longer names its source
    in the config now; when it ends, it ends as a config change does (the next attempt asks
    the new list)."""
    return lifecycle.asked_source(req, config).change is not None


def source_failed_event(left: str, request: str, why: str, following: str, name: str) -> Event:
    """The Event saying an attempt left a place (a capacity source, a topology domain) for
    the next; `left` and `following` as `places.Place.describe` says them."""
    text = f"{left} could not deliver for {request} ({why}); asking {following} with {name}"
    return Event("CapacitySourceFailed", text[:1].upper() + text[1:], warning=True)


def too_many_pod_sets(count: int) -> bool:
    return count > MAX_REQUEST_POD_SETS


@dataclass(frozen=True)
class InFlight:
    """Where the attempt in flight stands, for the source to write."""

    step: lifecycle.Step | None
    """None: the config changed under an attempt outside fit mode, which ends at once (no
    rollback: nothing is counted as arrived for it); `change` says how."""
    request: ProvisioningRequest
    """The attempt's record as it will be (its deadline moved)."""
    upkeep: tuple[Action, ...] = ()
    """Actions before the step's: the backend's upkeep, a deadline moved."""
    change: str | None = None
    """The config changed under the attempt before Provisioned: how (`lifecycle.drift`)."""


def in_flight(
    attempt: lifecycle.Attempt,
    now: datetime,
    *,
    class_name: str,
    parameters: Mapping[str, str],
    upkeep: Callable[[], tuple[Action, ...]] = tuple,
    changed: str | None = None,
) -> InFlight:
    """Follow the attempt in flight under the config now (`attempt.config`; class and
    parameters as the source would ask them now): a rollback under way goes on; a config
    changed before Provisioned ends the attempt (rolled back in fit mode): the capacity
    source it was made with left the config, moved, or asks other nodes or another class or
    parameters (`lifecycle.source_drift`); once Provisioned it is kept (the adapters pin it
    and fit it to the source it asked, `lifecycle.asked_source`); in fit mode a changed
    ``deadlineSeconds`` moves its deadline; then as the core says. `upkeep`: the backend's
    upkeep of a request still followed (not of one rolling back). `changed`: a change the
    source found that the attempt cannot follow (the gang grew), in words: a change like
    any other."""
    req = attempt.request
    assert isinstance(req, ProvisioningRequest)
    if rollback.is_rolling_back(req):
        return InFlight(lifecycle.roll_back(attempt), req)
    actions = upkeep()
    change = changed or lifecycle.source_drift(req, attempt.config, class_name, parameters)
    if change is not None and not attempt.status.has(Phase.PROVISIONED):
        step = lifecycle.replaced(attempt, change, now) if attempt.fit else None
        return InFlight(step, req, actions, change)
    if attempt.fit:
        req, moved = lifecycle.current_deadline(req, attempt.config)
        actions += moved
    step = lifecycle.follow(replace(attempt, request=req), now)
    return InFlight(step, req, actions)


def replaced_event(name: str) -> Event:
    """The Event saying an attempt is replaced because the config changed under it."""
    return Event(
        "ProvisioningRequestReplaced",
        f"ProvisioningRequest {name!r} no longer matches the config; the next attempt uses the "
        "new config",
    )


@dataclass(frozen=True)
class Withdrawal:
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None


def withdraw(
    requests: Sequence[ProvisioningRequest],
    *,
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    backend: CapacityBackend,
    why: str,
    gone: bool = False,
) -> Withdrawal:
    """Withdraw every attempt of a gang (lifecycle.clean_up: what arrived reclaimed under the
    config each was made with), once the node cache allows it (lifecycle.clean_up_waits);
    the reclaims said in Events (lifecycle.reclaiming)."""
    if lifecycle.clean_up_waits(requests, capacity, config):
        return Withdrawal(requeue_after=lifecycle.CATCH_UP_REQUEUE_SECONDS)
    actions = lifecycle.clean_up(
        requests, capacity=capacity, config=config, backend=backend, why=why, gone=gone
    )
    return Withdrawal(actions, lifecycle.reclaiming(actions, why))


@dataclass(frozen=True)
class FallBack:
    """InOrder: the place that could not deliver left for the next, in the same attempt."""

    place: places.Place
    """Where the next ask goes."""
    ask: int
    """Its number among the attempt's asks (its request's name says it: ``-s<n>``)."""
    said: str
    """What the gang's message says first: which place was left, and why."""
    gone: tuple[Action, ...]
    """The request left withdrawn (after the next is made), the hold lifted from its nodes
    (its rollback has reclaimed what arrived for it)."""
    left: str
    why: str

    def event(self, config: AtomicProvisioningSpec, request: str, name: str) -> Event:
        """CapacitySourceFailed: `request` left for the next ask, `name`."""
        return source_failed_event(self.left, request, self.why, self.place.describe(config), name)


def fall_back(
    config: AtomicProvisioningSpec,
    req: ProvisioningRequest,
    *,
    asks: int,
    gang_of: places.GangOf,
    capacity: ClusterView | None,
    backend: CapacityBackend,
    why: str,
) -> FallBack | None:
    """The place `req` asked could not deliver (`why`): the next place of the attempt (the
    next domain of its source, else the next source), asked as ask ``asks + 1``; None when
    no place is next, the attempt has made its most asks (then it ends as with one source),
    or its source changed under it (`source_changed`)."""
    if source_changed(config, req):
        return None
    place = places.of_request(req)
    following = places.next_place(config, place, gang_of, capacity)
    if following is None or asks + 1 >= naming.MAX_ASKS:
        return None
    left = place.describe(config) or source_name(config, place.source)
    gone = (
        *lifecycle.release_hold(capacity, req),
        *backend.withdraw(req, f"{left} could not deliver"),
    )
    said = f"{left} could not deliver ({why}); "
    return FallBack(following, asks + 1, said, gone, left, why)
