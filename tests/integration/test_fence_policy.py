"""The fence policy (manifests/base/fence-policy.yaml) on a real kube-apiserver: while a node
carries gangcheck's fence label, the API server refuses every bind to it, so a pod bound in
the last round trip of a reclaim (between gangcheck's last look at the node's pods and the
delete: issue 11, defect 3) cannot land on a node about to go. Without the policy that pod
is only reported (tests/integration/test_reclaim.py).

The policy is applied as a person would (kubectl, server-side) for this module and removed
after it. Where a bind must happen at an exact moment of the reclaim, the test wraps the
client's pod list around the real server (as test_reclaim.py does); everything else, the
refusal above all, is the server's own behaviour.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, ForbiddenError, NotFoundError
from gangcheck.kube.resources import NODE, POD
from gangcheck.model.names import FENCE_LABEL
from tests.builders import container
from tests.integration.harness import (
    FENCE_REFUSAL,
    eventually,
    fence_policy_installed,
    pod_on,
    until_fence_enforced,
)
from tests.integration.test_reclaim import (
    OUR_TAINT,
    Bed,
    after_first_recheck,
    fence_of,
    new_bed,
    reclaim_safely,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fence_policy(control_plane: ControlPlane) -> Iterator[None]:
    with fence_policy_installed(control_plane):
        yield


@pytest.fixture
async def fenced(fence_policy: None, control_plane: ControlPlane) -> AsyncIterator[Bed]:
    """A bed (test_reclaim.py's), once the API server enforces the policy."""
    async with await Kube.connect(str(control_plane.kubeconfig)) as kube, new_bed(kube) as bed:
        await until_fence_enforced(kube, bed.ns)
        yield bed


class Binder:
    """Binds a pod tolerating every taint at the moment the wrapper calls it (the reclaim
    waits meanwhile), and keeps the API server's answer. It binds once kube-apiserver's
    informer has the node's fence label (a dry-run pod onto it is refused): that lag is what
    gangcheck's settle after the fence covers, not what this test is about."""

    def __init__(self, bed: Bed, name: str, node: str) -> None:
        self.bed, self.name, self.node = bed, name, node
        self.refused: ApiError | None = None
        self.called = False

    async def __call__(self) -> None:
        self.called = True
        await until_fence_enforced(self.bed.kube, self.bed.ns, self.node)
        try:
            await self.bed.bind(self.name, self.node)
        except ForbiddenError as e:
            self.refused = e

    async def pod_node(self) -> str | None:
        pod = await self.bed.kube.get(POD, self.name, self.bed.ns)
        node: str | None = pod["spec"].get("nodeName")
        return node


async def test_a_bind_in_the_last_round_trip_of_a_reclaim_is_refused(fenced: Bed) -> None:
    """Defect 3, closed: a pod tolerating every taint, bound as kube-scheduler binds, between
    gangcheck's last look at the node's pods (after the settle that follows the fence) and
    the delete. The API server refuses the bind; the node is reclaimed with no pod on it, and
    the pod is not lost: it exists, unbound, for the scheduler to place elsewhere. (A bind
    in the moment right after the fence may still pass, before kube-apiserver's informer has
    the label: the settle and the re-check that follow it keep the node then, as
    test_reclaim.py shows.)"""
    node = await fenced.node()
    binder = Binder(fenced, "tolerates-all", node)
    restore = after_first_recheck(fenced.kube, node, binder, lists=4)
    try:
        result = await reclaim_safely(fenced.kube, fenced.target(node), datetime.now(UTC))
    finally:
        restore()
    assert binder.called
    assert binder.refused is not None, "the bind to a fenced node went through"
    assert f"node {node} is being reclaimed by gangcheck" in str(binder.refused)
    assert result.verdict == "reclaimed"
    assert result.bound_too_late == ()
    assert not await fenced.exists(node)
    assert await binder.pod_node() is None


async def test_a_pod_created_onto_a_fenced_node_is_refused_but_a_mirror_pod_is_not(
    fenced: Bed,
) -> None:
    """spec.nodeName set at creation bypasses the scheduler: refused on a fenced node. A
    mirror pod (a static pod its kubelet reports) is let through; a node without the label
    takes any pod."""
    node = await fenced.node(labels={FENCE_LABEL: "true"})
    await until_fence_enforced(fenced.kube, fenced.ns, node)
    with pytest.raises(ForbiddenError, match=FENCE_REFUSAL):
        await fenced.kube.create(POD, pod_on(fenced.ns, "direct", node))
    with pytest.raises(NotFoundError):
        await fenced.kube.get(POD, "direct", fenced.ns)
    mirror = {"kubernetes.io/config.mirror": "abc"}
    await fenced.kube.create(POD, pod_on(fenced.ns, "static", node, **mirror))
    other = await fenced.node()
    await fenced.kube.create(POD, pod_on(fenced.ns, "elsewhere", other))
    assert (await fenced.kube.get(POD, "elsewhere", fenced.ns))["spec"]["nodeName"] == other


async def test_a_node_kept_after_the_fence_takes_binds_again(fenced: Bed) -> None:
    """A pod nominated to the node right after the fence keeps it (the re-check sees it):
    gangcheck undoes the fence, its label included, and the API server lets binds through
    again; the node is exactly as before."""
    node = await fenced.node(labels={"example.com/pool": "gpu"})
    before = await fenced.kube.get(NODE, node)

    async def nominate() -> None:
        await fenced.kube.create(POD, {"metadata": {"name": "nominated", "namespace": fenced.ns},
                                       "spec": {"containers": [container()]}})  # fmt: skip
        await fenced.kube.merge_patch(
            POD, "nominated", {"status": {"nominatedNodeName": node}}, fenced.ns,
            subresource="status",
        )  # fmt: skip

    restore = after_first_recheck(fenced.kube, node, nominate)
    try:
        result = await reclaim_safely(fenced.kube, fenced.target(node), datetime.now(UTC))
    finally:
        restore()
    assert result.verdict == "keep"
    assert "nominated" in result.reason
    after = await fenced.kube.get(NODE, node)
    assert fence_of(after) == (False, [], None)
    assert after["metadata"]["labels"] == before["metadata"]["labels"]

    async def bound() -> bool:
        try:
            await fenced.bind(f"after-{uuid.uuid4().hex[:6]}", node)
        except ForbiddenError:
            return False  # the API server's informer has not seen the label go yet
        return True

    await eventually(bound, timeout=30, what="binds to the unfenced node to be let through")


class DaemonSetBinder(Binder):
    """A Binder whose pod is a DaemonSet's (controlled by one, tolerating every taint), as a
    CNI's or a GPU driver's rolling update makes on every node."""

    async def __call__(self) -> None:
        self.called = True
        await until_fence_enforced(self.bed.kube, self.bed.ns, self.node)
        try:
            await bind_daemonset_pod(self.bed, self.name, self.node)
        except ForbiddenError as e:
            self.refused = e


async def bind_daemonset_pod(bed: Bed, name: str, node: str) -> None:
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cni", "controller": True,
             "uid": str(uuid.uuid4())}  # fmt: skip
    spec = {"tolerations": [{"operator": "Exists"}], "containers": [container()]}
    meta = {"name": name, "namespace": bed.ns, "ownerReferences": [owner]}
    await bed.kube.create(POD, {"metadata": meta, "spec": spec})
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    await bed.kube.request("POST", POD.object_path(name, bed.ns) + "/binding", body=binding)


