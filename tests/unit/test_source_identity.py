"""An attempt follows the capacity source it was made with (its record), not whichever source
sits at its index now: a source removed or changed mid-attempt is seen (rolled back before
Provisioned, as any config change), and a provisioned attempt is pinned to the nodes of the
source it asked, for a Kueue Workload and for a PodGroup alike (driver.in_flight,
lifecycle.asked_source)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    CreateRequest,
    DeleteRequest,
    ReleaseMembers,
)
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.podgroups.podgroup import decide as decide_group
from gangcheck.logic.workloads.admission import decide
from gangcheck.model.names import CONSUME_ANNOTATION
from gangcheck.model.objects import request_of, workload_of
from gangcheck.model.provisioning_config import (
    CHECK_CAPACITY,
    QUEUED_PROVISIONING,
    parse_spec,
    spec_record,
)
from tests.builders import CHECK, node
from tests.unit import test_podgroup_growth as growth_tests
from tests.unit import test_race_adapters as race_tests
from tests.unit import test_topup as topup_tests
from tests.unit.test_admission_decide import NOW, gang
from tests.unit.test_capacity_sources import (
    SECOND,
    TRUST_MODE,
    _group_decide,
    _group_request,
    request,
    run,
)
from tests.unit.test_podgroup_decide import group, members

ON_DEMAND = {"name": "on-demand", "nodeSelector": {"pool": "a"}}
DWS = {
    "name": "dws",
    "provisioningClassName": CHECK_CAPACITY,
    "parameters": {"x": "1"},
    "nodeSelector": {"pool": "b"},
}
SPOT = {**DWS, "name": "spot", "nodeSelector": {"pool": "c"}}
MADE_UNDER = [ON_DEMAND, DWS, SPOT]


def unnamed(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "name"} for s in sources]


def config(sources: list[dict[str, Any]], *, trust: bool = False) -> dict[str, Any]:
    return {"capacitySources": sources, **(TRUST_MODE if trust else {})}


def recorded(sources: list[dict[str, Any]] | None) -> dict[str, str]:
    """The record of an attempt made under `sources` (none: a record of an older version)."""
    if sources is None:
        return {}
    return {"gangcheck.io/attempt-config": spec_record(parse_spec(config(sources)))}


PROVISIONED = {"Provisioned": "ok"}


@dataclass
class Case:
    id: str
    now: list[dict[str, Any]]
    """The config's sources now (the attempt asked dws, index 1, under MADE_UNDER)."""
    provisioned: bool
    made_under: list[dict[str, Any]] | None = field(default_factory=lambda: MADE_UNDER)
    rolled_back: str | None = None
    """Before Provisioned: the rollback reason (None: the attempt goes on)."""
    pinned: str | None = None
    """Provisioned: the pool the gang is pinned to."""


