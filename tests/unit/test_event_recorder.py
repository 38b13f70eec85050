"""The Event recorder in the background (as the controller runs it): a reconcile does not wait
for its Events, and every one is still sent; the same Event said again soon after is counted
into the next create, not created anew."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gangcheck.kube.resources import EVENT
from gangcheck.logic.attempt.actions import Event
from gangcheck.logic.podgroups import podgroup as pg
from gangcheck.model.objects import ObjectRef
from gangcheck.reconcile import events
from gangcheck.reconcile.events import EventRecorder
from tests.fakes.kube import FakeKube

REF = ObjectRef("Workload", "default", "wl", "uid-wl", "kueue.x-k8s.io/v1beta2")


async def test_a_background_emit_returns_before_its_create_and_every_event_is_sent() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, background=True, senders=2)
    for i in range(5):
        await recorder.emit(REF, Event("AdmissionCheckUpdated", f"update {i}"))
    assert kube.writes_of("Event") == []  # nothing waited for: the creates are under way
    assert recorder.sending == 5
    await recorder.flush()
    assert recorder.sending == 0
    sent = sorted(e["message"] for e in kube.all_of(EVENT))
    assert sent == [f"update {i}" for i in range(5)]


async def test_a_background_event_refused_is_logged_not_raised_and_the_rest_are_sent() -> None:
    kube = FakeKube()
    kube.fail("create", "Event", error=500)
    recorder = EventRecorder(kube, background=True)
    await recorder.emit(REF, Event("First", "refused"))
    await recorder.emit(REF, Event("Second", "sent"))
    await recorder.flush()
    assert [e["reason"] for e in kube.all_of(EVENT)] == ["Second"]


async def test_in_the_foreground_the_event_is_created_before_emit_returns() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube)
    await recorder.emit(REF, Event("Created", "now"))
    assert [e["reason"] for e in kube.all_of(EVENT)] == ["Created"]


# ---- the same Event said again -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


REFUSED = Event("FailedCreate", "Error creating Request: denied by policy", warning=True)


async def test_an_event_repeated_by_retries_is_created_once_then_counted() -> None:
    """A create refused on every retry (0.5 s, 1 s, 2 s ... backoff) said FailedCreate on
    every retry: one new Event each. Now once, and again with its count only after
    REPEAT_SECONDS."""
    kube, clock = FakeKube(), Clock()
    recorder = EventRecorder(kube, clock=clock)
    for delay in (0.5, 1, 2, 4, 8, 16, 32, 60, 60, 60):
        await recorder.emit(REF, REFUSED)
        clock.advance(delay)
    assert [(e["count"], e["firstTimestamp"]) for e in kube.all_of(EVENT)] == [
        (1, "2026-12-05T10:00:00Z")
    ]
    clock.now = datetime(2026, 12, 5, 10, 5, 1, tzinfo=UTC)
    await recorder.emit(REF, REFUSED)
    events = sorted(kube.all_of(EVENT), key=lambda e: e["count"])
    assert [(e["count"], e["firstTimestamp"], e["lastTimestamp"]) for e in events] == [
        (1, "2026-12-05T10:00:00Z", "2026-12-05T10:00:00Z"),
        (11, "2026-12-05T10:00:00Z", "2026-12-05T10:05:01Z"),
    ]


async def test_events_that_differ_in_object_reason_type_or_message_are_each_created() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube)
    other = ObjectRef("Workload", "default", "wl-2", "uid-wl-2", "kueue.x-k8s.io/v1beta2")
    await recorder.emit(REF, REFUSED)
    await recorder.emit(other, REFUSED)
    await recorder.emit(REF, Event("ReclaimFailed", REFUSED.message, warning=True))
    await recorder.emit(REF, Event("FailedCreate", REFUSED.message))
    await recorder.emit(REF, Event("FailedCreate", "Error creating Request: quota", warning=True))
    assert len(kube.all_of(EVENT)) == 5


async def test_a_repeat_of_an_event_the_server_refused_is_sent() -> None:
    kube = FakeKube()
    kube.fail("create", "Event", error=500)
    recorder = EventRecorder(kube)
    await recorder.emit(REF, REFUSED)
    await recorder.emit(REF, REFUSED)
    assert [e["count"] for e in kube.all_of(EVENT)] == [2]


async def test_a_background_recorder_counts_repeats_too() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, background=True)
    for _ in range(20):
        await recorder.emit(REF, REFUSED)
    await recorder.flush()
    assert [e["count"] for e in kube.all_of(EVENT)] == [1]


async def test_a_message_of_several_lines_is_said_on_one() -> None:
    kube = FakeKube()
    await EventRecorder(kube).emit(REF, Event("FailedCreate", "denied:\n  rule 1\n  rule 2"))
    assert [e["message"] for e in kube.all_of(EVENT)] == ["denied: rule 1 rule 2"]


async def test_the_events_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The least recently said is forgotten: memory stays flat over weeks of gangs."""
    monkeypatch.setattr(events, "REMEMBERED", 2)
    kube = FakeKube()
    recorder = EventRecorder(kube)
    for name in ("a", "b", "c", "a"):
        await recorder.emit(REF, Event("Said", name))
    assert sorted(e["message"] for e in kube.all_of(EVENT)) == ["a", "a", "b", "c"]


def test_every_event_reason_the_code_writes_is_one_camel_case_word() -> None:
    """Reasons are what alerts and `kubectl get events --field-selector reason=` match on:
    one stable CamelCase word each (the Event's message says the rest)."""
    package = Path(events.__file__).parents[1]
    source = "\n".join(p.read_text() for p in package.rglob("*.py"))
    reasons = set(re.findall(r'\bEvent\(\s*f?"([^"]*)"', source))
    reasons |= {pg.WAITING, pg.PROVISIONING, pg.RELEASED, pg.BACKING_OFF, pg.BLOCKED}
    reasons |= {pg.FAILED, pg.NOT_A_GANG, pg.GAVE_UP}  # a PodGroup's states, said as reasons
    assert len(reasons) > 30
    odd = sorted(r for r in reasons if not re.fullmatch(r"(\{backend\.kind\})?[A-Z][a-zA-Z]+", r))
    assert odd == []
