"""The manifests on a real kube-apiserver with RBAC: they build, they apply, they grant the
ServiceAccount what the controller does and nothing more, and the controller runs on them.

kubectl (the test bed's v1.37 build) builds and applies; ``kubectl auth can-i --as`` asks the
authorizer what the ServiceAccount may do; then the controller runs in this event loop with a
token of that ServiceAccount, so every call it makes meets the real RBAC. Everything applied is
removed again, except the CRD, which the test bed installed first and other tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed.karpenter import KARPENTER_MODULE, KARPENTER_TOOLCHAIN
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.app import Controller
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    EVENT,
    NAMESPACE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    SERVICE_ACCOUNT,
    WORKLOAD,
)
from gangcheck.logic.attempt import naming
from gangcheck.logic.podgroups.gating import COSCHEDULING_LABEL, OPT_IN_VALUE
from gangcheck.model.names import OPT_IN_LABEL
from gangcheck.model.provisioning_config import parse_spec
from gangcheck.webhook import DEFAULT_CERT_DIR, DEFAULT_PORT, MUTATE_PATH
from tests.builders import WorkloadBuilder, pod_template
from tests.integration import harness
from tests.integration.harness import TEST_CRDS, eventually, kubectl, token_kubeconfig
from tests.waiting import cancelled

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
EXAMPLE = MANIFESTS / "examples" / "gpu"
NAMESPACE_NAME = "gangcheck-system"
ACCOUNT = "gangcheck"
AS_ACCOUNT = f"--as=system:serviceaccount:{NAMESPACE_NAME}:{ACCOUNT}"
FIELD_MANAGER = "gangcheck-manifests-test"
CRD_NAME = "atomicprovisioningconfigs.gangcheck.io"
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"


# ---- kubectl -----------------------------------------------------------------------------


def apply(cp: ControlPlane, manifests: str, *extra: str) -> tuple[str, str]:
    return harness.apply(cp, manifests, *extra, manager=FIELD_MANAGER)


def build(cp: ControlPlane, folder: Path) -> str:
    return kubectl(cp, "kustomize", str(folder))


def documents(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def can_i(cp: ControlPlane, verb: str, resource: str, *flags: str) -> bool:
    done = cp.run_kubectl("auth", "can-i", verb, resource, AS_ACCOUNT, *flags, check=False)
    if done.returncode not in (0, 1):
        raise AssertionError(f"kubectl auth can-i {verb} {resource} failed: {done.stderr}")
    # A type discovery does not know is sent as a resource named "plural.group" in no group,
    # which nothing grants: the answer would be "no" whatever the rules say.
    assert "doesn't have a resource type" not in done.stderr, done.stderr
    return done.returncode == 0


def overlay(tmp_path: Path, component: str) -> Path:
    """An overlay of the base with one component, as docs/install.md has people write."""
    folder = tmp_path / f"with-{component}"
    folder.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, folder)],
        "components": [os.path.relpath(MANIFESTS / "components" / component, folder)],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return folder


# ---- install and remove --------------------------------------------------------------


def finalize_namespace(cp: ControlPlane, name: str) -> None:
    """No kube-controller-manager runs here: do the namespace controller's last step."""
    admin = cp.client()
    path = f"/api/v1/namespaces/{name}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        reply = admin.request("GET", path)
        if reply.status == 404:
            return
        namespace = reply.json()
        namespace["spec"]["finalizers"] = []
        admin.request("PUT", f"{path}/finalize", json.dumps(namespace).encode())
        time.sleep(0.1)
    raise AssertionError(f"namespace {name} still there after it was finalized")


def remove(cp: ControlPlane, manifests: list[Obj], *, keep_crd: bool) -> None:
    """Delete what was applied; give the CRD's fields back to the test bed if it was its."""
    mine = [d for d in manifests if not (keep_crd and d["kind"] == "CustomResourceDefinition")]
    kubectl(
        cp,
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(mine),
    )
    finalize_namespace(cp, NAMESPACE_NAME)
    if keep_crd:
        # Applying the bare name drops this field manager's claim on every field; the test
        # bed still owns them all, so the CRD itself is unchanged.
        bare = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD_NAME},
        }
        apply(cp, yaml.safe_dump(bare))


