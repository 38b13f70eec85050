"""An attempt whose gang is gone (lifecycle.abandon, rollback.abandon): what is reclaimed
before its request is deleted. Pure logic, by table."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from gangcheck.logic.attempt import lifecycle, rollback
from gangcheck.logic.attempt.actions import AnnotateRequest, ClaimNode, Event, ReclaimArrivals
from gangcheck.logic.attempt.fulfillment import ClusterView, Waiting
from gangcheck.model.objects import ObjectRef, request_of
from gangcheck.model.provisioning_config import parse_spec
from gangcheck.reclaim.arrivals import tell
from gangcheck.reclaim.safely import Result
from tests.builders import T0, node, pod_template, provisioning_request

REQ = "wl-atomic-1"
ARRIVED = {"gangcheck.io/arrived-for": f"default/{REQ}"}
ELSEWHERE = {"gangcheck.io/arrived-for": "default/other-atomic-1"}


@dataclass(frozen=True)
class Case:
    id: str
    annotations: dict[str, str] = field(default_factory=dict)
    nodes: tuple[dict[str, str], ...] = ()
    records_first: bool = False
    reclaims: tuple[str, ...] | None = None
    """The nodes reclaimed; None: nothing is done before the delete."""
    gone: bool = False
    """The gang is deleted (not evicted, finished or requeued)."""


CASES = [
    Case(
        "nodes that arrived mid-attempt are recorded, then reclaimed like any rollback",
        nodes=(ARRIVED, ARRIVED, ELSEWHERE),
        records_first=True,
        reclaims=("n0", "n1"),
    ),
    Case(
        "an attempt already rolling back reclaims what it recorded, without recording again",
        annotations={
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-nodes": '{"gone-already": "2026-11-30T10:00:00Z"}',
        },
        nodes=(ARRIVED,),
        reclaims=("gone-already", "n0"),
    ),
    Case("nothing arrived: nothing to reclaim", nodes=(ELSEWHERE, {})),
    Case(
        "a rollback whose outcome is recorded is not reclaimed twice",
        annotations={"gangcheck.io/phase": "RollingBack", "gangcheck.io/outcome": "{}"},
        nodes=(ARRIVED,),
    ),
    Case(
        # a MultiKueue worker whose copy lost the race after it turned Ready (was: left to the
        # autoscaler, held for a gang that had left)
        "a fulfilled gang deleted before it started: what arrived is recorded and reclaimed",
        annotations={"gangcheck.io/phase": "Fulfilled"},
        nodes=(ARRIVED, ELSEWHERE),
        records_first=True,
        reclaims=("n0",),
        gone=True,
    ),
    Case(
        "a fulfilled gang evicted or requeued: its nodes are left for it to come back to",
        annotations={"gangcheck.io/phase": "Fulfilled"},
        nodes=(ARRIVED,),
    ),
    Case(
        "a started gang's nodes were its own to use: left to the autoscaler",
        annotations={"gangcheck.io/phase": "Started"},
        nodes=(ARRIVED,),
        gone=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_abandon(case: Case) -> None:
    req = request_of(provisioning_request(REQ, annotations=case.annotations))
    nodes = tuple(node(f"n{i}", created=T0, annotations=a) for i, a in enumerate(case.nodes))
    actions = rollback.abandon(
        req, ClusterView(nodes=nodes), "cordon", "Workload deleted", gone=case.gone
    )
    if case.reclaims is None:
        assert actions == ()
        return
    *first, last = actions
    assert isinstance(last, ReclaimArrivals)
    assert last.nodes == case.reclaims
    assert (last.request, last.request_key, last.reclaimer) == (REQ, f"default/{REQ}", "cordon")
    if case.records_first:
        (annotate,) = first
        assert isinstance(annotate, AnnotateRequest)
        assert annotate.annotations["gangcheck.io/phase"] == "RollingBack"
        assert annotate.annotations["gangcheck.io/rollback-reason"] == "Workload deleted"
        assert set(json.loads(annotate.annotations["gangcheck.io/rollback-nodes"])) == set(
            case.reclaims
        )
    else:
        assert first == []


# ---- lifecycle.abandon: the arrivals an abandoned attempt had not recorded yet -------------

KEY = f"default/{REQ}"
POOL = {"pool": "gpu"}
LATER_NODE = "2026-11-30T10:01:00Z"  # younger than the request (T0)
DRIVER = {"key": "example.com/gpu-driver", "value": "installing", "effect": "NoSchedule"}


def _abandoned(mode: str | None, waiting: bool) -> tuple[Any, ...]:
    """A Provisioned request whose gang is gone, with one node it recorded and one arrival
    it passed over (a taint its members do not tolerate), and one of another pool."""
    req, capacity, config = _gone(mode, waiting)
    return lifecycle.abandon(req, capacity, config, "Workload deleted")


def _gone(mode: str | None, waiting: bool, *, current: bool = True) -> tuple[Any, ...]:
    req = request_of(provisioning_request(REQ, conditions={"Provisioned": ""}))
    nodes = (
        node("n-recorded", gpu=8, labels=POOL, created=LATER_NODE, annotations=ARRIVED),
        node("n-tainted", gpu=8, labels=POOL, created=LATER_NODE, taints=[DRIVER]),
        node("n-elsewhere", gpu=8, labels={"pool": "cpu"}, created=LATER_NODE),
    )
    template = {"spec": pod_template(gpu=8, node_selector=POOL)["spec"]}
    queued = (Waiting(KEY, (template,), T0),) if waiting else ()
    capacity = ClusterView(
        nodes=nodes, in_flight=frozenset({KEY}), waiting=queued, nodes_current=current
    )
    config = None if mode is None else parse_spec({"fulfillment": {"mode": mode}})
    return req, capacity, config


def test_an_abandoned_attempt_records_the_arrivals_it_passed_over_then_reclaims_them() -> None:
    """Before: only the nodes it had recorded were reclaimed; an arrival it had passed over
    (tainted against the gang, or not Ready yet) was left behind when its request was deleted."""
    claim, annotate, reclaim = _abandoned("NodesFit", waiting=True)
    assert claim == ClaimNode("n-tainted", "7", KEY)
    assert isinstance(annotate, AnnotateRequest)
    assert set(json.loads(annotate.annotations["gangcheck.io/rollback-nodes"])) == {
        "n-recorded",
        "n-tainted",
    }
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n-recorded", "n-tainted")


@pytest.mark.parametrize(
    ("mode", "waiting"),
    [("TrustProvisioned", True), (None, True), ("NodesFit", False)],
    ids=[
        "trusting Provisioned, nothing is recorded or reclaimed beyond what was",
        "its config unreadable: only what it recorded",
        "not waiting (not Provisioned, or fulfilled): only what it recorded",
    ],
)
def test_an_abandoned_attempt_records_no_more_unless_waiting_in_fit_mode(
    mode: str | None, waiting: bool
) -> None:
    *first, reclaim = _abandoned(mode, waiting)
    assert not [a for a in first if isinstance(a, ClaimNode)]
    assert isinstance(reclaim, ReclaimArrivals)
    assert reclaim.nodes == ("n-recorded",)


@pytest.mark.parametrize(
    ("mode", "waiting", "current", "waits"),
    [
        ("NodesFit", True, False, True),
        ("NodesFit", True, True, False),
        ("TrustProvisioned", True, False, False),
        (None, True, False, False),
        ("NodesFit", False, False, False),
    ],
    ids=[
        "fit mode, waiting, node cache behind: wait (an arrival may be missing)",
        "node cache current: withdraw now",
        "trusting Provisioned: nothing more is recorded, no need to wait",
        "config unreadable: nothing more is recorded, no need to wait",
        "not waiting: nothing more is recorded, no need to wait",
    ],
)
def test_withdrawing_waits_for_the_node_cache_only_when_it_would_record_arrivals(
    mode: str | None, waiting: bool, current: bool, waits: bool
) -> None:
    req, capacity, config = _gone(mode, waiting, current=current)
    assert lifecycle.clean_up_waits((req,), capacity, config) is waits


# ---- a record today's label checks refuse: finished under it all the same -----------------

KARPENTER_AB = {
    "backend": "Karpenter",
    "karpenter": {"nodePools": ["a,b"]},
    "fulfillment": {"reclaimer": "DeleteNodeClaim"},
}
BAD_SELECTOR = {
    "capacitySources": [{"name": "dws", "nodeSelector": {"bad key": "x"}}],
    "fulfillment": {"reclaimer": "DeleteNode"},
}
BAD_DETAIL_KEY = {
    "podSetUpdates": {
        "nodeSelector": [{"key": "a/b/c", "valueFromProvisioningClassDetail": "zone"}]
    },
    "fulfillment": {"reclaimer": "DeleteMachine"},
}


@pytest.mark.parametrize(
    ("record", "config_now", "reclaimer"),
    [
        (KARPENTER_AB, None, "DeleteNodeClaim"),
        (BAD_SELECTOR, None, "DeleteNode"),
        (BAD_DETAIL_KEY, None, "DeleteMachine"),
        (KARPENTER_AB, {"fulfillment": {"reclaimer": "DeleteNode"}}, "DeleteNodeClaim"),
        ({"fulfillment": {"reclaimer": "DeleteNode"}}, None, "DeleteNode"),
        (None, {"fulfillment": {"reclaimer": "DeleteNode"}}, "DeleteNode"),
    ],
    ids=[
        "a Karpenter NodePool list 'a,b': its DeleteNodeClaim, not the default CordonAndTaint",
        "a nodeSelector key no longer valid: its DeleteNode",
        "a podSetUpdates key no longer valid: its DeleteMachine",
        "the config fixed since, with another reclaimer: still the one it was made under",
        "a record valid today: as before",
        "no record (an older version): the config now, as before",
    ],
)
def test_a_withdrawal_reclaims_through_the_reclaimer_its_attempt_was_made_under(
    record: dict[str, Any] | None, config_now: dict[str, Any] | None, reclaimer: str
) -> None:
    """Before: a record the label checks of d698f46 refuse read as none, and the withdrawal
    of its attempt (its config now InvalidConfig) reclaimed through the default reclaimer."""
    notes = {"gangcheck.io/attempt-config": json.dumps(record)} if record else {}
    req = request_of(provisioning_request(REQ, annotations=notes))
    nodes = (node("n0", created=LATER_NODE, annotations=ARRIVED),)
    now = None if config_now is None else parse_spec(config_now)
    *_, reclaim = lifecycle.abandon(req, ClusterView(nodes=nodes), now, "Workload deleted")
    assert isinstance(reclaim, ReclaimArrivals)
    assert (reclaim.nodes, reclaim.reclaimer) == (("n0",), reclaimer)
    assert rollback.reclaimer_of(lifecycle.made_under(req, now)) == reclaimer


@pytest.mark.parametrize("record", [KARPENTER_AB, BAD_SELECTOR, BAD_DETAIL_KEY])
def test_a_record_the_label_checks_refuse_drives_nothing_more(record: dict[str, Any]) -> None:
    """Read to go on with its attempt (an inactive config's, the Karpenter provisioner's), it
    is still refused: nothing more is asked under it until the config is fixed."""
    notes = {"gangcheck.io/attempt-config": json.dumps(record)}
    req = request_of(provisioning_request(REQ, annotations=notes))
    assert lifecycle.recorded_config(req) is None
    assert lifecycle.recorded_config(req, finishing=True) is not None


# ---- what a rollback says, and how loud --------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.said: list[Event] = []

    async def emit(self, ref: ObjectRef, event: Event) -> None:
        self.said.append(event)


@pytest.mark.parametrize(
    ("result", "reason", "warning"),
    [
        (Result("keep", "runs pod other/p"), "NodeKept", False),
        (
            Result("keep", "its fence was refused (403 Forbidden): no", cause="Forbidden"),
            "NodeKept",
            True,
        ),
        (Result("failed", "DeleteNode failed: 500", cause="5xx"), "ReclaimFailed", True),
    ],
    ids=[
        "a node kept by a safety rule: Normal",
        "a node kept because its fence was refused: Warning, a person should look",
        "a reclaim that failed: Warning",
    ],
)
async def test_what_a_reclaim_says_of_a_node_and_how_loud(
    result: Result, reason: str, warning: bool
) -> None:
    recorder = _Recorder()
    await tell(recorder, None, "n1", result, request=f"default/{REQ}")
    assert [(e.reason, e.warning) for e in recorder.said] == [(reason, warning)]


def test_a_rollback_started_and_done_are_normal_events() -> None:
    """As Kueue records its own check turning Retry (AdmissionCheckUpdated, Normal) and the
    eviction that requeues the Workload (Normal): an attempt retried is the designed path.
    Before, both were Warnings."""
    req = request_of(provisioning_request(REQ))
    _, started = rollback.start(req, ClusterView(nodes=()), "Deadline: the gang did not fit")
    assert (started.reason, started.warning) == ("RollbackStarted", False)
    notes = {
        "gangcheck.io/phase": "RollingBack",
        "gangcheck.io/rollback-reason": "Deadline: the gang did not fit",
        "gangcheck.io/outcome": '{"reclaimed": ["n1"], "nodeSeconds": 60}',
    }
    done = rollback.verdict(request_of(provisioning_request(REQ, annotations=notes)))
    assert done is not None
    said = rollback.rolled_back(done)
    assert (said.reason, said.warning) == ("RolledBack", False)
    assert said.message == done.message
