"""The applier against a fake API server: each action's write, and the paths the server's
answers take it down (conflict, gone, taken, lost answer)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.app import SOURCES
from gangcheck.kube.errors import (
    ApiError,
    ConflictError,
    NotFoundError,
    ReplacedError,
    TransientError,
)
from gangcheck.kube.resources import NODE, POD, POD_TEMPLATE, PROVISIONING_REQUEST
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    ClaimNode,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    DeleteTemplate,
    ReclaimArrivals,
    ReleaseHold,
    ReleaseMembers,
)
from gangcheck.logic.attempt.fulfillment import ARRIVED_FOR
from gangcheck.logic.attempt.hold import HOLD_TAINT, hold_taint
from gangcheck.logic.placement.fit import CLAIM_DELETING, DELETING
from gangcheck.logic.podgroups.gating import GATE
from gangcheck.model.names import (
    CHECK_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OUTCOME_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    WORKLOAD_ANNOTATION,
)
from gangcheck.reclaim import safely
from gangcheck.reconcile.apply import Applier, NameCollisionError, StaleDecisionError
from tests.builders import T0, node, provisioning_request
from tests.fakes.kube import FakeKube
from tests.fakes.metrics import RecordedMetrics

Obj = dict[str, Any]
NOW = datetime(2026, 11, 30, 10, 30, tzinfo=UTC)
NS = "default"
REQUEST = "wl-atomic-1"
REQUEST_KEY = f"{NS}/{REQUEST}"
OTHER_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def managed(name: str, **annotations: str) -> Obj:
    return {
        "name": name,
        "namespace": NS,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        "annotations": {WORKLOAD_ANNOTATION: "wl", CHECK_ANNOTATION: "atomic", **annotations},
    }


def template(name: str = "wl-main") -> Obj:
    meta = managed(name)
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": meta, "template": {}}


def request() -> Obj:
    obj = provisioning_request(REQUEST, templates=[("wl-main", 2)])
    obj["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    return obj


def gated_pod(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"schedulingGates": [{"name": GATE}], "containers": [], **spec},
    }


def setup(*objs: Obj, metrics: RecordedMetrics | None = None) -> tuple[FakeKube, Applier]:
    kube = FakeKube(clock=lambda: NOW)
    kube.add(*objs)
    applier = Applier(
        kube, kube.caches(), SOURCES, clock=lambda: NOW, metrics=metrics or RecordedMetrics()
    )
    return kube, applier


def cached(applier: Applier) -> Any:
    return applier._caches


async def test_create_template_writes_it_and_the_cache_has_it_at_once() -> None:
    kube, applier = setup()
    await applier.apply(NS, CreateTemplate(template()))
    assert [(w.verb, w.kind, w.name) for w in kube.writes] == [("create", "PodTemplate", "wl-main")]
    assert cached(applier).templates.store.get("wl-main", NS) is not None


async def test_create_of_a_name_ours_already_counts_as_created() -> None:
    """An earlier reconcile made it and was interrupted before it heard back."""
    kube, applier = setup(request())
    await applier.apply(NS, CreateRequest(request()))
    assert [w.verb for w in kube.writes] == ["create"]


async def test_create_of_a_name_taken_by_someone_else_is_a_collision() -> None:
    theirs = provisioning_request(REQUEST)
    _, applier = setup(theirs)
    with pytest.raises(NameCollisionError):
        await applier.apply(NS, CreateRequest(request()))


async def test_a_create_whose_answer_was_lost_is_finished_by_the_next_reconcile() -> None:
    kube, applier = setup()
    kube.fail("create", "ProvisioningRequest", error=503, applied=True)
    with pytest.raises(TransientError):
        await applier.apply(NS, CreateRequest(request()))
    await applier.apply(NS, CreateRequest(request()))
    assert kube.stored(PROVISIONING_REQUEST, REQUEST, NS) is not None
    assert cached(applier).requests.store.get(REQUEST, NS) is not None


async def test_a_refused_create_is_raised_and_nothing_is_cached() -> None:
    kube, applier = setup()
    kube.fail("create", "PodTemplate", error=422)
    with pytest.raises(ApiError):
        await applier.apply(NS, CreateTemplate(template()))
    assert cached(applier).templates.store.get("wl-main", NS) is None


async def test_delete_request_deletes_it_by_uid_and_its_templates() -> None:
    kube, applier = setup(request(), template())
    await applier.apply(NS, DeleteRequest(REQUEST, "uid-wl-atomic-1", ("wl-main",), "done"))
    assert [(w.verb, w.kind) for w in kube.writes] == [
        ("delete", "ProvisioningRequest"),
        ("delete", "PodTemplate"),
    ]
    assert kube.writes[0].body["uid"] == "uid-wl-atomic-1"
    assert kube.stored(PROVISIONING_REQUEST, REQUEST, NS) is None
    # the caches know at once, not when the watch's DELETED comes (Store.deleted)
    assert cached(applier).requests.store.get(REQUEST, NS) is None
    assert cached(applier).templates.store.get("wl-main", NS) is None


async def test_a_request_a_finalizer_keeps_is_cached_as_answered_being_deleted() -> None:
    held = request()
    held["metadata"]["finalizers"] = ["example.com/keep"]
    kube, applier = setup(held)
    await applier.apply(NS, DeleteRequest(REQUEST, "uid-wl-atomic-1", (), "done"))
    kept = cached(applier).requests.store.get(REQUEST, NS)
    assert kept is not None and kept == kube.stored(PROVISIONING_REQUEST, REQUEST, NS)
    assert kept["metadata"]["deletionTimestamp"]


async def test_delete_request_leaves_a_newer_request_of_that_name_and_its_templates() -> None:
    """Its templates are named from the request's name: the newer request's are the same
    objects, never deleted for the older one."""
    kube, applier = setup(request(), template())
    await applier.apply(NS, DeleteRequest(REQUEST, "uid-of-an-older-one", ("wl-main",), "done"))
    assert kube.stored(PROVISIONING_REQUEST, REQUEST, NS) is not None
    assert cached(applier).requests.store.get(REQUEST, NS) is not None
    assert kube.stored(POD_TEMPLATE, "wl-main", NS) is not None


async def test_a_template_made_again_since_the_decision_is_not_deleted() -> None:
    """The delete goes to the template the decision saw (its uid in the cache): one of that
    name made again since stays (ConflictError: the queue decides again)."""
    kube, applier = setup(template())
    again = template()
    again["metadata"]["uid"] = "made-again"
    kube.add(again)  # the server has another one now, the cache not yet
    with pytest.raises(ConflictError):
        await applier.apply(NS, DeleteTemplate("wl-main"))
    stored = kube.stored(POD_TEMPLATE, "wl-main", NS)
    assert stored is not None and stored["metadata"]["uid"] == "made-again"


@pytest.mark.parametrize(
    "action",
    [DeleteRequest(REQUEST, "uid", ("wl-main",), "done"), DeleteTemplate("wl-main")],
    ids=["a request already gone is deleted", "a template already gone is deleted"],
)
async def test_deleting_what_is_gone_is_done(action: Any) -> None:
    _, applier = setup()
    await applier.apply(NS, action)


async def test_annotate_request_merges_the_annotations_and_caches_the_result() -> None:
    kube, applier = setup(request())
    await applier.apply(NS, AnnotateRequest(REQUEST, {OUTCOME_ANNOTATION: "{}"}))
    stored = kube.stored(PROVISIONING_REQUEST, REQUEST, NS)
    assert stored is not None
    assert stored["metadata"]["annotations"][OUTCOME_ANNOTATION] == "{}"
    assert stored["metadata"]["annotations"][WORKLOAD_ANNOTATION] == "wl"
    assert cached(applier).requests.store.get(REQUEST, NS) == stored


async def test_a_request_made_again_since_the_decision_is_not_given_its_record() -> None:
    """The record goes to the request the decision saw (its uid in the cache): one of that
    name made again since raises ReplacedError (the queue decides again) and keeps none."""
    kube, applier = setup(request())
    again = request()
    again["metadata"]["uid"] = "made-again"
    kube.add(again)  # the server has another one now, the cache not yet
    with pytest.raises(ReplacedError):
        await applier.apply(NS, AnnotateRequest(REQUEST, {OUTCOME_ANNOTATION: "{}"}))
    stored = kube.stored(PROVISIONING_REQUEST, REQUEST, NS)
    assert stored is not None and stored["metadata"]["uid"] == "made-again"
    assert OUTCOME_ANNOTATION not in stored["metadata"]["annotations"]


async def test_annotating_a_request_with_a_rollback_reason_counts_the_rollback() -> None:
    metrics = RecordedMetrics()
    _, applier = setup(request(), metrics=metrics)
    reason = {ROLLBACK_REASON_ANNOTATION: "Failed: the cloud said no"}
    await applier.apply(NS, AnnotateRequest(REQUEST, reason))
    assert metrics.calls == [("rollback", ("Failed",))]


async def test_a_rollback_is_counted_by_its_cause_not_its_words() -> None:
    """A reason that starts with no known cause (a gang withdrawn, its words naming it) is
    counted as GangGone: before, its text up to the first colon was the label."""
    metrics = RecordedMetrics()
    _, applier = setup(request(), metrics=metrics)
    reason = {ROLLBACK_REASON_ANNOTATION: "the members it added to wl-7f3 are gone"}
    await applier.apply(NS, AnnotateRequest(REQUEST, reason))
    assert metrics.calls == [("rollback", ("GangGone",))]


async def test_a_rollback_whose_record_was_not_written_is_not_counted() -> None:
    """Counted once written: the pass that writes it next (after a conflict) counts it once."""
    metrics = RecordedMetrics()
    kube, applier = setup(request(), metrics=metrics)
    kube.fail("patch", "ProvisioningRequest", REQUEST, 409)
    reason = {ROLLBACK_REASON_ANNOTATION: "Deadline: the gang did not fit within 420s"}
    with pytest.raises(ApiError):
        await applier.apply(NS, AnnotateRequest(REQUEST, reason))
    assert metrics.calls == []
    await applier.apply(NS, AnnotateRequest(REQUEST, reason))
    assert metrics.calls == [("rollback", ("Deadline",))]


async def test_reclaimed_nodes_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )
    metrics = RecordedMetrics()
    arrived = node("n1", created="2026-11-30T10:05:00Z", annotations={ARRIVED_FOR: REQUEST_KEY})
    _, applier = setup(request(), arrived, metrics=metrics)
    await applier.apply(NS, ReclaimArrivals(REQUEST, REQUEST_KEY, T0, ("n1",), "DeleteNode"))
    assert metrics.names() == ["reclaimed"]
    assert metrics.calls[0][1][0] == 1


async def test_annotating_a_request_gone_is_an_error() -> None:
    _, applier = setup()
    with pytest.raises(NotFoundError):
        await applier.apply(NS, AnnotateRequest(REQUEST, {OUTCOME_ANNOTATION: "{}"}))


async def test_claim_node_records_the_arrival_and_holds_it_in_one_write() -> None:
    kube, applier = setup(node("n1", taints=[OTHER_TAINT]))
    rv = cached(applier).nodes.store.get("n1")["metadata"]["resourceVersion"]
    await applier.apply(NS, ClaimNode("n1", rv, REQUEST_KEY))
    (write,) = kube.writes
    assert write.body["metadata"]["resourceVersion"] == rv
    stored = kube.stored(NODE, "n1")
    assert stored is not None
    assert stored["metadata"]["annotations"][ARRIVED_FOR] == REQUEST_KEY
    assert stored["spec"]["taints"] == [OTHER_TAINT, hold_taint(REQUEST_KEY)]


async def test_claim_node_decided_on_an_older_node_writes_nothing() -> None:
    kube, applier = setup(node("n1"))
    with pytest.raises(StaleDecisionError):
        await applier.apply(NS, ClaimNode("n1", "1", REQUEST_KEY))
    assert kube.writes == []


async def test_claim_node_that_loses_to_a_concurrent_write_drops_the_decision() -> None:
    kube, applier = setup(node("n1"))
    rv = cached(applier).nodes.store.get("n1")["metadata"]["resourceVersion"]
    kube.fail("patch", "Node", "n1", 409)
    with pytest.raises(StaleDecisionError):
        await applier.apply(NS, ClaimNode("n1", rv, REQUEST_KEY))


async def test_claim_node_refused_by_the_policy_leaves_it_unrecorded_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The admission policy refuses to record a node older than its window: the node stays
    unrecorded (never reclaimed) and a rollback that records arrivals is not stopped by it."""
    kube, applier = setup(node("n1"))
    rv = cached(applier).nodes.store.get("n1")["metadata"]["resourceVersion"]
    kube.fail("patch", "Node", "n1", 403)
    await applier.apply(NS, ClaimNode("n1", rv, REQUEST_KEY))
    stored = kube.stored(NODE, "n1")
    assert stored is not None
    assert ARRIVED_FOR not in (stored["metadata"].get("annotations") or {})
    assert "could not be recorded as arrived" in caplog.text


