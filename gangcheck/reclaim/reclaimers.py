"""The ways to give a node back, chosen per AtomicProvisioningConfig (`fulfillment.reclaimer`).

Each acts on a node that safety (``reclaim.safely``) has already fenced (cordoned and tainted)
and judged idle. Each either finishes (returning what it did), raises ReclaimRefused when a
safety rule of its own keeps the node (final), or lets an ApiError through (a failure,
retried). Each is idempotent under a lost answer: it checks the object's own state before
acting again, acts with preconditions (uid, resourceVersion, JSON patch ``test`` ops), and
treats "already gone" as done. Each trusts a node-to-object link only when the object's own
back-reference names the node. Each delete of its own that succeeds (or finds the object gone:
404) is told at once to the caches (`Told`, the informer stores' `Store.deleted`), so what is
decided before the watch brings its DELETED does not count the node as still there.
"""

from __future__ import annotations

import logging
from typing import Protocol

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, ConflictError, NotFoundError
from gangcheck.kube.resources import (
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    NODE,
    NODE_CLAIM,
    Resource,
)
from gangcheck.model.names import OWNER_SCALED_DOWN, SCALED_DOWN_FOR
from gangcheck.model.objects import Obj, json_pointer, tested_removal

DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
MACHINE_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
SCALE_ATTEMPTS = 5
log = logging.getLogger(__name__)


class ReclaimRefused(Exception):
    """A safety rule of the reclaimer keeps this node; the reason is kept in the outcome."""


class Told(Protocol):
    """Where a delete of gangcheck's own that succeeded is told as it is answered: the
    controller's caches (`reconcile.caches.Caches.deleted`)."""

    def deleted(
        self, res: Resource, name: str, namespace: str | None, answer: Obj | None, *, uid: str
    ) -> None:
        """`name` (at `uid`) was deleted: `answer` is the API server's (None: gone already)."""
        ...


class _NotCached:
    """No caches to tell (a reclaim run on its own, as the integration tests do)."""

    def deleted(
        self, res: Resource, name: str, namespace: str | None, answer: Obj | None, *, uid: str
    ) -> None:
        return None


NOT_CACHED: Told = _NotCached()


async def delete_told(
    kube: Kube,
    told: Told,
    res: Resource,
    obj: Obj,
    *,
    resource_version: str | None = None,
    uid: str | None = None,
) -> Obj | None:
    """Delete `obj` (cluster-scoped) with the preconditions given, and tell `told` at once:
    the API server's answer (a Status for one gone, the object for one its finalizers keep),
    or None for a 404 (gone already, returned as None too). Any other error is raised, nothing
    told."""
    meta = obj["metadata"]
    try:
        answer: Obj | None = await kube.delete(
            res, meta["name"], resource_version=resource_version, uid=uid
        )
    except NotFoundError:
        answer = None
    told.deleted(res, meta["name"], None, answer, uid=str(meta.get("uid") or ""))
    return answer


async def still_as_judged(kube: Kube, node: Obj) -> None:
    """Raise ConflictError unless the node is still at the resourceVersion it was judged at
    (NotFoundError: gone). A reclaimer that acts on another object (a NodeClaim, a Machine)
    asks it right before its first write, as DeleteNode's delete carries it as a
    precondition: a node changed since the last look (opted out, unfenced by a person) is
    read and judged again (`safely._act`), never acted on as it was. The lookups in between
    (the claim, the Machine) no longer widen that window; a bind does not change the Node,
    so it is still the fence policy's to refuse."""
    name = node["metadata"]["name"]
    now = await kube.get(NODE, name)
    if now["metadata"].get("resourceVersion") != node["metadata"].get("resourceVersion"):
        raise ConflictError(
            409, "Conflict", f"node {name} changed since it was judged", target=f"nodes/{name}"
        )


