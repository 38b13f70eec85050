"""Reclaim safety as invariants (hypothesis), the one age rule, undoing a fence, and the
rollback outcome record. Pure logic: no API server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.logic.attempt.fulfillment import is_new_arrival, proven_younger
from gangcheck.logic.attempt.reclaim import (
    LEFT_FOR_SCALE_DOWN_SECONDS,
    judge,
    left_for,
    left_ops,
    not_removed_message,
    scale_down_watch,
    unfence_ops,
)
from gangcheck.logic.attempt.records import Outcome, kept_restated
from gangcheck.logic.placement.fit import member_from_template
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import ARRIVED_FOR, FENCE_LABEL, RECLAIMED_AT
from gangcheck.model.objects import pod_of

REQUEST = "ns/gang-atomic-1"
CREATED = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
#: gangcheck's fence taint, and the mark of a reclaim owed once the node is idle.
OURS = {"key": "gangcheck.io/reclaiming", "value": "true", "effect": "NoSchedule"}
MARK = "gangcheck.io/reclaim-when-idle"


def n1(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    created: datetime | None = None,
    resource_version: str | None = None,
    cordoned: bool | None = None,
    taints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Node n1 with the fields given and no other (one not given is absent, as on a node
    that never had it: the logic reads such nodes too); a spec only with `cordoned` or
    `taints`."""
    meta: dict[str, Any] = {"name": "n1"}
    if created is not None:
        meta["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {}
    if cordoned is not None:
        spec["unschedulable"] = cordoned
    if taints is not None:
        spec["taints"] = taints
    return {"metadata": meta, "spec": spec} if spec else {"metadata": meta}


def node_obj(*, claim: str, opt_out: bool, born_offset: int) -> dict[str, Any]:
    return n1(
        created=CREATED + timedelta(seconds=born_offset),
        labels={"gangcheck.io/do-not-reclaim": "true"} if opt_out else {},
        annotations={"gangcheck.io/arrived-for": claim} if claim else {},
    )


pod_kinds = st.sampled_from(["daemonset", "gang", "foreign", "finished-foreign"])


def pod_obj(kind: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": kind, "namespace": "ns"}
    status = {"phase": "Running"}
    if kind == "daemonset":
        meta["ownerReferences"] = [{"kind": "DaemonSet", "controller": True, "name": "ds"}]
    elif kind == "gang":
        meta["annotations"] = {"autoscaling.x-k8s.io/consume-provisioning-request": "gang-atomic-1"}
    elif kind == "finished-foreign":
        status = {"phase": "Succeeded"}
    return {"metadata": meta, "status": status}


@settings(max_examples=300, database=None)
@given(
    claim=st.sampled_from([REQUEST, "ns/other-atomic-1", ""]),
    opt_out=st.booleans(),
    born_offset=st.integers(min_value=-600, max_value=600),
    pods=st.lists(pod_kinds, max_size=6),
)
def test_reclaim_only_what_is_safe(
    claim: str, opt_out: bool, born_offset: int, pods: list[str]
) -> None:
    verdict = judge(
        node_obj(claim=claim, opt_out=opt_out, born_offset=born_offset),
        [pod_of(pod_obj(p)) for p in pods],
        request=REQUEST,
        request_created=CREATED,
    ).verdict
    unsafe = opt_out or claim != REQUEST or born_offset <= 0 or "foreign" in pods
    if unsafe:
        assert verdict == "keep"
    elif "gang" in pods:
        assert verdict == "drain"
    else:
        assert verdict == "reclaim"


def test_outcome_round_trips_through_its_annotation() -> None:
    outcome = Outcome(("a", "b"), ("c",), {"d": "runs pod ns/x"}, 900)
    assert Outcome.from_annotation(outcome.to_annotation()) == outcome
    assert outcome.summary() == (
        "reclaimed 2 nodes (15.0 node-minutes held); 1 to reclaim once the gang's pods leave;"
        " kept d (runs pod ns/x)"
    )


def test_an_unreadable_outcome_is_reported_not_trusted() -> None:
    outcome = Outcome.from_annotation("{not json")
    assert outcome.reclaimed == ()
    assert "unreadable outcome" in outcome.kept["?"]


AGES = [
    ("2026-11-30T10:00:00Z", "2026-11-30T10:00:00Z", False),
    ("2026-11-30T09:59:59Z", "2026-11-30T10:00:00Z", False),
    ("2026-11-30T10:00:01Z", "2026-11-30T10:00:00Z", True),
    ("2026-11-30T10:00:00.900Z", "2026-11-30T10:00:00.100Z", False),
    ("", "2026-11-30T10:00:00Z", False),
]


@pytest.mark.parametrize(
    ("born", "asked", "younger"),
    AGES,
    ids=[
        "a node stamped the same second as the request is not proven younger",
        "a node stamped a second before the request is not younger",
        "a node stamped a later second is proven younger",
        "sub-second digits do not make a same-second node younger",
        "a node without a timestamp is not proven younger",
    ],
)
def test_one_age_rule_for_claiming_and_reclaiming(born: str, asked: str, younger: bool) -> None:
    node = {"metadata": {"name": "n1", "creationTimestamp": born,
                         "annotations": {"gangcheck.io/arrived-for": REQUEST}},
            "status": {"allocatable": {"pods": "110", "cpu": "4"}}}  # fmt: skip
    created = parse_time(asked)
    member = member_from_template({"spec": {"containers": [{"name": "c"}]}})
    assert proven_younger(node, created) is younger
    assert is_new_arrival(node, created, [member]) is younger
    verdict = judge(node, [], request=REQUEST, request_created=created).verdict
    assert (verdict == "reclaim") is younger


def test_every_kept_and_failed_node_is_named_with_its_reason() -> None:
    outcome = Outcome(
        ("a",), (), {"k1": "runs pod ns/x", "k2": "carries the opt-out label"}, 60,
        failed={"f1": "DeleteNode failed: 403 Forbidden"},
    )  # fmt: skip
    summary = outcome.summary()
    assert "kept k1 (runs pod ns/x), k2 (carries the opt-out label)" in summary
    assert "failed, retrying: f1 (DeleteNode failed: 403 Forbidden)" in summary
    assert "more" not in summary
    assert Outcome.from_annotation(outcome.to_annotation()) == outcome


KEPT = Outcome(
    ("a",), (), {"k1": "runs pod ns/x (not the gang's)", "k2": "carries the opt-out label"}, 60,
    failed={"f1": "DeleteNode failed: 403 Forbidden"},
)  # fmt: skip
KEPT_THEN = "kept then, gone since: "


def test_a_kept_node_gone_since_is_said_gone_not_kept() -> None:
    """Kept by a safety rule, then deleted (by the autoscaler, by hand): the summary read
    now says so, never that the node is kept."""
    assert KEPT.summary(gone={"k2"}) == (
        "reclaimed 1 node (1.0 node-minutes held); kept k1 (runs pod ns/x (not the gang's)); "
        f"{KEPT_THEN}k2 (carries the opt-out label); failed, retrying: f1 (DeleteNode failed: "
        "403 Forbidden)"
    )
    gone = KEPT.summary(gone={"k1", "k2"})
    assert " kept k" not in gone
    assert f"{KEPT_THEN}k1 (runs pod ns/x (not the gang's)), k2 (carries" in gone
    assert KEPT.kept_gone({"a", "k1"}) == ("k2",)
    assert Outcome.from_annotation("{not json").kept_gone(set()) == ()  # no node named


@pytest.mark.parametrize(
    ("exists", "kept"),
    [
        ({"k1", "k2"}, "kept k1 (runs pod ns/x (not the gang's)), k2 (carries the opt-out label)"),
        ({"k1"}, f"kept k1 (runs pod ns/x (not the gang's)); {KEPT_THEN}k2 (carries the opt-out "
                 "label)"),
        (set(), f"{KEPT_THEN}k1 (runs pod ns/x (not the gang's)), k2 (carries the opt-out label)"),
    ],
    ids=["both there: as written", "one gone", "both gone"],
)  # fmt: skip
def test_a_message_quoting_a_summary_is_restated_as_summary_says_it_now(
    exists: set[str], kept: str
) -> None:
    """A message written when the rollback ended (a PodGroup's GaveUp, a Rejected check)
    reads as the outcome's summary would now: the rest as written."""
    written = f"gave up after attempt 3: rolled back g-1 (Deadline: x); {KEPT.summary()}; done"
    restated = kept_restated(written, exists)
    head = "gave up after attempt 3: rolled back g-1 (Deadline: x); reclaimed 1 node (1.0 "
    assert restated == (
        f"{head}node-minutes held); {kept}; failed, retrying: f1 (DeleteNode failed: 403 "
        "Forbidden); done"
    )
    assert restated == written.replace(KEPT.summary(), KEPT.summary(gone=KEPT.kept_gone(exists)))
    twice = f"{written} / {written}"
    assert kept_restated(twice, exists) == f"{restated} / {restated}"


@pytest.mark.parametrize(
    "written",
    [
        "reclaimed 0 nodes (0.0 node-minutes held); kept k1 (a reason ( unclosed), k2 (x)",
        "no summary: kept k1 (runs pod ns/x)",
        "",
    ],
    ids=["a reason whose parentheses do not close", "no summary", "empty"],
)
def test_a_message_that_cannot_be_read_back_is_left_as_written(written: str) -> None:
    assert kept_restated(written, set()) == written


def fenced_node(taints: list[dict[str, Any]], *, cordoned: bool = True) -> dict[str, Any]:
    return n1(annotations={MARK: "{}"}, cordoned=cordoned, taints=taints)


def labelled(node: dict[str, Any]) -> dict[str, Any]:
    """The node with gangcheck's fence label beside another writer's label."""
    labels = {"gangcheck.io/reclaiming": "true", "example.com/pool": "gpu"}
    return {**node, "metadata": {**node["metadata"], "labels": labels}}


def left_before(node: dict[str, Any]) -> dict[str, Any]:
    """The node fenced again after CordonAndTaint left it (its reclaimed-at record on)."""
    notes = {**node["metadata"]["annotations"], "gangcheck.io/reclaimed-at": "2026-12-06T10:00:00Z"}
    return {**node, "metadata": {**node["metadata"], "annotations": notes}}


THEIRS = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("node", "was_cordoned", "forget", "expected"),
    [
        (fenced_node([THEIRS, OURS]), False, True, [
            {"op": "test", "path": "/spec/taints/1", "value": OURS},
            {"op": "remove", "path": "/spec/taints/1"},
            {"op": "test", "path": "/spec/unschedulable", "value": True},
            {"op": "remove", "path": "/spec/unschedulable"},
            {"op": "test", "path": "/metadata/annotations/gangcheck.io~1reclaim-when-idle",
             "value": "{}"},
            {"op": "remove", "path": "/metadata/annotations/gangcheck.io~1reclaim-when-idle"},
        ]),
        (fenced_node([OURS]), True, False, [
            {"op": "test", "path": "/spec/taints/0", "value": OURS},
            {"op": "remove", "path": "/spec/taints/0"},
        ]),
        (fenced_node([THEIRS], cordoned=True), False, False, []),
        (labelled(fenced_node([OURS])), False, False, [
            {"op": "test", "path": "/spec/taints/0", "value": OURS},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "test", "path": "/spec/unschedulable", "value": True},
            {"op": "remove", "path": "/spec/unschedulable"},
            {"op": "test", "path": "/metadata/labels/gangcheck.io~1reclaiming", "value": "true"},
            {"op": "remove", "path": "/metadata/labels/gangcheck.io~1reclaiming"},
        ]),
        (labelled(fenced_node([THEIRS], cordoned=False)), False, False, [
            {"op": "test", "path": "/metadata/labels/gangcheck.io~1reclaiming", "value": "true"},
            {"op": "remove", "path": "/metadata/labels/gangcheck.io~1reclaiming"},
        ]),
        (left_before(fenced_node([OURS])), False, False, [
            {"op": "test", "path": "/spec/taints/0", "value": OURS},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "test", "path": "/spec/unschedulable", "value": True},
            {"op": "remove", "path": "/spec/unschedulable"},
            {"op": "test", "path": "/metadata/annotations/gangcheck.io~1reclaimed-at",
             "value": "2026-12-06T10:00:00Z"},
            {"op": "remove", "path": "/metadata/annotations/gangcheck.io~1reclaimed-at"},
        ]),
    ],
    ids=[
        "unfencing removes only our taint, tested in place, our cordon and our mark",
        "a node cordoned before the fence stays cordoned",
        "a node without our taint is left alone, its cordon too",
        "the fence label goes with the fence (binds allowed again), no other label",
        "a fence label left without our taint goes alone",
        "a node left before (a reclaim run again, held or kept) is no longer left: its record"
        " goes, so a later leave records its own time",
    ],
)  # fmt: skip
def test_unfencing_touches_only_our_keys(
    node: dict[str, Any], was_cordoned: bool, forget: bool, expected: list[dict[str, Any]]
) -> None:
    assert unfence_ops(node, was_cordoned=was_cordoned, forget=forget) == expected


