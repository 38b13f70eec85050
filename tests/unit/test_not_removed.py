"""A node CordonAndTaint left for scale-down and still there is said once per slot, across
restarts and leaders: the slots and their Events' names (logic/attempt/not_removed.py), and
the draining-node reconciler saying it against a fake API server (a name taken answers 409
AlreadyExists, as the API server does)."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.kube.errors import FencedError
from gangcheck.kube.resources import EVENT
from gangcheck.logic.attempt.fulfillment import ARRIVED_FOR
from gangcheck.logic.attempt.not_removed import NOT_REMOVED_REPEAT_SECONDS, not_removed_slot
from gangcheck.logic.attempt.reclaim import LEFT_FOR_SCALE_DOWN_SECONDS, RECLAIM_TAINT_ENTRY
from gangcheck.logic.timefmt import format_time
from gangcheck.model.names import RECLAIMED_AT
from gangcheck.reconcile.nodes import DrainingNodeReconciler
from tests.builders import node
from tests.fakes.kube import FakeKube
from tests.fakes.metrics import RecordedMetrics

Obj = dict[str, Any]
LEFT = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)
BOUND = LEFT + timedelta(seconds=LEFT_FOR_SCALE_DOWN_SECONDS)
REPEAT = NOT_REMOVED_REPEAT_SECONDS
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def left(name: str = "n1", *, at: str = format_time(LEFT), uid: str = "uid-n1") -> Obj:
    """A node CordonAndTaint left at `at`: cordoned, gangcheck's taint on, reclaimed-at."""
    obj = node(
        name,
        annotations={RECLAIMED_AT: at, ARRIVED_FOR: "ns/wl-atomic-1"},
        taints=[dict(RECLAIM_TAINT_ENTRY)],
    )
    obj["metadata"]["uid"] = uid
    obj["spec"]["unschedulable"] = True
    return obj


# ---- the slots -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after_bound", "index", "ends_in"),
    [
        (0.0, 0, REPEAT),  # at the bound: the first slot, whole
        (1.0, 0, REPEAT - 1),
        (REPEAT - 1, 0, 1.0),
        (REPEAT, 1, REPEAT),  # the next slot begins on the dot
        (REPEAT + 0.5, 1, REPEAT - 0.5),
        (5 * REPEAT + 60, 5, REPEAT - 60),  # days later: its slot, however many passed
        (-5.0, 0, REPEAT + 5),  # before the bound (never asked so): the first slot's end
    ],
)
def test_the_slot_is_counted_from_reclaimed_at_plus_the_bound(
    after_bound: float, index: int, ends_in: float
) -> None:
    slot = not_removed_slot(left(), BOUND + timedelta(seconds=after_bound))
    assert (slot.index, slot.ends_in) == (index, ends_in)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        # one slot, two looks (a restart, another replica, a node update): one name
        ((left(), 1.0), (left(), REPEAT - 1), True),
        # clocks 90 s apart within a slot: one name
        ((left(), 100.0), (left(), 190.0), True),
        # the next slot: another name
        ((left(), REPEAT - 1), (left(), REPEAT), False),
        # a node of that name made again (another uid), left at the same second: another name
        ((left(), 1.0), (left(uid="uid-other"), 1.0), False),
        # left again (another record of when) and in the same slot index: another name
        ((left(), 1.0), (left(at=format_time(LEFT + timedelta(hours=3))), 3 * 3600 + 1.0), False),
        # another node: another name
        ((left(), 1.0), (left("n2"), 1.0), False),
    ],
)
def test_a_slots_event_name_is_one_per_slot_node_and_record(
    a: tuple[Obj, float], b: tuple[Obj, float], same: bool
) -> None:
    first = not_removed_slot(a[0], BOUND + timedelta(seconds=a[1]))
    second = not_removed_slot(b[0], BOUND + timedelta(seconds=b[1]))
    assert (first.event == second.event) is same


def test_the_event_name_says_the_node_and_slot_and_is_a_valid_name() -> None:
    slot = not_removed_slot(left(), BOUND + timedelta(seconds=2 * REPEAT + 1))
    assert slot.event.startswith("n1.not-removed-2-")
    longest = not_removed_slot(left("n" * 253), BOUND)
    assert len(longest.event) <= 253
    assert DNS_SUBDOMAIN.fullmatch(longest.event)
    assert DNS_SUBDOMAIN.fullmatch(slot.event)


