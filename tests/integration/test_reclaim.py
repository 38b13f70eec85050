"""Each reclaimer, and the safety rules, against a real kube-apiserver.

NodeClaim and Cluster API CRDs are test CRDs of ours (tests/crds/), shaped like the fields
the reclaimers touch; no pinned module provides them.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    NAMESPACE,
    NODE,
    NODE_CLAIM,
    POD,
    SERVICE_ACCOUNT,
)
from gangcheck.logic.timefmt import format_time
from gangcheck.reclaim.safely import Target, reclaim_safely
from gangcheck.testbed import crds
from tests.builders import container

pytestmark = pytest.mark.integration
TEST_CRDS = sorted((Path(__file__).parent.parent / "crds").glob("*.yaml"))
_ids = itertools.count(1)
ARRIVED = "gangcheck.io/arrived-for"


@pytest.fixture(scope="module")
def reclaim_crds(control_plane: Any) -> None:
    crds.install_crds(control_plane.client(), crds.load_crds(TEST_CRDS))


@pytest.fixture
async def kube(control_plane: Any, reclaim_crds: None) -> AsyncIterator[Kube]:
    async with await Kube.connect(str(control_plane.kubeconfig)) as k:
        yield k


class Bed:
    """A namespace, a request time, and nodes recorded as arrived for that request."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.request = f"{ns}/gang-atomic-1"
        self.request_created = format_time(datetime.now(UTC) - timedelta(seconds=30))
        self.nodes: list[str] = []

    async def node(
        self,
        *,
        claim: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        **meta: Any,
    ) -> str:
        name = f"{self.ns}-n{next(_ids)}"
        body = {"metadata": {
            "name": name,
            "labels": labels or {},
            "annotations": {ARRIVED: claim or self.request, **(annotations or {})},
            **meta,
        }}  # fmt: skip
        await self.kube.create(NODE, body)
        self.nodes.append(name)
        return name

    async def pod(self, name: str, node: str, **meta: Any) -> None:
        body = {"metadata": {"name": name, "namespace": self.ns, **meta},
                "spec": {"nodeName": node, "containers": [container()]}}  # fmt: skip
        await self.kube.create(POD, body)

    def target(self, node: str, reclaimer: str = "DeleteNode") -> Target:
        return Target(node, self.request, self.request_created, reclaimer)

    async def exists(self, node: str) -> bool:
        try:
            await self.kube.get(NODE, node)
        except NotFoundError:
            return False
        return True


@pytest.fixture
async def bed(kube: Kube) -> AsyncIterator[Bed]:
    ns = f"rc{next(_ids)}-{datetime.now(UTC).strftime('%H%M%S%f')}"
    await kube.create(NAMESPACE, {"metadata": {"name": ns}})
    await kube.create(SERVICE_ACCOUNT, {"metadata": {"name": "default", "namespace": ns}})
    b = Bed(kube, ns)
    yield b
    for node in b.nodes:
        with contextlib.suppress(NotFoundError):
            await kube.delete(NODE, node)


NOW = datetime.now


async def test_delete_node_reclaims_an_idle_arrival(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert result.verdict == "reclaimed"
    assert not await bed.exists(node)


async def test_daemonset_pods_do_not_keep_a_node(bed: Bed) -> None:
    node = await bed.node()
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u1",
             "controller": True}  # fmt: skip
    await bed.pod("agent-x", node, ownerReferences=[owner])
    assert (await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))).verdict == "reclaimed"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("opt-out", "opt-out label"),
        ("other-request", "recorded for"),
        ("foreign-pod", "runs pod"),
    ],
    ids=[
        "the opt-out label keeps a node",
        "a node recorded for another request is kept",
        "a node running another pod is kept",
    ],
)
async def test_safety_keeps_the_node(bed: Bed, setup: str, reason: str) -> None:
    if setup == "opt-out":
        node = await bed.node(labels={"gangcheck.io/do-not-reclaim": "true"})
    elif setup == "other-request":
        node = await bed.node(claim=f"{bed.ns}/other-atomic-1")
    else:
        node = await bed.node()
        await bed.pod("someone-else", node)
    result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert result.verdict == "keep"
    assert reason in result.reason
    fresh = await bed.kube.get(NODE, node)
    assert not fresh["spec"].get("unschedulable")
    assert not [
        t for t in fresh["spec"].get("taints") or [] if t["key"] == "gangcheck.io/reclaiming"
    ]


