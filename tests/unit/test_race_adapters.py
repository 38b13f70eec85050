"""capacitySourcePolicy Race through both adapters (issue 32): the same cases, run through a
Kueue Workload's check (admission.decide) and a PodGroup (podgroup.decide), must come to the
same race (logic/attempt/race.py): the same racers asked, the same winner, the same losers
withdrawn with their arrivals reclaimed, the same place given to the next source; each adapter
then writes it on its own state (the check entry; the group's annotations and members)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    Action,
    AnnotateRequest,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    Event,
    ReclaimArrivals,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.driver import SourceNote
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.hold import hold_taint, hold_toleration
from gangcheck.logic.podgroups.podgroup import GroupSnapshot
from gangcheck.logic.podgroups.podgroup import decide as decide_group
from gangcheck.logic.workloads.admission import Snapshot, decide
from gangcheck.model.names import CONSUME_ANNOTATION
from gangcheck.model.names import RACED_ALL_ANNOTATION as RACED_ALL
from gangcheck.model.names import RACED_ANNOTATION as RACED
from gangcheck.model.objects import pod_of, request_of, workload_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import parse_spec, spec_record
from tests.builders import CHECK, node, provisioning_request
from tests.unit.test_admission_decide import GPU_FLAVOR, NOW, gang
from tests.unit.test_podgroup_decide import group, members
from tests.unit.test_topup import in_flight

Obj = dict[str, Any]
RACE: Obj = {
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a"}},
        {"name": "b", "nodeSelector": {"pool": "b"}},
        {"name": "c", "nodeSelector": {"pool": "c"}},
    ],
    "capacitySourcePolicy": "Race",
    "fulfillment": {"reclaimer": "DeleteNode"},
    "retryStrategy": {"backoffLimitCount": 3},
}
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}'
ROLLED_BACK = {
    "gangcheck.io/phase": "RollingBack",
    "gangcheck.io/rollback-reason": "Failed: stocked out",
    "gangcheck.io/outcome": OUTCOME,
}


@dataclass(frozen=True)
class Racer:
    """A racer as a case states it: its ask (0: the first source), conditions, annotations."""

    ask: int
    conditions: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    """A node that arrived from a source's pool for the ask `ask`."""

    name: str
    pool: str
    ask: int
    gpu: int = 8
    held: bool = False
    """Carries the hold of the ask it arrived for (as recorded)."""


@dataclass(frozen=True)
class Seen:
    """What a decision came to, in words both adapters share."""

    state: str
    """asking, racing, won, retry"""
    created: list[str]
    sources_created: list[str]
    deleted: list[str]
    reclaimed: list[tuple[str, tuple[str, ...]]]
    consumed: str = ""
    pinned: dict[str, str] = field(default_factory=dict)
    tolerates: str = ""
    """The request whose hold the gang's members tolerate."""
    recorded_winner: str = ""
    events: frozenset[str] = frozenset()
    notes: frozenset[tuple[str, str, str]] = frozenset()
    message: str = ""
    """The gang's one-line message (the check's, the group's), when written."""
    records: dict[str, dict[str, str]] = field(default_factory=dict)
    """The annotations of each request created, by name."""
    annotated: dict[str, dict[str, str]] = field(default_factory=dict)
    """The annotations written on each request there, by name."""
    writes: list[tuple[str, str]] = field(default_factory=list)
    """The requests created, told what the race asked (RACED_ALL) and deleted, in order."""
    lifted: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """The holds lifted once the request they name is confirmed gone: (request, nodes)."""


def _kind_of(a: Action) -> str:
    return type(a).__name__


class Adapter:
    name: str
    ask: Callable[[int], str]

    def run(
        self,
        racers: list[Racer],
        nodes: list[Node],
        spec: Obj,
        *,
        ready: str = "",
        left: tuple[int, ...] = (),
    ) -> Seen:
        """`left`: the asks whose PodTemplates are left though their requests are gone."""
        raise NotImplementedError


