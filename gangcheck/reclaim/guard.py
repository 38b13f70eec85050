"""Set and take off cluster-autoscaler's ``scale-down-disabled`` on a kept node, as
logic/attempt/scaledown.py decides, with preconditions: the guard is written at the
resourceVersion it was decided on (a conflict: read again, decide again), and taken off with
JSON patch ``test`` ops (a test that fails: read again, decide again). A node gone is done.
"""

from __future__ import annotations

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ConflictError, NotFoundError
from gangcheck.kube.resources import NODE
from gangcheck.logic.attempt.scaledown import guard_patch, unguard_ops
from gangcheck.model.objects import Obj

ATTEMPTS = 5


async def _get(kube: Kube, name: str) -> Obj | None:
    try:
        return await kube.get(NODE, name)
    except NotFoundError:
        return None


async def guard(kube: Kube, node: Obj, request: str) -> Obj | None:
    """Disable the node's scale-down for `request` where scaledown.guard_patch says so; the
    node after (as it is when there is nothing to do), None when it is gone. Raises
    ConflictError when it kept changing."""
    name = node["metadata"]["name"]
    for _ in range(ATTEMPTS):
        patch = guard_patch(node, request)
        if patch is None:
            return node
        try:
            return await kube.merge_patch(NODE, name, patch)
        except NotFoundError:
            return None
        except ConflictError:
            fresh = await _get(kube, name)
            if fresh is None:
                return None
            node = fresh
    raise ConflictError(409, "Conflict", f"node {name} kept changing while guarded")


async def unguard(kube: Kube, node: Obj, request: str) -> Obj | None:
    """Take off the guard gangcheck set for `request` (scaledown.unguard_ops) and nothing
    else; the node after, None when it is gone. Raises ConflictError when it kept changing."""
    name = node["metadata"]["name"]
    for _ in range(ATTEMPTS):
        ops = unguard_ops(node, request)
        if not ops:
            return node
        try:
            return await kube.json_patch(NODE, name, ops)
        except NotFoundError:
            return None
        except ConflictError:  # a tested value changed: decide again
            fresh = await _get(kube, name)
            if fresh is None:
                return None
            node = fresh
    raise ConflictError(409, "Conflict", f"node {name} kept changing while unguarded")
