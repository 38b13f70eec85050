"""Odd objects a new user writes: each is told once, where the user looks, and the
controller goes on serving the rest (the house rule: docs/troubleshooting.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gangcheck.kube.errors import (
    ApiError,
    ChangedError,
    ConflictError,
    InvalidError,
    error_from_status,
    refusal,
    refused,
    refused_as_written,
    unapplied,
)
from gangcheck.kube.resources import EVENT, NODE, PROVISIONING_REQUEST
from gangcheck.logic.attempt.actions import (
    AnnotateRequest,
    CreateRequest,
    CreateTemplate,
    DeleteRequest,
    DeleteTemplate,
    ReleaseHold,
)
from gangcheck.logic.attempt.scaledown import SCALE_DOWN_DISABLED, unguard_ops
from gangcheck.model.names import MESSAGE_ANNOTATION, SCALE_DOWN_GUARD
from gangcheck.model.provisioning_config import parse_spec
from gangcheck.reclaim.guard import unguard
from gangcheck.reconcile.reconciler import refusal_event
from tests.builders import CHECK
from tests.fakes.kube import FakeKube
from tests.unit.test_admission_decide import REQ1, TRUST, Case, req, run
from tests.unit.test_admission_decide import gang as admission_gang
from tests.unit.test_podgroup_reconciler import World as GroupWorld
from tests.unit.test_podgroup_reconciler import gang as group_gang
from tests.unit.test_workload_reconciler import World, gang

# ---- AtomicProvisioningConfig: labels gangcheck writes, refused as the config's problem ----


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (
            {"capacitySources": [{"nodeSelector": {"bad key": "a"}}]},
            "spec.capacitySources[0].nodeSelector: 'bad key' is not a label key",
        ),
        (
            {"capacitySources": [{}, {"nodeSelector": {"pool": "has space"}}]},
            "spec.capacitySources[1].nodeSelector: 'has space' is not a label value",
        ),
        (
            {"capacitySources": [{"nodeSelector": {"pool": "x" * 64}}]},
            "spec.capacitySources[0].nodeSelector: 'xxxx",
        ),
        (
            {"capacitySources": [{"nodeSelector": {"-a.io/b": "c"}}]},
            "spec.capacitySources[0].nodeSelector: '-a.io/b' has no valid prefix",
        ),
        (
            {
                "podSetUpdates": {
                    "nodeSelector": [{"key": "my key", "valueFromProvisioningClassDetail": "d"}]
                }
            },
            "spec.podSetUpdates.nodeSelector[0].key: 'my key' is not a label key",
        ),
        (
            {
                "backend": "Karpenter",
                "fulfillment": {"reclaimer": "DeleteNodeClaim"},
                "karpenter": {"nodePools": ["a,b"]},
            },
            "spec.karpenter.nodePools[0]: 'a,b' is not a NodePool name",
        ),
        (
            {
                "capacitySources": [{"karpenter": {"nodePools": ["gpu", "Big Pool"]}}],
                "fulfillment": {"reclaimer": "DeleteNodeClaim"},
            },
            "spec.capacitySources[0].karpenter.nodePools[1]: 'Big Pool' is not a NodePool name",
        ),
    ],
)
def test_a_config_naming_labels_the_api_server_refuses_is_invalid(
    spec: dict[str, Any], names: str
) -> None:
    """Labels a config has gangcheck write (a source's pins on the request's pod templates
    and on the gang's podSetUpdates, the podSetUpdates keys it fills from the class
    details) must be labels: else every gang under the config met a refused write (the
    PodTemplate's, or Kueue's webhook refusing the check's podSetUpdates) and retried,
    the config itself Active. A NodePool name joins a comma-separated parameter."""
    with pytest.raises(ValueError) as refused:
        parse_spec(spec)
    assert names in str(refused.value)


@pytest.mark.parametrize(
    "spec",
    [
        {"capacitySources": [{"nodeSelector": {"cloud.google.com/gke-nodepool": "a-1_b.c"}}]},
        {"capacitySources": [{"nodeSelector": {"pool": ""}}]},
        {
            "podSetUpdates": {
                "nodeSelector": [
                    {
                        "key": "cloud.google.com/reservation-name",
                        "valueFromProvisioningClassDetail": "r",
                    }
                ]
            }
        },
        {
            "backend": "Karpenter",
            "fulfillment": {"reclaimer": "DeleteNodeClaim"},
            "karpenter": {"nodePools": ["gpu.a100", "b-2"]},
        },
    ],
)
def test_labels_and_pool_names_kubernetes_takes_are_taken(spec: dict[str, Any]) -> None:
    parse_spec(spec)


# ---- a check write the API server refuses: said on the Workload, the queue backs off -------

#: Kueue's Workload webhook refusing a podSetUpdates label (controller-runtime answers a
#: validator's error 403; validatePodSetUpdates, Kueue v0.17).
WEBHOOK_DENIAL = (
    'admission webhook "vworkload.kb.io" denied the request: status.admissionChecks[0]'
    '.podSetUpdates[0].nodeSelector: Invalid value: "x": name part must be 63 characters or less'
)
#: The CRD's schema refusing it (a 422 with causes; a failed JSON-patch test has none).
SCHEMA_DENIAL = (
    'Workload.kueue.x-k8s.io "wl" is invalid: status.admissionChecks[0].podSetUpdates[0]'
    ".tolerations: Too many: 9: must have at most 8 items"
)


def _refusal(status: int, message: str) -> ApiError:
    causes = [{"type": "FieldValueInvalid", "message": message, "field": "status"}]
    body = {
        "kind": "Status",
        "status": "Failure",
        "reason": "Forbidden" if status == 403 else "Invalid",
        "message": message,
        "code": status,
        "details": {"name": "wl", "kind": "Workload", "causes": causes} if status == 422 else {},
    }
    return error_from_status(status, json.dumps(body), target="Workload/wl")


@pytest.mark.parametrize(("status", "message"), [(403, WEBHOOK_DENIAL), (422, SCHEMA_DENIAL)])
async def test_a_check_write_refused_is_said_on_the_workload_and_backed_off(
    status: int, message: str
) -> None:
    """Before: the refusal was logged only (a 403 raised, a 422 read as "the Workload
    changed" and tried again every 0.5 s, for ever); `kubectl describe workload` showed the
    check Pending with nothing said."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    world.kube.fail("patch", "Workload", "wl", _refusal(status, message), times=100)
    with pytest.raises(ApiError):  # the queue backs off (0.5 s, 1 s ... 60 s), no hot loop
        await world.reconcile()
    events = [e for e in world.kube.all_of(EVENT) if e["reason"] == "FailedUpdate"]
    assert [(e["type"], e["involvedObject"]["name"]) for e in events] == [("Warning", "wl")]
    assert events[0]["message"] == f"Error writing admission check {CHECK}: {message}"
    assert world.check()["state"] == "Pending"


async def test_a_check_write_meeting_a_change_is_tried_again_soon_and_says_nothing() -> None:
    """A failed JSON-patch test (422 without causes, as kube-apiserver answers it) is the
    Workload changed meanwhile: decided again soon, no Event."""
    world = World(gang())
    await world.settle()
    world.provision("n1", "n2")
    world.kube.fail("patch", "Workload", "wl", 422)
    result = await world.reconcile()
    assert result.requeue_after is not None and result.requeue_after <= 0.5
    assert not [e for e in world.kube.all_of(EVENT) if e["reason"] == "FailedUpdate"]


# ---- one rule for a refused write, alone or among writes made at once ------------------

#: kube-apiserver's answer to a JSON patch whose ``test`` failed (apimachinery's
#: NewGenericServerResponse for a 422: no causes, its generic message).
PATCH_NOT_APPLIED = "the server rejected our request due to an error in our request"
#: A webhook answering 422 without details (apiserver's webhook errors.ToStatusErr keeps its
#: status and prefixes the message).
WEBHOOK_422 = 'admission webhook "nodes.example.io" denied the request: nodes are frozen'
#: A ValidatingAdmissionPolicy's denial: 422 (its default reason), the message as a cause.
POLICY_422 = "nodes \"n1\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied"

#: A ValidatingAdmissionPolicy refusing gangcheck's fence of a node, as kube-apiserver says it.
NODE_POLICY_DENIAL = (
    "nodes \"n1\" is forbidden: ValidatingAdmissionPolicy 'protect-nodes' with binding "
    "'protect-nodes' denied request: nodes are protected"
)
#: The authorizer refusing it: gangcheck's own right to patch nodes missing (an upgrade
#: half applied, a ClusterRole edited), no word about the node itself.
NODE_RBAC_DENIAL = (
    'nodes "n1" is forbidden: User "system:serviceaccount:gangcheck-system:gangcheck" '
    'cannot patch resource "nodes" in API group "" at the cluster scope'
)


def _status(status: int, message: str, causes: bool = False) -> ApiError:
    reason = {403: "Forbidden", 409: "Conflict", 422: "Invalid", 500: "InternalError"}[status]
    details = {"causes": [{"message": message}]} if causes else {}
    body = {"kind": "Status", "reason": reason, "message": message, "code": status}
    return error_from_status(status, json.dumps({**body, "details": details}), target="x/y")


@pytest.mark.parametrize(
    ("error", "is_refused"),
    [
        (_status(403, "exceeded quota: q"), True),
        (_status(403, WEBHOOK_422), True),
        (_status(422, SCHEMA_DENIAL, causes=True), True),
        (_status(422, POLICY_422, causes=True), True),
        (_status(422, WEBHOOK_422), True),
        (_status(422, PATCH_NOT_APPLIED), False),
        (_status(409, "the object has been modified"), False),
        (_status(500, "etcd"), False),
    ],
    ids=[
        "403: RBAC, a quota, a webhook",
        "403 of a webhook",
        "422 naming causes: the schema",
        "422 naming causes: a ValidatingAdmissionPolicy",
        "422 of a webhook, no causes",
        "422 of a patch that did not apply: changed meanwhile",
        "409: changed meanwhile",
        "500: transient",
    ],
)
def test_one_rule_says_which_writes_are_refused_alone_or_among_others(
    error: ApiError, is_refused: bool
) -> None:
    """Before, a write made alone was told refused on any 422 (a patch that did not apply
    too), one among others only on a 422 naming causes (a webhook's 422 not told)."""
    assert refused(error) is is_refused
    expected = error if is_refused else None
    assert refusal(error) is expected


@pytest.mark.parametrize(
    ("error", "changed"),
    [
        (_status(422, PATCH_NOT_APPLIED), True),
        (_status(422, SCHEMA_DENIAL, causes=True), False),
        (_status(422, POLICY_422, causes=True), False),
        (_status(422, WEBHOOK_422), False),
    ],
    ids=["a patch that did not apply", "the schema", "a policy", "a webhook, no causes"],
)
def test_a_json_patch_422_is_a_change_unless_refused(error: ApiError, changed: bool) -> None:
    """One reading of a JSON patch's 422 (`unapplied`, in `Kube.json_patch`): before, each
    caller mapped it, and three caught every 422 as "changed, read again", so a refusal was
    tried twice more, then raised as a Conflict ("kept changing")."""
    assert isinstance(error, InvalidError)
    read = unapplied(error, "nodes/n1")
    assert isinstance(read, ChangedError) is changed
    assert read is (read if changed else error)
    assert isinstance(read, ConflictError) is changed and refused(read) is not changed


async def test_a_refused_unguard_is_raised_as_refused_at_once() -> None:
    """Before: guard.unguard read a webhook's 422 as the node changed, read it again and
    wrote again twice more, then raised ConflictError "kept changing while unguarded"."""
    kube = FakeKube()
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "annotations": {SCALE_DOWN_GUARD: "ns/r1", SCALE_DOWN_DISABLED: "true"},
        },
    }
    kube.add(node)
    guarded = kube.stored(NODE, "n1")
    assert guarded is not None and unguard_ops(guarded, "ns/r1")
    kube.fail("patch", "Node", "n1", _status(422, WEBHOOK_422), times=5)
    with pytest.raises(InvalidError) as raised:
        await unguard(kube, guarded, "ns/r1")
    assert refused(raised.value)
    patches = [c for c in kube.calls if c.verb == "patch" and c.kind == "Node"]
    assert len(patches) == 1


