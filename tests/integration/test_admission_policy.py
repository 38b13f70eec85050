"""The ValidatingAdmissionPolicy of manifests/base on a real kube-apiserver: with a token of
gangcheck's ServiceAccount, the changes gangcheck makes go through, and every other change to
Pods and Nodes is refused by the API server, even where RBAC would allow it.

The base is applied as a person would (kubectl, server-side); gangcheck's own code (the
PodGroup release, the node claim and the reclaim paths) then runs with the ServiceAccount's
token. Everything applied is removed again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import MERGE_PATCH, Kube
from gangcheck.kube.errors import ApiError, NotFoundError
from gangcheck.kube.resources import NAMESPACE, NODE, POD, SERVICE_ACCOUNT, Resource
from gangcheck.logic.attempt.hold import hold_taint, hold_toleration
from gangcheck.model.names import ARRIVED_FOR, GATE, OPT_IN_LABEL
from gangcheck.reclaim.safely import Target, reclaim_safely
from tests.builders import container
from tests.integration.harness import Cluster, eventually
from tests.integration.test_manifests import (
    ACCOUNT,
    NAMESPACE_NAME,
    base_installed,
    service_account_kubeconfig,
)
from tests.integration.test_podgroups import Groups, controller_running

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
POLICY = "gangcheck-writes-only-its-own"
CLUSTER_ROLE = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
CLUSTER_ROLE_BINDING = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)
CA_TAINT = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}
LONG_AGO = "2020-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def policy(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """manifests/base applied (RBAC and the policy); the ServiceAccount's kubeconfig."""
    with base_installed(control_plane):
        folder = tmp_path_factory.mktemp("policy")
        yield str(service_account_kubeconfig(control_plane, folder))


@pytest.fixture
async def account(policy: str, kube: Kube) -> AsyncIterator[Kube]:
    """A client with the ServiceAccount's token, once the API server enforces the policy."""
    async with await Kube.connect(policy) as account:
        await until_enforced(account, kube)
        yield account


async def until_enforced(account: Kube, admin: Kube) -> None:
    """The API server loads policies from an informer: wait until it refuses a dry-run change
    of a probe node's label (allowed by RBAC, refused by the policy)."""
    name = f"policy-probe-{uuid.uuid4().hex[:6]}"
    await admin.create(NODE, {"metadata": {"name": name}})
    path = NODE.object_path(name, None)
    patch = {"metadata": {"labels": {"example.com/probe": "1"}}}

    async def refused() -> bool:
        try:
            await account.request(
                "PATCH", path, query={"dryRun": "All"}, body=patch, content_type=MERGE_PATCH
            )
        except ApiError as e:
            if refused_by_policy(e):
                return True
            raise
        return False

    try:
        await eventually(refused, timeout=30, what="the policy enforced")
    finally:
        await admin.delete(NODE, name)


