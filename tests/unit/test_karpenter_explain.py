"""What diagnose and status say of a Karpenter attempt's NodeClaims (the pure part).

The claims are built as the provisioner builds them (tests/unit/test_karpenter_logic.py);
listing them on a real API server, with and without Karpenter's CRDs, is proven in
tests/integration/test_diagnose.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.diagnose import (
    DiagnoseReport,
    GroupReport,
    StatusReport,
    attempt_node_claims,
    render_text,
    to_json,
)
from gangcheck.logic.attempt.explain import RequestFacts, Verdict
from gangcheck.logic.sources.karpenter.claims import ClaimAsk, claim_bodies
from gangcheck.logic.sources.karpenter.explain import (
    ClaimFacts,
    NodeClaimFacts,
    attempt_key,
    attempt_selector,
    claim_rows,
    is_karpenter,
    node_claim_facts,
    request_claims,
    unreadable,
)
from gangcheck.logic.sources.karpenter.packing import PackedClaim
from gangcheck.logic.workloads.diagnosis import Facts, Target
from gangcheck.model.objects import Condition
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from tests.fakes.kube import FakeKube
from tests.unit.test_group_diagnosis import Case, facts_of, group, members
from tests.unit.test_karpenter_logic import ASK, ATTEMPT, pool
from tests.unit.test_status_table import cells, table, workload_row

Obj = dict[str, Any]
NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
FOUR = [claim["metadata"]["name"] for claim in claim_bodies(pool(), ASK)]


def claim(index: int, status: Obj | None = None, *, deleting: bool = False) -> Obj:
    body = claim_bodies(pool(), ASK)[index]
    body["status"] = status or {}
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return body


def cond(kind: str, status: str = "True", reason: str = "", message: str = "") -> Obj:
    return {"type": kind, "status": status, "reason": reason, "message": message}


INITIALIZED = {
    "nodeName": "n-0",
    "conditions": [cond("Launched"), cond("Registered"), cond("Initialized")],
}
NO_CAPACITY = {
    "conditions": [cond("Launched", "False", "InsufficientCapacity", "no offering left")]
}


def rows_of(facts: NodeClaimFacts) -> list[tuple[str, ...]]:
    """Each claim's row, and its message ("-": none)."""
    rows = claim_rows(facts)[1:]
    return [(*row, c.message or "-") for row, c in zip(rows, facts.claims, strict=True)]


@pytest.mark.parametrize(
    ("claims", "asked", "accepted", "summary", "rows"),
    [
        pytest.param(
            [claim(0, INITIALIZED), claim(1, NO_CAPACITY)],
            2,
            True,
            f"1 of 2 NodeClaims arrived; {FOUR[1]}: InsufficientCapacity: no offering left",
            [
                (FOUR[0], "gpu", "Initialized", "n-0", "-"),
                (
                    FOUR[1],
                    "gpu",
                    "LaunchFailing",
                    "-",
                    "InsufficientCapacity: no offering left",
                ),
            ],
            id="one arrived, one failing to launch",
        ),
        pytest.param(
            [claim(0, INITIALIZED), claim(1, deleting=True)],
            3,
            True,
            "1 of 3 NodeClaims arrived; 2 lost (gone before the gang started: Karpenter "
            "deletes a claim it cannot launch, e.g. InsufficientCapacityError, see the claim's "
            "Events; one deleted by hand or with its NodePool is lost too)",
            [
                (FOUR[0], "gpu", "Initialized", "n-0", "-"),
                (FOUR[1], "gpu", "Lost", "-", "being deleted before it arrived"),
            ],
            id="lost: being deleted, or gone",
        ),
        pytest.param(
            [claim(1, {"conditions": [cond("Launched")]}), claim(0)],
            2,
            True,
            "0 of 2 NodeClaims arrived",
            [(FOUR[0], "gpu", "Requested", "-", "-"), (FOUR[1], "gpu", "Launched", "-", "-")],
            id="in index order",
        ),
        pytest.param([], 4, False, "", [], id="not created yet"),
        pytest.param(
            [],
            2,
            True,
            "0 of 2 NodeClaims arrived; 2 lost (gone before the gang started: Karpenter "
            "deletes a claim it cannot launch, e.g. InsufficientCapacityError, see the claim's "
            "Events; one deleted by hand or with its NodePool is lost too)",
            [],
            id="made, then all gone",
        ),
    ],
)
def test_claims_become_one_row_each_and_the_requests_summary(
    claims: list[Obj], asked: int, accepted: bool, summary: str, rows: list[tuple[str, ...]]
) -> None:
    facts = node_claim_facts(claims, ATTEMPT, asked, accepted=accepted)
    assert facts.summary == summary
    assert rows_of(facts) == rows
    assert facts.line == (summary or "no NodeClaims for this attempt")


