"""The capacity-aware dispatcher's choice (gangcheck.logic.dispatch), as a table."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from gangcheck.logic.attempt.published import Outcome
from gangcheck.logic.dispatch import (
    DISPATCHER,
    FAILURE_MEMORY,
    KUBECONFIG_VALUES_MAX,
    RECORD_ANNOTATION,
    CheckWorkers,
    DispatchRecord,
    Nomination,
    SourceHistory,
    WorkerFacts,
    admission_status,
    cannot_deliver,
    check_workers,
    copy_of,
    decide,
    departed,
    describe,
    flavors_of,
    for_workload,
    kubeconfig_unused,
    left_to_another,
    nominate,
    nominated_by_another,
    nominated_by_kueue,
    recent_failures,
    same_capacity,
    unanswered,
    workers_for,
)
from gangcheck.telemetry import Metrics

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


# -- decide: the step over the Workload's record ----------------------------------------------


def failing(name: str, why: str, *sources: SourceHistory) -> WorkerFacts:
    return WorkerFacts(name, sources=sources, failure=why)


def down(name: str, why: str) -> WorkerFacts:
    return WorkerFacts(name, reachable=False, skip=why)


@dataclass(frozen=True)
class Step_:
    record: DispatchRecord
    workers: tuple[WorkerFacts, ...]
    nominated: tuple[str, ...]
    newly: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()
    at_once: int = 1


NONE = DispatchRecord()
ON_A = DispatchRecord(nominated=("a",), tried=("a",), reason="a's sources")

STEPS = {
    "first step: the one where the gang fits now, alone": Step_(
        NONE, (w("a", DELIVERS), w("b", fits=True)), ("b",), newly=("b",)
    ),
    "the one nominated is kept while it tries, even if another fits now": Step_(
        ON_A, (w("a", ALWAYS_OUT), w("b", fits=True)), ("a",)
    ),
    "its copy failed: given up, the next nominated": Step_(
        ON_A,
        (failing("a", "check Retry: rolled back"), w("b", MOSTLY)),
        ("b",),
        newly=("b",),
        fallbacks=("a",),
    ),
    "it became unreachable while nominated: given up, the next": Step_(
        ON_A, (down("a", "MultiKueueCluster not Active"), w("b")), ("b",), ("b",), ("a",)
    ),
    "silent while nominated, its first window: kept, waited for": Step_(
        ON_A,
        (
            WorkerFacts("a", reachable=False, skip="unreachable: no answer", patience=True),
            w("b", fits=True),
        ),
        ("a",),
    ),
    "silent again once that window ended: given up, the next": Step_(
        ON_A, (down("a", "unreachable: no answer"), w("b")), ("b",), ("b",), ("a",)
    ),
    "a worker given up before is never nominated again, even when it fits": Step_(
        DispatchRecord(("b",), ("a", "b"), {"a": "Rejected"}),
        (w("a", fits=True), failing("b", "evicted")),
        (),
        fallbacks=("b",),
    ),
    "nothing fits anywhere and every one failed: none, left queued": Step_(
        NONE, (down("a", "Secret kueue-system/a not found"), down("b", "no gangcheck")), ()
    ),
    "two at once when configured": Step_(
        NONE,
        (w("a", DELIVERS), w("b", MOSTLY), w("c", ALWAYS_OUT)),
        ("a", "b"),
        ("a", "b"),
        at_once=2,
    ),
    "two at once: one failed, one kept, one more": Step_(
        DispatchRecord(("a", "b"), ("a", "b")),
        (failing("a", "Retry"), w("b"), w("c")),
        ("b", "c"),
        ("c",),
        ("a",),
        at_once=2,
    ),
    "a worker no longer configured while nominated: given up": Step_(
        ON_A, (w("b"),), ("b",), ("b",), ("a",)
    ),
    "dropped from the config while nominated, its copy still there: kept, none beside it": Step_(
        ON_A, (WorkerFacts("a", unlisted=True), w("b", fits=True)), ("a",)
    ),
    "dropped from the config while nominated, no copy there: given up, the next": Step_(
        ON_A, (WorkerFacts("a", unlisted=True, copied=False), w("b")), ("b",), ("b",), ("a",)
    ),
    "dropped, its copy there, not read now: given up (not known)": Step_(
        ON_A, (WorkerFacts("a", unlisted=True, reachable=False), w("b")), ("b",), ("b",), ("a",)
    ),
    "a worker dropped from the config is never a candidate": Step_(
        NONE, (WorkerFacts("a", unlisted=True, fits_now=True), w("b")), ("b",), ("b",)
    ),
    "a record nominating two (hand-edited) keeps the first: never two at once unless set": Step_(
        DispatchRecord(("b", "a"), ("b", "a")), (w("a"), w("b")), ("b",)
    ),
    "... nor more than at once allows": Step_(
        DispatchRecord(("a", "b", "c"), ("a", "b", "c")),
        (w("a"), w("b"), w("c")),
        ("a", "b"),
        at_once=2,
    ),
    "a record nominating a thousand unknown workers gives up one, not a thousand": Step_(
        DispatchRecord(tuple(f"ghost-{i}" for i in range(1000))),
        (w("a"),),
        ("a",),
        ("a",),
        ("ghost-0",),
    ),
}


@pytest.mark.parametrize("case", STEPS.values(), ids=STEPS.keys())
def test_decide(case: Step_) -> None:
    step = decide(case.record, case.workers, at_once=case.at_once)
    assert step.nominated == case.nominated
    assert step.newly_nominated == case.newly
    assert tuple(sorted(step.fallbacks)) == case.fallbacks
    assert step.changed == bool(case.newly or case.fallbacks)
    assert step.record.nominated == case.nominated
    for cluster in case.fallbacks:
        assert cluster in step.record.failed
    assert set(case.record.tried) | set(case.nominated) == set(step.record.tried)


def test_decide_records_why_each_worker_was_skipped_and_the_choice() -> None:
    step = decide(NONE, (down("a", "unreachable: connection refused"), w("b", fits=True)))
    assert step.record.skipped == {"a": "unreachable: connection refused"}
    assert "fits now in b" in step.record.reason
    failed = decide(step.record, (w("a"), failing("b", "check Rejected")))
    assert failed.record.failed == {"b": "check Rejected"}
    assert failed.nominated == ("a",)
    assert failed.record.reason.startswith("given up: b (check Rejected); ")
    assert failed.record.tried == ("b", "a")


def test_a_restart_resumes_from_the_record_without_a_second_nomination() -> None:
    first = decide(NONE, (w("a", DELIVERS), w("b", MOSTLY)))
    again = DispatchRecord.from_annotation(first.record.to_annotation())
    assert again == first.record
    # the facts changed (b fits now), but a is still trying: kept, nothing newly nominated
    step = decide(again, (w("a", DELIVERS), w("b", fits=True)))
    assert step.nominated == ("a",)
    assert not step.changed


def test_an_unreadable_record_reads_as_none() -> None:
    assert DispatchRecord.from_annotation(None) == DispatchRecord()
    assert DispatchRecord.from_annotation("[1]").nominated == ()
    assert "unreadable" in DispatchRecord.from_annotation("{").reason


HAND_EDITED = {
    "a map of failures written as a list reads as none": (
        {"nominated": ["a"], "failed": ["a"]},
        DispatchRecord(nominated=("a",)),
    ),
    "a lone name nominated reads as that one": (
        {"nominated": "a-1"},
        DispatchRecord(("a-1",)),
    ),
    "a number nominated reads as none": ({"nominated": 5, "tried": {"a": 1}}, NONE),
    "a name twice, or not a string, reads once": (
        {"nominated": ["a", "a", 7, None, ""], "tried": ["a", "b", "a"]},
        DispatchRecord(("a",), ("a", "b")),
    ),
    "maps of anything but maps read as none": (
        {"skipped": "a", "failedAt": [1], "nominatedAt": 3},
        NONE,
    ),
}


@pytest.mark.parametrize(("data", "read"), HAND_EDITED.values(), ids=HAND_EDITED.keys())
def test_a_hand_edited_record_reads_as_what_it_says_never_raising(
    data: dict[str, object], read: DispatchRecord
) -> None:
    got = DispatchRecord.from_annotation(json.dumps(data))
    assert got == read
    decide(got, (w("a"), w("b")), now=NOW)  # and a step can be taken on it


def test_a_nomination_time_far_in_the_future_is_stamped_again() -> None:
    """A ``nominatedAt`` of year 9999 (hand-edited) would keep the word on a copy Kueue does
    not make from ever being said; it is read as unreadable and the worker kept is stamped
    now, as one nominated without a time."""
    record = DispatchRecord(("a",), ("a",), nominated_at={"a": "9999-01-01T00:00:00Z"})
    step = decide(record, (WorkerFacts("a", copied=False),), now=NOW)
    assert step.record.nominated_at == {"a": "2026-01-01T12:00:00Z"}
    later = decide(step.record, (WorkerFacts("a", copied=False),), now=NOW + timedelta(minutes=1))
    assert "Kueue has not copied the Workload" in later.record.reason


def test_a_time_without_its_zone_in_a_record_is_unreadable_not_an_error() -> None:
    """Every time gangcheck writes ends in Z; one hand-written without a zone cannot be
    compared with now (TypeError, which ended the dispatcher's pass for every Workload)."""
    naive = "2026-01-01T11:59:00"
    record = DispatchRecord.from_annotation(
        json.dumps(
            {
                "nominated": ["a"],
                "failed": {"b": "Retry"},
                "failedAt": {"b": naive},
                "nominatedAt": {"a": naive},
            }
        )
    )
    assert recent_failures([record], NOW) == {}
    copy_missing = WorkerFacts("a", copied=False)
    step = decide(record, (copy_missing, w("b")), now=NOW)
    assert step.nominated == ("a",)


def test_the_dispatch_metrics_are_exposed() -> None:
    metrics = Metrics()
    metrics.dispatch_nomination("worker-1")
    metrics.dispatch_fallback("worker-1")
    metrics.dispatch_nomination("worker-2")
    metrics.dispatch_clusters_tried(2)
    metrics.dispatch_round()
    text = metrics.render()
    assert "gangcheck_dispatch_rounds_total 1" in text
    assert 'gangcheck_dispatch_nominations_total{cluster="worker-2"} 1' in text
    assert 'gangcheck_dispatch_fallbacks_total{cluster="worker-1"} 1' in text
    assert "gangcheck_dispatch_clusters_per_gang_count 1" in text


def test_the_cli_runs_the_dispatcher_role_on_a_lease_of_its_own() -> None:
    from gangcheck.cli import DISPATCHER_LEASE, _parser

    args = _parser().parse_args(["run", "--role", "dispatcher", "--dispatch-at-once", "2"])
    assert (args.role, args.dispatch_at_once) == ("dispatcher", 2)
    assert _parser().parse_args(["run"]).role == "controller"
    assert DISPATCHER_LEASE == "gangcheck-dispatcher"  # as manifests/dispatcher/rbac.yaml names it


def test_diagnose_says_who_is_tried_and_why_others_are_not() -> None:
    record = DispatchRecord(
        nominated=("b",),
        tried=("a", "b"),
        failed={"a": "check Retry"},
        skipped={"c": "unreachable: connection refused"},
        reason="a failed; the gang fits now in b",
    )
    assert describe(record) == [
        "trying b: a failed; the gang fits now in b",
        "given up: a (check Retry)",
        "skipped: c (unreachable: connection refused)",
    ]
    assert describe(DispatchRecord(reason="no worker left to try (unreachable: a)")) == [
        "no worker nominated: no worker left to try (unreachable: a)"
    ]


# -- a stockout seen, remembered, and the gangs just nominated --------------------------------

LATELY = "its capacity source cannot deliver (CapacityIsNotFound)"


def wf(name: str, *, pending: int = 0, lately: str = "", fits: bool = False) -> WorkerFacts:
    return WorkerFacts(name, fits_now=fits, pending=pending, lately_failed=lately)


MORE = {
    "a worker given up lately for another gang is tried after the others": Case(
        (wf("a", lately=LATELY), wf("b")), "b", "no record"
    ),
    "... and the reason says why the first by name was not": Case(
        (wf("a", lately=LATELY), wf("b")),
        "b",
        f"tried by name; after a, given up lately for another gang ({LATELY})",
    ),
    "... a long why cut": Case(
        (wf("a", lately="x" * 600), wf("b")), "b", f"another gang ({'x' * 157}...)"
    ),
    "... even after one with more gangs pending": Case(
        (wf("a", lately=LATELY), wf("b", pending=3)), "b", "3 other gang(s) pending there"
    ),
    "... but still tried when every one was": Case(
        (wf("a", lately=LATELY), wf("b", lately="check gpu Retry")), "a", "given up lately"
    ),
    "... and fitting now beats it all": Case(
        (wf("a", lately=LATELY, fits=True), wf("b")), "a", "fits now in a"
    ),
    "a burst is spread: fewer gangs pending there first": Case(
        (wf("a", pending=1), wf("b")), "b", "no record"
    ),
    "pending counts after a source open": Case(
        (WorkerFacts("a", sources=(ALWAYS_OUT,)), wf("b", pending=1)), "b", "pending there"
    ),
    "the reason names a worker passed over for its sources' last stockout": Case(
        (WorkerFacts("a", sources=(ALWAYS_OUT,)), wf("b")),
        "b",
        "tried by name; after a, whose capacity sources last stocked out for such gangs",
    ),
    "... after one given up lately, each said once": Case(
        (
            wf("a", lately=LATELY),
            WorkerFacts("b", sources=(STOCKED_OUT,), lately_failed=LATELY),
            WorkerFacts("c", sources=(STOCKED_OUT,)),
            WorkerFacts("d", sources=(DELIVERS,)),
        ),
        "d",
        f"after a, b, given up lately for another gang ({LATELY}); after c, whose capacity"
        " sources last stocked out for such gangs",
    ),
}


@pytest.mark.parametrize("case", MORE.values(), ids=MORE.keys())
def test_nominate_with_stockouts_remembered_and_gangs_pending(case: Case) -> None:
    test_nominate(case)


def test_no_worker_is_named_passed_over_when_the_one_chosen_was_given_up_lately_too() -> None:
    for workers in (
        (wf("a", lately=LATELY), wf("b", lately=LATELY)),
        (wf("a", lately=LATELY), wf("b", fits=True)),
        (WorkerFacts("a", sources=(ALWAYS_OUT,)), WorkerFacts("b", sources=(STOCKED_OUT,))),
        (WorkerFacts("a", sources=(ALWAYS_OUT,)), wf("b", fits=True)),
    ):
        reason = nominate(workers).reason
        assert "after" not in reason, reason


NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_a_worker_whose_source_cannot_deliver_is_given_up_at_once_and_stamped() -> None:
    step = decide(ON_A, (failing("a", LATELY), w("b")), now=NOW)
    assert step.nominated == ("b",)  # never two at once: a given up, b nominated
    assert step.record.failed == {"a": LATELY}
    assert step.record.failed_at == {"a": "2026-01-01T12:00:00Z"}
    again = DispatchRecord.from_annotation(step.record.to_annotation())
    assert again == step.record


RECENT = {
    "within the memory: remembered with its reason": (60.0, {"a": "CapacityIsNotFound"}),
    "older than the memory: forgotten": (200.0, {}),
    "a little in the future (another replica's clock): remembered": (
        -10.0,
        {"a": "CapacityIsNotFound"},
    ),
    "far in the future (hand-edited): unreadable, not remembered for ever": (-1e9, {}),
}


@pytest.mark.parametrize(("age", "wanted"), RECENT.values(), ids=RECENT.keys())
def test_recent_failures(age: float, wanted: dict[str, str]) -> None:
    stamp = (NOW - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    records = [
        DispatchRecord(failed={"a": "CapacityIsNotFound"}, failed_at={"a": stamp}),
        DispatchRecord(failed={"b": "Retry"}),  # no stamp (written before): not counted
        DispatchRecord(failed={"a": "x"}, failed_at={"a": "not a time"}),
    ]
    assert recent_failures(records, NOW, memory=FAILURE_MEMORY) == wanted


def request(
    *conds: dict[str, str], source: int | None = None, sources: int = 0
) -> dict[str, object]:
    notes: dict[str, str] = {}
    if source is not None:
        notes["gangcheck.io/capacity-source"] = str(source)
    if sources:
        notes["gangcheck.io/attempt-config"] = json.dumps(
            {"capacitySources": [{"name": f"s{i}"} for i in range(sources)]}
        )
    return {"metadata": {"annotations": notes}, "status": {"conditions": list(conds)}}


NOT_FOUND = {"type": "Provisioned", "status": "False", "reason": "CapacityIsNotFound"}
FAILED = {"type": "Failed", "status": "True", "reason": "CapacityIsNotFound", "message": "m"}
ACCEPTED = {"type": "Accepted", "status": "True", "reason": "Accepted"}
PROVISIONED = {"type": "Provisioned", "status": "True", "reason": "CapacityIsProvisioned"}

CANNOT = {
    "no request yet: trying": ((), ""),
    "accepted: trying": ((request(ACCEPTED),), ""),
    "provisioned: delivering": ((request(ACCEPTED, PROVISIONED),), ""),
    "CapacityIsNotFound, one source": ((request(ACCEPTED, NOT_FOUND),), "CapacityIsNotFound"),
    "Failed=True": ((request(FAILED),), "Failed: CapacityIsNotFound: m"),
    "CapacityIsNotFound on a first source of two: gangcheck moves on there": (
        (request(NOT_FOUND, source=0, sources=2),),
        "",
    ),
    "CapacityIsNotFound on the last of two": (
        (request(NOT_FOUND, source=1, sources=2),),
        "CapacityIsNotFound",
    ),
    "one of two racers still trying": (
        (request(NOT_FOUND, source=1, sources=2), request(ACCEPTED, source=0, sources=2)),
        "",
    ),
}


@pytest.mark.parametrize(("requests", "said"), CANNOT.values(), ids=CANNOT.keys())
def test_cannot_deliver(requests: tuple[dict[str, object], ...], said: str) -> None:
    got = cannot_deliver(requests)
    assert (said in got) if said else got == "", got


# -- the nomination's apply keeps every field of kueue-admission -----------------------------------

QUOTA = {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "m"}
PODS_READY = {"type": "PodsReady", "status": "False", "reason": "PodsReady", "message": "m"}
MK_CHECK = {"name": "multikueue", "state": "Pending", "message": ""}
ADMISSION = {"clusterQueue": "cq", "podSetAssignments": [{"name": "main", "count": 2}]}

APPLY = {
    "reserved: admission, its conditions and checks kept, requests emptied": (
        {
            "admission": ADMISSION,
            "conditions": [QUOTA, PODS_READY],
            "admissionChecks": [MK_CHECK],
            "resourceRequests": [{"name": "main"}],
            "requeueState": {"count": 1},
        },
        ["worker-2"],
        {
            "admission": ADMISSION,
            "resourceRequests": [],
            "requeueState": {"count": 1},
            "conditions": [QUOTA],
            "admissionChecks": [MK_CHECK],
            "nominatedClusterNames": ["worker-2"],
        },
    ),
    "not reserved: its requests kept, an empty requeue state left out": (
        {"resourceRequests": [{"name": "main"}], "requeueState": {}},
        [],
        {"resourceRequests": [{"name": "main"}], "nominatedClusterNames": []},
    ),
    "evictions' stats, cluster name, gates and execution time kept": (
        {
            "schedulingStats": {"evictions": [{"reason": "x", "count": 1}]},
            "clusterName": "worker-1",
            "preemptionGates": [],
            "unhealthyNodes": [{"name": "n1"}],
            "accumulatedPastExecutionTimeSeconds": 3,
        },
        ["worker-1"],
        {
            "schedulingStats": {"evictions": [{"reason": "x", "count": 1}]},
            "clusterName": "worker-1",
            "preemptionGates": [],
            "unhealthyNodes": [{"name": "n1"}],
            "accumulatedPastExecutionTimeSeconds": 3,
            "nominatedClusterNames": ["worker-1"],
        },
    ),
}


@pytest.mark.parametrize(("status", "nominated", "applied"), APPLY.values(), ids=APPLY.keys())
def test_the_nomination_applies_every_field_kueue_admission_owns(
    status: dict[str, object], nominated: list[str], applied: dict[str, object]
) -> None:
    assert admission_status(status, nominated) == applied


def test_a_nominated_worker_whose_copy_is_admitted_is_recorded_and_kept() -> None:
    record = DispatchRecord(nominated=("w2",), tried=("w1", "w2"), failed={"w1": "x"})
    step = decide(record, [WorkerFacts("w1"), WorkerFacts("w2", admitted=True)])
    assert step.nominated == ("w2",)
    assert step.record.admitted == "w2"
    assert not step.changed  # nothing to tell: only the record to write
    assert DispatchRecord.from_annotation(step.record.to_annotation()) == step.record
    assert "admitted in w2: MultiKueue places the gang there" in describe(step.record)
    # a worker not nominated is never recorded as admitted
    other = decide(DispatchRecord(nominated=("w1",)), [WorkerFacts("w2", admitted=True)])
    assert not other.record.admitted


@pytest.mark.parametrize(
    ("waited", "copied", "stalled"),
    [(31.0, False, True), (10.0, False, False), (31.0, True, False)],
    ids=["no copy past the grace: said", "no copy yet: still trying", "copied: trying"],
)
def test_a_nominated_worker_kueue_does_not_copy_to_is_said_and_kept(
    waited: float, copied: bool, stalled: bool
) -> None:
    """Kueue v0.17 copies no Workload of a MultiKueue check while a worker it counts connected
    does not answer (a Secret pointing nowhere): the nominated worker never gets its copy.
    Past COPY_GRACE the reason (and diagnose) says so; the worker stays nominated (another
    would get no copy either) and nothing is written again afterwards (the reason is stable)."""
    first = decide(DispatchRecord(), [WorkerFacts("b", fits_now=True)], now=NOW)
    assert first.record.nominated_at == {"b": "2026-01-01T12:00:00Z"}
    later = NOW + timedelta(seconds=waited)
    step = decide(first.record, [WorkerFacts("b", copied=copied)], now=later)
    assert step.nominated == ("b",)
    assert step.record.nominated_at == first.record.nominated_at
    said = "b nominated at 2026-01-01T12:00:00Z, and Kueue has not copied the Workload there"
    assert (said in step.record.reason) == stalled, step.record.reason
    assert (said in describe(step.record)[0]) == stalled
    assert DispatchRecord.from_annotation(step.record.to_annotation()) == step.record
    again = decide(step.record, [WorkerFacts("b", copied=copied)], now=later + timedelta(seconds=1))
    assert again.record == step.record


FITS_B = "the gang fits now in b, on nodes that exist or are reserved"
STALL_B = (
    "b nominated at 2026-01-01T12:00:00Z, and Kueue has not copied the Workload there: is "
    "the Workload's namespace missing there (Kueue cannot create the copy), or is MultiKueue "
    "stuck on another worker it counts connected that does not answer (a kubeconfig Secret "
    "pointing nowhere)?"
)
#: The wait as releases before the namespace was named wrote it: read back the same way.
STALL_B_EARLIER = (
    "b nominated at 2026-01-01T12:00:00Z, and Kueue has not copied the Workload there: is "
    "MultiKueue stuck on another worker it counts connected that does not answer (a kubeconfig "
    "Secret pointing nowhere)?"
)
#: (seconds after the nomination, whether b has Kueue's copy, the reason wanted then)
COPY_LATE = {
    "copied late: the choice's reason again, then stable": (
        (31.0, False, f"{FITS_B}; {STALL_B}"),
        (40.0, True, FITS_B),
        (41.0, True, FITS_B),
    ),
    "the copy gone again past the grace: said again": (
        (31.0, False, f"{FITS_B}; {STALL_B}"),
        (40.0, True, FITS_B),
        (80.0, False, f"{FITS_B}; {STALL_B}"),
    ),
    "copied before the grace: never said": (
        (10.0, False, FITS_B),
        (20.0, True, FITS_B),
        (60.0, True, FITS_B),
    ),
}


@pytest.mark.parametrize("timeline", COPY_LATE.values(), ids=COPY_LATE.keys())
def test_the_copy_wait_reason_follows_whether_kueue_copied_the_workload(
    timeline: tuple[tuple[float, bool, str], ...],
) -> None:
    """The reason is derived again at each step from the copy now: once Kueue copies the
    Workload (its stuck worker answered again), the record says why b was chosen, as before
    the wait, not that Kueue has not copied it; diagnose (``describe``) says the same."""
    record = decide(DispatchRecord(), [WorkerFacts("b", fits_now=True)], now=NOW).record
    assert record.reason == FITS_B
    for waited, copied, wanted in timeline:
        step = decide(
            record, [WorkerFacts("b", copied=copied)], now=NOW + timedelta(seconds=waited)
        )
        assert step.nominated == ("b",)
        assert not step.changed  # nothing to tell: b stays nominated, only the record
        assert step.record.reason == wanted, (waited, copied)
        assert describe(step.record)[0] == f"trying b: {wanted}"
        assert DispatchRecord.from_annotation(step.record.to_annotation()) == step.record
        record = step.record


def test_a_copy_wait_an_earlier_release_wrote_is_said_as_now() -> None:
    """A record holding the wait as an earlier release worded it: the choice's reason is kept,
    the wait said again as now (once), and gone once Kueue copies the Workload."""
    earlier = DispatchRecord(
        nominated=("b",),
        tried=("b",),
        reason=f"{FITS_B}; {STALL_B_EARLIER}",
        nominated_at={"b": "2026-01-01T12:00:00Z"},
    )
    later = NOW + timedelta(seconds=60)
    still = decide(earlier, [WorkerFacts("b", copied=False)], now=later).record.reason
    assert still == f"{FITS_B}; {STALL_B}"
    assert decide(earlier, [WorkerFacts("b")], now=later).record.reason == FITS_B


def test_a_copy_wait_said_alone_by_an_earlier_record_is_cleared_once_copied() -> None:
    """A record written before the wait was added to the choice's reason holds the wait alone
    as its reason: once the copy is there, b is said to be trying, as of a worker kept."""
    earlier = DispatchRecord(
        nominated=("b",), tried=("b",), reason=STALL_B, nominated_at={"b": "2026-01-01T12:00:00Z"}
    )
    later = NOW + timedelta(seconds=60)
    assert decide(earlier, [WorkerFacts("b")], now=later).record.reason == "b is still trying"
    still = decide(earlier, [WorkerFacts("b", copied=False)], now=later).record.reason
    assert still == f"b is still trying; {STALL_B}"


BLOCKERS = {
    "a token revoked": (
        "credentials refused (401: the token or client certificate of its kubeconfig Secret "
        "expired, was revoked or is not this cluster's): GET /apis/...: 401 Unauthorized",
        ("a",),
    ),
    "a server that answers nothing": ("unreachable: GET /apis/...: 0 ConnectionError", ("a",)),
    "not Active for Kueue: not counted connected, not named": (
        "MultiKueueCluster not Active (ClientConnectionFailed: ...)",
        (),
    ),
    "no gangcheck there: Kueue reads it fine, not named": (
        "no AdmissionCheck of gangcheck.io/atomic-provisioning Active: no gangcheck there",
        (),
    ),
}


@pytest.mark.parametrize(("skip", "named"), BLOCKERS.values(), ids=BLOCKERS.keys())
def test_the_copy_wait_names_the_workers_kueue_counts_connected_that_cannot_be_read(
    skip: str, named: tuple[str, ...]
) -> None:
    """Kueue v0.17 reads the copy in every worker of the check it counts connected (its
    MultiKueueCluster Active, which the dispatcher's own reads come after) and stops at the
    first error before copying anywhere (readGroup): a worker whose token was revoked, its
    watches still open (Active), blocks the gang nominated to b. The wait names it (stable:
    its reason is in ``skipped``), and drops the name once it reads again. Before, it asked
    whether a Secret pointed nowhere, naming no worker."""
    record = decide(DispatchRecord(), [WorkerFacts("b", fits_now=True)], now=NOW).record
    blocked = [WorkerFacts("a", reachable=False, skip=skip), WorkerFacts("b", copied=False)]
    later = NOW + timedelta(seconds=31)
    step = decide(record, blocked, now=later)
    head = "b nominated at 2026-01-01T12:00:00Z, and Kueue has not copied the Workload there"
    assert step.record.reason.startswith(f"{FITS_B}; {head}"), step.record.reason
    if named:
        assert step.record.reason == (
            f"{FITS_B}; {head}: Kueue copies no Workload of the check while a worker it counts "
            "connected (its MultiKueueCluster Active) cannot be read, and a is (skipped, "
            "below): mend its kubeconfig Secret, or take it off the MultiKueueConfig"
        ), step.record.reason
    else:
        assert step.record.reason == f"{FITS_B}; {STALL_B}", step.record.reason
    again = decide(step.record, blocked, now=later + timedelta(seconds=1))
    assert again.record == step.record  # stable: written once
    mended = [WorkerFacts("a"), WorkerFacts("b", copied=False)]
    assert decide(step.record, mended, now=later).record.reason == f"{FITS_B}; {STALL_B}"
    copied = [WorkerFacts("a"), WorkerFacts("b")]
    assert decide(step.record, copied, now=later).record.reason == FITS_B


def test_the_last_worker_given_up_is_said_once_not_again_at_the_next_step() -> None:
    """The last worker left fails: it is given up (a fallback) and nothing is left. The
    record's reason is the same at that step and at the next, so the next writes nothing and
    tells nothing. Before, the step of the fallback said 'given up: b (...); no worker left
    to try (...)' and the next 'no worker left to try (...)': the record written again and a
    second NoWorker Event (seen on the bed, a gang that fits nowhere)."""
    record = DispatchRecord(nominated=("b",), tried=("a", "b"), failed={"a": "stockout"})
    workers = [WorkerFacts("a"), WorkerFacts("b", failure="check gpu Retry: no room")]
    step = decide(record, workers, now=NOW)
    assert step.nominated == () and step.fallbacks == {"b": "check gpu Retry: no room"}
    assert step.record.reason == (
        "no worker left to try (tried and failed: a, b); round 2 at 2026-01-01T12:01:00Z"
    )
    later = decide(step.record, [WorkerFacts("a"), WorkerFacts("b")], now=NOW)
    assert later.record == step.record
    assert not later.changed


# -- a nomination written by another dispatcher -----------------------------------------------


def owner(manager: str, *, status_field: str = "f:nominatedClusterNames") -> dict[str, object]:
    return {
        "manager": manager,
        "operation": "Update",
        "subresource": "status",
        "fieldsV1": {"f:status": {status_field: {}}},
    }


OWNERS = {
    "Kueue's own manager (as which gangcheck writes too): none other": (
        [owner("kueue-admission")],
        "",
    ),
    "another manager owning the nomination": (
        [owner("kueue-admission", status_field="f:admission"), owner("their-dispatcher")],
        "their-dispatcher",
    ),
    "another manager owning other status fields only: none": (
        [owner("their-controller", status_field="f:conditions")],
        "",
    ),
    "Kueue's merge patch (its user agent, under WorkloadRequestUseMergePatch): none other": (
        [owner("kueue")],
        "",
    ),
    "no managed fields": ([], ""),
    "managed fields not as the API serves them": ("garbage", ""),
}


@pytest.mark.parametrize(("fields", "who"), OWNERS.values(), ids=OWNERS.keys())
def test_nominated_by_another(fields: object, who: str) -> None:
    assert nominated_by_another({"managedFields": fields}) == who


def test_a_nomination_of_another_dispatcher_is_left_as_written_and_said_once() -> None:
    """Another dispatcher's nomination is not overwritten (each rewriting the other's would
    loop, a pass woken by each write); the record says who wrote it, once."""
    step = left_to_another(ON_A, ["c"], "their-dispatcher")
    assert step.nominated == ("c",)
    assert not step.changed
    assert step.record.nominated == ()  # gangcheck nominates none while it stands
    assert step.record.tried == ON_A.tried
    assert describe(step.record)[0] == (
        "no worker nominated: nominated c by their-dispatcher, not by gangcheck: left as written"
    )
    assert step.record.reason == (
        "nominated c by their-dispatcher, not by gangcheck: left as written"
    )
    assert left_to_another(step.record, ["c"], "their-dispatcher").record == step.record


# -- the workers of a Workload's MultiKueue checks --------------------------------------------


def mk_check(name: str, config: str | None, *, kind: str = "MultiKueueConfig") -> dict[str, object]:
    spec: dict[str, object] = {"controllerName": "kueue.x-k8s.io/multikueue"}
    if config is not None:
        spec["parameters"] = {"apiGroup": "kueue.x-k8s.io", "kind": kind, "name": config}
    return {"metadata": {"name": name}, "spec": spec}


def mk_config(name: str, *clusters: object) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"clusters": list(clusters)}}