LEFT = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)


def left_node(
    *, labels: dict[str, str], annotations: dict[str, str] | None, tainted: bool = True
) -> dict[str, Any]:
    return n1(
        resource_version="9",
        labels=labels,
        annotations=annotations,
        cordoned=True,
        taints=[OURS] if tainted else [],
    )


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        (  # as the fence leaves it: label and mark off, the time on, the version tested
            {FENCE_LABEL: "true", "pool": "gpu"},
            {MARK: "{}", ARRIVED_FOR: REQUEST},
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
                {"op": "test", "path": "/metadata/labels/gangcheck.io~1reclaiming",
                 "value": "true"},
                {"op": "remove", "path": "/metadata/labels/gangcheck.io~1reclaiming"},
                {"op": "test", "path": "/metadata/annotations/gangcheck.io~1reclaim-when-idle",
                 "value": "{}"},
                {"op": "remove", "path": "/metadata/annotations/gangcheck.io~1reclaim-when-idle"},
                {"op": "add", "path": "/metadata/annotations/gangcheck.io~1reclaimed-at",
                 "value": "2026-11-30T11:00:00Z"},
            ],
        ),
        (  # left before (a reclaim run again): its earlier time kept
            {FENCE_LABEL: "true"},
            {MARK: "{}", RECLAIMED_AT: "2026-11-30T10:00:00Z"},
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
                {"op": "test", "path": "/metadata/labels/gangcheck.io~1reclaiming",
                 "value": "true"},
                {"op": "remove", "path": "/metadata/labels/gangcheck.io~1reclaiming"},
                {"op": "test", "path": "/metadata/annotations/gangcheck.io~1reclaim-when-idle",
                 "value": "{}"},
                {"op": "remove", "path": "/metadata/annotations/gangcheck.io~1reclaim-when-idle"},
            ],
        ),
        (  # no label, no annotations at all: the map is made
            {},
            None,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
                {"op": "add", "path": "/metadata/annotations",
                 "value": {RECLAIMED_AT: "2026-11-30T11:00:00Z"}},
            ],
        ),
    ],
)  # fmt: skip
def test_left_ops_take_the_fence_label_and_mark_off_and_record_when(
    labels: dict[str, str], annotations: dict[str, str] | None, expected: list[dict[str, Any]]
) -> None:
    assert left_ops(left_node(labels=labels, annotations=annotations), LEFT) == expected


