"""capacitySourcePolicy Race, through the admission check's decision: the first raceWidth
sources asked at once, the first to deliver the whole gang wins and the others are withdrawn
with what arrived for them reclaimed; a failed racer's place goes to the next source."""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    ReclaimArrivals,
    ReleaseHold,
)
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.model.objects import request_of, workload_of
from gangcheck.model.provisioning_config import parse_spec, spec_record
from tests.builders import CHECK, node, provisioning_request
from tests.unit.test_admission_decide import GPU_FLAVOR, NOW, gang

A, B, C = "wl-atomic-1", "wl-atomic-1-s1", "wl-atomic-1-s2"
RACE = {
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a"}},
        {"name": "b", "nodeSelector": {"pool": "b"}},
        {"name": "c", "nodeSelector": {"pool": "c"}},
    ],
    "capacitySourcePolicy": "Race",
    "fulfillment": {"reclaimer": "DeleteNode"},
}
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}'


def racer(name: str, source: int, **kw: Any) -> Any:
    notes = {"gangcheck.io/attempt": "1", **kw.pop("annotations", {})}
    if source:
        notes["gangcheck.io/capacity-source"] = str(source)
    templates = [(naming.template_name(name, "workers"), 4)]
    return provisioning_request(name, templates=templates, annotations=notes, **kw)


