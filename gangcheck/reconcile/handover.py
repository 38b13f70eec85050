"""A node owing a reclaim, found running the pods of a gang that started, is that gang's.

A reclaim finds the pods of the mark's gang on the node (``reclaim_safely``'s ``drain``) in
two places: the Karpenter provisioner withdrawing a claim whose gang started meanwhile (a
claim of an earlier request of the gang's name, or one left over after the start), and the
draining-node reconciler, which owes the reclaim of every marked node. Before the gang
started, its pods there are on their way out and the node is reclaimed once they are gone.
Once it started, they run there for as long as the gang does: the node is one of the gang's,
as the nodes recorded for it at its start are. Its mark comes off (no reclaim is owed: left
on, the draining-node reconciler would read it every 2 s for as long as the gang runs, and
reclaim it between a member's exit and its replacement's bind, under a gang still running)
and its hold is lifted; its record (arrived for the request) stays. Should gangcheck stop
between the reclaim and the hand-over, the draining-node reconciler, reading the mark after
the restart, hands the node over in turn.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ConflictError, NotFoundError
from gangcheck.kube.resources import NODE
from gangcheck.logic.attempt.fulfillment import claim_of
from gangcheck.logic.attempt.hold import taints_released
from gangcheck.logic.attempt.reclaim import is_fenced
from gangcheck.logic.sources.karpenter.provisioner import held_for, marked
from gangcheck.model.names import RECLAIM_WHEN_IDLE
from gangcheck.model.objects import Obj
from gangcheck.reclaim.safely import Target
from gangcheck.reconcile.apply import write_taints
from gangcheck.reconcile.caches import Caches

log = logging.getLogger(__name__)

#: Reads and writes a hand-over of a node tries while the node keeps changing under it.
HAND_OVER_TRIES = 5

#: How a caller's writes are made: the Karpenter provisioner turns a 403 into its
#: ``NotPermittedError`` (said once, the pass backed off); by default a plain call.
Permitted = Callable[[str, Awaitable[Obj]], Awaitable[Obj]]


async def _plain(_: str, call: Awaitable[Obj]) -> Obj:
    return await call


async def hand_over(
    kube: Kube, caches: Caches, name: str, key: str, mark: str, *, permitted: Permitted = _plain
) -> bool:
    """Hand node ``name``, found running the started gang's pods, to the gang of request
    ``key``: its mark comes off and the hold is lifted; the record (arrived for ``key``)
    stays, so no later pass withdraws its claim again. Read live, and only a node still
    recorded for ``key``, carrying ``mark`` (the same reclaim, however written) and not
    fenced (a reclaim of it under way since), written at the resourceVersion read (a change
    since: read and judged again, a few times; then the mark stays, and the draining-node
    reconciler tries again). Whether the mark came off."""
    for _ in range(HAND_OVER_TRIES):
        node = await kube.get_if_exists(NODE, name)
        if node is None or claim_of(node) != key or is_fenced(node):
            return False
        meta = node["metadata"]
        current = (meta.get("annotations") or {}).get(RECLAIM_WHEN_IDLE)
        if current is None or Target.from_mark(name, current) != Target.from_mark(name, mark):
            return False  # another reclaim's since (or none): not the one judged
        patch = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {RECLAIM_WHEN_IDLE: None},
            }
        }
        try:
            unmarked = await permitted("patch nodes", kube.merge_patch(NODE, name, patch))
        except NotFoundError:
            return False
        except ConflictError:
            continue  # changed since read (a heartbeat): read and judged again
        caches.nodes.store.put_if_newer(unmarked)
        log.info(
            "node %s runs the started gang's pods: handed over to it, not drained",
            name,
            extra={"object": key},
        )
        break
    else:
        return False  # kept changing: its mark stays, the draining-node reconciler's
    await lift_hold(kube, caches, name, key, permitted=permitted)
    return True


async def lift_hold(
    kube: Kube, caches: Caches, name: str, key: str, *, permitted: Permitted = _plain
) -> None:
    """Lift ``key``'s hold from a node a reclaim kept or handed over: read live, still
    recorded for ``key``, held for it and owing no reclaim (a mark since: the reclaim's
    again), written at the resourceVersion read (a change since: the next pass judges
    again)."""
    node = await kube.get_if_exists(NODE, name)
    if node is None or claim_of(node) != key or not held_for(node, key) or marked(node):
        return
    with contextlib.suppress(ConflictError, NotFoundError):
        lifted = await permitted("patch nodes", write_taints(kube, node, taints_released(node)))
        caches.nodes.store.put_if_newer(lifted)
        log.info("hold lifted from node %s, kept", name, extra={"object": key})