CHECKS = [
    mk_check("team-a", "a"),
    mk_check("team-b", "b"),
    mk_check("no-params", None),
    mk_check("other-kind", "a", kind="ProvisioningRequestConfig"),
    mk_check("gone", "missing"),
    {"metadata": {"name": "gpu"}, "spec": {"controllerName": "gangcheck.io/atomic-provisioning"}},
]
CONFIGS = [mk_config("a", "w1", "w2"), mk_config("b", "w2", "w3", 7)]

WORKERS_FOR = {
    "one check: its config's clusters": (("team-a",), CheckWorkers(("w1", "w2"))),
    "two checks: both configs', each cluster once": (
        ("team-b", "team-a"),
        CheckWorkers(("w1", "w2", "w3")),
    ),
    "a check naming no config: none, said why": (
        ("no-params",),
        CheckWorkers(problem="AdmissionCheck no-params names no MultiKueueConfig"),
    ),
    "a check naming another kind: none": (
        ("other-kind",),
        CheckWorkers(problem="AdmissionCheck other-kind names no MultiKueueConfig"),
    ),
    "a config not found: none, said why": (
        ("gone",),
        CheckWorkers(problem="MultiKueueConfig missing of gone not found"),
    ),
    "a config not found beside one found: the found one's": (
        ("gone", "team-a"),
        CheckWorkers(("w1", "w2")),
    ),
    "a check not MultiKueue's: none": (("gpu",), CheckWorkers()),
}