@pytest.mark.parametrize(
    ("error", "as_written"),
    [
        (_status(403, NODE_RBAC_DENIAL), False),
        (_status(403, WEBHOOK_422), True),
        (_status(403, NODE_POLICY_DENIAL), True),
        (_status(422, POLICY_422, causes=True), True),
        (_status(422, WEBHOOK_422), True),
        (_status(422, PATCH_NOT_APPLIED), False),
        (_status(500, "etcd"), False),
    ],
    ids=[
        "the authorizer's 403: a right missing",
        "a webhook's 403",
        "a ValidatingAdmissionPolicy's 403",
        "422 naming causes",
        "a webhook's 422",
        "a patch that did not apply",
        "500",
    ],
)
def test_a_write_refused_for_what_it_is_is_told_from_a_right_missing(
    error: ApiError, as_written: bool
) -> None:
    """What a refused fence keeps a node for, and what fails a Karpenter request
    (NodeClaimRefused): never the authorizer's 403, which granting the right mends."""
    assert refused_as_written(error) is as_written


@pytest.mark.parametrize(
    ("error", "told"),
    [(_status(422, PATCH_NOT_APPLIED), False), (_status(422, WEBHOOK_422), True)],
    ids=["a patch that did not apply: untold", "a webhook's 422: told"],
)
async def test_a_single_action_failing_is_told_by_the_same_rule(
    error: ApiError, told: bool
) -> None:
    """A request's create met with a 422: told as FailedCreate only when refused (before:
    any 422, a patch that did not apply too); raised either way, the queue backs off."""
    world = World(gang())
    world.kube.fail("create", "ProvisioningRequest", error=error, times=100)
    with pytest.raises(ApiError):
        await world.reconcile()
    events = [e for e in world.kube.all_of(EVENT) if e["reason"] == "FailedCreate"]
    assert [e["message"] for e in events] == ([f"Error creating Request: {error.message}"] * told)