def test_claims_of_other_attempts_are_not_shown() -> None:
    other = claim_bodies(pool(), ClaimAsk("team-a/other-1", 1, {"cpu": "1"}))
    unlabelled = claim(0)
    unlabelled["metadata"]["labels"] = {}
    facts = node_claim_facts([*other, unlabelled, claim(1, INITIALIZED)], ATTEMPT, 2)
    assert [c.name for c in facts.claims] == [FOUR[1]]
    assert (facts.arrived, facts.asked) == (1, 2)


def test_unreadable_claims_say_why_and_count_nothing() -> None:
    facts = unreadable(4, "NodeClaims are not served here")
    assert facts.line == "NodeClaims: not readable (NodeClaims are not served here)"
    assert (facts.claims, facts.arrived, claim_rows(facts)) == ((), 0, [])


def request(class_name: str = KARPENTER_CLASS, found: bool = True, **conds: str) -> RequestFacts:
    conditions = {k: Condition(k, v) for k, v in conds.items()}
    return RequestFacts(
        "train-1", 1, found=found, conditions=conditions, members=2, class_name=class_name
    )


@pytest.mark.parametrize(
    ("req", "karpenter"),
    [
        (request(), True),
        (request("best-effort-atomic-scale-up.autoscaling.x-k8s.io"), False),
        (request(found=False), False),
        (None, False),
    ],
)
def test_only_a_karpenter_class_request_has_claims(
    req: RequestFacts | None, karpenter: bool
) -> None:
    assert is_karpenter(req) is karpenter


def test_a_requests_claims_are_found_by_its_key_and_selector() -> None:
    key = attempt_key("team-a", request())
    assert key == "team-a/train-1"
    body = claim_bodies(pool(), ClaimAsk(key, 2, {"cpu": "1"}))
    label, value = attempt_selector(key).split("=")
    assert all(b["metadata"]["labels"][label] == value for b in body)
    found = request_claims(body, "team-a", request(Accepted="True"))
    assert (len(found.claims), found.arrived, found.asked) == (2, 0, 2)
    assert request_claims([], "team-a", request()).line == "no NodeClaims for this attempt"


SOME = NodeClaimFacts(
    2,
    claims=(
        ClaimFacts("gpu-abc-0", "gpu", "Initialized", "n-0"),
        ClaimFacts("gpu-abc-1", "gpu", "LaunchFailing", message="InsufficientCapacity: none"),
    ),
    arrived=1,
    summary="1 of 2 NodeClaims arrived; gpu-abc-1: InsufficientCapacity: none",
)


def workload_report(claims: NodeClaimFacts | None) -> DiagnoseReport:
    facts = Facts("team-a", "wl")
    blocked = Verdict(True, "nodes", "waiting")
    return DiagnoseReport(Target("workload", "team-a", "wl"), facts, blocked, NOW, claims)


def test_diagnose_shows_a_claims_section_in_text_and_json() -> None:
    text = render_text(workload_report(SOME)).splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("claims "))
    assert text[start] == f"claims    {SOME.summary}"
    assert text[start + 1].split() == ["NAME", "NODEPOOL", "PHASE", "NODE"]
    assert text[start + 2].split() == ["gpu-abc-0", "gpu", "Initialized", "n-0"]
    assert text[start + 3].split() == ["gpu-abc-1", "gpu", "LaunchFailing", "-"]
    assert text[start + 4] == f"{'':10}    InsufficientCapacity: none"
    got = to_json(workload_report(SOME))["nodeClaims"]
    assert (got["readable"], got["asked"], got["arrived"]) == (True, 2, 1)
    assert got["claims"][1] == {
        "name": "gpu-abc-1",
        "nodePool": "gpu",
        "phase": "LaunchFailing",
        "node": None,
        "message": "InsufficientCapacity: none",
    }