async def test_release_hold_lifts_only_the_hold() -> None:
    held = node("n1", taints=[OTHER_TAINT, hold_taint(REQUEST_KEY)])
    kube, applier = setup(held, node("n2"))
    await applier.apply(NS, ReleaseHold(("n1", "n2", "gone")))
    stored = kube.stored(NODE, "n1")
    assert stored is not None
    assert stored["spec"]["taints"] == [OTHER_TAINT]
    assert [w.name for w in kube.writes] == ["n1"]  # n2 is not held, "gone" is gone


async def test_release_hold_on_a_conflict_reads_the_node_again_and_lifts_it() -> None:
    kube, applier = setup(node("n1", taints=[hold_taint(REQUEST_KEY)]))
    kube.fail("patch", "Node", "n1", 409)
    await applier.apply(NS, ReleaseHold(("n1",)))
    stored = kube.stored(NODE, "n1")
    assert stored is not None
    assert not any(t["key"] == HOLD_TAINT for t in stored["spec"].get("taints") or [])
    assert [c.verb for c in kube.calls] == ["patch", "get", "patch"]


async def test_release_hold_of_a_node_that_keeps_changing_raises_after_the_others() -> None:
    """A hold that could not be lifted (the node changed at every try) is not given up
    silently, leaving the node closed to every other gang until some later decision: the
    other nodes' holds are lifted, then a ConflictError naming it is raised (the queue
    retries the decision, backed off)."""
    kube, applier = setup(
        node("n1", taints=[hold_taint(REQUEST_KEY)]), node("n2", taints=[hold_taint(REQUEST_KEY)])
    )
    kube.fail("patch", "Node", "n1", 409, times=3)
    with pytest.raises(ConflictError, match="n1"):
        await applier.apply(NS, ReleaseHold(("n1", "n2")))
    n1, n2 = kube.stored(NODE, "n1"), kube.stored(NODE, "n2")
    assert n1 is not None and n2 is not None
    assert any(t["key"] == HOLD_TAINT for t in n1["spec"].get("taints") or [])
    assert not any(t["key"] == HOLD_TAINT for t in n2["spec"].get("taints") or [])


