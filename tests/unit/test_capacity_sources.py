"""Capacity sources in order (spec.capacitySources, InOrder), through the admission check's
decision: which source an attempt asks, when it leaves one for the next inside the same
attempt, and what it pins to the source's nodes."""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.diagnose import as_json as diagnose_json
from gangcheck.diagnose import text as diagnose_text
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    ReleaseMembers,
)
from gangcheck.logic.attempt.driver import SourceNote
from gangcheck.logic.attempt.explain import request_facts
from gangcheck.logic.attempt.fulfillment import ClusterView
from gangcheck.logic.podgroups.podgroup import GroupSnapshot
from gangcheck.logic.podgroups.podgroup import decide as decide_group
from gangcheck.logic.workloads.admission import Decision, Snapshot, decide
from gangcheck.model.objects import pod_of, request_of, workload_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import CHECK_CAPACITY, parse_spec, spec_record
from gangcheck.telemetry import Metrics
from tests.builders import (
    CHECK,
    WorkloadBuilder,
    capacity_not_found,
    node,
    provisioning_request,
)
from tests.unit.test_admission_decide import GPU_FLAVOR, NOW, gang
from tests.unit.test_podgroup_decide import group, members
from tests.unit.test_podgroup_decide import req as group_req

FIRST, SECOND = "wl-atomic-1", "wl-atomic-1-s1"
SOURCES = {
    "capacitySources": [
        {"name": "on-demand", "nodeSelector": {"pool": "a"}, "deadlineSeconds": 60},
        {
            "name": "dws",
            "provisioningClassName": CHECK_CAPACITY,
            "parameters": {"x": "1"},
            "nodeSelector": {"pool": "b"},
        },
    ],
    "retryStrategy": {"backoffLimitCount": 3},
}
TRUST_MODE = {"fulfillment": {"mode": "TrustProvisioned"}}
TRUST = {**SOURCES, **TRUST_MODE}
OUTCOME = '{"draining": [], "kept": {}, "nodeSeconds": 0, "reclaimed": []}'


DEADLINES = ("2026-11-30T10:01:00Z", "2026-11-30T10:07:00Z")
"""Each source's deadline in SOURCES, for a request made at T0 (60 s, the default 420 s)."""


def request(name: str, *, source: int = 0, **kw: Any) -> Any:
    """A request as gangcheck makes one, asking SOURCES' source `source`."""
    annotations = {
        "gangcheck.io/attempt": "1",
        "gangcheck.io/fulfillment-deadline": DEADLINES[source],
        **kw.pop("annotations", {}),
    }
    if source:  # the second source's class and parameters
        annotations["gangcheck.io/capacity-source"] = str(source)
        kw.setdefault("class_name", CHECK_CAPACITY)
        kw.setdefault("parameters", {"x": "1"})
    templates = [(naming.template_name(name, "workers"), 4)]
    return provisioning_request(name, templates=templates, annotations=annotations, **kw)


def run(
    config: dict[str, Any], requests: list[Any], *, workload: WorkloadBuilder | None = None
) -> Decision:
    snap = Snapshot(
        workload=workload_of((workload or gang()).build()),
        check=CHECK,
        config=parse_spec(config),
        flavors=GPU_FLAVOR,
        requests=tuple(request_of(r) for r in requests),
        templates=frozenset(
            p["podTemplateRef"]["name"] for r in requests for p in r["spec"]["podSets"]
        ),
    )
    return decide(snap, NOW)


def created(d: Decision) -> tuple[dict[str, Any], dict[str, Any]]:
    req = next(a.body for a in d.actions if isinstance(a, CreateRequest))
    template = next(a.body for a in d.actions if isinstance(a, CreateTemplate))
    return req, template