@pytest.fixture
async def may_delete_nodes(kube: Kube) -> AsyncIterator[None]:
    """What manifests/components/reclaim-delete-node grants, for the reclaim tests."""
    name = f"gangcheck-delete-nodes-{uuid.uuid4().hex[:6]}"
    rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}
    await kube.create(CLUSTER_ROLE, {"metadata": {"name": name}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE_NAME}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    body = {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
    await kube.create(CLUSTER_ROLE_BINDING, body)
    try:
        yield
    finally:
        await kube.delete(CLUSTER_ROLE_BINDING, name)
        await kube.delete(CLUSTER_ROLE, name)


@pytest.fixture
async def opted_out(kube: Kube) -> AsyncIterator[str]:
    name = f"opted-out-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACE, {"metadata": {"name": name}})
    # No controller-manager runs here: the namespace's ServiceAccount is made by hand.
    await kube.create(SERVICE_ACCOUNT, {"metadata": {"name": "default"}}, name)
    try:
        yield name
    finally:
        await kube.delete(NAMESPACE, name)


@pytest.fixture
async def groups(cluster: Cluster) -> Groups:
    """PodGroup helpers in the test's namespace, opted in to gating."""
    g = Groups(cluster)
    await g.opt_in()
    return g


async def gated_pod(
    kube: Kube, namespace: str, name: str, *, gates: tuple[str, ...] = (GATE,)
) -> Obj:
    spec: Obj = {"containers": [container(gpu=1)], "restartPolicy": "Never"}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    body = {"metadata": {"name": name, "labels": {"app": "trainer"}}, "spec": spec}
    return await kube.create(POD, body, namespace)


def refused_by_policy(error: ApiError) -> bool:
    return error.status in (403, 422) and f"ValidatingAdmissionPolicy '{POLICY}'" in str(error)


async def refusal(write: Any) -> ApiError:
    """The API server's refusal of ``write`` by the policy."""
    with pytest.raises(ApiError) as refused:
        await write()
    assert refused_by_policy(refused.value), refused.value
    return refused.value


# ---- refused ---------------------------------------------------------------------------


async def test_changing_a_gated_pods_image_is_refused(
    account: Kube, groups: Groups, policy: str
) -> None:
    pod = await gated_pod(groups.kube, groups.ns, "p")
    containers = pod["spec"]["containers"]
    containers[0]["image"] = "attacker:1"
    image = {"spec": {"containers": containers}}
    error = await refusal(lambda: account.merge_patch(POD, "p", image, groups.ns))
    assert "containers" in str(error)
    assert (await groups.pod("p"))["spec"]["containers"][0]["image"] != "attacker:1"


def _tolerate_everything(pod: Obj) -> Obj:
    return {"spec": {"tolerations": [*pod["spec"]["tolerations"], {"operator": "Exists"}]}}


CHANGES_GANGCHECK_NEVER_MAKES = {
    "a label": (lambda _: {"metadata": {"labels": {"app": "other"}}}, "labels"),
    "another annotation": (lambda _: {"metadata": {"annotations": {"team": "x"}}}, "team"),
    "another scheduling gate": (
        lambda _: {"spec": {"schedulingGates": [{"name": GATE}]}},
        "scheduling gate",
    ),
    "a toleration": (_tolerate_everything, "toleration of its hold"),
}


@pytest.mark.parametrize("what", CHANGES_GANGCHECK_NEVER_MAKES)
async def test_changing_anything_of_a_gated_pod_but_its_gate_and_annotations_is_refused(
    account: Kube, groups: Groups, what: str
) -> None:
    pod = await gated_pod(groups.kube, groups.ns, "p", gates=(GATE, "other.example.com/gate"))
    change, says = CHANGES_GANGCHECK_NEVER_MAKES[what]
    patch = change(pod)
    error = await refusal(lambda: account.merge_patch(POD, "p", patch, groups.ns))
    assert says in str(error), what
    assert (await groups.pod("p"))["metadata"]["resourceVersion"] == pod["metadata"][
        "resourceVersion"
    ]


async def test_a_pod_without_gangchecks_gate_is_refused(account: Kube, groups: Groups) -> None:
    await gated_pod(groups.kube, groups.ns, "free", gates=())
    ours = {"metadata": {"annotations": {"gangcheck.io/note": "x"}}}
    error = await refusal(lambda: account.merge_patch(POD, "free", ours, groups.ns))
    assert "scheduling gate" in str(error)


async def test_a_gated_pod_in_a_namespace_not_opted_in_is_refused(
    account: Kube, kube: Kube, opted_out: str
) -> None:
    await gated_pod(kube, opted_out, "p")
    lift = {"spec": {"schedulingGates": None}}
    error = await refusal(lambda: account.merge_patch(POD, "p", lift, opted_out))
    assert OPT_IN_LABEL in str(error)
    pod = await kube.get(POD, "p", opted_out)
    assert pod["spec"]["schedulingGates"] == [{"name": GATE}]


async def test_another_controllers_node_taint_label_and_annotation_are_kept(
    account: Kube, cluster: Cluster
) -> None:
    (name,) = await cluster.add_nodes(1, taints=[CA_TAINT])
    writes = {
        "taint": {"spec": {"taints": None}},
        "label": {"metadata": {"labels": {"node-role.kubernetes.io/gpu": ""}}},
        "annotation": {"metadata": {"annotations": {"example.com/owner": "me"}}},
    }
    for what, patch in writes.items():
        error = await refusal(lambda p=patch: account.merge_patch(NODE, name, p))
        assert "gangcheck may" in str(error), what
    node = await cluster.kube.get(NODE, name)
    assert node["spec"]["taints"] == [CA_TAINT]
    assert "example.com/owner" not in (node["metadata"].get("annotations") or {})


async def test_karpenters_do_not_disrupt_may_only_be_removed(
    account: Kube, cluster: Cluster
) -> None:
    """A gang's NodeClaims bring ``karpenter.sh/do-not-disrupt`` onto their nodes;
    gangcheck removes it once the gang has started, and never sets or changes it."""
    protected, plain = await cluster.add_nodes(2)
    key = "karpenter.sh/do-not-disrupt"
    await cluster.kube.merge_patch(NODE, protected, {"metadata": {"annotations": {key: "true"}}})
    for name, value in ((plain, "true"), (protected, "false")):
        patch = {"metadata": {"annotations": {key: value}}}
        error = await refusal(lambda n=name, p=patch: account.merge_patch(NODE, n, p))
        assert key in str(error)
    await account.merge_patch(NODE, protected, {"metadata": {"annotations": {key: None}}})
    node = await cluster.kube.get(NODE, protected)
    assert key not in (node["metadata"].get("annotations") or {})
    assert key not in ((await cluster.kube.get(NODE, plain))["metadata"].get("annotations") or {})


async def test_a_node_not_recorded_as_arrived_is_never_deleted(
    account: Kube, cluster: Cluster, may_delete_nodes: None
) -> None:
    (name,) = await cluster.add_nodes(1)
    error = await refusal(lambda: account.delete(NODE, name))
    assert ARRIVED_FOR in str(error)
    assert await cluster.kube.get(NODE, name)


# ---- what gangcheck does still works ---------------------------------------------------


async def test_a_podgroup_gang_is_released_by_the_service_account(
    policy: str, groups: Groups
) -> None:
    """The real controller, as the ServiceAccount: the gang fits on existing nodes and every
    member is released (gate lifted, annotations written) through the policy."""
    await groups.cluster.add_nodes(2, gpu=1)
    await groups.upstream("train", 2)
    async with controller_running(policy):
        for i in range(2):
            await groups.member(f"train-{i}", "train")
        await groups.wait_state("train", "Released", timeout=30)
    assert await groups.gated("train-0", "train-1") == [False, False]


async def test_a_node_is_claimed_fenced_and_deleted_by_the_service_account(
    account: Kube, cluster: Cluster, may_delete_nodes: None
) -> None:
    (name,) = await cluster.add_nodes(1, taints=[CA_TAINT])
    request = f"{cluster.ns}/gang-check-1"
    await account.merge_patch(NODE, name, {"metadata": {"annotations": {ARRIVED_FOR: request}}})
    target = Target(name, request, LONG_AGO, "DeleteNode")
    result = await reclaim_safely(account, target, datetime.now(UTC))
    assert result.verdict == "reclaimed", result

    async def gone() -> bool:
        try:
            await cluster.kube.get(NODE, name)
        except NotFoundError:
            return True
        return False

    await eventually(gone, what=f"node {name} deleted")


async def test_cordon_and_taint_keeps_other_taints(account: Kube, cluster: Cluster) -> None:
    (name,) = await cluster.add_nodes(1, taints=[CA_TAINT])
    request = f"{cluster.ns}/gang-check-1"
    await account.merge_patch(NODE, name, {"metadata": {"annotations": {ARRIVED_FOR: request}}})
    target = Target(name, request, LONG_AGO, "CordonAndTaint")
    result = await reclaim_safely(account, target, datetime.now(UTC))
    assert result.verdict == "reclaimed", result
    node = await cluster.kube.get(NODE, name)
    assert node["spec"]["unschedulable"] is True
    assert CA_TAINT in node["spec"]["taints"]


async def test_a_gang_on_new_capacity_is_held_released_and_unheld_by_the_service_account(
    policy: str, groups: Groups, kube: Kube
) -> None:
    """The real controller, as the ServiceAccount, through every write of a provisioned gang:
    the request, the nodes recorded and held, the members released with the hold's
    toleration, and the hold lifted once every member is bound."""
    request = "ddp-coscheduling-1"
    key = f"{groups.ns}/{request}"
    async with controller_running(policy):
        await groups.coscheduling("ddp", 2)
        for i in range(2):
            await groups.member(f"ddp-{i}", "ddp", plugins=True)
        await groups.cluster.wait_request(request)
        await groups.cluster.set_request_conditions(request, {"Provisioned": "ok"})
        nodes = await groups.cluster.add_nodes(2, gpu=1)
        await groups.wait_state("ddp", "Released", plugins=True, timeout=30)
        for name in nodes:
            assert hold_taint(key) in (await kube.get(NODE, name))["spec"]["taints"]
        for i, name in enumerate(nodes):
            pod = await groups.pod(f"ddp-{i}")
            assert hold_toleration(key) in pod["spec"]["tolerations"]
            await bind(kube, groups.ns, f"ddp-{i}", name)

        async def unheld() -> bool:
            taints = [(await kube.get(NODE, n))["spec"].get("taints") or [] for n in nodes]
            return all(hold_taint(key) not in t for t in taints)

        await eventually(unheld, timeout=30, what="the hold lifted once every member is bound")


async def bind(kube: Kube, namespace: str, pod: str, node: str) -> None:
    """As kube-scheduler: a Binding of the pod to the node."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await kube.request("POST", f"{POD.object_path(pod, namespace)}/binding", body=body)
