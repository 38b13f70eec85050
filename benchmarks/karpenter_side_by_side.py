"""A 4 x 8-GPU gang on real Karpenter, two ways, side by side: Kueue alone (the Job admitted on
quota, its pods created, Karpenter provisioning for them) and Kueue with gangcheck's check on
the Karpenter backend (gangcheck creates the gang's NodeClaims itself, all or nothing).

Both arms run at the same time in one local stack (kube-apiserver, kube-scheduler, Kueue,
kwok, Karpenter v1.15 with its kwok provider), each in a namespace and NodePool of its own with
the same spec. Two scenarios:

- ``limits``: the NodePool's limits allow 3 of the 4 nodes (24 GPUs);
- ``room``: no limits.

Per arm, sampled every 0.5 s until every member runs or the horizon passes:
- time to start: seconds from the Job's creation until all 4 pods are Running;
- stranded node-minutes: node time of the arm's NodePool while the gang was not running;
- max nodes, and nodes left at the end.

Usage: python benchmarks/karpenter_side_by_side.py [--horizon SECONDS] [--scenario limits|room]
It starts (and stops) the stack and gangcheck (as a process with its ServiceAccount's rights).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from gangcheck_dev.testbed.deploy import deploy_gangcheck
from gangcheck_dev.testbed.karpenter import GPU_8X, NodePool
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.nodes import GPU_RESOURCE, Taint
from gangcheck_dev.testbed.stack import FULL_STACK

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NAMESPACE,
    NODE,
    NODE_CLAIM,
    NODE_POOL,
    POD,
    RESOURCE_FLAVOR,
)

Obj = dict[str, Any]
MEMBERS = 4
GPU_TAINT = Taint(GPU_RESOURCE, "present", "NoSchedule")
POOL_LABEL = "gangcheck.io/bench-pool"
SAMPLE = 0.5


@dataclass
class Outcome:
    arm: str
    started_after: float | None = None
    stranded_node_seconds: float = 0.0
    max_nodes: int = 0
    nodes_left: int = 0


def gangcheck_config(pool: str) -> Obj:
    return {
        "backend": "Karpenter",
        "karpenter": {"nodePools": [pool]},
        "managedResources": [GPU_RESOURCE],
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 5, "backoffMaxSeconds": 10},
        "fulfillment": {"deadlineSeconds": 60, "reclaimer": "DeleteNodeClaim"},
    }


async def make_arm(kube: Kube, arm: str, limits: dict[str, str]) -> tuple[str, str]:
    """Namespace, NodePool, flavor and queues of one arm; returns (namespace, pool)."""
    name = f"bench-{arm}-{int(time.time()) % 100000}"
    await kube.create(NAMESPACE, {"metadata": {"name": name}})
    labels = {POOL_LABEL: name}
    pool = NodePool(
        name, instance_types=(GPU_8X.name,), labels=labels, taints=(GPU_TAINT,), limits=limits
    )
    await kube.create(NODE_POOL, pool.to_dict())
    flavor = {
        "nodeLabels": labels,
        "nodeTaints": [GPU_TAINT.to_dict()],
        "tolerations": [GPU_TAINT.toleration()],
    }
    await kube.create(RESOURCE_FLAVOR, {"metadata": {"name": name}, "spec": flavor})
    spec: Obj = {"namespaceSelector": {}, "resourceGroups": [_quota(name)]}
    if arm == "gangcheck":
        await kube.create(
            ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": gangcheck_config(name)}
        )
        check = {
            "controllerName": "gangcheck.io/atomic-provisioning",
            "parameters": {
                "apiGroup": "gangcheck.io",
                "kind": "AtomicProvisioningConfig",
                "name": name,
            },
        }
        await kube.create(ADMISSION_CHECK, {"metadata": {"name": name}, "spec": check})
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": name}]}
    await kube.create(CLUSTER_QUEUE, {"metadata": {"name": name}, "spec": spec})
    await kube.create(
        LOCAL_QUEUE, {"metadata": {"name": "lq"}, "spec": {"clusterQueue": name}}, name
    )
    return name, name


def _quota(flavor: str) -> Obj:
    quota = [
        {"name": "cpu", "nominalQuota": "1000"},
        {"name": "memory", "nominalQuota": "10Ti"},
        {"name": GPU_RESOURCE, "nominalQuota": "256"},
    ]
    return {
        "coveredResources": ["cpu", "memory", GPU_RESOURCE],
        "flavors": [{"name": flavor, "resources": quota}],
    }


def gang_job() -> Obj:
    gpus = {GPU_RESOURCE: "8"}
    return {
        "metadata": {"name": "gang", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "suspend": True,
            "parallelism": MEMBERS,
            "completions": MEMBERS,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "resources": {"requests": {"cpu": "1", **gpus}, "limits": gpus},
                        }
                    ],
                    "tolerations": [GPU_TAINT.toleration()],
                }
            },
        },
    }


async def pool_nodes(kube: Kube, pool: str) -> list[Obj]:
    listed = await kube.list_objects(NODE, label_selector=f"karpenter.sh/nodepool={pool}")
    return list(listed["items"])


async def run_arm(kube: Kube, arm: str, namespace: str, pool: str, horizon: float) -> Outcome:
    outcome = Outcome(arm)
    await kube.create(JOB, gang_job(), namespace)
    began = last = time.monotonic()
    while True:
        nodes = await pool_nodes(kube, pool)
        pods = (await kube.list_objects(POD, namespace))["items"]
        ran = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        now = time.monotonic()
        outcome.max_nodes = max(outcome.max_nodes, len(nodes))
        if len(ran) == MEMBERS:
            outcome.started_after = now - began
            break
        outcome.stranded_node_seconds += len(nodes) * (now - last)
        last = now
        if now - began > horizon:
            break
        await asyncio.sleep(SAMPLE)
    outcome.nodes_left = len(await pool_nodes(kube, pool))
    return outcome


async def clean_up(kube: Kube, namespace: str, pool: str) -> None:
    for res, name, ns in (
        (JOB, "gang", namespace),
        (LOCAL_QUEUE, "lq", namespace),
        (CLUSTER_QUEUE, namespace, None),
        (ADMISSION_CHECK, namespace, None),
        (ATOMIC_CONFIG, namespace, None),
        (RESOURCE_FLAVOR, namespace, None),
        (NODE_POOL, pool, None),
    ):
        with contextlib.suppress(ApiError):
            await kube.delete(res, name, ns)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        claims = await kube.list_objects(NODE_CLAIM, label_selector=f"karpenter.sh/nodepool={pool}")
        if not claims["items"] and not await pool_nodes(kube, pool):
            break
        await asyncio.sleep(1)


async def scenario(kubeconfig: str, name: str, horizon: float) -> list[Outcome]:
    limits = {GPU_RESOURCE: "24"} if name == "limits" else {}
    async with await Kube.connect(kubeconfig) as kube:
        arms = [await make_arm(kube, arm, limits) for arm in ("kueue", "gangcheck")]
        await asyncio.sleep(3)  # the check turns Active, the NodePools Ready
        try:
            return list(
                await asyncio.gather(
                    *(
                        run_arm(kube, arm, ns, pool, horizon)
                        for arm, (ns, pool) in zip(("Kueue alone", "gangcheck"), arms, strict=True)
                    )
                )
            )
        finally:
            for ns, pool in arms:
                await clean_up(kube, ns, pool)


def table(name: str, outcomes: list[Outcome]) -> str:
    rows = [
        f"scenario {name}: {MEMBERS} x 8 GPUs"
        + (", NodePool limits 24 GPUs (3 of 4 nodes)" if name == "limits" else ", no limits"),
        f"{'arm':<14} {'time to start':>14} {'stranded node-min':>18} "
        f"{'max nodes':>10} {'left':>5}",
    ]
    for o in outcomes:
        started = "not started" if o.started_after is None else f"{o.started_after:.1f}s"
        rows.append(
            f"{o.arm:<14} {started:>14} {o.stranded_node_seconds / 60:>18.2f} "
            f"{o.max_nodes:>10} {o.nodes_left:>5}"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--horizon", type=float, default=60.0)
    parser.add_argument("--scenario", choices=("limits", "room", "both"), default="both")
    args = parser.parse_args()
    names = ("limits", "room") if args.scenario == "both" else (args.scenario,)
    with (
        ControlPlane(components=FULL_STACK, autoscaler="karpenter") as plane,
        tempfile.TemporaryDirectory(prefix="gangcheck-bench-") as workdir,
    ):
        process = deploy_gangcheck(
            Path(plane.kubeconfig),
            workdir=Path(workdir),
            components=("karpenter", "reclaim-nodeclaim"),
        )
        try:
            for name in names:
                outcomes = asyncio.run(scenario(str(plane.kubeconfig), name, args.horizon))
                print(table(name, outcomes), flush=True)
        finally:
            process.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
