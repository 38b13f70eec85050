"""Capacity that arrives for a gang belongs to that gang, with the real kube-scheduler.

Three gangs go through gangcheck's check on one node group while a stream of unrelated pods,
which would fit on the same nodes, waits for capacity. The node group's nodes come from the
simulated cloud (it answers ProvisioningRequests by creating real Node objects, which kwok
runs) and register closed (the arrival taint); gangcheck records each for a request, holding
it for that gang until the gang has started, and opens the node nobody waits for.

Every assertion is on what stays: where each pod is bound, what each node is recorded for,
its taints at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gangcheck_dev.testbed.deploy import ManagedProcess
from gangcheck_dev.testbed.nodes import Taint, kwok_node

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import NODE, POD, WORKLOAD
from gangcheck.logic.attempt.hold import ARRIVING_TAINT, HOLD_TAINT
from tests.e2e.conftest import GPU_TAINT, Cluster
from tests.e2e.helpers import container, delete_quietly, eventually, unique
from tests.e2e.test_gangcheck import (  # the module's processes, reused
    ARRIVED_FOR,
    GPU,
    GPU_TYPE,
    JOB,
    SIM_CLASS,
    SIM_POOL,
    SimCloud,
    controller,  # noqa: F401
    delete_nodes,
    gang_job,
    gpu_queue,
    job_pods,
    nodes_with,
    our_config,
    running,
    sim,  # noqa: F401
    sim_group,
    workdir,  # noqa: F401
)

Obj = dict[str, Any]
ARRIVING = {"key": ARRIVING_TAINT, "value": "true", "effect": "NoSchedule"}
CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
GANGS = {"g1": 2, "g2": 1, "g3": 2}
OTHERS = 6
STREAM_INTERVAL = 1.0


def other_pod(name: str, pool: str) -> Obj:
    """A pod of nobody's gang that would fit on any node of the pool, were it open to it."""
    return {
        "metadata": {"name": name, "labels": {"app": "unrelated"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                container({"cpu": "1", "memory": "1Gi", GPU: "8"}, {GPU: "8"}),
            ],
            "nodeSelector": {SIM_POOL: pool},
            "tolerations": [GPU_TAINT.toleration()],
        },
    }


@contextlib.asynccontextmanager
async def stream_of_others(kube: Kube, namespace: str, pool: str) -> AsyncIterator[list[str]]:
    """Creates an unrelated pending pod every STREAM_INTERVAL seconds, OTHERS in all."""
    names: list[str] = []

    async def stream() -> None:
        for i in range(OTHERS):
            name = f"other-{i}"
            await kube.create(POD, other_pod(name, pool), namespace)
            names.append(name)
            await asyncio.sleep(STREAM_INTERVAL)  # the pace of the stream, not a wait

    task = asyncio.create_task(stream())
    try:
        yield names
    finally:
        await task
        for name in names:
            await delete_quietly(kube, POD, name, namespace)


