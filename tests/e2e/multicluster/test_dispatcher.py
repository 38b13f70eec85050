"""gangcheck's capacity-aware dispatcher in the manager cluster (``gangcheck run --role
dispatcher``; Kueue's ``multiKueue.dispatcherName: gangcheck.io/capacity-aware``), on the
multi-cluster bed of conftest.py: real kube-apiservers, real Kueue in every cluster,
gangcheck in each worker; the simulated cloud stands in for a cloud's stockouts (worker-1's
delivers one node of any request and no more: stocked out; worker-2's delivers in full).

The dispatcher runs as a user deploys it: the manager's RBAC of ``manifests/dispatcher``, in
each worker the read-only rights of ``manifests/dispatcher/worker/reader.yaml`` for the
identity MultiKueue's Secret holds, a ServiceAccount token; a write the API server refuses
fails the test at teardown.

What is asserted is durable: the dispatcher's record on the manager's Workload (annotation
``gangcheck.io/dispatch``), its Events there (``Nominated``, ``DispatchFallback``), the
Workload's ``status.clusterName``, and the ``NodeDelivered`` Events each worker's cloud
records on a request for each node it delivered (they outlive the nodes and requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gangcheck_dev.simcloud.cloud import DELIVERED_REASON
from gangcheck_dev.simcloud.model import REQUEST_ANNOTATION as SIM_REQUEST
from gangcheck_dev.testbed.deploy import ManagedProcess, deploy_dispatcher, restart
from gangcheck_dev.testbed.nodes import kwok_node

from gangcheck.diagnose.fetch import diagnose, status
from gangcheck.diagnose.text import render_text
from gangcheck.kube.client import Kube
from gangcheck.kube.resources import (
    EVENT,
    LEASE,
    NAMESPACE,
    NODE,
    PROVISIONING_REQUEST,
    WORKLOAD,
)
from gangcheck.logic.dispatch import DISPATCHER, DOWN_GRACE, LEASE_EVERY, RECORD_ANNOTATION
from gangcheck.settings import LEASE_NAME, LEASE_NAMESPACE
from tests.e2e.helpers import JOB, delete_quietly, eventually, is_true, unique
from tests.e2e.multicluster.conftest import (
    GPU_TAINT,
    GPU_TYPE,
    POOL,
    SIM_POOL,
    STOCKED_OUT,
    WITH_ROOM,
    Bed,
)
from tests.e2e.multicluster.test_multikueue import (
    MANAGER,
    admitted_in_a_worker,
    cleanup_winner,
    fresh_namespace,
    gang_job,
    items,
    manager_workload,
    queues,
)

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def dispatcher(bed: Bed) -> Iterator[ManagedProcess]:
    """Kueue in the manager restarted with the external dispatcher's name, and gangcheck's
    dispatcher started there; stopped after the module (its refused writes fail it)."""
    bed.clusters.set_dispatcher(DISPATCHER)
    began = time.monotonic()
    process = deploy_dispatcher(
        bed.manager.kubeconfig,
        [worker.kubeconfig for worker in bed.workers.values()],
        workdir=bed.workdir / "dispatcher",
        kubectl=bed.manager.kubectl,
    )
    bed.measurements.append(f"dispatcher deployed and ready in {time.monotonic() - began:.1f}s")
    try:
        yield process
    finally:
        process.stop()


def record_of(wl: Obj) -> dict[str, Any]:
    raw = (wl["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    return dict(json.loads(raw)) if raw else {}


async def events_on(kube: Kube, wl: Obj, reason: str) -> list[Obj]:
    selector = f"involvedObject.uid={wl['metadata']['uid']},reason={reason}"
    found = await items(kube, EVENT, wl["metadata"]["namespace"], field_selector=selector)
    return sorted(found, key=lambda e: str(e.get("firstTimestamp") or ""))


async def deliveries(kube: Kube, namespace: str) -> list[Obj]:
    """The worker cloud's NodeDelivered Events for the gang of ``namespace``."""
    return await items(kube, EVENT, namespace, field_selector=f"reason={DELIVERED_REASON}")