class Reclaimer(Protocol):
    name: str
    leaves_node: bool
    """The node stays once it has acted, for another to remove in time (cluster-autoscaler's
    scale-down): `safely` then completes the reclaim on the node as judged (its fence label
    and mark off, RECLAIMED_AT on: logic/attempt/reclaim.left_ops), where for the others it
    only forgets the mark."""

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        """Give the fenced node back; return what was done, in a few words. A delete that
        succeeds is told to `told` at once."""
        ...


def _annotations(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


class DeleteNode:
    """Delete the Node object (kwok and simulated nodes; Karpenter also drains on Node delete)."""

    name = "DeleteNode"
    leaves_node = False

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        rv = node["metadata"]["resourceVersion"]
        if await delete_told(kube, told, NODE, node, resource_version=rv) is None:
            return "node already gone"
        return "node deleted"


class CordonAndTaint:
    """Leave the node cordoned and tainted and let cluster-autoscaler's scale-down remove it
    (its fence label taken off once it has acted: `leaves_node`); an administrator's
    `scale-down-disabled: "true"` keeps it (and is never overwritten)."""

    name = "CordonAndTaint"
    leaves_node = True

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        if _annotations(node).get(SCALE_DOWN_DISABLED) == "true":
            raise ReclaimRefused(f"{SCALE_DOWN_DISABLED}=true: its administrator keeps it")
        return "cordoned and tainted for scale-down"


class DeleteNodeClaim:
    """Delete the Karpenter NodeClaim (karpenter.sh/v1) whose status.nodeName is the node."""

    name = "DeleteNodeClaim"
    leaves_node = False

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        claim = await self._claim_of(kube, node)
        if claim is None:
            raise ReclaimRefused("no NodeClaim owns it")
        meta, name = claim["metadata"], node["metadata"]["name"]
        named = (claim.get("status") or {}).get("nodeName")
        if named != name:
            raise ReclaimRefused(
                f"NodeClaim {meta['name']} names node {named or 'none'} in status.nodeName"
            )
        if meta.get("deletionTimestamp"):
            return f"NodeClaim {meta['name']} already being deleted"
        await still_as_judged(kube, node)
        if await delete_told(kube, told, NODE_CLAIM, claim, uid=meta["uid"]) is None:
            return f"NodeClaim {meta['name']} already gone"
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
        return next((c for c in claims if (c.get("status") or {}).get("nodeName") == name), None)


class DeleteMachine:
    """Cluster API: mark the Machine for deletion and scale its owner down by one, once."""

    name = "DeleteMachine"
    leaves_node = False

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        machine = await _machine_of(kube, node)
        name = machine["metadata"]["name"]
        if machine["metadata"].get("deletionTimestamp"):
            return f"Machine {name} already being deleted"
        if _annotations(machine).get(OWNER_SCALED_DOWN):
            return f"Machine {name} already marked for deletion and its owner scaled down"
        await still_as_judged(kube, node)
        mark = {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "true"}}}
        namespace = machine["metadata"]["namespace"]
        await kube.merge_patch(MACHINE, name, mark, namespace)
        owner = await _scaling_owner(kube, machine)
        if owner is None:
            return f"Machine {name} marked for deletion (no MachineSet owns it)"
        res, obj = owner
        replicas = await _scale_down_once(kube, res, obj, machine)
        done = {
            "metadata": {
                "annotations": {OWNER_SCALED_DOWN: f"{res.kind}/{obj['metadata']['name']}"}
            }
        }
        await kube.merge_patch(MACHINE, name, done, namespace)
        await _forget_scaled_down(kube, res, obj, machine)
        return f"Machine {name} marked for deletion, {res.kind} scaled to {replicas}"


