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

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, ConflictError, FencedError, NotFoundError
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
from gangcheck.reclaim.turns import Turns

DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
MARKED_HERE = "gangcheck.io/marked-delete-machine"
"""On a Machine, written with its `delete-machine` mark when gangcheck wrote that mark (its
value the node's name): the mark is gangcheck's to take off when the decrement is refused,
by this try or by any retry after a restart, never a mark a person or cluster-autoscaler
wrote."""
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
MACHINE_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
SCALE_ATTEMPTS = 5
REVISION_ANNOTATION = "machinedeployment.clusters.x-k8s.io/revision"
"""Cluster API's revision of a MachineSet, and of its MachineDeployment (its newest's)."""
ROLLING_OUT = "MachineDeploymentRollingOut"
UNSETTLED = "MachineDeploymentUnsettled"
SETTLE_SECONDS = 10.0
"""How long a MachineDeployment that has not settled (`Rollout.settling`) is read again before
the reclaim fails for now: its controller applies a decrement within a second or so."""
SETTLE_POLL_SECONDS = 0.5
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

    async def kept(self, kube: Kube, node: Obj) -> None:
        """The node is kept (a safety rule, a pod there): take off what an earlier try of
        this reclaimer, cut short, left that would still remove the node later."""
        ...


class _LeavesNothing:
    """A reclaimer whose tries leave nothing behind that removes a node kept."""

    async def kept(self, kube: Kube, node: Obj) -> None:
        return None


