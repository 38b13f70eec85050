"""Rounds: a gang every worker has failed for waits, then is tried in every worker again
(``decide`` with ``RoundWait``). Before, such a gang waited for good, holding its quota in
the manager, though a stockout is seldom for good."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from gangcheck.logic.dispatch import (
    DispatchRecord,
    RoundWait,
    WorkerFacts,
    decide,
    describe,
)

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def spent(*, round_: int = 1, a: float | None = 70.0, b: float | None = 65.0) -> DispatchRecord:
    """Both workers given up for the gang, ``a`` and ``b`` seconds ago (None: no time)."""
    failed_at = {c: stamp(t) for c, t in (("a", a), ("b", b)) if t is not None}
    return DispatchRecord(
        tried=("a", "b"),
        failed={"a": "CapacityIsNotFound", "b": "check gpu Retry: no room"},
        failed_at=failed_at,
        reason="no worker left to try (tried and failed: a, b)",
        round=round_,
    )


@dataclass(frozen=True)
class Case:
    record: DispatchRecord
    workers: tuple[WorkerFacts, ...]
    nominated: tuple[str, ...]
    round_: int
    reason: str


AB = (WorkerFacts("a"), WorkerFacts("b"))
CASES = {
    "round 1 over 65 s ago, the wait 60 s: round 2, by rank (a by name)": Case(
        spent(), AB, ("a",), 2, "round 2, every worker having failed in round 1: "
    ),
    "round 2: the gang fits now in b, b first": Case(
        spent(), (WorkerFacts("a"), WorkerFacts("b", fits_now=True)), ("b",), 2, "fits now in b"
    ),
    "the last given up 30 s ago: waits, said until when": Case(
        spent(b=30.0),
        AB,
        (),
        1,
        "no worker left to try (tried and failed: a, b); round 2 at " + stamp(-30.0),
    ),
    "round 2 over 65 s ago: the wait is 120 s now": Case(
        spent(round_=2), AB, (), 2, "; round 3 at " + stamp(-55.0)
    ),
    "round 2 over 125 s ago: round 3": Case(
        spent(round_=2, a=130.0, b=125.0), AB, ("a",), 3, "round 3, every worker having"
    ),
    "round 30: the wait is at most 1800 s": Case(
        spent(round_=30, a=1900.0, b=1799.0), AB, (), 30, "; round 31 at " + stamp(-1.0)
    ),
    "no time recorded (an older record): stamped now, the wait from now": Case(
        spent(a=None, b=None), AB, (), 1, "; round 2 at " + stamp(-60.0)
    ),
    "b unreachable, a failed: a round for a (b tried once it answers)": Case(
        spent(),
        (WorkerFacts("a"), WorkerFacts("b", reachable=False, skip="no answer")),
        ("a",),
        2,
        "round 2",
    ),
    "every worker unreachable: no round, nothing to try": Case(
        spent(),
        (
            WorkerFacts("a", reachable=False, skip="no answer"),
            WorkerFacts("b", reachable=False, skip="no answer"),
        ),
        (),
        1,
        "no worker left to try (unreachable: a, b)",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rounds(case: Case) -> None:
    step = decide(case.record, case.workers, now=NOW, rounds=RoundWait(60.0, 1800.0))
    assert step.nominated == case.nominated
    assert step.record.round == case.round_
    assert case.reason in step.record.reason, step.record.reason
    if case.round_ > case.record.round:  # a new round: every worker a candidate again
        assert step.record.failed == {}
        assert step.newly_nominated == case.nominated
        assert step.record.failed_at == case.record.failed_at  # kept, for other gangs' ranks
    else:
        assert step.record.failed == case.record.failed
    again = DispatchRecord.from_annotation(step.record.to_annotation())
    assert again == step.record
    # the step after it, nothing changed and no time passed, writes nothing and tells nothing
    later = decide(step.record, case.workers, now=NOW, rounds=RoundWait(60.0, 1800.0))
    assert later.record == step.record and not later.changed


def test_a_worker_failing_again_in_the_new_round_ends_it_and_doubles_the_wait() -> None:
    step = decide(spent(), AB, now=NOW, rounds=RoundWait(60.0, 1800.0))
    assert step.nominated == ("a",) and step.record.round == 2
    then = NOW + timedelta(seconds=5)
    failed = decide(
        step.record,
        (WorkerFacts("a", failure="CapacityIsNotFound"), WorkerFacts("b")),
        now=then,
        rounds=RoundWait(60.0, 1800.0),
    )
    assert failed.nominated == ("b",) and failed.fallbacks == {"a": "CapacityIsNotFound"}
    # each choice of round 2 says so: its words differ from round 1's same choice (an Event
    # of the same words within minutes is counted, not sent again)
    assert failed.record.reason.startswith("round 2: given up: a (CapacityIsNotFound); ")
    last = NOW + timedelta(seconds=9)
    over = decide(
        failed.record,
        (WorkerFacts("a"), WorkerFacts("b", failure="CapacityIsNotFound")),
        now=last,
        rounds=RoundWait(60.0, 1800.0),
    )
    assert over.nominated == () and over.record.round == 2
    wanted = (last + timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert over.record.reason.endswith(f"; round 3 at {wanted}"), over.record.reason
    assert describe(over.record)[1] == "round 2: every worker failed in each round before"


ROUNDS_READ = {
    "absent: 1": (None, 1),
    "3": (3, 3),
    "0 (hand-edited): 1": (0, 1),
    "a string (hand-edited): 1": ("2", 1),
    "true (hand-edited): 1": (True, 1),
}


@pytest.mark.parametrize(("value", "wanted"), ROUNDS_READ.values(), ids=ROUNDS_READ.keys())
def test_the_round_as_read_from_the_record(value: object, wanted: int) -> None:
    import json

    data: dict[str, object] = {"nominated": [], "reason": "x"}
    if value is not None:
        data["round"] = value
    assert DispatchRecord.from_annotation(json.dumps(data)).round == wanted


def test_round_wait_doubles_up_to_its_most() -> None:
    wait = RoundWait(60.0, 1800.0)
    assert [wait.after(n) for n in (1, 2, 3, 5, 6, 1000)] == [60, 120, 240, 960, 1800, 1800]


def test_the_round_wait_is_set_by_file_environment_or_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dispatcher.roundWaitSeconds`` and ``roundWaitMaxSeconds``: 60 and 1800 by default;
    an environment variable sets them, a flag of ``gangcheck run`` wins; a wait that is no
    positive number of seconds, or a most below the first wait, is refused."""
    from gangcheck.cli import _parser, _settings
    from gangcheck.settings import SettingsError

    def waits(*argv: str) -> tuple[float, float]:
        args = _parser().parse_args(["run", "--role", "dispatcher", *argv])
        got = _settings(args).dispatcher
        return got.round_wait_seconds, got.round_wait_max_seconds

    assert waits() == (60.0, 1800.0)
    monkeypatch.setenv("GANGCHECK_DISPATCHER__ROUND_WAIT_SECONDS", "30")
    assert waits() == (30.0, 1800.0)
    assert waits("--round-wait", "10", "--round-wait-max", "40") == (10.0, 40.0)
    for wrong in ("0", "-1", "nan", "inf"):
        with pytest.raises(SettingsError, match="--round-wait"):
            waits("--round-wait", wrong)
    with pytest.raises(SettingsError, match="roundWaitMaxSeconds"):
        waits("--round-wait", "100", "--round-wait-max", "50")


def test_a_new_round_nominates_as_many_at_once_as_set() -> None:
    """``--dispatch-at-once 2``: round 2 nominates two workers again, as round 1 did."""
    three = (WorkerFacts("a"), WorkerFacts("b"), WorkerFacts("c"))
    record = DispatchRecord(
        tried=("a", "b", "c"),
        failed={c: "CapacityIsNotFound" for c in ("a", "b", "c")},
        failed_at={c: stamp(70.0) for c in ("a", "b", "c")},
    )
    step = decide(record, three, at_once=2, now=NOW, rounds=RoundWait(60.0, 1800.0))
    assert step.nominated == ("a", "b") and step.record.round == 2
    assert step.record.failed == {}
