"""capacitySourcePolicy Race, for any gang: what does not depend on who the gang is.

An attempt under Race asks the first ``raceWidth`` capacity sources at once (its asks named as
InOrder's, ``-s<n>`` after the first, each recording its source). Each racer is followed as an
attempt of its own (``driver.in_flight``). The first to deliver the whole gang wins; the
others are withdrawn at once and what arrived for them is reclaimed by the same safe path as a
rollback (``driver.withdraw``). A racer that fails (rolled back, or ended outside fit mode) is
withdrawn and its place goes to the next source not asked yet: the first of the config now
that the attempt has not asked, the sources asked known by identity (``sources_asked``), so a
list edited mid-race neither skips a source nor asks one twice. Each ask in a racer's place
records the sources the race has asked (`_given`); a racer that ends with no source left to
ask in its place tells the racers left, whose records do not know that much, that every
source of the config then was asked (`_told`), before its request goes. When every source
has failed, the attempt ends as one with a single source would (the adapter retries or gives
up).

The adapter (a Workload's check, a PodGroup) says how one racer is followed and how an ask is
made, and writes what the race comes to on its own state: a Workload's check entry and
podSetUpdates; a PodGroup's annotations and its members' release. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gangcheck.logic.attempt import driver, lifecycle, naming, places, rollback
from gangcheck.logic.attempt.actions import Action, AnnotateRequest, Event
from gangcheck.logic.attempt.backend import CapacityBackend
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.lifecycle import Progress
from gangcheck.logic.attempt.records import RollbackCause
from gangcheck.model.names import ATTEMPT_CONFIG_ANNOTATION, RACED_ALL_ANNOTATION, SOURCE_ANNOTATION
from gangcheck.model.objects import ProvisioningRequest
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, recorded_spec, spec_record

#: Why a racer that lost is withdrawn.
LOST = "another capacity source delivered the gang first"
#: Why a racer that could not deliver is withdrawn.
COULD_NOT = "it could not deliver in the race"
#: Why a place in the race is given with no racer withdrawn (`Ended` without a request).
VACANT = (
    "the race had fewer racers than raceWidth (a racer's request deleted outside gangcheck, "
    "or a source added to the list after the last one was asked)"
)

Ask = tuple[int, ProvisioningRequest]
"""A request of the attempt, with its number among the attempt's asks."""
FollowOne = Callable[[ProvisioningRequest, bool], driver.InFlight]
"""How the adapter follows one racer (`driver.in_flight` on its attempt); the flag: another
racer or source remains, so a racer whose source says CapacityIsNotFound ends at once."""


def asks(requests: Sequence[ProvisioningRequest], name_of: Callable[[int], str]) -> list[Ask]:
    """Every request of the attempt in flight (`name_of`: the attempt's n-th ask's name), with
    its number among the attempt's asks."""
    by_name = {r.name: r for r in requests}
    names = [(k, name_of(k)) for k in range(naming.MAX_ASKS)]
    return [(k, by_name[n]) for k, n in names if n in by_name]


def is_race(asks: Sequence[Ask], config: AtomicProvisioningSpec | None) -> bool:
    """Whether the attempt of `asks` is a race: as the config its asks were made under says
    (`lifecycle.made_under`), so a capacitySourcePolicy edited mid-attempt follows neither a
    race as InOrder (its other racers deleted as superseded, what arrived for them not
    reclaimed) nor an InOrder attempt as a race; an attempt not asked yet, as `config` (the
    config now)."""
    made = lifecycle.made_under(asks[0][1], config) if asks else config
    return made is not None and made.racing > 1


def stale(
    requests: Sequence[ProvisioningRequest],
    mine: Sequence[Ask],
    *,
    capacity: ClusterView | None,
    backend: CapacityBackend,
    why: str,
) -> tuple[Action, ...]:
    """Withdraw the requests that are no ask of the attempt in flight (an earlier attempt's),
    lifting the hold from what they kept."""
    ours = {r.name for _, r in mine}
    return tuple(
        a
        for r in requests
        if r.name not in ours and not r.deleting
        for a in (*lifecycle.release_hold(capacity, r), *backend.withdraw(r, why))
    )


def starting(config: AtomicProvisioningSpec) -> tuple[places.Place, ...]:
    """The places a race starts at: the first `raceWidth` sources, the k-th ask at source k."""
    width = min(config.racing, len(config.sources()))
    return tuple(places.Place(k) for k in range(width))


@dataclass(frozen=True)
class Won:
    """The first racer to deliver the whole gang, and the others withdrawn."""

    winner: ProvisioningRequest
    followed: driver.InFlight
    """The winner as the driver followed it (its step FITS)."""
    losers: tuple[ProvisioningRequest, ...]
    withdrawal: driver.Withdrawal
    """The losers withdrawn, what arrived for them reclaimed (`driver.withdraw`)."""
    notes: tuple[driver.SourceNote, ...]
    """Each loser's source failed by RaceLost."""
    event: Event
    """CapacityRaceWon."""


