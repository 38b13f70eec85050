"""The ValidatingAdmissionPolicy of manifests/base on a real kube-apiserver: with a token of
gangcheck's ServiceAccount, the changes gangcheck makes go through, and every other change to
Pods and Nodes is refused by the API server, even where RBAC would allow it. The other way
round, under the records guard, a user who may edit requests in a namespace cannot forge the
records gangcheck keeps on the requests and PodTemplates it made.

The base is applied as a person would (kubectl, server-side); gangcheck's own code (the
PodGroup release, the node claim and the reclaim paths) then runs with the ServiceAccount's
token. Everything applied is removed again.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.testbed.identity import HARNESS
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, Kube
from gangcheck.kube.errors import ApiError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    CONFIG_MAP,
    EVENT,
    LEASE,
    NAMESPACE,
    NODE,
    PLUGINS_POD_GROUP,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    SERVICE_ACCOUNT,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.attempt.hold import (
    ARRIVING_TAINT,
    HOLD_TAINT,
    hold_taint,
    hold_toleration,
    taints_holding,
)
from gangcheck.logic.attempt.reclaim import RECLAIM_TAINT_ENTRY
from gangcheck.logic.attempt.scaledown import SCALE_DOWN_DISABLED
from gangcheck.logic.sources.karpenter.names import ATTEMPT_LABEL
from gangcheck.model.names import (
    ARRIVED_FOR,
    FENCE_LABEL,
    GATE,
    KUEUE_PROVISIONING,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OPT_IN_LABEL,
    OPT_OUT_LABEL,
    PHASE_ANNOTATION,
    RECLAIM_TAINT,
    RECLAIM_WHEN_IDLE,
    RECLAIMED_AT,
    SCALE_DOWN_GUARD,
    STATE_ANNOTATION,
    WORKLOAD_ANNOTATION,
)
from gangcheck.reclaim.safely import Target, reclaim_safely
from tests.builders import WorkloadBuilder, container
from tests.faults.proxy import FaultProxy, Faults
from tests.integration.harness import Cluster, RunningController, eventually, namespace_user
from tests.integration.test_manifests import (
    ACCOUNT,
    MANIFESTS,
    NAMESPACE_NAME,
    apply,
    base_installed,
    documents,
    service_account_kubeconfig,
)
from tests.integration.test_podgroups import Groups, controller_running

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
POLICY = "gangcheck-writes-only-its-own"
GUARD = "gangcheck-guards-its-records"
GUARDS = (GUARD, f"{HARNESS.namespace}-guards-its-records")
POLICY_FILE = MANIFESTS / "base" / "admission-policy.yaml"
CLUSTER_ROLE = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
CLUSTER_ROLE_BINDING = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)
CA_TAINT = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}
LONG_AGO = "2020-01-01T00:00:00Z"
#: A request's status as the autoscaler writes it once it has provisioned.
PROVISIONED = {
    "status": {
        "conditions": [
            {
                "type": "Provisioned",
                "status": "True",
                "reason": "Provisioned",
                "message": "",
                "lastTransitionTime": LONG_AGO,
            }
        ]
    }
}


@pytest.fixture(scope="module")
def control_plane(testbed_binaries: dict[str, Path]) -> Iterator[ControlPlane]:
    """A control plane of this module's own, on which no policy was installed before: on
    kube-apiserver 1.37, once the base (or the fence policy) had been installed and removed
    on a control plane, the arrivals policy installed again there was not enforced
    (docs/security.md); the tests of other modules that do so run on the session's."""
    plane = ControlPlane(binaries=testbed_binaries)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


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


async def until_refused(
    dry_run: Callable[[], Awaitable[object]], policy: str, what: str, *, timeout: float = 30
) -> None:
    """The API server loads policies and their params from informers: wait until it refuses
    `dry_run` (a write with dryRun=All, allowed by RBAC) by `policy`."""

    async def refused() -> bool:
        try:
            await dry_run()
        except ApiError as e:
            if refused_by_policy(e, policy):
                return True
            raise
        return False

    await eventually(refused, timeout=timeout, what=what)


async def until_enforced(account: Kube, admin: Kube) -> None:
    """The API server loads policies from an informer: wait until it refuses a dry-run change
    of a probe node's label (allowed by RBAC, refused by the policy)."""
    name = f"policy-probe-{uuid.uuid4().hex[:6]}"
    await admin.create(NODE, {"metadata": {"name": name}})
    path = NODE.object_path(name, None)
    patch = {"metadata": {"labels": {"example.com/probe": "1"}}}

    def dry_run() -> Awaitable[object]:
        query = {"dryRun": "All"}
        return account.request("PATCH", path, query=query, body=patch, content_type=MERGE_PATCH)

    try:
        await until_refused(dry_run, POLICY, "the policy enforced")
    finally:
        await admin.delete(NODE, name)


@contextlib.asynccontextmanager
async def granted(kube: Kube, rule: Obj) -> AsyncIterator[None]:
    """One more rule for the ServiceAccount, as a component of manifests/components grants it."""
    name = f"gangcheck-component-{uuid.uuid4().hex[:6]}"
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
async def may_delete_nodes(kube: Kube) -> AsyncIterator[None]:
    """What manifests/components/reclaim-delete-node grants, for the reclaim tests."""
    async with granted(kube, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}):
        yield


@pytest.fixture
async def may_write_request_status(kube: Kube) -> AsyncIterator[None]:
    """What manifests/components/karpenter grants on requests (gangcheck serves its class)."""
    rule = {
        "apiGroups": ["autoscaling.x-k8s.io"],
        "resources": ["provisioningrequests/status"],
        "verbs": ["patch"],
    }
    async with granted(kube, rule):
        yield


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


def refused_by_policy(error: ApiError, policy: str = POLICY) -> bool:
    """Refused by `policy`; for the records guard, by the base's or the harness's (installed
    here by the tests running the controller): both apply to every writer, and the API server
    names the first that refused."""
    names = GUARDS if policy == GUARD else (policy,)
    return error.status in (403, 422) and any(
        f"ValidatingAdmissionPolicy '{name}'" in str(error) for name in names
    )


async def refusal(write: Any, policy: str = POLICY) -> ApiError:
    """The API server's refusal of ``write`` by the policy (the base's main one unless named)."""
    with pytest.raises(ApiError) as refused:
        await write()
    assert refused_by_policy(refused.value, policy), refused.value
    return refused.value