@pytest.mark.parametrize(("names", "wanted"), WORKERS_FOR.values(), ids=WORKERS_FOR.keys())
def test_workers_for(names: tuple[str, ...], wanted: CheckWorkers) -> None:
    assert workers_for(names, check_workers(CHECKS, CONFIGS)) == wanted


def test_no_worker_configured_says_why() -> None:
    step = decide(NONE, (), unconfigured="MultiKueueConfig x of mk not found")
    assert step.nominated == ()
    assert step.record.reason == (
        "no worker cluster is configured (MultiKueueConfig x of mk not found)"
    )


def test_a_record_naming_none_reads_the_nomination_written_on_the_workload() -> None:
    """A record lost or unreadable (hand-edited) while ``a`` is nominated and trying: ``a``
    is kept, not replaced by ``b`` where the gang fits now (Kueue would copy it there while
    ``a``'s gangcheck still scales up, until the copy there is removed)."""
    unreadable = DispatchRecord.from_annotation("{")
    step = decide(unreadable, (w("a"), w("b", fits=True)), written=["a"], now=NOW)
    assert step.nominated == ("a",)
    assert not step.newly_nominated
    assert step.record.nominated == ("a",) and step.record.tried == ("a",)
    given_up = DispatchRecord(failed={"a": "Retry"})  # written, but given up: not kept
    assert decide(given_up, (w("a"), w("b", fits=True)), written=["a"]).nominated == ("b",)


