"""The ways to give a node back, chosen per AtomicProvisioningConfig (`fulfillment.reclaimer`).

Each acts on a node that safety (``reclaim.safely``) has already fenced (cordoned and tainted)
and judged idle; each either finishes or raises ReclaimRefused with a reason, and then the
node is unfenced and kept.
"""

from __future__ import annotations

from typing import Protocol

from gangcheck.kube.client import Kube, Obj
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    NODE,
    NODE_CLAIM,
    Resource,
)

DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
MACHINE_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"


class ReclaimRefused(Exception):
    """The reclaimer cannot act on this node; the reason is kept in the outcome."""


class Reclaimer(Protocol):
    name: str

    async def reclaim(self, kube: Kube, node: Obj) -> str:
        """Give the fenced node back; return what was done, in a few words."""
        ...


def _meta(obj: Obj) -> dict[str, object]:
    return dict(obj.get("metadata") or {})


class DeleteNode:
    """Delete the Node object (kwok and simulated nodes; Karpenter also drains on Node delete)."""

    name = "DeleteNode"

    async def reclaim(self, kube: Kube, node: Obj) -> str:
        meta = node["metadata"]
        await kube.delete(NODE, meta["name"], resource_version=meta["resourceVersion"])
        return "node deleted"


class CordonAndTaint:
    """Leave the node fenced and let cluster-autoscaler's scale-down remove it."""

    name = "CordonAndTaint"

    async def reclaim(self, kube: Kube, node: Obj) -> str:
        patch = {"metadata": {"annotations": {SCALE_DOWN_DISABLED: "false"}}}
        await kube.merge_patch(NODE, node["metadata"]["name"], patch)
        return "cordoned and tainted for scale-down"


class DeleteNodeClaim:
    """Delete the Karpenter NodeClaim (karpenter.sh/v1) behind the node."""

    name = "DeleteNodeClaim"

    async def reclaim(self, kube: Kube, node: Obj) -> str:
        claim = await self._claim_of(kube, node)
        if claim is None:
            raise ReclaimRefused("no NodeClaim owns it")
        meta = claim["metadata"]
        await kube.delete(NODE_CLAIM, meta["name"], uid=meta["uid"])
        return f"NodeClaim {meta['name']} deleted"

    async def _claim_of(self, kube: Kube, node: Obj) -> Obj | None:
        for ref in node["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "NodeClaim":
                try:
                    return await kube.get(NODE_CLAIM, ref["name"])
                except NotFoundError:
                    return None
        claims = (await kube.list_objects(NODE_CLAIM)).get("items") or []
        name = node["metadata"]["name"]
        provider = (node.get("spec") or {}).get("providerID")
        return next(
            (
                c
                for c in claims
                if (c.get("status") or {}).get("nodeName") == name
                or (provider and (c.get("status") or {}).get("providerID") == provider)
            ),
            None,
        )


class DeleteMachine:
    """Cluster API: mark the Machine for deletion and scale its owner down by one."""

    name = "DeleteMachine"

    async def reclaim(self, kube: Kube, node: Obj) -> str:
        annotations = node["metadata"].get("annotations") or {}
        name = annotations.get(MACHINE_ANNOTATION)
        namespace = annotations.get(MACHINE_NAMESPACE_ANNOTATION)
        if not name or not namespace:
            raise ReclaimRefused(f"no {MACHINE_ANNOTATION} annotation")
        try:
            machine = await kube.get(MACHINE, name, namespace)
        except NotFoundError as e:
            raise ReclaimRefused(f"Machine {namespace}/{name} not found") from e
        mark = {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "true"}}}
        await kube.merge_patch(MACHINE, name, mark, namespace)
        owner = await _scaling_owner(kube, machine)
        if owner is None:
            return f"Machine {name} marked for deletion (no MachineSet owns it)"
        res, obj = owner
        replicas = int((obj.get("spec") or {}).get("replicas") or 0)
        patch = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"replicas": max(0, replicas - 1)},
        }
        await kube.merge_patch(res, obj["metadata"]["name"], patch, namespace)
        return f"Machine {name} marked for deletion, {res.kind} scaled to {max(0, replicas - 1)}"


async def _scaling_owner(kube: Kube, machine: Obj) -> tuple[Resource, Obj] | None:
    """The MachineDeployment above the Machine's MachineSet, or the MachineSet itself."""
    namespace = machine["metadata"]["namespace"]
    machine_set_name = _controller_of(machine, "MachineSet")
    if machine_set_name is None:
        return None
    machine_set = await kube.get(MACHINE_SET, machine_set_name, namespace)
    deployment = _controller_of(machine_set, "MachineDeployment")
    if deployment is None:
        return MACHINE_SET, machine_set
    return MACHINE_DEPLOYMENT, await kube.get(MACHINE_DEPLOYMENT, deployment, namespace)


def _controller_of(obj: Obj, kind: str) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref["name"])
    return None


RECLAIMERS: dict[str, Reclaimer] = {
    r.name: r for r in (DeleteNode(), CordonAndTaint(), DeleteNodeClaim(), DeleteMachine())
}