def provisioned(req: Any) -> Any:
    req["status"]["conditions"] = [
        {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": ""}
    ]
    return req


def arrived(name: str, pool: str, request: str) -> Any:
    return node(
        name,
        gpu=8,
        labels={"pool": pool},
        annotations={"gangcheck.io/arrived-for": f"default/{request}"},
    )


def run(
    requests: list[Any], nodes: list[Any] = (), config: dict[str, Any] | None = None
) -> Decision:  # type: ignore[assignment]
    snap = Snapshot(
        workload=workload_of(gang(4).build()),
        check=CHECK,
        config=parse_spec(config or RACE),
        flavors=GPU_FLAVOR,
        requests=tuple(request_of(r) for r in requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
        ),
        capacity=ClusterView(
            nodes=tuple(nodes),
            in_flight=frozenset(f"default/{r['metadata']['name']}" for r in requests),
        ),
    )
    return decide(snap, NOW)


def created(d: Decision) -> list[dict[str, Any]]:
    return [a.body for a in d.actions if isinstance(a, CreateRequest)]


def test_the_first_race_width_sources_are_asked_at_once_each_pinned_to_its_nodes() -> None:
    d = run([])
    made = created(d)
    assert [r["metadata"]["name"] for r in made] == [A, B]
    templates = [a.body for a in d.actions if isinstance(a, CreateTemplate)]
    assert [t["template"]["spec"]["nodeSelector"]["pool"] for t in templates] == ["a", "b"]
    assert d.check is not None and d.check.state == "Pending"
    assert d.check.message.startswith("racing: ")


def test_the_first_to_deliver_wins_and_the_others_are_withdrawn_with_their_arrivals() -> None:
    nodes = [
        *(arrived(f"b{i}", "b", B) for i in range(4)),  # b delivered the whole gang
        arrived("a0", "a", A),  # a delivered one node so far
    ]
    d = run([racer(A, 0, conditions={"Accepted": "ok"}), provisioned(racer(B, 1))], nodes)
    assert d.check is not None and d.check.state == "Ready"
    update = d.check.pod_set_updates[0]
    assert update["nodeSelector"] == {"pool": "b"}
    assert update["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"] == B
    # the loser goes once the winner is written: Ready waits on none of its round trips
    assert not [a for a in d.actions if isinstance(a, ReclaimArrivals | DeleteRequest)]
    reclaims = [a for a in d.after if isinstance(a, ReclaimArrivals)]
    assert [(r.request, r.nodes) for r in reclaims] == [(A, ("a0",))]
    assert [a.name for a in d.after if isinstance(a, DeleteRequest)] == [A]
    assert "CapacityRaceWon" in {e.reason for e in d.events}


def test_a_failed_racer_gives_its_place_to_the_next_source() -> None:
    rolled = racer(
        A,
        0,
        annotations={
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "Failed: stocked out",
            "gangcheck.io/outcome": OUTCOME,
        },
    )
    d = run([rolled, racer(B, 1, conditions={"Accepted": "ok"})])
    made = created(d)
    assert [r["metadata"]["name"] for r in made] == [C]
    assert made[0]["metadata"]["annotations"]["gangcheck.io/capacity-source"] == "2"
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [A]
    assert d.check is not None and d.check.state == "Pending"


def test_a_racer_deleted_by_hand_gives_its_place_to_the_next_source() -> None:
    """Racer B's request deleted outside gangcheck: the race had one racer fewer than
    raceWidth, silently, source c never asked unless A failed. Now its place goes to the
    next source not asked yet, as a racer that could not deliver gives it, said by a
    RacerReplaced Warning Event; racer A untouched."""
    d = run([racer(A, 0, conditions={"Accepted": "ok"})])
    made = created(d)
    assert [r["metadata"]["name"] for r in made] == [C]
    assert made[0]["metadata"]["annotations"]["gangcheck.io/capacity-source"] == "2"
    assert not [a for a in d.actions if isinstance(a, DeleteRequest)]
    assert d.check is not None and d.check.state == "Pending"
    assert d.check.message.startswith("racing: ")
    (event,) = [e for e in d.events if e.reason == "RacerReplaced"]
    assert event.warning and "deleted outside gangcheck" in event.message
    assert "capacity source 'c'" in event.message and C in event.message


def test_a_racer_deleted_by_hand_with_no_source_left_leaves_the_race_to_the_others() -> None:
    """Every source asked, the racers left told so, then a racer deleted by hand: no source
    is left to ask in its place; A races on alone, nothing asked."""
    told = {"gangcheck.io/sources-raced-all": spec_record(parse_spec(RACE))}
    alone = run([racer(A, 0, conditions={"Accepted": "ok"}, annotations=told)])
    assert created(alone) == []
    assert not [e for e in alone.events if e.reason == "RacerReplaced"]
    assert alone.check is not None and alone.check.state == "Pending"


def test_a_racer_asked_again_under_the_name_of_one_deleted_by_hand_keeps_its_nodes_held() -> None:
    """C took B's place (B failed), then C is deleted by hand, a node having arrived for it:
    only C's own record knew source c was raced, so c is asked again in its place under its
    name (as an InOrder ask deleted by hand is asked again under its name); the new C counts
    the node recorded for it, so its hold is not lifted."""
    held = arrived("c0", "c", C)
    held["spec"]["taints"] = [hold_taint(f"default/{C}")]
    d = run([racer(A, 0, conditions={"Accepted": "ok"})], [held])
    assert [r["metadata"]["name"] for r in created(d)] == [C]
    assert not [a for a in d.actions if isinstance(a, ReleaseHold)], d.actions


def test_every_racer_failed_with_no_source_left_retries() -> None:
    failed = {"Failed": "stocked out"}
    d = run(
        [
            racer(A, 0, conditions=failed),
            racer(B, 1, conditions=failed),
            racer(C, 2, conditions=failed),
        ],
        config={**RACE, "fulfillment": {"mode": "TrustProvisioned"}},
    )
    assert d.check is not None and d.check.state == "Retry"
    assert "every capacity source failed" in d.check.message
    assert sorted(a.name for a in d.actions if isinstance(a, DeleteRequest)) == [A, B, C]


def test_a_ready_race_withdraws_a_loser_left_behind() -> None:
    """A loser not yet withdrawn when the check turned Ready (the node cache was behind) is
    withdrawn after, the winner kept."""
    ready = gang(4)
    wl = ready.build()
    wl["status"]["admissionChecks"][0].update(
        {
            "state": "Ready",
            "podSetUpdates": [
                {
                    "name": "workers",
                    "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": B},
                }
            ],
        }
    )
    snap = Snapshot(
        workload=workload_of(wl),
        check=CHECK,
        config=parse_spec(RACE),
        requests=(request_of(racer(A, 0)), request_of(provisioned(racer(B, 1)))),
        capacity=ClusterView(),
    )
    d = decide(snap, NOW)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [A]


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (
            {**RACE, "raceWidth": 4},
            "spec.raceWidth: 4 sources at once, but spec.capacitySources lists 3",
        ),
        (
            {
                "capacitySources": [{"nodeSelector": {"pool": "a"}}, {}],
                "capacitySourcePolicy": "Race",
            },
            "spec.capacitySources[1].nodeSelector: Race needs each source's node labels",
        ),
        (
            {
                "capacitySources": [
                    {"nodeSelector": {"pool": "a"}},
                    {"nodeSelector": {"zone": "z1"}},
                ],
                "capacitySourcePolicy": "Race",
            },
            "spec.capacitySources[1].nodeSelector: its nodes cannot be told apart from "
            "spec.capacitySources[0]'s",
        ),
        ({"capacitySources": [{}], "raceWidth": 2}, "spec.raceWidth: only with"),
    ],
)
def test_a_race_that_cannot_be_run_is_refused_naming_the_field(
    spec: dict[str, Any], names: str
) -> None:
    with pytest.raises(ValueError) as refused:
        parse_spec(spec)
    assert names in str(refused.value)