def _copy(*conditions: str, checks: list[dict[str, str]] | None = None) -> dict[str, object]:
    return {
        "status": {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "admissionChecks": checks
            if checks is not None
            else [{"name": "gpu", "state": "Pending", "message": ""}],
        }
    }


@pytest.mark.parametrize(
    ("copy", "requests", "expected"),
    [
        (_copy("QuotaReserved"), [], True),
        (_copy(), [], False),  # no quota there yet: waiting on the worker's queue, not gangcheck
        (_copy("QuotaReserved"), [{"metadata": {"name": "r"}}], False),  # a request made
        (_copy("QuotaReserved", "Admitted"), [], False),
        (
            _copy("QuotaReserved", checks=[{"name": "gpu", "state": "Pending", "message": "x"}]),
            [],
            False,  # gangcheck said something on its check
        ),
        (_copy("QuotaReserved", checks=[{"name": "gpu", "state": "Ready"}]), [], False),
        (_copy("QuotaReserved", checks=[{"name": "other", "state": "Pending"}]), [], False),
        (
            _copy(
                "QuotaReserved",
                checks=[
                    {"name": "gpu", "state": "Pending"},
                    {"name": "other", "state": "Pending"},
                ],
            ),
            [],
            True,  # another controller's check waiting too says nothing of gangcheck
        ),
    ],
)
def test_a_copy_left_untouched_by_gangcheck(
    copy: dict[str, object], requests: list[dict[str, object]], expected: bool
) -> None:
    assert unanswered(copy, ["gpu"], requests) is expected