def test_the_first_source_is_asked_first_pinned_to_its_nodes_with_its_deadline() -> None:
    d = run(SOURCES, [])
    req, template = created(d)
    assert req["metadata"]["name"] == FIRST
    assert (
        req["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    )
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "a"}
    # the source's own deadline (60 s), not fulfillment.deadlineSeconds
    assert req["metadata"]["annotations"]["gangcheck.io/fulfillment-deadline"] == (
        "2026-11-30T10:06:00Z"
    )
    assert "gangcheck.io/capacity-source" not in req["metadata"]["annotations"]
    assert d.check is not None and d.check.state == "Pending"
    assert d.check.message.endswith("from capacity source 'on-demand' (1 of 2)")


@pytest.mark.parametrize(
    ("config", "first", "why"),
    [
        (TRUST, request(FIRST, conditions={"Failed": "no capacity"}), "no capacity"),
        (
            SOURCES,
            request(
                FIRST,
                annotations={
                    "gangcheck.io/phase": "RollingBack",
                    "gangcheck.io/rollback-reason": "Deadline: the gang did not fit within 60s",
                    "gangcheck.io/outcome": OUTCOME,
                },
            ),
            "Deadline: the gang did not fit within 60s",
        ),
    ],
    ids=["a failed source (trusting Provisioned)", "a source rolled back at its deadline"],
)
def test_a_source_that_cannot_deliver_is_left_for_the_next_in_the_same_attempt(
    config: dict[str, Any], first: Any, why: str
) -> None:
    d = run(config, [first])
    req, template = created(d)
    assert req["metadata"]["name"] == SECOND
    assert req["spec"]["provisioningClassName"] == CHECK_CAPACITY
    assert req["spec"]["parameters"] == {"x": "1"}
    assert req["metadata"]["annotations"]["gangcheck.io/capacity-source"] == "1"
    assert req["metadata"]["annotations"]["gangcheck.io/attempt"] == "1"
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "b"}
    kinds = [type(a) for a in d.actions]
    # the next request is made before the one left is withdrawn: a crash between the two
    # leaves the next one current, never the first asked again under its old name
    assert kinds.index(CreateRequest) < kinds.index(DeleteRequest)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [FIRST]
    assert d.check is not None and d.check.state == "Pending"  # no retry of Kueue's used
    assert d.check.message.startswith("capacity source 'on-demand' (1 of 2) could not deliver (")
    assert why in d.check.message
    assert d.check.message.endswith(
        f"{SECOND} created for 4 pods from capacity source 'dws' (2 of 2)"
    )
    assert "CapacitySourceFailed" in {e.reason for e in d.events}


def test_the_last_source_failing_retries_as_one_source_would() -> None:
    d = run(TRUST, [request(SECOND, source=1, conditions={"Failed": "no capacity"})])
    assert d.check is not None and d.check.state == "Retry"
    assert not any(isinstance(a, CreateRequest) for a in d.actions)


def test_a_source_that_cannot_find_the_capacity_is_left_at_once_when_another_is_next() -> None:
    made = {"created": "2026-11-30T10:04:30Z"}  # its 60 s deadline is not past: left at once
    deadline = {"gangcheck.io/fulfillment-deadline": "2026-11-30T10:05:30Z"}
    d = run(SOURCES, [capacity_not_found(request(FIRST, annotations=deadline, **made))])
    rolling = next(a for a in d.actions if isinstance(a, AnnotateRequest))
    assert rolling.name == FIRST
    assert rolling.annotations["gangcheck.io/phase"] == "RollingBack"
    assert rolling.annotations["gangcheck.io/rollback-reason"].startswith(
        "CapacityIsNotFound: Capacity is not found"
    )


def test_the_last_source_saying_not_found_is_waited_on_until_its_deadline() -> None:
    """cluster-autoscaler tries again later: with nothing next, the deadline decides."""
    d = run(SOURCES, [capacity_not_found(request(SECOND, source=1))])
    assert not any(isinstance(a, AnnotateRequest) for a in d.actions)
    assert d.check is not None and d.check.state == "Pending"
    # no failure yet, but what the source said is its latest outcome, to publish
    assert d.sources == (SourceNote("dws", "refused"),)


def test_a_single_class_config_waits_on_not_found_as_before() -> None:
    deadline = {"gangcheck.io/fulfillment-deadline": DEADLINES[1]}  # the default 420 s
    d = run({}, [capacity_not_found(request(FIRST, annotations=deadline))])
    assert not any(isinstance(a, AnnotateRequest) for a in d.actions)
    assert d.sources == (SourceNote("default", "refused"),)


def test_the_attempt_in_flight_is_the_latest_source_asked() -> None:
    """The first source's request, rolled back and not yet deleted, is withdrawn; the
    second's is followed."""
    rolled = request(FIRST, annotations={"gangcheck.io/outcome": OUTCOME})
    d = run(SOURCES, [rolled, request(SECOND, source=1, conditions={"Accepted": "ok"})])
    assert not any(isinstance(a, CreateRequest) for a in d.actions)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == [FIRST]
    assert d.check is not None and d.check.message == f"provisioning request {SECOND} accepted"
    assert d.sources == ()  # nothing said of its room yet


def test_ready_on_a_later_source_pins_the_gang_to_its_nodes() -> None:
    d = run(TRUST, [request(SECOND, source=1, conditions={"Provisioned": "ok"})])
    assert d.check is not None and d.check.state == "Ready"
    update = d.check.pod_set_updates[0]
    assert update["nodeSelector"] == {"pool": "b"}
    assert update["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"] == SECOND