@pytest.mark.parametrize("raw", ["yesterday", ""])
def test_an_unreadable_reclaimed_at_counts_its_slots_from_the_epoch(raw: str) -> None:
    """Said at once (scale_down_watch: overdue), then once per slot all the same: the slots
    of a time gangcheck cannot read are the epoch's, the same for every replica."""
    now = datetime(2026, 11, 30, 10, 10, 0, tzinfo=UTC)  # 10:00 began a slot of the epoch's
    slot = not_removed_slot(left(at=raw), now)
    epoch_slots = (now - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() // REPEAT
    assert (slot.index, slot.ends_in) == (epoch_slots, REPEAT - 600)
    later = not_removed_slot(left(at=raw), now + timedelta(seconds=REPEAT - 601))
    assert (later.index, later.event) == (slot.index, slot.event)


# ---- the reconciler saying it --------------------------------------------------------------


def fake(*objs: Obj) -> FakeKube:
    kube = FakeKube(clock=lambda: BOUND)
    kube.add(*objs)
    return kube


def reconciler(kube: FakeKube, clock: dict[str, datetime]) -> DrainingNodeReconciler:
    """A reconciler as a (re)start makes it: nothing in memory."""
    return DrainingNodeReconciler(
        kube, kube.caches(), clock=lambda: clock["now"], metrics=RecordedMetrics()
    )


def said(kube: FakeKube) -> list[Obj]:
    """The ReclaimedNodeNotRemoved Events the server has."""
    return [e for e in kube.all_of(EVENT) if e["reason"] == "ReclaimedNodeNotRemoved"]


def metric(r: DrainingNodeReconciler) -> int:
    assert isinstance(r.metrics, RecordedMetrics)
    return r.metrics.names().count("reclaimed_not_removed")


async def test_a_restart_within_a_slot_says_nothing_and_the_next_slot_says_it_once() -> None:
    kube = fake(left())
    clock = {"now": BOUND + timedelta(seconds=1)}
    first = reconciler(kube, clock)
    result = await first.reconcile("n1")
    assert result.requeue_after == REPEAT - 1
    assert len(said(kube)) == 1
    assert said(kube)[0]["type"] == "Warning"
    assert said(kube)[0]["involvedObject"] == {
        "apiVersion": "v1", "kind": "Node", "name": "n1", "namespace": "", "uid": "uid-n1",
    }  # fmt: skip
    assert metric(first) == 1

    clock["now"] = BOUND + timedelta(seconds=600)  # restarted ten minutes on
    again = reconciler(kube, clock)
    assert (await again.reconcile("n1")).requeue_after == REPEAT - 600
    assert len(said(kube)) == 1
    assert metric(again) == 0
    creates = len(kube.writes_of("Event", "create"))
    await again.reconcile("n1")  # a node update: remembered now, not even tried
    assert len(kube.writes_of("Event", "create")) == creates

    clock["now"] = BOUND + timedelta(seconds=REPEAT)  # the next slot
    assert (await again.reconcile("n1")).requeue_after == REPEAT
    await again.reconcile("n1")
    assert len(said(kube)) == 2
    assert metric(again) == 1


async def test_two_replicas_whose_clocks_differ_say_each_slot_once() -> None:
    """The one ahead by 90 s says the next slot 90 s early; the one behind, looking in
    between (a handover), finds both names taken."""
    kube = fake(left())
    ahead, behind = {"now": BOUND + timedelta(seconds=90)}, {"now": BOUND}
    await reconciler(kube, ahead).reconcile("n1")
    await reconciler(kube, behind).reconcile("n1")
    ahead["now"] = BOUND + timedelta(seconds=REPEAT + 10)
    await reconciler(kube, ahead).reconcile("n1")
    behind["now"] = BOUND + timedelta(seconds=REPEAT - 80)
    await reconciler(kube, behind).reconcile("n1")
    behind["now"] = BOUND + timedelta(seconds=REPEAT + 1)
    await reconciler(kube, behind).reconcile("n1")
    assert sorted(e["metadata"]["name"].split("-")[2] for e in said(kube)) == ["0", "1"]


@pytest.mark.parametrize("status", [403, 500])
async def test_an_event_the_server_refuses_is_said_in_the_log_and_metric_once_a_slot(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Never silent (the log line and the metric say it), never held up: not tried again in
    the slot, tried again in the next."""
    kube = fake(left())
    kube.fail("create", "Event", error=status, times=2)
    clock = {"now": BOUND + timedelta(seconds=1)}
    r = reconciler(kube, clock)
    with caplog.at_level(logging.WARNING, logger="gangcheck.reconcile.nodes"):
        assert (await r.reconcile("n1")).requeue_after == REPEAT - 1
        assert (await r.reconcile("n1")).requeue_after == REPEAT - 1
    assert said(kube) == []
    assert metric(r) == 1
    warned = [m.getMessage() for m in caplog.records]
    assert len(warned) == 1
    assert "still here" in warned[0] and "its Event not recorded" in warned[0]
    kube.mend("create", "Event")
    clock["now"] = BOUND + timedelta(seconds=REPEAT)
    await r.reconcile("n1")
    assert len(said(kube)) == 1
    assert metric(r) == 2


async def test_a_replica_that_lost_the_lead_says_nothing_and_its_next_look_does() -> None:
    """Its write fenced (not the leader): raised, neither logged nor counted as said, nor
    remembered: once it leads again, the slot is said."""
    kube = fake(left())
    kube.fail("create", "Event", error=FencedError("not the leader"))
    r = reconciler(kube, {"now": BOUND + timedelta(seconds=1)})
    with pytest.raises(FencedError):
        await r.reconcile("n1")
    assert metric(r) == 0
    assert said(kube) == []
    await r.reconcile("n1")
    assert len(said(kube)) == 1
    assert metric(r) == 1