def test_a_record_counts_only_for_the_workload_it_was_written_for() -> None:
    """A Workload made again under its name from a saved manifest carries the earlier one's
    record: set aside, said so; a record written before records named a uid is stamped."""
    mine = DispatchRecord(("a",), ("b", "a"), {"b": "Retry"}, uid="u1")
    assert for_workload(mine, "u1") == mine
    assert for_workload(replace(mine, uid=""), "u1") == mine
    fresh = for_workload(mine, "u2")
    assert fresh.nominated == () and fresh.tried == () and not fresh.failed
    assert fresh.uid == "u2" and "(uid u1) set aside" in fresh.reason
    assert DispatchRecord.from_annotation(mine.to_annotation()) == mine
    step = decide(fresh, (w("a"), w("b", fits=True)), now=NOW)
    assert step.nominated == ("b",) and step.record.uid == "u2"
    assert step.record.reason.startswith("the record of an earlier Workload")


def test_a_set_aside_record_is_said_once_while_no_worker_is_nominated() -> None:
    """A Workload made again under its name, no worker to nominate (none fits, none
    configured): the reason says the earlier record was set aside once, pass after pass.
    Before, each pass put the whole reason before the new one ('set aside; no worker ...;
    no worker ...'): the record changed at every pass (written again, a NoWorker Event each
    time) and grew by a clause each, towards the Workload's 256 KiB of annotations."""
    fresh = for_workload(DispatchRecord(("a",), ("a",), uid="u1"), "u2")
    first = decide(fresh, (), now=NOW, unconfigured="no MultiKueueConfig lists a worker")
    assert first.nominated == () and first.record.reason.startswith(fresh.reason)
    again = decide(first.record, (), now=NOW, unconfigured="no MultiKueueConfig lists a worker")
    assert again.record == first.record
    full = decide(first.record, (w("a", fits=False),), now=NOW)  # another reason now
    assert full.record.reason.startswith(f"{fresh.reason}; ")
    assert full.record.reason.count("set aside") == 1
    assert decide(full.record, (w("a", fits=False),), now=NOW).record == full.record