async def assert_placed_where_it_fits_now(kubes: dict[str, Kube], wl: Obj) -> dict[str, Any]:
    """The gang admitted in worker-2, where it fits now, and worker-1 (stocked out) left
    alone: the dispatcher's record on ``wl`` (the manager's Workload, admitted) has worker-2
    alone tried and nominated because the gang fits there now, with one ``Nominated`` Event;
    worker-1 never got a copy of the Workload (Kueue records Events on a copy it admits or
    evicts; a copy's gangcheck would have asked its cloud) nor a node. Returns the record."""
    manager, stocked_out = kubes[MANAGER], kubes[STOCKED_OUT]
    namespace = wl["metadata"]["namespace"]
    assert wl["status"]["clusterName"] == WITH_ROOM
    record = record_of(wl)
    assert record["tried"] == [WITH_ROOM], record
    assert record["nominated"] == [WITH_ROOM], record
    assert not record["failed"], record
    assert "fits now" in record["reason"], record
    nominated = await events_on(manager, wl, "Nominated")
    assert [e["message"].split(":")[0] for e in nominated] == [f"nominated {WITH_ROOM}"]
    assert not await deliveries(stocked_out, namespace)
    events = await items(stocked_out, EVENT, namespace)
    assert not [e for e in events if e["involvedObject"]["kind"] == "Workload"], events
    assert not await items(stocked_out, WORKLOAD, namespace)
    return record


@pytest.fixture
async def free_nodes(kubes: dict[str, Kube]) -> AsyncIterator[list[str]]:
    """Two idle 8-GPU nodes in worker-2, as its cloud makes them, Ready: room now."""
    async with idle_nodes(kubes[WITH_ROOM], WITH_ROOM) as names:
        yield names


@contextlib.asynccontextmanager
async def idle_nodes(kube: Kube, worker: str) -> AsyncIterator[list[str]]:
    """Two idle 8-GPU nodes in the worker (``kube``), as its cloud makes them, Ready (room
    now for the gang); deleted after."""
    names = [unique("room") for _ in range(2)]
    labels = {GPU_TYPE: "e2e", SIM_POOL: POOL}
    try:
        for name in names:
            await kube.create(NODE, kwok_node(name, gpus=8, labels=labels, taints=[GPU_TAINT]))

        async def ready() -> bool:
            nodes = [await kube.get(NODE, name) for name in names]
            return all(is_true(node, "Ready") for node in nodes)

        await eventually(ready, timeout=30, what=f"{worker}'s idle nodes Ready")
        yield names
    finally:
        for name in names:
            await delete_quietly(kube, NODE, name)


@pytest.mark.timeout(120)
async def test_the_gang_goes_where_it_fits_now_and_the_stocked_out_worker_never_scales_up(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess, free_nodes: list[str]
) -> None:
    """worker-2 has room now (two idle 8-GPU nodes), worker-1 is stocked out: the dispatcher
    nominates worker-2 alone, the gang is admitted there, and worker-1 never got a copy of
    the Workload nor a node."""
    async with gang_submitted(kubes) as (namespace, began):
        wl = await admitted_in_a_worker(kubes[MANAGER], namespace)
        took = time.monotonic() - began
        record = await assert_placed_where_it_fits_now(kubes, wl)
        # the record names the Workload it was written for, and Kueue's copy in worker-2
        # carries it (Kueue copies the manager's annotations): the copy names its Workload
        assert record["uid"] == wl["metadata"]["uid"], record
        copy = await kubes[WITH_ROOM].get(WORKLOAD, wl["metadata"]["name"], namespace)
        assert record_of(copy)["uid"] == wl["metadata"]["uid"], copy["metadata"]
        # which cluster worker-2 is, read through the reader's rights (its kube-system uid):
        # a MultiKueueCluster re-pointed elsewhere would be noticed
        cluster = await kubes[WITH_ROOM].get(NAMESPACE, "kube-system")
        assert record["identities"] == {WITH_ROOM: cluster["metadata"]["uid"]}, record
        bed.measurements.append(
            f"dispatcher, room now in {WITH_ROOM}: admitted there {took:.1f}s after the "
            f"Job; {STOCKED_OUT} got no copy and no node"
        )


@contextlib.asynccontextmanager
async def gang_submitted(kubes: dict[str, Kube]) -> AsyncIterator[tuple[str, float]]:
    """The gang's Job created in the manager, in a fresh namespace with its queues: (the
    namespace, when the Job was created). After: the Job deleted, and what came for the gang
    in worker-2 removed (the nodes it ran on, those its cloud made)."""
    manager, with_room = kubes[MANAGER], kubes[WITH_ROOM]
    namespace = await fresh_namespace(kubes)
    async with queues(kubes, namespace):
        began = time.monotonic()
        await manager.create(JOB, gang_job("gang"), namespace)
        try:
            yield namespace, began
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(with_room, namespace)
            await cleanup_delivered(with_room, namespace)