# ---- a class detail no label can carry: not pinned, said once ---------------------------


@pytest.mark.parametrize("value", ["x" * 64, "two words", "-r"])
def test_a_class_detail_that_is_no_label_value_is_not_pinned_and_is_said(value: str) -> None:
    """The autoscaler's provisioningClassDetails value for a podSetUpdates nodeSelector key
    that no label can carry matches no node, and Kueue's webhook refuses the check that
    names it: before, the check stayed Pending for ever (the request already marked
    fulfilled, its nodes held) and nothing but a log said why. Now the gang is Ready without
    that pin, and a Warning Event names the detail."""
    config = {
        **TRUST,
        "podSetUpdates": {
            "nodeSelector": [
                {"key": "cloud.example/reservation", "valueFromProvisioningClassDetail": "r"},
                {"key": "cloud.example/zone", "valueFromProvisioningClassDetail": "z"},
            ]
        },
    }
    request = req(conditions={"Provisioned": ""})
    request["status"]["provisioningClassDetails"] = {"r": value, "z": "zone-a"}
    d = run(Case("", admission_gang(), config=config, requests=[request]))
    assert d.check is not None and d.check.state == "Ready"
    assert {u["nodeSelector"]["cloud.example/zone"] for u in d.check.pod_set_updates} == {"zone-a"}
    assert not any(
        "cloud.example/reservation" in u["nodeSelector"] for u in d.check.pod_set_updates
    )
    (said,) = [e for e in d.events if e.reason == "InvalidClassDetail"]
    assert said.warning
    assert said.message == (
        f"provisioningClassDetails r of {REQ1} is {value!r}, not a label value: "
        "the gang is not pinned to cloud.example/reservation"
    )