def test_a_workers_copy_is_the_workloads_when_its_record_names_its_uid_or_none() -> None:
    def copy(record: DispatchRecord | None) -> dict[str, object]:
        notes = {RECORD_ANNOTATION: record.to_annotation()} if record else {}
        return {"metadata": {"name": "g", "annotations": notes}}

    assert copy_of(copy(DispatchRecord(("a",), uid="u1")), "u1")
    assert not copy_of(copy(DispatchRecord(("a",), uid="u0")), "u1")
    assert copy_of(copy(DispatchRecord(("a",))), "u1")  # written before records named one
    assert copy_of(copy(None), "u1")


KUEUE_NOMINATIONS = {
    "every worker (AllAtOnce)": (ON_A, ["a", "b"], 1, True),
    "a worker gangcheck never tried for the gang": (ON_A, ["b"], 1, True),
    "gangcheck's own nomination": (ON_A, ["a"], 1, False),
    "two at once, as gangcheck wrote them, in another order": (
        DispatchRecord(("a", "b"), ("a", "b")),
        ["b", "a"],
        2,
        False,
    ),
    "one nominated before (gangcheck stopped between record and nomination)": (
        DispatchRecord(("b",), ("a", "b"), {"a": "Retry"}),
        ["a"],
        1,
        False,
    ),
    "no record yet, one worker (a record lost: read as nominated)": (NONE, ["a"], 1, False),
    "gangcheck's two, written under --dispatch-at-once 2, now 1": (
        DispatchRecord(("a", "b"), ("a", "b")),
        ["a", "b"],
        1,
        False,
    ),
    "no record yet, more than at once": (NONE, ["a", "b"], 1, True),
    "nothing written": (ON_A, [], 1, False),
}


