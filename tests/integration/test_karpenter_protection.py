"""karpenter.sh/do-not-disrupt on a gang's NodeClaims and nodes, on a kube-apiserver serving
Karpenter's own NodePool and NodeClaim CRDs (from the module the test bed pins), once no
request of gangcheck's Karpenter class is left.

Claims the previous release made (no gangcheck.io/request-uid, no
gangcheck.io/pool-do-not-disrupt), arrived, their gang started (the hold lifted) and their
request gone: in a NodePool whose template sets do-not-disrupt, the admin's protection stays on
the claims and their nodes; in one that does not, gangcheck's own comes off (the gang no longer
needs it). Before, the pools were read only while a request of the class existed, and the last
request's going took the admin's protection off as well."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import NODE, NODE_CLAIM, NODE_POOL
from gangcheck.logic.sources.karpenter import names
from gangcheck.logic.sources.karpenter.claims import ClaimAsk, claim_bodies
from gangcheck.model.names import ARRIVED_FOR
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.karpenter_bed import node_pool, running

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
NOW = "2026-12-01T10:00:00Z"


async def old_claim_on_a_node(admin: Kube, pool: Obj, key: str) -> tuple[str, str]:
    """One claim of ``key``'s attempt as the previous release made it, launched and
    initialized on a node of its own carrying what Karpenter copied (do-not-disrupt) and the
    ledger's record; the gang started (no hold). Returns the claim's and the node's names."""
    (body,) = claim_bodies(pool, ClaimAsk(key, 1, {"cpu": "1"}))
    body["metadata"]["annotations"].pop(names.POOL_PROTECTED, None)
    body["metadata"]["annotations"].pop(names.REQUEST_UID, None)
    node = f"node-{body['metadata']['name']}"
    await admin.create(
        NODE,
        {
            "metadata": {
                "name": node,
                "labels": {names.NODE_POOL_LABEL: pool["metadata"]["name"]},
                "annotations": {names.DO_NOT_DISRUPT: "true", ARRIVED_FOR: key},
            }
        },
    )
    made = await admin.create(NODE_CLAIM, body)
    status = {
        "nodeName": node,
        "providerID": f"kwok://{node}",
        "conditions": [
            {"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": NOW}
            for t in ("Launched", "Registered", "Initialized")
        ],
    }
    await admin.merge_patch(
        NODE_CLAIM, made["metadata"]["name"], {"status": status}, subresource="status"
    )
    return made["metadata"]["name"], node


def protected(obj: Obj) -> bool:
    return (obj["metadata"].get("annotations") or {}).get(names.DO_NOT_DISRUPT) == "true"


@pytest.mark.timeout(120)
async def test_with_no_request_left_a_protecting_pools_old_claims_keep_do_not_disrupt(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    run = uuid.uuid4().hex[:8]
    protecting = node_pool(f"protecting-{run}")
    protecting["spec"]["template"]["metadata"] = {"annotations": {names.DO_NOT_DISRUPT: "true"}}
    plain = node_pool(f"plain-{run}")
    made: list[tuple[str, str]] = []
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        try:
            for pool, gang in ((protecting, "a"), (plain, "b")):
                created = await admin.create(NODE_POOL, pool)
                key = f"gone-{run}/{gang}-check-1"  # no such request: it is gone
                made.append(await old_claim_on_a_node(admin, created, key))
            # no request of the class left: the requests' cache synced empty (the session's
            # API server is shared: other modules' requests of the class may be on it)
            async with running(admin, requests=False) as caches:
                karpenter = KarpenterProvisioner(admin, caches)
                assert not karpenter._requests()
                await karpenter.pass_once()
            after = [
                (
                    protected(await admin.get(NODE_CLAIM, claim)),
                    protected(await admin.get(NODE, node)),
                )
                for claim, node in made
            ]
        finally:
            for claim, node in made:
                with contextlib.suppress(NotFoundError):
                    await admin.delete(NODE_CLAIM, claim)
                with contextlib.suppress(NotFoundError):
                    await admin.delete(NODE, node)
            for pool in (protecting, plain):
                with contextlib.suppress(NotFoundError):
                    await admin.delete(NODE_POOL, pool["metadata"]["name"])
    assert after == [(True, True), (False, False)]
