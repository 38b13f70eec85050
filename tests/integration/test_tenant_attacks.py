"""A tenant as an attacker, on a real API server: what one with a namespace admin's rights
in its own namespace alone (a ServiceAccount of that namespace, bound by a Role) can make
gangcheck, which runs with rights over the whole cluster, do to others.

Only attacks that got through once are kept here, each as the guard against it coming back
(docs/security.md, "What a tenant can try", lists every attack tried and why the others do
not get through).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.app import Controller
from gangcheck.kube.client import Kube
from gangcheck.kube.resources import POD, UPSTREAM_POD_GROUP_V1BETA1
from gangcheck.model.names import GATE, STATE_ANNOTATION
from tests.builders import container
from tests.integration.harness import Cluster, namespace_user
from tests.integration.test_operations import parse_exposition
from tests.integration.test_podgroups import Groups, controller_running

Obj = dict[str, Any]
TENANT = "tenant"
HOST = "kubernetes.io/hostname"


@pytest.fixture
async def tenant(
    control_plane: ControlPlane, cluster: Cluster, tmp_path: Path
) -> AsyncIterator[Kube]:
    """A ServiceAccount of the test's namespace with what a namespace's `admin` may do there
    to what gangcheck reads (a Role: no kube-controller-manager aggregates the `admin`
    ClusterRole on this control plane): every verb on pods, PodTemplates, Jobs, both PodGroup
    APIs, Kueue Workloads and ProvisioningRequests, with their status."""
    ns, admin = cluster.ns, cluster.kube
    everything = ["get", "list", "watch", "create", "update", "patch", "delete"]
    resources = {
        "": ["pods", "pods/status", "podtemplates", "events"],
        "batch": ["jobs"],
        "scheduling.k8s.io": ["podgroups", "podgroups/status"],
        "scheduling.x-k8s.io": ["podgroups", "podgroups/status"],
        "kueue.x-k8s.io": ["workloads", "workloads/status"],
        "autoscaling.x-k8s.io": ["provisioningrequests", "provisioningrequests/status"],
    }
    rules = [{"apiGroups": [g], "resources": r, "verbs": everything} for g, r in resources.items()]
    kubeconfig = tmp_path / "tenant.kubeconfig"
    probe = UPSTREAM_POD_GROUP_V1BETA1
    async with namespace_user(
        control_plane, admin, ns, TENANT, rules=rules, probe=probe, kubeconfig=kubeconfig
    ) as user:
        yield user


async def _many_nodes(cluster: Cluster, count: int, *, gpu: int) -> None:
    """`count` Ready nodes of the test's pool, made 250 at a time."""
    batches = [cluster.add_nodes(10, gpu=gpu) for _ in range(count // 10)]
    for start in range(0, len(batches), 25):
        await asyncio.gather(*batches[start : start + 25])


def _slowest_podgroup_reconciles(controller: Controller, above: float) -> float:
    """How many PodGroup reconciles took longer than `above` seconds (a bucket's bound)."""
    samples = parse_exposition(controller.metrics.render())
    family = "gangcheck_reconcile_duration_seconds"
    labels = (("controller", "podgroup"),)
    total = samples[(f"{family}_count", labels)]
    within = samples[(f"{family}_bucket", (*labels, ("le", f"{above:g}")))]
    return total - within


async def test_a_gang_wanting_one_host_among_many_does_not_stall_the_controller(
    control_plane: ControlPlane, cluster: Cluster, tenant: Kube
) -> None:
    """A tenant's PodGroup required on `kubernetes.io/hostname` (one domain per node), two
    members each wanting a whole node: it fits on no node. Each domain tried used to read
    every node: 1000 nodes took seconds of the controller's one event loop per look (more
    than 15 minutes of them, this test found, before it ended), every other gang waiting.
    Every PodGroup reconcile now takes under 2.5 s (milliseconds when the machine is idle),
    and another namespace's gang is released meanwhile."""
    await _many_nodes(cluster, 1000, gpu=8)
    victim = await Cluster.create(cluster.kube)  # another namespace, its own node
    try:
        await victim.add_nodes(1, gpu=1)
        await _attacked(control_plane, cluster, tenant, Groups(victim))
    finally:
        await victim.remove_nodes()


async def _attacked(
    control_plane: ControlPlane, cluster: Cluster, tenant: Kube, victims: Groups
) -> None:
    await victims.opt_in()
    await Groups(cluster).opt_in()
    async with controller_running(str(control_plane.kubeconfig)) as controller:
        spec = {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": HOST}]},
        }
        body = {"metadata": {"name": "greedy", "namespace": cluster.ns}, "spec": spec}
        await tenant.create(UPSTREAM_POD_GROUP_V1BETA1, body)
        for i in range(2):
            member: Obj = {
                "metadata": {"name": f"greedy-{i}", "namespace": cluster.ns},
                "spec": {
                    "containers": [container(gpu=8)],
                    "restartPolicy": "Never",
                    "nodeSelector": dict(cluster.pool),
                    "schedulingGroup": {"podGroupName": "greedy"},
                    "schedulingGates": [{"name": GATE}],
                },
            }
            await tenant.create(POD, member)
        await Groups(cluster).wait_state("greedy", "Provisioning", timeout=60)
        await victims.upstream("small", 1)
        await victims.member("small-0", "small", gpu=1)
        released = await victims.wait_state("small", "Released", timeout=30)
        assert released["metadata"]["annotations"][STATE_ANNOTATION] == "Released"
        assert _slowest_podgroup_reconciles(controller, 2.5) == 0