@pytest.mark.parametrize(
    ("record", "written", "at_once", "kueues"), KUEUE_NOMINATIONS.values(), ids=KUEUE_NOMINATIONS
)
def test_a_nomination_kueue_wrote_itself_is_told_from_gangchecks(
    record: DispatchRecord, written: list[str], at_once: int, kueues: bool
) -> None:
    assert nominated_by_kueue(record, written, at_once=at_once) is kueues


ON_A_IN_X = replace(ON_A, identities={"a": "x"})
#: A gang nominated to a, and which cluster a reaches now: (record, a's identity now, whether
#: a is given up as re-pointed, the identities recorded after the step).
REPOINTINGS = {
    "the same cluster": (ON_A_IN_X, "x", False, {"a": "x"}),
    "another cluster": (ON_A_IN_X, "y", True, {"b": "z"}),
    "not known now (not granted, not read)": (ON_A_IN_X, "", False, {"a": "x"}),
    "none recorded (nominated by a release before, or not known then): recorded now": (
        ON_A,
        "y",
        False,
        {"a": "y"},
    ),
    "none recorded, not known now": (ON_A, "", False, {}),
}


@pytest.mark.parametrize(
    ("record", "now", "given_up", "identities"), REPOINTINGS.values(), ids=REPOINTINGS
)
def test_a_worker_re_pointed_since_it_was_nominated_is_given_up(
    record: DispatchRecord, now: str, given_up: bool, identities: dict[str, str]
) -> None:
    step = decide(record, (WorkerFacts("a", identity=now), WorkerFacts("b", identity="z")))
    assert step.nominated == (("b",) if given_up else ("a",))
    assert ("a" in step.fallbacks) is given_up
    if given_up:
        assert step.record.failed["a"].startswith(
            "re-pointed: its MultiKueueCluster now reaches another cluster (kube-system uid y; "
            "nominated when it reached uid x): Kueue's copy of this Workload"
        )
    assert step.record.identities == identities
    again = DispatchRecord.from_annotation(step.record.to_annotation())
    assert again == step.record


#: A record as the previous release wrote it mid-nomination (no identities, no uid yet).
PREVIOUS_RELEASE_RECORD = (
    '{"failed": {}, "nominated": ["a"], "reason": "", "skipped": {}, "tried": ["a"]}'
)


@pytest.mark.parametrize("now", ["", "y"], ids=["identity-not-known", "identity-read"])
def test_a_record_of_the_previous_release_keeps_its_worker(now: str) -> None:
    """Upgraded mid-nomination: the record names no identity, so nothing tells that the
    worker was re-pointed; it is kept, its identity recorded once read."""
    record = DispatchRecord.from_annotation(PREVIOUS_RELEASE_RECORD)
    step = decide(record, (WorkerFacts("a", identity=now), WorkerFacts("b", identity="z")))
    assert step.nominated == ("a",)
    assert not step.fallbacks and not step.record.failed
    assert step.record.identities == ({"a": now} if now else {})


def test_a_re_pointed_worker_is_said_so_even_when_the_new_cluster_cannot_be_used() -> None:
    """The new cluster runs no gangcheck (skipped): the worker is given up as re-pointed,
    not merely as unreachable, so that the copy left in the earlier cluster is said."""
    new = WorkerFacts("a", reachable=False, skip="no gangcheck there", identity="y")
    step = decide(ON_A_IN_X, (new, WorkerFacts("b")))
    assert step.record.failed["a"].startswith("re-pointed: ")
    assert step.nominated == ("b",)


def _kubeconfig(user: dict[str, object], cluster: dict[str, object] | None = None) -> object:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "w", "cluster": {"server": "https://w:6443", **(cluster or {})}}],
        "users": [{"name": "mk", "user": user}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "mk"}}],
        "current-context": "w",
    }


EMBEDDED = {"certificate-authority-data": "Q0E="}
KUBECONFIGS = {
    "MultiKueue's own: a token, the CA embedded": (
        _kubeconfig({"token": "t"}, EMBEDDED),
        "",
    ),
    "a client certificate embedded": (
        _kubeconfig({"client-certificate-data": "Yw==", "client-key-data": "aw=="}, EMBEDDED),
        "",
    ),
    "insecure TLS (Kueue's gate decides; nothing local)": (
        _kubeconfig({"token": "t"}, {"insecure-skip-tls-verify": True}),
        "",
    ),
    "no map (loading it says why)": ("kubeconfig of worker-1", ""),
    "an exec plugin": (
        _kubeconfig({"exec": {"command": "aws"}}),
        'an exec plugin (a command to run) (user "mk": exec)',
    ),
    "an auth provider": (_kubeconfig({"auth-provider": {"name": "oidc"}}), "an auth provider"),
    "a token file": (_kubeconfig({"tokenFile": "/var/run/t"}), 'a token file (user "mk"'),
    "a client key file": (
        _kubeconfig({"client-certificate-data": "Yw==", "client-key": "/k"}),
        "a client key file",
    ),
    "basic auth": (_kubeconfig({"username": "u", "password": "p"}), "basic auth"),
    "a CA file": (
        _kubeconfig({"token": "t"}, {"certificate-authority": "/ca"}),
        'a certificate authority file (cluster "w": certificate-authority)',
    ),
    "a user not of the current context": (
        {**_kubeconfig({"token": "t"}), "users": [{"name": "x", "user": {"exec": {}}}]},
        "an exec plugin",
    ),
    "entries not maps": ({"users": ["x", {"user": "y"}], "clusters": 3}, ""),
}


@pytest.mark.parametrize(("config", "said"), KUBECONFIGS.values(), ids=KUBECONFIGS.keys())
def test_a_kubeconfig_naming_a_command_or_a_file_is_not_used(config: object, said: str) -> None:
    got = kubeconfig_unused(config)
    if not said:
        assert got == ""
    else:
        assert got.startswith(f"its kubeconfig names {said}"), got
        assert "not used by the dispatcher" in got


