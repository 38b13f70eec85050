"""Karpenter in the local stack: pending pods become NodeClaims, then Ready kwok nodes that run
the pods; Karpenter takes cluster-autoscaler's place, never its side."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed import ControlPlane
from gangcheck_dev.testbed.karpenter import (
    GPU_8X,
    NODE_CLAIMS,
    NODE_POOL_LABEL,
    InstanceType,
    NodePool,
    write_instance_types,
)
from gangcheck_dev.testbed.nodes import GPU_RESOURCE, Taint
from gangcheck_dev.testbed.process import pid_alive, port_is_free
from gangcheck_dev.testbed.rest import RestClient
from gangcheck_dev.testbed.stack import FULL_STACK
from gangcheck_dev.testbed.stack import KARPENTER as KARPENTER_COMPONENT

pytestmark = pytest.mark.integration
GPU_TAINT = Taint(GPU_RESOURCE, "present", "NoSchedule")


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def _gpu_pod(name: str) -> dict[str, Any]:
    gpus = {GPU_RESOURCE: "8"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": gpus, "limits": gpus}}
            ],
            "tolerations": [GPU_TAINT.toleration()],
        },
    }


def _is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_instance_types_file_is_what_the_kwok_provider_reads(tmp_path: Path) -> None:
    path = write_instance_types(tmp_path / "types.json", [GPU_8X])
    (entry,) = json.loads(path.read_text())
    assert entry["name"] == "gpu-8x-amd64-linux"
    assert entry["resources"][GPU_RESOURCE] == "8"
    assert {r["key"] for o in entry["offerings"] for r in o["Requirements"]} == {
        "karpenter.sh/capacity-type",
        "topology.kubernetes.io/zone",
    }
    with pytest.raises(ValueError, match="distinct names"):
        write_instance_types(tmp_path / "twice.json", [GPU_8X, GPU_8X])


def test_node_pool_limits_taints_and_consolidation() -> None:
    pool = NodePool("gpu", limits={"nodes": "3"}, taints=(GPU_TAINT,), consolidation=None)
    spec = pool.to_dict()["spec"]
    assert spec["limits"] == {"nodes": "3"}
    assert spec["disruption"] == {"consolidateAfter": "Never"}
    assert spec["template"]["spec"]["taints"] == [GPU_TAINT.to_dict()]
    assert spec["template"]["spec"]["nodeClassRef"]["kind"] == "KWOKNodeClass"


def test_karpenter_replaces_cluster_autoscaler_never_joins_it() -> None:
    plane = ControlPlane(components=FULL_STACK, autoscaler="karpenter")
    assert plane.requested[-1] == KARPENTER_COMPONENT
    assert "cluster-autoscaler" not in plane.requested
    assert "karpenter" in plane.families
    with pytest.raises(ValueError, match="choose one autoscaler"):
        ControlPlane(components=["autoscaler", "karpenter"])
    with pytest.raises(ValueError, match="unknown component 'keda'"):
        ControlPlane(components=FULL_STACK, autoscaler="keda")


@pytest.mark.soak  # the e2e Karpenter package runs the same pipeline in make test
@pytest.mark.timeout(240)
def test_pending_pods_become_nodeclaims_ready_nodes_and_running_pods(
    karpenter_binaries: dict[str, Path],
) -> None:
    pool = NodePool("gpu", taints=(GPU_TAINT,), labels={"gangcheck.io/gpu-type": "kwok"})
    cpu_only = InstanceType("c-2x-amd64-linux", cpu="2", memory="8Gi", price=0.1)
    plane = ControlPlane(
        binaries=karpenter_binaries,
        components=["scheduler", "controller-manager", "kwok", "autoscaler"],
        autoscaler="karpenter",
        node_pools=[pool],
        instance_types=[GPU_8X, cpu_only],
    )
    with plane:
        admin = plane.client()
        for name in ("p0", "p1"):
            admin.create("/api/v1/namespaces/default/pods", _gpu_pod(name))
        pods = _until(lambda: _running(admin, ["p0", "p1"]), 120, "both pods Running")
        # Karpenter marks a claim Initialized a moment after its node turns Ready (the pods
        # may run first): wait for that record rather than read it at one poll.
        claims = _until(lambda: _initialized(admin, 2), 60, "both NodeClaims Initialized")
        nodes = {n["metadata"]["name"]: n for n in admin.get("/api/v1/nodes")["items"]}
        pids = [c.pid for c in plane.components.values()]
        ports = [p for by_use in plane.addon_ports().values() for p in by_use.values()]
        root = plane.root

    # One 8-GPU node per pod: two NodeClaims of the pool, each launched, registered and
    # initialized, each naming the Ready kwok node its pod runs on.
    assert len(claims) == 2
    assert {c["metadata"]["labels"][NODE_POOL_LABEL] for c in claims} == {"gpu"}
    for claim in claims:
        conditions = {c["type"]: c["status"] for c in claim["status"]["conditions"]}
        assert conditions["Launched"] == conditions["Registered"] == "True"
        assert conditions["Initialized"] == "True"
    claimed = {c["status"]["nodeName"] for c in claims}
    assert {p["spec"]["nodeName"] for p in pods} == claimed
    for name in claimed:
        node = nodes[name]
        assert _is_ready(node)
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == GPU_8X.name
        assert node["metadata"]["labels"]["gangcheck.io/gpu-type"] == "kwok"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
    # Stopping leaves no process, port or folder behind.
    assert not any(pid is not None and pid_alive(pid) for pid in pids)
    assert all(port_is_free(port) for port in ports)
    assert not root.exists()


def _initialized(admin: RestClient, count: int) -> list[dict[str, Any]] | None:
    claims: list[dict[str, Any]] = admin.get(NODE_CLAIMS)["items"]
    done = [
        c
        for c in claims
        if any(
            x["type"] == "Initialized" and x["status"] == "True"
            for x in (c.get("status") or {}).get("conditions") or []
        )
    ]
    return claims if len(claims) >= count and len(done) == len(claims) else None


def _running(admin: RestClient, names: list[str]) -> list[dict[str, Any]] | None:
    pods = [admin.get(f"/api/v1/namespaces/default/pods/{name}") for name in names]
    return pods if all(p.get("status", {}).get("phase") == "Running" for p in pods) else None
