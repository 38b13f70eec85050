"""The config changed under an attempt in flight: one table, run through both gang sources
(a Kueue Workload's check and a PodGroup), which must follow it alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.actions import Action, AnnotateRequest
from gangcheck.logic.podgroups.podgroup import GroupSnapshot
from gangcheck.logic.podgroups.podgroup import decide as decide_group
from gangcheck.logic.workloads.admission import Decision, Snapshot
from gangcheck.logic.workloads.admission import decide as decide_workload
from gangcheck.model.objects import pod_of, request_of, workload_of
from gangcheck.model.podgroups import pod_group_of
from gangcheck.model.provisioning_config import parse_spec
from tests.builders import CHECK, WorkloadBuilder, container, provisioning_request

NOW = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
CREATED = "2026-11-30T10:00:00Z"
DEADLINE_420 = "2026-11-30T10:07:00Z"  # created + the default 420 s
DEFAULT_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Case:
    id: str
    config: dict[str, Any]
    """The config now; the request was made under the defaults."""
    conditions: dict[str, str]
    outcome: dict[str, str] | None = None
    """The request's rollback outcome (a rollback done), if any."""
    phase: str | None = None
    """The phase written on the request (None: none)."""
    reason: str = ""
    """The rollback reason written begins so."""
    deadline: str | None = None
    """The deadline written on the request (None: not moved)."""
    recorded: str | None = DEADLINE_420
    """The deadline the request carries (None: none)."""


CASES = [
    Case(
        "class changed before Provisioned: rolled back, saying why",
        {"provisioningClassName": "queued-provisioning.gke.io"},
        {"Accepted": ""},
        phase="RollingBack",
        reason=f"ConfigChanged: class '{DEFAULT_CLASS}' -> 'queued-provisioning.gke.io'",
    ),
    Case(
        "parameters changed before Provisioned: rolled back",
        {"parameters": {"ValidUntilSeconds": "600"}},
        {"Accepted": ""},
        phase="RollingBack",
        reason="ConfigChanged: the request parameters changed",
    ),
    Case(
        "class changed once Provisioned: kept, its capacity is there",
        {"provisioningClassName": "queued-provisioning.gke.io"},
        {"Provisioned": ""},
    ),
    Case(
        "deadlineSeconds changed: the attempt's deadline moves with it",
        {"fulfillment": {"deadlineSeconds": 900}},
        {"Accepted": ""},
        deadline="2026-11-30T10:15:00Z",
    ),
    Case(
        "deadlineSeconds shortened past now: moved, and the rollback quotes the new 60 s",
        {"fulfillment": {"deadlineSeconds": 60}},
        {"Provisioned": ""},
        deadline="2026-11-30T10:01:00Z",
        phase="RollingBack",
        reason="Deadline: the gang did not fit within 60s",
    ),
    Case(
        "the deadline record removed by hand: written again, creation + deadlineSeconds",
        {},
        {"Accepted": ""},
        deadline=DEADLINE_420,
        recorded=None,
    ),
    Case(
        "the deadline record unreadable and the deadline passed: written again, rolled back",
        {"fulfillment": {"deadlineSeconds": 60}},
        {"Provisioned": ""},
        deadline="2026-11-30T10:01:00Z",
        phase="RollingBack",
        reason="Deadline: the gang did not fit within 60s",
        recorded="tomorrow",
    ),
]


def request(
    name: str, conditions: dict[str, str], identity: dict[str, str], deadline: str | None
) -> Obj:
    recorded = {} if deadline is None else {"gangcheck.io/fulfillment-deadline": deadline}
    return provisioning_request(
        name,
        conditions=conditions,
        templates=[(naming.template_name(name, "ps-0"), 2)],
        created=CREATED,
        annotations={**recorded, **identity},
    )


def workload_decision(case: Case) -> Decision:
    wl = WorkloadBuilder().pod_set("workers", 2).reserve_quota().check()
    name = naming.request_name("wl", CHECK, 1)
    snap = Snapshot(
        workload=workload_of(wl.build()),
        check=CHECK,
        config=parse_spec(case.config),
        requests=(request_of(request(name, case.conditions, {}, case.recorded)),),
        templates=frozenset({naming.template_name(name, "ps-0")}),
    )
    return decide_workload(snap, NOW)


def through_workload(case: Case) -> tuple[Action, ...]:
    return workload_decision(case).actions


def through_pod_group(case: Case) -> tuple[Action, ...]:
    group = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "g",
            "namespace": "default",
            "uid": "uid-g",
            "annotations": {"gangcheck.io/state": "Provisioning"},
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    members = [
        {
            "metadata": {"name": f"m{i}", "namespace": "default"},
            "spec": {
                "containers": [container(gpu=1)],
                "schedulingGroup": {"podGroupName": "g"},
                "schedulingGates": [{"name": "gangcheck.io/provisioning"}],
            },
        }
        for i in range(2)
    ]
    identity = {"gangcheck.io/pod-group": "pg/g", "gangcheck.io/pod-group-uid": "uid-g"}
    snap = GroupSnapshot(
        group=pod_group_of(group),
        members=tuple(map(pod_of, members)),
        config=parse_spec(case.config),
        requests=(request_of(request("g-pg-1", case.conditions, identity, case.recorded)),),
    )
    return decide_group(snap, NOW).actions


SOURCES: dict[str, Callable[[Case], tuple[Action, ...]]] = {
    "workload": through_workload,
    "podgroup": through_pod_group,
}


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_both_gang_sources_follow_a_config_changed_under_their_attempt(
    case: Case, source: str
) -> None:
    written: dict[str, str] = {}
    for action in SOURCES[source](case):
        if isinstance(action, AnnotateRequest):
            written.update(action.annotations)
    assert written.get("gangcheck.io/fulfillment-deadline") == case.deadline
    assert written.get("gangcheck.io/phase") == case.phase
    assert written.get("gangcheck.io/rollback-reason", "").startswith(case.reason)


def test_outside_fit_mode_a_workloads_attempt_ends_at_once_a_podgroups_rolls_back() -> None:
    """TrustProvisioned counts no arrival, so a Workload's attempt is not rolled back: its
    check goes Retry (as Kueue). A PodGroup's members are released only when they fit, so its
    attempts are always followed in fit mode, and its attempt is rolled back."""
    case = Case(
        "-",
        {"fulfillment": {"mode": "TrustProvisioned"}, "parameters": {"x": "y"}},
        {"Accepted": ""},
    )
    check = workload_decision(case).check
    assert check is not None and check.state == "Retry"
    assert check.message.startswith("Retrying after config change: the request parameters")
    marks = [a.annotations for a in through_pod_group(case) if isinstance(a, AnnotateRequest)]
    assert [m.get("gangcheck.io/phase") for m in marks] == ["RollingBack"]