async def cleanup_delivered(kube: Kube, namespace: str) -> None:
    """Once the worker holds no request for the gang, every node its cloud made for one (the
    gang ran on the idle nodes; what its gangcheck also asked for may have come after)."""

    async def no_request() -> bool:
        return not await items(kube, PROVISIONING_REQUEST, namespace)

    await eventually(no_request, timeout=30, what="worker-2 holding no request for the gang")
    for node in await items(kube, NODE):
        made_for = (node["metadata"].get("annotations") or {}).get(SIM_REQUEST, "")
        if made_for.startswith(f"{namespace}/"):
            await delete_quietly(kube, NODE, node["metadata"]["name"])


@pytest.mark.timeout(150)
async def test_the_nominated_worker_failing_moves_the_gang_on_and_a_restart_nominates_nothing_twice(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess
) -> None:
    """No room now anywhere and no record of either cloud: worker-1 is nominated alone (by
    name). Its cloud stocks out after one node; gangcheck there rolls back at its deadline
    (6 s) and its check goes Retry. Meanwhile the dispatcher is killed and started again:
    it resumes from its record on the Workload (worker-1 still nominated, not nominated
    again). On worker-1's failure it gives worker-1 up and nominates worker-2, whose cloud
    delivers: the gang is admitted there. worker-2's cloud delivered nothing before worker-1
    was given up (one cluster scaling up for the gang at a time). ``gangcheck diagnose`` on
    the manager's Workload says so, and ``gangcheck status`` there lists the gang under both
    workers: given up in worker-1, placed in worker-2."""
    manager, stocked_out, with_room = kubes[MANAGER], kubes[STOCKED_OUT], kubes[WITH_ROOM]
    namespace = await fresh_namespace(kubes)

    async def nothing_in_worker_2() -> bool:  # so worker-1 is nominated first (by name)
        pool = await items(with_room, NODE, label_selector=f"{SIM_POOL}={POOL}")
        return not pool and not await items(with_room, PROVISIONING_REQUEST)

    await eventually(nothing_in_worker_2, timeout=30, what="worker-2 holding no node, no request")
    # a long backoff: worker-1 does not start a second attempt before it is given up
    async with queues(kubes, namespace, deadline=6, backoff=60):
        began = time.monotonic()
        await manager.create(JOB, gang_job("gang"), namespace)
        try:

            async def on_worker_1() -> Obj | None:
                wl = await manager_workload(manager, namespace)
                return wl if wl is not None and record_of(wl).get("nominated") else None

            wl = await eventually(on_worker_1, timeout=30, what="a first nomination")
            assert record_of(wl)["nominated"] == [STOCKED_OUT], record_of(wl)
            os.killpg(dispatcher.pid, signal.SIGKILL)  # mid-dispatch: worker-1 trying
            dispatcher.component.stop()  # reaps it
            restart(dispatcher)
            wl = await admitted_in_a_worker(manager, namespace, timeout=90)
            took = time.monotonic() - began
            assert wl["status"]["clusterName"] == WITH_ROOM
            record = record_of(wl)
            assert record["tried"] == [STOCKED_OUT, WITH_ROOM], record
            assert list(record["failed"]) == [STOCKED_OUT], record
            # The record above is the durable proof of one nomination at a time. Events are
            # sent after it: the SIGKILL may take the first one with it, never add one.
            nominated = [
                e["message"].split(":")[0] for e in await events_on(manager, wl, "Nominated")
            ]
            assert nominated in (
                [f"nominated {STOCKED_OUT}", f"nominated {WITH_ROOM}"],
                [f"nominated {WITH_ROOM}"],
            ), nominated
            (fallback,) = await events_on(manager, wl, "DispatchFallback")
            assert STOCKED_OUT in fallback["message"]
            # both nominations kept Kueue's quota reservation (a nomination that dropped it had
            # Kueue's scheduler reserve the quota again: one more QuotaReserved Event each)
            reserved = await events_on(manager, wl, "QuotaReserved")
            assert sum(int(e.get("count") or 1) for e in reserved) == 1, reserved
            assert await deliveries(stocked_out, namespace), "worker-1 scaled up nothing"
            delivered = await deliveries(with_room, namespace)
            assert delivered, "worker-2's cloud delivered nothing: the gang ran on what?"
            gave_up = str(fallback["firstTimestamp"])
            assert all(str(e["firstTimestamp"]) >= gave_up for e in delivered), (
                gave_up,
                [e["firstTimestamp"] for e in delivered],
            )
            text = render_text(
                await diagnose(manager, f"workload/{namespace}/{wl['metadata']['name']}")
            )
            assert f"trying {WITH_ROOM}" in text, text
            assert f"given up: {STOCKED_OUT}" in text, text
            listed = await status(manager, namespace)
            assert [(w.worker, w.placement) for w in listed.workers] == [
                (STOCKED_OUT, "given up"),
                (WITH_ROOM, "placed"),
            ], listed.workers
            bed.measurements.append(
                f"dispatcher, {STOCKED_OUT} failing (restarted mid-dispatch): admitted in "
                f"{WITH_ROOM} {took:.1f}s after the Job, 2 nominations, 1 fallback"
            )
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(with_room, namespace)


