"""Which pods are PodGroup members and the JSON patch that gates them (logic/gating.py)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from gangcheck.logic.podgroups.gating import (
    COSCHEDULING,
    COSCHEDULING_LABEL,
    UPSTREAM,
    PodGroupRef,
    admission_warnings,
    gate_patch,
    gated_at,
    group_of,
    is_gated,
    ungated_cause,
)
from gangcheck.model.names import GATE, GATED_AT

Obj = dict[str, Any]
NOW = datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=UTC)
STAMP = "2026-03-01T12:30:05Z"


def pod(
    *,
    group: str | None = None,
    label: str | None = None,
    gates: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
) -> Obj:
    meta: Obj = {"name": "p", "namespace": "ns"}
    if label is not None or labels:
        meta["labels"] = {**(labels or {})}
        if label is not None:
            meta["labels"][COSCHEDULING_LABEL] = label
    if annotations is not None:
        meta["annotations"] = annotations
    spec: Obj = {"containers": [{"name": "c", "image": "busybox"}]}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# ---- group_of ------------------------------------------------------------------------

GROUPS = [
    pytest.param(pod(group="gang"), (UPSTREAM, "gang"), id="schedulingGroup.podGroupName"),
    pytest.param(pod(label="gang"), (COSCHEDULING, "gang"), id="coscheduling label"),
    pytest.param(pod(group="up", label="co"), (UPSTREAM, "up"), id="both: the upstream field"),
    pytest.param(pod(), None, id="plain pod"),
    pytest.param(pod(group=""), None, id="empty podGroupName"),
    pytest.param(pod(label=""), None, id="empty label"),
    pytest.param(pod(labels={"app": "x"}), None, id="other labels only"),
    pytest.param(
        pod(labels={"pod-group.scheduling.sigs.k8s.io": "g"}), None, id="another label's name"
    ),
    pytest.param(
        {"metadata": {}, "spec": {"schedulingGroup": {}}}, None, id="schedulingGroup empty"
    ),
    pytest.param(
        {"metadata": {}, "spec": {"schedulingGroup": None}}, None, id="schedulingGroup null"
    ),
    pytest.param({"metadata": {"labels": None}, "spec": None}, None, id="labels and spec null"),
    pytest.param({}, None, id="empty object"),
    pytest.param(
        {"metadata": "x", "spec": {"schedulingGroup": {"podGroupName": 3}}},
        None,
        id="wrong types",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), GROUPS)
def test_group_of(obj: Obj, expected: tuple[str, str] | None) -> None:
    assert group_of(obj) == expected


def test_group_of_names_its_fields() -> None:
    ref = group_of(pod(label="gang"))
    assert ref == PodGroupRef(api_group=COSCHEDULING, name="gang")
    assert ref is not None
    assert (ref.api_group, ref.name) == ("scheduling.x-k8s.io", "gang")


# ---- gate_patch ----------------------------------------------------------------------

GATE_ALL = {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
GATE_ONE_MORE = {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}
ANNOTATIONS = {"op": "add", "path": "/metadata/annotations", "value": {GATED_AT: STAMP}}
ONE_ANNOTATION = {
    "op": "add",
    "path": "/metadata/annotations/gangcheck.io~1gated-at",
    "value": STAMP,
}

PATCHES = [
    pytest.param(pod(group="g"), [GATE_ALL, ANNOTATIONS], id="upstream member, no gates"),
    pytest.param(pod(label="g"), [GATE_ALL, ANNOTATIONS], id="coscheduling member, no gates"),
    pytest.param(
        pod(group="g", gates=["other.io/wait"]),
        [GATE_ONE_MORE, ANNOTATIONS],
        id="existing gates: appended",
    ),
    pytest.param(pod(group="g", gates=[]), [GATE_ONE_MORE, ANNOTATIONS], id="empty gate list"),
    pytest.param(
        {**pod(group="g"), "spec": {**pod(group="g")["spec"], "schedulingGates": None}},
        [GATE_ALL, ANNOTATIONS],
        id="gates null: the list is set",
    ),
    pytest.param(
        pod(label="g", annotations={"a": "b"}),
        [GATE_ALL, ONE_ANNOTATION],
        id="existing annotations: one added",
    ),
    pytest.param(
        pod(label="g", annotations={GATED_AT: "2020-01-01T00:00:00Z"}),
        [GATE_ALL, ONE_ANNOTATION],
        id="stale gated-at of an ungated pod: replaced",
    ),
    pytest.param(
        {"spec": {"schedulingGroup": {"podGroupName": "g"}}},
        [GATE_ALL, {"op": "add", "path": "/metadata", "value": {"annotations": {GATED_AT: STAMP}}}],
        id="no metadata",
    ),
    pytest.param(pod(group="g", gates=[GATE]), None, id="already gated"),
    pytest.param(
        pod(label="g", gates=["other.io/wait", GATE]), None, id="already gated among others"
    ),
    pytest.param(pod(group="g", node_name="n1"), None, id="bound: gates are refused"),
    pytest.param(pod(), None, id="not a member"),
    pytest.param(pod(gates=["other.io/wait"]), None, id="not a member, other gates"),
    pytest.param({"metadata": {"labels": {COSCHEDULING_LABEL: "g"}}}, None, id="no spec"),
]


@pytest.mark.parametrize(("obj", "expected"), PATCHES)
def test_gate_patch(obj: Obj, expected: list[Obj] | None) -> None:
    before = copy.deepcopy(obj)
    assert gate_patch(obj, now=NOW) == expected
    assert obj == before, "the pod itself is not modified"


def apply_patch(obj: Obj, ops: list[Obj]) -> Obj:
    """Just enough of RFC 6902 'add' to check what the API server will do with the patch."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in op["path"][1:].split("/")
        ]
        target = out
        for token in parents:
            target = target[token]
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