CASES = [
    Case(
        "dws removed, not provisioned: rolled back naming the field",
        [ON_DEMAND, SPOT],
        provisioned=False,
        rolled_back="ConfigChanged: spec.capacitySources[1] (dws) left the config",
    ),
    Case(
        "dws removed, provisioned: kept, pinned to dws's nodes",
        [ON_DEMAND, SPOT],
        provisioned=True,
        pinned="b",
    ),
    Case(
        "unnamed dws removed, not provisioned: the spot source after it is not taken for it",
        unnamed([ON_DEMAND, SPOT]),
        made_under=unnamed(MADE_UNDER),
        provisioned=False,
        rolled_back="ConfigChanged: spec.capacitySources[1] left the config",
    ),
    Case(
        "unnamed dws removed, provisioned: pinned to dws's nodes",
        unnamed([ON_DEMAND, SPOT]),
        made_under=unnamed(MADE_UNDER),
        provisioned=True,
        pinned="b",
    ),
    Case(
        "dws's nodeSelector edited, not provisioned: rolled back",
        [ON_DEMAND, {**DWS, "nodeSelector": {"pool": "d"}}, SPOT],
        provisioned=False,
        rolled_back=(
            "ConfigChanged: spec.capacitySources[1] (dws): nodeSelector "
            "{'pool': 'b'} -> {'pool': 'd'}"
        ),
    ),
    Case(
        "dws's nodeSelector edited, provisioned: pinned where it asked",
        [ON_DEMAND, {**DWS, "nodeSelector": {"pool": "d"}}, SPOT],
        provisioned=True,
        pinned="b",
    ),
    Case(
        "dws's class edited, not provisioned: rolled back naming the field",
        [ON_DEMAND, {**DWS, "provisioningClassName": QUEUED_PROVISIONING}, SPOT],
        provisioned=False,
        rolled_back=(
            f"ConfigChanged: spec.capacitySources[1] (dws): class {CHECK_CAPACITY!r} -> "
            f"{QUEUED_PROVISIONING!r}"
        ),
    ),
    Case(
        "dws's parameters edited, not provisioned: rolled back naming the field",
        [ON_DEMAND, {**DWS, "parameters": {"x": "2"}}, SPOT],
        provisioned=False,
        rolled_back="ConfigChanged: spec.capacitySources[1] (dws): the request parameters changed",
    ),
    Case(
        "dws's class edited, provisioned: kept, pinned where it asked",
        [ON_DEMAND, {**DWS, "provisioningClassName": QUEUED_PROVISIONING}, SPOT],
        provisioned=True,
        pinned="b",
    ),
    Case(
        "on-demand removed, not provisioned: dws moved up, spot is not taken for it",
        [DWS, SPOT],
        provisioned=False,
        rolled_back="ConfigChanged: spec.capacitySources[1] (dws) is spec.capacitySources[0] now",
    ),
    Case(
        "a record without attempt-config, its index gone: by index as before, the field named",
        [ON_DEMAND],
        made_under=None,
        provisioned=False,
        rolled_back="ConfigChanged: spec.capacitySources[1] left the config",
    ),
]


def _workload_request(case: Case) -> Any:
    return request(
        SECOND,
        source=1,
        annotations=recorded(case.made_under),
        conditions=PROVISIONED if case.provisioned else {"Accepted": "ok"},
    )


@pytest.mark.parametrize("case", [c for c in CASES if not c.provisioned], ids=lambda c: c.id)
def test_a_workloads_attempt_whose_source_left_or_changed_is_rolled_back(case: Case) -> None:
    d = run(config(case.now), [_workload_request(case)])
    rolling = [a for a in d.actions if isinstance(a, AnnotateRequest)]
    assert [a.annotations.get("gangcheck.io/rollback-reason") for a in rolling] == [
        case.rolled_back
    ]
    assert rolling[0].annotations["gangcheck.io/phase"] == "RollingBack"
    assert not any(isinstance(a, CreateRequest) for a in d.actions)
    assert d.check is None  # the check stays Pending while what arrived goes back


@pytest.mark.parametrize("case", [c for c in CASES if not c.provisioned], ids=lambda c: c.id)
def test_trusting_provisioned_a_workload_retries_naming_the_source(case: Case) -> None:
    d = run(config(case.now, trust=True), [_workload_request(case)])
    assert d.check is not None and d.check.state == "Retry"
    said = (case.rolled_back or "").removeprefix("ConfigChanged: ")
    assert d.check.message == f"Retrying after config change: {said}"


@pytest.mark.parametrize("case", [c for c in CASES if c.provisioned], ids=lambda c: c.id)
def test_a_provisioned_workload_is_pinned_to_the_source_it_asked(case: Case) -> None:
    d = run(config(case.now, trust=True), [_workload_request(case)])
    assert d.check is not None and d.check.state == "Ready", d.check
    for update in d.check.pod_set_updates:
        assert update["nodeSelector"] == {"pool": case.pinned}
    # its delivery is counted for the source it asked
    assert [(n.source, n.outcome) for n in d.sources] == [
        ("dws" if case.made_under == MADE_UNDER else "source-1", "delivered")
    ]


