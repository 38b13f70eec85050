"""A node whose Karpenter NodeClaim is being deleted is going: never counted as capacity.

Karpenter, once a NodeClaim is being deleted, deletes its Node and only then taints it
(``karpenter.sh/disrupted:NoSchedule``) and drains it: until then the Node looks usable. A
gang found to fit there is admitted and then evicted. Against a real kube-apiserver, with the
NodeClaim test CRD (tests/crds/) and claims kept in deletion by a finalizer, as Karpenter's
termination finalizer keeps them; gangcheck runs as its ServiceAccount under the shipped
RBAC (the base's rule lists and watches NodeClaims).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.informer import Informer
from gangcheck.kube.resources import NODE, NODE_CLAIM
from gangcheck.logic.attempt import naming
from gangcheck.model.objects import Obj
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import (
    TEST_CRDS,
    Cluster,
    RunningController,
    apply,
    arrived_for,
    eventually,
    kubectl,
    token_kubeconfig,
)
from tests.waiting import cancelled

pytestmark = pytest.mark.integration

#: Kept on the test's claims, as Karpenter's termination finalizer keeps a claim being deleted.
FINALIZER = "gangcheck.io/test-keeps-the-claim"


@pytest.fixture(scope="module")
def node_claim_crd(control_plane: Any) -> None:
    """The NodeClaim CRD, installed before the controller starts (its informer finds the
    resource at its first list)."""
    crds.install_crds(control_plane.client(), crds.load_crds(TEST_CRDS))


class Claims:
    """NodeClaims the test makes for its nodes; every one of them gone at the end."""

    def __init__(self, kube: Kube, prefix: str) -> None:
        self.kube, self.prefix = kube, prefix
        self.names: list[str] = []

    async def of(self, node: str) -> str:
        """A registered claim for ``node``: linked as Karpenter links them, by providerID
        (set on the Node too)."""
        provider = f"kwok://{node}"
        await self.kube.merge_patch(NODE, node, {"spec": {"providerID": provider}})
        name = f"{self.prefix}-{len(self.names)}"
        body = {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": name, "finalizers": [FINALIZER]},
            "spec": {},
        }
        await self.kube.create(NODE_CLAIM, body)
        self.names.append(name)
        await self.kube.merge_patch(
            NODE_CLAIM, name, {"status": {"providerID": provider}}, subresource="status"
        )
        return name

    async def start_deleting(self, name: str) -> None:
        """Delete the claim: it stays, with a deletionTimestamp, while its finalizer does."""
        await self.kube.delete(NODE_CLAIM, name)

    async def remove(self) -> None:
        for name in self.names:
            with contextlib.suppress(NotFoundError):
                await self.kube.merge_patch(NODE_CLAIM, name, {"metadata": {"finalizers": None}})
            with contextlib.suppress(NotFoundError):
                await self.kube.delete(NODE_CLAIM, name)


@pytest.fixture
async def claims(node_claim_crd: None, cluster: Cluster) -> AsyncIterator[Claims]:
    made = Claims(cluster.kube, f"{cluster.ns}-claim")
    yield made
    await made.remove()


def fit_config() -> dict[str, Any]:
    return {
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 120, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
    }


def gang(members: int = 2) -> WorkloadBuilder:
    return (
        WorkloadBuilder("wl")
        .pod_set("workers", members, pod_template(gpu=1))
        .reserve_quota()
        .check()
    )


async def message_with(cluster: Cluster, text: str) -> Obj | None:
    entry = await cluster.check_state("wl")
    return entry if text in entry["message"] else None


async def test_a_gang_that_fits_only_where_a_claim_is_being_deleted_waits_for_a_node_that_stays(
    node_claim_crd: None, claims: Claims, cluster: Cluster, controller: RunningController
) -> None:
    # A node roomy enough for the whole gang, there before it, whose claim is being deleted.
    (going,) = await cluster.add_nodes(1, gpu=2, prefix="going")
    await claims.start_deleting(await claims.of(going))
    await cluster.install_check(fit_config())
    await cluster.submit(gang())
    request = naming.request_name("wl", cluster.check, 1)
    await cluster.set_request_conditions(request, {"Provisioned": "resize done"})

    check = await eventually(
        lambda: message_with(cluster, "its NodeClaim is being deleted"),
        what="the check message naming the claim being deleted",
    )
    assert check["state"] == "Pending", check
    assert "0 of 2 members placeable" in check["message"], check

    (stays,) = await cluster.add_nodes(1, gpu=2, prefix="stays")
    check = await cluster.wait_check("wl", "Ready")
    assert "the whole gang fits on nodes that exist" in check["message"], check
    assert await arrived_for(cluster, request) == [stays]


async def test_a_claim_that_starts_deleting_takes_its_node_out_of_a_waiting_gangs_count(
    node_claim_crd: None, claims: Claims, cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit_config())
    await cluster.submit(gang(members=3))
    request = naming.request_name("wl", cluster.check, 1)
    await cluster.set_request_conditions(request, {"Provisioned": "resize done"})
    (first,) = await cluster.add_nodes(1, gpu=2, prefix="first")
    claim = await claims.of(first)
    await eventually(lambda: message_with(cluster, "2 of 3 members placeable"), what="2 of 3")

    # The claim's deletion, the Node unchanged: the waiting gang counts without the node.
    await claims.start_deleting(claim)
    check = await eventually(
        lambda: message_with(cluster, "its NodeClaim is being deleted"),
        what="the check message naming the claim being deleted",
    )
    assert "0 of 3 members placeable" in check["message"], check
    assert check["state"] == "Pending", check

    await cluster.add_nodes(1, gpu=4, prefix="second")
    check = await cluster.wait_check("wl", "Ready")
    assert "the whole gang fits on nodes that exist" in check["message"], check


async def test_nodeclaims_refused_are_an_empty_cache_synced_until_allowed(
    node_claim_crd: None,
    control_plane: ControlPlane,
    cluster: Cluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An install whose RBAC lacks the base's NodeClaim rule (or a cluster that refuses it):
    the NodeClaim cache is empty and synced, so the controller starts and judges nodes on
    themselves alone, said once in the log; granted the right, the cache fills."""
    caplog.set_level(logging.INFO, logger="gangcheck.kube.informer")
    name = f"{cluster.ns}-reader"
    await cluster.kube.create(NODE_CLAIM, {"metadata": {"name": name}, "spec": {}})
    grant = yaml.safe_dump_all(reader_rbac(name, cluster.ns))
    try:
        async with await Kube.connect(
            str(default_account(control_plane, cluster.ns, tmp_path))
        ) as k:
            informer = Informer(
                k,
                NODE_CLAIM,
                optional=True,
                forbidden_is_absent=True,
                retry_delay=0.1,
                absent_retry=0.5,
            )
            task = asyncio.create_task(informer.run())
            try:
                await asyncio.wait_for(informer.synced.wait(), 20)
                assert (informer.served, len(informer.store)) == (False, 0)
                apply(control_plane, grant)

                async def listed() -> Obj | None:
                    return informer.store.get(name)

                await eventually(listed, what="the claim, once allowed")
                assert informer.served
            finally:
                await cancelled(task)
    finally:
        kubectl(control_plane, "delete", "--ignore-not-found", "-f", "-", stdin=grant)
        await cluster.kube.delete(NODE_CLAIM, name)
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "not allowed to list" in r.getMessage()
    ]
    assert len(warned) == 1, warned


def reader_rbac(name: str, namespace: str) -> list[Obj]:
    rbac = "rbac.authorization.k8s.io"
    return [
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": ["karpenter.sh"],
                    "resources": ["nodeclaims"],
                    "verbs": ["list", "watch"],
                }
            ],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    ]


def default_account(cp: ControlPlane, namespace: str, folder: Path) -> Path:
    """A kubeconfig of the namespace's default ServiceAccount, which nothing grants anything."""
    token = kubectl(cp, "create", "token", "default", "-n", namespace).strip()
    return token_kubeconfig(cp, "reader", token, folder / "reader.kubeconfig")