@pytest.mark.timeout(300)
async def test_three_gangs_run_on_their_own_held_nodes_and_no_other_pod_lands_there(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: ManagedProcess | None,  # noqa: F811
    sim: SimCloud,  # noqa: F811
) -> None:
    pool = unique("held")
    group = {**sim_group(pool, 8), "taints": [GPU_TAINT.to_dict(), ARRIVING]}
    sim.configure(group)
    selector = f"{SIM_POOL}={pool}"
    labels = {GPU_TYPE: "e2e", SIM_POOL: pool}
    config = our_config(klass=SIM_CLASS, deadline=90)
    # A node of the pool that no gang can use (it lacks the GPU type the gangs ask for), closed
    # like the others: nobody waits for it, so gangcheck opens it, and an unrelated pod runs.
    spare = f"{pool}-spare"
    taints = [GPU_TAINT, Taint(ARRIVING_TAINT, "true")]
    await kube.create(NODE, kwok_node(spare, gpus=8, labels={SIM_POOL: pool}, taints=taints))
    try:
        async with (
            gpu_queue(kube, namespace, labels, ours=config),
            stream_of_others(kube, namespace, pool) as others,
        ):
            for name, count in GANGS.items():
                await kube.create(JOB, gang_job(name, count, 8, {SIM_POOL: pool}), namespace)

            async def all_running() -> bool:
                pods = [await job_pods(kube, namespace, name) for name in GANGS]
                return all(len(running(p)) == GANGS[n] for n, p in zip(GANGS, pods, strict=True))

            try:
                await eventually(all_running, timeout=180, interval=1, what="every gang Running")
            except AssertionError as e:
                raise AssertionError(f"{e}\n{await story(kube, namespace, selector)}") from None
            figures = await where_everything_runs(kube, namespace, selector, others)
            figures_text = f"{figures}\n{await story(kube, namespace, selector)}"
            assert figures["gang pods on nodes not recorded for their gang"] == 0, figures_text
            assert figures["pods on a node recorded for another gang"] == 0, figures_text
            assert figures["unrelated pods on a gang's node"] == 0, figures_text

            async def spare_used() -> bool:
                on_spare = await kube.list_objects(
                    POD, namespace, field_selector=f"spec.nodeName={spare}"
                )
                return bool(on_spare["items"])

            await eventually(spare_used, timeout=30, what="an unrelated pod on the opened spare")
            spare_taints = (await kube.get(NODE, spare))["spec"].get("taints") or []
            assert [t["key"] for t in spare_taints] == [GPU_TAINT.key]

            async def hold_lifted() -> bool:
                return not any(_held(n) for n in await nodes_with(kube, selector))

            await eventually(hold_lifted, timeout=30, what="the hold lifted once gangs started")
            cluster.record(
                f"f. three gangs {GANGS} and {OTHERS} unrelated pods on one node group: "
                + ", ".join(f"{k}: {v}" for k, v in figures.items())
            )
    finally:
        for name in GANGS:
            await delete_quietly(kube, JOB, name, namespace)
        await delete_nodes(kube, await nodes_with(kube, selector))
        await delete_quietly(kube, NODE, spare)


async def where_everything_runs(
    kube: Kube, namespace: str, selector: str, others: list[str]
) -> dict[str, int]:
    """Counts, from where pods are bound and what nodes are recorded for."""
    recorded = {
        n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR, "")
        for n in await nodes_with(kube, selector)
    }
    pods = (await kube.list_objects(POD, namespace))["items"]
    bound = [p for p in pods if p["spec"].get("nodeName")]
    gang_pods = [p for p in bound if CONSUME in (p["metadata"].get("annotations") or {})]
    unrelated = [p for p in bound if p["metadata"]["name"] in others]

    def request_of(pod: Obj) -> str:
        return f"{namespace}/{pod['metadata']['annotations'][CONSUME]}"

    # The requests the gangs run on (a node a rollback kept keeps its old record).
    gangs = {request_of(p) for p in gang_pods}

    return {
        "gang pods": len(gang_pods),
        "gang pods on nodes not recorded for their gang": sum(
            recorded.get(p["spec"]["nodeName"]) != request_of(p) for p in gang_pods
        ),
        "pods on a node recorded for another gang": sum(
            recorded.get(p["spec"]["nodeName"], "") not in ("", request_of(p)) for p in gang_pods
        ),
        "unrelated pods bound": len(unrelated),
        "unrelated pods on a gang's node": sum(
            recorded.get(p["spec"]["nodeName"]) in gangs for p in unrelated
        ),
    }


def _held(node: Obj) -> bool:
    return any(t["key"] == HOLD_TAINT for t in node["spec"].get("taints") or [])


async def story(kube: Kube, namespace: str, selector: str) -> str:
    """What the nodes, pods and gangs look like, for a failure message."""
    lines = []
    for n in await nodes_with(kube, selector):
        notes = n["metadata"].get("annotations") or {}
        taints = [t["key"] for t in n["spec"].get("taints") or []]
        lines.append(f"node {n['metadata']['name']}: {notes.get(ARRIVED_FOR)} {taints}")
    for p in (await kube.list_objects(POD, namespace))["items"]:
        phase = (p.get("status") or {}).get("phase")
        lines.append(f"pod {p['metadata']['name']}: {p['spec'].get('nodeName')} {phase}")
    for w in (await kube.list_objects(WORKLOAD, namespace))["items"]:
        checks = [
            f"{c.get('state')}: {c.get('message')}"
            for c in (w.get("status") or {}).get("admissionChecks") or []
        ]
        lines.append(f"workload {w['metadata']['name']}: {checks}")
    return "\n".join(lines)