# ---- a PodGroup write the API server refuses: said on the group, backed off -------------

POLICY_DENIAL = (
    'admission webhook "validate.example.io" denied the request: annotations of PodGroup g '
    "may not be changed"
)


async def test_a_group_write_refused_is_said_on_the_group_and_backed_off() -> None:
    """A policy webhook refusing gangcheck's annotations on a PodGroup: before, logged only
    (the reconcile raised before the decision's Events were sent)."""
    world = GroupWorld(*group_gang())
    refusal = _refusal(403, POLICY_DENIAL)
    world.kube.fail("patch", "PodGroup", "g", refusal, times=100)
    with pytest.raises(ApiError):
        await world.reconcile()
    events = [e for e in world.kube.all_of(EVENT) if e["reason"] == "FailedUpdate"]
    assert [(e["type"], e["involvedObject"]["name"]) for e in events] == [("Warning", "g")]
    assert events[0]["message"] == f"Error writing the PodGroup's status: {POLICY_DENIAL}"


# ---- what a refused action is called where the user looks ------------------------------


@pytest.mark.parametrize(
    ("action", "reason", "said"),
    [
        (CreateRequest({}), "FailedCreate", "Error creating Request: no"),
        (CreateTemplate({}), "FailedCreate", "Error creating Template: no"),
        (
            DeleteRequest("wl-atomic-1", "uid-r", ("ppt-r-w",), "Failed: x"),
            "FailedDelete",
            "Error deleting ProvisioningRequest 'wl-atomic-1': no",
        ),
        (DeleteTemplate("ppt-r-w"), "FailedDelete", "Error deleting PodTemplate 'ppt-r-w': no"),
        (
            AnnotateRequest("wl-atomic-1", {"a": "b"}),
            "FailedUpdate",
            "Error annotating ProvisioningRequest 'wl-atomic-1': no",
        ),
        (ReleaseHold(("n1",)), "FailedUpdate", "Error applying ReleaseHold: no"),
    ],
)
def test_a_refused_action_is_called_what_it_did(action: Any, reason: str, said: str) -> None:
    """Before, every refusal was 'Error creating <action>' as FailedCreate: a policy
    refusing a request's deletion read 'Error creating DeleteRequest: ...'."""
    event = refusal_event(action, "no")
    assert (event.reason, event.message, event.warning) == (reason, said, True)


