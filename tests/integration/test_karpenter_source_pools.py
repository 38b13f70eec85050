"""A Karpenter capacity source whose NodePool does not exist, on a real kube-apiserver serving
Karpenter's own NodePool CRD (from the module the test bed pins): the AdmissionCheck turns
Active=False naming the source's field, and Active again once the pool is created (found by
the check's recheck: creating a NodePool wakes nothing else)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import ATOMIC_CONFIG, NODE_POOL
from gangcheck.logic.attempt import naming
from gangcheck.model.provisioning_config import CHECK_CAPACITY
from gangcheck.reconcile import admissioncheck
from tests.integration.harness import Cluster, RunningController, eventually
from tests.integration.karpenter_bed import node_pool
from tests.integration.test_admission_check import CONSUME, gang

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


async def active_is(cluster: Cluster, status: str) -> Obj | None:
    cond = await cluster.active_condition()
    return cond if cond and cond["status"] == status else None


async def cleanup(cluster: Cluster, *pools: str) -> None:
    """The test's NodePools and config (the namespace's objects go with the cluster)."""
    for res, name in [*((NODE_POOL, p) for p in pools), (ATOMIC_CONFIG, cluster.config)]:
        with contextlib.suppress(NotFoundError):
            await cluster.kube.delete(res, name)


async def test_a_sources_missing_node_pool_turns_the_check_inactive_until_it_exists(
    cluster: Cluster,
    node_pool_crd: None,
    controller: RunningController,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admissioncheck, "RECHECK_SECONDS", 1.0)  # 30 s in production
    there, missing = f"there-{cluster.ns}", f"missing-{cluster.ns}"
    await cluster.kube.create(NODE_POOL, node_pool(there))
    try:
        await cluster.install_check(
            {
                "fulfillment": {"reclaimer": "DeleteNodeClaim"},
                "capacitySources": [
                    {"provisioningClassName": CHECK_CAPACITY},
                    {"karpenter": {"nodePools": [missing]}},
                    {"karpenter": {"nodePools": [there]}},
                ],
            }
        )

        inactive = await eventually(lambda: active_is(cluster, "False"), what="Active=False")
        assert (inactive["reason"], inactive["message"]) == (
            admissioncheck.KARPENTER_UNAVAILABLE,
            f"spec.capacitySources[1].karpenter.nodePools[0]: NodePool {missing!r} not found",
        )
        await cluster.kube.create(NODE_POOL, node_pool(missing))
        active = await eventually(lambda: active_is(cluster, "True"), what="Active=True")
        assert active["reason"] == "Active"
    finally:
        for res, name in (
            (NODE_POOL, there),
            (NODE_POOL, missing),
            (ATOMIC_CONFIG, cluster.config),
        ):
            with contextlib.suppress(NotFoundError):
                await cluster.kube.delete(res, name)


async def test_a_gang_in_flight_keeps_its_attempt_when_a_sources_pool_goes(
    cluster: Cluster,
    node_pool_crd: None,
    controller: RunningController,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check's Active=False is Kueue's to act on (no new admission on its ClusterQueue);
    gangcheck goes on with the attempt asked under the config, which is still valid. A pool
    deleted while the check is active is found by the same recheck."""
    monkeypatch.setattr(admissioncheck, "RECHECK_SECONDS", 1.0)  # 30 s in production
    later = f"later-{cluster.ns}"
    await cluster.kube.create(NODE_POOL, node_pool(later))
    try:
        await cluster.install_check(
            {
                "fulfillment": {"mode": "TrustProvisioned", "reclaimer": "DeleteNodeClaim"},
                "capacitySources": [
                    {"provisioningClassName": CHECK_CAPACITY},
                    {"karpenter": {"nodePools": [later]}},
                ],
            }
        )
        await eventually(lambda: active_is(cluster, "True"), what="Active=True")
        await cluster.submit(gang())
        name = naming.request_name("wl", cluster.check, 1)
        asked = await cluster.wait_request(name)
        assert asked["spec"]["provisioningClassName"] == CHECK_CAPACITY

        await cluster.kube.delete(NODE_POOL, later)
        inactive = await eventually(lambda: active_is(cluster, "False"), what="Active=False")
        assert inactive["message"] == (
            f"spec.capacitySources[1].karpenter.nodePools[0]: NodePool {later!r} not found"
        )
        await cluster.set_request_conditions(name, {"Accepted": "", "Provisioned": "resize ok"})
        ready = await cluster.wait_check("wl", "Ready")
        assert [u["annotations"][CONSUME] for u in ready["podSetUpdates"]] == [name, name]
        kept = await cluster.request(name)
        assert kept is not None and kept["metadata"]["uid"] == asked["metadata"]["uid"]
        assert [r["metadata"]["name"] for r in await cluster.requests()] == [name]
    finally:
        await cleanup(cluster, later)