async def test_a_node_cordon_and_taint_reclaimed_takes_daemonset_pods_again(fenced: Bed) -> None:
    """While gangcheck is about to act the fence refuses every bind, a DaemonSet pod's too.
    Once CordonAndTaint has acted (the last look passed, the node left cordoned and tainted
    for cluster-autoscaler) the label is no longer needed (gangcheck deletes nothing; the
    autoscaler drains by its own rules) and comes off: a DaemonSet's rolling update (a CNI,
    a GPU driver) binds its pod there again, where before it stalled for as long as the node
    stayed (for good with its node group at min size). The node stays cordoned and tainted."""
    node = await fenced.node()
    binder = DaemonSetBinder(fenced, "cni-during", node)
    restore = after_first_recheck(fenced.kube, node, binder, lists=4)
    try:
        target = fenced.target(node, "CordonAndTaint")
        result = await reclaim_safely(fenced.kube, target, datetime.now(UTC))
    finally:
        restore()
    assert binder.called
    assert binder.refused is not None, "a bind went through while the node was fenced"
    assert result.verdict == "reclaimed"
    after = await fenced.kube.get(NODE, node)
    assert fence_of(after) == (True, [OUR_TAINT], None)
    assert FENCE_LABEL not in (after["metadata"].get("labels") or {})

    async def bound() -> bool:
        try:
            await bind_daemonset_pod(fenced, f"cni-{uuid.uuid4().hex[:6]}", node)
        except ForbiddenError:
            return False  # the API server's informer has not seen the label go yet
        return True

    await eventually(bound, timeout=30, what="a DaemonSet pod's bind to the reclaimed node")