async def _machine_of(kube: Kube, node: Obj) -> Obj:
    """The Machine the node's annotations name, if its status.nodeRef names the node."""
    annotations = _annotations(node)
    name = annotations.get(MACHINE_ANNOTATION)
    namespace = annotations.get(MACHINE_NAMESPACE_ANNOTATION)
    if not name or not namespace:
        raise ReclaimRefused(f"no {MACHINE_ANNOTATION} annotation")
    try:
        machine = await kube.get(MACHINE, name, namespace)
    except NotFoundError as e:
        raise ReclaimRefused(f"Machine {namespace}/{name} not found") from e
    node_ref = (machine.get("status") or {}).get("nodeRef") or {}
    if node_ref.get("name") != node["metadata"]["name"]:
        named = node_ref.get("name") or "no node"
        raise ReclaimRefused(f"Machine {namespace}/{name} names {named} in status.nodeRef")
    return machine


def scaled_down_key(machine_uid: str) -> str:
    """The owner's record of a decrement made for the Machine of this uid: one key per
    Machine (``gangcheck.io/scaled-down-for-machine-<uid>``), so that decrements made for
    other Machines of the same owner meanwhile never overwrite it."""
    return f"{SCALED_DOWN_FOR}-{machine_uid}"


def _scaled_down_for(obj: Obj, uid: str) -> bool:
    """Whether the owner records a decrement for the Machine of `uid` (its own key, or the
    single-valued annotation versions before this one wrote)."""
    annotations = _annotations(obj)
    return scaled_down_key(uid) in annotations or annotations.get(SCALED_DOWN_FOR) == uid


async def _scale_down_once(kube: Kube, res: Resource, obj: Obj, machine: Obj) -> int:
    """Decrement replicas by one with a `test` of the value read, recording on the owner, in
    the same patch, that it was done for this Machine (`scaled_down_key`); a failed test (a
    lost answer, another writer) is read again: the record says whether the decrement was
    ours. The record stays until the Machine says its owner was scaled down (a reclaim that
    failed in between, its lease lost, is retried later: after others of the owner's
    Machines were scaled down for, too)."""
    uid, namespace = machine["metadata"]["uid"], machine["metadata"]["namespace"]
    for _ in range(SCALE_ATTEMPTS):
        if _scaled_down_for(obj, uid):
            return int((obj.get("spec") or {}).get("replicas") or 0)
        replicas = int((obj.get("spec") or {}).get("replicas") or 0)
        if replicas <= 0:
            return 0
        try:
            await kube.json_patch(
                res, obj["metadata"]["name"], _decrement(obj, replicas, machine), namespace
            )
            return replicas - 1
        except ConflictError:
            obj = await kube.get(res, obj["metadata"]["name"], namespace)
    raise ApiError(409, "Conflict", f"{res.kind} kept changing while being scaled down")


def _decrement(obj: Obj, replicas: int, machine: Obj) -> list[Obj]:
    key, value = scaled_down_key(machine["metadata"]["uid"]), machine["metadata"]["name"]
    ops: list[Obj] = [
        {"op": "test", "path": "/spec/replicas", "value": replicas},
        {"op": "replace", "path": "/spec/replicas", "value": replicas - 1},
    ]
    if "annotations" in (obj.get("metadata") or {}):
        path = json_pointer("metadata", "annotations", key)
        return [*ops, {"op": "add", "path": path, "value": value}]
    return [*ops, {"op": "add", "path": "/metadata/annotations", "value": {key: value}}]


async def _forget_scaled_down(kube: Kube, res: Resource, obj: Obj, machine: Obj) -> None:
    """Take the owner's record of this Machine's decrement off, once the Machine itself says
    its owner was scaled down (so one record per Machine does not pile up on the owner). A
    record already gone, or an owner gone, is done; any other failure leaves the record (a
    short annotation naming a Machine) and is logged: the decrement is done either way."""
    key = scaled_down_key(machine["metadata"]["uid"])
    ops = tested_removal("annotations", key, machine["metadata"]["name"])
    try:
        await kube.json_patch(res, obj["metadata"]["name"], ops, machine["metadata"]["namespace"])
    except (ConflictError, NotFoundError):
        return
    except ApiError as e:
        log.warning(
            "%s %s keeps its record %s: %s", res.kind, obj["metadata"]["name"], key, e.message
        )


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
