"""One partial delivery, two ways: gangcheck (NodesFit) beside Kueue's behaviour (TrustProvisioned).

Both run in the same control plane against the same simulated cloud, at the same time: a
16-member gang (one GPU each, one GPU per node) whose first request gets 11 nodes; every later
request gets all 16. The script plays Kueue core (admits on Ready, evicts and requeues on
Retry after requeueAfterSeconds). A gang "starts" once its check is Ready AND all 16 members,
as Kueue would start them (the check's podSetUpdates merged in), fit on the nodes of its pool
(judged with gangcheck's own fit logic: there is no kubelet here).

Figures per mode, within the horizon:
- time to start: seconds from the first quota reservation to the start, or "did not start";
- stranded node-minutes: node time of pool nodes while the gang had not started (capacity
  billed for a gang that was not running), summed from each node's creation to the start (or
  the end of the horizon, or the node's deletion).

Usage: python benchmarks/partial_delivery.py [--horizon SECONDS] [--kubeconfig FILE]
Without --kubeconfig it starts (and stops) a local control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gangcheck_dev.simcloud.cloud import SimCloud
from gangcheck_dev.testbed.binaries import CONTROL_PLANE, ensure_binaries
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.app import Controller
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import CONFIG_MAP, NODE
from gangcheck.logic.placement.fit import GangPodSet, fit_gang, member_from_template, node_view
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster

MEMBERS, DELIVERED = 16, 11


@dataclass
class Run:
    mode: str
    cluster: Cluster
    builder: WorkloadBuilder
    reserved_at: float = 0.0
    started_at: float | None = None
    attempts: int = 1
    node_first_seen: dict[str, float] = field(default_factory=dict)
    node_gone: dict[str, float] = field(default_factory=dict)


def config(mode: str) -> dict[str, Any]:
    return {
        "fulfillment": {"mode": mode, "deadlineSeconds": 8, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 5, "backoffBaseSeconds": 2, "backoffMaxSeconds": 8},
    }


def sim_config(namespaces: list[str], pools: dict[str, str]) -> dict[str, Any]:
    groups = [
        {"name": f"g-{ns}", "maxNodes": 40, "cpu": "16", "memory": "64Gi", "gpus": 1,
         "labels": {"pool": pools[ns]}}
        for ns in namespaces
    ]  # fmt: skip
    rules = [
        {"name": f"partial-{ns}", "match": {"namespace": ns, "name": ".*-1"}, "deliver": DELIVERED,
         "nodeDelaySeconds": 1}
        for ns in namespaces
    ]  # fmt: skip
    rules.append({"name": "full", "nodeDelaySeconds": 1})
    return {"namespaces": namespaces, "nodeGroups": groups, "scenarios": rules}


async def pool_nodes(kube: Kube, pool: str) -> list[dict[str, Any]]:
    listing = await kube.list_objects(NODE, label_selector=f"pool={pool}")
    return list(listing.get("items") or [])


def gang_fits(nodes: list[dict[str, Any]], check: dict[str, Any]) -> bool:
    """Whether the 16 members fit as Kueue would start them: the pod set's template with the
    check's podSetUpdates merged in (gangcheck's hold toleration and node selector among them:
    the nodes it holds for the gang are tainted for everyone else)."""
    update = next((u for u in check.get("podSetUpdates") or [] if u["name"] == "workers"), {})
    template = pod_template(
        gpu=1,
        tolerations=list(update.get("tolerations") or []),
        node_selector=dict(update.get("nodeSelector") or {}),
    )
    member = member_from_template(template)
    return fit_gang([GangPodSet("workers", MEMBERS, member)], [node_view(n) for n in nodes]).fits


async def play_kueue(run: Run, horizon_end: float) -> None:
    """Kueue core for one Workload, and the node ledger for the stranded figure."""
    c = run.cluster
    requeue_at: float | None = None
    while time.monotonic() < horizon_end and run.started_at is None:
        now = time.monotonic()
        nodes = await pool_nodes(c.kube, c.ns)
        names = {n["metadata"]["name"] for n in nodes}
        for name in names:
            run.node_first_seen.setdefault(name, now)
        for name in set(run.node_first_seen) - names:
            run.node_gone.setdefault(name, now)
        check = await c.check_state("wl")
        state = check["state"]
        if state == "Ready" and gang_fits(nodes, check):
            run.started_at = now
        elif state == "Retry" and requeue_at is None:
            delay = check.get("requeueAfterSeconds") or 0
            await c.evict_and_requeue("wl")
            requeue_at = now + float(delay)
        elif requeue_at is not None and now >= requeue_at:
            await c.reserve_again("wl", run.builder)
            run.attempts += 1
            requeue_at = None
        await asyncio.sleep(0.2)


def stranded_minutes(run: Run, horizon_end: float) -> float:
    until = run.started_at or horizon_end
    total = 0.0
    for name, seen in run.node_first_seen.items():
        end = min(run.node_gone.get(name, until), until)
        total += max(0.0, end - seen)
    return total / 60


async def main_async(kubeconfig: str, horizon: float) -> list[dict[str, Any]]:
    async with await Kube.connect(kubeconfig) as kube:
        runs = []
        for mode in ("NodesFit", "TrustProvisioned"):
            cluster = await Cluster.create(kube)
            await cluster.install_check(config(mode))
            builder = (
                WorkloadBuilder("wl").pod_set("workers", MEMBERS, pod_template(gpu=1))
                .reserve_quota().check()
            )  # fmt: skip
            runs.append(Run(mode, cluster, builder))
        namespaces = [r.cluster.ns for r in runs]
        sim_ns = namespaces[0]
        await kube.create(CONFIG_MAP, {
            "metadata": {"name": "sim-cloud", "namespace": sim_ns},
            "data": {"config": json.dumps(sim_config(namespaces, {ns: ns for ns in namespaces}))},
        })  # fmt: skip
        controller = Controller(kube, workers=4)
        sim = SimCloud(kube, f"{sim_ns}/sim-cloud")
        tasks = [asyncio.create_task(controller.run()), asyncio.create_task(sim.run())]
        try:
            await asyncio.wait_for(controller.caches.wait_synced(), 30)
            await sim.ready.wait()
            horizon_end = time.monotonic() + horizon
            for run in runs:
                run.reserved_at = time.monotonic()
                await run.cluster.submit(run.builder)
            await asyncio.gather(*(play_kueue(r, horizon_end) for r in runs))
            end = min(horizon_end, time.monotonic())
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for run in runs:
                for n in await pool_nodes(kube, run.cluster.ns):
                    with contextlib.suppress(NotFoundError):
                        await kube.delete(NODE, n["metadata"]["name"])
        return [report(run, end) for run in runs]


def report(run: Run, end: float) -> dict[str, Any]:
    started = run.started_at - run.reserved_at if run.started_at else None
    label = (
        "gangcheck (NodesFit)" if run.mode == "NodesFit" else "Kueue's behaviour (TrustProvisioned)"
    )
    return {
        "mode": label,
        "time_to_start_s": None if started is None else round(started, 1),
        "stranded_node_minutes": round(stranded_minutes(run, end), 2),
        "attempts": run.attempts,
        "nodes_seen": len(run.node_first_seen),
    }


def print_table(rows: list[dict[str, Any]], horizon: float) -> None:
    head = f"partial delivery: {DELIVERED} of {MEMBERS} nodes on the first attempt"
    print(f"{head}; horizon {horizon:.0f}s")
    columns = ("mode", "time to start", "stranded node-min", "attempts", "nodes")
    print(f"{columns[0]:40} {columns[1]:>14} {columns[2]:>18} {columns[3]:>9} {columns[4]:>6}")
    for r in rows:
        start = "did not start" if r["time_to_start_s"] is None else f"{r['time_to_start_s']}s"
        figures = f"{r['stranded_node_minutes']:>18} {r['attempts']:>9} {r['nodes_seen']:>6}"
        print(f"{r['mode']:40} {start:>14} {figures}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--horizon", type=float, default=90.0)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    if args.kubeconfig:
        rows = asyncio.run(main_async(args.kubeconfig, args.horizon))
    else:
        with ControlPlane(binaries=ensure_binaries(CONTROL_PLANE)) as plane:
            rows = asyncio.run(main_async(str(plane.kubeconfig), args.horizon))
    print_table(rows, args.horizon)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
