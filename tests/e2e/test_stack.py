"""The whole cluster is real: scheduling onto kwok nodes, garbage collection, Kueue admission,
and cluster-autoscaler answering ProvisioningRequests with kwok nodes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import (
    LEASE,
    NODE,
    POD,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    WORKLOAD,
)
from tests.e2e.conftest import E2E_NODE_GROUPS, GPU_TAINT, Cluster
from tests.e2e.helpers import (
    CLUSTER_QUEUE,
    CONFIG_MAP,
    JOB,
    KWOK_TOLERATION,
    LOCAL_QUEUE,
    POOL_LABEL,
    condition,
    container,
    delete_quietly,
    eventually,
    get_or_none,
    is_true,
    kwok_node,
    node_ready,
    unique,
)

Obj = dict[str, Any]
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
NODE_GROUP_LABEL = "gangcheck.io/nodegroup"
BIG, SMALL = E2E_NODE_GROUPS[:2]
STATUS_CONFIG_MAP = "cluster-autoscaler-status"


async def _ready_kwok_nodes(kube: Kube, pool: str, count: int) -> list[str]:
    names = [unique(f"kwok-{pool}") for _ in range(count)]
    for name in names:
        await kube.create(NODE, kwok_node(name, pool))

    async def all_ready() -> bool:
        nodes = [await kube.get(NODE, name) for name in names]
        return all(node_ready(n) for n in nodes)

    await eventually(all_ready, timeout=30, what=f"kwok nodes {names} Ready")
    return names


async def test_pod_is_scheduled_onto_a_kwok_node_and_runs(kube: Kube, namespace: str) -> None:
    pool = unique("pool")
    (node,) = await _ready_kwok_nodes(kube, pool, 1)
    try:
        pod = {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [container({"cpu": "100m"})],
                "nodeSelector": {POOL_LABEL: pool},
                "tolerations": [KWOK_TOLERATION],
            },
        }
        await kube.create(POD, pod, namespace)

        async def running() -> Obj | None:
            got = await kube.get(POD, "p", namespace)
            return got if got.get("status", {}).get("phase") == "Running" else None

        got = await eventually(running, timeout=30, what="pod p Running")
        assert got["spec"]["nodeName"] == node  # bound by kube-scheduler
        assert is_true(got, "Ready")  # kwok's pod-ready stage
        assert is_true(got, "PodScheduled")

        # No kubelet finishes a graceful deletion: kwok's pod-delete stage does.
        await kube.delete(POD, "p", namespace)

        async def gone() -> bool:
            return await get_or_none(kube, POD, "p", namespace) is None

        await eventually(gone, timeout=30, what="the deleted pod to go away")
    finally:
        await delete_quietly(kube, NODE, node)


async def test_garbage_collector_deletes_dependents_of_a_deleted_owner(
    kube: Kube, namespace: str
) -> None:
    owner = await kube.create(CONFIG_MAP, {"metadata": {"name": "owner"}}, namespace)
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    await kube.create(
        CONFIG_MAP, {"metadata": {"name": "dependent", "ownerReferences": [reference]}}, namespace
    )
    await kube.delete(CONFIG_MAP, "owner", namespace)

    async def gone() -> bool:
        return await get_or_none(kube, CONFIG_MAP, "dependent", namespace) is None

    await eventually(gone, timeout=60, what="the garbage collector to delete the dependent")


@pytest.mark.timeout(180)
async def test_kueue_admits_a_job_whose_pods_run_on_kwok_nodes(kube: Kube, namespace: str) -> None:
    pool = unique("pool")
    nodes = await _ready_kwok_nodes(kube, pool, 2)
    flavor, queue = unique("e2e-flavor"), unique("e2e-cq")
    try:
        await kube.create(
            RESOURCE_FLAVOR,
            {
                "metadata": {"name": flavor},
                # Kueue adds these to the pods it admits: they land in the pool.
                "spec": {"nodeLabels": {POOL_LABEL: pool}, "tolerations": [KWOK_TOLERATION]},
            },
        )
        quota = [{"name": "cpu", "nominalQuota": "4"}, {"name": "memory", "nominalQuota": "8Gi"}]
        await kube.create(
            CLUSTER_QUEUE,
            {
                "metadata": {"name": queue},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory"],
                            "flavors": [{"name": flavor, "resources": quota}],
                        }
                    ],
                },
            },
        )
        await kube.create(
            LOCAL_QUEUE, {"metadata": {"name": "lq"}, "spec": {"clusterQueue": queue}}, namespace
        )
        job = await kube.create(
            JOB,
            {
                "metadata": {"name": "job", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                "spec": {
                    "parallelism": 2,
                    "completions": 2,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [container({"cpu": "1", "memory": "1Gi"})],
                        }
                    },
                },
            },
            namespace,
        )
        assert job["spec"]["suspend"] is True  # Kueue's Job webhook suspends queued jobs

        async def admitted_workload() -> Obj | None:
            listing = await kube.list_objects(WORKLOAD, namespace)
            for workload in listing["items"]:
                owners = workload["metadata"].get("ownerReferences") or []
                if any(o["uid"] == job["metadata"]["uid"] for o in owners) and is_true(
                    workload, "Admitted"
                ):
                    return dict(workload)
            return None

        workload = await eventually(admitted_workload, timeout=60, what="an Admitted Workload")
        assert workload["status"]["admission"]["clusterQueue"] == queue

        async def running_pods() -> list[Obj] | None:
            listing = await kube.list_objects(
                POD, namespace, label_selector="batch.kubernetes.io/job-name=job"
            )
            pods = [p for p in listing["items"] if p["status"].get("phase") == "Running"]
            return pods if len(pods) == 2 else None

        pods = await eventually(running_pods, timeout=60, what="2 running job pods")
        assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
        assert all(p["spec"]["nodeSelector"] == {POOL_LABEL: pool} for p in pods)
        unsuspended = await kube.get(JOB, "job", namespace)
        assert unsuspended["spec"]["suspend"] is False
    finally:
        await delete_quietly(kube, JOB, "job", namespace)
        await delete_quietly(kube, LOCAL_QUEUE, "lq", namespace)
        await delete_quietly(kube, CLUSTER_QUEUE, queue)
        await delete_quietly(kube, RESOURCE_FLAVOR, flavor)
        for node in nodes:
            await delete_quietly(kube, NODE, node)


async def _provisioning_request(
    kube: Kube, namespace: str, group: str, count: int, name: str = "pr"
) -> None:
    """PodTemplate first (cluster-autoscaler fails a request whose template is missing), then
    a best-effort-atomic request for ``count`` pods that each need a whole 8-GPU node."""
    template = {
        "metadata": {"name": f"{name}-template"},
        "template": {
            "spec": {
                "containers": [
                    container(
                        {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8"},
                        {"nvidia.com/gpu": "8"},
                    )
                ],
                "nodeSelector": {NODE_GROUP_LABEL: group},
                "tolerations": [GPU_TAINT.toleration()],
            }
        },
    }
    await kube.create(POD_TEMPLATE, template, namespace)
    request = {
        "metadata": {"name": name},
        "spec": {
            "provisioningClassName": ATOMIC,
            "podSets": [{"podTemplateRef": {"name": f"{name}-template"}, "count": count}],
        },
    }
    await kube.create(PROVISIONING_REQUEST, request, namespace)


async def _group_nodes(kube: Kube, group: str) -> list[Obj]:
    listing = await kube.list_objects(NODE, label_selector=f"{NODE_GROUP_LABEL}={group}")
    return list(listing["items"])


async def _new_nodes(kube: Kube, group: str, before: set[str]) -> list[Obj]:
    return [n for n in await _group_nodes(kube, group) if n["metadata"]["name"] not in before]


def _conditions(obj: Obj) -> str:
    found = (obj.get("status") or {}).get("conditions") or []
    return "; ".join(
        f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}" for c in found
    )


@pytest.mark.timeout(300)
async def test_autoscaler_provisions_an_atomic_request_with_ready_kwok_nodes(
    kube: Kube, namespace: str, cluster: Cluster
) -> None:
    count = 3
    assert BIG.max >= count
    before = {n["metadata"]["name"] for n in await _group_nodes(kube, BIG.name)}
    began = time.monotonic()
    await _provisioning_request(kube, namespace, BIG.name, count)
    try:

        async def accepted() -> Obj | None:
            got = await kube.get(PROVISIONING_REQUEST, "pr", namespace)
            return got if is_true(got, "Accepted") else None

        await eventually(accepted, timeout=120, what="Accepted=True", interval=0.5)
        accepted_after = time.monotonic() - began

        async def provisioned() -> Obj | None:
            got = await kube.get(PROVISIONING_REQUEST, "pr", namespace)
            return got if is_true(got, "Provisioned") else None

        request = await eventually(provisioned, timeout=120, what="Provisioned=True", interval=0.5)
        provisioned_after = time.monotonic() - began
        assert not is_true(request, "Failed"), _conditions(request)
        at_provisioned = await _new_nodes(kube, BIG.name, before)
        ready_at_provisioned = sum(map(node_ready, at_provisioned))

        async def new_ready_nodes() -> list[Obj] | None:
            nodes = await _new_nodes(kube, BIG.name, before)
            return nodes if len(nodes) == count and all(map(node_ready, nodes)) else None

        nodes = await eventually(new_ready_nodes, timeout=120, what=f"{count} new Ready nodes")
        ready_after = time.monotonic() - began
        for node in nodes:
            allocatable = node["status"]["allocatable"]
            assert allocatable["nvidia.com/gpu"] == "8"
            assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
            # (cluster-autoscaler may add and remove its soft DeletionCandidate taint too)
            assert GPU_TAINT.to_dict() in node["spec"]["taints"]
        cluster.record(
            f"atomic ProvisioningRequest for {count} nodes of {BIG.name} (max {BIG.max}): "
            f"Accepted after {accepted_after:.1f}s, Provisioned after {provisioned_after:.1f}s, "
            f"{count} nodes Ready after {ready_after:.1f}s (when Provisioned was seen: "
            f"{len(at_provisioned)} nodes, {ready_at_provisioned} Ready); "
            f"conditions: {_conditions(request)}"
        )
    finally:
        await delete_quietly(kube, PROVISIONING_REQUEST, "pr", namespace)
        # Keep the group empty for later tests (scale-down would take its unneeded time).
        for node in await _new_nodes(kube, BIG.name, before):
            await delete_quietly(kube, NODE, node["metadata"]["name"])


#: The autoscaler's loops watched after its refusal for anything partial.
LOOPS_AFTER_REFUSAL = 3


async def _autoscaler_loops(kube: Kube, loops: int) -> None:
    """Return once cluster-autoscaler has finished ``loops`` more loops: each ends writing
    its status ConfigMap (kube-system/cluster-autoscaler-status, with the loop's time), so
    its resourceVersion moves once per loop."""
    seen: list[str] = []

    async def versions() -> list[str] | None:
        status = await get_or_none(kube, CONFIG_MAP, STATUS_CONFIG_MAP, "kube-system")
        version = status["metadata"]["resourceVersion"] if status is not None else ""
        if version and version not in seen:
            seen.append(version)
        return seen if len(seen) > loops else None

    await eventually(versions, timeout=60, interval=0.2, what=f"{loops} autoscaler loops")


@pytest.mark.timeout(300)
async def test_autoscaler_does_not_provision_beyond_a_groups_max(
    kube: Kube, namespace: str, cluster: Cluster
) -> None:
    count = SMALL.max + 1
    began = time.monotonic()
    await _provisioning_request(kube, namespace, SMALL.name, count)
    try:

        async def decided() -> Obj | None:
            got = await kube.get(PROVISIONING_REQUEST, "pr", namespace)
            provisioned = condition(got, "Provisioned")
            settled = is_true(got, "Failed") or (
                provisioned is not None and provisioned["status"] == "False"
            )
            return got if settled else None

        request = await eventually(decided, timeout=120, what="a refusal", interval=0.5)
        decided_after = time.monotonic() - began
        assert not is_true(request, "Provisioned"), _conditions(request)
        # Nothing partial either: the autoscaler's next loops (it writes its status ConfigMap
        # at the end of each) make no node and do not turn the request Provisioned.
        await _autoscaler_loops(kube, LOOPS_AFTER_REFUSAL)
        again = await kube.get(PROVISIONING_REQUEST, "pr", namespace)
        assert not is_true(again, "Provisioned"), _conditions(again)
        assert await _group_nodes(kube, SMALL.name) == []
        cluster.record(
            f"atomic ProvisioningRequest for {count} nodes of {SMALL.name} (max {SMALL.max}): "
            f"refused after {decided_after:.1f}s, no node created; conditions then: "
            f"{_conditions(request)}; {LOOPS_AFTER_REFUSAL} autoscaler loops later: "
            f"{_conditions(again)}"
        )
    finally:
        await delete_quietly(kube, PROVISIONING_REQUEST, "pr", namespace)


@pytest.mark.soak  # 65 s of waiting for a heartbeat timeout (docs/testing.md)
@pytest.mark.timeout(180)
async def test_kwok_nodes_stay_ready_past_the_node_monitor_grace_period(kube: Kube) -> None:
    """kube-controller-manager's node lifecycle controller marks a node unreachable when its
    heartbeat (the Lease in kube-node-lease) is older than --node-monitor-grace-period (50 s);
    kwok renews the lease (--node-lease-duration-seconds=40)."""
    (node,) = await _ready_kwok_nodes(kube, unique("pool"), 1)
    try:
        lease = await eventually(
            lambda: get_or_none(kube, LEASE, node, "kube-node-lease"), what="the node's lease"
        )
        await asyncio.sleep(65)
        later = await kube.get(NODE, node)
        assert node_ready(later), _conditions(later)
        lifecycle = [t for t in later["spec"].get("taints", []) if t["key"].startswith("node.")]
        assert lifecycle == []
        renewed = await kube.get(LEASE, node, "kube-node-lease")
        assert renewed["spec"]["renewTime"] > lease["spec"]["renewTime"]
    finally:
        await delete_quietly(kube, NODE, node)