@dataclass(frozen=True)
class Going:
    """A racer still in the running (waiting, or its rollback under way), or one rolled back
    whose Events are still to say (`message` None: it is no longer in the running)."""

    request: ProvisioningRequest
    message: str | None
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None


@dataclass(frozen=True)
class Ended:
    """A racer that could not deliver: withdrawn, and the place it gives to the next source
    not asked yet (the ask's number and place), if one is left. Or (`request` None) a racer
    gone without gangcheck withdrawing it (its request deleted outside gangcheck): only its
    place, given the same way (`VACANT`), its hold lifted by the race's flow
    (`flow.race_attempt`)."""

    request: ProvisioningRequest | None
    why: str
    actions: tuple[Action, ...]
    notes: tuple[driver.SourceNote, ...]
    replacement: tuple[int, places.Place] | None


@dataclass(frozen=True)
class Standing:
    """Where a race in flight stands: won, or its racers going and ended."""

    won: Won | None = None
    going: tuple[Going, ...] = ()
    ended: tuple[Ended, ...] = ()

    @property
    def last(self) -> str:
        """Why the last racer that ended could not deliver."""
        ended = [e for e in self.ended if e.request is not None]
        return ended[-1].why if ended else "no source left"


def follow(
    asked: Sequence[Ask],
    follow_one: FollowOne,
    *,
    config: AtomicProvisioningSpec,
    capacity: ClusterView | None,
    backend: CapacityBackend,
) -> Standing:
    """Each racer followed; the first that fits wins (the others withdrawn); each that ended
    is withdrawn and its place goes to the next source not asked yet (none past the most
    asks an attempt makes, `naming.MAX_ASKS`: `asks` would not find it); when none is left,
    the racers left are told every source was asked (`_told`). A race left with fewer racers
    than `raceWidth` (gangcheck withdraws one only with the ask in its place made first, or
    with no source left: a racer's request deleted outside gangcheck, or a source added to
    the list since the last was asked) gives each place missing to the next source not asked
    yet, after those of the racers that ended, as a racer that could not deliver does; none
    left, it goes on with the racers left."""
    live = [r for _, r in asked if not r.deleting]
    known = {r.name: sources_asked(r, k, config) for k, r in asked}
    raced = {i for s in known.values() for i in s}
    # each source raced was asked by an ask of its own: with the latest asks gone (withdrawn
    # with no place to give), the next is still not named as one of them
    next_ask = max(max((k for k, _ in asked), default=-1) + 1, len(raced))
    unasked = [s.index for s in config.sources() if s.index not in raced]
    others = len(live) > 1 or bool(unasked)
    followed = {r.name: follow_one(r, others) for r in live}
    for r in live:
        step = followed[r.name].step
        if step is not None and step.progress is Progress.FITS:
            return Standing(
                won=won(
                    r, followed[r.name], live, config=config, capacity=capacity, backend=backend
                )
            )
    going: list[Going] = []
    ended: list[tuple[ProvisioningRequest, str]] = []
    for r in live:
        f = followed[r.name]
        step = f.step
        if step is None or step.progress in (Progress.FAILED, Progress.EXPIRED, Progress.REVOKED):
            ended.append((r, step.message if step is not None else f.change or "config changed"))
        elif step.progress is Progress.ROLLED_BACK:
            assert step.verdict is not None
            ended.append((r, step.verdict.message))
            going.append(Going(r, None, events=step.events))
        else:
            where = named(config, r)
            going.append(
                Going(
                    r,
                    f"{where}: {step.message or 'rolling back'}",
                    (*f.upkeep, *step.actions),
                    step.events,
                    step.requeue_after,
                )
            )
    out = tuple(
        Ended(
            r,
            why,
            (*lifecycle.release_hold(capacity, r), *backend.withdraw(r, COULD_NOT)),
            driver.failed_note(config, r, rollback.record_of(r).reason or f"Failed: {why}"),
            (next_ask + i, _given(unasked[i], raced | set(unasked[:i])))
            if i < len(unasked) and next_ask + i < naming.MAX_ASKS
            else None,
        )
        for i, (r, why) in enumerate(ended)
    )
    # places missing from the race (racers gone by hand): given as an ended racer's are; a
    # racer being deleted holds its place until it is gone (withdrawn by gangcheck, its
    # replacement made first; or an earlier one under its name, after an eviction)
    width = min(config.racing, len(config.sources()))
    vacant = range(len(ended), min(len(unasked), len(ended) + width - len(asked)))
    refills = tuple(
        Ended(None, VACANT, (), (), (next_ask + i, _given(unasked[i], raced | set(unasked[:i]))))
        for i in vacant
        if next_ask + i < naming.MAX_ASKS
    )
    out += refills
    if out and not unasked:
        going = [_told(g, known[g.request.name], config) for g in going]
    return Standing(going=tuple(going), ended=out)