async def claim(
    account: Kube, admin: Kube, node: str, request: str, *, dry_run: bool = False
) -> Obj:
    """Record the node as arrived for ``request`` and hold it, in one write, as gangcheck's
    applier does (reconcile/apply.py ``_claim_node``)."""
    current = await admin.get(NODE, node)
    patch = {
        "metadata": {"annotations": {ARRIVED_FOR: request}},
        "spec": {"taints": taints_holding(current, request)},
    }
    query = {"dryRun": "All"} if dry_run else None
    path = NODE.object_path(node, None)
    return await account.request("PATCH", path, query=query, body=patch, content_type=MERGE_PATCH)


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
    """A gang's NodeClaims bring ``karpenter.sh/do-not-disrupt`` onto their nodes (and
    their ``gangcheck.io/attempt`` label); gangcheck removes it once the gang has started,
    never sets or changes it, and removes it from no node of anyone else's."""
    protected, plain, others = await cluster.add_nodes(3)
    key = "karpenter.sh/do-not-disrupt"
    gangs = {"annotations": {key: "true"}, "labels": {ATTEMPT_LABEL: "r" + "0" * 40}}
    await cluster.kube.merge_patch(NODE, protected, {"metadata": gangs})
    await cluster.kube.merge_patch(NODE, others, {"metadata": {"annotations": {key: "true"}}})
    lift = {"metadata": {"annotations": {key: None}}}
    error = await refusal(lambda: account.merge_patch(NODE, others, lift))
    assert key in str(error)
    for name, value in ((plain, "true"), (protected, "false")):
        patch = {"metadata": {"annotations": {key: value}}}
        error = await refusal(lambda n=name, p=patch: account.merge_patch(NODE, n, p))
        assert key in str(error)
    await account.merge_patch(NODE, protected, {"metadata": {"annotations": {key: None}}})
    node = await cluster.kube.get(NODE, protected)
    assert key not in (node["metadata"].get("annotations") or {})
    assert key not in ((await cluster.kube.get(NODE, plain))["metadata"].get("annotations") or {})


async def test_scale_down_disabled_only_with_gangchecks_record_on_a_recorded_node(
    account: Kube, cluster: Cluster
) -> None:
    """While a request is kept for a top-up, gangcheck marks its nodes with
    cluster-autoscaler's ``scale-down-disabled: "true"`` and its own record naming the node's
    arrival, in one write, and takes both off together (logic/attempt/scaledown.py): never the
    autoscaler's key alone, another value, on a node it did not record, or someone else's."""
    sdd, guard = SCALE_DOWN_DISABLED, SCALE_DOWN_GUARD
    plain, recorded, theirs = await cluster.add_nodes(3)
    request = f"{cluster.ns}/gang-check-1"
    for name in (recorded, theirs):
        await claim(account, cluster.kube, name, request)
    await cluster.kube.merge_patch(NODE, theirs, {"metadata": {"annotations": {sdd: "true"}}})
    refused = {
        plain: [{sdd: "true", guard: request}],  # not recorded as arrived
        recorded: [
            {sdd: "true"},  # without the record
            {sdd: "false", guard: request},  # another value
            {sdd: "true", guard: f"{cluster.ns}/another"},  # a record naming another request
        ],
        theirs: [{sdd: None}, {sdd: None, guard: request}],  # someone else's, never taken off
    }
    for name, writes in refused.items():
        for notes in writes:
            patch = {"metadata": {"annotations": notes}}
            error = await refusal(lambda n=name, p=patch: account.merge_patch(NODE, n, p))
            assert "scale-down-disabled" in str(error), (name, notes)
    ours = {"metadata": {"annotations": {sdd: "true", guard: request}}}
    notes = (await account.merge_patch(NODE, recorded, ours))["metadata"]["annotations"]
    assert (notes[sdd], notes[guard]) == ("true", request)
    alone = {"metadata": {"annotations": {sdd: None}}}
    error = await refusal(lambda: account.merge_patch(NODE, recorded, alone))
    assert "scale-down-disabled" in str(error)
    lift = {"metadata": {"annotations": {sdd: None, guard: None}}}
    notes = (await account.merge_patch(NODE, recorded, lift))["metadata"]["annotations"]
    assert sdd not in notes and guard not in notes
    assert (await cluster.kube.get(NODE, theirs))["metadata"]["annotations"][sdd] == "true"


async def test_a_node_not_recorded_as_arrived_is_never_deleted(
    account: Kube, cluster: Cluster, may_delete_nodes: None
) -> None:
    (name,) = await cluster.add_nodes(1)
    error = await refusal(lambda: account.delete(NODE, name))
    assert ARRIVED_FOR in str(error)
    assert await cluster.kube.get(NODE, name)


# ---- nodes: only the exact keys, values and effects gangcheck writes -----------------------


async def test_an_arrival_is_recorded_once_with_the_hold_and_never_moved_or_removed(
    account: Kube, cluster: Cluster
) -> None:
    """Recording a node (``gangcheck.io/arrived-for``) is what makes it deletable: the account
    may write it only as gangcheck does (with the hold of that request), once."""
    fresh, recorded = await cluster.add_nodes(2)
    alone = {"metadata": {"annotations": {ARRIVED_FOR: f"{cluster.ns}/gang-check-1"}}}
    error = await refusal(lambda: account.merge_patch(NODE, fresh, alone))
    assert ARRIVED_FOR in str(error)
    await claim(account, cluster.kube, recorded, f"{cluster.ns}/gang-check-1")
    for value in (f"{cluster.ns}/gang-check-2", None):
        moved = {"metadata": {"annotations": {ARRIVED_FOR: value}}}
        error = await refusal(lambda p=moved: account.merge_patch(NODE, recorded, p))
        assert ARRIVED_FOR in str(error)
    node = await cluster.kube.get(NODE, recorded)
    assert node["metadata"]["annotations"][ARRIVED_FOR] == f"{cluster.ns}/gang-check-1"
    assert ARRIVED_FOR not in (
        (await cluster.kube.get(NODE, fresh))["metadata"].get("annotations") or {}
    )


def _adding(taint: Obj) -> Callable[[list[Obj]], list[Obj]]:
    return lambda taints: [*taints, taint]


def _hold_moved(taints: list[Obj]) -> list[Obj]:
    """The node's hold given to another request's gang, with no recording."""
    return [t for t in taints if t["key"] != HOLD_TAINT] + [hold_taint("default/someone")]