def test_diagnose_says_claims_are_not_readable_and_nothing_without_karpenter() -> None:
    report = workload_report(unreadable(2, "forbidden"))
    assert "claims    NodeClaims: not readable (forbidden)" in render_text(report).splitlines()
    assert to_json(report)["nodeClaims"]["problem"] == "forbidden"
    plain = workload_report(None)
    assert "claims" not in render_text(plain) and to_json(plain)["nodeClaims"] is None


def test_a_podgroups_diagnosis_shows_its_claims_too() -> None:
    facts = facts_of(Case("w", group(2, state="WaitingForMembers"), members(2), "", ""))
    report = GroupReport(Target("podgroup", "default", "g"), facts, Verdict(True, "x", "y"), NOW)
    with_claims = GroupReport(report.target, facts, report.verdict, NOW, claims=SOME)
    assert "claims" not in render_text(report)
    assert "claims    1 of 2 NodeClaims arrived" in render_text(with_claims)
    assert to_json(with_claims)["nodeClaims"]["summary"] == SOME.summary


def test_status_shows_arrived_of_asked_claims_for_karpenter_attempts() -> None:
    rows = table(workload_row(), workload_row(name="k", claims_arrived=1, claims_asked=4, needed=4))
    assert cells(rows, "NODES") == ["2 arrived, none usable", "1/4 claims"]
    listed = to_json(StatusReport("ns", (workload_row(claims_arrived=0, claims_asked=2),), NOW))
    assert (listed["items"][0]["nodeClaimsArrived"], listed["items"][0]["nodeClaimsAsked"]) == (
        0,
        2,
    )


# ---- the edge: one list, optional ---------------------------------------------------------


async def test_diagnose_lists_the_attempts_claims_once_by_its_label() -> None:
    kube = FakeKube()
    mine = claim_bodies(pool(), ClaimAsk("team-a/train-1", 2, {"cpu": "1"}))
    kube.add(*mine, *claim_bodies(pool("other"), ClaimAsk("team-a/other-1", 1, {"cpu": "1"})))
    facts = await attempt_node_claims(kube, "team-a", request(Accepted="True"))
    assert facts is not None and [c.name for c in facts.claims] == [
        c["metadata"]["name"] for c in mine
    ]
    assert [(c.verb, c.kind) for c in kube.calls] == [("list", "NodeClaim")]
    assert await attempt_node_claims(kube, "team-a", request("other.example.com")) is None
    assert len(kube.calls) == 1


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        (404, "NodeClaims are not served here: Karpenter's CRDs are not installed"),
        (403, "forbidden: NodeClaim '': Forbidden"),
        (500, "500 InternalError: NodeClaim '': InternalError"),
    ],
)
async def test_claims_that_cannot_be_listed_are_not_readable_never_an_error(
    status: int, problem: str
) -> None:
    kube = FakeKube()
    kube.fail("list", "NodeClaim", error=status)
    facts = await attempt_node_claims(kube, "team-a", request())
    assert facts == unreadable(2, problem)


def test_claims_the_request_never_recorded_are_counted_by_what_they_say() -> None:
    """No Accepted (gangcheck stopped between creating the claims and recording them): the
    claims say how many were made, not the members; a packed claim for both members is 1 of 1,
    nothing lost."""
    key = attempt_key("team-a", request())
    both = PackedClaim({"cpu": 2}, ("member 0", "member 1"))
    body = claim_bodies(pool(), ClaimAsk.packing(key, [both], {}))
    found = request_claims(body, "team-a", request())
    assert (len(found.claims), found.asked) == (1, 1)
    assert found.summary == "0 of 1 NodeClaims arrived"