def test_the_losers_are_counted_as_failures_of_their_source_by_race_lost() -> None:
    nodes = [*(arrived(f"b{i}", "b", B) for i in range(4))]
    d = run([racer(A, 0, conditions={"Accepted": "ok"}), provisioned(racer(B, 1))], nodes)
    notes = {(n.source, n.outcome, n.reason) for n in d.sources}
    assert ("a", "failed", "RaceLost") in notes
    assert ("b", "delivered", "") in notes


def deleting(req: Any) -> Any:
    req["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    req["metadata"]["finalizers"] = ["example.com/keep"]
    return req


def test_a_race_whose_racers_are_all_being_deleted_waits_for_them_to_go() -> None:
    """The Workload evicted and admitted again under the same attempt number while the
    racers of its earlier admission are still being deleted (a finalizer): before, the race
    followed no racer and said 'every capacity source failed: no source left', Retry (the
    attempt counted failed); nothing is decided on them, nothing asked under their names,
    until they are gone (as an InOrder request being deleted is waited for)."""
    d = run([deleting(racer(A, 0)), deleting(racer(B, 1))])
    assert d.actions == () and d.requeue_after is not None
    # in deletion past the grace (flow.deleting): the wait is said, naming each and its
    # finalizer, the check still Pending, with a Warning once
    assert d.check is not None and d.check.state == "Pending"
    assert d.check.message == "; ".join(
        f"waiting for ProvisioningRequest {name} to be deleted: finalizers [example.com/keep] "
        "remain since 2026-11-30T10:00:00Z"
        for name in ("wl-atomic-1", "wl-atomic-1-s1")
    )
    assert [(e.reason, e.warning) for e in d.events] == [("RequestStuckDeleting", True)]
    one = run([deleting(racer(A, 0)), racer(B, 1, conditions={"Accepted": "ok"})])
    assert created(one) == [] and one.check is not None and one.check.state == "Pending"


def test_a_race_in_flight_when_the_policy_turns_in_order_is_finished_as_a_race() -> None:
    """capacitySourcePolicy edited from Race to InOrder while the race runs (both racers made
    under the Race config they record): B delivers the whole gang and wins as in any race,
    and A, still waiting with a node that arrived for it, is withdrawn with that node
    reclaimed. Before, the attempt was followed as InOrder: A was deleted as 'superseded by
    attempt 1' (the same attempt) and the node that arrived for it was left, not reclaimed."""
    made = {"gangcheck.io/attempt-config": spec_record(parse_spec(RACE))}
    in_order = {k: v for k, v in RACE.items() if k != "capacitySourcePolicy"}
    nodes = [*(arrived(f"b{i}", "b", B) for i in range(4)), arrived("a0", "a", A)]
    asks = [
        racer(A, 0, conditions={"Accepted": "ok"}, annotations=made),
        provisioned(racer(B, 1, annotations=made)),
    ]
    d = run(asks, nodes, config=in_order)
    assert d.check is not None and d.check.state == "Ready"
    update = d.check.pod_set_updates[0]
    assert update["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"] == B
    reclaims = [a for a in (*d.actions, *d.after) if isinstance(a, ReclaimArrivals)]
    assert [(r.request, r.nodes) for r in reclaims] == [(A, ("a0",))]
    assert "CapacityRaceWon" in {e.reason for e in d.events}
