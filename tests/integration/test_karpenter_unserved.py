"""Requests of gangcheck's Karpenter class on a kube-apiserver that does not serve what the
provisioner needs: no Karpenter CRD at all, or Karpenter's NodeClaim CRD without its NodePool
CRD (one of the two installed). Each request fails once with ``KarpenterNotServed`` naming
the kind not served, no claim is made, and the pass ends normally (before, with NodeClaims
served and NodePools not, every pass ended on the NodePools' 404 and the requests waited
with nothing said)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed.karpenter import KARPENTER_MODULE, KARPENTER_TOOLCHAIN
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import NAMESPACE, NODE_CLAIM, PROVISIONING_REQUEST
from gangcheck.logic.sources.karpenter import names
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.harness import eventually
from tests.integration.karpenter_bed import CRD_API, Bed, running
from tests.integration.test_diagnose import node_claim_crd
from tests.integration.test_manifests import remove_namespace

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def no_node_pool_crd(control_plane: ControlPlane) -> Iterator[None]:
    """Karpenter's NodePool CRD absent; installed again afterwards if it was there."""
    module = crds.module_dir(KARPENTER_MODULE, wrapper="karpenter", toolchain=KARPENTER_TOOLCHAIN)
    crd = crds.load_crds([module / "kwok" / "charts" / "crds" / "karpenter.sh_nodepools.yaml"])
    admin = control_plane.client()
    path = f"{CRD_API}/{crd[0]['metadata']['name']}"
    was = admin.request("GET", path).status == 200
    if was:
        admin.request("DELETE", path)
        crds.wait_gone(admin, [crd[0]["metadata"]["name"]])
    try:
        yield
    finally:
        if was:
            crds.install_crds(admin, crd)


@contextlib.asynccontextmanager
async def gangs(control_plane: ControlPlane, *names_: str) -> AsyncIterator[Bed]:
    """A namespace of the test's own with ``names_`` asking through the Karpenter class
    (no NodePool made: its CRD is not served)."""
    namespace = f"karp-unserved-{uuid.uuid4().hex[:8]}"
    async with await Kube.connect(str(control_plane.kubeconfig)) as admin:
        await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
        try:
            bed = Bed(admin, namespace, f"pool-{namespace}")
            await bed.add_gangs(*names_)
            yield bed
        finally:
            remove_namespace(control_plane, namespace)


async def _passes(bed: Bed, *gang_names: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Two passes of a provisioner; each gang's request's Failed condition after the first,
    and its resourceVersion after the second."""
    async with running(bed.admin) as caches:
        karpenter = KarpenterProvisioner(bed.admin, caches)
        await karpenter.pass_once()
        failed = {g: (await bed.conditions(g)).get("Failed") or {} for g in gang_names}
        versions: dict[str, str] = {}
        for g in gang_names:
            got = await bed.admin.get(PROVISIONING_REQUEST, f"{g}-check-1", bed.namespace)
            versions[g] = got["metadata"]["resourceVersion"]

        async def cached_failed() -> bool:  # the second pass reads the conditions written
            mine = [
                r for r in caches.requests.store if r["metadata"].get("namespace") == bed.namespace
            ]
            return len(mine) == len(gang_names) and all(
                (r.get("status") or {}).get("conditions") for r in mine
            )

        await eventually(cached_failed, what="the Failed conditions in the cache")
        await karpenter.pass_once()
        again: dict[str, str] = {}
        for g in gang_names:
            got = await bed.admin.get(PROVISIONING_REQUEST, f"{g}-check-1", bed.namespace)
            again[g] = got["metadata"]["resourceVersion"]
    assert again == versions  # told once: the second pass writes nothing
    return failed, versions


@pytest.mark.timeout(120)
async def test_node_claims_served_without_node_pools_fails_each_request_once(
    control_plane: ControlPlane,
) -> None:
    with node_claim_crd(control_plane, installed=True), no_node_pool_crd(control_plane):
        async with gangs(control_plane, "a", "b") as bed:
            failed, _ = await _passes(bed, "a", "b")
            listed = await bed.admin.list_objects(NODE_CLAIM, label_selector=names.ATTEMPT_LABEL)
            made = [
                c
                for c in listed["items"]
                if c["metadata"]["annotations"]
                .get(names.REQUESTED_FOR, "")
                .startswith(f"{bed.namespace}/")
            ]
    assert made == []
    for gang in ("a", "b"):
        assert failed[gang].get("status") == "True", failed
        assert failed[gang]["reason"] == "KarpenterNotServed"
        assert "karpenter.sh/v1 NodePools" in failed[gang]["message"], failed[gang]


@pytest.mark.timeout(120)
async def test_no_karpenter_crd_fails_each_request_naming_node_claims(
    control_plane: ControlPlane,
) -> None:
    with node_claim_crd(control_plane, installed=False), no_node_pool_crd(control_plane):
        async with gangs(control_plane, "a") as bed:
            failed, _ = await _passes(bed, "a")
    assert failed["a"].get("status") == "True", failed
    assert failed["a"]["reason"] == "KarpenterNotServed"
    assert "karpenter.sh/v1 NodeClaims" in failed["a"]["message"], failed["a"]
