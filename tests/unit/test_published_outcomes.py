"""What gangcheck publishes of its capacity sources' outcomes on its AdmissionChecks (pure, by
tables), the reconcilers that note and write it (against the fake API server), and how the
dispatcher reads it back for a worker."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.app import CHECK_KEY, WORKLOAD_KEY, Controller
from gangcheck.dispatcher import _Alike, _view_of
from gangcheck.kube.resources import ADMISSION_CHECK
from gangcheck.logic.attempt import published
from gangcheck.logic.attempt.driver import SourceNote
from gangcheck.logic.attempt.published import (
    AT_MOST,
    CONDITION,
    KEEP_SECONDS,
    MESSAGE_MAX,
    REFRESH_SECONDS,
    Outcome,
    Seen,
)
from gangcheck.logic.dispatch import Flavors
from gangcheck.reconcile.admissioncheck import AdmissionCheckReconciler, SourceOutcomes
from tests.builders import CONTROLLER, WorkloadBuilder, pod_template
from tests.fakes.kube import FakeKube

Obj = dict[str, Any]
NOW = datetime(2026, 12, 7, 10, 0, 0, tzinfo=UTC)
H100, A100 = ("h100",), ("a100",)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def out(flavors: tuple[str, ...], source: str, seconds: float = 0) -> Seen:
    return Seen(flavors, source, Outcome.STOCKOUT, at(seconds))


def got(flavors: tuple[str, ...], source: str, seconds: float = 0) -> Seen:
    return Seen(flavors, source, Outcome.DELIVERED, at(seconds))


# ---- what counts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "cause", "expected"),
    [
        ("delivered", "", Outcome.DELIVERED),
        ("failed", "Deadline", Outcome.STOCKOUT),
        ("failed", "Failed", Outcome.STOCKOUT),
        ("failed", "CapacityIsNotFound", Outcome.STOCKOUT),
        ("refused", "", Outcome.STOCKOUT),  # it cannot find the capacity, and is waited on
        # the source's room is not what ended these
        ("failed", "RaceLost", None),
        ("failed", "GangGone", None),
        ("failed", "ConfigChanged", None),
        ("failed", "StartDeadline", None),
        ("failed", "StrayPods", None),
        ("failed", "BookingExpired", None),
        ("asked", "", None),
    ],
)
def test_which_outcomes_say_something_of_the_source(
    outcome: str, cause: str, expected: Outcome | None
) -> None:
    one = published.seen(["h100", "h100", "cpu"], "pool-a", outcome, cause, NOW)
    if expected is None:
        assert one is None
    else:
        assert one == Seen(("cpu", "h100"), "pool-a", expected, NOW)


def test_a_gang_with_no_flavors_known_publishes_nothing() -> None:
    assert published.seen([], "pool-a", "delivered", "", NOW) is None


# ---- merged, due -----------------------------------------------------------------------------


def test_merged_keeps_the_latest_per_flavors_and_source() -> None:
    before = (out(H100, "pool-a", 0), got(A100, "pool-a", 0))
    noted = (got(H100, "pool-a", 10), out(H100, "pool-b", 5))
    assert published.merged(before, noted, at(10)) == tuple(
        sorted((got(H100, "pool-a", 10), got(A100, "pool-a", 0), out(H100, "pool-b", 5)))
    )


def test_an_older_outcome_noted_late_does_not_replace_a_newer_one() -> None:
    assert published.merged((out(H100, "a", 20),), (got(H100, "a", 10),), at(20)) == (
        out(H100, "a", 20),
    )


def test_merged_drops_outcomes_past_their_keep_and_keeps_the_newest_few() -> None:
    old = out(H100, "a", 0)
    assert published.merged((old,), (), at(KEEP_SECONDS + 1)) == ()
    assert published.merged((old,), (), at(KEEP_SECONDS)) == (old,)
    many = [got((f"f{i:03}",), "a", i) for i in range(AT_MOST + 10)]
    kept = published.merged(many, (), at(AT_MOST + 10))
    assert len(kept) == AT_MOST
    assert min(s.at for s in kept) == at(10)  # the 10 oldest left out


def test_a_time_in_the_future_is_taken_as_now_and_written_so() -> None:
    """A stockout stamped in year 9999 (a hand edit, a clock since set back) would outrank
    every outcome to come and never age: it is taken as now, written so, and a delivery
    after it replaces it."""
    future = Seen(H100, "a", Outcome.STOCKOUT, datetime(9999, 1, 1, tzinfo=UTC))
    brought = published.merged((future,), (), at(10))
    assert brought == (out(H100, "a", 10),)
    assert published.due((future,), brought)
    assert published.merged(brought, (got(H100, "a", 20),), at(20)) == (got(H100, "a", 20),)


@pytest.mark.parametrize(
    ("before", "wanted", "due"),
    [
        ((), (), False),
        ((), (got(H100, "a"),), True),  # new
        ((got(H100, "a"),), (out(H100, "a", 1),), True),  # flipped
        ((got(H100, "a"),), (), True),  # dropped
        ((got(H100, "a"),), (got(H100, "a", 10),), False),  # a burst of deliveries: one write
        ((got(H100, "a"),), (got(H100, "a", REFRESH_SECONDS),), True),  # its time moved on
        ((out(H100, "a"),), (out(H100, "a", 10), got(A100, "a", 10)), True),
    ],
)
def test_when_a_write_is_due(before: tuple[Seen, ...], wanted: tuple[Seen, ...], due: bool) -> None:
    assert published.due(before, wanted) is due


# ---- the condition -----------------------------------------------------------------------------


def test_the_condition_round_trips_its_outcomes() -> None:
    outcomes = (got(A100, "pool-a", 0), out(("cpu", "h100"), "pool-b", 3))
    cond = published.condition(outcomes, None, at(5), 7)
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION, "True", "StockedOut")
    assert cond["observedGeneration"] == 7
    assert published.of_condition(cond) == tuple(sorted(outcomes))
    delivering = published.condition((got(A100, "a"),), cond, at(9), 7)
    assert (delivering["status"], delivering["reason"]) == ("False", "Delivering")
    assert delivering["lastTransitionTime"] == "2026-12-07T10:00:09Z"
    again = published.condition((got(A100, "a", 60),), delivering, at(60), 7)
    assert again["lastTransitionTime"] == "2026-12-07T10:00:09Z"  # its status stayed


def test_a_message_too_long_leaves_the_oldest_out() -> None:
    long = "f" * 200
    many = [got((f"{long}{i:04}",), "a", i) for i in range(400)]
    message = published.message_of(many)
    assert len(message) <= MESSAGE_MAX
    rows = json.loads(message)
    assert 0 < len(rows) < 400
    kept = {r["flavors"][0] for r in rows}
    assert f"{long}0399" in kept  # the newest
    assert f"{long}0000" not in kept  # the oldest


@pytest.mark.parametrize(
    "message",
    [
        "",
        "not json",
        '{"a": 1}',
        '[{"flavors": [], "source": "a", "outcome": "Delivered", "at": "2026-12-07T10:00:00Z"}]',
        '[{"flavors": ["x"], "source": 3, "outcome": "Delivered", "at": "2026-12-07T10:00:00Z"}]',
        '[{"flavors": ["x"], "source": "a", "outcome": "Maybe", "at": "2026-12-07T10:00:00Z"}]',
        '[{"flavors": ["x"], "source": "a", "outcome": "Delivered", "at": "yesterday"}]',
        '[7, "x", null]',
    ],
)
def test_what_cannot_be_read_is_left_out(message: str) -> None:
    assert published.of_condition({"type": CONDITION, "message": message}) == ()


def test_only_the_outcomes_changing_is_not_a_change_a_workload_decides_on() -> None:
    check = {"spec": {"controllerName": CONTROLLER}, "status": {"conditions": [ACTIVE]}}
    with_outcomes = {**check, "status": {"conditions": [ACTIVE, _published(got(H100, "a"))]}}
    assert published.same_but_outcomes(check, with_outcomes)
    inactive = {**ACTIVE, "status": "False"}
    assert not published.same_but_outcomes(check, {**check, "status": {"conditions": [inactive]}})
    moved = {**check, "spec": {"controllerName": CONTROLLER, "parameters": {"name": "other"}}}
    assert not published.same_but_outcomes(check, moved)


ACTIVE = {"type": "Active", "status": "True", "reason": "Active", "message": "ok"}


def _published(*outcomes: Seen) -> Obj:
    return published.condition(outcomes, None, NOW, 1)


# ---- noted by the Workload reconciler, written by the check's -----------------------------------


def test_outcomes_noted_wake_their_check_once_until_published() -> None:
    woken: list[str] = []
    noted = SourceOutcomes()
    noted.wake = woken.append
    delivered = SourceNote("pool-a", "delivered", seconds=3.0)
    noted.note("atomic", ["h100"], [delivered, SourceNote("pool-a", "asked")], NOW)
    noted.note("atomic", ["h100"], [SourceNote("pool-b", "failed", "Deadline")], at(1))
    noted.note("atomic", ["h100"], [SourceNote("pool-b", "failed", "RaceLost")], at(2))
    assert woken == ["atomic"]
    taken = noted.pending("atomic")
    assert set(taken) == {got(H100, "pool-a"), out(H100, "pool-b", 1)}
    noted.note("atomic", ["h100"], [SourceNote("pool-a", "failed", "Deadline")], at(3))
    noted.written("atomic", taken)  # written meanwhile: the one noted since stays, and wakes
    assert noted.pending("atomic") == (out(H100, "pool-a", 3),)
    assert woken == ["atomic", "atomic"]
    noted.written("atomic", noted.pending("atomic"))
    assert noted.pending("atomic") == ()
    noted.note("atomic", ["h100"], [delivered], at(4))
    noted.forget("atomic")
    assert noted.pending("atomic") == ()


def _check(*conditions: Obj) -> Obj:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": "atomic", "generation": 3},
        "spec": {"controllerName": CONTROLLER},
        "status": {"conditions": list(conditions)},
    }


def _stored_outcomes(kube: FakeKube) -> tuple[Seen, ...]:
    stored = kube.stored(ADMISSION_CHECK, "atomic")
    assert stored is not None
    return published.on_check(stored)


async def test_the_check_reconciler_publishes_what_was_noted_with_what_it_said_before() -> None:
    kube = FakeKube(clock=lambda: at(30))
    kube.add(_check(_published(got(A100, "pool-a"))))  # from before a restart
    noted = SourceOutcomes()
    reconciler = AdmissionCheckReconciler(kube, kube.caches(), clock=lambda: at(30), outcomes=noted)
    await reconciler.reconcile("atomic")  # made Active: what it published stays
    assert _stored_outcomes(kube) == (got(A100, "pool-a"),)
    stored = kube.stored(ADMISSION_CHECK, "atomic")
    assert stored is not None
    active = next(c for c in stored["status"]["conditions"] if c["type"] == "Active")
    await reconciler.reconcile("atomic")
    assert len(kube.writes) == 1  # nothing noted, nothing due
    noted.note("atomic", ["h100"], [SourceNote("pool-a", "failed", "Deadline")], at(20))
    await reconciler.reconcile("atomic")
    assert set(_stored_outcomes(kube)) == {
        Seen(A100, "pool-a", Outcome.DELIVERED, NOW),
        Seen(H100, "pool-a", Outcome.STOCKOUT, at(20)),
    }
    stored = kube.stored(ADMISSION_CHECK, "atomic")
    assert stored is not None
    kinds = {c["type"]: c for c in stored["status"]["conditions"]}
    assert kinds["Active"] == active  # kept as it was
    assert (kinds[CONDITION]["status"], kinds[CONDITION]["reason"]) == ("True", "StockedOut")
    assert noted.pending("atomic") == ()
    # more deliveries where the last was one: nothing to write
    for i in range(50):
        noted.note("atomic", ["a100"], [SourceNote("pool-a", "delivered")], at(21 + i / 100))
    await reconciler.reconcile("atomic")
    assert len(kube.writes) == 2
    # a burst of deliveries of a flavor new there: one write for all of them
    for i in range(50):
        noted.note("atomic", ["l4"], [SourceNote("pool-a", "delivered")], at(22 + i / 100))
    await reconciler.reconcile("atomic")
    assert len(kube.writes) == 3
    # the latest of the burst, to the second
    assert Seen(("l4",), "pool-a", Outcome.DELIVERED, at(22)) in _stored_outcomes(kube)


async def test_a_check_that_is_no_longer_ours_forgets_what_was_noted_for_it() -> None:
    kube = FakeKube(clock=lambda: NOW)
    noted = SourceOutcomes()
    noted.note("atomic", ["h100"], [SourceNote("pool-a", "delivered")], NOW)
    await AdmissionCheckReconciler(kube, kube.caches(), outcomes=noted).reconcile("atomic")
    assert noted.pending("atomic") == ()
    assert kube.writes == []


# ---- read back by the dispatcher --------------------------------------------------------------


def _theirs(*conditions: Obj) -> Obj:
    check = _check(*conditions)
    check["spec"]["controllerName"] = "kueue.x-k8s.io/provisioning-request"
    return check


def _histories(checks: list[Obj], mine: Flavors | None, now: datetime = NOW) -> list[Any]:
    view = _view_of(checks, [], [], [], [], now=now)
    return [(h.deliveries, h.stockouts, h.last) for h in view.sources(_Alike({}, mine))]


def test_the_dispatcher_reads_a_workers_published_outcomes_for_the_same_flavors() -> None:
    check = _check(ACTIVE, _published(out(H100, "pool-a", -5), got(A100, "pool-a", -5)))
    assert _histories([check], frozenset(H100)) == [(0, 1, Outcome.STOCKOUT)]
    assert _histories([check], frozenset(A100)) == [(1, 0, Outcome.DELIVERED)]
    assert _histories([check], frozenset({"l4"})) == []  # nothing said of that kind of node
    assert _histories([check], None) == [(0, 1, Outcome.STOCKOUT)]  # the latest, either kind


def test_the_dispatcher_takes_the_latest_of_every_check_of_gangchecks_only() -> None:
    first = _check(ACTIVE, _published(out(H100, "pool-a", -50)))
    second = {**_check(ACTIVE, _published(got(H100, "pool-a", -5))), "metadata": {"name": "b"}}
    assert _histories([first, second], frozenset(H100)) == [(1, 0, Outcome.DELIVERED)]
    forged = _theirs(ACTIVE, _published(out(H100, "pool-a", -1)))
    assert _histories([first, second, forged], frozenset(H100)) == [(1, 0, Outcome.DELIVERED)]


def test_the_dispatcher_forgets_published_outcomes_past_their_keep() -> None:
    check = _check(ACTIVE, _published(out(H100, "pool-a")))
    assert _histories([check], frozenset(H100), at(KEEP_SECONDS)) == [(0, 1, Outcome.STOCKOUT)]
    assert _histories([check], frozenset(H100), at(KEEP_SECONDS + 1)) == []


def test_a_write_of_the_outcomes_alone_asks_no_workload_to_decide_again() -> None:
    """The controller's own write of what its sources did (every few seconds in a burst)
    reaches the check's watch: the check is looked at again, the Workloads listing it are not
    (a change of its Active condition or its spec still asks each of them)."""
    check = _check({**ACTIVE, "lastTransitionTime": "2026-12-07T09:00:00Z"})
    gang = WorkloadBuilder("wl").pod_set("workers", 2, pod_template(gpu=1)).reserve_quota()
    wl = gang.check().build()
    kube = FakeKube(clock=lambda: NOW)
    kube.add(check, wl)
    controller = Controller(kube, pod_groups=None)
    kube.sync(controller.caches)
    key = f"{WORKLOAD_KEY}{wl['metadata']['namespace']}/wl"

    with_outcomes = copy.deepcopy(check)
    with_outcomes["status"]["conditions"].append(_published(got(H100, "a")))
    controller._on_admission_check(check, with_outcomes)
    assert CHECK_KEY + "atomic" in controller.queue._queued
    assert key not in controller.queue._queued

    inactive = copy.deepcopy(with_outcomes)
    inactive["status"]["conditions"][0]["status"] = "False"
    controller._on_admission_check(with_outcomes, inactive)
    assert key in controller.queue._queued
