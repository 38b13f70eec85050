"""The flow around an attempt (logic/attempt/flow.py), said once for both gang sources: what it
does over the facts an adapter gives (`flow.Gang`), whichever adapter it is. The tables in
test_topup.py, test_race_adapters.py, test_capacity_sources*.py run the same steps through
both adapters; here the flow is read on its own, with a stand-in adapter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from gangcheck.logic.attempt import deletion, flow, naming, places
from gangcheck.logic.attempt.actions import DeleteRequest, Event
from gangcheck.logic.attempt.backend import CapacityBackend
from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec
from gangcheck.logic.podgroups.podgroup import GroupDecision
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.logic.timefmt import format_time, parse_time
from gangcheck.logic.workloads.admission import Decision
from gangcheck.model.objects import ProvisioningRequest, request_of
from gangcheck.model.provisioning_config import AtomicProvisioningSpec, parse_spec
from tests.builders import T0, provisioning_request

NOW = parse_time(T0) or datetime.min

SOURCES: dict[str, object] = {
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a"}},
        {"name": "b", "nodeSelector": {"pool": "b"}},
    ],
    "fulfillment": {"reclaimer": "DeleteNode"},
}
TWO_SOURCES = parse_spec(SOURCES)


@dataclass(frozen=True)
class Said(flow.Decided):
    """A stand-in adapter's decision: what it wrote on its own state."""

    said: str = ""


@dataclass(frozen=True)
class Held:
    config: AtomicProvisioningSpec | None
    requests: tuple[ProvisioningRequest, ...] = ()
    capacity: ClusterView | None = None
    backend: CapacityBackend = PROVISIONING_REQUEST
    templates: frozenset[str] = frozenset()


@dataclass
class Stand:
    """A stand-in adapter: the asks it was told to make, and the attempts it ended."""

    made: list[tuple[str, flow.NewAsk]] = field(default_factory=list)
    ended: list[tuple[str, str]] = field(default_factory=list)
    saying: str = ""
    """What the gang's state says already (its `say` writes nothing when it says it)."""

    def gang(self, held: Held, attempt: int = 2, now: datetime = NOW) -> flow.Gang[Said]:
        def create(name: str, new: flow.NewAsk) -> Said:
            self.made.append((name, new))
            return Said(said=f"asked {name}")

        def ended(req: ProvisioningRequest, why: str) -> Said:
            self.ended.append((req.name, why))
            return Said(said=f"ended {req.name}")

        def say(message: str, event: Event) -> Said:
            return Said() if message == self.saying else Said(said=message, events=(event,))

        def pinned(labels: Mapping[str, str]) -> GangSpec:
            return GangSpec((("ps", 1, {"spec": {"nodeSelector": dict(labels)}}),))

        return flow.Gang(
            kind=Said,
            held=held,
            owner="job",
            namespace="default",
            short="check",
            attempt=attempt,
            gang_of=lambda index: pinned({"pool": "ab"[index]}),
            pinned=pinned,
            create=create,
            ended=ended,
            now=now,
            say=say,
        )


def _request(name: str, **annotations: str) -> ProvisioningRequest:
    return request_of(provisioning_request(name, templates=[("t", 1)], annotations=annotations))


def _deleted(decision: flow.Decided) -> list[tuple[str, str]]:
    return [(a.name, a.reason) for a in decision.actions if isinstance(a, DeleteRequest)]


def _name(attempt: int, ask: int = 0) -> str:
    return naming.request_name("job", "check", attempt, ask)


def test_both_adapters_decisions_carry_what_the_flow_writes() -> None:
    for kind in (Decision, GroupDecision):
        made = kind(actions=(), requeue_after=1.0)
        assert isinstance(made, flow.Decided)
        assert made.requeue_after == 1.0
        assert made.sources == ()
        assert made.step is None


def test_in_order_makes_the_first_ask_and_withdraws_an_earlier_attempts_request() -> None:
    stand = Stand()
    earlier = _request(_name(1))
    gang = stand.gang(Held(TWO_SOURCES, (earlier,)))
    out = flow.in_order(
        gang,
        first=lambda name: flow.first_ask(gang, name),
        in_flight=lambda req: Said(said="followed"),
        why="superseded by attempt 2",
    )
    assert stand.made == [(_name(2), flow.NewAsk(places.Place(0)))]
    assert out.said == f"asked {_name(2)}"
    assert _deleted(out) == [(earlier.name, "superseded by attempt 2")]


def test_in_order_follows_the_current_ask_and_waits_for_one_being_deleted() -> None:
    current = _request(_name(2, 1), **{"gangcheck.io/capacity-source": "1"})
    stand = Stand()
    followed = flow.in_order(
        stand.gang(Held(TWO_SOURCES, (current,))),
        first=lambda name: Said(said="first"),
        in_flight=lambda req: Said(said=f"following {req.name}"),
        why="superseded",
    )
    assert followed.said == f"following {current.name}"
    assert followed.actions == ()
    gone = replace_deleting(current)
    waiting = flow.in_order(
        stand.gang(Held(TWO_SOURCES, (gone,))),
        first=lambda name: Said(said="first"),
        in_flight=lambda req: Said(said="followed"),
        why="superseded",
    )
    assert waiting == Said(requeue_after=1.0)
    assert stand.made == []


