"""The attempt's record, parsed once from its request's annotations into typed fields."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gangcheck.logic.attempt.records import AttemptPhase, Record, RollbackCause


def test_a_full_record_is_read_into_typed_fields() -> None:
    record = Record.of(
        {
            "gangcheck.io/attempt": "3",
            "gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z",
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "StrayPods: default/x on n1",
            "gangcheck.io/rollback-nodes": '{"n1": "2026-11-30T10:01:00Z"}',
            "gangcheck.io/outcome": '{"reclaimed": ["n2"], "nodeSeconds": 60}',
            "gangcheck.io/reserved-members": "2",
            "gangcheck.io/gang-members": "6",
        }
    )
    assert record.number == 3
    assert record.deadline == datetime(2026, 11, 30, 10, 7, tzinfo=UTC)
    assert record.phase is AttemptPhase.ROLLING_BACK
    assert record.cause is RollbackCause.STRAY_PODS
    assert record.rollback_nodes == {"n1": "2026-11-30T10:01:00Z"}
    assert record.outcome is not None and record.outcome.reclaimed == ("n2",)
    assert (record.reserved, record.gang_members) == (2, 6)
    assert not record.settled


def test_an_empty_or_unreadable_record_leaves_its_fields_unset() -> None:
    record = Record.of(
        {
            "gangcheck.io/attempt": "x",
            "gangcheck.io/phase": "Unknown",
            "gangcheck.io/rollback-nodes": "not json",
            "gangcheck.io/reserved-members": "-1",
        }
    )
    assert record == Record(phase=AttemptPhase.ASKED, raw_nodes="not json")
    assert record.rollback_nodes == {}
    assert record.cause is None and record.outcome is None


@pytest.mark.parametrize(
    "raw",
    [
        "²",  # a digit to str.isdigit, not to int
        "\u0661",  # an Arabic-Indic one: not what gangcheck writes
        "1" * 5000,  # past int()'s limit on digits
        "9" * 19,  # beyond int64
        "-1",
        " 3",
    ],
)
def test_a_count_written_by_hand_is_unreadable_not_an_error(raw: str) -> None:
    notes = ("attempt", "reserved-members", "gang-members", "capacity-source")
    record = Record.of({f"gangcheck.io/{n}": raw for n in notes})
    assert (record.number, record.reserved, record.gang_members, record.source) == (
        None,
        0,
        None,
        0,
    )


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("Deadline: the gang did not fit within 60s (...)", RollbackCause.DEADLINE),
        ("StartDeadline: 2 of 4 members scheduled", RollbackCause.START_DEADLINE),
        ("Failed: CapacityIsNotFound: no", RollbackCause.FAILED),
        ("CapacityRevoked: taken back", RollbackCause.REVOKED),
        ("BookingExpired: lapsed", RollbackCause.EXPIRED),
        ("ConfigChanged: class 'a' -> 'b'", RollbackCause.CONFIG_CHANGED),
        ("StrayPods: pods not of this gang", RollbackCause.STRAY_PODS),
        ("Workload evicted", RollbackCause.GANG_GONE),
        ("PodGroup deleted", RollbackCause.GANG_GONE),
        ("Deadlines: not the word", RollbackCause.GANG_GONE),
    ],
)
def test_a_rollback_reason_names_its_cause_by_its_first_word(
    reason: str, cause: RollbackCause
) -> None:
    assert RollbackCause.of(reason) is cause


@pytest.mark.parametrize("phase", ["Fulfilled", "Started"])
def test_a_fulfilled_or_started_attempt_is_settled(phase: str) -> None:
    assert Record.of({"gangcheck.io/phase": phase}).settled