NODE_TAINTS_GANGCHECK_NEVER_WRITES = {
    "NoExecute with its key": _adding(
        {"key": RECLAIM_TAINT, "value": "true", "effect": "NoExecute"}
    ),
    "another gangcheck.io key": _adding({"key": "gangcheck.io/evict", "effect": "NoSchedule"}),
    "its fence with another value": _adding(
        {"key": RECLAIM_TAINT, "value": "x", "effect": "NoSchedule"}
    ),
    "its hold for another request": _hold_moved,
    "the arrival taint": _adding({"key": ARRIVING_TAINT, "effect": "NoSchedule"}),
}


@pytest.mark.parametrize("what", NODE_TAINTS_GANGCHECK_NEVER_WRITES)
async def test_a_taint_gangcheck_never_writes_is_refused(
    account: Kube, cluster: Cluster, what: str
) -> None:
    """Not even on a node recorded as arrived: a NoExecute taint would evict its pods."""
    (name,) = await cluster.add_nodes(1)
    await claim(account, cluster.kube, name, f"{cluster.ns}/gang-check-1")
    node = await cluster.kube.get(NODE, name)
    taints = NODE_TAINTS_GANGCHECK_NEVER_WRITES[what](node["spec"]["taints"])
    error = await refusal(lambda: account.merge_patch(NODE, name, {"spec": {"taints": taints}}))
    assert "taint" in str(error), what
    assert (await cluster.kube.get(NODE, name))["spec"]["taints"] == node["spec"]["taints"]


async def test_the_fence_goes_only_on_a_node_recorded_as_arrived(
    account: Kube, cluster: Cluster
) -> None:
    """The fence label makes the fence policy refuse every bind to the node; cordon and the
    fence taint keep the scheduler off it: none of them on a node gangcheck did not record."""
    (name,) = await cluster.add_nodes(1)
    writes = {
        "label": {"metadata": {"labels": {FENCE_LABEL: "true"}}},
        "taint": {"spec": {"taints": [RECLAIM_TAINT_ENTRY]}},
        "cordon": {"spec": {"unschedulable": True}},
        "mark": {"metadata": {"annotations": {RECLAIM_WHEN_IDLE: "{}"}}},
    }
    for what, patch in writes.items():
        error = await refusal(lambda p=patch: account.merge_patch(NODE, name, p))
        assert "gangcheck may" in str(error), what
    node = await cluster.kube.get(NODE, name)
    assert FENCE_LABEL not in node["metadata"]["labels"]
    assert not node["spec"].get("unschedulable")


async def test_a_cordon_or_opt_out_label_of_someone_else_stays(
    account: Kube, cluster: Cluster
) -> None:
    """An administrator's cordon and ``gangcheck.io/do-not-reclaim`` are not gangcheck's to
    lift, even on a node it recorded."""
    (name,) = await cluster.add_nodes(1)
    await cluster.kube.merge_patch(
        NODE,
        name,
        {"metadata": {"labels": {OPT_OUT_LABEL: "true"}}, "spec": {"unschedulable": True}},
    )
    await claim(account, cluster.kube, name, f"{cluster.ns}/gang-check-1")
    for what, patch in {
        "uncordon": {"spec": {"unschedulable": None}},
        "opt-out label": {"metadata": {"labels": {OPT_OUT_LABEL: None}}},
    }.items():
        error = await refusal(lambda p=patch: account.merge_patch(NODE, name, p))
        assert "gangcheck may" in str(error), what
    node = await cluster.kube.get(NODE, name)
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][OPT_OUT_LABEL] == "true"


async def test_a_node_recorded_but_not_fenced_or_opted_out_is_never_deleted(
    account: Kube, cluster: Cluster, may_delete_nodes: None
) -> None:
    """Deleting needs the node recorded, fenced as gangcheck fences, and not opted out."""
    recorded, opted_out = await cluster.add_nodes(2)
    request = f"{cluster.ns}/gang-check-1"
    await claim(account, cluster.kube, recorded, request)
    error = await refusal(lambda: account.delete(NODE, recorded))
    assert "fenced" in str(error)
    await cluster.kube.merge_patch(
        NODE, opted_out, {"metadata": {"labels": {OPT_OUT_LABEL: "true"}}}
    )
    await claim(account, cluster.kube, opted_out, request)
    node = await cluster.kube.get(NODE, opted_out)
    fence = {
        "metadata": {"labels": {FENCE_LABEL: "true"}},
        "spec": {"unschedulable": True, "taints": [*node["spec"]["taints"], RECLAIM_TAINT_ENTRY]},
    }
    await account.merge_patch(NODE, opted_out, fence)
    error = await refusal(lambda: account.delete(NODE, opted_out))
    assert OPT_OUT_LABEL in str(error)
    for name in (recorded, opted_out):
        assert await cluster.kube.get(NODE, name)


WINDOW = 3
IDENTITY = "apiserver.kubernetes.io/identity"
ARRIVALS = "gangcheck-writes-only-its-own-arrivals"
CHECKS = "gangcheck-writes-only-its-own-checks"


@pytest.fixture
def arrivals_within(policy: str, control_plane: ControlPlane) -> Iterator[None]:
    """The arrivals policy with its hour cut to a few seconds, restored afterwards: a node an
    hour old cannot be made on a test bed, one a few seconds old can."""
    text = POLICY_FILE.read_text()
    (original,) = (
        d
        for d in documents(text)
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == ARRIVALS
    )
    shipped = yaml.safe_dump(original)
    assert 'duration("1h")' in shipped
    apply(control_plane, shipped.replace('duration("1h")', f'duration("{WINDOW}s")'))
    try:
        yield
    finally:
        apply(control_plane, shipped)