def test_a_source_gone_from_the_config_ends_its_request() -> None:
    """The attempt asks source 1, and the config now lists one source: the attempt is over
    (a config change: the next attempt follows the new config)."""
    one = {"capacitySources": SOURCES["capacitySources"][:1], **TRUST_MODE}
    d = run(one, [request(SECOND, source=1, conditions={"Accepted": "ok"})])
    assert d.check is not None and d.check.state == "Retry"
    assert "spec.capacitySources[1] left the config" in d.check.message


def test_the_start_deadline_never_falls_back() -> None:
    """After Ready the gang had its capacity: a rollback then is Kueue's retry, not the next
    source."""
    started = request(
        FIRST,
        annotations={
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "StartDeadline: 3 of 4 members scheduled",
            "gangcheck.io/outcome": OUTCOME,
        },
    )
    d = run(SOURCES, [started], workload=gang())
    assert not any(isinstance(a, CreateRequest) for a in d.actions)
    assert d.check is not None and d.check.state == "Retry"


def test_names_of_later_sources_never_match_a_first_sources_name() -> None:
    """`-s<i>` ends no first source's name, whatever the check is called."""
    assert naming.request_name("wl", "c", 1, 1) == "wl-c-1-s1"
    assert naming.attempt_of("wl-c-1-s1", "wl", "c") == 1
    assert naming.attempt_of("wl-c-1-s1", "wl", "c-1") is None
    assert naming.request_name("wl", "c-1", 1) != naming.request_name("wl", "c", 1, 1)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ({"capacitySources": []}, "spec.capacitySources: list at least one source"),
        (
            {"capacitySources": [{}, {"provisioningClassName": "nobody.example.com"}]},
            "spec.capacitySources[1].provisioningClassName: 'nobody.example.com' is not a class",
        ),
        (
            {"capacitySources": [{"name": "a"}, {"name": "a"}]},
            "spec.capacitySources[1].name: 'a' names an earlier source too",
        ),
        (
            {"capacitySources": [{}, {"karpenter": {"nodePools": ["gpu"]}}]},
            "spec.capacitySources[1] is Karpenter: use DeleteNodeClaim",
        ),
        (
            {"capacitySources": [{"karpenter": {"nodePools": []}}]},
            "spec.capacitySources[0].karpenter.nodePools:",
        ),
        (
            {"capacitySources": [{}], "provisioningClassName": CHECK_CAPACITY},
            "spec.provisioningClassName: not with spec.capacitySources",
        ),
        ({"capacitySources": [{}] * 9}, "spec.capacitySources:"),
        ({"capacitySourcePolicy": "Race"}, "spec.capacitySourcePolicy:"),
    ],
)
def test_a_bad_source_list_is_refused_naming_the_field(spec: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_spec(spec)
    assert names in str(refused.value)


def test_the_single_class_fields_are_a_list_of_one() -> None:
    spec = parse_spec({"provisioningClassName": CHECK_CAPACITY, "parameters": {"a": "b"}})
    (only,) = spec.sources()
    assert (only.class_name, dict(only.parameters), only.index) == (CHECK_CAPACITY, {"a": "b"}, 0)
    karpenter = parse_spec(
        {
            "backend": "Karpenter",
            "karpenter": {"nodePools": ["p1", "p2"]},
            "fulfillment": {"reclaimer": "DeleteNodeClaim"},
        }
    )
    assert karpenter.sources()[0].karpenter
    assert karpenter.sources()[0].parameters["nodePools"] == "p1,p2"


# ---- PodGroups: the same sources, through the group's decision --------------------------


def _group_decide(config: dict[str, Any], requests: list[Any], nodes: tuple[Any, ...] = ()) -> Any:
    pods = members(3)
    snap = GroupSnapshot(
        group=pod_group_of(group(3)),
        members=tuple(map(pod_of, pods)),
        config=parse_spec(config),
        requests=tuple(request_of(r) for r in requests),
        capacity=ClusterView(nodes=nodes, pods=tuple(pods)),
    )
    return decide_group(snap, NOW)


def _group_request(name: str, *, source: int = 0, **annotations: str) -> Any:

    extra = {"gangcheck.io/capacity-source": str(source)} if source else {}
    kw: dict[str, Any] = {"class_name": CHECK_CAPACITY, "parameters": {"x": "1"}} if source else {}
    return group_req(name, annotations={**annotations, **extra}, **kw)


def test_a_pod_group_asks_its_first_source_pinned_to_its_nodes() -> None:
    d = _group_decide(SOURCES, [])
    req = next(a.body for a in d.actions if isinstance(a, CreateRequest))
    template = next(a.body for a in d.actions if isinstance(a, CreateTemplate))
    assert req["metadata"]["name"] == "g-pg-1"
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "a"}
    assert "from capacity source 'on-demand' (1 of 2)" in d.status["gangcheck.io/message"]