def _annotations(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


class DeleteNode(_LeavesNothing):
    """Delete the Node object (kwok and simulated nodes; Karpenter also drains on Node delete)."""

    name = "DeleteNode"
    leaves_node = False

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        rv = node["metadata"]["resourceVersion"]
        if await delete_told(kube, told, NODE, node, resource_version=rv) is None:
            return "node already gone"
        return "node deleted"


class CordonAndTaint(_LeavesNothing):
    """Leave the node cordoned and tainted and let cluster-autoscaler's scale-down remove it
    (its fence label taken off once it has acted: `leaves_node`); an administrator's
    `scale-down-disabled: "true"` keeps it (and is never overwritten)."""

    name = "CordonAndTaint"
    leaves_node = True

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        if _annotations(node).get(SCALE_DOWN_DISABLED) == "true":
            raise ReclaimRefused(f"{SCALE_DOWN_DISABLED}=true: its administrator keeps it")
        return "cordoned and tainted for scale-down"


class DeleteNodeClaim(_LeavesNothing):
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


_turns: Turns[tuple[str, str]] = Turns()
"""Per owner of Machines (namespace, its MachineSet; the Machine itself when none owns it):
their marks and decrements one at a time; others' go on."""


def _owner_key(machine: Obj) -> tuple[str, str]:
    meta = machine["metadata"]
    return meta["namespace"], _controller_of(machine, "MachineSet") or f"Machine/{meta['name']}"


class DeleteMachine:
    """Cluster API: mark the Machine for deletion and scale its owner down by one, once; not
    while its MachineDeployment rolls out (`rolling_out`: Cluster API would then apply the
    decrement to whichever of its MachineSets it chooses). The Machines of one owner one at a
    time in this process (`_turns`): they share the replica count they decrement, and the next
    waits for the owner to settle after the last decrement. The safe path's fence and settle
    around it (reclaim.safely) overlap for any number of nodes."""

    name = "DeleteMachine"
    leaves_node = False

    async def reclaim(self, kube: Kube, node: Obj, told: Told) -> str:
        async with _turns.of(_owner_key(await _machine_of(kube, node))):
            return await self._reclaim(kube, node)  # the Machine read again, in its turn

    async def _reclaim(self, kube: Kube, node: Obj) -> str:
        machine = await _machine_of(kube, node)
        name = machine["metadata"]["name"]
        if machine["metadata"].get("deletionTimestamp"):
            return f"Machine {name} already being deleted"
        if _annotations(machine).get(OWNER_SCALED_DOWN):
            return f"Machine {name} already marked for deletion and its owner scaled down"
        owner = await _scaling_owner(kube, machine)
        try:
            if owner is not None:  # before any write: a rollout leaves the Machine unmarked
                owner = await _not_rolling_out(kube, owner, machine)
        except MachineDeploymentRollingOut:
            await _unmark(kube, machine)  # an earlier try's mark (its decrement not made)
            raise
        await still_as_judged(kube, node)
        namespace = machine["metadata"]["namespace"]
        notes = {DELETE_MACHINE_ANNOTATION: "true"}
        if DELETE_MACHINE_ANNOTATION not in _annotations(machine):  # gangcheck's own mark
            notes[MARKED_HERE] = node["metadata"]["name"]
        mark = {"metadata": {"annotations": notes}}
        machine = await kube.merge_patch(MACHINE, name, mark, namespace)
        if owner is None:
            return f"Machine {name} marked for deletion (no MachineSet owns it)"
        try:
            replicas = await _scale_down_once(kube, owner, machine)
        except MachineDeploymentRollingOut:  # a rollout begun since the look above
            await _unmark(kube, machine)
            raise
        res, obj = owner.res, owner.obj
        done = {
            "metadata": {
                "annotations": {OWNER_SCALED_DOWN: f"{res.kind}/{obj['metadata']['name']}"}
            }
        }
        said = f"Machine {name} marked for deletion, {res.kind} scaled to {replicas}"
        try:
            await kube.merge_patch(MACHINE, name, done, namespace)
        except FencedError:
            raise
        except ApiError as e:
            # The decrement is made: Cluster API removes the marked Machine, so the reclaim is
            # done (failed, the node would be unfenced as it goes). The owner's record stays,
            # and says so to any retry.
            log.warning("Machine %s: %s not recorded on it: %s", name, OWNER_SCALED_DOWN, e)
            return said
        await _forget_scaled_down(kube, res, obj, machine)
        return said

    async def kept(self, kube: Kube, node: Obj) -> None:
        """The mark an earlier try wrote (`MARKED_HERE`) and whose decrement was not made (a
        failure, a lease lost, in between: the node unfenced and in use since) comes off: a
        marked Machine is the first its MachineSet removes in any scale-down, whoever makes
        it. One whose decrement was made (recorded on the owner, or on the Machine) stays:
        Cluster API removes one Machine for it, and unmarked, it would be another."""
        try:
            machine = await _machine_of(kube, node)
        except ReclaimRefused:
            return
        notes = _annotations(machine)
        if MARKED_HERE not in notes or OWNER_SCALED_DOWN in notes:
            return
        owner = await _scaling_owner(kube, machine)
        if owner is None or _scaled_down_for(owner.obj, machine["metadata"]["uid"]):
            return
        await _unmark(kube, machine)


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


async def _scale_down_once(kube: Kube, owner: Owner, machine: Obj) -> int:
    """Decrement replicas by one with a `test` of the value read, recording on the owner, in
    the same patch, that it was done for this Machine (`scaled_down_key`); a failed test (a
    lost answer, another writer) is read again: the record says whether the decrement was
    ours. The record stays until the Machine says its owner was scaled down (a reclaim that
    failed in between, its lease lost, is retried later: after others of the owner's
    Machines were scaled down for, too). A MachineDeployment is judged (`rolling_out`) as
    read before each try, and decremented only as judged (its resourceVersion tested)."""
    uid, namespace = machine["metadata"]["uid"], machine["metadata"]["namespace"]
    for _ in range(SCALE_ATTEMPTS):
        owner = await _not_rolling_out(kube, owner, machine)
        obj = owner.obj
        replicas = int((obj.get("spec") or {}).get("replicas") or 0)
        if _scaled_down_for(obj, uid):
            return replicas
        if replicas <= 0:
            return 0
        try:
            await kube.json_patch(
                owner.res, obj["metadata"]["name"], _decrement(owner, replicas, machine), namespace
            )
            return replicas - 1
        except ConflictError:
            owner = await _read_again(kube, owner, namespace)
    raise ApiError(409, "Conflict", f"{owner.res.kind} kept changing while being scaled down")


def _decrement(owner: Owner, replicas: int, machine: Obj) -> list[Obj]:
    obj = owner.obj
    key, value = scaled_down_key(machine["metadata"]["uid"]), machine["metadata"]["name"]
    ops: list[Obj] = [
        {"op": "test", "path": "/spec/replicas", "value": replicas},
        {"op": "replace", "path": "/spec/replicas", "value": replicas - 1},
    ]
    if owner.res is MACHINE_DEPLOYMENT:  # the MachineDeployment judged not rolling out
        rv = obj["metadata"].get("resourceVersion")
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *ops]
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