@pytest.mark.parametrize(
    ("annotations", "tainted", "after", "fate", "seconds"),
    [
        ({}, True, 0, "none", 0.0),  # not left by CordonAndTaint
        ({MARK: "{}"}, True, 0, "none", 0.0),  # a reclaim owed: the other path's
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z"}, False, 5000, "returned", 0.0),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z"}, True, 0, "wait", 1800.0),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z"}, True, 1799, "wait", 1.0),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z"}, True, 1800, "overdue", 0.0),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z"}, True, 9000, "overdue", 0.0),
        ({RECLAIMED_AT: "yesterday"}, True, 0, "overdue", 0.0),  # unreadable: it was left
    ],
)
def test_a_node_left_for_scale_down_is_said_once_past_its_bound(
    annotations: dict[str, str], tainted: bool, after: int, fate: str, seconds: float
) -> None:
    assert LEFT_FOR_SCALE_DOWN_SECONDS == 1800
    node = left_node(labels={}, annotations=annotations, tainted=tainted)
    watch = scale_down_watch(node, LEFT + timedelta(seconds=after))
    assert (watch.fate, watch.seconds) == (fate, seconds)


def test_the_not_removed_message_names_the_causes_and_what_to_do() -> None:
    node = left_node(labels={}, annotations={ARRIVED_FOR: REQUEST, RECLAIMED_AT: "x"})
    message = not_removed_message(node, LEFT)
    for words in (
        "node n1, arrived for ns/gang-atomic-1, was reclaimed by CordonAndTaint at "
        "2026-11-30T11:00:00Z",
        "after 30 min",
        "node group is at its min size",
        "--scale-down-enabled=false",
        "cluster-autoscaler.kubernetes.io/scale-down-disabled",
        "kubectl uncordon n1 && kubectl taint nodes n1 gangcheck.io/reclaiming-",
    ):
        assert words in message


@pytest.mark.parametrize(
    ("annotations", "tainted", "left"),
    [
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z", ARRIVED_FOR: REQUEST}, True, True),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z", ARRIVED_FOR: "ns/other-1"}, True, False),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z", ARRIVED_FOR: REQUEST}, False, False),
        ({RECLAIMED_AT: "2026-11-30T11:00:00Z", ARRIVED_FOR: REQUEST, MARK: "{}"}, True, False),
        ({ARRIVED_FOR: REQUEST}, True, False),
    ],
    ids=["left-for-it", "another-request", "returned", "fenced-again", "never-left"],
)
def test_a_node_left_for_this_requests_reclaim_is_told_apart(
    annotations: dict[str, str], tainted: bool, left: bool
) -> None:
    """left_for: CordonAndTaint left it for this request's reclaim (a reclaim run again is
    done), not for another's, not returned to service, not fenced again meanwhile."""
    node = left_node(labels={}, annotations=annotations, tainted=tainted)
    assert left_for(node, REQUEST) is left