def test_a_pod_group_leaves_a_source_rolled_back_for_the_next_in_the_same_attempt() -> None:
    rolled = _group_request(
        "g-pg-1",
        **{
            "gangcheck.io/phase": "RollingBack",
            "gangcheck.io/rollback-reason": "CapacityIsNotFound: no node group",
            "gangcheck.io/outcome": OUTCOME,
        },
    )
    d = _group_decide(SOURCES, [rolled])
    req = next(a.body for a in d.actions if isinstance(a, CreateRequest))
    template = next(a.body for a in d.actions if isinstance(a, CreateTemplate))
    assert req["metadata"]["name"] == "g-pg-1-s1"
    assert req["spec"]["provisioningClassName"] == CHECK_CAPACITY
    assert template["template"]["spec"]["nodeSelector"] == {"pool": "b"}
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == ["g-pg-1"]
    assert d.status["gangcheck.io/state"] == "Provisioning"  # not BackingOff: same attempt
    assert "gangcheck.io/attempt" not in d.status
    assert "CapacitySourceFailed" in {e.reason for e in d.events}


def test_a_pod_group_released_from_a_later_source_is_pinned_to_its_nodes() -> None:

    ready = _group_request("g-pg-1-s1", source=1)
    ready["status"]["conditions"] = [
        {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": ""}
    ]
    nodes = tuple(node(f"n{i}", gpu=1, labels={"pool": "b"}) for i in range(3))
    d = _group_decide(SOURCES, [ready], nodes)
    release = next(a for a in d.actions if isinstance(a, ReleaseMembers))
    assert release.node_selector.get("pool") == "b"


def test_each_source_says_what_happened_there_for_its_metrics() -> None:
    asked = run(SOURCES, [])
    assert [(n.source, n.outcome) for n in asked.sources] == [("on-demand", "asked")]
    left = run(TRUST, [request(FIRST, conditions={"Failed": "no capacity"})])
    assert [(n.source, n.outcome, n.reason) for n in left.sources] == [
        ("on-demand", "failed", "Failed"),
        ("dws", "asked", ""),
    ]
    ready = run(TRUST, [request(SECOND, source=1, conditions={"Provisioned": "ok"})])
    ((name, outcome, seconds),) = [(n.source, n.outcome, n.seconds) for n in ready.sources]
    assert (name, outcome) == ("dws", "delivered")
    assert seconds == 300.0  # asked at T0, 10:00; delivered at NOW, 10:05


def test_the_source_metrics_are_exposed_by_source() -> None:
    metrics = Metrics()
    metrics.source("on-demand", "asked", "", 0)
    metrics.source("on-demand", "failed", "CapacityIsNotFound", 120)
    metrics.source("dws", "asked", "", 0)
    metrics.source("dws", "delivered", "", 42.0)
    text = metrics.render()
    assert 'gangcheck_source_asks_total{source="on-demand"} 1' in text
    assert (
        'gangcheck_source_failures_total{reason="CapacityIsNotFound",source="on-demand"} 1' in text
    )
    assert 'gangcheck_source_stranded_node_seconds_total{source="on-demand"} 120' in text
    assert 'gangcheck_source_deliveries_total{source="dws"} 1' in text
    assert 'gangcheck_source_delivery_seconds_count{source="dws"} 1' in text


def test_diagnose_says_which_source_and_domain_the_request_asks() -> None:
    req = request_of(
        request(
            SECOND,
            source=1,
            annotations={
                "gangcheck.io/topology-domain": "rack=r2",
                "gangcheck.io/domains-tried": "r1",
            },
        )
    )
    facts = request_facts(req, SECOND, 1)
    lines = diagnose_text._lines_of_request("default", facts, NOW)
    assert (
        f"  asks topology domain rack=r2 in capacity source #2 ({CHECK_CAPACITY}); "
        "domains left before: r1"
    ) in lines
    out = diagnose_json._request_facts_json(facts, NOW)
    assert out is not None
    assert (out["capacitySource"], out["topologyDomain"], out["domainsTried"]) == (
        1,
        "rack=r2",
        ["r1"],
    )


def test_diagnose_names_the_source_a_request_asked_as_its_recorded_config_names_it() -> None:
    """Messages, Events and metrics name a source by spec.capacitySources[].name; diagnose's
    request section said only 'capacity source #2 (class)' (seen on the local full stack)."""
    made = {"gangcheck.io/attempt-config": spec_record(parse_spec(SOURCES))}
    facts = request_facts(request_of(request(SECOND, source=1, annotations=made)), SECOND, 1)
    lines = diagnose_text._lines_of_request("default", facts, NOW)
    assert f"  asks capacity source 'dws' (#2, {CHECK_CAPACITY})" in lines
    out = diagnose_json._request_facts_json(facts, NOW)
    assert out is not None and (out["capacitySource"], out["capacitySourceName"]) == (1, "dws")