async def test_a_node_older_than_the_request_is_kept(bed: Bed) -> None:
    node = await bed.node()
    target = Target(node, bed.request, format_time(NOW(UTC) + timedelta(hours=1)), "DeleteNode")
    result = await reclaim_safely(bed.kube, target, NOW(UTC))
    assert result.verdict == "keep"
    assert "not proven younger than the request" in result.reason
    assert await bed.exists(node)


async def test_gang_pods_make_the_node_wait_and_it_is_marked(bed: Bed) -> None:
    node = await bed.node()
    consume = {"autoscaling.x-k8s.io/consume-provisioning-request": "gang-atomic-1"}
    await bed.pod("member-0", node, annotations=consume)
    result = await reclaim_safely(bed.kube, bed.target(node), NOW(UTC))
    assert result.verdict == "drain"
    mark = (await bed.kube.get(NODE, node))["metadata"]["annotations"]
    assert "gangcheck.io/reclaim-when-idle" in mark


async def test_a_pod_bound_after_fencing_wins(bed: Bed) -> None:
    """The race: a pod lands between the first look and the act. The node is kept, unfenced."""
    node = await bed.node()
    kube = bed.kube
    original = kube.merge_patch

    async def fence_then_bind(res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        result = await original(res, name, patch, *a, **kw)
        if res is NODE and (patch.get("spec") or {}).get("unschedulable") is True:
            await bed.pod("late-arrival", node)  # bound by someone just as we fenced
        return result

    kube.merge_patch = fence_then_bind  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node), NOW(UTC))
    finally:
        kube.merge_patch = original  # type: ignore[method-assign]
    assert result.verdict == "keep"
    assert "late-arrival" in result.reason
    fresh = await kube.get(NODE, node)
    assert not fresh["spec"].get("unschedulable")
    assert not [
        t for t in fresh["spec"].get("taints") or [] if t["key"] == "gangcheck.io/reclaiming"
    ]


async def test_cordon_and_taint_leaves_the_node_to_the_autoscaler(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "CordonAndTaint"), NOW(UTC))
    assert result.verdict == "reclaimed"
    fresh = await bed.kube.get(NODE, node)
    assert fresh["spec"]["unschedulable"] is True
    assert {"key": "gangcheck.io/reclaiming", "value": "true", "effect": "NoSchedule"} in fresh[
        "spec"
    ]["taints"]
    annotations = fresh["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/scale-down-disabled"] == "false"


async def test_delete_node_claim_removes_the_claim_that_owns_the_node(bed: Bed) -> None:
    body = {"metadata": {"name": f"{bed.ns}-claim"}, "spec": {}}
    claim = await bed.kube.create(NODE_CLAIM, body)
    meta = claim["metadata"]
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": meta["name"],
             "uid": meta["uid"]}  # fmt: skip
    node = await bed.node(ownerReferences=[owner])
    result = await reclaim_safely(bed.kube, bed.target(node, "DeleteNodeClaim"), NOW(UTC))
    assert result.verdict == "reclaimed"
    with pytest.raises(NotFoundError):
        await bed.kube.get(NODE_CLAIM, claim["metadata"]["name"])


async def test_delete_node_claim_without_a_claim_keeps_and_unfences(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "DeleteNodeClaim"), NOW(UTC))
    assert (result.verdict, result.reason) == ("keep", "no NodeClaim owns it")
    assert not (await bed.kube.get(NODE, node))["spec"].get("unschedulable")