@pytest.mark.parametrize("obj", [p.values[0] for p in PATCHES if p.values[1] is not None])
def test_a_patched_pod_is_gated_annotated_and_needs_no_second_patch(obj: Obj) -> None:
    ops = gate_patch(obj, now=NOW)
    assert ops is not None
    patched = apply_patch(obj, ops)
    assert is_gated(patched)
    assert gated_at(patched) == NOW.replace(microsecond=0)
    # The other gates stay, in their order, ours last.
    before = [g["name"] for g in (obj.get("spec") or {}).get("schedulingGates") or []]
    assert [g["name"] for g in patched["spec"]["schedulingGates"]] == [*before, GATE]
    # Reinvocation (reinvocationPolicy: IfNeeded) changes nothing more.
    assert gate_patch(patched, now=NOW) is None


def test_is_gated_and_gated_at_on_pods_without_them() -> None:
    assert not is_gated(pod(group="g"))
    assert not is_gated(pod(gates=["other.io/wait"]))
    assert not is_gated({"spec": {"schedulingGates": ["not-a-map"]}})
    assert gated_at(pod()) is None
    assert gated_at(pod(annotations={GATED_AT: "yesterday"})) is None
    assert gated_at(pod(annotations={GATED_AT: STAMP})) == datetime(
        2026, 3, 1, 12, 30, 5, tzinfo=UTC
    )


# ---- why a member carries no gate ------------------------------------------------------

UNGATED = [
    pytest.param(
        pod(group="g"),
        "created without the gangcheck.io/provisioning scheduling gate (was the webhook down, "
        "or the namespace not opted in?)",
        id="never gated: the webhook did not answer, or was not asked",
    ),
    pytest.param(
        pod(group="g", annotations={GATED_AT: STAMP}),
        "gated by the webhook at 2026-03-01T12:30:05Z, its gangcheck.io/provisioning "
        "scheduling gate since removed while its gang is not released",
        id="gated at creation, the gate removed by someone else",
    ),
    pytest.param(
        pod(group="g", node_name="n1"),
        "bound to node n1 without ever having the gangcheck.io/provisioning scheduling gate "
        "(created bound, or while the webhook was down, or before the namespace was opted in)",
        id="never gated and bound: it runs",
    ),
    pytest.param(
        pod(group="g", annotations={GATED_AT: "yesterday"}),
        "created without the gangcheck.io/provisioning scheduling gate (was the webhook down, "
        "or the namespace not opted in?)",
        id="a stamp that is no time: not taken as gated",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), UNGATED)
