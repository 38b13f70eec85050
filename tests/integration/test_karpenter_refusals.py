"""A NodeClaim the real API server refuses for what it is, on a kube-apiserver serving
Karpenter's own NodePool and NodeClaim CRDs (from the module the test bed pins): a
ValidatingAdmissionPolicy denying one gang's claims. That gang's request fails quoting the
policy (not "the Karpenter backend's RBAC is not installed", though the policy may answer
403), none of its claims is left, and the other gang of the same pass gets its claims. (Before:
the 403 was told as missing RBAC and every pass backed off; the 422 ended each pass, the other
gang never served.)"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    NAMESPACE,
    NODE_CLAIM,
    NODE_POOL,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
)
from gangcheck.logic.sources.karpenter import names
from gangcheck.model.names import MANAGED_BY, MANAGED_BY_LABEL
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.harness import apply, deny_policy
from tests.integration.test_diagnose import node_claim_crd
from tests.integration.test_karpenter_source_pools import (  # the fixture: pytest finds it here
    node_pool,
    node_pool_crd,  # noqa: F401
)
from tests.integration.test_manifests import remove_namespace

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}


@pytest.fixture
def claim_crd(control_plane: ControlPlane) -> Iterator[None]:
    with node_claim_crd(control_plane, installed=True):
        yield


def request(namespace: str, gang: str) -> Obj:
    return {
        "metadata": {"name": f"{gang}-check-1", "namespace": namespace, "labels": MANAGED},
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": f"pool-{namespace}"},
            "podSets": [{"podTemplateRef": {"name": f"ppt-{gang}"}, "count": 2}],
        },
    }


def template(namespace: str, gang: str) -> Obj:
    gpus = {"nvidia.com/gpu": "8"}
    container = {"name": "c", "image": "x", "resources": {"requests": gpus, "limits": gpus}}
    return {
        "metadata": {"name": f"ppt-{gang}", "namespace": namespace, "labels": MANAGED},
        "template": {"spec": {"containers": [container]}},
    }


@contextlib.contextmanager
def policy(control_plane: ControlPlane, name: str, denied: str, reason: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy (and its binding) denying the creation of NodeClaims made
    for the gang request ``denied`` (``namespace/name``); yields the message it denies with."""
    said = "claims of this gang are not allowed here"
    validation: Obj = {"expression": "false", "message": said}
    if reason:
        validation["reason"] = reason
    requested_for = f"object.metadata.annotations['{names.REQUESTED_FOR}']"
    the_denied_gang = {
        "name": "the-denied-gang",
        "expression": f"has(object.metadata.annotations) && "
        f"'{names.REQUESTED_FOR}' in object.metadata.annotations && "
        f"{requested_for} == '{denied}'",
    }
    manifests = deny_policy(
        name,
        {
            "apiGroups": [names.GROUP],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["nodeclaims"],
        },
        validation,
        match_conditions=[the_denied_gang],
    )
    apply(control_plane, manifests)
    try:
        yield said
    finally:
        control_plane.run_kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifests)


@contextlib.asynccontextmanager
async def running(kube: Kube) -> AsyncIterator[Caches]:
    """The informers a provisioner's pass reads, synced."""
    caches = Caches.create(kube, watch_timeout=30)
    informers = (caches.requests, caches.templates, caches.nodes)
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        for informer in informers:
            await asyncio.wait_for(informer.synced.wait(), 30)
        yield caches
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def until(check: Any, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("not seen in time")
        await asyncio.sleep(0.2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reason", ["Forbidden", ""], ids=["403", "default-reason"])
async def test_a_claim_a_policy_refuses_fails_only_its_gang_quoting_the_policy(
    control_plane: ControlPlane,
    node_pool_crd: None,  # noqa: F811
    claim_crd: None,
    reason: str,
) -> None:
    namespace = f"karp-refused-{uuid.uuid4().hex[:8]}"
    pool = f"pool-{namespace}"
    name = f"deny-{namespace}"
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
        await admin.create(NODE_POOL, node_pool(pool))
        try:
            with policy(control_plane, name, f"{namespace}/a-check-1", reason) as said:
                for gang in ("a", "b"):
                    await admin.create(POD_TEMPLATE, template(namespace, gang), namespace)
                    await admin.create(PROVISIONING_REQUEST, request(namespace, gang), namespace)
                await asyncio.sleep(1.1)  # claims are made a second after their request

                async def claims(gang: str) -> list[Obj]:
                    listed = await admin.list_objects(
                        NODE_CLAIM, label_selector=names.ATTEMPT_LABEL
                    )
                    key = f"{namespace}/{gang}-check-1"
                    return [
                        c
                        for c in listed["items"]
                        if c["metadata"]["annotations"].get(names.REQUESTED_FOR) == key
                    ]

                async def failed() -> Obj | None:
                    got = await admin.get(PROVISIONING_REQUEST, "a-check-1", namespace)
                    conditions = (got.get("status") or {}).get("conditions") or []
                    return next((c for c in conditions if c["type"] == "Failed"), None)

                async with running(admin) as caches:
                    karpenter = KarpenterProvisioner(admin, caches)
                    await karpenter.pass_once()
                    made_for_b = await claims("b")
                    condition = await until(failed)
                    await until(lambda: _none_left(claims, "a", karpenter))
        finally:
            listed = await admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
            for claim in listed["items"]:
                if claim["metadata"]["labels"].get(names.NODE_POOL_LABEL) == pool:
                    with contextlib.suppress(NotFoundError):
                        await admin.delete(NODE_CLAIM, claim["metadata"]["name"])
            with contextlib.suppress(NotFoundError):
                await admin.delete(NODE_POOL, pool)
            remove_namespace(control_plane, namespace)
    assert len(made_for_b) == 2  # served in the same pass
    assert condition["reason"] == "NodeClaimRefused"
    assert condition["message"].startswith("the API server refused NodeClaim "), condition
    assert (
        f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request"
        in (condition["message"])
    )
    assert said in condition["message"]
    assert "RBAC" not in condition["message"]
    assert karpenter.denials.message is None


async def _none_left(claims: Any, gang: str, karpenter: KarpenterProvisioner) -> bool:
    """Passes until the gang's claims are withdrawn (none is made: the first is refused)."""
    await karpenter.pass_once()
    return not await claims(gang)
