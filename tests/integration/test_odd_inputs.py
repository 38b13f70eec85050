"""Odd objects against a real kube-apiserver: each is said where the user looks, and what the
API server answers is read for what it is."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.app import Controller
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import (
    ChangedError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    refused,
)
from gangcheck.kube.resources import (
    NODE,
    PLUGINS_POD_GROUP,
    POD,
    PROVISIONING_REQUEST,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.attempt import naming
from gangcheck.model.names import MESSAGE_ANNOTATION
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, RunningController, apply, deny_policy, eventually
from tests.integration.test_podgroups import Groups, groups, provisioner  # noqa: F401
from tests.integration.test_reclaim import NO_CORDON, no_cordon

pytestmark = pytest.mark.integration

RESOURCE_QUOTA = Resource("", "v1", "resourcequotas", "ResourceQuota")
COUNT = "count/provisioningrequests.autoscaling.x-k8s.io"


def gang(name: str = "wl") -> WorkloadBuilder:
    return WorkloadBuilder(name).pod_set("workers", 2, pod_template(gpu=1)).reserve_quota().check()


async def test_a_failed_patch_test_is_a_change_and_a_schema_refusal_is_refused(
    cluster: Cluster,
) -> None:
    """`kube.errors.refused` on kube-apiserver's own answers: a JSON-patch ``test`` that fails
    (the Workload changed meanwhile) is a 422 naming no causes, which the client raises as a
    ChangedError (`unapplied`); the CRD's schema refusing a check entry is a 422 naming them,
    raised as it is."""
    await cluster.install_check(None)
    name = await cluster.submit(gang())
    wl = await cluster.workload(name)
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/status/admissionChecks/0/message", "value": "x"},
    ]
    with pytest.raises(ChangedError) as changed:
        await cluster.kube.json_patch(WORKLOAD, name, stale, cluster.ns, subresource="status")
    assert not refused(changed.value) and isinstance(changed.value.__cause__, InvalidError)
    version = wl["metadata"]["resourceVersion"]
    bogus = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "replace", "path": "/status/admissionChecks/0/state", "value": "Bogus"},
    ]
    with pytest.raises((InvalidError, ConflictError)) as invalid:
        await cluster.kube.json_patch(WORKLOAD, name, bogus, cluster.ns, subresource="status")
    assert isinstance(invalid.value, InvalidError) and refused(invalid.value), invalid.value


async def test_a_config_pinning_a_label_kubernetes_refuses_is_inactive_until_fixed(
    cluster: Cluster, controller: RunningController
) -> None:
    """Before, the config was Active and each gang's PodTemplate was refused by the API
    server (nodeSelector: 'bad key'), retried for ever."""
    bad = {"capacitySources": [{"name": "a", "nodeSelector": {"bad key": "x"}}]}
    await cluster.install_check(bad)

    async def inactive() -> dict[str, str] | None:
        cond = await cluster.active_condition()
        return cond if cond is not None and cond["status"] == "False" else None

    cond = await eventually(inactive, what="the check inactive")
    assert cond["reason"] == "InvalidConfig"
    assert "spec.capacitySources[0].nodeSelector: 'bad key' is not a label key" in cond["message"]
    await cluster.submit(gang())

    async def said() -> dict[str, str] | None:
        check = await cluster.check_state("wl")
        return check if "'bad key' is not a label key" in check["message"] else None

    check = await eventually(said, what="the check saying why nothing is asked")
    assert check["state"] == "Pending"
    assert "no provisioning request is made" in check["message"]
    assert not await cluster.requests() and not await cluster.templates()

    await cluster.set_config({"capacitySources": [{"name": "a", "nodeSelector": cluster.pool}]})
    await cluster.wait_request(f"wl-{cluster.check}-1")


def _no_ready_policy(namespace: str, workload: str) -> str:
    """A ValidatingAdmissionPolicy (reason left to its default, Invalid: a 422 naming its
    cause) refusing the check of one Workload turning Ready, in one namespace."""
    name = f"no-ready-{namespace}"
    never_ready = (
        f"object.metadata.name != '{workload}' || !has(object.status.admissionChecks) || "
        "object.status.admissionChecks.all(c, c.state != 'Ready')"
    )
    return deny_policy(
        name,
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["workloads/status"],
        },
        {"expression": never_ready, "message": f"{workload} may not run"},
        namespace=namespace,
    )


async def test_a_check_write_a_policy_refuses_is_said_once_and_other_gangs_are_served(
    cluster: Cluster, controller: RunningController, control_plane: ControlPlane
) -> None:
    """An admission policy refusing one gang's Ready: before, kube-apiserver's 422 was read
    as the Workload changed meanwhile and the check written again every 0.5 s, said nowhere
    a user looks. Now a FailedUpdate Warning Event on that Workload carries the policy's
    message, its check stays Pending, and the other gang turns Ready."""
    manifests = _no_ready_policy(cluster.ns, "bad")
    apply(control_plane, manifests)
    try:
        await cluster.install_check({"fulfillment": {"mode": "TrustProvisioned"}})
        for name in ("bad", "good"):
            await cluster.submit(gang(name))
        await _until_policy_refuses(control_plane, cluster.ns, "bad")
        for name in ("bad", "good"):
            request = naming.request_name(name, cluster.check, 1)
            await cluster.set_request_conditions(request, {"Provisioned": "ok"})
        await cluster.wait_check("good", "Ready")
        (said,) = await cluster.wait_events("FailedUpdate", about="bad")
        assert said["type"] == "Warning"
        assert said["message"].startswith(f"Error writing admission check {cluster.check}: ")
        assert "bad may not run" in said["message"]
        assert (await cluster.check_state("bad"))["state"] == "Pending"
        # the refusals are this test's policy's, of the Workload it names (the controller
        # fixture fails a test on any refusal of gangcheck's writes)
        policy = f"ValidatingAdmissionPolicy 'no-ready-{cluster.ns}'"
        ours = controller.forgive_refusals(policy)
        assert ours and all("/workloads/bad/status" in r for r in ours)
    finally:
        control_plane.run_kubectl("delete", "-f", "-", stdin=manifests, check=False)


async def _until_policy_refuses(cp: ControlPlane, namespace: str, workload: str) -> None:
    """A policy takes effect a moment after it is made: a dry run of the write it refuses
    tells when."""
    patch = json.dumps(
        [{"op": "replace", "path": "/status/admissionChecks/0/state", "value": "Ready"}]
    )
    argv = ("patch", "workloads.kueue.x-k8s.io", workload, "-n", namespace, "--subresource=status")
    args = (*argv, "--type=json", "-p", patch, "--dry-run=server")

    async def refused_now() -> bool:
        done = await asyncio.to_thread(cp.run_kubectl, *args, check=False)
        return done.returncode != 0 and "may not run" in done.stderr

    await eventually(refused_now, what="the policy refusing a dry run")


async def test_a_groups_request_a_resource_quota_refuses_is_said_on_the_group(
    groups: Groups,  # noqa: F811
    provisioner: Controller,  # noqa: F811
) -> None:
    """A namespace's ResourceQuota allowing no ProvisioningRequest: kube-apiserver refuses
    the group's request (403). Before, said nowhere (no Event, nothing on the group) and
    retried for ever; now a FailedCreate Event on the group and its gangcheck.io/message
    say it, as a Workload's check does."""
    quota = {
        "metadata": {"name": "no-requests", "namespace": groups.ns},
        "spec": {"hard": {COUNT: "0"}},
    }
    created = await groups.kube.create(RESOURCE_QUOTA, quota)
    # No kube-controller-manager runs here: its quota controller's status written by hand.
    created["status"] = {"hard": quota["spec"]["hard"], "used": {COUNT: "0"}}
    await groups.kube.replace(RESOURCE_QUOTA, created, subresource="status")
    await _until_quota_refuses(groups.kube, groups.ns)
    try:
        await groups.coscheduling("q", 2)
        for i in range(2):
            await groups.member(f"q-{i}", "q", plugins=True)
        (said,) = await groups.cluster.wait_events("FailedCreate", about="q")
        assert said["type"] == "Warning" and said["involvedObject"]["kind"] == "PodGroup"
        assert said["message"].startswith("Error creating Request: ")
        assert "quota" in said["message"]

        async def on_the_group() -> str | None:
            group = await groups.group("q", plugins=True)
            message = (group["metadata"].get("annotations") or {}).get(MESSAGE_ANNOTATION)
            return message if message == said["message"] else None

        await eventually(on_the_group, what="the refusal in the group's message")
        assert not await groups.cluster.requests()
    finally:  # the controllers of later modules watch every namespace: nothing left refused
        for i in range(2):
            with contextlib.suppress(NotFoundError):
                await groups.kube.delete(POD, f"q-{i}", groups.ns)
        with contextlib.suppress(NotFoundError):
            await groups.kube.delete(PLUGINS_POD_GROUP, "q", groups.ns)
        await groups.kube.delete(RESOURCE_QUOTA, "no-requests", groups.ns)


