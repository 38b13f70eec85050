"""Capacity sources in order, end to end on the full local stack with the real
cluster-autoscaler: two node groups of one flavor, the first too small for the gang. The
gang's first source (pinned to the small group) says CapacityIsNotFound; gangcheck leaves it
inside the same attempt, asks the second (pinned to the big group), and the gang runs there,
with no node in the first group and no retry of Kueue's used."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import JOB, PROVISIONING_REQUEST
from tests.e2e.conftest import Cluster
from tests.e2e.helpers import delete_quietly, events_of, eventually, is_true, messages
from tests.e2e.test_gangcheck import (  # noqa: F401 (fixtures)
    BIG,
    GPU,
    GPU_TYPE,
    NODE_GROUP_LABEL,
    SMALL,
    Timeline,
    _drain_and_delete_new_nodes,
    attempt_record,
    check_state,
    controller,
    gang_job,
    gpu_queue,
    job_pods,
    nodes_with,
    running,
    until,
    workdir,
    workload_of,
)

Obj = dict[str, Any]


def in_order(small_deadline: int) -> Obj:
    """The small group first, the big one next; Kueue's retries left at none, so only a
    fallback inside the attempt can start the gang."""
    return {
        "managedResources": [GPU],
        "capacitySources": [
            {
                "name": "small-pool",
                "nodeSelector": {NODE_GROUP_LABEL: SMALL.name},
                "deadlineSeconds": small_deadline,
            },
            {"name": "big-pool", "nodeSelector": {NODE_GROUP_LABEL: BIG.name}},
        ],
        "retryStrategy": {"backoffLimitCount": 0, "backoffBaseSeconds": 1},
        "fulfillment": {
            "mode": "NodesFit",
            "deadlineSeconds": 120,
            "startDeadlineSeconds": 120,
            "reclaimer": "DeleteNode",
        },
    }


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("controller")
async def test_in_order_the_gang_runs_from_the_second_source_when_the_first_cannot_hold_it(
    kube: Kube, namespace: str, cluster: Cluster
) -> None:
    count = SMALL.max + 1
    assert BIG.max >= count
    small, big = f"{NODE_GROUP_LABEL}={SMALL.name}", f"{NODE_GROUP_LABEL}={BIG.name}"
    assert await nodes_with(kube, small) == []
    before = {n["metadata"]["name"] for n in await nodes_with(kube, big)}
    timeline = Timeline()
    # the flavor leaves the node group open: each source's node labels choose it
    async with gpu_queue(kube, namespace, {GPU_TYPE: "e2e"}, ours=in_order(60)) as queue:
        began = time.monotonic()
        job = await kube.create(JOB, gang_job("gang", count, SMALL.gpus), namespace)
        try:

            async def all_running() -> list[Obj] | None:
                workload = await workload_of(kube, namespace, job)
                timeline.see(check_state(workload, queue.check))
                pods = running(await job_pods(kube, namespace, "gang"))
                return pods if len(pods) == count else None

            pods = await until(all_running, timeout=180, what="the gang Running", timeline=timeline)
            started_after = time.monotonic() - began
            workload = await workload_of(kube, namespace, job)
            assert workload is not None and is_true(workload, "Admitted")
            name = workload["metadata"]["name"]
            first, second = f"{name}-{queue.check}-1", f"{name}-{queue.check}-1-s1"
            # the gang runs on the second source's nodes, pinned there by its podSetUpdates
            on_big = {n["metadata"]["name"] for n in await nodes_with(kube, big)} - before
            assert {p["spec"]["nodeName"] for p in pods} <= on_big, (pods, on_big)
            assert await nodes_with(kube, small) == [], "a node was left in the first source"
            # durable records: one attempt, two requests, the first source left with a reason
            record = await attempt_record(kube, workload, queue.check)
            assert record.requests == sorted([first, second]), record
            assert not record.went_to("Retry"), record
            events = await events_of(kube, workload)
            (left,) = messages(events, "CapacitySourceFailed")
            assert "'small-pool'" in left and "'big-pool'" in left, left
            assert "CapacityIsNotFound" in left, left
            assert (workload["status"].get("admissionChecks") or [{}])[0].get("retryCount", 0) == 0

            async def first_gone() -> bool:
                listing = await kube.list_objects(PROVISIONING_REQUEST, namespace)
                return first not in {r["metadata"]["name"] for r in listing["items"]}

            await eventually(first_gone, timeout=30, what=f"{first} withdrawn")
            cluster.record(
                f"g. capacity sources InOrder, real CA, {count} pods x {SMALL.gpus} GPUs, "
                f"{SMALL.name} (max {SMALL.max}) then {BIG.name}: Running after "
                f"{started_after:.1f}s on {len(on_big)} {BIG.name} nodes, 0 nodes in "
                f"{SMALL.name}, no Kueue retry; left the first: {left}"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            await _drain_and_delete_new_nodes(kube, namespace, big, before)