@pytest.mark.timeout(150)
async def test_a_worker_whose_gangcheck_is_down_is_skipped_and_the_gang_runs_in_the_other(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess, free_nodes: list[str]
) -> None:
    """worker-1's gangcheck killed (SIGKILL: its leader Lease there left as it was, to go
    stale; its AdmissionCheck, which it wrote, still says Active). A gang that fits now in
    both workers (two idle nodes in each: worker-1 would come first by name), submitted once
    the Lease is older than its duration plus the dispatcher's grace: the dispatcher skips
    worker-1 with the reason on the manager's Workload, and the gang is placed in worker-2;
    worker-1 never gets a copy of the Workload. worker-1's gangcheck is started again after
    (the same identity: it holds its Lease again at once)."""
    manager, stocked_out = kubes[MANAGER], kubes[STOCKED_OUT]
    (keeper,) = [k for k in bed.keepers if k.worker_name == STOCKED_OUT]
    (gangcheck,) = [p for p in keeper.processes if p.name == "gangcheck"]

    async def nothing_asked_in_worker_1() -> bool:  # an earlier test's attempt withdrawn
        return not await items(stocked_out, PROVISIONING_REQUEST)

    await eventually(nothing_asked_in_worker_1, timeout=60, what="worker-1 holding no request")
    namespace = await fresh_namespace(kubes)
    # the queues first: gangcheck in each worker makes the namespace's AdmissionCheck Active
    async with queues(kubes, namespace), idle_nodes(stocked_out, STOCKED_OUT):
        os.killpg(gangcheck.pid, signal.SIGKILL)
        gangcheck.component.stop()  # reaps it
        try:
            lease = await stocked_out.get(LEASE, LEASE_NAME, LEASE_NAMESPACE)
            spec = lease["spec"]
            renewed = datetime.fromisoformat(str(spec["renewTime"]).replace("Z", "+00:00"))
            stale_at = renewed + timedelta(seconds=spec["leaseDurationSeconds"] + DOWN_GRACE)
            # the dispatcher reads the Lease in the background every LEASE_EVERY seconds and
            # times it by its own clock from when it first saw that renewal: it may say it
            # down up to two reads after the Lease's own time says so
            settle = 2 * LEASE_EVERY + 1
            await asyncio.sleep(max(0.0, (stale_at - datetime.now(UTC)).total_seconds()) + settle)
            began = time.monotonic()
            await manager.create(JOB, gang_job("gang"), namespace)
            try:
                wl = await admitted_in_a_worker(manager, namespace)
                took = time.monotonic() - began
                assert wl["status"]["clusterName"] == WITH_ROOM
                record = record_of(wl)
                assert record["tried"] == [WITH_ROOM], record
                assert record["nominated"] == [WITH_ROOM], record
                assert not record["failed"], record
                said = (
                    f"gangcheck down: its Lease {LEASE_NAMESPACE}/{LEASE_NAME} last renewed at "
                    f"{renewed.strftime('%Y-%m-%dT%H:%M:%SZ')} "
                    f"(duration {spec['leaseDurationSeconds']}s)"
                )
                assert record["skipped"] == {STOCKED_OUT: said}, record
                assert not await items(stocked_out, WORKLOAD, namespace)
                text = render_text(
                    await diagnose(manager, f"workload/{namespace}/{wl['metadata']['name']}")
                )
                assert f"skipped: {STOCKED_OUT} ({said})" in text, text
                # the Lease stayed as the killed gangcheck left it: nothing else renewed it
                again = await stocked_out.get(LEASE, LEASE_NAME, LEASE_NAMESPACE)
                assert again["spec"]["renewTime"] == spec["renewTime"]
                bed.measurements.append(
                    f"dispatcher, {STOCKED_OUT}'s gangcheck down: admitted in {WITH_ROOM} "
                    f"{took:.1f}s after the Job ({STOCKED_OUT} skipped, its Lease stale)"
                )
            finally:
                await delete_quietly(manager, JOB, "gang", namespace)
                await cleanup_winner(kubes[WITH_ROOM], namespace)
                await cleanup_delivered(kubes[WITH_ROOM], namespace)
        finally:
            restart(gangcheck)  # in this thread: a child of the bed is bound to its thread
