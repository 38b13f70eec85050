"""A worker that does not answer (gangcheck.logic.dispatch: ``silence``, ``unread``): how
long it is skipped unread, and what the record says of it, as tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gangcheck.logic.dispatch import (
    SILENT_FIRST,
    SILENT_MAX,
    Silence,
    patient,
    silence,
    silent_reason,
    unread,
)

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def window(wait: float, *, ends_in: float | None = None) -> Silence:
    return Silence(NOW + timedelta(seconds=wait if ends_in is None else ends_in), wait)


WINDOWS = {
    "silent the first time: SILENT_FIRST": (None, SILENT_FIRST),
    "silent again when tried: twice as long": (window(SILENT_FIRST, ends_in=0), 2 * SILENT_FIRST),
    "doubled again": (window(2 * SILENT_FIRST, ends_in=0), 4 * SILENT_FIRST),
    "never longer than SILENT_MAX": (window(SILENT_MAX, ends_in=0), SILENT_MAX),
    "doubling past SILENT_MAX: SILENT_MAX": (window(0.75 * SILENT_MAX, ends_in=0), SILENT_MAX),
}


@pytest.mark.parametrize(("previous", "wait"), WINDOWS.values(), ids=WINDOWS.keys())
def test_a_silent_worker_is_skipped_for_a_window_doubling_up_to_a_cap(
    previous: Silence | None, wait: float
) -> None:
    got = silence(previous, NOW)
    assert got == Silence(NOW + timedelta(seconds=wait), wait)


def test_the_windows_in_a_row_double_from_the_first_to_the_cap() -> None:
    held, waits = None, []
    for _ in range(6):
        held = silence(held, NOW)
        waits.append(held.wait)
    assert waits == [30.0, 60.0, 120.0, 240.0, 240.0, 240.0]
    assert (SILENT_FIRST, SILENT_MAX) == (30.0, 240.0)


READS = {
    "never silent: read": (None, 0.0, False),
    "in its window: skipped unread": (window(30.0), 0.0, True),
    "its window's last moment: skipped unread": (window(30.0), 29.9, True),
    "its window ended: read again": (window(30.0), 30.0, False),
    "long after: read again": (window(30.0), 1000.0, False),
}


@pytest.mark.parametrize(("held", "later", "skipped"), READS.values(), ids=READS.keys())
def test_a_silent_worker_is_read_again_once_its_window_ends(
    held: Silence | None, later: float, skipped: bool
) -> None:
    said = unread(held, NOW + timedelta(seconds=later))
    assert bool(said) is skipped
    if held is not None and skipped:
        assert said == silent_reason(held)


def test_the_reason_says_the_bound_and_when_it_is_tried_again_the_same_all_window() -> None:
    held = silence(None, NOW)
    said = silent_reason(held)
    assert said == "unreachable: no answer within 5s (tried again after 2026-12-05T12:00:30Z)"
    assert unread(held, NOW) == unread(held, NOW + timedelta(seconds=29)) == said
    assert silent_reason(held, within=0.5).startswith("unreachable: no answer within 0.5s")


PATIENT = {
    "answered (no window)": (None, False),
    "its first window": (window(SILENT_FIRST), True),
    "silent again: a doubled window": (window(2 * SILENT_FIRST), False),
    "at the cap": (window(SILENT_MAX), False),
}


@pytest.mark.parametrize(("held", "waited"), PATIENT.values(), ids=PATIENT.keys())
def test_a_nominated_silent_worker_is_waited_for_in_its_first_window_only(
    held: Silence | None, waited: bool
) -> None:
    assert patient(held) is waited