@pytest.mark.parametrize("kind", ["ProvisioningRequest", "PodTemplate"])
async def test_a_groups_create_refused_is_said_on_the_group_and_backed_off(kind: str) -> None:
    """A namespace's ResourceQuota on object counts refusing a PodGroup's request (or its
    template): before, said nowhere (no Event, nothing on the group), retried for ever;
    a Workload's is said on its check and as FailedCreate."""
    quota = "exceeded quota: q, requested: count/x=1, used: count/x=5, limited: count/x=5"
    world = GroupWorld(*group_gang())
    world.kube.fail("create", kind, error=_refusal(403, quota), times=100)
    with pytest.raises(ApiError):
        await world.reconcile()
    what = "Request" if kind == "ProvisioningRequest" else "Template"
    message = f"Error creating {what}: {quota}"
    events = [e for e in world.kube.all_of(EVENT) if e["reason"] == "FailedCreate"]
    assert [(e["involvedObject"]["name"], e["message"]) for e in events] == [("g", message)]
    assert world.group_says()[MESSAGE_ANNOTATION] == message


async def test_a_node_whose_fence_is_refused_is_kept_and_the_rollback_finishes() -> None:
    """A policy refusing gangcheck's fence of a node during a rollback (a 403; a 422 naming
    its cause is the same rule, kube.errors.refused). Before, the refusal raised out of the
    reclaim, no outcome was recorded, and the whole rollback was retried on backoff for ever
    (said once as 'Error applying ReclaimArrivals'). Now the node is kept, not fenced and
    never deleted, named with the policy's message in the outcome and the RolledBack
    message; the rollback finishes and the check asks Kueue for a retry."""
    world = World(gang())
    await world.settle()
    world.provision("n1")
    await world.settle()
    request = world.kube.stored(PROVISIONING_REQUEST, "wl-atomic-1", "default")
    assert request is not None
    request["status"]["conditions"].append(
        {"type": "Failed", "status": "True", "reason": "x", "message": "no",
         "lastTransitionTime": "2026-11-30T10:05:00Z"}
    )  # fmt: skip
    world.kube.add(request)
    # the fence, the first write to the node: a policy refusing only that (cordon, taint)
    world.kube.fail("patch", "Node", error=_refusal(403, NODE_POLICY_DENIAL))
    await world.settle()
    kept = f"kept n1 (its fence was refused (403 Forbidden): {NODE_POLICY_DENIAL})"
    events = [e for e in world.kube.all_of(EVENT) if e["reason"] == "RolledBack"]
    assert len(events) == 1 and kept in events[0]["message"]
    assert not [e for e in world.kube.all_of(EVENT) if e["reason"] == "FailedUpdate"]
    assert world.check()["state"] == "Retry"
    node = world.kube.stored(NODE, "n1")
    assert node is not None and not node["spec"].get("unschedulable")
    assert not world.kube.writes_of("Node", "delete")


async def test_a_fence_the_authorizer_refuses_keeps_nothing_and_is_retried() -> None:
    """The authorizer's 403 (gangcheck's right to patch nodes missing for a while) is not a
    refusal of the node: the node is not kept for good (its reclaim mark dropped, the
    rollback finished, the next attempt asking for more capacity while this one is left
    behind for ever, as with a policy's refusal). The rollback raises and backs off, said
    once as the write refused; once the right is back the node is reclaimed."""
    world = World(gang())
    await world.settle()
    world.provision("n1")
    await world.settle()
    request = world.kube.stored(PROVISIONING_REQUEST, "wl-atomic-1", "default")
    assert request is not None
    request["status"]["conditions"].append(
        {"type": "Failed", "status": "True", "reason": "x", "message": "no",
         "lastTransitionTime": "2026-11-30T10:05:00Z"}
    )  # fmt: skip
    world.kube.add(request)
    world.kube.fail("patch", "Node", error=_refusal(403, NODE_RBAC_DENIAL), times=2)
    for _ in range(2):  # raised: the queue backs off; said as the write refused
        with pytest.raises(ApiError):
            await world.reconcile()
    assert not [e for e in world.kube.all_of(EVENT) if e["reason"] in ("NodeKept", "RolledBack")]
    assert world.check()["state"] != "Retry"
    await world.settle()  # the right back: the node is reclaimed, not kept
    events = [e for e in world.kube.all_of(EVENT) if e["reason"] == "RolledBack"]
    assert len(events) == 1 and "kept n1" not in events[0]["message"]
    assert not [e for e in world.kube.all_of(EVENT) if e["reason"] == "NodeKept"]
    assert world.check()["state"] == "Retry"
