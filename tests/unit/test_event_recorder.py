"""The Event recorder in the background (as the controller runs it): a reconcile does not wait
for its Events, and every one is still sent."""

from __future__ import annotations

from gangcheck.kube.resources import EVENT
from gangcheck.logic.attempt.actions import Event
from gangcheck.model.objects import ObjectRef
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