@pytest.mark.timeout(180)
async def test_only_a_new_node_or_one_that_came_closed_or_held_can_be_recorded(
    account: Kube, cluster: Cluster, arrivals_within: None
) -> None:
    """A node older than the window (an hour as shipped) cannot be recorded as arrived, so
    never fenced or deleted by the account: the API server's own identity Leases tell it
    the time. A node that registered closed (the arrival taint) or held (the hold taint a
    gang's NodeClaim gives it) can be, whatever its age: the account cannot add either."""
    request = f"{cluster.ns}/gang-check-1"
    (closed,) = await cluster.add_nodes(1, taints=[{"key": ARRIVING_TAINT, "effect": "NoSchedule"}])
    (held,) = await cluster.add_nodes(1, taints=[hold_taint(request)])
    (old,) = await cluster.add_nodes(1)
    # The node is too old once the API server's identity Lease, renewed every 10 s, is read
    # more than the window after the node's creation: one renewal, delivered to the policy
    # by the API server's param informer; both lag on a loaded machine (30 s was not enough).
    try:
        await until_refused(
            lambda: claim(account, cluster.kube, old, request, dry_run=True),
            ARRIVALS,
            f"node {old} too old to be recorded",
            timeout=90,
        )
    except AssertionError as e:  # say what the policy compared
        leases = await cluster.kube.list_objects(LEASE, "kube-system")
        times = {
            lease["metadata"]["name"]: lease["spec"].get("renewTime")
            for lease in leases["items"]
            if (lease["metadata"].get("labels") or {}).get(IDENTITY) == "kube-apiserver"
        }
        made = (await cluster.kube.get(NODE, old))["metadata"]["creationTimestamp"]
        raise AssertionError(f"{e}; node created {made}; identity Leases renewed {times}") from e
    error = await refusal(lambda: claim(account, cluster.kube, old, request), ARRIVALS)
    assert "created in the last" in str(error)
    for name in (closed, held):
        node = await claim(account, cluster.kube, name, request)
        assert node["metadata"]["annotations"][ARRIVED_FOR] == request
        assert hold_taint(request) in node["spec"]["taints"]
    assert ARRIVED_FOR not in (
        (await cluster.kube.get(NODE, old))["metadata"].get("annotations") or {}
    )


# ---- requests, templates, events: only those it made, where it works --------------------


def provisioning_request(name: str, *, ours: bool) -> Obj:
    meta: Obj = {"name": name}
    if ours:
        meta["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    spec = {
        "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": f"{name}-main"}, "count": 1}],
    }
    return {"metadata": meta, "spec": spec}