def release(*pods: str, node_selector: dict[str, str] | None = None) -> ReleaseMembers:
    return ReleaseMembers(
        pods=pods,
        annotations={"gangcheck.io/request": REQUEST},
        node_selector=node_selector or {},
        gate=GATE,
        tolerations=(hold_toleration(),),
    )


def hold_toleration() -> Obj:
    taint = hold_taint(REQUEST_KEY)
    return {
        "key": taint["key"],
        "operator": "Equal",
        "value": taint["value"],
        "effect": "NoSchedule",
    }


async def test_release_members_lifts_the_gate_annotates_and_pins_in_one_write_each() -> None:
    kube, applier = setup(gated_pod("m0"), gated_pod("m1"))
    await applier.apply(NS, release("m0", "m1", "gone", node_selector={"zone": "a"}))
    assert [(w.verb, w.name) for w in kube.writes] == [("patch", "m0"), ("patch", "m1")]
    pod = kube.stored(POD, "m0", NS)
    assert pod is not None
    assert "schedulingGates" not in pod["spec"]
    assert pod["spec"]["nodeSelector"] == {"zone": "a"}
    assert pod["spec"]["tolerations"] == [hold_toleration()]
    assert pod["metadata"]["annotations"]["gangcheck.io/request"] == REQUEST