def _laughs(levels: int) -> list[object]:
    """A list of ten, each the list of ten one level down (YAML aliases, as a YAML loader
    returns them: the same object repeated): ``10 ** levels`` strings once expanded."""
    value: list[object] = ["lol"] * 10
    for _ in range(levels - 1):
        value = [value] * 10
    return value


EXPANDED = {
    "a billion laughs in a cluster entry": (
        _kubeconfig({"token": "t"}, {"extensions": _laughs(8)}),
        True,
    ),
    "one long string repeated by aliases": (
        _kubeconfig({"token": "t"}, {"extensions": ["x" * 100_000] * 20}),
        True,
    ),
    "an alias repeated a few times (a kubeconfig's own)": (
        _kubeconfig({"token": "t"}, {"extensions": _laughs(3)}),
        False,
    ),
    "a CA of 700 KB, embedded": (
        _kubeconfig({"token": "t"}, {"certificate-authority-data": "Q" * 700_000}),
        False,
    ),
}


@pytest.mark.parametrize(("config", "refused"), EXPANDED.values(), ids=EXPANDED.keys())
def test_a_kubeconfig_expanding_beyond_what_a_secret_holds_is_not_used(
    config: object, refused: bool
) -> None:
    """YAML aliases repeat a value without its text: a 666-byte kubeconfig became 10**8
    strings for the loader, which formats each entry whole (a pass held 10 s, and one level
    more is out of memory). One expanding beyond a Secret's MiB is refused before it is
    loaded; Go's YAML reader, Kueue's, refuses excessive aliasing too."""
    got = kubeconfig_unused(config)
    if refused:
        said = ("its kubeconfig expands to more than", "its kubeconfig holds more than")
        assert got.startswith(said), got
    else:
        assert got == ""


TLS_VERIFY = {
    "a string 'false' (the loader reads it as true: verification off)": ("false", True),
    "a string 'true'": ("true", True),
    "a number": (0, True),
    "true": (True, False),
    "false": (False, False),
    "not given": (None, False),
}


@pytest.mark.parametrize(("value", "refused"), TLS_VERIFY.values(), ids=TLS_VERIFY.keys())
def test_a_kubeconfig_whose_tls_verify_flag_is_no_boolean_is_not_used(
    value: object, refused: bool
) -> None:
    """The loader turns TLS verification off for any truthy ``insecure-skip-tls-verify``: a
    quoted "false" (a template's quoting) sent the worker's token over TLS unverified, while
    client-go's reader, Kueue's, refuses the kubeconfig (a string for a boolean)."""
    cluster = {} if value is None else {"insecure-skip-tls-verify": value}
    got = kubeconfig_unused(_kubeconfig({"token": "t"}, cluster))
    if refused:
        assert got.startswith("its kubeconfig's insecure-skip-tls-verify is no boolean"), got
        assert 'cluster "w"' in got, got
    else:
        assert got == ""


def test_a_kubeconfig_of_more_values_than_a_workers_holds_is_not_used() -> None:
    """A Secret's MiB of small entries (30,000 users) took the loader 5 s to read, on the
    event loop, at each new digest: a Secret rewritten every few seconds held every gang's
    dispatch. A kubeconfig of a few hundred contexts holds fewer than ``KUBECONFIG_VALUES_MAX``
    values; one holding more is refused before it is loaded."""
    many = _kubeconfig({"token": "t"})
    many["users"] = [{"name": f"u{i}", "user": {"token": "t"}} for i in range(30_000)]
    assert kubeconfig_unused(many).startswith(
        f"its kubeconfig holds more than {KUBECONFIG_VALUES_MAX} values"
    )
    fewer = _kubeconfig({"token": "t"})
    fewer["users"] = [{"name": f"u{i}", "user": {"token": "t"}} for i in range(500)]
    assert kubeconfig_unused(fewer) == ""


def _admitted(*assignments: dict[str, str]) -> dict[str, object]:
    return {
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": f"ps{i}", "flavors": f} for i, f in enumerate(assignments)
                ],
            }
        }
    }


H100 = {"nvidia.com/gpu": "h100", "cpu": "default"}


@pytest.mark.parametrize(
    ("one", "other", "alike"),
    [
        (H100, H100, True),
        (H100, {"nvidia.com/gpu": "a100", "cpu": "default"}, False),
        ({"cpu": "default"}, {"nvidia.com/gpu": "h100", "cpu": "default"}, False),
        ({"nvidia.com/gpu": "h100", "cpu": "h100"}, {"nvidia.com/gpu": "h100"}, True),
        ({"nvidia.com/gpu": "h100"}, {"nvidia.com/gpu": "h100", "cpu": "default"}, False),
    ],
)
def test_outcomes_speak_for_gangs_assigned_the_same_flavors(
    one: dict[str, str], other: dict[str, str], alike: bool
) -> None:
    assert same_capacity(flavors_of(_admitted(one)), flavors_of(_admitted(other))) is alike


def test_a_gang_whose_flavors_are_not_known_counts_with_every_other() -> None:
    h100 = flavors_of(_admitted({"nvidia.com/gpu": "h100"}))
    for unknown in ({}, {"status": {}}, {"status": {"admission": {"podSetAssignments": "x"}}}):
        assert flavors_of(unknown) is None
        assert same_capacity(flavors_of(unknown), h100)
        assert same_capacity(h100, flavors_of(unknown))
    two_sets = _admitted({"nvidia.com/gpu": "h100"}, {"cpu": "default"})
    assert flavors_of(two_sets) == {"h100", "default"}


def test_give_ups_are_kept_after_the_gang_is_deleted_while_they_are_recent() -> None:
    h100 = flavors_of(_admitted(H100))
    failed = DispatchRecord(
        ("b",), ("a", "b"), {"a": "CapacityIsNotFound"}, failed_at={"a": "2026-01-01T11:59:00Z"}
    )
    records = {("ns", "g"): failed, ("ns", "h"): DispatchRecord()}
    kept = departed({}, records, {("ns", "g"): h100}, NOW)
    assert kept == {("ns", "g"): (h100, {"a": (NOW - timedelta(minutes=1), "CapacityIsNotFound")})}
    later = NOW + timedelta(seconds=FAILURE_MEMORY - 61)
    assert departed(kept, {}, {}, later) == kept  # deleted: kept while recent
    assert recent_failures([], later, also=[kept[("ns", "g")][1]]) == {"a": "CapacityIsNotFound"}
    gone = NOW + timedelta(seconds=FAILURE_MEMORY - 59)
    assert departed(kept, {}, {}, gone) == {}
    assert recent_failures([], gone, also=[kept[("ns", "g")][1]]) == {}
