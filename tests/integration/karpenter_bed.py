"""The set-up the Karpenter provisioner's integration tests share: a kube-apiserver serving
Karpenter's own NodePool and NodeClaim CRDs (from the module the test bed pins; fixtures
``node_pool_crd`` and ``claim_crd``, made known to every module by conftest.py), a NodePool
and a namespace of the test's own with gangs asking through gangcheck's Karpenter class
(``karpenter_bed``), the informers a pass reads (``running``), and what the tests read back
(``Bed.claims``, ``Bed.conditions``)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed.karpenter import KARPENTER_MODULE, KARPENTER_TOOLCHAIN
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.informer import Informer
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
from tests.builders import node_pool  # the bed's tests import it from here too
from tests.integration.test_diagnose import node_claim_crd
from tests.integration.test_manifests import remove_namespace
from tests.waiting import cancelled

Obj = dict[str, Any]
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def node_pool_crd(control_plane: ControlPlane) -> Iterator[None]:
    """Karpenter's NodePool CRD; removed again if this module installed it."""
    module = crds.module_dir(KARPENTER_MODULE, wrapper="karpenter", toolchain=KARPENTER_TOOLCHAIN)
    wanted = crds.load_crds([module / "kwok" / "charts" / "crds" / "karpenter.sh_nodepools.yaml"])
    admin = control_plane.client()
    path = f"{CRD_API}/{wanted[0]['metadata']['name']}"
    missing = wanted if admin.request("GET", path).status == 404 else []
    crds.install_crds(admin, missing)
    yield
    for crd in missing:
        admin.request("DELETE", f"{CRD_API}/{crd['metadata']['name']}")
    crds.wait_gone(admin, [c["metadata"]["name"] for c in missing])


@pytest.fixture
def claim_crd(control_plane: ControlPlane) -> Iterator[None]:
    """Karpenter's NodeClaim CRD (only that one), as it was again afterwards."""
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


@dataclass(frozen=True)
class Bed:
    """A namespace and a NodePool of the test's own (``pool-<namespace>``)."""

    admin: Kube
    namespace: str
    pool: str

    async def add_gangs(self, *gangs: str) -> None:
        """Each gang's PodTemplate and request (``<gang>-check-1``, two members of 8 GPUs);
        then a second passes: claims are made a second after their request."""
        for gang in gangs:
            await self.admin.create(POD_TEMPLATE, template(self.namespace, gang), self.namespace)
            await self.admin.create(
                PROVISIONING_REQUEST, request(self.namespace, gang), self.namespace
            )
        await asyncio.sleep(1.1)

    def key(self, gang: str) -> str:
        return f"{self.namespace}/{gang}-check-1"

    async def claims(self, gang: str) -> list[Obj]:
        """The gang's attempt's NodeClaims, read now, by name."""
        listed = await self.admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
        return sorted(
            (
                c
                for c in listed["items"]
                if c["metadata"]["annotations"].get(names.REQUESTED_FOR) == self.key(gang)
            ),
            key=lambda c: str(c["metadata"]["name"]),
        )

    async def conditions(self, gang: str) -> dict[str, Obj]:
        """The gang's request's conditions, read now, by type."""
        got = await self.admin.get(PROVISIONING_REQUEST, f"{gang}-check-1", self.namespace)
        found = (got.get("status") or {}).get("conditions") or []
        return {c["type"]: c for c in found}


@contextlib.asynccontextmanager
async def karpenter_bed(
    control_plane: ControlPlane, prefix: str, *gangs: str
) -> AsyncIterator[Bed]:
    """A namespace ``<prefix>-<random>`` and its NodePool, with ``gangs`` asking (``add_gangs``);
    the pool's claims, the pool and the namespace removed at the end."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    pool = f"pool-{namespace}"
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
        await admin.create(NODE_POOL, node_pool(pool))
        try:
            bed = Bed(admin, namespace, pool)
            if gangs:
                await bed.add_gangs(*gangs)
            yield bed
        finally:
            await _clean(admin, control_plane, namespace, pool)


async def _clean(admin: Kube, control_plane: ControlPlane, namespace: str, pool: str) -> None:
    listed = await admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
    for claim in listed["items"]:
        if claim["metadata"]["labels"].get(names.NODE_POOL_LABEL) == pool:
            with contextlib.suppress(NotFoundError):
                await admin.delete(NODE_CLAIM, claim["metadata"]["name"])
    with contextlib.suppress(NotFoundError):
        await admin.delete(NODE_POOL, pool)
    remove_namespace(control_plane, namespace)


@contextlib.asynccontextmanager
async def running(kube: Kube, *, requests: bool = True) -> AsyncIterator[Caches]:
    """The informers a provisioner's pass reads, synced. `requests=False`: the requests'
    cache is not filled, synced empty: the pass sees no request of any class, whatever other
    tests of the session left on the shared API server."""
    caches = Caches.create(kube, watch_timeout=30)
    informers: tuple[Informer, ...] = (caches.requests, caches.templates, caches.nodes)
    if not requests:
        caches.requests.synced.set()
        informers = (caches.templates, caches.nodes)
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        for informer in informers:
            await asyncio.wait_for(informer.synced.wait(), 30)
        yield caches
    finally:
        await cancelled(*tasks)