@dataclass(frozen=True)
class Owner:
    """What a Machine's decrement is made on (`res`, `obj`: its MachineDeployment, or its
    MachineSet when no MachineDeployment owns it) and the Machine's MachineSet, as read."""

    res: Resource
    obj: Obj
    machine_set: Obj


async def _scaling_owner(kube: Kube, machine: Obj) -> Owner | None:
    """The MachineDeployment above the Machine's MachineSet, or the MachineSet itself."""
    namespace = machine["metadata"]["namespace"]
    machine_set_name = _controller_of(machine, "MachineSet")
    if machine_set_name is None:
        return None
    machine_set = await kube.get(MACHINE_SET, machine_set_name, namespace)
    deployment = _controller_of(machine_set, "MachineDeployment")
    if deployment is None:
        return Owner(MACHINE_SET, machine_set, machine_set)
    obj = await kube.get(MACHINE_DEPLOYMENT, deployment, namespace)
    return Owner(MACHINE_DEPLOYMENT, obj, machine_set)


async def _read_again(kube: Kube, owner: Owner, namespace: str) -> Owner:
    """The owner and the Machine's MachineSet read again (a decrement's test failed)."""
    machine_set = await kube.get(MACHINE_SET, owner.machine_set["metadata"]["name"], namespace)
    if owner.res is MACHINE_SET:
        return Owner(MACHINE_SET, machine_set, machine_set)
    obj = await kube.get(MACHINE_DEPLOYMENT, owner.obj["metadata"]["name"], namespace)
    return Owner(MACHINE_DEPLOYMENT, obj, machine_set)


class MachineDeploymentRollingOut(ApiError):
    """The Machine's MachineDeployment rolls out, or has not settled (`rolling_out`): not
    scaled down now. A failure, not a refusal: the reclaim is retried with backoff (the
    draining-node reconciler) and acts once it is over. Its reason (`ROLLING_OUT` or
    `UNSETTLED`) is the cause counted; its message names the MachineDeployment and why."""

    def __init__(self, deployment: Obj, found: Rollout) -> None:
        meta = deployment["metadata"]
        named = f"MachineDeployment {meta.get('namespace')}/{meta['name']}"
        said = "has not settled" if found.settling else "is rolling out"
        super().__init__(
            409,
            UNSETTLED if found.settling else ROLLING_OUT,
            f"{named} {said} ({found.why}): a decrement now could remove a Machine of"
            " another of its MachineSets",
            target=f"machinedeployments/{meta['name']}",
        )


async def _not_rolling_out(kube: Kube, owner: Owner, machine: Obj) -> Owner:
    """The owner, once judged not `rolling_out` (read again while it settles, for up to
    SETTLE_SECONDS: Cluster API's controller applying a decrement made just before, ours for
    another Machine of it); MachineDeploymentRollingOut if it is. A MachineSet with no
    MachineDeployment, or a decrement for this Machine done already (a retry after a lost
    answer or lease), is not judged."""
    namespace, uid = machine["metadata"]["namespace"], machine["metadata"]["uid"]
    deadline = asyncio.get_running_loop().time() + SETTLE_SECONDS
    while owner.res is MACHINE_DEPLOYMENT and not _scaled_down_for(owner.obj, uid):
        found = rolling_out(owner.obj, owner.machine_set)
        if found is None:
            break
        if not found.settling or asyncio.get_running_loop().time() >= deadline:
            error = MachineDeploymentRollingOut(owner.obj, found)
            log.warning(
                "Machine %s not scaled down for: %s", machine["metadata"]["name"], error.message
            )
            raise error
        await asyncio.sleep(SETTLE_POLL_SECONDS)
        owner = await _read_again(kube, owner, namespace)
    return owner


