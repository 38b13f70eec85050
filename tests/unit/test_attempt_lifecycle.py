"""Table tests of the attempt core: where one attempt stands, for any gang source."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import AnnotateRequest, ClaimNode, ReclaimArrivals
from gangcheck.logic.attempt.fulfillment import ClusterView, GangSpec
from gangcheck.logic.attempt.lifecycle import Attempt, Progress
from gangcheck.logic.sources.provreq import PROVISIONING_REQUEST
from gangcheck.model.objects import request_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import node, pod_template, provisioning_request

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
LATER = datetime(2026, 11, 30, 10, 20, tzinfo=UTC)  # past the deadline below
DEADLINE = {"gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z"}
ROLLING = {"gangcheck.io/phase": "RollingBack", "gangcheck.io/rollback-reason": "Failed: broke"}
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}'
GANG = GangSpec((("workers", 4, pod_template(gpu=1)),))


@dataclass
class Case:
    id: str
    conditions: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=lambda: dict(DEADLINE))
    fit: bool = True
    started: bool = False
    now: datetime = NOW
    # expectations
    progress: Progress = Progress.WAITING
    message: str = ""
    action: type | None = None


CASES = [
    Case("a request not accepted yet waits", message="to be accepted"),
    Case("an accepted request waits with the autoscaler's word", {"Accepted": "soon"},
         message="accepted"),
    Case("a provisioned request is trusted outside fit mode", {"Provisioned": "done"},
         fit=False, progress=Progress.FITS, message="done"),
    Case("a provisioned request with no nodes yet waits in fit mode", {"Provisioned": ""},
         message="capacity requested, not yet usable"),
    Case("a failed request rolls back in fit mode", {"Failed": "no capacity"},
         progress=Progress.ROLLING_BACK, message="Failed: no capacity", action=AnnotateRequest),
    Case("a failed request fails outside fit mode", {"Failed": "no capacity"}, fit=False,
         progress=Progress.FAILED, message="no capacity"),
    Case("revoked capacity is revoked outside fit mode", {"CapacityRevoked": ""}, fit=False,
         progress=Progress.REVOKED, message="capacity revoked"),
    Case("an expired booking ends an attempt not started", {"BookingExpired": "late"},
         fit=False, progress=Progress.EXPIRED, message="late"),
    Case("an expired booking is moot once the gang started",
         {"Provisioned": "done", "BookingExpired": "late"}, fit=False, started=True,
         progress=Progress.FITS),
    Case("the deadline passed without a fit: roll back", {"Accepted": ""}, now=LATER,
         progress=Progress.ROLLING_BACK, message="Deadline:", action=AnnotateRequest),
    Case("a rollback under way reclaims what arrived", annotations={**DEADLINE, **ROLLING},
         progress=Progress.ROLLING_BACK, action=ReclaimArrivals),
    Case("a rollback with its outcome recorded is done",
         annotations={**DEADLINE, **ROLLING, "gangcheck.io/outcome": OUTCOME},
         progress=Progress.ROLLED_BACK, message="rolled back wl-atomic-1 (Failed: broke)"),
]  # fmt: skip


def attempt(case: Case) -> Attempt:
    obj = provisioning_request(
        "wl-atomic-1",
        templates=[("ppt-wl-atomic-1-workers", 4)],
        conditions=case.conditions,
        annotations=case.annotations,
    )
    req = request_of(obj)
    mode = "NodesFit" if case.fit else "TrustProvisioned"
    return Attempt(
        request=req,
        status=PROVISIONING_REQUEST.status_of(req),
        gang=GANG,
        capacity=ClusterView(),
        config=parse_spec({"fulfillment": {"mode": mode}}),
        fit=case.fit,
        started=case.started,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_follow(case: Case) -> None:
    step = lifecycle.follow(attempt(case), case.now)
    assert step.progress is case.progress
    assert case.message in step.message
    if case.action is not None:
        assert [type(a) for a in step.actions] == [case.action]
    if step.progress is Progress.WAITING:
        assert step.requeue_after is not None and 0.2 <= step.requeue_after <= 5.0


@pytest.mark.parametrize(
    ("attempt_number", "seconds"),
    [(1, 60), (2, 120), (3, 240), (4, None)],
    ids=["first", "second", "third", "past backoffLimitCount: give up"],
)
def test_the_next_attempt_follows_kueues_backoff(attempt_number: int, seconds: Any) -> None:
    strategy = parse_spec({}).retry_strategy
    assert lifecycle.next_attempt(attempt_number, strategy) == seconds


@pytest.mark.timeout(5)
@pytest.mark.parametrize("attempt_number", [64, 2_147_483_647, 10**15])
def test_a_huge_attempt_number_backs_off_by_the_most_at_once(attempt_number: int) -> None:
    """A PodGroup's owner may write any attempt on it (gangcheck.io/attempt), and a config
    may allow int32's most retries: the backoff is backoffMaxSeconds, worked out without
    2 ** attempt (a number of a billion bits took seconds and hundreds of MB, on the one
    thread that serves every gang)."""
    strategy = parse_spec({"retryStrategy": {"backoffLimitCount": 2_147_483_647}}).retry_strategy
    assert lifecycle.backoff_seconds(attempt_number, strategy) == 1800
    assert lifecycle.next_attempt(min(attempt_number, 2_147_483_647), strategy) == 1800


def test_a_new_attempt_records_its_number_deadline_and_reserved_members() -> None:
    assert lifecycle.record(2, parse_spec({}), NOW, reserved=3) == {
        "gangcheck.io/attempt": "2",
        "gangcheck.io/fulfillment-deadline": "2026-11-30T10:12:00Z",
        "gangcheck.io/reserved-members": "3",
        "gangcheck.io/attempt-config": "{}",
    }


def _rolling_back_with(nodes: list[dict[str, Any]], conditions: dict[str, str]) -> Any:
    case = Case("-", conditions, now=LATER)
    base = attempt(case)
    capacity = ClusterView(nodes=nodes, in_flight=frozenset({KEY, "default/other-1"}))
    return lifecycle.follow(Attempt(**{**base.__dict__, "capacity": capacity}), case.now)


KEY = "default/wl-atomic-1"
RECORDED = node(
    "n-recorded",
    gpu=1,
    created="2026-11-30T10:01:00Z",
    annotations={"gangcheck.io/arrived-for": KEY},
)
UNRECORDED = node("n-unrecorded", gpu=1, created="2026-11-30T10:02:00Z")
OLDER = node("n-older", gpu=1, created="2026-11-30T09:00:00Z")
OTHERS = node(
    "n-others",
    gpu=1,
    created="2026-11-30T10:02:00Z",
    annotations={"gangcheck.io/arrived-for": "default/other-1"},
)


@pytest.mark.parametrize(
    ("conditions", "claimed"),
    [
        ({"Provisioned": ""}, ["n-unrecorded"]),
        ({"Provisioned": "", "Failed": "late"}, ["n-unrecorded"]),
        ({"Accepted": ""}, []),
    ],
    ids=[
        "past the deadline, an arrival whose record was lost is recorded, then reclaimed",
        "a late failure records an unrecorded arrival too",
        "nothing is claimed for a request never provisioned",
    ],
)  # fmt: skip
def test_a_rollback_records_the_arrivals_it_may_still_claim(
    conditions: dict[str, str], claimed: list[str]
) -> None:
    step = _rolling_back_with([RECORDED, UNRECORDED, OLDER, OTHERS], conditions)
    assert step.progress is Progress.ROLLING_BACK
    claims = [a for a in step.actions if isinstance(a, ClaimNode)]
    assert [c.name for c in claims] == claimed
    assert all(c.request == KEY for c in claims)
    annotate = step.actions[-1]
    assert isinstance(annotate, AnnotateRequest)  # after the claims: recorded only once claimed
    recorded = json.loads(annotate.annotations["gangcheck.io/rollback-nodes"])
    assert sorted(recorded) == sorted(["n-recorded", *claimed])


def test_a_rollback_does_not_start_from_a_node_cache_that_has_not_caught_up() -> None:
    """Its watch failed (an apiserver restart): a node that registered meanwhile is missing
    from the cache, and a rollback recording the arrivals now would leave it unrecorded. It
    writes nothing and looks again; once the cache is current it starts as ever."""
    case = Case("-", {"Provisioned": ""}, now=LATER)
    base = attempt(case)
    stale = ClusterView(nodes=[RECORDED], in_flight=frozenset({KEY}), nodes_current=False)
    step = lifecycle.follow(Attempt(**{**base.__dict__, "capacity": stale}), case.now)
    assert step.progress is Progress.ROLLING_BACK
    assert step.actions == () and step.events == ()
    assert step.requeue_after == lifecycle.CATCH_UP_REQUEUE_SECONDS
    assert "node cache" in step.message and step.message.startswith("Deadline")
    caught_up = ClusterView(nodes=[RECORDED, UNRECORDED], in_flight=frozenset({KEY}))
    step = lifecycle.follow(Attempt(**{**base.__dict__, "capacity": caught_up}), case.now)
    claims = [a.name for a in step.actions if isinstance(a, ClaimNode)]
    assert claims == ["n-unrecorded"] and isinstance(step.actions[-1], AnnotateRequest)


@pytest.mark.parametrize("phase", ["Fulfilled", "Kept"])
def test_a_rollback_of_an_attempt_that_claims_no_more_records_no_node_arrived_since(
    phase: str,
) -> None:
    """A fulfilled attempt (its gang released; a growth delivered) or a kept one claims no
    new node: one that registered since, younger than its request and fitting a member, came
    for someone else (another workload's scale-up, its pods not bound yet). Its start
    watchdog's rollback reclaims only what it recorded: recording that node too held it for
    the gang and reclaimed it (empty yet: deleted)."""
    base = attempt(Case("-", {"Provisioned": ""}, annotations={"gangcheck.io/phase": phase}))
    capacity = ClusterView(nodes=[RECORDED, UNRECORDED, OLDER], in_flight=frozenset())
    step = lifecycle.start_rollback(
        Attempt(**{**base.__dict__, "capacity": capacity}),
        "StartDeadline: 3 of 4 members scheduled",
        now=LATER,
    )
    assert [a for a in step.actions if isinstance(a, ClaimNode)] == []
    annotate = step.actions[-1]
    assert isinstance(annotate, AnnotateRequest)
    assert sorted(json.loads(annotate.annotations["gangcheck.io/rollback-nodes"])) == ["n-recorded"]
