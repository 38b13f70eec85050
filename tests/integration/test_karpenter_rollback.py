"""Claims of an attempt that rolls back, on a kube-apiserver serving Karpenter's own NodePool
and NodeClaim CRDs (from the module the test bed pins): its request stays as the record (a
PodGroup's backoff), and its claims not arrived are withdrawn at once, not once the request is
deleted; the one that arrived is the rollback's to reclaim and stays; nothing is written on
the request. (Before: every claim stayed, launching, until the request was deleted.)"""

from __future__ import annotations

from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.resources import NODE_CLAIM, PROVISIONING_REQUEST
from gangcheck.model.names import PHASE_ANNOTATION, ROLLING_BACK
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.karpenter_bed import Bed, karpenter_bed, running, until

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
NOW = "2026-12-01T10:00:00Z"


def _conditions(*kinds: str) -> list[Obj]:
    return [{"type": t, "status": "True", "lastTransitionTime": NOW, "reason": t} for t in kinds]


async def _roll_back(bed: Bed, caches: Caches, gang: str) -> Obj:
    """The core's part: the attempt rolls back, its request staying as the record; returns the
    request as written, once the provisioner's cache has it."""
    name = f"{gang}-check-1"
    await bed.admin.merge_patch(
        PROVISIONING_REQUEST,
        name,
        {"metadata": {"annotations": {PHASE_ANNOTATION: ROLLING_BACK}}},
        bed.namespace,
    )
    rolling = await bed.admin.get(PROVISIONING_REQUEST, name, bed.namespace)

    async def seen() -> bool:
        got = caches.requests.store.get(name, bed.namespace) or {}
        notes = got.get("metadata", {}).get("annotations") or {}
        return notes.get(PHASE_ANNOTATION) == ROLLING_BACK

    await until(seen)
    return rolling


@pytest.mark.timeout(120)
async def test_claims_not_arrived_are_withdrawn_once_the_attempt_rolls_back(
    control_plane: ControlPlane, node_pool_crd: None, claim_crd: None
) -> None:
    async with (
        karpenter_bed(control_plane, "karp-rollback", "a") as bed,
        running(bed.admin) as caches,
    ):
        karpenter = KarpenterProvisioner(bed.admin, caches)
        await karpenter.pass_once()
        made = await bed.claims("a")
        # Karpenter's part: the first claim arrived (Initialized, its node named)
        arrived = made[0]["metadata"]["name"]
        await bed.admin.merge_patch(
            NODE_CLAIM,
            arrived,
            {
                "status": {
                    "nodeName": f"node-{bed.namespace}",
                    "conditions": _conditions("Launched", "Registered", "Initialized"),
                }
            },
            subresource="status",
        )
        rolling = await _roll_back(bed, caches, "a")
        await karpenter.pass_once()
        left = await bed.claims("a")
        await karpenter.pass_once()  # again: nothing more
        left_after = await bed.claims("a")
        after = await bed.admin.get(PROVISIONING_REQUEST, "a-check-1", bed.namespace)
    assert len(made) == 2
    assert [c["metadata"]["name"] for c in left] == [arrived]
    assert [c["metadata"]["name"] for c in left_after] == [arrived]
    assert after["metadata"]["resourceVersion"] == rolling["metadata"]["resourceVersion"]
    assert "Failed" not in {c["type"] for c in (after.get("status") or {}).get("conditions") or []}
