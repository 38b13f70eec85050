"""The scale-down guard at the edge (reconcile/apply.py ``GuardScaleDown``, reclaim/guard.py,
and the safe reclaim taking it off first) against a fake API server: what is written, and the
paths the server's answers take it down (a conflict, a failed test, a lost answer, a node
gone, a refusal)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.app import SOURCES
from gangcheck.kube.resources import NODE
from gangcheck.logic.attempt.actions import GuardScaleDown
from gangcheck.logic.attempt.scaledown import SCALE_DOWN_DISABLED
from gangcheck.model.names import ARRIVED_FOR, SCALE_DOWN_GUARD
from gangcheck.reclaim.safely import Target, reclaim_safely
from gangcheck.reconcile.apply import Applier
from tests.builders import node
from tests.fakes.kube import FakeKube
from tests.fakes.metrics import RecordedMetrics

Obj = dict[str, Any]
NOW = datetime(2026, 11, 30, 10, 30, tzinfo=UTC)
NS = "default"
KEY = f"{NS}/wl-atomic-1"
SDD, GUARD = SCALE_DOWN_DISABLED, SCALE_DOWN_GUARD
GUARDED = {SDD: "true", GUARD: KEY}


def arrived(name: str, **notes: str) -> Obj:
    return node(name, annotations={ARRIVED_FOR: KEY, **notes})


def setup(*objs: Obj) -> tuple[FakeKube, Applier]:
    kube = FakeKube(clock=lambda: NOW)
    kube.add(*objs)
    applier = Applier(kube, kube.caches(), SOURCES, clock=lambda: NOW, metrics=RecordedMetrics())
    return kube, applier


def notes_of(kube: FakeKube, name: str) -> dict[str, str]:
    stored = kube.stored(NODE, name)
    assert stored is not None
    return dict(stored["metadata"].get("annotations") or {})


async def test_the_guard_is_set_in_one_write_with_the_record_and_cached() -> None:
    kube, applier = setup(arrived("n1"), arrived("n2", **{SDD: "true"}))
    await applier.apply(NS, GuardScaleDown(KEY, ("n1", "n2", "gone")))
    assert notes_of(kube, "n1") | GUARDED == notes_of(kube, "n1")
    assert GUARD not in notes_of(kube, "n2")  # someone else's: left alone, not recorded
    assert [w.name for w in kube.writes] == ["n1"]
    cached = applier.caches.nodes.store.get("n1")
    assert cached is not None and cached["metadata"]["annotations"][GUARD] == KEY


async def test_a_guard_whose_answer_was_lost_is_not_written_again() -> None:
    kube, applier = setup(arrived("n1"))
    kube.fail("patch", "Node", "n1", 500, applied=True)
    with pytest.raises(Exception):  # noqa: B017 (the lost answer reaches the reconcile)
        await applier.apply(NS, GuardScaleDown(KEY, ("n1",)))
    kube, applier = setup(kube.stored(NODE, "n1") or {})  # the next reconcile, fresh caches
    await applier.apply(NS, GuardScaleDown(KEY, ("n1",)))
    assert kube.writes == []
    assert notes_of(kube, "n1")[GUARD] == KEY


async def test_a_guard_that_conflicts_is_decided_again_on_the_node_read() -> None:
    kube, applier = setup(arrived("n1"))
    kube.fail("patch", "Node", "n1", 409)
    await applier.apply(NS, GuardScaleDown(KEY, ("n1",)))
    assert [c.verb for c in kube.calls] == ["patch", "get", "patch"]
    assert notes_of(kube, "n1")[SDD] == "true"


async def test_a_guard_refused_is_logged_and_the_next_node_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, applier = setup(arrived("n1"), arrived("n2"))
    kube.fail("patch", "Node", "n1", 403)
    await applier.apply(NS, GuardScaleDown(KEY, ("n1", "n2")))
    assert SDD not in notes_of(kube, "n1") and notes_of(kube, "n2")[GUARD] == KEY
    assert "scale-down guard of node n1 refused" in caplog.text


async def test_lifting_takes_off_only_what_gangcheck_set() -> None:
    kube, applier = setup(
        arrived("ours", **GUARDED),
        arrived("changed", **{SDD: "false", GUARD: KEY}),
        arrived("theirs", **{SDD: "true"}),
    )
    await applier.apply(NS, GuardScaleDown(KEY, ("ours", "changed", "theirs"), on=False))
    assert SDD not in notes_of(kube, "ours") and GUARD not in notes_of(kube, "ours")
    assert notes_of(kube, "changed")[SDD] == "false" and GUARD not in notes_of(kube, "changed")
    assert notes_of(kube, "theirs")[SDD] == "true"
    assert sorted(w.name for w in kube.writes) == ["changed", "ours"]


async def test_lifting_a_guard_changed_under_it_reads_the_node_and_keeps_the_new_value() -> None:
    """The test op fails (someone set "false" since the cache was filled): the node is read
    again and only the record goes."""
    kube, applier = setup(arrived("n1", **GUARDED))
    await kube.merge_patch(NODE, "n1", {"metadata": {"annotations": {SDD: "false"}}})
    kube.calls.clear()  # the caches (filled before) still say "true"
    await applier.apply(NS, GuardScaleDown(KEY, ("n1",), on=False))
    assert notes_of(kube, "n1")[SDD] == "false" and GUARD not in notes_of(kube, "n1")
    assert [c.verb for c in kube.calls] == ["patch", "get", "patch"]


async def test_the_safe_reclaim_takes_the_guard_off_first_even_from_a_node_it_keeps() -> None:
    """A kept node goes back to the pool by the reclaim; one a safety rule keeps (here: not
    proven younger than its request) stays, without the guard."""
    kube, _ = setup(arrived("n1", **GUARDED))
    target = Target("n1", KEY, NOW.isoformat().replace("+00:00", "Z"), "DeleteNode")
    result = await reclaim_safely(kube, target, NOW, settle_seconds=0)
    assert result.verdict == "keep"
    assert SDD not in notes_of(kube, "n1") and GUARD not in notes_of(kube, "n1")


async def test_the_safe_reclaim_keeps_someone_elses_guard() -> None:
    kube, _ = setup(arrived("n1", **{SDD: "true"}))
    target = Target("n1", KEY, NOW.isoformat().replace("+00:00", "Z"), "None")
    result = await reclaim_safely(kube, target, NOW, settle_seconds=0)
    assert result.verdict == "keep"
    assert notes_of(kube, "n1")[SDD] == "true"
    assert kube.writes == []