def pod_template(name: str, *, ours: bool) -> Obj:
    meta: Obj = {"name": name}
    if ours:
        meta["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    return {"metadata": meta, "template": {"spec": {"containers": [container()]}}}


async def test_a_request_or_template_it_did_not_make_is_neither_deleted_nor_changed(
    account: Kube, cluster: Cluster
) -> None:
    """gangcheck's mark (``app.kubernetes.io/managed-by=gangcheck``) is set when it creates
    and never added later, so what carries it is what it made."""
    ns = cluster.ns
    await cluster.kube.create(PROVISIONING_REQUEST, provisioning_request("theirs", ours=False), ns)
    await cluster.kube.create(POD_TEMPLATE, pod_template("theirs-main", ours=False), ns)
    for res, name in ((PROVISIONING_REQUEST, "theirs"), (POD_TEMPLATE, "theirs-main")):
        error = await refusal(lambda r=res, n=name: account.delete(r, n, ns))
        assert "it made" in str(error)
    mark = {"metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY}}}
    await refusal(lambda: account.merge_patch(PROVISIONING_REQUEST, "theirs", mark, ns))
    phase = {"metadata": {"annotations": {PHASE_ANNOTATION: "RollingBack"}}}
    await refusal(lambda: account.merge_patch(PROVISIONING_REQUEST, "theirs", phase, ns))
    request = await cluster.kube.get(PROVISIONING_REQUEST, "theirs", ns)
    assert MANAGED_BY_LABEL not in (request["metadata"].get("labels") or {})
    assert await cluster.kube.get(POD_TEMPLATE, "theirs-main", ns)


async def test_its_own_request_keeps_its_identity_and_its_status_is_not_its_to_write(
    account: Kube, cluster: Cluster, may_write_request_status: None
) -> None:
    """On its own requests gangcheck writes its annotations (phase, outcome); not the
    identity ones that tie a request to its gang, nor the status of a class it does not
    serve (the autoscaler's Provisioned=True)."""
    ns = cluster.ns
    await account.create(PROVISIONING_REQUEST, provisioning_request("ours", ours=True), ns)
    await account.merge_patch(
        PROVISIONING_REQUEST,
        "ours",
        {"metadata": {"annotations": {PHASE_ANNOTATION: "Started"}}},
        ns,
    )
    for patch in (
        {"metadata": {"annotations": {WORKLOAD_ANNOTATION: "someone-else"}}},
        {"metadata": {"annotations": {"example.com/note": "x"}}},
    ):
        await refusal(lambda p=patch: account.merge_patch(PROVISIONING_REQUEST, "ours", p, ns))
    await refusal(
        lambda: account.merge_patch(
            PROVISIONING_REQUEST, "ours", PROVISIONED, ns, subresource="status"
        )
    )
    request = await cluster.kube.get(PROVISIONING_REQUEST, "ours", ns)
    assert request["metadata"]["annotations"] == {PHASE_ANNOTATION: "Started"}
    assert not (request.get("status") or {}).get("conditions")
    await account.delete(PROVISIONING_REQUEST, "ours", ns)


@pytest.mark.parametrize("what", ["a ProvisioningRequest", "a PodTemplate", "an Event"])
async def test_nothing_is_created_in_kube_system(account: Kube, kube: Kube, what: str) -> None:
    name = f"gangcheck-{uuid.uuid4().hex[:6]}"
    res, body = {
        "a ProvisioningRequest": (PROVISIONING_REQUEST, provisioning_request(name, ours=True)),
        "a PodTemplate": (POD_TEMPLATE, pod_template(name, ours=True)),
        "an Event": (EVENT, event(name, "kube-system", "Pod", "kube-system")),
    }[what]
    error = await refusal(lambda: account.create(res, body, "kube-system"))
    assert "kube-system" in str(error)
    with pytest.raises(NotFoundError):
        await kube.get(res, name, "kube-system")


def event(name: str, namespace: str, kind: str, about_namespace: str) -> Obj:
    """An Event as reconcile/events.py writes it."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": kind,
            "name": "x",
            "namespace": about_namespace,
        },
        "reason": "Test",
        "message": "m",
        "type": "Normal",
        "source": {"component": "gangcheck"},
        "reportingComponent": "gangcheck",
        "reportingInstance": "gangcheck",
        "firstTimestamp": LONG_AGO,
        "lastTimestamp": LONG_AGO,
        "count": 1,
    }


async def test_events_only_as_gangcheck(account: Kube, cluster: Cluster) -> None:
    """An Event reported as another component (the kubelet) is refused; gangcheck's own, on
    a Workload of the namespace or a Node (in default), are made."""
    ns = cluster.ns
    kubelet = {**event("kubelet", ns, "Pod", ns), "reportingComponent": "kubelet"}
    error = await refusal(lambda: account.create(EVENT, kubelet, ns))
    assert "reportingComponent" in str(error)
    await account.create(EVENT, event("here", ns, "Workload", ns), ns)
    name = f"n-{uuid.uuid4().hex[:6]}"
    await account.create(EVENT, event(name, "default", "Node", ""), "default")
    await cluster.kube.delete(EVENT, name, "default")


# ---- Workloads: only its own admission-check entries --------------------------------------


@pytest.fixture
async def gang_with_two_checks(cluster: Cluster) -> AsyncIterator[tuple[str, str]]:
    """A Workload whose status lists gangcheck's check and a check of another controller
    (Kueue's own ProvisioningRequest check), both Pending; (workload, other check)."""
    await cluster.install_check({})
    other = f"kueue-provisioning-{cluster.ns}"
    await cluster.kube.create(
        ADMISSION_CHECK,
        {"metadata": {"name": other}, "spec": {"controllerName": KUEUE_PROVISIONING}},
    )
    builder = WorkloadBuilder("gang").pod_set("main", 1).reserve_quota().check("atomic")
    name = await cluster.submit(builder)

    def add_other(wl: Obj) -> None:
        entries = wl["status"]["admissionChecks"]
        entries.append({**entries[0], "name": other})

    await cluster.update_status(name, add_other)
    try:
        yield name, other
    finally:
        await cluster.kube.delete(ADMISSION_CHECK, other)
        await cluster.kube.delete(ADMISSION_CHECK, cluster.check)


def entry_index(wl: Obj, check: str) -> int:
    return next(i for i, e in enumerate(wl["status"]["admissionChecks"]) if e["name"] == check)


async def test_a_workload_status_write_touches_only_its_own_check_entry(
    account: Kube, cluster: Cluster, gang_with_two_checks: tuple[str, str]
) -> None:
    """Its own entry may go Ready (as reconcile/workload.py writes it: a JSON patch of the
    entry); another controller's entry, a condition (Finished=True, Admitted) or a new entry
    may not."""
    name, other = gang_with_two_checks
    ns, check = cluster.ns, cluster.check

    async def write(ops: Callable[[Obj], list[Obj]]) -> Obj:
        wl = await cluster.workload(name)
        return await account.json_patch(WORKLOAD, name, ops(wl), ns, subresource="status")

    def ready(check: str) -> Callable[[Obj], list[Obj]]:
        def ops(wl: Obj) -> list[Obj]:
            i = entry_index(wl, check)
            entry = {**wl["status"]["admissionChecks"][i], "state": "Ready", "message": "fits"}
            return [{"op": "replace", "path": f"/status/admissionChecks/{i}", "value": entry}]

        return ops

    # The API server loads a policy's params (here the AdmissionChecks) from an informer of
    # their own: until it has the fixture's new check, that check's entry has no param to
    # guard it. Wait until a dry run of the write is refused, then make it for real.
    async def dry_run() -> object:
        path = f"{WORKLOAD.object_path(name, ns)}/status"
        body, dry = ready(other)(await cluster.workload(name)), {"dryRun": "All"}
        return await account.request("PATCH", path, query=dry, body=body, content_type=JSON_PATCH)

    await until_refused(dry_run, CHECKS, f"the policy guarding {other}'s entry")
    error = await refusal(lambda: write(ready(other)), CHECKS)
    assert other in str(error)
    finished = {
        "type": "Finished",
        "status": "True",
        "reason": "Succeeded",
        "message": "",
        "lastTransitionTime": LONG_AGO,
    }
    added = {**finished, "type": "Admitted"}
    for ops in (
        lambda wl: [{"op": "add", "path": "/status/conditions/-", "value": finished}],
        lambda wl: [{"op": "add", "path": "/status/conditions/-", "value": added}],
        lambda wl: [
            {
                "op": "add",
                "path": "/status/admissionChecks/-",
                "value": {**wl["status"]["admissionChecks"][0], "name": "invented"},
            }
        ],
        lambda wl: [{"op": "remove", "path": f"/status/admissionChecks/{entry_index(wl, check)}"}],
    ):
        await refusal(lambda o=ops: write(o))
    await write(ready(check))
    wl = await cluster.workload(name)
    states = {e["name"]: e["state"] for e in wl["status"]["admissionChecks"]}
    assert states == {check: "Ready", other: "Pending"}
    assert [c["type"] for c in wl["status"]["conditions"]] == ["QuotaReserved"]


async def test_only_its_own_admission_checks_status_is_written(
    account: Kube, cluster: Cluster, gang_with_two_checks: tuple[str, str]
) -> None:
    _, other = gang_with_two_checks
    inactive = {
        "status": {
            "conditions": [
                {
                    "type": "Active",
                    "status": "False",
                    "reason": "Broken",
                    "message": "",
                    "lastTransitionTime": LONG_AGO,
                }
            ]
        }
    }
    error = await refusal(
        lambda: account.merge_patch(ADMISSION_CHECK, other, inactive, subresource="status")
    )
    assert "controllerName" in str(error)
    await account.merge_patch(ADMISSION_CHECK, cluster.check, inactive, subresource="status")


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
    await claim(account, cluster.kube, name, request)
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
    await claim(account, cluster.kube, name, request)
    target = Target(name, request, LONG_AGO, "CordonAndTaint")
    result = await reclaim_safely(account, target, datetime.now(UTC))
    assert result.verdict == "reclaimed", result
    node = await cluster.kube.get(NODE, name)
    assert node["spec"]["unschedulable"] is True
    assert CA_TAINT in node["spec"]["taints"]
    # the write completing it (fence label and mark off, reclaimed-at on) passes the policy
    assert FENCE_LABEL not in (node["metadata"].get("labels") or {})
    assert RECLAIMED_AT in node["metadata"]["annotations"]


async def test_the_account_writes_reclaimed_at_only_on_a_node_recorded_as_arrived(
    account: Kube, cluster: Cluster
) -> None:
    """gangcheck.io/reclaimed-at is gangcheck's record of a node CordonAndTaint left: the
    account may add it, and take it off, on a node recorded as arrived; on any other node
    the policy refuses it, as it does the reclaim mark."""
    recorded, other = await cluster.add_nodes(2, taints=[CA_TAINT])
    await claim(account, cluster.kube, recorded, f"{cluster.ns}/gang-check-1")
    at = {"metadata": {"annotations": {RECLAIMED_AT: "2026-12-06T10:00:00Z"}}}
    await account.merge_patch(NODE, recorded, at)
    await account.merge_patch(NODE, recorded, {"metadata": {"annotations": {RECLAIMED_AT: None}}})
    refused = await refusal(lambda: account.merge_patch(NODE, other, at))
    assert "gangcheck.io/reclaimed-at" in refused.message


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


async def test_a_podgroups_spec_and_labels_are_not_gangchecks_to_change(
    account: Kube, groups: Groups
) -> None:
    """gangcheck writes only its state annotations on a PodGroup (reconcile/podgroup.py)."""
    await groups.coscheduling("ddp", 2)
    ns = groups.ns
    for patch in (
        {"spec": {"minMember": 1}},
        {"metadata": {"labels": {"team": "x"}}},
        {"metadata": {"annotations": {"example.com/note": "x"}}},
    ):
        error = await refusal(lambda p=patch: account.merge_patch(PLUGINS_POD_GROUP, "ddp", p, ns))
        assert "PodGroup" in str(error)
    state = {"metadata": {"annotations": {STATE_ANNOTATION: "Waiting"}}}
    group = await account.merge_patch(PLUGINS_POD_GROUP, "ddp", state, ns)
    assert group["spec"]["minMember"] == 2


# ---- the suites run gangcheck under all this ----------------------------------------------


async def who(kube: Kube) -> str:
    """The user the API server sees behind ``kube``."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    answer = await kube.request("POST", path, body=review)
    return str(answer["status"]["userInfo"]["username"])


async def test_the_harness_and_the_fault_proxy_run_gangcheck_as_its_service_account(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """RunningController (and so the integration tests' controller) and the fault proxy (the
    fault suite's replicas) call the API server as gangcheck's ServiceAccount, under the
    shipped RBAC and policies (testbed/identity.py), not as the admin."""
    running = RunningController(str(control_plane.kubeconfig))
    controller = await running.start()
    try:
        assert await who(controller.kube) == HARNESS.username
    finally:
        await running.stop()
    faults = Faults()
    proxy = await FaultProxy(control_plane.kubeconfig, faults, replica="r").start()
    try:
        kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig")
        async with await Kube.connect(str(kubeconfig)) as proxied:
            assert await who(proxied) == HARNESS.username
            assert faults.refused == []  # what the fault suite counts as refused writes
            config_map = {"metadata": {"name": f"x-{uuid.uuid4().hex[:6]}"}}
            with pytest.raises(ApiError):
                await proxied.create(CONFIG_MAP, config_map, "default")
            assert len(faults.refused) == 1, faults.refused
    finally:
        await proxy.stop()


async def test_a_call_refused_to_the_harness_controller_fails_the_test(
    control_plane: ControlPlane,
) -> None:
    """What makes every test running the controller a proof: a refused write fails it."""
    running = RunningController(str(control_plane.kubeconfig))
    controller = await running.start()
    config_map = {"metadata": {"name": f"x-{uuid.uuid4().hex[:6]}"}}
    with pytest.raises(ApiError):
        await controller.kube.create(CONFIG_MAP, config_map, "default")
    with pytest.raises(AssertionError, match="refused gangcheck's own calls"):
        await running.stop()


# ---- gangcheck's records: nobody else writes them ---------------------------------------

EDITOR = "editor"


@pytest.fixture
async def editor(
    control_plane: ControlPlane, cluster: Cluster, tmp_path: Path
) -> AsyncIterator[Kube]:
    """A user with edit rights in the test's namespace (a ServiceAccount there, bound by a
    Role): every verb on ProvisioningRequests, their status and PodTemplates, as Kueue users
    are often given."""
    ns, admin = cluster.ns, cluster.kube
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    rules = [
        {
            "apiGroups": ["autoscaling.x-k8s.io"],
            "resources": ["provisioningrequests", "provisioningrequests/status"],
            "verbs": verbs,
        },
        {"apiGroups": [""], "resources": ["podtemplates"], "verbs": verbs},
    ]
    kubeconfig = tmp_path / "editor.kubeconfig"
    probe = PROVISIONING_REQUEST
    async with namespace_user(
        control_plane, admin, ns, EDITOR, rules=rules, probe=probe, kubeconfig=kubeconfig
    ) as user:
        yield user


def annotated(name: str, annotations: dict[str, str | None]) -> Obj:
    """A merge patch of the object's annotations (None removes one)."""
    return {"metadata": {"name": name, "annotations": annotations}}


async def test_a_namespace_editor_cannot_forge_gangchecks_records(
    account: Kube, editor: Kube, cluster: Cluster
) -> None:
    """On the request and PodTemplate gangcheck made, a user who may edit requests in the
    namespace cannot add, change or remove a gangcheck.io/* annotation nor the managed-by
    label, nor create an object carrying that label; gangcheck's ServiceAccount writes its
    records, and the cluster's admin (system:masters) may repair them."""
    ns, admin = cluster.ns, cluster.kube
    request = provisioning_request("ours", ours=True)
    request["metadata"]["annotations"] = {WORKLOAD_ANNOTATION: "gang"}
    await account.create(PROVISIONING_REQUEST, request, ns)
    template = pod_template("ours-main", ours=True)
    template["metadata"]["annotations"] = {WORKLOAD_ANNOTATION: "gang"}
    await account.create(POD_TEMPLATE, template, ns)
    await account.merge_patch(
        PROVISIONING_REQUEST, "ours", annotated("ours", {PHASE_ANNOTATION: "RollingBack"}), ns
    )

    def forge(patch: Obj, res: Resource = PROVISIONING_REQUEST, name: str = "ours") -> Any:
        return lambda: editor.merge_patch(res, name, patch, ns)

    def dry_run() -> Awaitable[object]:
        path = PROVISIONING_REQUEST.object_path("ours", ns)
        patch = annotated("ours", {PHASE_ANNOTATION: "Started"})
        return editor.request(
            "PATCH", path, query={"dryRun": "All"}, body=patch, content_type=MERGE_PATCH
        )

    await until_refused(dry_run, GUARD, "the records guard enforced")
    started = await refusal(forge(annotated("ours", {PHASE_ANNOTATION: "Started"})), GUARD)
    assert PHASE_ANNOTATION in str(started)
    for patch in (
        annotated("ours", {PHASE_ANNOTATION: None}),
        annotated("ours", {"gangcheck.io/outcome": '{"reclaimed": []}'}),
        annotated("ours", {"gangcheck.io/outcome": ""}),  # read by its presence alone
        annotated("ours", {"gangcheck.io/attempt-config": '{"fulfillment": {}}'}),
        {"metadata": {"labels": {MANAGED_BY_LABEL: None}}},
        {"metadata": {"labels": {MANAGED_BY_LABEL: "someone"}}},
    ):
        await refusal(forge(patch), GUARD)
    for patch in (
        annotated("ours-main", {WORKLOAD_ANNOTATION: "another-gang"}),
        {"metadata": {"labels": {MANAGED_BY_LABEL: None}}},
    ):
        await refusal(forge(patch, POD_TEMPLATE, "ours-main"), GUARD)
    # Nothing labelled as gangcheck's is created by anyone else (gangcheck takes it as its own).
    for res, body in (
        (PROVISIONING_REQUEST, provisioning_request("forged", ours=True)),
        (POD_TEMPLATE, pod_template("forged-main", ours=True)),
    ):
        error = await refusal(lambda r=res, b=body: editor.create(r, b, ns), GUARD)
        assert "only gangcheck creates" in str(error)
    # What is not a record goes through: another annotation, a finalizer (as the garbage
    # collector writes them), and the status (as cluster-autoscaler writes it, below).
    await editor.merge_patch(
        PROVISIONING_REQUEST, "ours", annotated("ours", {"example.com/note": "x"}), ns
    )
    finalizer = {"metadata": {"finalizers": ["example.com/keep"]}}
    await editor.merge_patch(PROVISIONING_REQUEST, "ours", finalizer, ns)
    await editor.merge_patch(PROVISIONING_REQUEST, "ours", {"metadata": {"finalizers": None}}, ns)
    # gangcheck writes its records; the admin repairs one by hand.
    await account.merge_patch(
        PROVISIONING_REQUEST, "ours", annotated("ours", {PHASE_ANNOTATION: "Fulfilled"}), ns
    )
    repaired = {"gangcheck.io/rollback-reason": "Deadline: repaired by hand"}
    await admin.merge_patch(PROVISIONING_REQUEST, "ours", annotated("ours", repaired), ns)
    # The status subresource is not matched, and changes no record: the API server keeps all
    # of a custom resource but its status on that path.
    status_too = annotated("ours", {PHASE_ANNOTATION: "Started"}) | PROVISIONED
    await editor.merge_patch(PROVISIONING_REQUEST, "ours", status_too, ns, subresource="status")
    kept = await admin.get(PROVISIONING_REQUEST, "ours", ns)
    assert kept["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    assert kept["metadata"]["annotations"] == {
        WORKLOAD_ANNOTATION: "gang",
        PHASE_ANNOTATION: "Fulfilled",
        "example.com/note": "x",
        **repaired,
    }
    assert [c["type"] for c in kept["status"]["conditions"]] == ["Provisioned"]
    assert "finalizers" not in kept["metadata"]
    made = await admin.get(POD_TEMPLATE, "ours-main", ns)
    assert made["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    assert made["metadata"]["annotations"] == {WORKLOAD_ANNOTATION: "gang"}
    for res, name in ((PROVISIONING_REQUEST, "forged"), (POD_TEMPLATE, "forged-main")):
        with pytest.raises(NotFoundError):
            await admin.get(res, name, ns)
    # Deleting stays allowed.
    await editor.delete(PROVISIONING_REQUEST, "ours", ns)
    await editor.delete(POD_TEMPLATE, "ours-main", ns)


async def test_no_other_form_of_write_forges_a_record_either(
    account: Kube, editor: Kube, cluster: Cluster
) -> None:
    """The guard reads the object before and after, whatever the write: a JSON patch of the
    whole annotations map (emptied, removed, one key added through its escaped path), a merge
    patch removing every annotation at once, a server-side apply by another field manager
    forcing a record, a PUT of the whole object (its status too, or without annotations):
    each refused to the namespace's editor, the request and its PodTemplate unchanged."""
    ns, admin = cluster.ns, cluster.kube
    request = provisioning_request("ours", ours=True)
    request["metadata"]["annotations"] = {WORKLOAD_ANNOTATION: "gang", PHASE_ANNOTATION: "Created"}
    await account.create(PROVISIONING_REQUEST, request, ns)
    template = pod_template("ours-main", ours=True)
    template["metadata"]["annotations"] = {WORKLOAD_ANNOTATION: "gang"}
    await account.create(POD_TEMPLATE, template, ns)
    path = PROVISIONING_REQUEST.object_path("ours", ns)

    def dry_run() -> Awaitable[object]:
        return editor.request(
            "PATCH",
            path,
            query={"dryRun": "All"},
            body=annotated("ours", {PHASE_ANNOTATION: "Started"}),
            content_type=MERGE_PATCH,
        )

    await until_refused(dry_run, GUARD, "the records guard enforced")

    def json_patch(ops: list[Obj], res: Resource = PROVISIONING_REQUEST, name: str = "ours") -> Any:
        return lambda: editor.json_patch(res, name, ops, ns)

    def applied(annotations: dict[str, str]) -> Any:
        body = {
            "apiVersion": PROVISIONING_REQUEST.api_version,
            "kind": PROVISIONING_REQUEST.kind,
            "metadata": {"name": "ours", "namespace": ns, "annotations": annotations},
        }
        return lambda: editor.request(
            "PATCH",
            path,
            query={"fieldManager": "someone-else", "force": "true"},
            body=body,
            content_type=APPLY_PATCH,
        )

    def put(res: Resource, name: str, change: Callable[[Obj], None]) -> Any:
        async def write() -> object:
            current = await editor.get(res, name, ns)
            change(current)
            return await editor.replace(res, current)

        return write

    def started_and_provisioned(obj: Obj) -> None:
        obj["metadata"]["annotations"][PHASE_ANNOTATION] = "Started"
        obj["status"] = PROVISIONED["status"]

    def stripped(obj: Obj) -> None:
        obj["metadata"].pop("annotations", None)

    for write in (
        json_patch([{"op": "replace", "path": "/metadata/annotations", "value": {}}]),
        json_patch([{"op": "remove", "path": "/metadata/annotations"}]),
        json_patch(
            [{"op": "add", "path": "/metadata/annotations/gangcheck.io~1outcome", "value": ""}]
        ),
        json_patch(
            [{"op": "replace", "path": "/metadata/annotations/gangcheck.io~1phase", "value": "x"}]
        ),
        json_patch([{"op": "remove", "path": "/metadata/labels"}]),
        lambda: editor.merge_patch(
            PROVISIONING_REQUEST, "ours", {"metadata": {"annotations": None}}, ns
        ),
        applied({PHASE_ANNOTATION: "Started"}),
        put(PROVISIONING_REQUEST, "ours", started_and_provisioned),
        put(PROVISIONING_REQUEST, "ours", stripped),
    ):
        await refusal(write, GUARD)
    for write in (
        json_patch(
            [{"op": "replace", "path": "/metadata/annotations", "value": {}}],
            POD_TEMPLATE,
            "ours-main",
        ),
        put(POD_TEMPLATE, "ours-main", stripped),
    ):
        await refusal(write, GUARD)
    kept = await admin.get(PROVISIONING_REQUEST, "ours", ns)
    assert kept["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    assert kept["metadata"]["annotations"] == {
        WORKLOAD_ANNOTATION: "gang",
        PHASE_ANNOTATION: "Created",
    }
    assert "conditions" not in (kept.get("status") or {})
    made = await admin.get(POD_TEMPLATE, "ours-main", ns)
    assert made["metadata"]["annotations"] == {WORKLOAD_ANNOTATION: "gang"}
    # the same forms pass when they leave the records as they were
    await editor.json_patch(
        PROVISIONING_REQUEST,
        "ours",
        [{"op": "add", "path": "/metadata/annotations/example.com~1note", "value": "x"}],
        ns,
    )
    await applied({"example.com/other": "y"})()
    await account.delete(PROVISIONING_REQUEST, "ours", ns)
    await account.delete(POD_TEMPLATE, "ours-main", ns)


async def test_a_namespace_editor_still_writes_their_own_requests(
    account: Kube, editor: Kube, cluster: Cluster
) -> None:
    """Requests and PodTemplates without gangcheck's label are not guarded: their user
    creates, annotates (gangcheck.io/* keys too: gangcheck reads no record there), writes the
    status of and deletes them; only adding gangcheck's label to one is refused."""
    ns, admin = cluster.ns, cluster.kube
    await until_refused(
        lambda: editor.request(
            "POST",
            PROVISIONING_REQUEST.collection_path(ns),
            query={"dryRun": "All"},
            body={
                "apiVersion": PROVISIONING_REQUEST.api_version,
                "kind": PROVISIONING_REQUEST.kind,
                **provisioning_request("probe", ours=True),
            },
        ),
        GUARD,
        "the records guard enforced",
    )
    await editor.create(PROVISIONING_REQUEST, provisioning_request("mine", ours=False), ns)
    await editor.create(POD_TEMPLATE, pod_template("mine-main", ours=False), ns)
    notes = {"example.com/note": "x", PHASE_ANNOTATION: "Started"}
    await editor.merge_patch(PROVISIONING_REQUEST, "mine", annotated("mine", notes), ns)
    await editor.merge_patch(POD_TEMPLATE, "mine-main", annotated("mine-main", notes), ns)
    await editor.merge_patch(PROVISIONING_REQUEST, "mine", PROVISIONED, ns, subresource="status")
    mark = {"metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY}}}
    await refusal(lambda: editor.merge_patch(PROVISIONING_REQUEST, "mine", mark, ns), GUARD)
    await refusal(lambda: editor.merge_patch(POD_TEMPLATE, "mine-main", mark, ns), GUARD)
    mine = await admin.get(PROVISIONING_REQUEST, "mine", ns)
    assert mine["metadata"]["annotations"] == notes
    assert MANAGED_BY_LABEL not in (mine["metadata"].get("labels") or {})
    await editor.delete(PROVISIONING_REQUEST, "mine", ns)
    await editor.delete(POD_TEMPLATE, "mine-main", ns)
    for res, name in ((PROVISIONING_REQUEST, "mine"), (POD_TEMPLATE, "mine-main")):
        with pytest.raises(NotFoundError):
            await admin.get(res, name, ns)


async def test_who_may_patch_every_namespaces_requests_may_write_the_records(
    account: Kube, editor: Kube, cluster: Cluster
) -> None:
    """The guard exempts no account by name but whoever may patch ProvisioningRequests in
    every namespace (a ClusterRoleBinding) and patch Nodes: gangcheck's ServiceAccount of any
    installation (another Helm release's, the harness's), cluster-admin. The editor's Role
    grants the same verb in one namespace only, and is refused; bound cluster-wide to patch
    requests alone (as Kueue's manager is), still refused; to patch nodes too, it passes."""
    ns, admin = cluster.ns, cluster.kube
    await account.create(PROVISIONING_REQUEST, provisioning_request("ours", ours=True), ns)
    forged = annotated("ours", {PHASE_ANNOTATION: "Started"})
    await refusal(lambda: editor.merge_patch(PROVISIONING_REQUEST, "ours", forged, ns), GUARD)
    name = f"requests-everywhere-{uuid.uuid4().hex[:6]}"
    rule = {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"]}
    role: Obj = {"metadata": {"name": name}, "rules": [rule | {"verbs": ["patch"]}]}
    await admin.create(CLUSTER_ROLE, role)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    subject = {"kind": "ServiceAccount", "name": EDITOR, "namespace": ns}
    body = {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
    await admin.create(CLUSTER_ROLE_BINDING, body)
    try:

        async def may(group: str, resource: str) -> bool:  # as the API server's RBAC says now
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {"group": group, "resource": resource, "verb": "patch"}
                },
            }
            path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
            answer = await editor.request("POST", path, body=review)
            return bool(answer["status"].get("allowed"))

        await eventually(
            lambda: may("autoscaling.x-k8s.io", "provisioningrequests"),
            what="the editor may patch every namespace's requests",
        )
        await refusal(lambda: editor.merge_patch(PROVISIONING_REQUEST, "ours", forged, ns), GUARD)
        role["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]})
        await admin.merge_patch(CLUSTER_ROLE, name, {"rules": role["rules"]})

        async def written() -> bool:  # once the API server's RBAC cache has the rule
            try:
                await editor.merge_patch(PROVISIONING_REQUEST, "ours", forged, ns)
            except ApiError as e:
                if refused_by_policy(e, GUARD):
                    return False
                raise
            return True

        await eventually(written, what="the editor bound cluster-wide writes the record")
    finally:
        await admin.delete(CLUSTER_ROLE_BINDING, name)
        await admin.delete(CLUSTER_ROLE, name)
    request = await admin.get(PROVISIONING_REQUEST, "ours", ns)
    assert request["metadata"]["annotations"] == {PHASE_ANNOTATION: "Started"}
    await account.delete(PROVISIONING_REQUEST, "ours", ns)