def _request(adapter: Adapter, r: Racer, extra: dict[str, str], pod_set: str) -> Obj:
    name = adapter.ask(r.ask)
    notes = {"gangcheck.io/attempt": "1", **extra, **r.annotations}
    if r.ask:  # the k-th ask at source k, unless the case says where
        notes.setdefault("gangcheck.io/capacity-source", str(r.ask))
    req = provisioning_request(
        name,
        templates=[(naming.template_name(name, pod_set), 4)],
        annotations=notes,
        conditions={k: v for k, v in r.conditions.items() if k != "Provisioned"} or None,
    )
    if "Provisioned" in r.conditions:
        req["status"]["conditions"] = [
            {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": ""}
        ]
    return req


def _nodes(adapter: Adapter, nodes: list[Node]) -> list[Obj]:
    return [
        node(
            n.name,
            gpu=n.gpu,
            labels={"pool": n.pool},
            annotations={"gangcheck.io/arrived-for": f"default/{adapter.ask(n.ask)}"},
            taints=[hold_taint(f"default/{adapter.ask(n.ask)}")] if n.held else None,
        )
        for n in nodes
    ]


def _common(
    actions: tuple[Action, ...], events: tuple[Event, ...], notes: tuple[SourceNote, ...]
) -> dict[str, Any]:
    made = [a.body for a in actions if isinstance(a, CreateRequest)]
    templates = [a.body for a in actions if isinstance(a, CreateTemplate)]
    annotated: dict[str, dict[str, str]] = {}
    for a in actions:
        if isinstance(a, AnnotateRequest):
            annotated[a.name] = {**annotated.get(a.name, {}), **a.annotations}
    writes = [
        ("create", a.body["metadata"]["name"])
        if isinstance(a, CreateRequest)
        else ("tell", a.name)
        if isinstance(a, AnnotateRequest)
        else ("delete", a.name)
        for a in actions
        if isinstance(a, CreateRequest | DeleteRequest)
        or (isinstance(a, AnnotateRequest) and RACED_ALL in a.annotations)
    ]
    return {
        "annotated": annotated,
        "writes": writes,
        "created": [r["metadata"]["name"] for r in made],
        "records": {r["metadata"]["name"]: r["metadata"]["annotations"] for r in made},
        "sources_created": [t["template"]["spec"]["nodeSelector"]["pool"] for t in templates],
        "deleted": sorted(a.name for a in actions if isinstance(a, DeleteRequest)),
        "reclaimed": [(a.request, a.nodes) for a in actions if isinstance(a, ReclaimArrivals)],
        "lifted": [(a.gone, a.nodes) for a in actions if isinstance(a, ReleaseHold) and a.gone],
        "events": frozenset(e.reason for e in events),
        "notes": frozenset((n.source, n.outcome, n.reason) for n in notes),
    }


class Workloads(Adapter):
    name = "Workload"

    @staticmethod
    def ask(k: int) -> str:
        return naming.request_name("wl", CHECK, 1, k)

    def run(
        self,
        racers: list[Racer],
        nodes: list[Node],
        spec: Obj,
        *,
        ready: str = "",
        left: tuple[int, ...] = (),
        quota: bool = True,
    ) -> Seen:
        builder = gang(4)
        if not quota:  # taken back without eviction (Kueue: its LocalQueue stopped, deleted)
            builder.condition("QuotaReserved", "False", "Inadmissible")
        wl = builder.build()
        if ready:
            named = {CONSUME_ANNOTATION: ready} if ready.strip() else {}  # " ": none named
            wl["status"]["admissionChecks"][0].update(
                {
                    "state": "Ready",
                    "podSetUpdates": [{"name": "workers", "annotations": named}],
                }
            )
        requests = [_request(self, r, {}, "workers") for r in racers]
        snap = Snapshot(
            workload=workload_of(wl),
            check=CHECK,
            config=parse_spec(spec),
            flavors=GPU_FLAVOR,
            requests=tuple(request_of(r) for r in requests),
            templates=frozenset(
                p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
            )
            | {naming.template_name(self.ask(k), "workers") for k in left},
            capacity=ClusterView(
                nodes=tuple(_nodes(self, nodes)),
                in_flight=frozenset(f"default/{r['metadata']['name']}" for r in requests),
            ),
        )
        d = decide(snap, NOW)
        seen = _common((*d.actions, *d.after), d.events, d.sources)
        check = d.check
        state = check.state if check is not None else "Ready" if ready else ""
        words = {"Ready": "won", "Retry": "retry", "Pending": "racing"}.get(state, state)
        if words == "racing" and check is not None and not check.message.startswith("racing: "):
            words = "asking"
        consumed, pinned, tolerates = "", {}, ""
        if check is not None and check.state == "Ready":
            update = check.pod_set_updates[0]
            consumed = update["annotations"][CONSUME_ANNOTATION]
            pinned = dict(update.get("nodeSelector") or {})
            tolerates = _tolerated(update.get("tolerations") or [])
        message = check.message if check is not None else ""
        return Seen(
            words, consumed=consumed, pinned=pinned, tolerates=tolerates, message=message, **seen
        )


class PodGroups(Adapter):
    name = "PodGroup"

    @staticmethod
    def ask(k: int) -> str:
        return naming.request_name("g", "pg", 1, k)

    def run(
        self,
        racers: list[Racer],
        nodes: list[Node],
        spec: Obj,
        *,
        ready: str = "",
        left: tuple[int, ...] = (),
    ) -> Seen:
        notes = {"gangcheck.io/state": "Released", "gangcheck.io/request": ready} if ready else {}
        pods = members(4, gated=not ready)
        extra = {
            "gangcheck.io/pod-group": "pg/g",
            "gangcheck.io/pod-group-uid": "uid-g",
            "gangcheck.io/gang-members": "4",
        }
        requests = [_request(self, r, extra, "ps-0") for r in racers]
        if ready:  # the winner records the race it was made under
            for r in requests:
                r["metadata"]["annotations"]["gangcheck.io/attempt-config"] = (
                    '{"capacitySourcePolicy": "Race", "capacitySources": '
                    '[{"name": "a", "nodeSelector": {"pool": "a"}}, '
                    '{"name": "b", "nodeSelector": {"pool": "b"}}]}'
                )
        snap = in_flight(group(4, annotations=notes), pods, spec, requests, _nodes(self, nodes))
        left_over = {naming.template_name(self.ask(k), "ps-0") for k in left}
        snap = replace(snap, templates=snap.templates | left_over)
        d = decide_group(snap, NOW)
        seen = _common((*d.actions, *d.after), d.events, d.sources)
        status = d.status or {}
        state = status.get("gangcheck.io/state", "Released" if ready else "")
        message = status.get("gangcheck.io/message", "")
        words = {"Released": "won", "BackingOff": "retry", "Provisioning": "racing"}.get(
            state, state
        )
        if words == "racing" and not message.startswith("racing: "):
            words = "asking"
        released = [a for a in d.actions if isinstance(a, ReleaseMembers)]
        consumed, pinned, tolerates = "", {}, ""
        if released:
            consumed = released[0].annotations.get(CONSUME_ANNOTATION, "")
            pinned = dict(released[0].node_selector)
            tolerates = _tolerated(released[0].tolerations)
        return Seen(
            words,
            consumed=consumed,
            pinned=pinned,
            tolerates=tolerates,
            recorded_winner=status.get("gangcheck.io/race-won-by", ""),
            message=message,
            **seen,
        )


def _tolerated(tolerations: Any) -> str:
    """The request whose hold these tolerations let the members onto."""
    for k in range(3):
        for adapter in (Workloads, PodGroups):
            name = adapter.ask(k)
            if hold_toleration(f"default/{name}") in list(tolerations):
                return name
    return ""


ADAPTERS = [Workloads(), PodGroups()]


@dataclass(frozen=True)
class Case:
    id: str
    racers: list[Racer]
    nodes: list[Node] = field(default_factory=list)
    spec: Obj = field(default_factory=lambda: RACE)
    ready: int | None = None
    """The gang already runs on this ask's capacity (Ready; Released)."""
    # expectations, by ask number
    state: str = "racing"
    created: list[int] = field(default_factory=list)
    sources_created: list[str] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    deleted_by: dict[str, list[int]] = field(default_factory=dict)
    """Where the adapters differ: the requests one of them deletes in this decision."""
    reclaimed: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    consumed: int | None = None
    pinned: dict[str, str] = field(default_factory=dict)
    events: set[str] = field(default_factory=set)
    notes: set[tuple[str, str, str]] = field(default_factory=set)


CASES = [
    Case(
        "the first raceWidth sources are asked at once, each pinned to its nodes",
        racers=[],
        created=[0, 1],
        sources_created=["a", "b"],
        notes={("a", "asked", ""), ("b", "asked", "")},
    ),
    Case(
        "the first to deliver wins; the loser is withdrawn and what arrived for it reclaimed",
        racers=[Racer(0, {"Accepted": "ok"}), Racer(1, {"Provisioned": "ok"})],
        nodes=[*(Node(f"b{i}", "b", 1) for i in range(4)), Node("a0", "a", 0)],
        state="won",
        deleted=[0],
        reclaimed=[(0, ("a0",))],
        consumed=1,
        pinned={"pool": "b"},
        events={"CapacityRaceWon", "ReclaimingArrivals"},
        notes={("a", "failed", "RaceLost"), ("b", "delivered", "")},
    ),
    Case(
        "a racer that delivered part of the gang only does not win",
        racers=[Racer(0, {"Provisioned": "ok"}), Racer(1, {"Accepted": "ok"})],
        nodes=[Node("a0", "a", 0, gpu=1)],
        state="racing",
    ),
    Case(
        "a failed racer is withdrawn and its place goes to the next source",
        racers=[Racer(0, annotations=ROLLED_BACK), Racer(1, {"Accepted": "ok"})],
        created=[2],
        sources_created=["c"],
        deleted=[0],
        events={"RolledBack"},
        notes={("a", "failed", "Failed"), ("c", "asked", "")},
    ),
    Case(
        "a source asked earlier in the attempt is not asked again once its request is gone",
        racers=[Racer(1, annotations=ROLLED_BACK), Racer(2, {"Accepted": "ok"})],
        deleted=[1],
        events={"RolledBack"},
        notes={("b", "failed", "Failed")},
    ),
    Case(
        "every racer failed and no source is left: the next attempt",
        racers=[
            Racer(0, annotations=ROLLED_BACK),
            Racer(1, annotations=ROLLED_BACK),
            Racer(2, annotations=ROLLED_BACK),
        ],
        state="retry",
        # A Workload's check withdraws them with the Retry; a group writes only its next
        # attempt first, and its racers go as superseded by it (never a gap in which a
        # restart would make the same attempt again).
        deleted_by={"Workload": [0, 1, 2], "PodGroup": []},
        events={"RolledBack"},
        notes={("a", "failed", "Failed"), ("b", "failed", "Failed"), ("c", "failed", "Failed")},
    ),
    Case(
        "a loser left behind when the gang got the winner's capacity is withdrawn after",
        racers=[Racer(0), Racer(1, {"Provisioned": "ok"})],
        ready=1,
        state="won",
        deleted=[0],
    ),
]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_same_race_through_both_adapters(case: Case, adapter: Adapter) -> None:
    ready = adapter.ask(case.ready) if case.ready is not None else ""
    seen = adapter.run(case.racers, case.nodes, case.spec, ready=ready)
    assert seen.state == case.state
    assert seen.created == [adapter.ask(k) for k in case.created]
    assert seen.sources_created == case.sources_created
    deleted = case.deleted_by.get(adapter.name, case.deleted)
    assert seen.deleted == sorted(adapter.ask(k) for k in deleted)
    assert seen.reclaimed == [(adapter.ask(k), nodes) for k, nodes in case.reclaimed]
    if case.consumed is not None and case.ready is None:
        winner = adapter.ask(case.consumed)
        assert seen.consumed == winner
        assert seen.tolerates == winner
        assert seen.pinned == case.pinned
        if isinstance(adapter, PodGroups):
            assert seen.recorded_winner == "b"
    assert case.events <= seen.events
    assert seen.notes == case.notes


def test_a_ready_workload_whose_quota_is_taken_back_still_withdraws_the_losers() -> None:
    """Kueue takes a Ready gang's quota back without evicting it (its LocalQueue stopped):
    the attempt it consumes is kept for when quota comes back, but a racer that lost to it
    is not the gang's, quota or not: withdrawn now, what arrived for it reclaimed."""
    adapter = Workloads()
    racers = [Racer(0, {"Accepted": "ok"}), Racer(1, {"Provisioned": "ok"})]
    nodes = [*(Node(f"b{i}", "b", 1) for i in range(4)), Node("a0", "a", 0)]
    seen = adapter.run(racers, nodes, RACE, ready=adapter.ask(1), quota=False)
    assert seen.deleted == [adapter.ask(0)]
    assert seen.reclaimed == [(adapter.ask(0), ("a0",))]
    assert seen.message == ""  # the Ready check is left as it is
    kept = adapter.run([racers[1]], nodes[:4], RACE, ready=adapter.ask(1), quota=False)
    assert kept.deleted == [] and kept.reclaimed == []  # the winner alone: nothing to do
    # a Ready check naming no consumed request (a slice's: its podSetUpdates keep only what
    # agrees with the Job's template, its attempts numbered its own way): nothing guessed
    unnamed = adapter.run(racers, nodes, RACE, ready=" ", quota=False)
    assert unnamed.deleted == [] and unnamed.reclaimed == []


def test_a_pod_group_racing_again_withdraws_the_racers_of_the_attempt_before() -> None:
    """After every source failed, the group's next attempt is on it first; the racers of the
    attempt before then go as superseded, and the next race starts after the backoff."""
    pods = members(4)
    extra = {"gangcheck.io/pod-group": "pg/g", "gangcheck.io/pod-group-uid": "uid-g"}
    old = [_request(PodGroups(), Racer(k, annotations=ROLLED_BACK), extra, "ps-0") for k in (0, 1)]
    notes = {
        "gangcheck.io/state": "BackingOff",
        "gangcheck.io/attempt": "2",
        "gangcheck.io/next-attempt-at": "2026-11-30T10:04:00Z",
    }
    snap = GroupSnapshot(
        group=pod_group_of(group(4, annotations=notes)),
        members=tuple(map(pod_of, pods)),
        config=parse_spec(RACE),
        requests=tuple(request_of(r) for r in old),
        capacity=ClusterView(pods=tuple(pods)),
    )
    d = decide_group(snap, NOW)
    assert sorted(a.name for a in d.actions if isinstance(a, DeleteRequest)) == [
        "g-pg-1",
        "g-pg-1-s1",
    ]
    made = [a.body["metadata"]["name"] for a in d.actions if isinstance(a, CreateRequest)]
    assert made == ["g-pg-2", "g-pg-2-s1"]
    assert d.status is not None and d.status["gangcheck.io/message"].startswith("racing: ")


def test_a_pod_group_race_is_said_once_and_each_ask_in_its_own_event() -> None:
    pods = members(4)
    snap = GroupSnapshot(
        group=pod_group_of(group(4)),
        members=tuple(map(pod_of, pods)),
        config=parse_spec(RACE),
        capacity=ClusterView(pods=tuple(pods)),
    )
    d = decide_group(snap, NOW)
    reasons = [e.reason for e in d.events]
    assert reasons.count("Provisioning") == 1
    assert reasons.count("ProvisioningRequestCreated") == 2
    assert d.status is not None and d.status["gangcheck.io/message"].startswith("racing: ")


def test_a_pod_group_started_over_forgets_the_winner_of_its_earlier_race() -> None:
    pods = members(4)
    snap = GroupSnapshot(
        group=pod_group_of(group(4, annotations={"gangcheck.io/race-won-by": "b"})),
        members=tuple(map(pod_of, pods)),
        config=parse_spec(RACE),
        capacity=ClusterView(pods=tuple(pods)),
    )
    d = decide_group(snap, NOW)
    assert d.status is not None and d.status["gangcheck.io/race-won-by"] == ""


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_racers_whose_sources_moved_are_named_as_the_sources_they_asked(
    adapter: Adapter,
) -> None:
    """Racing a and b of [a, b, c], both Provisioned; then a source x is put first ([x, a, b,
    c]): the race goes on, its message naming a (2 of 4) and b (3 of 4), the sources the
    racers asked. Before, it named the sources now at their recorded indexes: x and a."""
    made = {"gangcheck.io/attempt-config": spec_record(parse_spec(RACE))}
    x = {"name": "x", "nodeSelector": {"pool": "x"}}
    now = {**RACE, "capacitySources": [x, *RACE["capacitySources"]]}
    racers = [Racer(0, {"Provisioned": "ok"}, made), Racer(1, {"Provisioned": "ok"}, made)]
    seen = adapter.run(racers, [], now)
    assert seen.state == "racing", seen
    assert "capacity source 'a' (2 of 4): " in seen.message
    assert "capacity source 'b' (3 of 4): " in seen.message
    assert "'x'" not in seen.message


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_a_racer_whose_source_left_is_named_by_the_source_it_asked(adapter: Adapter) -> None:
    """Racing a and b of [a, b, c], both Provisioned; then b is removed ([a, c]): b's racer
    is named as it asked ('b', left the config), not as c, now at its index."""
    made = {"gangcheck.io/attempt-config": spec_record(parse_spec(RACE))}
    now = {**RACE, "capacitySources": [RACE["capacitySources"][i] for i in (0, 2)]}
    racers = [Racer(0, {"Provisioned": "ok"}, made), Racer(1, {"Provisioned": "ok"}, made)]
    seen = adapter.run(racers, [], now)
    assert seen.state == "racing", seen
    assert "capacity source 'b' (left the config): " in seen.message
    assert "'c'" not in seen.message


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_a_race_in_flight_when_the_policy_turns_in_order_is_finished_as_a_race(
    adapter: Adapter,
) -> None:
    """capacitySourcePolicy edited from Race to InOrder while the race runs (both racers made
    under the Race config they record): b delivers the whole gang and wins as in any race;
    a, still waiting with a node that arrived for it, is withdrawn with it reclaimed. Before,
    the attempt was followed as InOrder: a was deleted as superseded (by its own attempt) and
    the node that arrived for it was left, not reclaimed."""
    made = {"gangcheck.io/attempt-config": spec_record(parse_spec(RACE))}
    in_order = {k: v for k, v in RACE.items() if k != "capacitySourcePolicy"}
    racers = [Racer(0, {"Accepted": "ok"}, made), Racer(1, {"Provisioned": "ok"}, made)]
    nodes = [*(Node(f"b{i}", "b", 1) for i in range(4)), Node("a0", "a", 0)]
    seen = adapter.run(racers, nodes, in_order)
    assert seen.state == "won", seen
    assert seen.consumed == adapter.ask(1)
    assert seen.reclaimed == [(adapter.ask(0), ("a0",))]
    assert "CapacityRaceWon" in seen.events


# ---- the race's hand-over follows the sources asked by identity, not by position ---------

X = {"name": "x", "nodeSelector": {"pool": "x"}}
Y = {"name": "y", "nodeSelector": {"pool": "y"}}
A, B, C = RACE["capacitySources"]


def _under(sources: list[Obj]) -> dict[str, str]:
    """The record of an ask made under a race of `sources`."""
    return {
        "gangcheck.io/attempt-config": spec_record(parse_spec({**RACE, "capacitySources": sources}))
    }


@dataclass(frozen=True)
class Relisted:
    id: str
    racers: list[Racer]
    """The asks still there (the others withdrawn and gone)."""
    now: list[Obj]
    """The config's sources now."""
    # expectations: the ask made for the place given up (its number, its pool, the sources
    # it records the race has asked with it, in the config now), or none: the attempt ends
    created: tuple[int, str, str] | None
    also: tuple[int, str] | None = None
    """The ask made for a place missing from the race (fewer racers than raceWidth: the
    others gone with no source left then), if a source is left for it."""


FAILED = {**ROLLED_BACK}
AT_X = {"gangcheck.io/capacity-source": "0"}
RELISTED = [
    Relisted(
        "[a, b] raced, a gave up (gone), x put first: b's place goes to x",
        [Racer(1, annotations={**FAILED, **_under([A, B])})],
        [X, A, B],
        (2, "x", "0,1,2"),
    ),
    Relisted(
        "[a, b] raced, a gave up (gone), a replaced by x ([x, b]): b's place goes to x",
        [Racer(1, annotations={**FAILED, **_under([A, B])})],
        [X, B],
        (2, "x", "0,1"),
    ),
    Relisted(
        "[a, b, c] raced a and b, x put first, a fails, b kept: a's place goes to x",
        [
            Racer(0, annotations={**FAILED, **_under([A, B, C])}),
            Racer(1, {"Provisioned": "ok"}, _under([A, B, C])),
        ],
        [X, A, B, C],
        (2, "x", "0,1,2"),
    ),
    Relisted(
        "a and b gave up (gone), c asked for a; b moved below c ([x, y, c, b]): x, not b",
        [Racer(2, annotations={**FAILED, **_under([A, B, C])})],
        [X, Y, C, B],
        (3, "x", "0,2,3"),
        also=(4, "y"),  # b gone with no source left then: its place, with y added, to y
    ),
    Relisted(
        "x asked for a and b (recorded), gone; x fails under [x, y, a, b]: y, not b again",
        [Racer(2, annotations={**FAILED, **_under([X, Y, A, B]), **AT_X, RACED: "0,2,3"})],
        [X, Y, A, B],
        (3, "y", "0,1,2,3"),
    ),
    Relisted(
        "[a, b] raced, a gave up (gone), nothing new: the attempt ends",
        [Racer(1, annotations={**FAILED, **_under([A, B])})],
        [A, B],
        None,
    ),
]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", RELISTED, ids=lambda c: c.id)
def test_a_race_gives_a_place_to_a_source_it_has_not_asked_by_identity(
    case: Relisted, adapter: Adapter
) -> None:
    """A racer that could not deliver gives its place to the first source of the config now
    that the attempt has not asked, the sources asked read by identity (the asks there,
    each with the sources the race had asked when it was made), not by position. Before,
    a source below the next ask's number was taken as asked and one at or above it as not:
    with the list edited, x was skipped (the attempt ended) or b, asked and given up, was
    asked again."""
    seen = adapter.run(case.racers, [], {**RACE, "capacitySources": case.now})
    if case.created is None:
        assert seen.state == "retry", seen
        assert seen.created == []
        return
    number, pool, raced = case.created
    also = [case.also] if case.also is not None else []
    assert seen.created == [adapter.ask(number), *(adapter.ask(n) for n, _ in also)], seen
    assert seen.sources_created == [pool, *(p for _, p in also)]
    assert seen.records[adapter.ask(number)].get(RACED) == raced


# ---- what a racer withdrawn with no place to give knew is kept on the racers left ---------


@dataclass(frozen=True)
class Remembered:
    id: str
    racers: list[Racer]
    """The asks there: one ends with no source of the config now left unasked."""
    now: list[Obj]
    withdrawn: int
    remembers: list[int]
    """The racers left that are told the race had asked every source of the config now."""
    then: list[Obj]
    """The config's sources when the racers left fail too."""
    created: tuple[int, str] | None
    """The ask then made in their place (its number, its source's pool), or none: the
    attempt ends."""


UNDER_ABC = _under([A, B, C])
RACED_FOR_A = {**_under([A, B, C]), RACED: "0,1,2"}
X_FOR_A = {**_under([X, A, B]), **AT_X, RACED: "0,1,2"}
REMEMBERED = [
    Remembered(
        "[a, b, c] width 2: a gone, c asked for it fails: b told; b fails: c not asked again",
        [Racer(1, {"Accepted": "ok"}, UNDER_ABC), Racer(2, annotations={**FAILED, **RACED_FOR_A})],
        [A, B, C],
        withdrawn=2,
        remembers=[1],
        then=[A, B, C],
        created=None,
    ),
    Remembered(
        "[a, b] raced, x put first, asked for a, fails: b (made under [a, b]) told of x",
        [Racer(1, {"Accepted": "ok"}, _under([A, B])), Racer(2, annotations={**FAILED, **X_FOR_A})],
        [X, A, B],
        withdrawn=2,
        remembers=[1],
        then=[X, A, B],
        created=None,
    ),
    Remembered(
        "as above, then y added: b's place goes to y, the one source not asked, a 4th ask",
        [Racer(1, {"Accepted": "ok"}, _under([A, B])), Racer(2, annotations={**FAILED, **X_FOR_A})],
        [X, A, B],
        withdrawn=2,
        remembers=[1],
        then=[X, A, B, Y],
        created=(3, "y"),
    ),
    Remembered(
        "[a, b, c]: b fails, c (asked for a, its record knows a, b, c) is told nothing",
        [Racer(1, annotations={**FAILED, **UNDER_ABC}), Racer(2, {"Accepted": "ok"}, RACED_FOR_A)],
        [A, B, C],
        withdrawn=1,
        remembers=[],
        then=[A, B, C],
        created=None,
    ),
]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
@pytest.mark.parametrize("case", REMEMBERED, ids=lambda c: c.id)
def test_a_racer_withdrawn_with_no_place_to_give_is_not_forgotten(
    case: Remembered, adapter: Adapter
) -> None:
    """A racer that could not deliver when no source is left unasked is withdrawn, its place
    given to none; the racers left whose records do not know every source were asked are
    told (gangcheck.io/sources-raced-all: the config then, every source of it asked), before
    the withdrawn racer's request goes. When they fail too, the attempt ends: a source is not
    asked twice. Before, only the withdrawn request knew it had been asked (c, or x put first
    later), and once it was gone the last racer's failure asked it again."""
    seen = adapter.run(case.racers, [], {**RACE, "capacitySources": case.now})
    assert seen.state == "racing", seen
    assert seen.created == []
    assert seen.deleted == [adapter.ask(case.withdrawn)]
    told = [("tell", adapter.ask(k)) for k in case.remembers]
    assert seen.writes == [*told, ("delete", adapter.ask(case.withdrawn))], seen
    for k in case.remembers:  # the config now, every source of which was asked
        now = parse_spec({**RACE, "capacitySources": case.now})
        assert seen.annotated[adapter.ask(k)][RACED_ALL] == spec_record(now)
    # the racers left fail in turn, the withdrawn request gone
    left = [
        Racer(
            r.ask,
            annotations={
                **r.annotations,
                **FAILED,
                **seen.annotated.get(adapter.ask(r.ask), {}),
            },
        )
        for r in case.racers
        if r.ask != case.withdrawn
    ]
    after = adapter.run(left, [], {**RACE, "capacitySources": case.then})
    if case.created is None:
        assert after.state == "retry", after
        assert after.created == []
    else:  # not named as x's ask, withdrawn: one name never stands for two asks
        number, pool = case.created
        assert after.created == [adapter.ask(number)], after
        assert after.sources_created == [pool]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_the_ask_in_a_withdrawn_racers_place_is_made_before_it_goes(adapter: Adapter) -> None:
    """The ask in a racer's place records what the race had asked; made after the racer was
    withdrawn, a restart between the two would lose both."""
    racers = [
        Racer(0, annotations={**FAILED, **UNDER_ABC}),
        Racer(1, {"Accepted": "ok"}, UNDER_ABC),
    ]
    seen = adapter.run(racers, [], RACE)
    assert seen.writes == [("create", adapter.ask(2)), ("delete", adapter.ask(0))], seen


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_no_place_is_given_past_the_most_asks_an_attempt_makes(adapter: Adapter) -> None:
    """The 32nd ask of an attempt (a list edited mid-race again and again) fails while c is
    not asked: its place goes to none, as InOrder's (an ask numbered 32 is no ask `asks`
    finds: the next pass would withdraw it as an earlier attempt's); the racer left goes on,
    not told c was asked."""
    at = {"gangcheck.io/capacity-source": "0", RACED: "0,1", **UNDER_ABC}
    racers = [
        Racer(naming.MAX_ASKS - 2, {"Accepted": "ok"}, at),
        Racer(
            naming.MAX_ASKS - 1, annotations={**FAILED, **at, "gangcheck.io/capacity-source": "1"}
        ),
    ]
    seen = adapter.run(racers, [], RACE)
    assert seen.state == "racing", seen
    assert seen.created == []
    assert seen.deleted == [adapter.ask(naming.MAX_ASKS - 1)]
    # c was not asked: the racer left is not told it was
    assert not any(RACED_ALL in notes for notes in seen.annotated.values())


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
@pytest.mark.parametrize("won", [False, True], ids=["racing", "won"])
def test_a_racer_deleted_by_hand_has_the_hold_it_left_lifted(adapter: Adapter, won: bool) -> None:
    """A racer's request is deleted outside gangcheck after a node arrived for it: the race
    goes on, its place given to the next source not asked yet (c, RacerReplaced), and the
    node, recorded and held for a request that is gone, is held by nothing that would ever
    lift it (no record of the racer is left to roll back or withdraw): its hold is lifted
    (once the API server confirms the request gone) and said, the node not reclaimed (no
    record proves it younger than a request), while the race goes on or when another racer
    wins. Before, it stayed closed to every pod for ever, nothing said."""
    delivered = {"Provisioned": "ok"} if won else {"Accepted": "ok"}
    nodes = [Node("a0", "a", 0, held=True), *(Node(f"b{i}", "b", 1) for i in range(4) if won)]
    seen = adapter.run([Racer(1, delivered)], nodes, RACE)
    assert seen.state == ("won" if won else "racing")
    assert seen.lifted == [(adapter.ask(0), ("a0",))]
    assert "HoldLifted" in seen.events
    assert seen.reclaimed == [] and seen.deleted == []
    assert seen.created == ([] if won else [adapter.ask(2)])
    assert ("RacerReplaced" in seen.events) is not won
    gone = adapter.run([Racer(1, delivered)], [Node("a0", "a", 0), *nodes[1:]], RACE)
    assert gone.lifted == [] and "HoldLifted" not in gone.events  # no hold left: nothing


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
@pytest.mark.parametrize("sources", [3, 2], ids=["c after b", "b the last"])
def test_in_order_a_later_ask_deleted_by_hand_is_asked_again_where_the_attempt_was(
    adapter: Adapter, sources: int
) -> None:
    """InOrder, source a failed and was withdrawn (its request and templates with it), the
    ask of source b deleted outside gangcheck (its PodTemplates left): no ask of the attempt
    is left. Before, it was asked again from a, which had stocked out in this very attempt,
    under a's name. Now it is asked again at b, under b's ask's name, the message saying so;
    the node held for it is counted by it (not lifted)."""
    in_order = {
        **RACE,
        "capacitySourcePolicy": "InOrder",
        "capacitySources": RACE["capacitySources"][:sources],
    }
    seen = adapter.run([], [Node("b0", "b", 1, gpu=1, held=True)], in_order, left=(1,))
    assert seen.created == [adapter.ask(1)], seen
    assert seen.records[adapter.ask(1)].get("gangcheck.io/capacity-source") == "1"
    assert seen.lifted == [] and "HoldLifted" not in seen.events
    assert "deleted outside gangcheck" in seen.message, seen.message


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_in_order_an_ask_deleted_by_hand_leaves_no_hold_but_its_own_names(
    adapter: Adapter,
) -> None:
    """InOrder, the ask of a later source (after the first failed and was withdrawn) deleted
    outside gangcheck after a node arrived for it: no ask of the attempt is left, so the
    attempt asks again from its first (as a request deleted by hand is asked again under its
    name). The node held for the deleted ask is held by nothing that would lift it: its hold
    is lifted and said. A node held for the ask made again now is not: the ask made again
    under its name counts it as before."""
    in_order = {**RACE, "capacitySourcePolicy": "InOrder"}
    seen = adapter.run([], [Node("b0", "b", 1, gpu=1, held=True)], in_order)
    assert seen.created == [adapter.ask(0)]
    assert seen.lifted == [(adapter.ask(1), ("b0",))]
    assert "HoldLifted" in seen.events
    again = adapter.run([], [Node("a0", "a", 0, gpu=1, held=True)], in_order)
    assert again.created == [adapter.ask(0)]
    assert again.lifted == [] and "HoldLifted" not in again.events