def replace_deleting(
    req: ProvisioningRequest, since: datetime = NOW, finalizers: tuple[str, ...] = ()
) -> ProvisioningRequest:
    raw = provisioning_request(req.name, templates=[("t", 1)], annotations=dict(req.annotations))
    raw["metadata"]["deletionTimestamp"] = format_time(since)
    if finalizers:
        raw["metadata"]["finalizers"] = list(finalizers)
    return request_of(raw)


HELD = ("example.com/keep", "other.io/audit")
STUCK = f"finalizers [example.com/keep, other.io/audit] remain since {T0}"


@pytest.mark.parametrize(
    ("seconds", "finalizers", "saying", "said", "event", "poll"),
    [
        # within the grace: waited for every second, nothing said (a deletion is quick)
        (0, HELD, "", "", False, 1.0),
        (29, HELD, "", "", False, 1.0),
        # past it: said, naming the request and what holds it, a Warning once
        (
            30,
            HELD,
            "",
            f"waiting for ProvisioningRequest {{name}} to be deleted: {STUCK}",
            True,
            1.0,
        ),
        # said already: nothing written, no second Event; the poll doubles, up to 30 s
        (
            32,
            HELD,
            f"waiting for ProvisioningRequest {{name}} to be deleted: {STUCK}",
            "",
            False,
            2.0,
        ),
        (
            38,
            HELD,
            f"waiting for ProvisioningRequest {{name}} to be deleted: {STUCK}",
            "",
            False,
            8.0,
        ),
        (
            3600,
            HELD,
            f"waiting for ProvisioningRequest {{name}} to be deleted: {STUCK}",
            "",
            False,
            30.0,
        ),
        # no finalizer in the read (a read older than its removal): said as such
        (
            45,
            (),
            "",
            f"waiting for ProvisioningRequest {{name}} to be deleted: no finalizer left since {T0}",
            True,
            15.0,
        ),
    ],
)
def test_a_request_stuck_in_deletion_is_said_once_and_polled_less_often(
    *,
    seconds: int,
    finalizers: tuple[str, ...],
    saying: str,
    said: str,
    event: bool,
    poll: float,
) -> None:
    current = _request(_name(2))
    gone = replace_deleting(current, finalizers=finalizers)
    stand = Stand(saying=saying.format(name=current.name))
    out = flow.in_order(
        stand.gang(Held(TWO_SOURCES, (gone,)), now=NOW + timedelta(seconds=seconds)),
        first=lambda name: Said(said="first"),
        in_flight=lambda req: Said(said="followed"),
        why="superseded",
    )
    assert out.said == said.format(name=current.name)
    warned = [(e.reason, e.warning, e.message) for e in out.events]
    assert warned == ([(deletion.EVENT_REASON, True, out.said)] if event else [])
    assert out.requeue_after == poll
    assert out.actions == ()  # nothing asked, nothing deleted: another's finalizer is left
    assert stand.made == []


def test_a_place_that_could_not_deliver_gives_way_to_the_next_in_the_same_attempt() -> None:
    stand = Stand()
    first = _request(_name(2))
    gang = stand.gang(Held(TWO_SOURCES, (first,)))
    out = flow.fall_back(gang, first, "Failed: stocked out")
    assert out is not None
    [(name, new)] = stand.made
    assert name == _name(2, 1)
    assert new.place == places.Place(1)
    assert new.said.endswith("could not deliver (Failed: stocked out); ")
    # the new ask is made before the place left is withdrawn, and said last
    assert _deleted(out) == [(first.name, "capacity source 'a' (1 of 2) could not deliver")]
    assert isinstance(out.actions[-1], DeleteRequest)
    assert out.events[-1].reason == "CapacitySourceFailed"


def test_no_place_after_the_last_source() -> None:
    stand = Stand()
    last = _request(_name(2, 1), **{"gangcheck.io/capacity-source": "1"})
    gang = stand.gang(Held(TWO_SOURCES, (last,)))
    assert flow.fall_back(gang, last, "Failed: stocked out") is None
    assert stand.made == []


def test_a_race_starts_at_its_first_sources_and_withdraws_an_earlier_attempts_requests() -> None:
    race = parse_spec({**SOURCES, "capacitySourcePolicy": "Race"})
    stand = Stand()
    earlier = _request(_name(1))
    gang = stand.gang(Held(race, (earlier,)))

    def start() -> Said:
        made: list[Said] = flow.racers(gang)
        return flow.joined(Said(said="racing"), made)

    out = flow.race_attempt(gang, start=start, follow=lambda asks: Said(said="following"))
    assert [(n, a.place.source) for n, a in stand.made] == [(_name(2), 0), (_name(2, 1), 1)]
    assert out.said == "racing"
    assert _deleted(out) == [(earlier.name, "superseded by attempt 2")]


def test_a_race_whose_asks_are_all_stuck_in_deletion_names_those_past_the_grace() -> None:
    race = parse_spec({**SOURCES, "capacitySourcePolicy": "Race"})
    old = replace_deleting(_request(_name(2)), finalizers=HELD)
    young = replace_deleting(
        _request(_name(2, 1)), since=NOW + timedelta(seconds=50), finalizers=HELD
    )
    stand = Stand()
    gang = stand.gang(Held(race, (old, young)), now=NOW + timedelta(seconds=60))
    out = flow.race_attempt(
        gang, start=lambda: Said(said="start"), follow=lambda asks: Said(said="following")
    )
    assert out.said == f"waiting for ProvisioningRequest {old.name} to be deleted: {STUCK}"
    assert [e.reason for e in out.events] == [deletion.EVENT_REASON]
    assert out.requeue_after == 1.0  # the younger one is still in its grace
    assert stand.made == []
