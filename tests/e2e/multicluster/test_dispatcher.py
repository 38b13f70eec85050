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
import base64
import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.simcloud.cloud import DELIVERED_REASON
from gangcheck_dev.simcloud.model import REQUEST_ANNOTATION as SIM_REQUEST
from gangcheck_dev.testbed.deploy import ManagedProcess, deploy_dispatcher, restart
from gangcheck_dev.testbed.multicluster import CONFIG, IDENTITY
from gangcheck_dev.testbed.nodes import kwok_node
from gangcheck_dev.testbed.stack import KUEUE_NAMESPACE

from gangcheck.diagnose.fetch import diagnose, status
from gangcheck.diagnose.text import render_text
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    CONFIG_MAP,
    EVENT,
    LEASE,
    LOCAL_QUEUE,
    MULTIKUEUE_CLUSTER,
    MULTIKUEUE_CONFIG,
    NAMESPACE,
    NODE,
    PROVISIONING_REQUEST,
    SECRET,
    SERVICE_ACCOUNT,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.dispatch import (
    COPY_GRACE,
    DISPATCHER,
    DOWN_GRACE,
    LEASE_EVERY,
    RECORD_ANNOTATION,
    WORKER_LEASE_ANNOTATION,
)
from gangcheck.settings import LEASE_NAME, LEASE_NAMESPACE
from tests.e2e.helpers import JOB, container, delete_quietly, eventually, is_true, unique
from tests.e2e.multicluster.conftest import (
    GPU_TAINT,
    GPU_TYPE,
    POOL,
    SIM_CONFIG_MAP,
    SIM_POOL,
    STOCKED_OUT,
    WITH_ROOM,
    Bed,
)
from tests.e2e.multicluster.test_multikueue import (
    GPU,
    MANAGER,
    admitted_in_a_worker,
    cleanup_winner,
    delivered,
    drop_kept,
    fresh_namespace,
    gang_job,
    holding,
    items,
    manager_workload,
    queues,
    told_reclaimed,
    until_given_back,
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
        extra_args=(f"--round-wait={ROUND_WAIT}",),
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


async def worker_2_empty(two: Kube) -> None:
    """Wait until worker-2 holds no node of the pool and no request: its room is what a
    dispatcher reads, so worker-1 is nominated first (by name)."""

    async def nothing_in_worker_2() -> bool:
        pool = await items(two, NODE, label_selector=f"{SIM_POOL}={POOL}")
        return not pool and not await items(two, PROVISIONING_REQUEST)

    await eventually(nothing_in_worker_2, timeout=30, what="worker-2 holding no node, no request")


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

    await worker_2_empty(with_room)
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


# -- bad input: workers a new user gets wrong ------------------------------------------------------

#: MultiKueue's AdmissionCheck (and its MultiKueueConfig) of the workers below.
BROKEN = "mk-broken"


def _kubeconfig_with(config: Obj, *, server: str = "", user: Obj | None = None) -> bytes:
    """worker-1's kubeconfig as MultiKueue holds it (``config``, parsed), its server or its
    user's credentials replaced."""
    changed = json.loads(json.dumps(config))
    if server:
        for entry in changed["clusters"]:
            entry["cluster"]["server"] = server
    if user is not None:
        for entry in changed["users"]:
            entry["user"] = user
    return yaml.safe_dump(changed).encode()


@contextlib.asynccontextmanager
async def broken_workers(kubes: dict[str, Kube], marker: Path) -> AsyncIterator[dict[str, str]]:
    """In the manager, MultiKueue's AdmissionCheck ``BROKEN`` whose MultiKueueConfig lists the
    workers a new user gets wrong, each said in the dispatcher's words (what its reason holds):
    a cluster listed that has no MultiKueueCluster; a Secret whose kubeconfig names a server
    that answers nothing; a Secret made in the wrong namespace; a token worker-1 takes for no
    one; an exec plugin (touching ``marker`` if it ran); and worker-1 itself, which Kueue
    reaches (so the check stays Active and its ClusterQueue admits), under a MultiKueueCluster
    whose gangcheck Lease annotation is no Lease's name. Removed after, with what they made."""
    manager = kubes[MANAGER]
    cluster = await manager.get(MULTIKUEUE_CLUSTER, STOCKED_OUT)
    location = cluster["spec"]["clusterSource"]["kubeConfig"]["location"]
    held = await manager.get(SECRET, location, KUEUE_NAMESPACE)
    config = yaml.safe_load(base64.b64decode(held["data"]["kubeconfig"]))
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "/bin/sh",
            "args": ["-c", f"touch {marker}"],
        }
    }
    secrets: dict[str, tuple[bytes, str]] = {
        "bad-nowhere": (_kubeconfig_with(config, server="https://127.0.0.1:1"), KUEUE_NAMESPACE),
        "bad-wrong-namespace": (_kubeconfig_with(config), "default"),
        "bad-token": (_kubeconfig_with(config, user={"token": "not-a-token"}), KUEUE_NAMESPACE),
        "bad-exec": (_kubeconfig_with(config, user=exec_user), KUEUE_NAMESPACE),
        "bad-lease": (_kubeconfig_with(config), KUEUE_NAMESPACE),
    }
    said = {
        "bad-missing": "no MultiKueueCluster bad-missing",
        "bad-nowhere": "MultiKueueCluster not Active (ClientConnectionFailed: ",
        "bad-wrong-namespace": "MultiKueueCluster not Active (BadKubeConfig: ",
        "bad-token": "MultiKueueCluster not Active (ClientConnectionFailed: ",
        "bad-exec": "MultiKueueCluster not Active (InsecureKubeConfig: ",
        "bad-lease": 'annotation gangcheck.io/worker-lease is "gc", not <namespace>/<name>',
    }
    made: list[tuple[Any, str, str | None]] = []

    async def create(res: Any, body: Obj, namespace: str | None = None) -> None:
        await manager.create(res, body, namespace)
        made.append((res, body["metadata"]["name"], namespace))

    try:
        for name, (kubeconfig, namespace) in secrets.items():
            data = {"kubeconfig": base64.b64encode(kubeconfig).decode()}
            await create(SECRET, {"metadata": {"name": name}, "data": data}, namespace)
            source = {"kubeConfig": {"locationType": "Secret", "location": name}}
            meta: Obj = {"name": name}
            if name == "bad-lease":
                meta["annotations"] = {WORKER_LEASE_ANNOTATION: "gc"}
            await create(MULTIKUEUE_CLUSTER, {"metadata": meta, "spec": {"clusterSource": source}})
        await create(
            MULTIKUEUE_CONFIG, {"metadata": {"name": BROKEN}, "spec": {"clusters": sorted(said)}}
        )
        parameters = {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": BROKEN}
        spec = {"controllerName": "kueue.x-k8s.io/multikueue", "parameters": parameters}
        await create(ADMISSION_CHECK, {"metadata": {"name": BROKEN}, "spec": spec})

        async def judged() -> bool:  # Kueue's word on each, so the reasons are final
            for name in secrets:
                found = await manager.get(MULTIKUEUE_CLUSTER, name)
                conditions = (found.get("status") or {}).get("conditions") or []
                if not any(c["type"] == "Active" for c in conditions):
                    return False
            return is_true(await manager.get(ADMISSION_CHECK, BROKEN), "Active")

        await eventually(judged, timeout=30, what="Kueue's word on each broken MultiKueueCluster")
        yield said
    finally:
        for res, name, namespace in reversed(made):
            await delete_quietly(manager, res, name, namespace)


@pytest.mark.timeout(120)
async def test_a_gang_whose_workers_are_all_wrong_waits_said_why_and_another_is_dispatched(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess, free_nodes: list[str]
) -> None:
    """Two gangs at once: one of MultiKueue's check ``mk-broken``, whose workers are each
    wrong as a new user makes them (``broken_workers``), the other of the bed's check, with
    room now in worker-2. The first stays queued in the manager (its quota kept, nominated
    nowhere, no copy in any worker), each worker skipped with its reason on the Workload's
    record, said once in a NoWorker Event and in ``gangcheck diagnose``; the second is
    placed in worker-2 as usual. The exec plugin never ran; the dispatcher writes in no
    worker (its reader's rights there are read-only: a refused write fails the module)."""
    manager = kubes[MANAGER]
    marker = bed.workdir / f"{unique('exec-ran')}"
    bad, good = await fresh_namespace(kubes), await fresh_namespace(kubes)
    async with (
        broken_workers(kubes, marker) as said,
        queues(kubes, bad, check=BROKEN),
        queues(kubes, good),
    ):
        try:
            await manager.create(JOB, gang_job("gang"), bad)
            began = time.monotonic()
            await manager.create(JOB, gang_job("gang"), good)
            placed = await admitted_in_a_worker(manager, good)
            took = time.monotonic() - began
            assert placed["status"]["clusterName"] == WITH_ROOM

            async def said_why() -> Obj | None:
                wl = await manager_workload(manager, bad)
                return wl if wl is not None and record_of(wl).get("reason") else None

            wl = await eventually(said_why, timeout=30, what="the broken gang's record")
            await asyncio.sleep(3)  # passes more: the record and its Event stay as they are
            wl = await manager.get(WORKLOAD, wl["metadata"]["name"], bad)
            record = record_of(wl)
            assert record["nominated"] == [] and record["tried"] == [], record
            assert record["reason"].startswith("no worker left to try"), record
            assert sorted(record["skipped"]) == sorted(said), record
            for name, why in said.items():
                assert why in record["skipped"][name], (name, record["skipped"][name])
            assert is_true(wl, "QuotaReserved"), wl["status"]  # queued, never lost
            assert not wl["status"].get("nominatedClusterNames"), wl["status"]
            assert not wl["status"].get("clusterName"), wl["status"]
            (told,) = await events_on(manager, wl, "NoWorker")
            assert int(told.get("count") or 1) == 1, told
            for name in said:
                assert f"{name}: " in told["message"], told["message"]
            text = render_text(await diagnose(manager, f"workload/{bad}/{wl['metadata']['name']}"))
            assert "no worker nominated: no worker left to try" in text, text
            for name in said:
                assert f"skipped: {name} (" in text, text
            for worker in (STOCKED_OUT, WITH_ROOM):
                assert not await items(kubes[worker], WORKLOAD, bad), worker
            assert not marker.exists(), "the exec plugin of a worker's kubeconfig ran"
            bed.measurements.append(
                f"dispatcher, bad input: {len(said)} broken workers said, that gang queued; "
                f"the other admitted in {WITH_ROOM} {took:.1f}s after its Job"
            )
        finally:
            for namespace in (bad, good):
                await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(kubes[WITH_ROOM], good)
            await cleanup_delivered(kubes[WITH_ROOM], good)


CLUSTER_ROLE_BINDING = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)
ROLE_BINDING = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")