@pytest.fixture(scope="module")
def reclaimer_crds(control_plane: ControlPlane) -> Iterator[None]:
    """The NodeClaim and Cluster API test CRDs (tests/crds/), so that kubectl knows those
    types; removed again if this module installed them."""
    admin = control_plane.client()
    wanted = crds.load_crds(TEST_CRDS)
    missing = [c for c in wanted if admin.request("GET", _crd_path(c)).status == 404]
    crds.install_crds(admin, missing)
    yield
    for crd in missing:
        admin.request("DELETE", _crd_path(crd))
    crds.wait_gone(admin, [c["metadata"]["name"] for c in missing])  # gone before the next module


def _crd_path(crd: Obj) -> str:
    return f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"


@contextlib.contextmanager
def base_installed(cp: ControlPlane) -> Iterator[list[Obj]]:
    """manifests/base, applied server-side as a person would, and removed afterwards."""
    crd_was_there = cp.client().request("GET", CRD_PATH).status == 200
    manifests = build(cp, BASE)
    _, warnings = apply(cp, manifests)
    assert "Warning" not in warnings, warnings
    try:
        yield documents(manifests)
    finally:
        remove(cp, documents(manifests), keep_crd=crd_was_there)


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, reclaimer_crds: None) -> Iterator[list[Obj]]:
    with base_installed(control_plane) as manifests:
        yield manifests


# ---- what the base holds -------------------------------------------------------------


def the(manifests: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in manifests if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def test_the_base_builds_into_the_objects_an_operator_expects(
    control_plane: ControlPlane,
) -> None:
    manifests = documents(build(control_plane, BASE))
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in manifests)
    assert kinds == [
        "ClusterRole/gangcheck",
        "ClusterRoleBinding/gangcheck",
        f"CustomResourceDefinition/{CRD_NAME}",
        "Deployment/gangcheck",
        "MutatingWebhookConfiguration/gangcheck",
        f"Namespace/{NAMESPACE_NAME}",
        "PodDisruptionBudget/gangcheck",
        "Role/gangcheck-leader-election",
        "RoleBinding/gangcheck-leader-election",
        "Service/gangcheck-metrics",
        "Service/gangcheck-webhook",
        "ServiceAccount/gangcheck",
        "ValidatingAdmissionPolicy/gangcheck-fence",
        "ValidatingAdmissionPolicy/gangcheck-guards-its-records",
        "ValidatingAdmissionPolicy/gangcheck-writes-only-its-own",
        "ValidatingAdmissionPolicy/gangcheck-writes-only-its-own-arrivals",
        "ValidatingAdmissionPolicy/gangcheck-writes-only-its-own-checks",
        "ValidatingAdmissionPolicyBinding/gangcheck-fence",
        "ValidatingAdmissionPolicyBinding/gangcheck-guards-its-records",
        "ValidatingAdmissionPolicyBinding/gangcheck-writes-only-its-own",
        "ValidatingAdmissionPolicyBinding/gangcheck-writes-only-its-own-arrivals",
        "ValidatingAdmissionPolicyBinding/gangcheck-writes-only-its-own-checks",
    ]
    crd_file = MANIFESTS / "crd" / "gangcheck.io_atomicprovisioningconfigs.yaml"
    assert the(manifests, "CustomResourceDefinition") == yaml.safe_load(crd_file.read_text())
    namespaced = [d for d in manifests if d["kind"] not in _CLUSTER_SCOPED]
    assert {d["metadata"]["namespace"] for d in namespaced} == {NAMESPACE_NAME}


_CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def test_the_deployment_runs_two_locked_down_replicas_with_one_leader(
    control_plane: ControlPlane,
) -> None:
    manifests = documents(build(control_plane, BASE))
    deployment = the(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == ACCOUNT
    assert container["args"][:2] == ["run", "--in-cluster"]
    assert "--leader-elect" in container["args"]
    assert "--lease-namespace=$(POD_NAMESPACE)" in container["args"]
    assert "--lease-name=gangcheck" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081, "webhook": 9443}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["securityContext"]["runAsUser"] == 65532
    assert the(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    service = the(manifests, "Service", "gangcheck-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    lease_role = the(manifests, "Role")
    assert {r["resources"][0] for r in lease_role["rules"]} == {"leases"}


def test_the_base_applies_without_a_warning_and_is_served(
    control_plane: ControlPlane, installed: list[Obj]
) -> None:
    # The fixture applied it and asserted that kubectl printed no warning: in particular no
    # "would violate PodSecurity" for the restricted profile the namespace enforces.
    labels = the(installed, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    served = kubectl(
        control_plane, "get", "-f", "-", "-o", "name", stdin=yaml.safe_dump_all(installed)
    )
    assert len(served.split()) == len(installed)


# ---- the pod-gating webhook ----------------------------------------------------------

WEBHOOK_SERVICE = "gangcheck-webhook"
WEBHOOK_SECRET = "gangcheck-webhook-cert"


def test_the_webhook_gates_pods_of_opted_in_namespaces_served_by_both_replicas(
    control_plane: ControlPlane,
) -> None:
    manifests = documents(build(control_plane, BASE))
    [hook] = the(manifests, "MutatingWebhookConfiguration", "gangcheck")["webhooks"]
    assert hook["name"] == "pods.gangcheck.io"
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {"matchLabels": {OPT_IN_LABEL: OPT_IN_VALUE}}
    assert "objectSelector" not in hook
    # Never blocks pod creation: a webhook that is down lets pods through ungated.
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] == 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert "caBundle" not in hook["clientConfig"]  # the component or the operator sets it
    assert hook["clientConfig"]["service"] == {
        "name": WEBHOOK_SERVICE,
        "namespace": NAMESPACE_NAME,
        "path": MUTATE_PATH,
        "port": 443,
    }
    # The Service reaches the webhook port of every controller pod, leader or not.
    service = the(manifests, "Service", WEBHOOK_SERVICE)
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    deployment = the(manifests, "Deployment")
    template = deployment["spec"]["template"]
    assert service["spec"]["selector"] == template["metadata"]["labels"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    [container] = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["webhook"] == DEFAULT_PORT
    # The certificate Secret is mounted where the webhook reads it, and may come later.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["webhook-cert"] == {
        "name": "webhook-cert",
        "mountPath": str(DEFAULT_CERT_DIR),
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["webhook-cert"]["secret"] == {"secretName": WEBHOOK_SECRET, "optional": True}


def test_the_webhook_configuration_is_served_as_written(
    control_plane: ControlPlane, installed: list[Obj]
) -> None:
    written = the(installed, "MutatingWebhookConfiguration")
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gangcheck"
    served = control_plane.client().request("GET", path).json()
    [hook] = served["webhooks"]
    for key, value in written["webhooks"][0].items():
        assert hook[key] == value, key


async def test_with_no_webhook_answering_pods_of_an_opted_in_namespace_are_created(
    control_plane: ControlPlane, installed: list[Obj]
) -> None:
    """The base installed, nothing serving its webhook (no certificate, no endpoints): a
    PodGroup member is still created, ungated, within the webhook's timeout."""
    namespace = f"webhook-{uuid.uuid4().hex[:8]}"
    labels = {OPT_IN_LABEL: OPT_IN_VALUE}
    pod = {
        "metadata": {"name": "member", "labels": {COSCHEDULING_LABEL: "gang"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/never-runs:1"}]},
    }
    try:
        async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
            await admin.create(NAMESPACE, {"metadata": {"name": namespace, "labels": labels}})
            await admin.create(SERVICE_ACCOUNT, {"metadata": {"name": "default"}}, namespace)
            began = time.monotonic()
            created = await admin.create(POD, pod, namespace)
            assert time.monotonic() - began < 15
            assert not created["spec"].get("schedulingGates")
            await admin.delete(POD, "member", namespace, grace_period_seconds=0)
    finally:
        remove_namespace(control_plane, namespace)


def test_the_cert_manager_component_issues_the_secret_the_deployment_mounts(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    base = documents(build(control_plane, BASE))
    with_component = documents(build(control_plane, overlay(tmp_path, "webhook-cert-manager")))
    issuer = the(with_component, "Issuer")
    certificate = the(with_component, "Certificate")
    config = the(with_component, "MutatingWebhookConfiguration")
    for obj in (issuer, certificate):
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == NAMESPACE_NAME
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {
        "kind": "Issuer",
        "name": issuer["metadata"]["name"],
    }
    assert certificate["spec"]["secretName"] == WEBHOOK_SECRET
    assert f"{WEBHOOK_SERVICE}.{NAMESPACE_NAME}.svc" in certificate["spec"]["dnsNames"]
    # cert-manager's CA injector keeps the caBundle in step with the Certificate.
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE_NAME}/{certificate['metadata']['name']}"
    }
    # The annotated configuration is valid for the API server, and nothing else changes.
    _, warnings = apply(control_plane, yaml.safe_dump(config), "--dry-run=server")
    assert "Warning" not in warnings, warnings
    meta = {k: v for k, v in config["metadata"].items() if k != "annotations"}
    without_annotation = {**config, "metadata": meta}
    rest = [d for d in with_component if d["kind"] not in ("Issuer", "Certificate")]
    assert [without_annotation if d is config else d for d in rest] == base


# ---- what the ServiceAccount may do --------------------------------------------------

ALL = "--all-namespaces"
IN_OWN = f"--namespace={NAMESPACE_NAME}"
STATUS = "--subresource=status"


def ask(verb: str, resource: str, *flags: str, id: str) -> Any:
    return pytest.param(verb, resource, flags, id=id)


MAY = [
    ask("list", "workloads.kueue.x-k8s.io", ALL, id="lists workloads everywhere"),
    ask("watch", "workloads.kueue.x-k8s.io", ALL, id="watches workloads everywhere"),
    ask("patch", "workloads.kueue.x-k8s.io", ALL, STATUS, id="patches workload status"),
    ask("watch", "admissionchecks.kueue.x-k8s.io", id="watches admission checks"),
    ask("patch", "admissionchecks.kueue.x-k8s.io", STATUS, id="patches admission check status"),
    ask("list", "resourceflavors.kueue.x-k8s.io", id="lists resource flavors"),
    ask("watch", "atomicprovisioningconfigs.gangcheck.io", id="watches its configs"),
    ask("create", "provisioningrequests.autoscaling.x-k8s.io", ALL, id="creates requests"),
    ask("patch", "provisioningrequests.autoscaling.x-k8s.io", ALL, id="annotates requests"),
    ask("delete", "provisioningrequests.autoscaling.x-k8s.io", ALL, id="deletes requests"),
    ask("watch", "provisioningrequests.autoscaling.x-k8s.io", ALL, id="watches requests"),
    ask("create", "podtemplates", ALL, id="creates pod templates"),
    ask("delete", "podtemplates", ALL, id="deletes pod templates"),
    ask(
        "get",
        "provisioningrequests.autoscaling.x-k8s.io",
        ALL,
        id="reads a request it collided with",
    ),
    ask("get", "podtemplates", ALL, id="reads a pod template it collided with"),
    ask("get", "workloads.kueue.x-k8s.io", ALL, id="reads a workload live before cleaning up"),
    ask("get", "nodes", id="gets nodes"),
    ask("watch", "nodes", id="watches nodes"),
    ask("patch", "nodes", id="patches nodes to claim, fence and unfence them"),
    ask("list", "pods", ALL, id="lists pods everywhere"),
    ask("watch", "pods", ALL, id="watches pods everywhere"),
    ask("get", "pods", ALL, id="gets a pod"),
    ask("patch", "pods", ALL, id="patches pods to release a gated gang"),
    ask("list", "nodeclaims.karpenter.sh", id="lists node claims to know which nodes are going"),
    ask("watch", "nodeclaims.karpenter.sh", id="watches node claims"),
    ask("list", "namespaces", id="lists namespaces to know which opted in to gating"),
    ask("watch", "namespaces", id="watches namespaces"),
    ask("watch", "podgroups.scheduling.k8s.io", ALL, id="watches pod groups"),
    ask("patch", "podgroups.scheduling.k8s.io", ALL, id="annotates pod groups with their state"),
    ask("create", "events", ALL, id="creates events everywhere"),
    ask("create", "leases.coordination.k8s.io", IN_OWN, id="creates its lease"),
    ask("get", "leases.coordination.k8s.io/gangcheck", IN_OWN, id="reads its lease"),
    ask("update", "leases.coordination.k8s.io/gangcheck", IN_OWN, id="renews its lease"),
]

MAY_NOT = [
    ask("delete", "nodes", id="deletes no node without the component"),
    ask("patch", "podtemplates", ALL, id="changes no pod template"),
    ask("update", "nodes", id="replaces no node"),
    ask("create", "nodes", id="creates no node"),
    ask("patch", "nodes", STATUS, id="writes no node status"),
    ask("get", "secrets", ALL, id="reads no secret"),
    ask("list", "secrets", IN_OWN, id="lists no secret even in its own namespace"),
    ask("get", "configmaps", ALL, id="reads no configmap"),
    ask("delete", "pods", ALL, id="deletes no pod"),
    ask("create", "pods", ALL, id="creates no pod"),
    ask("update", "pods", ALL, id="replaces no pod"),
    ask("patch", "namespaces", id="changes no namespace"),
    ask("delete", "podgroups.scheduling.k8s.io", ALL, id="deletes no pod group"),
    ask("create", "pods", ALL, "--subresource=eviction", id="evicts no pod"),
    ask("update", "clusterroles.rbac.authorization.k8s.io", id="changes no cluster role"),
    ask("escalate", "clusterroles.rbac.authorization.k8s.io", id="escalates nothing"),
    ask("create", "clusterrolebindings.rbac.authorization.k8s.io", id="binds no role"),
    ask("impersonate", "serviceaccounts", ALL, id="impersonates no one"),
    ask("create", "serviceaccounts", ALL, "--subresource=token", id="mints no token"),
    ask("update", "workloads.kueue.x-k8s.io", ALL, id="replaces no workload"),
    ask(
        "update",
        "workloads.kueue.x-k8s.io",
        ALL,
        "--subresource=finalizers",
        id="needs no workload's finalizers: nothing of its is owned by one",
    ),
    ask(
        "update",
        "podgroups.scheduling.k8s.io",
        ALL,
        "--subresource=finalizers",
        id="needs no pod group's finalizers either",
    ),
    ask("patch", "workloads.kueue.x-k8s.io", ALL, id="patches no workload spec"),
    ask("delete", "workloads.kueue.x-k8s.io", ALL, id="deletes no workload"),
    ask("update", "workloads.kueue.x-k8s.io", ALL, STATUS, id="replaces no workload status"),
    ask("create", "admissionchecks.kueue.x-k8s.io", id="creates no admission check"),
    ask("patch", "admissionchecks.kueue.x-k8s.io", id="patches no admission check spec"),
    ask("patch", "clusterqueues.kueue.x-k8s.io", id="touches no cluster queue"),
    ask("update", "atomicprovisioningconfigs.gangcheck.io", id="changes none of its configs"),
    ask(
        "patch",
        "provisioningrequests.autoscaling.x-k8s.io",
        ALL,
        STATUS,
        id="writes no request status, which is the autoscaler's",
    ),
    ask("delete", "nodeclaims.karpenter.sh", id="deletes no node claim without the component"),
    ask("patch", "machines.cluster.x-k8s.io", ALL, id="patches no machine without the component"),
    ask("delete", "customresourcedefinitions.apiextensions.k8s.io", id="deletes no CRD"),
    ask(
        "update", "leases.coordination.k8s.io", "--namespace=default", id="holds no lease elsewhere"
    ),
    ask("update", "leases.coordination.k8s.io/kube-scheduler", IN_OWN, id="renews no other lease"),
    ask("delete", "leases.coordination.k8s.io/gangcheck", IN_OWN, id="deletes no lease"),
]


@pytest.mark.parametrize(("verb", "resource", "flags"), MAY)
def test_the_service_account_may(
    control_plane: ControlPlane,
    installed: list[Obj],
    verb: str,
    resource: str,
    flags: tuple[str, ...],
) -> None:
    assert can_i(control_plane, verb, resource, *flags)


@pytest.mark.parametrize(("verb", "resource", "flags"), MAY_NOT)
def test_the_service_account_may_not(
    control_plane: ControlPlane,
    installed: list[Obj],
    verb: str,
    resource: str,
    flags: tuple[str, ...],
) -> None:
    assert not can_i(control_plane, verb, resource, *flags)


# ---- the reclaimer components --------------------------------------------------------

COMPONENT_GRANTS = [
    pytest.param(
        "reclaim-delete-node",
        [("delete", "nodes", ())],
        id="reclaim-delete-node lets it delete nodes",
    ),
    pytest.param(
        "reclaim-nodeclaim",
        [
            ("get", "nodeclaims.karpenter.sh", ()),
            ("list", "nodeclaims.karpenter.sh", ()),
            ("delete", "nodeclaims.karpenter.sh", ()),
        ],
        id="reclaim-nodeclaim lets it find and delete node claims",
    ),
    pytest.param(
        "reclaim-capi",
        [
            (verb, f"{plural}.cluster.x-k8s.io", (ALL,))
            for plural in ("machines", "machinesets", "machinedeployments")
            for verb in ("get", "patch")
        ],
        id="reclaim-capi lets it mark machines and scale their owners",
    ),
]


@pytest.mark.parametrize(("component", "grants"), COMPONENT_GRANTS)
def test_a_reclaimer_component_grants_only_its_reclaimer_and_the_base_takes_it_back(
    control_plane: ControlPlane,
    installed: list[Obj],
    tmp_path: Path,
    component: str,
    grants: list[tuple[str, str, tuple[str, ...]]],
) -> None:
    with_component = documents(build(control_plane, overlay(tmp_path, component)))
    base_rules = the(installed, "ClusterRole")["rules"]
    added = [r for r in the(with_component, "ClusterRole")["rules"] if r not in base_rules]
    assert len(added) == 1, added
    assert [d for d in with_component if d["kind"] != "ClusterRole"] == [
        d for d in installed if d["kind"] != "ClusterRole"
    ]
    apply(control_plane, yaml.safe_dump_all(with_component))
    try:
        for verb, resource, flags in grants:
            assert can_i(control_plane, verb, resource, *flags), f"{verb} {resource}"
        assert not can_i(control_plane, "delete", "secrets", ALL)
        assert not can_i(control_plane, "create", "nodes")
    finally:
        # Applying the base again replaces the rules: the extra rule is gone.
        apply(control_plane, yaml.safe_dump_all(installed))
    for verb, resource, flags in grants:
        if verb in ("delete", "patch"):
            assert not can_i(control_plane, verb, resource, *flags), f"{verb} {resource}"


@pytest.fixture(scope="module")
def node_pool_crd(control_plane: ControlPlane) -> Iterator[None]:
    """Karpenter's NodePool CRD, from the module the test bed pins, so that kubectl knows the
    type; removed again if this module installed it (NodeClaims: tests/crds)."""
    module = crds.module_dir(KARPENTER_MODULE, wrapper="karpenter", toolchain=KARPENTER_TOOLCHAIN)
    wanted = crds.load_crds([module / "kwok" / "charts" / "crds" / "karpenter.sh_nodepools.yaml"])
    admin = control_plane.client()
    missing = [c for c in wanted if admin.request("GET", _crd_path(c)).status == 404]
    crds.install_crds(admin, missing)
    yield
    for crd in missing:
        admin.request("DELETE", _crd_path(crd))
    crds.wait_gone(admin, [c["metadata"]["name"] for c in missing])  # gone before the next module


def test_the_karpenter_component_grants_the_backend_and_never_writes_pools(
    control_plane: ControlPlane, installed: list[Obj], node_pool_crd: None, tmp_path: Path
) -> None:
    with_component = documents(build(control_plane, overlay(tmp_path, "karpenter")))
    base_rules = the(installed, "ClusterRole")["rules"]
    added = [r for r in the(with_component, "ClusterRole")["rules"] if r not in base_rules]
    assert [(r["resources"], r["verbs"]) for r in added] == [
        (["nodepools"], ["get", "list", "watch"]),
        (["nodeclaims"], ["get", "list", "watch", "create", "patch", "delete"]),
        (["provisioningrequests/status"], ["patch"]),
    ]
    status = ("patch", "provisioningrequests.autoscaling.x-k8s.io", ALL, STATUS)
    apply(control_plane, yaml.safe_dump_all(with_component))
    try:
        for verb in ("get", "list", "watch"):
            assert can_i(control_plane, verb, "nodepools.karpenter.sh")
        for verb in ("create", "patch", "delete", "watch"):
            assert can_i(control_plane, verb, "nodeclaims.karpenter.sh")
        for verb in ("create", "patch", "update", "delete"):
            assert not can_i(control_plane, verb, "nodepools.karpenter.sh"), verb
        assert not can_i(control_plane, "update", "nodeclaims.karpenter.sh")
        assert can_i(control_plane, *status)
    finally:
        apply(control_plane, yaml.safe_dump_all(installed))
    assert not can_i(control_plane, "create", "nodeclaims.karpenter.sh")
    assert not can_i(control_plane, *status)


# ---- the example ---------------------------------------------------------------------


def test_the_gpu_example_is_valid_for_the_api_server_and_for_gangcheck(
    control_plane: ControlPlane,
) -> None:
    manifests = build(control_plane, EXAMPLE)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in documents(manifests))
    assert kinds == [
        "AdmissionCheck/gpu-atomic",
        "AtomicProvisioningConfig/gpu-atomic",
        "ClusterQueue/gpu",
        "LocalQueue/gpu",
        "ResourceFlavor/gpu",
    ]
    stdout, warnings = apply(control_plane, manifests, "--dry-run=server")
    assert "Warning" not in warnings, warnings
    assert stdout.count("serverside-applied (server dry run)") == 5, stdout
    config = the(documents(manifests), "AtomicProvisioningConfig")
    parse_spec(config["spec"])  # what the controller checks before it calls the check Active
    queue = the(documents(manifests), "ClusterQueue")
    assert queue["spec"]["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": "gpu-atomic", "onFlavors": ["gpu"]}
    ]


# ---- the controller, with nothing but the ServiceAccount's rights -----------------------


def service_account_kubeconfig(cp: ControlPlane, folder: Path) -> Path:
    """A kubeconfig holding a fresh token of the ServiceAccount (TokenRequest API)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    path = f"/api/v1/namespaces/{NAMESPACE_NAME}/serviceaccounts/{ACCOUNT}/token"
    reply = cp.client().request("POST", path, json.dumps(request).encode())
    assert reply.status == 201, reply.body
    token = reply.json()["status"]["token"]
    return token_kubeconfig(cp, ACCOUNT, token, folder / "service-account.kubeconfig")


async def active_condition(admin: Kube, check: str) -> Obj | None:
    ac = await admin.get(ADMISSION_CHECK, check)
    conditions = (ac.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Active" and c["status"] == "True"), None)


async def submit_gang(admin: Kube, namespace: str) -> str:
    """As Kueue core would: a Workload on the example's queue, quota reserved on the GPU
    flavor, the example's check Pending."""
    builder = (
        WorkloadBuilder("gang", namespace=namespace)
        .pod_set("driver", 1, pod_template(cpu="2"))
        .pod_set("workers", 4, pod_template(gpu=8))
        .reserve_quota("gpu")
        .check("gpu-atomic")
    )
    obj = builder.build()
    for key in ("uid", "resourceVersion"):
        obj["metadata"].pop(key)
    obj["spec"]["queueName"] = "gpu"
    status = obj.pop("status")
    status["admission"]["clusterQueue"] = "gpu"
    created = await admin.create(WORKLOAD, obj)
    created["status"] = status
    await admin.replace(WORKLOAD, created, subresource="status")
    return str(obj["metadata"]["name"])


async def get_or_none(admin: Kube, res: Any, name: str, namespace: str) -> Obj | None:
    try:
        return await admin.get(res, name, namespace)
    except NotFoundError:
        return None


@contextlib.asynccontextmanager
async def running(kube: Kube) -> Any:
    controller = Controller(kube, workers=2, watch_timeout=30)
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.wait_for(controller.caches.wait_synced(), 60)
        yield controller
    finally:
        await cancelled(task)


def remove_namespace(cp: ControlPlane, namespace: str) -> None:
    """What the namespace controller would do: delete what is in it, then the namespace."""
    kinds = "workloads.kueue.x-k8s.io,provisioningrequests.autoscaling.x-k8s.io,podtemplates,events"
    kubectl(cp, "delete", kinds, "--all", f"--namespace={namespace}", "--wait=false")
    kubectl(cp, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
    finalize_namespace(cp, namespace)


async def prove_the_controller_works(
    cp: ControlPlane, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Run the controller as the ServiceAccount on the example: the check turns Active, a
    gang gets its request, the templates go to the request, the Event is recorded, and no
    call is refused."""
    kubeconfig = service_account_kubeconfig(cp, folder)
    example = build(cp, EXAMPLE)
    apply(cp, example)
    namespace = f"manifests-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING)
    try:
        async with (
            await Kube.connect(str(cp.kubeconfig)) as admin,
            await Kube.connect(str(kubeconfig)) as account,
        ):
            await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
            async with running(account):
                request = await gang_gets_its_request(admin, namespace)
    finally:
        remove_namespace(cp, namespace)
        kubectl(cp, "delete", "--ignore-not-found", "-f", "-", stdin=example)
    # Only the GPU pod set is provisioned (managedResources), with the example's class.
    assert request["spec"]["provisioningClassName"] == (
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    )
    template = naming.template_name(request["metadata"]["name"], "workers")
    assert request["spec"]["podSets"] == [{"podTemplateRef": {"name": template}, "count": 4}]
    # No cache failed to list or watch, and no call for this gang was refused. (Objects other
    # tests left in the shared control plane may ask for a reclaimer this base lacks.)
    refused = [
        message
        for message in (r.getMessage() for r in caplog.records)
        if "forbidden" in message.lower() and ("list/watch" in message or namespace in message)
    ]
    assert not refused, refused


async def gang_gets_its_request(admin: Kube, namespace: str) -> Obj:
    await eventually(
        lambda: active_condition(admin, "gpu-atomic"), what="the example's AdmissionCheck Active"
    )
    workload = await submit_gang(admin, namespace)
    name = naming.request_name(workload, "gpu-atomic", 1)
    request: Obj = await eventually(
        lambda: get_or_none(admin, PROVISIONING_REQUEST, name, namespace),
        what=f"ProvisioningRequest {name}",
    )
    template = naming.template_name(name, "workers")

    made: Obj = await eventually(
        lambda: get_or_none(admin, POD_TEMPLATE, template, namespace),
        what=f"PodTemplate {template}",
    )
    # Owned by nothing (a request deleted by hand must not take it with it, nor the garbage
    # collector a kept request's with its Workload); it names the Workload's uid.
    owner = await admin.get(WORKLOAD, workload, namespace)
    assert "ownerReferences" not in made["metadata"]
    assert made["metadata"]["annotations"]["gangcheck.io/workload-uid"] == owner["metadata"]["uid"]

    async def recorded() -> list[Obj]:
        items = (await admin.list_objects(EVENT, namespace)).get("items") or []
        return [e for e in items if e["reason"] == "ProvisioningRequestCreated"]

    await eventually(recorded, what="the ProvisioningRequestCreated event")
    return request


async def test_the_controller_works_with_only_the_service_accounts_rights(
    control_plane: ControlPlane,
    installed: list[Obj],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await prove_the_controller_works(control_plane, tmp_path, caplog)


@pytest.fixture(scope="module")
def enforcing_control_plane(testbed_binaries: dict[str, Path]) -> Iterator[ControlPlane]:
    """A control plane that also runs OwnerReferencesPermissionEnforcement (as OpenShift
    does): setting blockOwnerDeletion needs update on the owner's finalizers."""
    plugin = "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"
    with ControlPlane(binaries=testbed_binaries, apiserver_args=[plugin]) as plane:
        yield plane


async def test_the_controller_works_where_owner_references_are_enforced(
    enforcing_control_plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with base_installed(enforcing_control_plane):
        await prove_the_controller_works(enforcing_control_plane, tmp_path, caplog)