async def test_release_members_keeps_a_value_the_pod_already_pins() -> None:
    kube, applier = setup(gated_pod("m0", nodeSelector={"zone": "b"}))
    await applier.apply(NS, release("m0", node_selector={"zone": "a"}))
    pod = kube.stored(POD, "m0", NS)
    assert pod is not None
    assert pod["spec"]["nodeSelector"] == {"zone": "b"}


async def test_release_members_refused_a_selector_lifts_the_gate_alone() -> None:
    kube, applier = setup(gated_pod("m0"))
    kube.fail("patch", "Pod", "m0", 422)
    await applier.apply(NS, release("m0", node_selector={"zone": "a"}))
    last = kube.writes[-1].body
    assert "nodeSelector" not in last["spec"]
    pod = kube.stored(POD, "m0", NS)
    assert pod is not None
    assert "schedulingGates" not in pod["spec"]


async def test_release_members_changed_meanwhile_is_read_again_once() -> None:
    kube, applier = setup(gated_pod("m0"))
    kube.fail("patch", "Pod", "m0", 409)
    await applier.apply(NS, release("m0"))
    assert [c.verb for c in kube.calls] == ["patch", "get", "patch"]
    pod = kube.stored(POD, "m0", NS)
    assert pod is not None
    assert "schedulingGates" not in pod["spec"]