@dataclass(frozen=True)
class Rollout:
    """Why a MachineDeployment is not to be scaled down now (`rolling_out`)."""

    why: str
    settling: bool = False
    """Only its controller's last act not seen yet (it has not observed its spec, or has not
    yet given the MachineSet its replicas): judged again a little later before it counts."""


def rolling_out(deployment: Obj, machine_set: Obj) -> Rollout | None:
    """Why a decrement of `deployment` may not take its Machine of `machine_set` now, or None.

    Cluster API's MachineDeployment controller applies a decrement to the MachineSet it
    chooses: with one MachineSet holding all the replicas, to that one, whose controller then
    deletes the Machine marked `cluster.x-k8s.io/delete-machine` first; during a rollout
    (RollingUpdate or OnDelete) to the new MachineSet only while that holds more than the
    MachineDeployment's replicas, else to the old ones, oldest first (paused, to those with
    replicas in proportion): another Machine, perhaps running someone's pods, is removed, the
    marked one kept. Read from the MachineDeployment's own
    status and the Machine's MachineSet (a get each: no list), it rolls out when
    - its RollingOut condition is True (Cluster API v1.9 on: status.v1beta2.conditions);
    - not all its Machines are of its newest MachineSet (status.updatedReplicas, the newest
      MachineSet's, below status.replicas, all its MachineSets');
    - the Machine's MachineSet is not its newest (the revision annotations differ);
    and it has not settled when
    - its controller has not acted on its spec yet (status.observedGeneration behind
      metadata.generation): a decrement just made, or a template changed (a rollout about to
      start: judged again once seen);
    - the Machine's MachineSet does not hold its replicas (a scaling not yet applied, or
      another MachineSet holding some)."""
    meta, status = deployment["metadata"], deployment.get("status") or {}
    v1beta2 = status.get("v1beta2") or {}
    for condition in [*(status.get("conditions") or []), *(v1beta2.get("conditions") or [])]:
        if condition.get("type") == "RollingOut" and condition.get("status") == "True":
            return Rollout("its RollingOut condition is True")
    replicas = int(status.get("replicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    if updated < replicas:
        return Rollout(
            f"{replicas - updated} of its {replicas} Machines are of an older MachineSet"
        )
    ms_meta = machine_set["metadata"]
    revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    ms_revision = (ms_meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    if revision is not None and ms_revision != revision:
        return Rollout(
            f"the Machine's MachineSet {ms_meta['name']} is at revision {ms_revision or 'none'},"
            f" the MachineDeployment at {revision}"
        )
    generation = int(meta.get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    if observed < generation:
        return Rollout(f"its controller has observed generation {observed} of {generation}", True)
    desired = int((deployment.get("spec") or {}).get("replicas") or 0)
    held = int((machine_set.get("spec") or {}).get("replicas") or 0)
    if held != desired:
        return Rollout(
            f"the Machine's MachineSet {ms_meta['name']} has {held} of its {desired} replicas",
            True,
        )
    return None


async def _unmark(kube: Kube, machine: Obj) -> None:
    """Take off the `delete-machine` mark gangcheck wrote (`MARKED_HERE`, by this try or an
    earlier one cut short; while it is still "true"), its decrement refused: a marked Machine
    would be the first its MachineSet removes in any scale-down, the node meanwhile back in
    use. A mark gangcheck did not write stays. Failing, it stays, logged."""
    meta = machine["metadata"]
    marked_by = _annotations(machine).get(MARKED_HERE)
    if marked_by is None:
        return
    ops = [
        *tested_removal("annotations", DELETE_MACHINE_ANNOTATION, "true"),
        *tested_removal("annotations", MARKED_HERE, marked_by),
    ]
    try:
        await kube.json_patch(MACHINE, meta["name"], ops, meta["namespace"])
    except (ConflictError, NotFoundError):
        return
    except FencedError:
        raise  # no longer the leader: the next one's retry takes it off
    except ApiError as e:
        log.warning(
            "Machine %s keeps its %s: %s", meta["name"], DELETE_MACHINE_ANNOTATION, e.message
        )


def _controller_of(obj: Obj, kind: str) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref["name"])
    return None


RECLAIMERS: dict[str, Reclaimer] = {
    r.name: r for r in (DeleteNode(), CordonAndTaint(), DeleteNodeClaim(), DeleteMachine())
}