async def _until_quota_refuses(kube: Kube, namespace: str) -> None:
    """A quota is enforced once kube-apiserver's quota admission has seen it: a request of
    the test's own, refused, tells when (one let through meanwhile is deleted again)."""
    probe = {
        "metadata": {"name": "quota-probe", "namespace": namespace},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": [{"podTemplateRef": {"name": "none"}, "count": 1}],
        },
    }

    async def refused_now() -> bool:
        try:
            await kube.create(PROVISIONING_REQUEST, probe)
        except ForbiddenError:
            return True
        await kube.delete(PROVISIONING_REQUEST, "quota-probe", namespace)
        return False

    await eventually(refused_now, what="the quota refusing a request")


async def test_a_rollback_whose_fence_a_policy_refuses_keeps_that_node_and_finishes(
    cluster: Cluster, controller: RunningController, control_plane: ControlPlane
) -> None:
    """A policy refusing to cordon one of the two nodes that arrived for a gang (3 members)
    that never fits: at the deadline the rollback keeps that node, unfenced, named with the
    policy's message; reclaims the other; finishes (check Retry, RolledBack naming it, a
    Normal Event). Before: the refusal raised out of the reclaim, no outcome was recorded,
    and the rollback was retried on backoff for ever, the check left rolling back."""
    spec = {
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 6, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
    }
    await cluster.install_check(spec)
    members = WorkloadBuilder("wl").pod_set("workers", 3, pod_template(gpu=1))
    await cluster.submit(members.reserve_quota().check())
    request = naming.request_name("wl", cluster.check, 1)
    await cluster.wait_request(request)
    frozen, other = await cluster.add_nodes(2)
    async with no_cordon(control_plane, cluster.kube, frozen, "Invalid"):
        await cluster.set_request_conditions(request, {"Provisioned": ""})
        check = await cluster.wait_check("wl", "Retry", timeout=30)
        (rolled,) = await cluster.wait_events("RolledBack", about="wl")
    kept = f"kept {frozen} (its fence was refused (422 Invalid): "
    assert kept in check["message"] and NO_CORDON in check["message"]
    assert kept in rolled["message"] and rolled["type"] == "Normal"
    assert "reclaimed 1 node" in rolled["message"]
    names = [n["metadata"]["name"] for n in await cluster.nodes()]
    assert frozen in names and other not in names
    node = await cluster.kube.get(NODE, frozen)
    assert not node["spec"].get("unschedulable")
    # the refusals are this test's policy's, of the node it names (the controller fixture
    # fails a test on any refusal of gangcheck's writes)
    ours = controller.forgive_refusals(NO_CORDON)
    assert ours and all(f"/nodes/{frozen}" in r for r in ours)