async def test_reclaim_arrivals_reclaims_an_idle_node_and_records_the_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )
    arrived = node("n1", created="2026-11-30T10:05:00Z", annotations={ARRIVED_FOR: REQUEST_KEY})
    kube, applier = setup(request(), arrived)
    action = ReclaimArrivals(REQUEST, REQUEST_KEY, T0, ("n1",), "DeleteNode")
    await applier.apply(NS, action)
    assert kube.stored(NODE, "n1") is None
    stored = kube.stored(PROVISIONING_REQUEST, REQUEST, NS)
    assert stored is not None
    assert '"n1"' in stored["metadata"]["annotations"][OUTCOME_ANNOTATION]


@dataclass(frozen=True)
class Deleted:
    """A reclaim that deletes: what the server holds, its answer to the delete, and what
    the caches show at once, before any watch event (the node, its NodeClaim; the node's
    capacity view)."""

    reclaimer: str
    finalizers: tuple[str, ...] = ()
    answer: int = 0
    """A status the delete is answered with (applied first: a lost answer), 0 for none."""
    node_cached: bool = False
    node_problem: str = ""
    claim_deleting: bool = False


DELETED = {
    "a node deleted is gone from the node cache": Deleted("DeleteNode"),
    "a node found gone at the delete (404) is gone from it too": Deleted("DeleteNode", answer=404),
    "a node its finalizers keep is cached being deleted, not capacity": Deleted(
        "DeleteNode", ("example.com/drain",), node_cached=True, node_problem=DELETING
    ),
    "a node whose NodeClaim is deleted is not capacity, its claim cached being deleted": (
        Deleted(
            "DeleteNodeClaim",
            node_cached=True,
            node_problem=CLAIM_DELETING,
            claim_deleting=True,
        )
    ),
}


@pytest.mark.parametrize("case", list(DELETED.values()), ids=list(DELETED))
async def test_a_reclaim_that_deletes_tells_the_caches_at_once(
    monkeypatch: pytest.MonkeyPatch, case: Deleted
) -> None:
    """The nodes arrived for a rolled-back request are judged again right after the reclaim,
    before the watches bring its DELETEDs: what the caches show then is what was deleted."""
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )
    arrived = node("n1", created="2026-11-30T10:05:00Z", annotations={ARRIVED_FOR: REQUEST_KEY})
    arrived["metadata"]["finalizers"] = list(case.finalizers)
    claim = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "c1", "finalizers": ["karpenter.sh/termination"]},
        "status": {"nodeName": "n1"},
    }
    kube, applier = setup(request(), arrived, claim)
    if case.answer:
        kube.fail("delete", "*", error=case.answer, applied=True)
    await applier.apply(NS, ReclaimArrivals(REQUEST, REQUEST_KEY, T0, ("n1",), case.reclaimer))
    stored = kube.stored(PROVISIONING_REQUEST, REQUEST, NS)
    assert stored is not None
    assert '"reclaimed": ["n1"]' in stored["metadata"]["annotations"][OUTCOME_ANNOTATION]
    caches = cached(applier)
    assert (caches.nodes.store.get("n1") is not None) == case.node_cached
    view = caches.capacity.views().get("n1")
    assert (view.problem.kind if view and view.problem else "") == case.node_problem
    kept_claim = caches.node_claims.store.get("c1")
    assert kept_claim is not None  # its finalizer keeps it
    assert bool(kept_claim["metadata"].get("deletionTimestamp")) == case.claim_deleting


async def test_a_reclaim_whose_delete_failed_leaves_the_caches_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )
    arrived = node("n1", created="2026-11-30T10:05:00Z", annotations={ARRIVED_FOR: REQUEST_KEY})
    kube, applier = setup(request(), arrived)
    kube.fail("delete", "Node", "n1", 500)
    await applier.apply(NS, ReclaimArrivals(REQUEST, REQUEST_KEY, T0, ("n1",), "DeleteNode"))
    assert kube.stored(NODE, "n1") is not None
    cached_node = cached(applier).nodes.store.get("n1")
    assert cached_node is not None and not cached_node["metadata"].get("deletionTimestamp")


async def test_reclaim_arrivals_keeps_a_node_running_someone_elses_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        safely.reclaim_safely, "__kwdefaults__", {"settle_seconds": 0.0, "owed": False}
    )
    arrived = node("n1", created="2026-11-30T10:05:00Z", annotations={ARRIVED_FOR: REQUEST_KEY})
    stranger = gated_pod("stranger", nodeName="n1")
    kube, applier = setup(request(), arrived, stranger)
    await applier.apply(NS, ReclaimArrivals(REQUEST, REQUEST_KEY, T0, ("n1",), "DeleteNode"))
    assert kube.stored(NODE, "n1") is not None
    assert kube.writes_of("Node", "delete") == []
    assert [w.body["reason"] for w in kube.writes_of("Event")] == ["NodeKept"]