async def test_delete_machine_marks_it_and_scales_the_deployment_down(bed: Bed) -> None:
    ns, kube = bed.ns, bed.kube
    deployment = await kube.create(
        MACHINE_DEPLOYMENT, {"metadata": {"name": "md", "namespace": ns}, "spec": {"replicas": 3}}
    )
    md_ref = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment", "name": "md",
              "uid": deployment["metadata"]["uid"], "controller": True}  # fmt: skip
    machine_set = await kube.create(
        MACHINE_SET,
        {"metadata": {"name": "ms", "namespace": ns, "ownerReferences": [md_ref]},
         "spec": {"replicas": 3}},
    )  # fmt: skip
    ms_ref = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "ms",
              "uid": machine_set["metadata"]["uid"], "controller": True}  # fmt: skip
    await kube.create(
        MACHINE,
        {"metadata": {"name": "m1", "namespace": ns, "ownerReferences": [ms_ref]}, "spec": {}},
    )
    node = await bed.node(
        annotations={"cluster.x-k8s.io/machine": "m1", "cluster.x-k8s.io/cluster-namespace": ns}
    )
    result = await reclaim_safely(kube, bed.target(node, "DeleteMachine"), NOW(UTC))
    assert result.verdict == "reclaimed"
    machine = await kube.get(MACHINE, "m1", ns)
    assert machine["metadata"]["annotations"]["cluster.x-k8s.io/delete-machine"] == "true"
    assert (await kube.get(MACHINE_DEPLOYMENT, "md", ns))["spec"]["replicas"] == 2


async def test_reclaimer_none_leaves_the_node_alone(bed: Bed) -> None:
    node = await bed.node()
    result = await reclaim_safely(bed.kube, bed.target(node, "None"), NOW(UTC))
    assert (result.verdict, result.reason) == ("keep", "reclaimer None: nodes are left alone")
    fresh = await bed.kube.get(NODE, node)
    assert not fresh["spec"].get("unschedulable")


async def test_a_reclaimer_the_server_refuses_unfences_and_keeps_the_node(bed: Bed) -> None:
    node = await bed.node()
    kube = bed.kube
    original = kube.delete

    async def forbidden(res: Any, *a: Any, **kw: Any) -> Any:
        if res is NODE:
            raise ForbiddenError(403, "Forbidden", "nodes is forbidden", target="nodes")
        return await original(res, *a, **kw)

    kube.delete = forbidden  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node), NOW(UTC))
    finally:
        kube.delete = original  # type: ignore[method-assign]
    assert (result.verdict, result.reason) == ("keep", "DeleteNode refused: 403 Forbidden")
    assert not (await kube.get(NODE, node))["spec"].get("unschedulable")


async def test_a_node_that_changes_meanwhile_is_judged_again_and_reclaimed(bed: Bed) -> None:
    """A status heartbeat moves the node's resourceVersion between fencing and deleting."""
    node = await bed.node()
    kube = bed.kube
    original = kube.merge_patch
    beats = 0

    async def fence_then_heartbeat(res: Any, name: str, patch: Any, *a: Any, **kw: Any) -> Any:
        nonlocal beats
        result = await original(res, name, patch, *a, **kw)
        if res is NODE and (patch.get("spec") or {}).get("unschedulable") is True and beats < 2:
            beats += 1
            await original(NODE, node, {"metadata": {"annotations": {"heartbeat": str(beats)}}})
        return result

    kube.merge_patch = fence_then_heartbeat  # type: ignore[method-assign]
    try:
        result = await reclaim_safely(kube, bed.target(node), NOW(UTC))
    finally:
        kube.merge_patch = original  # type: ignore[method-assign]
    assert result.verdict == "reclaimed"
    assert beats == 1
    assert not await bed.exists(node)
