"""Claims of an attempt that rolls back, on a kube-apiserver serving Karpenter's own NodePool
and NodeClaim CRDs (from the module the test bed pins): its request stays as the record (a
PodGroup's backoff), and its claims not arrived are withdrawn at once, not once the request is
deleted; the one that arrived is the rollback's to reclaim and stays; nothing is written on
the request. (Before: every claim stayed, launching, until the request was deleted.)"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import (
    NAMESPACE,
    NODE_CLAIM,
    NODE_POOL,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
)
from gangcheck.logic.sources.karpenter import names
from gangcheck.model.names import PHASE_ANNOTATION, ROLLING_BACK
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.test_karpenter_refusals import (  # the fixtures: pytest finds them here
    _clean,
    claim_crd,  # noqa: F401
    request,
    running,
    template,
    until,
)
from tests.integration.test_karpenter_source_pools import (
    node_pool,
    node_pool_crd,  # noqa: F401
)

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
NOW = "2026-12-01T10:00:00Z"


@pytest.mark.timeout(120)
async def test_claims_not_arrived_are_withdrawn_once_the_attempt_rolls_back(
    control_plane: ControlPlane,
    node_pool_crd: None,  # noqa: F811
    claim_crd: None,  # noqa: F811
) -> None:
    namespace = f"karp-rollback-{uuid.uuid4().hex[:8]}"
    pool = f"pool-{namespace}"
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
        await admin.create(NODE_POOL, node_pool(pool))
        try:
            await admin.create(POD_TEMPLATE, template(namespace, "a"), namespace)
            await admin.create(PROVISIONING_REQUEST, request(namespace, "a"), namespace)
            await asyncio.sleep(1.1)  # claims are made a second after their request

            async def claims() -> list[Obj]:
                listed = await admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
                key = f"{namespace}/a-check-1"
                return sorted(
                    (
                        c
                        for c in listed["items"]
                        if c["metadata"]["annotations"].get(names.REQUESTED_FOR) == key
                    ),
                    key=lambda c: str(c["metadata"]["name"]),
                )

            async with running(admin) as caches:
                karpenter = KarpenterProvisioner(admin, caches)
                await karpenter.pass_once()
                made = await claims()
                # Karpenter's part: the first claim arrived (Initialized, its node named)
                arrived = made[0]["metadata"]["name"]
                conditions = [
                    {"type": t, "status": "True", "lastTransitionTime": NOW, "reason": t}
                    for t in ("Launched", "Registered", "Initialized")
                ]
                await admin.merge_patch(
                    NODE_CLAIM,
                    arrived,
                    {"status": {"nodeName": f"node-{namespace}", "conditions": conditions}},
                    subresource="status",
                )
                # the core: the attempt rolls back, its request stays as the record
                await admin.merge_patch(
                    PROVISIONING_REQUEST,
                    "a-check-1",
                    {"metadata": {"annotations": {PHASE_ANNOTATION: ROLLING_BACK}}},
                    namespace,
                )
                rolling = await admin.get(PROVISIONING_REQUEST, "a-check-1", namespace)

                async def seen() -> bool:
                    got = caches.requests.store.get("a-check-1", namespace) or {}
                    notes = got.get("metadata", {}).get("annotations") or {}
                    return notes.get(PHASE_ANNOTATION) == ROLLING_BACK

                await until(seen)
                await karpenter.pass_once()
                left = await claims()
                await karpenter.pass_once()  # again: nothing more
                left_after = await claims()
                after = await admin.get(PROVISIONING_REQUEST, "a-check-1", namespace)
        finally:
            await _clean(admin, control_plane, namespace, pool)
    assert len(made) == 2
    assert [c["metadata"]["name"] for c in left] == [arrived]
    assert [c["metadata"]["name"] for c in left_after] == [arrived]
    assert after["metadata"]["resourceVersion"] == rolling["metadata"]["resourceVersion"]
    assert "Failed" not in {c["type"] for c in (after.get("status") or {}).get("conditions") or []}