def _group_case_request(case: Case) -> Any:
    made = _group_request("g-pg-1-s1", source=1, **recorded(case.made_under))
    if case.provisioned:
        made["status"]["conditions"] = [
            {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": ""}
        ]
    return made


@pytest.mark.parametrize("case", [c for c in CASES if not c.provisioned], ids=lambda c: c.id)
def test_a_pod_groups_attempt_whose_source_left_or_changed_is_rolled_back(case: Case) -> None:
    d = _group_decide(config(case.now), [_group_case_request(case)])
    rolling = [a for a in d.actions if isinstance(a, AnnotateRequest)]
    assert [a.annotations.get("gangcheck.io/rollback-reason") for a in rolling] == [
        case.rolled_back
    ]
    assert not any(isinstance(a, ReleaseMembers) for a in d.actions)


@pytest.mark.parametrize("case", [c for c in CASES if c.provisioned], ids=lambda c: c.id)
def test_a_provisioned_pod_group_is_released_onto_the_source_it_asked(case: Case) -> None:
    """The nodes came in the pool the attempt asked (b): the gang fits there and is pinned
    there, whatever source sits at its index now."""
    nodes = tuple(node(f"n{i}", gpu=1, labels={"pool": "b"}) for i in range(3))
    d = _group_decide(config(case.now), [_group_case_request(case)], nodes)
    release = next(a for a in d.actions if isinstance(a, ReleaseMembers))
    assert release.node_selector.get("pool") == case.pinned
    assert d.status["gangcheck.io/state"] == "Released"


# ---- a provisioned attempt kept under a source that left: no next place from its index ----

A_B_C = {
    "capacitySources": [
        {"name": "a", "nodeSelector": {"pool": "a"}, "deadlineSeconds": 20},
        {"name": "b", "nodeSelector": {"pool": "b"}},
        {"name": "c", "nodeSelector": {"pool": "c"}},
    ],
    "fulfillment": {"reclaimer": "DeleteNode"},
    "retryStrategy": {"backoffLimitCount": 3},
}
#: a removed: b sits at a's index now.
B_C = {**A_B_C, "capacitySources": A_B_C["capacitySources"][1:]}
ROLLED_BACK = {
    "phase": "RollingBack",
    "rollback_reason": "Deadline: the gang did not fit within 20s",
    "outcome": '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}',
}


def _through(kind: str, requests: list[Any], nodes: list[Any]) -> Any:
    if kind == "Workload":
        snap = topup_tests.Snapshot(
            workload=workload_of(gang(4).build()),
            check=CHECK,
            config=parse_spec(B_C),
            flavors=topup_tests.FLAVOR,
            requests=tuple(request_of(r) for r in requests),
            templates=frozenset(
                p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
            ),
            capacity=ClusterView(
                nodes=tuple(nodes),
                in_flight=frozenset(f"default/{r['metadata']['name']}" for r in requests),
            ),
        )
        return topup_tests.seen(decide(snap, NOW))
    obj = group(4, annotations=dict(topup_tests.PROVISIONING))
    d = decide_group(topup_tests.in_flight(obj, members(4), B_C, requests, nodes), NOW)
    state = (d.status or {}).get("gangcheck.io/state", "")
    return topup_tests._seen(d.actions, d.events, state=topup_tests.WORDS.get(state, state))


@pytest.mark.parametrize("kind", topup_tests.KINDS)
def test_a_provisioned_attempt_whose_source_left_is_not_topped_up_from_its_index(
    kind: str,
) -> None:
    """a delivered 2 of 4 and its deadline passed, a having left the config meanwhile: what
    arrived goes back by a rollback, the attempt asks no next source from a's old index (b
    now; c would be asked as 'next')."""
    made = {"attempt_config": spec_record(parse_spec(A_B_C))}
    req = topup_tests.request(0, 4, kind=kind, fulfillment_deadline=topup_tests.PAST, **made)
    nodes = [topup_tests.gpu_node(n, "a", arrived_for=topup_tests.A, kind=kind) for n in "01"]
    s = _through(kind, [req], nodes)
    a = topup_tests.ask(0, kind)
    assert s.annotated[a]["gangcheck.io/phase"] == "RollingBack"
    assert s.annotated[a]["gangcheck.io/rollback-reason"].startswith("Deadline: ")
    assert s.created == {}


@pytest.mark.parametrize("kind", topup_tests.KINDS)
def test_a_rolled_back_attempt_whose_source_left_does_not_fall_back_from_its_index(
    kind: str,
) -> None:
    """Its rollback done, the attempt ends as a config change does: the next attempt (a
    Workload's Retry, a PodGroup's next) asks the new list from its first source."""
    made = {"attempt_config": spec_record(parse_spec(A_B_C)), **ROLLED_BACK}
    req = topup_tests.request(0, 4, kind=kind, **made)
    s = _through(kind, [req], [])
    assert s.created == {}
    assert s.state == "retry"


# ---- Race: a racer whose source left once Provisioned wins as the source it asked ---------


@pytest.mark.parametrize("adapter", race_tests.ADAPTERS, ids=lambda a: a.name)
def test_a_racer_whose_source_left_after_provisioned_wins_as_the_source_it_asked(
    adapter: race_tests.Adapter,
) -> None:
    """Racing a and b of [a, b, c]; b is removed (c moves to its index) after it said
    Provisioned, and its nodes came in pool b: b wins, pinned to pool b, named b (its
    delivery counted for b, the group's race-won-by b), not c."""
    made = {"gangcheck.io/attempt-config": spec_record(parse_spec(race_tests.RACE))}
    now = {
        **race_tests.RACE,
        "capacitySources": [race_tests.RACE["capacitySources"][i] for i in (0, 2)],
    }
    racers = [
        race_tests.Racer(0, {"Accepted": "ok"}, made),
        race_tests.Racer(1, {"Provisioned": "ok"}, made),
    ]
    nodes = [race_tests.Node(f"b{i}", "b", 1) for i in range(4)]
    seen = adapter.run(racers, nodes, now)
    assert seen.state == "won"
    assert seen.consumed == adapter.ask(1)
    assert seen.pinned == {"pool": "b"}
    assert ("b", "delivered", "") in seen.notes
    if isinstance(adapter, race_tests.PodGroups):
        assert seen.recorded_winner == "b"


# ---- a PodGroup's growth follows the source it asked as the group's own attempt does -----


def _growth_request(case: Case, *, provisioned: bool, **more: str) -> Any:
    """A growth of the group released onto dws (pinned to pool b), asking dws (index 1)
    under `case.made_under`."""
    annotations = {**recorded(case.made_under), "gangcheck.io/capacity-source": "1", **more}
    return growth_tests.grow_req(
        annotations=annotations,
        class_name=CHECK_CAPACITY,
        parameters={"x": "1"},
        conditions={"Provisioned": ""} if provisioned else {"Accepted": "ok"},
    )


def _grown(case: Case, requests: tuple[Any, ...], nodes: tuple[Any, ...] = ()) -> Any:
    obj = growth_tests.group(6)
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    return growth_tests.grown_by_two(obj, config(case.now), requests, nodes)


@pytest.mark.parametrize("case", [c for c in CASES if not c.provisioned], ids=lambda c: c.id)
def test_a_growth_whose_source_left_or_changed_is_rolled_back(case: Case) -> None:
    """Before Provisioned, a growth whose source left, moved, or asks another class,
    parameters or nodes is rolled back as the group's own attempt is, naming the field.
    Before, a growth compared its request's class and parameters with themselves: a class
    or parameters edited under it went unseen."""
    d = _grown(case, (_growth_request(case, provisioned=False),))
    rolling = [a for a in d.actions if isinstance(a, AnnotateRequest)]
    assert [(a.name, a.annotations.get("gangcheck.io/rollback-reason")) for a in rolling] == [
        (growth_tests.GROW1, case.rolled_back)
    ]
    assert rolling[0].annotations["gangcheck.io/phase"] == "RollingBack"
    assert not any(isinstance(a, CreateRequest | ReleaseMembers) for a in d.actions)
    assert "ProvisioningRequestReplaced" in {e.reason for e in d.events}


def test_a_growth_whose_source_is_as_it_asked_goes_on() -> None:
    case = Case("unchanged", MADE_UNDER, provisioned=False)
    deadline = {"gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z"}  # dws's 420 s
    d = _grown(case, (_growth_request(case, provisioned=False, **deadline),))
    assert not [a for a in d.actions if isinstance(a, AnnotateRequest)], d.actions
    assert "accepted" in d.status["gangcheck.io/message"]


@pytest.mark.parametrize("case", [c for c in CASES if c.provisioned], ids=lambda c: c.id)
def test_a_provisioned_growth_is_kept_whatever_its_source_became(case: Case) -> None:
    """Once Provisioned the growth is kept: its nodes came in pool b, its members are
    released onto them together, consuming it."""
    arrived = node("n2", gpu=2, created="2026-11-30T10:04:00Z", labels={"pool": "b"})
    d = _grown(case, (_growth_request(case, provisioned=True),), (arrived,))
    (release,) = [a for a in d.actions if isinstance(a, ReleaseMembers)]
    assert release.pods == ("new0", "new1")
    assert release.annotations[CONSUME_ANNOTATION] == (growth_tests.GROW1)
    assert release.node_selector.get("pool") == case.pinned
    assert not [
        a
        for a in d.actions
        if isinstance(a, AnnotateRequest) and "gangcheck.io/rollback-reason" in a.annotations
    ]


@pytest.mark.parametrize("limit", [3, 0], ids=["in-its-backoff", "past-backoffLimitCount"])
def test_a_growth_rolled_back_for_a_config_change_is_followed_at_once_by_the_new_list(
    limit: int,
) -> None:
    """dws's class edited under the growth: once its rollback is done, the next growth asks
    dws as it is now, at once, as the group's own attempt and a Workload's follow a config
    change (no backoff, no retry counted). Before, it waited out Kueue's backoff as after a
    failure, or gave up past backoffLimitCount."""
    edited = [ON_DEMAND, {**DWS, "provisioningClassName": QUEUED_PROVISIONING}, SPOT]
    case = Case("class edited", edited, provisioned=False)
    reason = (
        f"ConfigChanged: spec.capacitySources[1] (dws): class {CHECK_CAPACITY!r} -> "
        f"{QUEUED_PROVISIONING!r}"
    )
    done = {
        **growth_tests.ROLLED,
        "gangcheck.io/rollback-reason": reason,
        "gangcheck.io/fulfillment-deadline": "2026-11-30T10:04:30Z",
    }
    obj = growth_tests.group(6)
    obj["metadata"]["annotations"]["gangcheck.io/topology-domain"] = "pool=b"
    spec = {**config(case.now), "retryStrategy": {"backoffLimitCount": limit}}
    d = growth_tests.grown_by_two(obj, spec, (_growth_request(case, provisioned=False, **done),))
    (body,) = [a.body for a in d.actions if isinstance(a, CreateRequest)]
    assert body["metadata"]["name"] == growth_tests.GROW2
    assert body["spec"]["provisioningClassName"] == QUEUED_PROVISIONING
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [growth_tests.GROW1]
    assert "GrowthRolledBack" not in {e.reason for e in d.events}
    said = f"growth attempt 1 was rolled back ({reason}), the next asks now"
    assert said in (d.status or {}).get("gangcheck.io/message", "")