def _binding(name: str, kind: str, role: str, account: str) -> Obj:
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": KUEUE_NAMESPACE}],
    }


@pytest.mark.timeout(120)
async def test_a_worker_whose_token_is_revoked_is_skipped_as_its_credentials_refused(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess, free_nodes: list[str]
) -> None:
    """A MultiKueueCluster reaching worker-1 as a ServiceAccount of its own, with MultiKueue's
    and the reader's rights there, Active; then that ServiceAccount deleted (its token now
    answered 401). A gang of a MultiKueueConfig listing it and worker-2 (room now in both
    would rank it first by name): the record skips it, 'credentials refused (401: ...)', not
    'unreachable', and nominates worker-2."""
    manager, one = kubes[MANAGER], kubes[STOCKED_OUT]
    name = unique("revoked")
    rbac: list[tuple[Resource, str, str | None]] = [
        (CLUSTER_ROLE_BINDING, f"{name}-multikueue", None),
        (CLUSTER_ROLE_BINDING, f"{name}-reader", None),
        (ROLE_BINDING, f"{name}-reader", LEASE_NAMESPACE),
    ]
    made: list[tuple[Kube, Resource, str, str | None]] = []  # removed after, in reverse
    try:
        await one.create(SERVICE_ACCOUNT, {"metadata": {"name": name}}, KUEUE_NAMESPACE)
        made.append((one, SERVICE_ACCOUNT, name, KUEUE_NAMESPACE))
        roles = [
            ("ClusterRole", f"{IDENTITY}-role"),
            ("ClusterRole", "gangcheck-dispatcher-reader"),
            ("Role", "gangcheck-dispatcher-reader"),
        ]
        for (res, binding, namespace), (kind, role) in zip(rbac, roles, strict=True):
            await one.create(res, _binding(binding, kind, role, name), namespace)
            made.append((one, res, binding, namespace))
        path = f"{SERVICE_ACCOUNT.object_path(name, KUEUE_NAMESPACE)}/token"
        asked = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        token = (await one.request("POST", path, body=asked))["status"]["token"]
        cluster = await manager.get(MULTIKUEUE_CLUSTER, STOCKED_OUT)
        location = cluster["spec"]["clusterSource"]["kubeConfig"]["location"]
        held = await manager.get(SECRET, location, KUEUE_NAMESPACE)
        config = yaml.safe_load(base64.b64decode(held["data"]["kubeconfig"]))
        kubeconfig = _kubeconfig_with(config, user={"token": token})
        data = {"kubeconfig": base64.b64encode(kubeconfig).decode()}
        await manager.create(SECRET, {"metadata": {"name": name}, "data": data}, KUEUE_NAMESPACE)
        made.append((manager, SECRET, name, KUEUE_NAMESPACE))
        source = {"kubeConfig": {"locationType": "Secret", "location": name}}
        await manager.create(
            MULTIKUEUE_CLUSTER, {"metadata": {"name": name}, "spec": {"clusterSource": source}}
        )
        made.append((manager, MULTIKUEUE_CLUSTER, name, None))
        listing = {"metadata": {"name": name}, "spec": {"clusters": [name, WITH_ROOM]}}
        await manager.create(MULTIKUEUE_CONFIG, listing)
        made.append((manager, MULTIKUEUE_CONFIG, name, None))
        parameters = {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": name}
        spec = {"controllerName": "kueue.x-k8s.io/multikueue", "parameters": parameters}
        await manager.create(ADMISSION_CHECK, {"metadata": {"name": name}, "spec": spec})
        made.append((manager, ADMISSION_CHECK, name, None))

        async def connected() -> bool:
            return is_true(await manager.get(MULTIKUEUE_CLUSTER, name), "Active")

        await eventually(connected, timeout=30, what=f"MultiKueueCluster {name} Active")
        await one.delete(SERVICE_ACCOUNT, name, KUEUE_NAMESPACE)  # its token: 401 from now
        probe = bed.workdir / f"{name}.kubeconfig"
        probe.write_bytes(kubeconfig)
        async with await Kube.connect(str(probe), retry_attempts=1) as revoked:

            async def refused() -> bool:
                try:
                    await revoked.get(NAMESPACE, "kube-system")
                except ApiError as e:
                    return e.status == 401
                return False

            await eventually(refused, timeout=30, what="the revoked token answered 401")
        namespace = await fresh_namespace(kubes)
        async with queues(kubes, namespace, check=name), idle_nodes(one, STOCKED_OUT):
            try:
                await manager.create(JOB, gang_job("gang"), namespace)

                async def said() -> dict[str, Any] | None:
                    wl = await manager_workload(manager, namespace)
                    record = record_of(wl) if wl is not None else {}
                    return record if record.get("nominated") else None

                record = await eventually(said, timeout=30, what="a nomination")
                assert record["nominated"] == [WITH_ROOM], record
                assert record["skipped"][name].startswith("credentials refused (401: "), record
                # Kueue's watches there are still open: it counts the worker connected, its
                # reads of the copy there answer 401, and it copies the gang nowhere; past
                # COPY_GRACE the record says so, naming that worker
                assert is_true(await manager.get(MULTIKUEUE_CLUSTER, name), "Active")
                blocked = f"and {name} is (skipped, below): mend its kubeconfig Secret"

                async def named() -> dict[str, Any] | None:
                    wl = await manager_workload(manager, namespace)
                    record = record_of(wl) if wl is not None else {}
                    return record if blocked in record.get("reason", "") else None

                record = await eventually(
                    named, timeout=COPY_GRACE + 20, what="the worker blocking Kueue named"
                )
                assert record["nominated"] == [WITH_ROOM], record
                wl = await manager_workload(manager, namespace)
                assert wl is not None and not wl["status"].get("clusterName"), wl
                text = render_text(
                    await diagnose(manager, f"workload/{namespace}/{wl['metadata']['name']}")
                )
                assert blocked in text, text
                bed.measurements.append(
                    f"dispatcher, a revoked token: skipped as credentials refused; Kueue, "
                    "its MultiKueueCluster still Active, copied the gang nowhere: named past "
                    f"{COPY_GRACE:g}s"
                )
            finally:
                await delete_quietly(manager, JOB, "gang", namespace)
                await cleanup_winner(kubes[WITH_ROOM], namespace)
    finally:
        for kube, res, obj, ns in reversed(made):
            await delete_quietly(kube, res, obj, ns)


@pytest.mark.timeout(150)
async def test_a_worker_dropped_from_the_config_mid_dispatch_keeps_the_gang_until_its_copy_goes(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess
) -> None:
    """No room now anywhere: worker-1 is nominated (by name) and gets Kueue's copy. worker-1
    is then taken off the MultiKueueConfig: Kueue no longer manages that copy, so the
    dispatcher keeps worker-1 nominated and none beside it, the record saying why and what to
    do; worker-2 gets no copy meanwhile. The copy deleted in worker-1, as the record says
    (once gangcheck there recorded the one node its cloud delivered), worker-1 is given up
    ('no longer configured') and the gang is admitted in worker-2; worker-1 is left holding
    no node, the node reclaimed by its gangcheck's withdrawal, and its request kept open for
    what its cloud, which said Provisioned=True, may still deliver."""
    manager, one, two = kubes[MANAGER], kubes[STOCKED_OUT], kubes[WITH_ROOM]

    await worker_2_empty(two)
    namespace = await fresh_namespace(kubes)
    listed = (await manager.get(MULTIKUEUE_CONFIG, CONFIG))["spec"]["clusters"]
    async with queues(kubes, namespace):
        await manager.create(JOB, gang_job("gang"), namespace)
        try:

            async def copied_to_worker_1() -> Obj | None:
                wl = await manager_workload(manager, namespace)
                nominated = record_of(wl).get("nominated") if wl is not None else None
                return wl if nominated and await items(one, WORKLOAD, namespace) else None

            wl = await eventually(copied_to_worker_1, timeout=30, what="a copy in worker-1")
            assert record_of(wl)["nominated"] == [STOCKED_OUT], record_of(wl)
            dropped = {"spec": {"clusters": [WITH_ROOM]}}
            await manager.merge_patch(MULTIKUEUE_CONFIG, CONFIG, dropped)
            try:
                stranded = f"{STOCKED_OUT} is no longer a worker of the Workload's MultiKueueConfig"

                async def said() -> dict[str, Any] | None:
                    found = await manager_workload(manager, namespace)
                    record = record_of(found) if found is not None else {}
                    return record if stranded in record.get("reason", "") else None

                record = await eventually(said, timeout=30, what="the stranded copy said")
                assert record["nominated"] == [STOCKED_OUT], record
                assert not record["failed"], record
                assert not await items(two, WORKLOAD, namespace)

                # worker-1's cloud delivers 1 node of 2 at once; the copy is deleted once
                # gangcheck there recorded it for the request (gangcheck.io/arrived-for), so
                # that the Event below names it (a node that comes after the copy went is
                # recorded for the request kept open and reclaimed by a later pass:
                # test_multikueue.py's Job deleted mid-flight, docs/multicluster.md).
                async def recorded_in_worker_1() -> list[str]:
                    return (await holding(one, namespace))["arrived"]

                arrived = await eventually(
                    recorded_in_worker_1, timeout=30, what="worker-1's node recorded for the gang"
                )
                for copy in await items(one, WORKLOAD, namespace):  # as the record says
                    await delete_quietly(one, WORKLOAD, copy["metadata"]["name"], namespace)
                placed = await admitted_in_a_worker(manager, namespace, timeout=60)
                assert placed["status"]["clusterName"] == WITH_ROOM
                record = record_of(placed)
                assert record["tried"] == [STOCKED_OUT, WITH_ROOM], record
                assert record["failed"] == {STOCKED_OUT: "no longer configured"}, record
                # withdrawn: no Workload or node left for the gang, the request kept open
                # (with its templates) for the node its cloud promised, and what its cloud
                # delivered is what gangcheck reclaimed, said in its Event
                kept = await until_given_back(one, namespace, f"{STOCKED_OUT} holding no node")
                assert len(kept) == 1, kept
                assert await delivered(one, namespace) == arrived
                await told_reclaimed(one, namespace, arrived)
            finally:
                await manager.merge_patch(MULTIKUEUE_CONFIG, CONFIG, {"spec": {"clusters": listed}})
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(two, namespace)
            await cleanup_delivered(two, namespace)

            await drop_kept(one, namespace)
            # only after a failure above: left, a node of worker-1 wins the next module's race
            await cleanup_delivered(one, namespace)


def too_big_gang() -> Obj:
    """The gang's Job with members of 16 GPUs each, where every node of either cloud has 8:
    each worker's cloud answers gangcheck's request there CapacityIsNotFound."""
    job = gang_job("gang")
    job["spec"]["template"]["spec"]["containers"] = [
        container({"cpu": "1", "memory": "1Gi", GPU: "16"}, {GPU: "16"})
    ]
    return job


@contextlib.asynccontextmanager
async def too_big_gang_submitted(kubes: dict[str, Kube]) -> AsyncIterator[tuple[str, float]]:
    """``too_big_gang``'s Job created in the manager, in a fresh namespace with its queues
    (gangcheck's deadline 6 s and backoff 60 s in the workers): (the namespace, when the Job
    was created). After: the Job deleted, the nodes the gang ran on in worker-2 removed, and
    in each worker, once it holds no request for the gang, every node its cloud made for it."""
    manager = kubes[MANAGER]
    namespace = await fresh_namespace(kubes)
    async with queues(kubes, namespace, deadline=6, backoff=60):
        began = time.monotonic()
        await manager.create(JOB, too_big_gang(), namespace)
        try:
            yield namespace, began
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(kubes[WITH_ROOM], namespace)
            for worker in (STOCKED_OUT, WITH_ROOM):
                await cleanup_delivered(kubes[worker], namespace)


async def both_given_up(manager: Kube, namespace: str, *, timeout: float) -> Obj:
    """The manager's Workload of the gang of ``namespace`` once its record has given both
    workers up."""

    async def nowhere_left() -> Obj | None:
        wl = await manager_workload(manager, namespace)
        record = record_of(wl) if wl is not None else {}
        return wl if len(record.get("failed") or {}) == 2 else None

    return await eventually(nowhere_left, timeout=timeout, what="both workers given up")


@pytest.mark.timeout(150)
async def test_a_gang_that_fits_nowhere_is_tried_once_in_each_worker_then_waits_said_why(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess
) -> None:
    """A gang whose members ask 16 GPUs each, where every node of either cloud has 8: tried in
    one worker at a time, each given up once its attempt fails there (its cloud's
    CapacityIsNotFound on gangcheck's request), then nowhere left: the Workload keeps its
    quota in the manager, nominated nowhere, the record naming each worker given up and why,
    one NoWorker Event, written once (before 0746537 a second one came a pass later), all
    in diagnose."""
    manager = kubes[MANAGER]
    async with too_big_gang_submitted(kubes) as (namespace, began):
        wl = await both_given_up(manager, namespace, timeout=90)
        took = time.monotonic() - began
        await asyncio.sleep(3)  # passes more: the record and its Event stay as they are
        wl = await manager.get(WORKLOAD, wl["metadata"]["name"], namespace)
        record = record_of(wl)
        assert record["nominated"] == [], record
        assert sorted(record["tried"]) == [STOCKED_OUT, WITH_ROOM], record
        assert record["reason"].startswith("no worker left to try (tried and failed: "), record
        assert is_true(wl, "QuotaReserved"), wl["status"]  # queued, never lost
        assert not wl["status"].get("nominatedClusterNames"), wl["status"]
        told = await events_on(manager, wl, "NoWorker")
        assert [int(e.get("count") or 1) for e in told] == [1], [
            (e.get("count"), e["message"]) for e in told
        ]
        falls = await events_on(manager, wl, "DispatchFallback")
        assert sorted(e["message"].split(":")[0] for e in falls) == [
            f"gave up on {STOCKED_OUT}",
            f"gave up on {WITH_ROOM}",
        ], falls
        text = render_text(
            await diagnose(manager, f"workload/{namespace}/{wl['metadata']['name']}")
        )
        assert "no worker nominated: no worker left to try" in text, text
        for worker in (STOCKED_OUT, WITH_ROOM):
            assert f"given up: {worker} (" in text, text
        bed.measurements.append(
            f"dispatcher, a gang that fits nowhere: both workers given up {took:.1f}s after "
            "the Job, one NoWorker Event"
        )


#: The wait before a gang every worker failed for is tried again, as the bed's dispatcher
#: runs (``--round-wait``; 60 s by default): long enough that the tests of a gang that fits
#: nowhere read its first round's end, short enough to see the next.
ROUND_WAIT = 15


def _rounds_begun(process: ManagedProcess) -> float:
    """``gangcheck_dispatch_rounds_total`` as the dispatcher's metrics endpoint says it."""
    url = f"http://127.0.0.1:{process.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r"^gangcheck_dispatch_rounds_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@contextlib.asynccontextmanager
async def bigger_nodes(kube: Kube, gpus: int) -> AsyncIterator[None]:
    """worker-2's cloud making nodes of ``gpus`` GPUs (its ConfigMap changed: the cloud
    reads it again at each change); as before after."""
    namespace, _, name = SIM_CONFIG_MAP.partition("/")
    before = await kube.get(CONFIG_MAP, name, namespace)
    config = yaml.safe_load(before["data"]["config"])
    config["nodeGroups"][0]["gpus"] = gpus
    patch = {"data": {"config": yaml.safe_dump(config, sort_keys=False)}}
    await kube.merge_patch(CONFIG_MAP, name, patch, namespace)
    try:
        yield
    finally:
        await kube.merge_patch(CONFIG_MAP, name, {"data": before["data"]}, namespace)


@pytest.mark.timeout(150)
async def test_a_gang_every_worker_failed_for_is_tried_again_in_a_new_round(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess
) -> None:
    """Members of 16 GPUs, every node of either cloud 8: round 1 tries each worker once and
    gives both up (their clouds' CapacityIsNotFound). Then worker-2's cloud gets nodes of 16
    GPUs (a stockout that ended). ``ROUND_WAIT`` seconds after the last was given up, round
    2 tries them again by rank, one at a time (worker-1 first, by name: it fails again), and
    the gang is admitted in worker-2. Before, the gang waited for good, nominated nowhere,
    holding its quota in the manager."""
    manager, two = kubes[MANAGER], kubes[WITH_ROOM]
    async with too_big_gang_submitted(kubes) as (namespace, began):
        wl = await both_given_up(manager, namespace, timeout=60)
        first = record_of(wl)
        over = time.monotonic() - began
        assert first["nominated"] == [] and "round" not in first, first
        assert "; round 2 at " in first["reason"], first
        async with bigger_nodes(two, 16):

            async def placed_in_round_2() -> Obj | None:
                wl = await manager_workload(manager, namespace)
                if wl is None or record_of(wl).get("admitted") != WITH_ROOM:
                    return None
                return wl if is_true(wl, "Admitted") else None

            wl = await eventually(
                placed_in_round_2, timeout=ROUND_WAIT + 60, what="admitted in round 2"
            )
            took = time.monotonic() - began
        record = record_of(wl)
        assert wl["status"]["clusterName"] == WITH_ROOM, wl["status"]
        assert record["round"] == 2 and record["nominated"] == [WITH_ROOM], record
        assert set(record["failed"]) <= {STOCKED_OUT}, record  # round 2's given up only
        # each worker nominated once a round (the same words twice make one Event, counted)
        told = await events_on(manager, wl, "Nominated")
        per_worker = {
            worker: sum(
                int(e.get("count") or 1)
                for e in told
                if e["message"].startswith(f"nominated {worker}: ")
            )
            for worker in (STOCKED_OUT, WITH_ROOM)
        }
        # worker-1 comes first by name in round 2 as in round 1, when nothing else ranks
        # them: tried again and given up again (by rank it could come second, not tried)
        assert per_worker[WITH_ROOM] == 2 and per_worker[STOCKED_OUT] in (1, 2), told
        again = [e["message"] for e in told if "round 2, every worker having" in e["message"]]
        assert len(again) == 1, told
        assert took - over >= ROUND_WAIT - 2, (over, took)
        assert _rounds_begun(dispatcher) >= 1  # this process began one at least
        text = render_text(
            await diagnose(manager, f"workload/{namespace}/{wl['metadata']['name']}")
        )
        assert "round 2: every worker failed in each round before" in text, text
        bed.measurements.append(
            f"dispatcher, rounds: round 1 over {over:.1f}s after the Job, the gang "
            f"admitted in {WITH_ROOM} in round 2, {took:.1f}s after it "
            f"(--round-wait={ROUND_WAIT})"
        )


@pytest.mark.timeout(120)
async def test_a_worker_without_the_gangs_local_queue_is_given_up_and_the_next_tried(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess
) -> None:
    """The namespace's LocalQueue missing in worker-1 (a new user made it in the manager and
    worker-2 only): no room now anywhere, worker-1 is nominated by name, and Kueue there
    cannot queue the copy (QuotaReserved False, Inadmissible: 'LocalQueue lq doesn't
    exist'): nothing fails there, gangcheck never sees it. The dispatcher gives worker-1 up,
    said why, and the gang is admitted in worker-2. Before, worker-1 stayed nominated for
    good, the record saying only that it was tried by name."""
    manager, one, two = kubes[MANAGER], kubes[STOCKED_OUT], kubes[WITH_ROOM]

    await worker_2_empty(two)
    namespace = await fresh_namespace(kubes)
    async with queues(kubes, namespace):
        await one.delete(LOCAL_QUEUE, "lq", namespace)
        began = time.monotonic()
        await manager.create(JOB, gang_job("gang"), namespace)
        try:
            wl = await admitted_in_a_worker(manager, namespace, timeout=60)
            took = time.monotonic() - began
            assert wl["status"]["clusterName"] == WITH_ROOM
            record = record_of(wl)
            assert record["tried"] == [STOCKED_OUT, WITH_ROOM], record
            assert record["failed"][STOCKED_OUT].startswith(
                "not queued there: LocalQueue lq doesn't exist"
            ), record
            assert not await deliveries(one, namespace), "worker-1 scaled up for a copy"
            bed.measurements.append(
                f"dispatcher, no LocalQueue in {STOCKED_OUT}: given up, admitted in "
                f"{WITH_ROOM} {took:.1f}s after the Job"
            )
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            await cleanup_winner(two, namespace)
            await cleanup_delivered(two, namespace)