def test_ungated_cause(obj: Obj, expected: str) -> None:
    assert ungated_cause(obj) == expected


# ---- what the webhook warns of ---------------------------------------------------------

HOLD = "status-taint.cluster-autoscaler.kubernetes.io/gangcheck-held-for"
ARRIVING = "status-taint.cluster-autoscaler.kubernetes.io/gangcheck-arriving"


def tolerating(obj: Obj, *tolerations: Obj) -> Obj:
    out = copy.deepcopy(obj)
    out["spec"]["tolerations"] = list(tolerations)
    return out


WARNINGS = [
    pytest.param(pod(group="g"), (), id="a member: gated, nothing to warn of"),
    pytest.param(pod(), (), id="no member, no gate"),
    pytest.param(pod(gates=["other.io/gate"]), (), id="another gate"),
    pytest.param(pod(group="g", gates=[GATE]), (), id="a member that brings the gate itself"),
    pytest.param(
        pod(gates=[GATE]),
        (
            "gangcheck: the pod carries the gangcheck.io/provisioning scheduling gate but "
            "names no PodGroup: gangcheck never lifts it, the pod waits until it is removed",
        ),
        id="the gate without a group: never lifted",
    ),
    pytest.param(
        pod(label="g", node_name="n1"),
        (
            "gangcheck: the pod names PodGroup g but is bound to node n1 at creation: it is "
            "not gated, starts before its gang's capacity exists, and ignores gangcheck's holds",
        ),
        id="a member bound at creation",
    ),
    pytest.param(
        tolerating(pod(), {"key": HOLD, "operator": "Exists", "effect": "NoSchedule"}),
        (
            f"gangcheck: the pod tolerates {HOLD} with operator Exists: it may be scheduled "
            "onto nodes gangcheck keeps for gangs, taking a gang's capacity",
        ),
        id="tolerating every gang's hold",
    ),
    pytest.param(
        tolerating(pod(group="g"), {"key": ARRIVING, "operator": "Exists"}),
        (
            f"gangcheck: the pod tolerates {ARRIVING} with operator Exists: it may be "
            "scheduled onto nodes gangcheck keeps for gangs, taking a gang's capacity",
        ),
        id="tolerating nodes arriving closed",
    ),
    pytest.param(
        tolerating(pod(), {"key": HOLD, "operator": "Equal", "value": "r0123", "effect": ""}),
        (),
        id="one request's hold (Kueue's podSetUpdates give its gang's pods that)",
    ),
    pytest.param(
        tolerating(pod(), {"operator": "Exists"}), (), id="every taint (DaemonSet-like): known"
    ),
    pytest.param(
        {
            **tolerating(pod(), {"key": ARRIVING, "operator": "Exists"}),
            "metadata": {
                "name": "agent-x",
                "ownerReferences": [{"kind": "DaemonSet", "name": "agent", "controller": True}],
            },
        },
        (),
        id="a DaemonSet's pod: it runs on every node by design, the reclaim rules know it",
    ),
    pytest.param(
        {"metadata": {}, "spec": {"tolerations": [None, "x", {"key": 3}], "nodeName": 5}},
        (),
        id="wrong types",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), WARNINGS)
def test_admission_warnings(obj: Obj, expected: tuple[str, ...]) -> None:
    assert admission_warnings(obj) == expected
    assert all(len(w) <= 256 for w in admission_warnings(obj))  # cut past 4 KiB in all
