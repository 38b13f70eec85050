"""The capacity-aware dispatcher's choice (gangcheck.logic.dispatch), as a table."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gangcheck.logic.dispatch import (
    DISPATCHER,
    Nomination,
    Outcome,
    SourceHistory,
    WorkerFacts,
    nominate,
)

DELIVERS = SourceHistory(deliveries=4, stockouts=0, last=Outcome.DELIVERED)
MOSTLY = SourceHistory(deliveries=3, stockouts=1, last=Outcome.DELIVERED)
STOCKED_OUT = SourceHistory(deliveries=3, stockouts=1, last=Outcome.STOCKOUT)
ALWAYS_OUT = SourceHistory(deliveries=0, stockouts=3, last=Outcome.STOCKOUT)
UNTRIED = SourceHistory()


@dataclass(frozen=True)
class Case:
    workers: tuple[WorkerFacts, ...]
    chosen: str | None
    reason: str
    current: str | None = None
    failed: tuple[str, ...] = ()


def w(name: str, *sources: SourceHistory, fits: bool = False, up: bool = True) -> WorkerFacts:
    return WorkerFacts(name, reachable=up, fits_now=fits, sources=sources)


CASES = {
    "fits now beats a source that delivers": Case(
        (w("a", DELIVERS), w("b", ALWAYS_OUT, fits=True)), "b", "fits now in b"
    ),
    "of two that fit now, by name": Case(
        (w("b", fits=True), w("a", ALWAYS_OUT, fits=True)), "a", "fits now in a"
    ),
    "a source that delivers lately beats one that last stocked out": Case(
        (w("a", STOCKED_OUT), w("b", MOSTLY)), "b", "delivered best lately"
    ),
    "a higher share of deliveries wins": Case(
        (w("a", MOSTLY), w("b", DELIVERS)), "b", "delivered best lately"
    ),
    "any open source of a worker counts": Case(
        (w("a", ALWAYS_OUT, DELIVERS), w("b", MOSTLY)), "a", "delivered best lately"
    ),
    "a source with no record is even odds: above a poor one, below a good one": Case(
        (w("a", UNTRIED), w("b", SourceHistory(1, 3, Outcome.DELIVERED))),
        "a",
        "delivered best lately",
    ),
    "no record at all: by name": Case((w("b"), w("a")), "a", "no record"),
    "all last stocked out: the one that did so least": Case(
        (w("a", ALWAYS_OUT), w("b", STOCKED_OUT)), "b", "did so least"
    ),
    "an unreachable worker is skipped, however good": Case(
        (w("a", fits=True, up=False), w("b", ALWAYS_OUT)), "b", "did so least"
    ),
    "one at a time: the current one is kept while it tries": Case(
        (w("a", fits=True), w("b", MOSTLY)), "b", "still trying", current="b"
    ),
    "next on failure: the current one failed": Case(
        (w("a", MOSTLY), w("b", DELIVERS)),
        "a",
        "b failed; a's capacity sources",
        current="b",
        failed=("b",),
    ),
    "a worker that failed before is not tried again": Case(
        (w("a", DELIVERS), w("b", MOSTLY)), "b", "delivered best lately", failed=("a",)
    ),
    "the current one unreachable: the next": Case(
        (w("a", MOSTLY), w("b", DELIVERS, up=False)), "a", "delivered best lately", current="b"
    ),
    "none left: every one failed or is unreachable": Case(
        (w("a", up=False), w("b")),
        None,
        "no worker left to try (unreachable: a; tried and failed: b)",
        failed=("b",),
    ),
    "none configured": Case((), None, "no worker cluster is configured"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_nominate(case: Case) -> None:
    got = nominate(case.workers, current=case.current, failed=case.failed)
    assert got.cluster == case.chosen
    assert case.reason in got.reason, got.reason


def test_the_nomination_is_one_cluster_or_none() -> None:
    assert Nomination("b", "").nominated == ["b"]
    assert Nomination(None, "").nominated == []


def test_the_dispatcher_name_is_not_kueues() -> None:
    assert not DISPATCHER.startswith("kueue.x-k8s.io/")