def _told(going: Going, known: set[int], config: AtomicProvisioningSpec) -> Going:
    """A racer left when another ended with no source of `config` (the config now) left to
    ask in its place: told that its race has asked every source of `config` (the config
    recorded whole, so a source added after the racer was made is named too), unless its
    record knows that much (`known`). Written before the other's request goes (the racers'
    actions come first), so what that request alone knew survives it and a restart."""
    every = {s.index for s in config.sources()}
    if going.message is None or every <= known:
        return going
    told = AnnotateRequest(going.request.name, {RACED_ALL_ANNOTATION: spec_record(config)})
    return replace(going, actions=(*going.actions, told))


def sources_asked(
    req: ProvisioningRequest, number: int, config: AtomicProvisioningSpec
) -> set[int]:
    """The sources of `config` (the config now) the race of `req` had asked when `req` was
    made, its own too: read by identity (`lifecycle.asked_source`), not by position, so an
    attempt follows the sources it asked whatever the list became (one that left is not
    among them). What the ask recorded (`places.Place.raced`, in the config it was made
    under), else, by the rules it was made under: the race started at the first `raceWidth`
    sources, and the `number`-th ask at source `number` after those. A record without a
    config is read by its index, as before. And every source of the config `req` was told of
    when another racer ended with none left to ask (`_told`)."""
    made = lifecycle.recorded_config(req) or config
    place = places.of_request(req)
    indexes = set(place.raced) or set(range(max(number + 1, made.racing)))
    told = req.annotations.get(RACED_ALL_ANNOTATION)
    then = recorded_spec(told)
    every = [s.index for s in then.sources()] if then is not None else []
    return {
        now
        for under, i in [
            *((None, i) for i in indexes | {place.source}),
            *((told, i) for i in every),
        ]
        if (now := lifecycle.asked_source(_asking(req, i, under), config).now) is not None
    }


def _asking(req: ProvisioningRequest, index: int, under: str | None = None) -> ProvisioningRequest:
    """`req`'s record as if it had asked source `index` of the config it records, or of the
    config recorded as `under`."""
    notes = {**req.annotations, SOURCE_ANNOTATION: str(index)}
    if under is not None:
        notes[ATTEMPT_CONFIG_ANNOTATION] = under
    return replace(req, annotations=notes)


def _given(index: int, raced: set[int]) -> places.Place:
    """The place a racer that could not deliver gives: source `index`, recording the sources
    the race has asked (its own too), so the next place follows from the record by identity
    even once the others' requests are gone."""
    return places.Place(index, raced=tuple(sorted(raced | {index})))


def won(
    winner: ProvisioningRequest,
    followed: driver.InFlight,
    live: Sequence[ProvisioningRequest],
    *,
    config: AtomicProvisioningSpec,
    capacity: ClusterView | None,
    backend: CapacityBackend,
) -> Won:
    """`winner` delivered the whole gang first: the other racers withdrawn, what arrived for
    them reclaimed by the safe path of a rollback, each counted as failed by RaceLost."""
    losers = tuple(r for r in live if r.name != winner.name)
    gone = withdraw_losers(losers, capacity=capacity, config=config, backend=backend)
    lost = tuple(
        note
        for r in losers
        for note in driver.failed_note(config, r, RollbackCause.RACE_LOST.value)
    )
    names = ", ".join(r.name for r in losers) or "none"
    event = Event(
        "CapacityRaceWon",
        f"{named(config, winner)} delivered the whole gang first "
        f"({winner.name}); withdrawing the others: {names}",
    )
    return Won(winner, followed, losers, gone, lost, event)


def withdraw_losers(
    losers: Sequence[ProvisioningRequest],
    *,
    capacity: ClusterView | None,
    config: AtomicProvisioningSpec | None,
    backend: CapacityBackend,
) -> driver.Withdrawal:
    """Racers that lost: withdrawn, what arrived for them reclaimed (driver.withdraw)."""
    return driver.withdraw(losers, capacity=capacity, config=config, backend=backend, why=LOST)


def left_behind(asked: Sequence[Ask], winner: str) -> list[ProvisioningRequest]:
    """Racers of an attempt whose gang was given the winner's capacity that are not withdrawn
    yet (the node cache was behind when the race was won)."""
    return [r for _, r in asked if r.name != winner and not r.deleting]


def named(config: AtomicProvisioningSpec, req: ProvisioningRequest) -> str:
    """How messages name the place a request asked (a racer, a source kept for a top-up):
    the source it asked (`lifecycle.asked_source`), at its index in the config now, not the
    source now at its recorded index; one that left the config by the name it asked with,
    saying so; and its domain. A request without a recorded config: by its index, as
    before."""
    asked = lifecycle.asked_source(req, config)
    place = places.of_request(req)
    if asked.source is None:  # no recorded config, its index gone: as before
        return place.describe(config)
    if asked.now is not None:
        return replace(place, source=asked.now).describe(config)
    where = f"capacity source {asked.name!r} (left the config)"
    if place.domain is None:
        return where
    return f"topology domain {place.domain[0]}={place.domain[1]} in {where}"


def racing(said: Sequence[str]) -> str:
    """The gang's one-line message while racers are in the running."""
    return f"racing: {'; '.join(said)}"


def every_source_failed(standing: Standing) -> str:
    return f"every capacity source failed: {standing.last}"
