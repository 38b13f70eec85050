"""The dispatcher's edge (gangcheck.dispatcher) on in-memory API servers: a manager and its
workers, each a FakeKube. Bad input: a MultiKueueCluster not Active, its Secret missing or
without a kubeconfig, a worker without gangcheck, a worker that does not answer; the
Workload keeps its quota and gets the reasons; the copy of the nominated worker failing;
a restart; the record's word on a copy Kueue has not made, gone once it makes it; nothing
ever written in a worker."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from gangcheck.dispatcher import (
    _WORKER_TRIM,
    SKIP_REWORDED_EVERY,
    Dispatcher,
    _connect,
    _copy_state,
    _view_of,
)
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ForbiddenError, TransientError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    EVENT,
    LEASE,
    MULTIKUEUE_CLUSTER,
    MULTIKUEUE_CONFIG,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    SECRET,
    WORKLOAD,
)
from gangcheck.logic.attempt import published
from gangcheck.logic.attempt.published import KEEP_SECONDS, Outcome, Seen
from gangcheck.logic.dispatch import KUEUE_ADMISSION, RECORD_ANNOTATION, DispatchRecord, describe
from gangcheck.model.names import (
    CONTROLLER_NAME,
    FULFILLED,
    PHASE_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    WORKLOAD_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.objects import Obj
from gangcheck.telemetry import Metrics
from tests.fakes.kube import FakeKube

NS = "team"
KUEUE_NS = "kueue-system"


class Manager(FakeKube):
    """The manager: also answers the server-side apply of a Workload's status, as the API
    server would for the fields sent (only ``nominatedClusterNames`` here), and records the
    field manager it came as."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[tuple[str, list[str]]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        assert method == "PATCH" and path.endswith("/status"), (method, path)
        body, query = kwargs["body"], kwargs["query"]
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        self.applied.append((query["fieldManager"], body["status"]["nominatedClusterNames"]))
        return await self.merge_patch(
            WORKLOAD, name, {"status": body["status"]}, namespace, subresource="status"
        )


def active(status: str = "True", reason: str = "Active", message: str = "") -> list[Obj]:
    return [{"type": "Active", "status": status, "reason": reason, "message": message}]


def workload(name: str = "job-gang") -> Obj:
    template = {
        "spec": {
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "8"}}}
            ]
        }
    }
    return {
        "apiVersion": WORKLOAD.api_version,
        "kind": WORKLOAD.kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"podSets": [{"name": "main", "count": 2, "template": template}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admissionChecks": [{"name": "multikueue", "state": "Pending"}],
        },
    }


def gpu_node(name: str) -> Obj:
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def worker(
    *,
    gangcheck: bool = True,
    nodes: int = 0,
    kube: FakeKube | None = None,
    check_active: str = "True",
) -> FakeKube:
    kube = kube if kube is not None else FakeKube()
    if gangcheck:
        kube.add(
            {
                "apiVersion": ADMISSION_CHECK.api_version,
                "kind": ADMISSION_CHECK.kind,
                "metadata": {"name": "gpu"},
                "spec": {"controllerName": CONTROLLER_NAME},
                "status": {"conditions": active(check_active)},
            }
        )
    kube.add(*(gpu_node(f"n{i}") for i in range(nodes)))
    return kube


Connect = Callable[[bytes], Awaitable[Kube]]


def multikueue_config(*clusters: str) -> Obj:
    return {
        "apiVersion": MULTIKUEUE_CONFIG.api_version,
        "kind": MULTIKUEUE_CONFIG.kind,
        "metadata": {"name": "multikueue"},
        "spec": {"clusters": list(clusters)},
    }


def bed(
    workers: dict[str, FakeKube | None],
    *,
    inactive: tuple[str, ...] = (),
    config: tuple[str, ...] | None = None,
    manager: Manager | None = None,
) -> tuple[Manager, Dispatcher, Connect]:
    """A manager with MultiKueue's check and its MultiKueueConfig (listing ``config``, by
    default every worker), one MultiKueueCluster and Secret per worker (None: the Secret is
    missing), a Workload to dispatch; the dispatcher connecting to the fakes."""
    manager = manager if manager is not None else Manager()
    manager.add(
        {
            "apiVersion": ADMISSION_CHECK.api_version,
            "kind": ADMISSION_CHECK.kind,
            "metadata": {"name": "multikueue"},
            "spec": {
                "controllerName": "kueue.x-k8s.io/multikueue",
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "MultiKueueConfig",
                    "name": "multikueue",
                },
            },
        },
        multikueue_config(*(config if config is not None else workers)),
        workload(),
    )
    by_config: dict[bytes, FakeKube] = {}
    for name, kube in workers.items():
        cluster = {
            "apiVersion": MULTIKUEUE_CLUSTER.api_version,
            "kind": MULTIKUEUE_CLUSTER.kind,
            "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": name}}},
            "status": {
                "conditions": active("False", "BadConfig", "x") if name in inactive else active()
            },
        }
        manager.add(cluster)
        if kube is not None:
            kubeconfig = f"kubeconfig of {name}".encode()
            by_config[kubeconfig] = kube
            manager.add(secret(name, kubeconfig))

    async def connect(config: bytes) -> FakeKube:
        return by_config[config]

    return manager, Dispatcher(manager, metrics=Metrics(), connect=connect), connect


def secret(name: str, kubeconfig: bytes) -> Obj:
    """The Secret MultiKueue holds for the worker ``name``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": KUEUE_NS},
        "data": {"kubeconfig": base64.b64encode(kubeconfig).decode()},
    }


def record(manager: FakeKube) -> DispatchRecord:
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    return DispatchRecord.from_annotation(
        wl["metadata"].get("annotations", {}).get(RECORD_ANNOTATION)
    )


def events(manager: FakeKube) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in manager.all_of(EVENT)]


async def test_the_gang_goes_where_it_fits_now_written_as_kueue_admission() -> None:
    one, two = worker(), worker(nodes=2)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two})
    await dispatcher.pass_once()
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-2"])]
    assert record(manager).nominated == ("worker-2",)
    assert "fits now in worker-2" in record(manager).reason
    assert [r for r, _ in events(manager)] == ["Nominated"]
    assert not one.writes and not two.writes  # nothing written in a worker


async def test_a_gang_does_not_fit_now_on_a_workers_nodes_being_deleted() -> None:
    """Worker-1's nodes are being deleted (a scale-down, a NodeClaim gone): capacity going,
    not room; worker-2's are idle. The gang fits now in worker-2 only."""
    one = worker()
    for name in ("n0", "n1"):
        going = gpu_node(name)
        going["metadata"]["deletionTimestamp"] = "2026-12-05T10:00:00Z"
        one.add(going)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-2",)
    assert "fits now in worker-2" in record(manager).reason


BAD = {
    "Secret missing": ({"worker-1": None}, (), "Secret kueue-system/worker-1 not found"),
    "MultiKueueCluster not Active": ({}, ("worker-1",), "not Active (BadConfig: x)"),
    "no gangcheck in the worker": ({"worker-1": worker(gangcheck=False)}, (), "no gangcheck"),
    "gangcheck's check there not Active": (
        {"worker-1": worker(nodes=2, check_active="False")},
        (),
        "no AdmissionCheck of gangcheck.io/atomic-provisioning Active",
    ),
}


@pytest.mark.parametrize(("given", "inactive", "why"), BAD.values(), ids=BAD.keys())
async def test_a_bad_worker_is_skipped_with_its_reason_and_the_next_used(
    given: dict[str, FakeKube | None], inactive: tuple[str, ...], why: str
) -> None:
    workers: dict[str, FakeKube | None] = {"worker-1": worker(nodes=2), **given}
    workers["worker-2"] = worker()
    manager, dispatcher, _ = bed(workers, inactive=inactive)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert why in got.skipped["worker-1"], got.skipped


async def test_an_unreachable_worker_is_skipped() -> None:
    one = worker(nodes=2)
    one.fail("list", "*", error=503, times=99)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-2",)
    assert record(manager).skipped["worker-1"].startswith("unreachable")


async def test_nowhere_to_go_the_workload_stays_queued_with_the_reasons() -> None:
    manager, dispatcher, _ = bed({"worker-1": None, "worker-2": worker(gangcheck=False)})
    await dispatcher.pass_once()
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    assert not wl["status"].get("nominatedClusterNames")
    assert wl["status"]["conditions"][0]["type"] == "QuotaReserved"  # untouched: queued
    assert not manager.applied
    ((reason, message),) = events(manager)
    assert reason == "NoWorker"
    assert "worker-1: Secret" in message and "worker-2: no AdmissionCheck" in message
    text = dispatcher.metrics.render()  # for an alert: a gang with nowhere to go
    assert 'gangcheck_dispatch_waiting_gangs{state="no_worker"} 1' in text
    assert 'gangcheck_dispatch_waiting_gangs{state="nominated"} 0' in text


async def test_the_copy_failing_moves_on_and_a_restart_nominates_nothing_twice() -> None:
    one, two = worker(), worker()
    manager, first, connect = bed({"worker-1": one, "worker-2": two})
    await first.pass_once()
    assert record(manager).nominated == ("worker-1",)  # by name: nothing known of either
    # a restart: a new dispatcher reads the record; worker-1 still trying -> nothing written
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect)
    writes = len(manager.writes)
    await dispatcher.pass_once()
    assert len(manager.writes) == writes
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-1"])]
    # worker-1's copy: gangcheck's check went Retry
    copy = workload()
    copy["status"]["admissionChecks"] = [
        {"name": "gpu", "state": "Retry", "message": "rolled back"}
    ]
    one.add(copy)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.tried == ("worker-1", "worker-2")
    assert got.failed == {"worker-1": "check gpu Retry: rolled back"}
    assert manager.applied[-1] == (KUEUE_ADMISSION, ["worker-2"])
    assert [r for r, _ in events(manager)] == ["Nominated", "DispatchFallback", "Nominated"]
    text = dispatcher.metrics.render()
    assert 'gangcheck_dispatch_fallbacks_total{cluster="worker-1"} 1' in text
    assert 'gangcheck_dispatch_waiting_gangs{state="nominated"} 1' in text
    assert "gangcheck_dispatch_clusters_per_gang_count" not in text  # not admitted yet
    assert not one.writes and not two.writes


INADMISSIBLE = {
    "no LocalQueue of the name in the worker: at once": ("LocalQueue lq doesn't exist", 0),
    "its LocalQueue stopped: at once": ("LocalQueue lq is inactive", 0),
    "its ClusterQueue missing: after 30 s": ("ClusterQueue mc-gang doesn't exist", 30),
    "its ClusterQueue inactive: after 30 s": ("ClusterQueue mc-gang is inactive", 30),
}


@pytest.mark.parametrize(("message", "grace"), INADMISSIBLE.values(), ids=INADMISSIBLE.keys())
async def test_a_copy_the_worker_cannot_queue_gives_the_worker_up(message: str, grace: int) -> None:
    """Kueue in worker-1 cannot queue the copy (Kueue v0.17 workload_controller: QuotaReserved
    False, reason Inadmissible: its LocalQueue or ClusterQueue missing or inactive there), so
    gangcheck there never sees it and nothing fails. Before, worker-1 stayed nominated for
    good, the record saying only why it was chosen; now it is given up, said why, and the
    next nominated: at once for its LocalQueue (Kueue reads it from its API), after 30 s
    for its ClusterQueue (Kueue reads that from its in-memory queues, filled anew when it
    restarts: for a moment a healthy worker's copy may say so)."""
    one, two = worker(), worker()
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    clock = Clock()
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect, clock=clock)
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-1",)  # by name
    copy = workload()
    copy["status"] = {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Inadmissible",
                "message": message,
            }
        ]
    }
    one.add(copy)
    if grace:
        await dispatcher.pass_once()
        clock.now += timedelta(seconds=grace - 1)
        await dispatcher.pass_once()
        assert record(manager).nominated == ("worker-1",), record(manager)  # kept meanwhile
        clock.now += timedelta(seconds=1)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",), got
    assert got.failed["worker-1"].startswith(f"not queued there: {message}"), got.failed
    assert not one.writes and not two.writes


async def test_a_placed_workload_is_left_alone() -> None:
    manager, dispatcher, _ = bed({"worker-1": worker(nodes=2)})
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    wl["status"]["clusterName"] = "worker-1"
    manager.add(wl)
    await dispatcher.pass_once()
    assert not manager.writes


# -- a stockout seen at once, remembered for the next gangs; a burst spread --------------------


def not_found_request(name: str = "job-gang") -> Obj:
    """gangcheck's request in a worker for the Workload ``name``, as cluster-autoscaler
    leaves it when no node group can host the pods."""
    return {
        "apiVersion": PROVISIONING_REQUEST.api_version,
        "kind": PROVISIONING_REQUEST.kind,
        "metadata": {
            "name": f"{name}-gpu-1",
            "namespace": NS,
            "annotations": {WORKLOAD_ANNOTATION: name},
        },
        "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"},
        "status": {
            "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted"},
                {
                    "type": "Provisioned",
                    "status": "False",
                    "reason": "CapacityIsNotFound",
                    "message": "Capacity is not found, CA will try to find it later.",
                },
            ]
        },
    }


def nominated_of(manager: FakeKube, name: str) -> list[str]:
    wl = manager.stored(WORKLOAD, name, NS)
    assert wl is not None
    return list(wl["status"].get("nominatedClusterNames") or [])


async def test_a_source_that_cannot_deliver_is_given_up_at_once_and_remembered() -> None:
    one, two = worker(), worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two})
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]  # by name: nothing known
    one.add(workload(), not_found_request())  # its copy there, its request not found
    await dispatcher.pass_once()  # no deadline waited for: the next pass moves on
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert "CapacityIsNotFound" in got.failed["worker-1"]
    assert "worker-1" in got.failed_at
    assert [r for r, _ in events(manager)] == ["Nominated", "DispatchFallback", "Nominated"]
    # worker-1 removed its copy and request (gangcheck's rollback): the record remembers
    one.remove(WORKLOAD, "job-gang", NS)
    one.remove(PROVISIONING_REQUEST, "job-gang-gpu-1", NS)
    manager.add(workload("job-gang-2"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang-2") == ["worker-2"]
    assert not one.writes and not two.writes


async def test_a_burst_goes_one_gang_per_worker_when_nothing_is_known() -> None:
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker()})
    manager.add(workload("job-gang-2"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    assert nominated_of(manager, "job-gang-2") == ["worker-2"]


class HeldManager(Manager):
    """The manager, holding each nomination until `together` are in flight at once."""

    def __init__(self, together: int) -> None:
        super().__init__()
        self.barrier = asyncio.Barrier(together)

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        await asyncio.wait_for(self.barrier.wait(), 10)
        return await super().request(method, path, **kwargs)


async def test_a_bursts_nominations_are_written_side_by_side() -> None:
    """Three gangs of one pass, each decided on the nominations before it, are nominated at
    once: the manager answers none until all three are in flight (one after another, the
    last gang would wait two round trips per gang before it)."""
    workers = {f"worker-{i}": worker() for i in (1, 2, 3)}
    manager, dispatcher, _ = bed(workers, manager=HeldManager(together=3))
    manager.add(workload("job-gang-2"), workload("job-gang-3"))
    await asyncio.wait_for(dispatcher.pass_once(), 20)
    nominated = [nominated_of(manager, n) for n in ("job-gang", "job-gang-2", "job-gang-3")]
    assert sorted(c for cs in nominated for c in cs) == ["worker-1", "worker-2", "worker-3"]
    assert [r for r, _ in events(manager)] == ["Nominated"] * 3


async def test_a_gang_whose_record_cannot_be_written_is_left_for_the_next_pass() -> None:
    """A record refused (the Workload changed meanwhile) leaves that gang unnominated and
    untold, the other nominated beside it; the next pass nominates it, on the worker the
    other was not sent to."""
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker()})
    manager.add(workload("job-gang-2"))
    manager.fail("patch", "Workload", "job-gang", 409)
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == []
    (first,) = nominated_of(manager, "job-gang-2")
    assert [r for r, _ in events(manager)] == ["Nominated"]
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang-2") == [first]
    assert nominated_of(manager, "job-gang") == [({"worker-1", "worker-2"} - {first}).pop()]
    assert [r for r, _ in events(manager)] == ["Nominated", "Nominated"]


async def test_room_for_one_gang_is_counted_with_the_gang_just_nominated_there() -> None:
    manager, dispatcher, _ = bed({"worker-1": worker(nodes=2), "worker-2": worker()})
    manager.add(workload("job-gang-2"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]  # fits now
    assert nominated_of(manager, "job-gang-2") == ["worker-2"]  # not next to it


async def test_a_change_of_a_workload_wakes_a_pass_before_the_poll() -> None:
    changed = asyncio.Event()

    class Watched(Manager):
        async def watch(self, res: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
            if res is WORKLOAD:
                await changed.wait()
                created = workload("job-new")
                created["metadata"]["resourceVersion"] = "99"
                yield {"type": "ADDED", "object": created}
            await asyncio.Event().wait()  # then quiet

    manager = Watched()
    dispatcher = Dispatcher(manager, metrics=Metrics(), interval=60.0)
    task = asyncio.create_task(dispatcher.run())
    try:
        for _ in range(100):
            if dispatcher.passes:
                break
            await asyncio.sleep(0.01)
        assert dispatcher.passes == 1
        changed.set()
        for _ in range(100):
            if dispatcher.passes > 1:
                break
            await asyncio.sleep(0.01)
        assert dispatcher.passes == 2  # woken, not the 60 s poll
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_its_own_writes_wake_no_pass_a_change_by_another_does() -> None:
    """The watch brings back the Workload as the pass's record and nomination left it: that
    pass took them into account, so they wake nothing (a pass woken by them finds nothing to
    do, and a worker's change arriving meanwhile waits for it to end); Kueue's change after
    them wakes a pass at once."""
    manager, _, connect = bed({"worker-1": worker(), "worker-2": worker(nodes=2)})
    echoes: asyncio.Queue[Obj] = asyncio.Queue()

    async def watch(res: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        while res is WORKLOAD:
            yield {"type": "MODIFIED", "object": await echoes.get()}
        await asyncio.Event().wait()  # the other kinds: quiet

    writes: list[Obj] = []
    patch = manager.merge_patch

    async def merge_patch(*args: Any, **kwargs: Any) -> Obj:
        reply = await patch(*args, **kwargs)
        writes.append(reply)
        return reply

    manager.watch = watch  # type: ignore[method-assign]
    manager.merge_patch = merge_patch  # type: ignore[method-assign]
    dispatcher = Dispatcher(manager, metrics=Metrics(), interval=60.0, connect=connect)
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: dispatcher.passes == 1)
        assert nominated_of(manager, "job-gang") == ["worker-2"]
        # the Workload as each of its two writes left it (the record, then the nomination)
        assert [w["kind"] for w in writes] == ["Workload", "Workload"]
        for echo in writes:
            await echoes.put(echo)
        await until(echoes.empty)
        await asyncio.sleep(0.2)
        assert dispatcher.passes == 1
        kueues = copy.deepcopy(writes[-1])  # Kueue's change after them
        kueues["metadata"]["resourceVersion"] = str(manager.last_rv + 1)
        await echoes.put(kueues)
        await until(lambda: dispatcher.passes == 2)  # woken, not the 60 s poll
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_running_its_passes_read_from_caches_listed_once() -> None:
    """Running, the dispatcher lists each kind it reads in the manager, and in each worker,
    once, then keeps it by watch: its passes (one every 0.01 s here; every second and on each
    change by default) list nothing more, in the manager or in a worker, nor get anything
    there: gangcheck's Lease there and the cluster's identity are read by the first pass,
    then in the background every ``lease_every`` seconds (a minute here: none in the test),
    and each reads the first pass's own writes (the record, the nomination) from
    its cache before any watch brings them back: nothing written twice. Before, every pass
    listed the manager's AdmissionChecks and all its Workloads (thousands in a large
    manager), even with none waiting, and while one waited, every node and pod of every
    worker."""
    one = worker(kube=WatchedWorker())
    two = worker(kube=WatchedWorker(), nodes=2)
    manager, _, connect = bed({"worker-1": one, "worker-2": two})

    async def quiet(res: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        await asyncio.Event().wait()  # open, and nothing changes
        yield {}

    manager.watch = quiet  # type: ignore[method-assign]
    dispatcher = Dispatcher(
        manager, metrics=Metrics(), interval=0.01, connect=connect, lease_every=60.0
    )
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: dispatcher.passes >= 30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    lists = sorted(c.kind for c in manager.calls if c.verb == "list")
    kinds = (ADMISSION_CHECK, WORKLOAD, MULTIKUEUE_CONFIG, MULTIKUEUE_CLUSTER)
    assert lists == sorted(res.kind for res in kinds)
    assert nominated_of(manager, "job-gang") == ["worker-2"]
    assert len(manager.writes_of(WORKLOAD.kind)) == 2  # the record, the nomination: once
    for held in (one, two):  # its caches' lists, and perhaps a first pass's before them
        listed = Counter(c.kind for c in held.calls if c.verb == "list")
        assert set(listed) == {res.kind for res in WATCHED} and max(listed.values()) <= 2
        got = Counter(c.kind for c in held.calls if c.verb == "get")
        assert got == {LEASE.kind: 1, NAMESPACE.kind: 1}  # the first pass's, once


# -- a change in a worker wakes a pass: its requests watched -------------------------------------


class WatchedWorker(FakeKube):
    """A worker whose watches (of ProvisioningRequests, of Workloads) bring, once ``changed``
    is set, a change of each object of their kind in ``changes`` (or are refused:
    ``forbidden``), then stay quiet. It counts the watches open on it now (``open``) and
    the times its client was closed (``closed``)."""

    def __init__(self, *, forbidden: bool = False) -> None:
        super().__init__()
        self.changed = asyncio.Event()
        self.forbidden = forbidden
        self.watched: list[str] = []
        self.changes: list[Obj] = []
        self.open = 0
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1

    async def watch(self, res: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        self.watched.append(res.kind)
        if self.forbidden:
            raise ForbiddenError(403, "Forbidden", f"cannot watch {res.plural}")
        self.open += 1
        try:
            await self.changed.wait()
            for obj in self.changes:
                if obj["kind"] == res.kind:
                    yield {"type": "MODIFIED", "object": obj}
            await asyncio.Event().wait()  # then quiet
        finally:
            self.open -= 1


#: What the dispatcher keeps by watch in each worker while it runs (a cache each).
WATCHED = (ADMISSION_CHECK, NODE, POD, PROVISIONING_REQUEST, WORKLOAD)
WATCHES = len(WATCHED)


async def until(probe: Callable[[], bool]) -> None:
    for _ in range(300):
        if probe():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 3 s")


async def test_a_change_of_a_request_in_a_worker_wakes_a_pass_before_the_poll() -> None:
    one = worker(kube=WatchedWorker())
    assert isinstance(one, WatchedWorker)
    manager, _, connect = bed({"worker-1": one})
    dispatcher = Dispatcher(manager, metrics=Metrics(), interval=60.0, connect=connect)
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(
            lambda: (
                dispatcher.passes == 1
                and sorted(one.watched) == sorted(res.kind for res in WATCHED)
            )
        )
        assert nominated_of(manager, "job-gang") == ["worker-1"]
        # worker-1's copy and its request, not found: only the watch can tell before 60 s (a
        # request of a Workload not waiting there wakes nothing)
        one.add(workload(), not_found_request(), not_found_request("job-other"))
        stored = [
            one.stored(PROVISIONING_REQUEST, "job-other-gpu-1", NS),
            one.stored(WORKLOAD, "job-gang", NS),
            one.stored(PROVISIONING_REQUEST, "job-gang-gpu-1", NS),
        ]
        one.changes = [obj for obj in stored if obj is not None]
        one.changed.set()
        await until(lambda: "worker-1" in record(manager).failed)
        assert dispatcher.woken_by_workers == 2  # the copy, its request: not the other's
        assert "CapacityIsNotFound" in record(manager).failed["worker-1"]
        assert not one.writes  # read-only there
        watches = list(dispatcher._worker_watches.values())
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert watches and all(t.done() for ts in watches for t in ts)  # none left running


async def test_a_worker_refusing_the_watch_is_still_followed_by_the_poll() -> None:
    one = worker(kube=WatchedWorker(forbidden=True))
    manager, _, connect = bed({"worker-1": one, "worker-2": worker()})
    dispatcher = Dispatcher(manager, metrics=Metrics(), interval=0.05, connect=connect)
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: nominated_of(manager, "job-gang") == ["worker-1"])
        one.add(workload(), not_found_request())
        await until(lambda: nominated_of(manager, "job-gang") == ["worker-2"])
        assert dispatcher.woken_by_workers == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_copy_admitted_in_the_worker_is_recorded_at_once() -> None:
    """Its copy admitted in the nominated worker (seen by the watch on its Workloads), the
    record says so: a change of the manager's Workload, which has MultiKueue place it at once
    instead of after its 1 s batch of a worker's changes."""
    one = worker(kube=WatchedWorker(), nodes=2)
    assert isinstance(one, WatchedWorker)
    manager, _, connect = bed({"worker-1": one})
    dispatcher = Dispatcher(manager, metrics=Metrics(), interval=60.0, connect=connect)
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: dispatcher.passes == 1)
        assert record(manager).nominated == ("worker-1",)
        assert not record(manager).admitted
        copy = workload()
        copy["status"]["conditions"].append({"type": "Admitted", "status": "True"})
        one.add(copy)
        one.changes = [copy]
        one.changed.set()
        await until(lambda: record(manager).admitted == "worker-1")
        assert record(manager).nominated == ("worker-1",)
        assert [r for r, _ in events(manager)] == ["Nominated"]  # nothing more to tell
        passes = dispatcher.passes
        dispatcher._wake.set()
        await until(lambda: dispatcher.passes > passes)
        # clusters tried, counted once for the gang (before: at each nomination)
        text = dispatcher.metrics.render()
        assert "gangcheck_dispatch_clusters_per_gang_count 1" in text
        assert "gangcheck_dispatch_clusters_per_gang_sum 1" in text
        assert not one.writes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_copy_wait_said_on_the_record_goes_once_kueue_copies_the_workload() -> None:
    """A worker nominated a minute ago without Kueue's copy of the Workload: the record on the
    manager's Workload says so, written once; once the copy is there, the next pass writes
    the reason of the choice again, as ``gangcheck diagnose`` prints it (``describe``)."""
    one = worker(nodes=2)
    manager, dispatcher, _ = bed({"worker-1": one})
    await dispatcher.pass_once()
    chosen = record(manager)
    assert chosen.nominated == ("worker-1",)
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    a_minute_ago = datetime.now(UTC) - timedelta(seconds=60)
    stamp = a_minute_ago.strftime("%Y-%m-%dT%H:%M:%SZ")
    earlier = replace(chosen, nominated_at={"worker-1": stamp})
    wl["metadata"]["annotations"][RECORD_ANNOTATION] = earlier.to_annotation()
    manager.add(wl)
    await dispatcher.pass_once()
    waiting = record(manager)
    said = f"worker-1 nominated at {stamp}, and Kueue has not copied the Workload there"
    assert said in waiting.reason, waiting.reason
    assert said in describe(waiting)[0]
    writes = len(manager.writes)
    await dispatcher.pass_once()
    assert len(manager.writes) == writes  # stable: written once
    one.add(workload())  # Kueue's copy, trying there
    await dispatcher.pass_once()
    copied = record(manager)
    assert copied.reason == chosen.reason, copied.reason
    assert describe(copied)[0] == f"trying worker-1: {chosen.reason}"
    assert copied.nominated == ("worker-1",) and copied.nominated_at == {"worker-1": stamp}
    assert [r for r, _ in events(manager)] == ["Nominated"]  # nothing more to tell
    assert not one.writes


# -- a worker answering garbage ------------------------------------------------------------------


class Garbled(FakeKube):
    """A worker that answers the dispatcher's reads of ``kinds`` with ``answer``: an error
    other than the API's (a body that is not JSON) when it is one, else that list's items."""

    def __init__(self, kinds: tuple[str, ...], answer: BaseException | list[Any]) -> None:
        super().__init__()
        self.kinds, self.answer = kinds, answer

    async def list_objects(self, res: Any, *args: Any, **kwargs: Any) -> Obj:
        listing = await super().list_objects(res, *args, **kwargs)
        if res.kind not in self.kinds:
            return listing
        if isinstance(self.answer, BaseException):
            raise self.answer
        return {**listing, "items": self.answer}


NOT_JSON = ValueError("Expecting value: line 1 column 1 (char 0)")
GARBAGE = {
    "its lists answered with a body that is not JSON": (("Node",), NOT_JSON),
    "its requests without metadata": (("ProvisioningRequest",), [{"spec": {}}]),
    "its requests as strings": (("ProvisioningRequest",), ["garbage"]),
    "its checks with a spec that is a string": (("AdmissionCheck",), [{"spec": "x"}]),
}


@pytest.mark.parametrize(("kinds", "answer"), GARBAGE.values(), ids=GARBAGE.keys())
async def test_a_worker_answering_garbage_is_skipped_and_the_next_used(
    kinds: tuple[str, ...], answer: BaseException | list[Any]
) -> None:
    """Before, the error ended the pass, and ``run`` (which goes on after an API error
    only) with it: one worker's answer stopped the dispatch of every Workload."""
    one = worker(kube=Garbled(kinds, answer), nodes=2)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.skipped["worker-1"].startswith("unreadable answer"), got.skipped
    assert not one.writes


async def test_a_nominated_worker_whose_copy_is_garbage_is_given_up() -> None:
    copy = {"metadata": {"name": "job-gang", "namespace": NS}, "status": "garbage"}
    one, two = worker(kube=Garbled(("Workload",), [copy]), nodes=2), worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two})
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-1",)  # fits now
    await dispatcher.pass_once()  # its copy read: garbage
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.failed["worker-1"].startswith("unreachable: unreadable answer"), got.failed


async def test_a_nomination_written_by_another_dispatcher_is_not_fought() -> None:
    """Another dispatcher (its own field manager) nominates worker-2 after gangcheck
    nominated worker-1: gangcheck's apply (forced) would take it back on every pass, and the
    other write it again, each write waking the next pass. It is left as written; the record
    says who wrote it, written once."""
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker()})
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    wl["status"]["nominatedClusterNames"] = ["worker-2"]
    wl["metadata"]["managedFields"] = [
        {
            "manager": "their-dispatcher",
            "operation": "Update",
            "subresource": "status",
            "fieldsV1": {"f:status": {"f:nominatedClusterNames": {}}},
        }
    ]
    manager.add(wl)
    await dispatcher.pass_once()
    writes = len(manager.writes)
    await dispatcher.pass_once()
    assert len(manager.writes) == writes  # no loop
    assert nominated_of(manager, "job-gang") == ["worker-2"]
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-1"])]  # the first, before theirs
    assert "by their-dispatcher, not by gangcheck" in record(manager).reason


# -- the workers of the Workload's MultiKueueConfig, and only those --------------------------------


async def test_a_worker_outside_the_checks_multikueue_config_is_never_nominated() -> None:
    """MultiKueue copies a Workload only to the clusters of its check's MultiKueueConfig
    (Kueue v0.17, remoteClientsForAC): worker-1, where the gang fits now, is another
    config's; nominated, the Workload would wait for a copy Kueue never makes."""
    one = worker(nodes=2)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()}, config=("worker-2",))
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert "worker-1" not in got.skipped and "worker-1" not in got.tried
    assert not one.calls  # not even read


async def test_a_cluster_the_config_lists_without_a_multikueue_cluster_is_skipped() -> None:
    manager, dispatcher, _ = bed({"worker-2": worker()}, config=("worker-1", "worker-2"))
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.skipped == {"worker-1": "no MultiKueueCluster worker-1"}


async def test_the_checks_multikueue_config_missing_leaves_the_workload_queued() -> None:
    manager, dispatcher, _ = bed({"worker-1": worker(nodes=2)})
    manager.remove(MULTIKUEUE_CONFIG, "multikueue")
    await dispatcher.pass_once()
    assert not manager.applied
    ((reason, message),) = events(manager)
    assert reason == "NoWorker"
    assert "MultiKueueConfig multikueue of multikueue not found" in message, message
    assert record(manager).reason == message
    await dispatcher.pass_once()
    assert len(events(manager)) == 1  # said once


async def test_a_workers_copies_are_read_once_per_pass_not_once_per_workload() -> None:
    """A worker answering slowly cost that much per Workload nominated there (a get of its
    copy each, one after another), and every Workload of the pass waited for them all: its
    Workloads are listed once per pass, beside its other reads."""
    one, two = worker(), worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two})
    for i in range(4):
        manager.add(workload(f"job-gang-{i}"))
    await dispatcher.pass_once()
    assert sum(nominated_of(manager, n) == ["worker-1"] for n in ("job-gang", "job-gang-0")) >= 1
    before = len(one.calls)
    await dispatcher.pass_once()
    assert [c.verb for c in one.calls[before:] if c.kind == "Workload"] == ["list"]


SOURCES = {
    "a ClusterProfile, no kubeconfig": (
        {"clusterProfileRef": {"name": "w1-profile"}},
        "no kubeconfig Secret (ClusterProfile w1-profile: not read)",
    ),
    "no source at all": ({}, "no kubeconfig Secret"),
    "a kubeconfig naming no Secret": (
        {"kubeConfig": {"locationType": "Secret", "location": ""}},
        "no kubeconfig Secret",
    ),
}


@pytest.mark.parametrize(("source", "why"), SOURCES.values(), ids=SOURCES.keys())
async def test_a_multikueue_cluster_without_a_kubeconfig_secret_is_skipped_said_why(
    source: dict[str, Any], why: str
) -> None:
    """Before, the Secret named '' was asked for: a GET of the Secrets' collection (a list,
    which the dispatcher's Role on Secrets does not grant), or a list read as a Secret."""
    manager, dispatcher, _ = bed({"worker-1": worker(nodes=2), "worker-2": worker()})
    cluster = manager.stored(MULTIKUEUE_CLUSTER, "worker-1")
    assert cluster is not None
    cluster["spec"]["clusterSource"] = source
    manager.add(cluster)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.skipped == {"worker-1": why}
    assert not [c for c in manager.calls if c.kind == "Secret" and not c.name]


WORKER_ERRORS = {
    "Kueue's API of this version not served (another Kueue version)": (
        "AdmissionCheck",
        404,
        "AdmissionCheck (kueue.x-k8s.io/v1beta2) not served there: another Kueue version, "
        "or not installed",
    ),
    "ProvisioningRequests not served (no CRD)": (
        "ProvisioningRequest",
        404,
        "ProvisioningRequest (autoscaling.x-k8s.io/v1) not served there",
    ),
    "the reader's rights missing": (
        "Node",
        403,
        "refused (the reader's rights, manifests/dispatcher/worker/reader.yaml, not granted "
        "there to this Secret's identity)",
    ),
    "a server error": ("Pod", 500, "unreachable: "),
    "its credentials refused (a token expired or revoked)": (
        "AdmissionCheck",
        401,
        "credentials refused (401: the token or client certificate of its kubeconfig Secret "
        "expired, was revoked or is not this cluster's)",
    ),
}


@pytest.mark.parametrize(
    ("kind", "status", "why"), WORKER_ERRORS.values(), ids=WORKER_ERRORS.keys()
)
async def test_a_workers_refusal_is_said_for_what_it_is(kind: str, status: int, why: str) -> None:
    """Before, every error of a worker's reads was said 'unreachable', a worker of another
    Kueue version (its API not served) or without the reader's rights included."""
    one = worker(nodes=2)
    one.fail("list", kind, error=status, times=99)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.skipped["worker-1"].startswith(why), got.skipped


CREDENTIALS_REFUSED = "credentials refused (401: "


@pytest.mark.parametrize("kind", ["Lease", "Namespace"])
async def test_a_worker_refusing_its_credentials_on_a_get_is_skipped_though_its_lists_answer(
    kind: str,
) -> None:
    """worker-1's token revoked (or expired) after its caches were filled: a watch open is not
    authenticated again, so its lists still answer from them, but the gets of its Lease and
    identity answer 401; Kueue's own reads and writes there are refused as well. Before, a
    Lease or identity not read was 'not known' (logged) and worker-1, where the gang fits
    now, was nominated: a gang sent where nothing can reach it."""
    one = worker(nodes=2)
    one.add(gangcheck_lease(datetime.now(UTC)))
    one.fail("get", kind, error=401, times=99)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",), got
    assert got.skipped["worker-1"].startswith(CREDENTIALS_REFUSED), got.skipped
    assert not one.writes


def kubeconfig(user: str, cluster: str = "") -> bytes:
    """A kubeconfig of a server that answers nothing (port 1), its user and cluster entries
    (flow YAML) completed by ``user`` and ``cluster``."""
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: w\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:1'{cluster}}}}}]\n"
        f"users: [{{name: u, user: {{{user}}}}}]\n"
        "contexts: [{name: w, context: {cluster: c, user: u}}]\n"
    ).encode()


def bed_with_secret(
    kubeconfig: bytes, load: Connect = _connect
) -> tuple[Manager, Dispatcher, list[bytes]]:
    """worker-1's Secret holding ``kubeconfig``, loaded by ``load`` (by default as the
    dispatcher does, ``_connect``); worker-2 a fake without room. Returned with them: the
    kubeconfig once for every time it was handed to ``load``."""
    manager, _, connect = bed({"worker-1": worker(nodes=2), "worker-2": worker()})
    manager.add(secret("worker-1", kubeconfig))
    loaded: list[bytes] = []

    async def connecting(config: bytes) -> Kube:
        if config == kubeconfig:
            loaded.append(config)
            return await load(config)
        return await connect(config)

    return manager, Dispatcher(manager, metrics=Metrics(), connect=connecting), loaded


async def refused_in_one_pass(
    kubeconfig: bytes, load: Connect = _connect
) -> tuple[str, Dispatcher, list[bytes]]:
    """One pass (within 10 s) of `bed_with_secret`'s dispatcher, which sends the gang to
    worker-2: why worker-1 was skipped, the dispatcher (closed), the kubeconfigs loaded."""
    manager, dispatcher, loaded = bed_with_secret(kubeconfig, load)
    try:
        await asyncio.wait_for(dispatcher.pass_once(), 10)
    finally:
        await dispatcher.close()
    got = record(manager)
    assert got.nominated == ("worker-2",), got
    return got.skipped["worker-1"], dispatcher, loaded


async def test_an_unusable_kubeconfig_is_said_once_without_the_file_it_was_read_from() -> None:
    """Before, the reason named the temporary file the kubeconfig was read from, another at
    each pass: the record was written again, and a NoWorker Event sent, every pass (every
    second) for as long as the Secret stayed so."""
    manager, dispatcher, _ = bed_with_secret(b"not yaml: [")
    manager.add(secret("worker-2", b"not yaml: ["))  # nowhere to go: NoWorker
    try:
        for _ in range(3):
            await dispatcher.pass_once()
    finally:
        await dispatcher.close()
    got = record(manager)
    assert got.skipped["worker-1"].startswith(
        "Secret kueue-system/worker-1: unusable kubeconfig (not YAML"
    ), got.skipped
    assert "gangcheck-worker-" not in got.skipped["worker-1"], got.skipped
    assert len(manager.writes_of("Workload")) == 1, manager.writes
    assert [r for r, _ in events(manager)] == ["NoWorker"]


@pytest.mark.parametrize("config", [b"not yaml: [", kubeconfig("tokenFile: /t"), b"just words"])
async def test_a_kubeconfig_refused_is_not_read_again_until_its_secret_changes(
    config: bytes,
) -> None:
    """A pass a second reads the Secrets: a kubeconfig refused (not YAML, naming a file, or
    one the loader cannot use) was parsed, or written to a file and loaded, again at each
    one (up to a MiB each, per worker). Now its digest is remembered with the reason; a
    Secret changed is read afresh."""
    manager, dispatcher, loaded = bed_with_secret(config)
    parsed = 0
    real = yaml.safe_load

    def counting(text: Any) -> Any:
        nonlocal parsed
        parsed += text == config
        return real(text)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("gangcheck.dispatcher.yaml.safe_load", counting)
            for _ in range(3):
                await dispatcher.pass_once()
            assert "worker-1" in record(manager).skipped
            assert parsed == 1 and len(loaded) <= 1, (parsed, loaded)
            manager.add(secret("worker-1", b"kubeconfig of worker-1"))  # mended
            await dispatcher.pass_once()
            assert "worker-1" not in record(manager).skipped, record(manager).skipped
    finally:
        await dispatcher.close()


UNSAFE = {
    "an exec plugin": (
        "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, "
        "args: ['-c', 'touch %s; sleep 60']}",
        "",
    ),
    "an auth provider": ("auth-provider: {name: oidc, config: {idp-issuer-url: %s}}", ""),
    "a token file": ("tokenFile: %s", ""),
    "a client certificate file": ("client-certificate: %s, client-key: %s", ""),
    "a certificate authority file": ("token: t", ", certificate-authority: %s"),
    "basic auth": ("username: admin, password: '%s'", ""),
}


@pytest.mark.parametrize(("user", "cluster"), UNSAFE.values(), ids=UNSAFE.keys())
async def test_a_kubeconfig_naming_a_command_or_a_local_file_is_never_used(
    user: str, cluster: str, tmp_path: Any
) -> None:
    """A kubeconfig whose credentials come from a command to run, an auth provider to ask, a
    file of this pod's, or a password, as Kueue v0.17 refuses them (validateKubeconfig,
    unless MultiKueueAllowInsecureKubeconfigs) and its MultiKueueCluster turns not Active:
    the Secret is read before that shows. Before, the dispatcher ran the command (a pass
    waited for it, however long), or sent this pod's file (its own token) as the worker's
    credentials."""
    marker = tmp_path / "ran"
    local = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    named = str(marker) if user.startswith("exec") else local
    why, dispatcher, _ = await refused_in_one_pass(
        kubeconfig(user.replace("%s", named), cluster.replace("%s", local))
    )
    assert why.startswith("Secret kueue-system/worker-1: its kubeconfig "), why
    assert "not used by the dispatcher" in why, why
    assert "worker-1" not in dispatcher._workers
    assert not marker.exists()


def _bomb(levels: int) -> bytes:
    """A kubeconfig whose cluster entry holds ``10 ** levels`` strings once its YAML
    aliases are expanded, in under a KB of text."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines).encode() + b"\n" + kubeconfig("token: t", f", x: *l{levels - 1}")


NOT_LOADED = {
    "a billion laughs": (_bomb(9), "its kubeconfig holds more than 10000 values"),
    "a long string repeated": (
        b"s: &s " + b"x" * 200_000 + b"\n" + kubeconfig("token: t", ", x: [" + "*s, " * 6 + "]"),
        "its kubeconfig expands to more than",
    ),
    "nested deeper than a YAML reader goes": (
        b"x: " + b"[" * 5000 + b"]" * 5000,
        "unusable kubeconfig (nested too deep",
    ),
}


@pytest.mark.parametrize(("config", "said"), NOT_LOADED.values(), ids=NOT_LOADED.keys())
async def test_a_kubeconfig_too_large_or_too_deep_for_yaml_is_refused_not_loaded(
    config: bytes, said: str
) -> None:
    """One Secret writer's kubeconfig stopped every gang's dispatch: a billion laughs (under
    a KB) was handed to the loader, which formats its entries whole (10 s at 10**8 strings,
    out of memory at 10**9, and again after each restart); one nested a few thousand deep
    raised RecursionError out of the pass, which ended the dispatcher's run. Now each is
    refused, said why, and the other workers dispatched to."""

    async def never(given: bytes) -> Kube:
        raise AssertionError("a refused kubeconfig was loaded")

    why, _, loaded = await refused_in_one_pass(config, never)
    assert why.startswith(f"Secret kueue-system/worker-1: {said}"), why
    assert not loaded


# -- the workers held: closed once no longer listed, made again when their kubeconfig changes -----


def placed(manager: FakeKube) -> None:
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    wl["status"]["clusterName"] = "worker-2"
    manager.add(wl)


GONE: dict[str, tuple[Callable[[FakeKube], None], bool]] = {
    "dropped from its MultiKueueConfig": (
        lambda m: m.add(multikueue_config("worker-2")),
        False,
    ),
    "dropped from its MultiKueueConfig, no Workload waiting": (
        lambda m: m.add(multikueue_config("worker-2")),
        True,
    ),
    "its MultiKueueCluster deleted": (lambda m: m.remove(MULTIKUEUE_CLUSTER, "worker-1"), False),
    "its MultiKueueCluster deleted, no Workload waiting": (
        lambda m: m.remove(MULTIKUEUE_CLUSTER, "worker-1"),
        True,
    ),
    "its Secret deleted": (lambda m: m.remove(SECRET, "worker-1", KUEUE_NS), False),
}


@pytest.mark.parametrize(("change", "idle"), GONE.values(), ids=GONE.keys())
async def test_a_worker_gone_from_the_config_has_its_client_closed_and_watches_ended(
    change: Callable[[FakeKube], None], idle: bool
) -> None:
    """Before, its client and watches were kept for good (a worker dropped from the config,
    its MultiKueueCluster deleted: never read again, never closed). The other worker is kept
    as it was; the one gone is not connected again."""
    one, two = worker(kube=WatchedWorker()), worker(kube=WatchedWorker())
    assert isinstance(one, WatchedWorker) and isinstance(two, WatchedWorker)
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    made: list[bytes] = []

    async def connecting(kubeconfig: bytes) -> Kube:
        made.append(kubeconfig)
        return await connect(kubeconfig)

    dispatcher = Dispatcher(manager, metrics=Metrics(), interval=0.02, connect=connecting)
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: one.open == WATCHES and two.open == WATCHES)
        if idle:
            placed(manager)
        change(manager)
        await until(lambda: "worker-1" not in dispatcher._workers)
        passes = dispatcher.passes
        await until(lambda: dispatcher.passes >= passes + 3)  # and stays so
        assert "worker-1" not in dispatcher._workers
        assert "worker-1" not in dispatcher._worker_watches
        assert (one.open, one.closed) == (0, 1)
        assert (two.open, two.closed) == (WATCHES, 0)
        assert sorted(dispatcher._workers) == ["worker-2"]
        assert len(made) == 2  # each connected once
        assert not one.writes and not two.writes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert (one.closed, two.closed) == (1, 1)  # the one left closed on the way out


async def test_a_rotated_kubeconfig_is_read_through_and_a_no_op_update_keeps_the_client() -> None:
    """The Secret of worker-1 rotated to another server: its old client is closed and its
    watches ended, the new one read and watched. Before, the client of the first Secret was
    kept until its resourceVersion moved, and any update of it, even one leaving the
    kubeconfig as it was, made the client and its watches again."""
    old, new = worker(kube=WatchedWorker()), worker(kube=WatchedWorker())
    assert isinstance(old, WatchedWorker) and isinstance(new, WatchedWorker)
    manager, _, connect = bed({"worker-1": old})
    made: list[bytes] = []

    async def connecting(kubeconfig: bytes) -> Kube:
        made.append(kubeconfig)
        return new if kubeconfig == b"rotated" else await connect(kubeconfig)

    dispatcher = Dispatcher(
        manager, metrics=Metrics(), interval=0.02, connect=connecting, lease_every=0.02
    )
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: old.open == WATCHES)
        manager.add(secret("worker-1", b"kubeconfig of worker-1"))  # a no-op update
        passes = dispatcher.passes
        await until(lambda: dispatcher.passes >= passes + 3)
        assert made == [b"kubeconfig of worker-1"]
        assert (old.open, old.closed) == (WATCHES, 0)
        manager.add(secret("worker-1", b"rotated"))
        await until(lambda: new.open == WATCHES)
        assert made == [b"kubeconfig of worker-1", b"rotated"]
        assert dispatcher._workers["worker-1"].kube is new
        assert (old.open, old.closed) == (0, 1)
        read = len(old.calls)
        gets = len([c for c in new.calls if c.kind == LEASE.kind])  # in the background
        await until(lambda: len([c for c in new.calls if c.kind == LEASE.kind]) >= gets + 3)
        assert len(old.calls) == read  # no read of the old server any more
        assert not old.writes and not new.writes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- a worker that does not answer (a network black hole) ---------------------------------------


class Hanging(FakeKube):
    """A worker whose API server, once ``hanging``, never answers a list (a connect or read
    that hangs, not refused); ``hung`` counts the lists it was asked for since."""

    def __init__(self) -> None:
        super().__init__()
        self.hanging = False
        self.hung = 0

    async def list_objects(self, res: Any, *args: Any, **kwargs: Any) -> Obj:
        if self.hanging:
            self.hung += 1
            await asyncio.Event().wait()  # no answer, ever: only the dispatcher's bound ends it
        return await super().list_objects(res, *args, **kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


BOUND = 0.2


def bounded(manager: Manager, connect: Connect, clock: Clock) -> Dispatcher:
    return Dispatcher(manager, metrics=Metrics(), connect=connect, answer_within=BOUND, clock=clock)


async def test_a_worker_that_does_not_answer_is_skipped_within_the_bound_then_unread() -> None:
    """Before, a pass waited for every worker: one that did not answer held up the nomination
    of every Workload for the client's request timeout, at every pass. Now it is skipped
    after ``answer_within`` seconds, with the reason; the next passes skip it without asking
    until its window ends, then ask it again, and its window doubles while it stays silent."""
    one = Hanging()
    worker(kube=one, nodes=2)  # the gang would fit now there
    one.hanging = True
    manager, _, connect = bed({"worker-1": one, "worker-2": worker()})
    clock = Clock()
    dispatcher = bounded(manager, connect, clock)
    await asyncio.wait_for(dispatcher.pass_once(), 10)  # unbounded, it would never end
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-2"])]
    assert got.skipped["worker-1"] == (
        f"unreachable: no answer within {BOUND:g}s (tried again after 2026-12-05T12:00:30Z)"
    )
    asked = one.hung
    assert asked == 5  # its five lists, side by side, once
    writes = len(manager.writes)
    for seconds in (1, 29.9):  # in its window: not asked, the record as it was
        clock.now = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)
        await asyncio.wait_for(dispatcher.pass_once(), 10)
    assert one.hung == asked
    assert len(manager.writes) == writes
    clock.now = datetime(2026, 12, 5, 12, 0, 30, tzinfo=UTC)  # its window ended: asked again
    await asyncio.wait_for(dispatcher.pass_once(), 10)
    assert one.hung == 2 * asked
    assert record(manager).skipped["worker-1"].endswith("(tried again after 2026-12-05T12:01:30Z)")
    assert record(manager).nominated == ("worker-2",)  # kept, trying
    one.hanging = False  # it answers again: read at the end of its window, used again
    clock.now = datetime(2026, 12, 5, 12, 1, 30, tzinfo=UTC)
    await asyncio.wait_for(dispatcher.pass_once(), 10)
    assert "worker-1" not in record(manager).skipped
    assert not one.writes


async def test_a_nominated_worker_that_stops_answering_is_given_up_once_silent_again() -> None:
    """A nominated worker that stops answering is waited for through its first window of
    silence (a stall is no stockout: moving on would throw away what it brings up), kept
    nominated and not asked meanwhile; silent again when that window ends, it is given up as
    an unreachable one is, the next nominated in the same step."""
    one = Hanging()
    worker(kube=one, nodes=2)
    manager, _, connect = bed({"worker-1": one, "worker-2": worker()})
    clock = Clock()
    dispatcher = bounded(manager, connect, clock)
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-1",)  # fits now
    one.hanging = True
    for seconds in (0, 10, 29.9):  # silent, its first window: kept
        clock.now = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)
        await asyncio.wait_for(dispatcher.pass_once(), 10)
        got = record(manager)
        assert got.nominated == ("worker-1",) and not got.failed, got
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-1"])]
    clock.now = datetime(2026, 12, 5, 12, 0, 30, tzinfo=UTC)  # asked again: still silent
    await asyncio.wait_for(dispatcher.pass_once(), 10)
    got = record(manager)
    assert got.nominated == ("worker-2",)
    said = f"unreachable: no answer within {BOUND:g}s"
    assert got.failed["worker-1"].startswith(said), got.failed
    assert manager.applied[-1] == (KUEUE_ADMISSION, ["worker-2"])
    assert [r for r, _ in events(manager)] == ["Nominated", "DispatchFallback", "Nominated"]


def gangcheck_lease(renewed: datetime, *, duration: int = 15) -> Obj:
    """gangcheck's leader Lease in a worker, as leader.py leaves it renewed at ``renewed``."""
    return {
        "apiVersion": LEASE.api_version,
        "kind": LEASE.kind,
        "metadata": {"name": "gangcheck", "namespace": "gangcheck-system"},
        "spec": {
            "holderIdentity": "gangcheck-0",
            "leaseDurationSeconds": duration,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


STARTED = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


async def test_a_worker_whose_gangcheck_lease_is_stale_is_skipped_said_why() -> None:
    """worker-1's gangcheck died: its AdmissionCheck still says Active (gangcheck wrote it),
    its Lease was last renewed 36 s ago (duration 15 s, grace 20 s). The gang fits now in
    both; worker-1 would come first by name: it is skipped with the reason on the manager's
    Workload, worker-2 nominated. Nothing is written in either worker."""
    one, two = worker(nodes=2), worker(nodes=2)
    one.add(gangcheck_lease(STARTED - timedelta(seconds=36)))
    two.add(gangcheck_lease(STARTED - timedelta(seconds=1)))
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    clock = Clock()
    dispatcher = bounded(manager, connect, clock)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-2"])]
    assert got.skipped == {
        "worker-1": (
            "gangcheck down: its Lease gangcheck-system/gangcheck last renewed at "
            "2026-12-05T11:59:24Z (duration 15s)"
        )
    }
    assert f"skipped: worker-1 ({got.skipped['worker-1']})" in describe(got)
    assert not got.failed
    writes = len(manager.writes)
    clock.now = STARTED + timedelta(seconds=5)  # still down, same Lease: nothing written again
    await dispatcher.pass_once()
    assert len(manager.writes) == writes
    assert not one.writes and not two.writes
    assert [c.verb for c in one.calls if c.kind == LEASE.kind] == ["get", "get"]


async def test_a_lease_renewed_within_its_duration_and_grace_is_no_reason_to_skip() -> None:
    one = worker(nodes=2)
    one.add(gangcheck_lease(STARTED - timedelta(seconds=35)))  # a hand-over may take this long
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    await bounded(manager, connect, Clock()).pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.skipped


@pytest.mark.parametrize("status", [403, 404, 500])
async def test_a_lease_the_reader_cannot_get_is_not_known_no_skip_logged_once(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader's rights older than the Lease's rule (403), no Lease (404: leader election
    off there), or any other failure of that one read: gangcheck there is not known to be
    down, so the worker is used as before; the log says so once, not at every pass."""
    one = worker(nodes=2)
    one.add(gangcheck_lease(STARTED - timedelta(seconds=600)))  # would be stale if read
    one.fail("get", LEASE.kind, error=status, times=10)
    two = worker(nodes=2)
    two.add(gangcheck_lease(STARTED))
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    dispatcher = bounded(manager, connect, Clock())
    with caplog.at_level(logging.WARNING, logger="gangcheck.dispatcher"):
        for _ in range(3):
            await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.skipped, got
    said = [r.getMessage() for r in caplog.records if "is not known" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("worker worker-1: whether gangcheck is up there is not known")
    assert "Lease gangcheck-system/gangcheck" in said[0]
    if status == 403:
        assert "reader.yaml" in said[0]


class OddLease(FakeKube):
    """A worker answering the get of gangcheck's Lease with ``answer``, whatever it is."""

    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        if res.kind == LEASE.kind:
            return self.answer
        return await super().get(res, name, namespace)


def odd_lease(**spec: Any) -> Obj:
    return {"spec": {"renewTime": "2026-12-05T11:00:00Z", "leaseDurationSeconds": 15, **spec}}


ODD_LEASES = {
    "a list": ([1, 2], ""),
    "text": ("garbage", ""),
    "a duration too large for a float": (odd_lease(leaseDurationSeconds=10**400), ""),
    "a duration NaN": (odd_lease(leaseDurationSeconds=float("nan")), ""),
    "renewed a century ahead": (odd_lease(renewTime="2126-12-05T11:00:00Z"), ""),
    "names of 10,000 characters, stale": (
        {
            **odd_lease(holderIdentity="h" * 10_000),
            "metadata": {"namespace": "n" * 10_000, "name": "x" * 10_000},
        },
        "gangcheck down: its Lease gangcheck-system/gangcheck last renewed at "
        "2026-12-05T11:00:00Z (duration 15s)",
    ),
}


@pytest.mark.parametrize(("answer", "skipped"), ODD_LEASES.values(), ids=ODD_LEASES.keys())
async def test_a_worker_answering_an_odd_lease_ends_no_pass(answer: object, skipped: str) -> None:
    """Before, a Lease read that was no object, or whose duration no float holds, raised out
    of the pass (and ``run`` with it: no Workload dispatched any more), and a stale Lease's
    own names (any length) were written into the record. Now such a Lease is not known (the
    worker used as before) and the reason names the Lease read."""
    one = worker(kube=OddLease(answer), nodes=2)
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    await bounded(manager, connect, Clock()).pass_once()
    got = record(manager)
    if skipped:
        assert got.nominated == ("worker-2",)
        assert got.skipped == {"worker-1": skipped}
    else:
        assert got.nominated == ("worker-1",) and not got.skipped, got
    assert not one.writes


async def test_the_lease_read_is_the_dispatchers_setting() -> None:
    """``worker_lease`` (settings ``dispatcher.workerLeaseNamespace``, ``workerLeaseName``)
    names the Lease read in each worker."""
    one = worker(nodes=2)
    stale = gangcheck_lease(STARTED - timedelta(seconds=600))
    stale["metadata"] = {"name": "gc", "namespace": "ops"}
    one.add(stale)
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    dispatcher = Dispatcher(
        manager, metrics=Metrics(), connect=connect, clock=Clock(), worker_lease=("ops", "gc")
    )
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.skipped["worker-1"].startswith("gangcheck down: its Lease ops/gc last renewed")


async def test_a_workers_cluster_annotation_names_the_lease_read_there() -> None:
    """worker-1's gangcheck leads through ops/gc (installed otherwise): its MultiKueueCluster
    says so (``gangcheck.io/worker-lease``), and that Lease is read there, stale: skipped,
    said why; worker-2 reads the dispatcher's own setting. A MultiKueueCluster whose
    annotation is no Lease's name is skipped, said why, its worker not read."""
    one, two = worker(nodes=2), worker(nodes=2)
    stale = gangcheck_lease(STARTED - timedelta(seconds=600))
    stale["metadata"] = {"name": "gc", "namespace": "ops"}
    one.add(stale)
    two.add(gangcheck_lease(STARTED))
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    cluster = manager.stored(MULTIKUEUE_CLUSTER, "worker-1")
    assert cluster is not None
    cluster["metadata"]["annotations"] = {"gangcheck.io/worker-lease": "ops/gc"}
    manager.add(cluster)
    dispatcher = bounded(manager, connect, Clock())
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.skipped["worker-1"].startswith("gangcheck down: its Lease ops/gc last renewed")
    leases = {(c.namespace, c.name) for k in (one, two) for c in k.calls if c.kind == LEASE.kind}
    assert leases == {("ops", "gc"), ("gangcheck-system", "gangcheck")}

    cluster["metadata"]["annotations"] = {"gangcheck.io/worker-lease": "gc"}
    manager.add(cluster)
    calls = len(one.calls)
    await dispatcher.pass_once()
    assert record(manager).skipped["worker-1"] == (
        'its MultiKueueCluster\'s annotation gangcheck.io/worker-lease is "gc", not '
        "<namespace>/<name> of gangcheck's leader Lease there"
    )
    assert len(one.calls) == calls  # not read
    assert not one.writes and not two.writes


DIES = {
    "clocks agree": (
        0,
        "gangcheck down: its Lease gangcheck-system/gangcheck last renewed at "
        "2026-12-05T12:00:00Z (duration 15s)",
        "gangcheck down: its Lease gangcheck-system/gangcheck last renewed 96s ago, at "
        "2026-12-05T12:00:00Z (duration 15s)",
    ),
    # Before, a renewTime in the manager's future kept the worker up for good.
    "its clock 100 s ahead": (
        100,
        "gangcheck down: its Lease gangcheck-system/gangcheck unchanged since read at "
        "2026-12-05T12:00:00Z (renewTime 2026-12-05T12:01:40Z, duration 15s)",
        "gangcheck down: its Lease gangcheck-system/gangcheck not renewed for 96s, unchanged "
        "since read at 2026-12-05T12:00:00Z (renewTime 2026-12-05T12:01:40Z by its clock, "
        "duration 15s)",
    ),
}


@pytest.mark.parametrize(("ahead", "skipped", "failed"), DIES.values(), ids=DIES.keys())
async def test_a_nominated_worker_whose_gangcheck_dies_is_given_up_only_after_the_bound(
    ahead: int, skipped: str, failed: str
) -> None:
    """worker-1 nominated (the gang fits now there), then its gangcheck dies: its Lease last
    renewed at 12:00:00 (by worker-1's clock, ``ahead`` seconds ahead of the manager's; the
    dispatcher, reading it at each pass, sees it unchanged). Kept nominated through a
    restart's or a hand-over's time (to 35 s: not down) and then for DOWN_PATIENCE more (to
    95 s: down, skipped, still nominated, its copy left); past it, given up as a failed copy
    is, the record saying why, and worker-2 nominated in the same step (one cluster at a
    time)."""
    one, two = worker(nodes=2), worker(nodes=2)
    one.add(gangcheck_lease(STARTED + timedelta(seconds=ahead)))
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    clock = Clock()
    dispatcher = bounded(manager, connect, clock)
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-1",)
    one.add(workload())  # Kueue's copy there, trying
    for seconds in (10, 35, 36, 60, 95):
        clock.now = STARTED + timedelta(seconds=seconds)
        await dispatcher.pass_once()
        got = record(manager)
        assert got.nominated == ("worker-1",) and not got.failed, (seconds, got)
        down = seconds > 35
        assert ("worker-1" in got.skipped) is down, (seconds, got.skipped)
    assert got.skipped == {"worker-1": skipped}
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-1"])]
    assert [r for r, _ in events(manager)] == ["Nominated"]
    clock.now = STARTED + timedelta(seconds=96)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.failed == {"worker-1": failed}
    assert got.failed_at == {"worker-1": "2026-12-05T12:01:36Z"}
    assert got.tried == ("worker-1", "worker-2")
    assert manager.applied[-1] == (KUEUE_ADMISSION, ["worker-2"])
    assert [r for r, _ in events(manager)] == ["Nominated", "DispatchFallback", "Nominated"]
    assert not one.writes and not two.writes


async def test_a_live_worker_whose_clock_is_behind_is_not_skipped_once_a_renewal_is_seen() -> None:
    """worker-2's clock is 100 s behind: each renewTime of its live gangcheck reads 100 s
    old. The first pass counts it down (no renewal seen yet): skipped, said why. Its
    gangcheck renews; at the next pass the dispatcher has seen it renew: no longer skipped.
    Before, worker-2 was skipped as down for as long as it lived."""
    one, two = worker(nodes=2), worker(nodes=2)
    one.add(gangcheck_lease(STARTED))
    two.add(gangcheck_lease(STARTED - timedelta(seconds=100)))
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    clock = Clock()
    dispatcher = bounded(manager, connect, clock)
    await dispatcher.pass_once()
    assert record(manager).skipped["worker-2"].startswith("gangcheck down:")
    clock.now = STARTED + timedelta(seconds=2)
    one.add(gangcheck_lease(clock.now))
    two.add(gangcheck_lease(clock.now - timedelta(seconds=100)))  # renewed, by its clock
    await dispatcher.pass_once()
    assert "worker-2" not in record(manager).skipped
    assert not one.writes and not two.writes


def timed(manager: Manager, connect: Connect, clock: Clock) -> Dispatcher:
    """A dispatcher on ``clock`` giving a worker up after 300 s of gangcheck's silence there."""
    return Dispatcher(
        manager, metrics=Metrics(), connect=connect, clock=clock, unanswered_within=300
    )


def waiting_copy(*, message: str = "") -> Obj:
    """Kueue's copy of the gang in a worker: its quota reserved there, gangcheck's check
    Pending (with ``message``: what gangcheck said on it, '' when it said nothing)."""
    copy = workload()
    copy["metadata"]["uid"] = "copy-uid"
    copy["status"]["admissionChecks"] = [{"name": "gpu", "state": "Pending", "message": message}]
    return copy


@pytest.mark.parametrize(
    ("acted", "given_up"),
    [
        ("nothing", True),  # down without leader election, or stuck but renewing its Lease
        ("a request", False),  # waiting on its autoscaler, however long
        ("a word on its check", False),
    ],
)
async def test_a_worker_whose_gangcheck_leaves_the_copy_untouched_is_given_up(
    acted: str, given_up: bool
) -> None:
    """gangcheck acts within seconds of a copy's quota: a worker where it has done nothing
    for ``unanswered_within`` seconds since (as the dispatcher saw it) is given up for the
    gang, said why, and the next nominated; a request made, or a word on the check, keeps
    the worker however long the gang waits there."""
    one, two = worker(), worker()
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    clock = Clock()
    dispatcher = timed(manager, connect, clock)
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-1",)
    one.add(waiting_copy(message="asking cluster-autoscaler" if acted.startswith("a word") else ""))
    if acted == "a request":
        one.add(not_found_request() | {"status": {}})
    await dispatcher.pass_once()  # seen untouched from here
    clock.now += timedelta(seconds=299)
    await dispatcher.pass_once()
    assert record(manager).nominated == ("worker-1",)
    clock.now += timedelta(seconds=2)
    await dispatcher.pass_once()
    got = record(manager)
    if not given_up:
        assert got.nominated == ("worker-1",) and not got.failed
        return
    assert got.nominated == ("worker-2",)
    assert got.failed["worker-1"].startswith(
        "gangcheck there has not acted on the copy in 301s since its quota was reserved"
    ), got.failed
    assert not one.writes and not two.writes


async def test_the_untouched_copy_is_timed_anew_by_a_new_dispatcher() -> None:
    """The time is this process's: a restart (the worker's clock never read) waits the
    whole while again before giving the worker up."""
    one, two = worker(), worker()
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    clock = Clock()
    first = timed(manager, connect, clock)
    await first.pass_once()
    one.add(waiting_copy())
    await first.pass_once()
    clock.now += timedelta(seconds=200)
    restarted = timed(manager, connect, clock)
    await restarted.pass_once()
    clock.now += timedelta(seconds=200)  # 400 s since the first saw it, 200 s since the restart
    await restarted.pass_once()
    assert record(manager).nominated == ("worker-1",)
    clock.now += timedelta(seconds=101)
    await restarted.pass_once()
    assert record(manager).nominated == ("worker-2",)


# -- a Workload deleted and made again under its name --------------------------------------------


def remade(uid: str, *, record: DispatchRecord | None = None) -> Obj:
    """The gang's Workload in the manager with the uid ``uid``, carrying ``record`` (a copy
    of it made again from a saved manifest carries its annotations, the record included)."""
    wl = workload()
    wl["metadata"]["uid"] = uid
    if record is not None:
        wl["metadata"]["annotations"] = {RECORD_ANNOTATION: record.to_annotation()}
    return wl


async def test_a_workload_made_again_under_its_name_starts_afresh_not_from_the_old_record() -> None:
    """The Workload deleted and made again from its saved manifest: the record it carries is
    the earlier Workload's (worker-1 nominated, worker-2 given up). Nothing of it carries
    over: worker-2, where the gang fits now, is nominated, and the record is the new one's."""
    old = DispatchRecord(
        nominated=("worker-1",),
        tried=("worker-2", "worker-1"),
        failed={"worker-2": "check gpu Retry: rolled back"},
        reason="worker-2 failed; worker-1 by name",
        uid="uid-old",
    )
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker(nodes=2)})
    manager.add(remade("uid-new", record=old))
    await dispatcher.pass_once()
    got = record(manager)
    assert nominated_of(manager, "job-gang") == ["worker-2"]
    assert got.uid == "uid-new"
    assert got.tried == ("worker-2",)
    assert got.failed == {}
    assert "earlier Workload of this name (uid uid-old)" in got.reason


async def test_the_copy_and_requests_of_an_earlier_workload_of_the_name_do_not_count() -> None:
    """Worker-1 still holds the copy of the earlier Workload of this name (Kueue removes it
    after the deletion) with its check Retry and its request stocked out: not the copy of the
    Workload nominated there now (its record names another uid), so worker-1 is not given
    up for it; nor does a request left by an earlier copy (another uid) give it up."""
    one = worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    manager.add(remade("uid-new"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    stale = workload()
    stale["metadata"]["uid"] = "copy-old"
    made_for = DispatchRecord(("worker-1",), ("worker-1",), uid="uid-old")
    stale["metadata"]["annotations"] = {RECORD_ANNOTATION: made_for.to_annotation()}
    stale["status"]["admissionChecks"] = [{"name": "gpu", "state": "Retry", "message": "old"}]
    old_request = not_found_request()
    old_request["metadata"]["annotations"][WORKLOAD_UID_ANNOTATION] = "copy-old"
    one.add(stale, old_request)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.failed, got
    # Kueue made this Workload's copy (its record names uid-new); the old request stays
    fresh = workload()
    fresh["metadata"]["uid"] = "copy-new"
    fresh["metadata"]["annotations"] = {RECORD_ANNOTATION: got.to_annotation()}
    one.remove(WORKLOAD, "job-gang", NS)
    one.add(fresh)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.failed, got
    # its own request says its source cannot deliver: now given up
    own = not_found_request()
    own["metadata"]["name"] = "job-gang-gpu-2"
    own["metadata"]["annotations"][WORKLOAD_UID_ANNOTATION] = "copy-new"
    one.add(own)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert "CapacityIsNotFound" in got.failed["worker-1"]
    assert not one.writes


# -- Kueue's own dispatcher writing the nomination (its dispatcherName changed) -------------------


def kueue_nominates(manager: FakeKube, clusters: list[str]) -> None:
    """Kueue writes the nomination itself, as its field manager kueue-admission (as
    gangcheck's apply does): AllAtOnce (every worker) or Incremental (up to 3 a round), once
    Kueue was restarted with that dispatcherName while gangcheck's dispatcher still runs."""
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    wl["status"]["nominatedClusterNames"] = clusters
    wl["metadata"]["managedFields"] = [
        {
            "manager": KUEUE_ADMISSION,
            "operation": "Apply",
            "subresource": "status",
            "fieldsV1": {"f:status": {"f:nominatedClusterNames": {}}},
        }
    ]
    manager.add(wl)


KUEUE_WRITES = {
    "AllAtOnce: every worker": ["worker-1", "worker-2"],
    "AllAtOnce after a fallback: every worker, both tried": ["worker-2", "worker-1"],
    "a worker gangcheck never tried for the gang": ["worker-2"],
}


@pytest.mark.parametrize("written", KUEUE_WRITES.values(), ids=KUEUE_WRITES.keys())
async def test_a_nomination_kueue_wrote_itself_is_not_fought(written: list[str]) -> None:
    """Kueue's multiKueue.dispatcherName changed to one of its own mid-flight: Kueue writes
    the nomination as kueue-admission, the manager gangcheck writes as. Taken for gangcheck's
    own, it was written back on every pass, Kueue writing its own again each time (a loop,
    each write waking the other). Left as written, said why, written once."""
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker()})
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    if written == ["worker-2", "worker-1"]:  # worker-1 given up, worker-2 nominated after
        copy = workload()
        copy["status"]["admissionChecks"] = [{"name": "gpu", "state": "Rejected"}]
        workers = dispatcher._workers
        one = workers["worker-1"].kube
        assert isinstance(one, FakeKube)
        one.add(copy)
        await dispatcher.pass_once()
        assert nominated_of(manager, "job-gang") == ["worker-2"]
    kueue_nominates(manager, written)
    applied = list(manager.applied)
    await dispatcher.pass_once()
    writes = len(manager.writes)
    await dispatcher.pass_once()
    assert len(manager.writes) == writes  # no loop
    assert manager.applied == applied  # nothing written back
    assert nominated_of(manager, "job-gang") == written
    got = record(manager)
    assert got.nominated == ()
    assert "not by gangcheck: left as written" in got.reason
    assert "multiKueue.dispatcherName" in got.reason
    assert "nominated by gangcheck" not in describe(got)[0]


# -- a worker answering odd or hostile records ---------------------------------------------------


async def test_a_workers_long_messages_are_cut_in_the_record() -> None:
    """Worker-1's copy goes Retry with a message of 32768 characters (the most Kueue's API
    takes), worker-2's Secret is refused with one as long: what each says is kept in the
    record cut (the annotation would otherwise grow by the message twice, in ``failed`` and
    in the reason, for every worker: a few such workers and the record no longer fits in
    the Workload's 256 KiB of annotations, the gang stuck with its write refused)."""
    one, two = worker(), worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two, "worker-3": worker()})
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    copy = workload()
    copy["status"]["admissionChecks"] = [{"name": "gpu", "state": "Retry", "message": "x" * 32768}]
    one.add(copy)
    two.fail("list", "*", error=503, times=99)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-3",)
    assert got.failed["worker-1"].startswith("check gpu Retry: xxx")
    assert got.failed["worker-1"].endswith("...")
    assert all(len(why) <= 512 for why in [*got.failed.values(), *got.skipped.values()])
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    assert len(wl["metadata"]["annotations"][RECORD_ANNOTATION]) < 4096


def test_a_worker_holding_many_requests_costs_each_gang_only_its_own() -> None:
    """A worker holds 20,000 requests (odd records, or many gangs) and 2,000 copies of gangs
    nominated there: each gang's copy is judged from its own requests, looked up, not by
    reading the 20,000 again for each gang (40 million reads a pass: 8 s for 500 gangs)."""
    requests = []
    for i in range(20_000):
        req = not_found_request(f"g-{i % 4000}")
        req["metadata"]["name"] = f"r-{i}"
        requests.append(req)
    copies = [workload(f"g-{i}") for i in range(2000)]
    checks = worker().all_of(ADMISSION_CHECK)
    view = _view_of(checks, [], [], requests, copies, now=datetime.now(UTC))
    started = time.monotonic()
    states = [_copy_state(view, workload(f"g-{i}")) for i in range(2000)]
    assert time.monotonic() - started < 2.0
    assert all("CapacityIsNotFound" in failure for failure, _, _ in states)


def outcome_request(name: str, workload_name: str, *, namespace: str = NS, **notes: str) -> Obj:
    """A request in a worker for ``workload_name`` with gangcheck's record ``notes``
    (a rollback reason: a stockout; phase Fulfilled: a delivery)."""
    return {
        "apiVersion": PROVISIONING_REQUEST.api_version,
        "kind": PROVISIONING_REQUEST.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": f"2026-12-06T08:{len(name) % 60:02d}:00Z",
            "annotations": {WORKLOAD_ANNOTATION: workload_name, **notes},
        },
        "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"},
    }


STOCKOUT = {ROLLBACK_REASON_ANNOTATION: "CapacityIsNotFound"}


def dispatched_copy(name: str, *, namespace: str = NS, uid: str = "") -> Obj:
    """Kueue's copy in a worker of a gang the dispatcher sent there: it carries the record
    (Kueue copies the manager's annotations)."""
    copy = workload(name)
    copy["metadata"]["namespace"] = namespace
    copy["metadata"]["annotations"] = {
        RECORD_ANNOTATION: DispatchRecord(("worker-1",), ("worker-1",)).to_annotation()
    }
    if uid:
        copy["metadata"]["uid"] = uid
    return copy


def test_records_for_no_gang_sent_there_do_not_count_in_a_sources_history() -> None:
    """Requests in another namespace with records of stockouts for gangs the dispatcher never
    sent to the worker (none has a copy there carrying its record: forged, or another
    tenant's), thousands of them: not the source's history. A gang sent there counts once
    per source, its latest outcome, however many requests name it."""
    checks = worker().all_of(ADMISSION_CHECK)
    forged = [
        outcome_request(f"f-{i}", f"ghost-{i}", namespace="other", **STOCKOUT) for i in range(5000)
    ]
    local = dispatched_copy("job-local")
    del local["metadata"]["annotations"]  # a gang of the worker's own: not sent by us
    forged += [outcome_request(f"l-{i}", "job-local", **STOCKOUT) for i in range(50)]
    view = _view_of(checks, [], [], forged, [local], now=datetime.now(UTC))
    assert view.sources() == ()
    sent = dispatched_copy("job-sent", uid="copy-sent")
    requests = [
        outcome_request("a", "job-sent", **STOCKOUT),
        *(outcome_request(f"b-{i}", "job-sent", **STOCKOUT) for i in range(50)),
        outcome_request("c-later", "job-sent", **{WORKLOAD_UID_ANNOTATION: "copy-old", **STOCKOUT}),
    ]
    view = _view_of(checks, [], [], [*forged, *requests], [local, sent], now=datetime.now(UTC))
    (history,) = view.sources()
    assert (history.stockouts, history.deliveries) == (1, 0)


@pytest.mark.parametrize(
    ("reason", "stockouts"),
    [
        ("CapacityIsNotFound", 1),
        ("CapacityIsNotFound: the cloud has no GPUs of that kind", 1),
        ("Deadline: 1 of 2 members placeable after 420s", 1),
        ("Failed: NotProvisioned", 1),
        ("StartDeadline: 1 of 2 members scheduled within 600s of admission", 0),
        ("StrayPods: pods not of this gang took nodes that arrived for it", 0),
        ("RaceLost: another source delivered the whole gang first", 0),
        ("ConfigChanged: the check's config changed", 0),
        ("CapacityRevoked: revoked", 0),
        ("BookingExpired: expired", 0),
        ("Workload deleted", 0),
    ],
)
def test_only_a_rollback_that_says_the_source_could_not_deliver_is_its_stockout(
    reason: str, stockouts: int
) -> None:
    """A gang sent to the worker rolled back there: a stockout of its source only for the
    causes gangcheck there publishes as one (``published.STOCKOUT_CAUSES``). A start deadline
    its own pods missed (a tenant's gang that never fits), stray pods, a race lost, the
    config changed or the gang withdrawn say nothing of the source's room: the worker is not
    ranked after another for them."""
    checks = worker().all_of(ADMISSION_CHECK)
    sent = dispatched_copy("job-sent")
    req = outcome_request("r", "job-sent", **{ROLLBACK_REASON_ANNOTATION: reason})
    view = _view_of(checks, [], [], [req], [sent], now=datetime.now(UTC))
    assert sum(h.stockouts for h in view.sources()) == stockouts


async def test_a_workers_forged_records_do_not_send_the_gang_elsewhere() -> None:
    """Worker-1 holds thousands of forged stockout records in another namespace: by name it
    is still the first tried (nothing known of either); with a gang sent there that stocked
    out (its copy and request there), worker-2 is."""
    one = worker()
    one.add(
        *(
            outcome_request(f"f-{i}", f"ghost-{i}", namespace="other", **STOCKOUT)
            for i in range(500)
        )
    )
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    assert "worker-1 has no record of its capacity sources" in record(manager).reason
    one.add(dispatched_copy("job-sent"), outcome_request("s", "job-sent", **STOCKOUT))
    manager.add(workload("job-gang-2"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang-2") == ["worker-2"]


def test_a_workers_requests_and_copies_are_cached_trimmed_to_what_a_pass_reads() -> None:
    """A request and a copy of 250 KB each (annotations, a spec, messages as long as their
    APIs take): the worker's caches keep a few KB of each, and the pass judges them as it
    judges the whole objects."""
    big = "y" * 60_000
    req = not_found_request()
    req["metadata"]["annotations"] |= {f"junk-{i}": big for i in range(3)}
    req["metadata"]["annotations"][ROLLBACK_REASON_ANNOTATION] = f"CapacityIsNotFound: {big}"
    req["metadata"]["managedFields"] = [{"manager": big}]
    req["spec"]["podSets"] = [{"podTemplateRef": {"name": big}}]
    req["status"]["conditions"][1]["message"] = "z" * 32768
    copy = dispatched_copy("job-gang", uid="copy-1")
    copy["metadata"]["annotations"]["junk"] = big
    copy["metadata"]["labels"] = {"l": big[:63]}
    copy["spec"]["podSets"][0]["template"]["metadata"] = {"annotations": {"a": big * 2}}
    copy["status"]["admissionChecks"] = [{"name": "gpu", "state": "Retry", "message": big}]
    trim_req, trim_copy = _WORKER_TRIM[PROVISIONING_REQUEST], _WORKER_TRIM[WORKLOAD]
    assert len(json.dumps(trim_req(req))) < 8192
    assert len(json.dumps(trim_copy(copy))) < 8192
    checks = worker().all_of(ADMISSION_CHECK)
    whole = _view_of(checks, [], [], [req], [copy], now=datetime.now(UTC))
    trimmed = _view_of(checks, [], [], [trim_req(req)], [trim_copy(copy)], now=datetime.now(UTC))
    assert trimmed.sources() == whole.sources() and trimmed.sources()
    wl = workload()
    wl["metadata"]["uid"] = "uid-x"
    got, want = _copy_state(trimmed, wl), _copy_state(whole, wl)
    assert got[1:] == want[1:] and got[0][:300] == want[0][:300]


# -- a worker dropped from the MultiKueueConfig while nominated ----------------------------------


async def test_a_worker_dropped_from_the_config_holding_the_copy_is_kept_until_it_goes() -> None:
    """Worker-1, nominated, holds the gang's copy when it is dropped from the MultiKueueConfig:
    Kueue no longer manages that copy (v0.17 reconciles only the config's clusters, and its
    garbage collector removes a copy only once the manager's Workload is gone), so gangcheck
    there may go on scaling up for it. Nominating worker-2 then had two clusters scale up for
    one gang. The Workload stays nominated to worker-1, said why, until the copy is gone from
    worker-1; then worker-1 is given up and worker-2 nominated."""
    one, two = worker(), worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two})
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    one.add(dispatched_copy("job-gang"))
    manager.add(multikueue_config("worker-2"))
    await dispatcher.pass_once()
    writes = len(manager.writes)
    await dispatcher.pass_once()
    assert len(manager.writes) == writes  # said once
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.failed
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    assert "worker-1 is no longer a worker of the Workload's MultiKueueConfig" in got.reason
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-1"])]
    one.remove(WORKLOAD, "job-gang", NS)  # deleted there by hand
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.failed == {"worker-1": "no longer configured"}
    assert not one.writes and not two.writes


async def test_a_worker_dropped_from_the_config_without_the_copy_is_given_up_at_once() -> None:
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker()})
    await dispatcher.pass_once()
    manager.add(multikueue_config("worker-2"))
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.failed == {"worker-1": "no longer configured"}


# -- probed and found sound: kept as regression tests -------------------------------------------


async def test_a_config_listing_a_worker_twice_reads_and_nominates_it_once() -> None:
    one = worker(nodes=2)
    manager, dispatcher, _ = bed(
        {"worker-1": one, "worker-2": worker()}, config=("worker-1", "worker-1", "worker-2")
    )
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    assert record(manager).tried == ("worker-1",)
    assert Counter(c.kind for c in one.calls if c.verb == "list")[ADMISSION_CHECK.kind] == 1


async def test_two_gangs_of_one_name_in_two_namespaces_are_told_apart() -> None:
    """team/job-gang and team-b/job-gang, both nominated to worker-1: the copy of team's
    failing there gives up worker-1 for team's alone."""
    one = worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    other = workload()
    other["metadata"]["namespace"] = "team-b"
    manager.add(other)
    await dispatcher.pass_once()
    failing = workload()
    failing["status"]["admissionChecks"] = [{"name": "gpu", "state": "Rejected"}]
    trying = workload()
    trying["metadata"]["namespace"] = "team-b"
    one.add(failing, trying, not_found_request())  # the request: team's
    await dispatcher.pass_once()
    mine = record(manager)
    theirs_wl = manager.stored(WORKLOAD, "job-gang", "team-b")
    assert theirs_wl is not None
    theirs = DispatchRecord.from_annotation(theirs_wl["metadata"]["annotations"][RECORD_ANNOTATION])
    assert "worker-1" in mine.failed and mine.nominated == ("worker-2",)
    assert not theirs.failed and theirs.nominated == (theirs.tried[0],)


async def test_a_nomination_emptied_by_hand_is_written_again_for_the_worker_still_trying() -> None:
    """status.nominatedClusterNames emptied by hand while worker-1 tries: Kueue removes the
    copy there; the dispatcher nominates worker-1 again (its record), never another beside."""
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker(nodes=2)})
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    wl["metadata"]["annotations"] = {
        RECORD_ANNOTATION: DispatchRecord(("worker-1",), ("worker-1",)).to_annotation()
    }
    manager.add(wl)
    await dispatcher.pass_once()
    assert manager.applied == [(KUEUE_ADMISSION, ["worker-1"])]


NODES = {"negative": "-8", "10^18": "1000000000000000000", "not a quantity": "lots"}


@pytest.mark.parametrize("value", NODES.values(), ids=NODES.keys())
async def test_a_worker_whose_nodes_report_absurd_capacity_ends_no_pass(value: str) -> None:
    one = worker()
    node = gpu_node("odd")
    node["status"]["allocatable"] = node["status"]["capacity"] = {
        "cpu": value,
        "memory": value,
        "pods": value,
        "nvidia.com/gpu": value,
    }
    one.add(node)
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    manager.add(workload("job-gang-2"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang")  # both dispatched, the pass not ended
    assert nominated_of(manager, "job-gang-2")


async def test_a_nomination_by_hand_of_a_cluster_not_configured_says_it_copies_nowhere() -> None:
    """status.nominatedClusterNames set by hand to a cluster the Workload's MultiKueueConfig
    does not list: left as written (another field manager), and the record says Kueue makes
    no copy there, so the gang waits until it is cleared."""
    manager, dispatcher, _ = bed({"worker-1": worker(), "worker-2": worker()})
    await dispatcher.pass_once()
    wl = manager.stored(WORKLOAD, "job-gang", NS)
    assert wl is not None
    wl["status"]["nominatedClusterNames"] = ["worker-9"]
    wl["metadata"]["managedFields"] = [
        {
            "manager": "kubectl-edit",
            "operation": "Update",
            "subresource": "status",
            "fieldsV1": {"f:status": {"f:nominatedClusterNames": {}}},
        }
    ]
    manager.add(wl)
    await dispatcher.pass_once()
    got = record(manager)
    assert nominated_of(manager, "job-gang") == ["worker-9"]
    assert "by kubectl-edit, not by gangcheck: left as written" in got.reason
    assert "worker-9 is not a worker of its MultiKueueConfig: Kueue copies it nowhere" in got.reason


async def test_a_worker_whose_multikueue_cluster_is_deleted_holding_the_copy_is_kept() -> None:
    """Worker-1's MultiKueueCluster deleted while nominated, the gang's copy there: Kueue
    closes its client and leaves that copy unmanaged (its garbage collector runs through the
    clients it holds). Read through the client the dispatcher still holds, worker-1 stays
    nominated, none beside it, until the copy is gone there; then worker-2 is nominated."""
    one = worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    await dispatcher.pass_once()
    one.add(dispatched_copy("job-gang"))
    manager.remove(MULTIKUEUE_CLUSTER, "worker-1")
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.failed, got
    assert "worker-1 is no longer a worker of the Workload's MultiKueue" in got.reason
    one.remove(WORKLOAD, "job-gang", NS)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.failed == {"worker-1": "no longer configured"}
    await dispatcher.pass_once()
    assert "worker-1" not in dispatcher._workers  # closed once no longer nominated


async def test_a_gang_kept_on_its_worker_costs_no_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a gang fits now in a worker matters only when one is to be chosen: a gang
    still trying on the worker nominated costs no fit. Before, every pass fitted every gang
    waiting on every worker, each next to all the others pending there: 400 gangs waiting
    on a worker of 400 nodes made each pass take 92 s, while nothing was to be chosen."""
    import gangcheck.dispatcher as edge

    fits: list[int] = []
    real = edge.fit_gang

    def counted(*args: Any, **kwargs: Any) -> Any:
        fits.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(edge, "fit_gang", counted)
    manager, dispatcher, _ = bed({"worker-1": worker(nodes=4), "worker-2": worker()})
    for i in range(10):
        manager.add(workload(f"job-gang-{i}"))
    await dispatcher.pass_once()
    assert fits  # chosen: fits read
    assert nominated_of(manager, "job-gang") == ["worker-1"]  # fits now, oldest first
    assert nominated_of(manager, "job-gang-0") == ["worker-1"]
    fits.clear()
    await dispatcher.pass_once()
    assert not fits  # every gang kept on its worker: no fit
    assert nominated_of(manager, "job-gang-1") == ["worker-2"]


async def test_a_burst_fits_each_gang_once_on_what_the_others_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst of 40 gangs on a worker with room for 2: the gangs nominated there are placed
    once and each next gang is fitted alone on what they leave (the members handed to fits
    grow with the gangs, not with their square: 200 gangs on 200 nodes took 13 s in a pass
    of their first nominations). The first 2 go where they fit now, none after them."""
    import gangcheck.dispatcher as edge

    members: list[int] = []
    real = edge.fit_gang

    def counted(pod_sets: Any, *args: Any, **kwargs: Any) -> Any:
        members.append(sum(ps.count for ps in pod_sets))
        return real(pod_sets, *args, **kwargs)

    monkeypatch.setattr(edge, "fit_gang", counted)
    manager, dispatcher, _ = bed({"worker-1": worker(nodes=4), "worker-2": worker()})
    for i in range(39):
        manager.add(workload(f"job-gang-{i}"))
    await dispatcher.pass_once()
    there = [
        wl["metadata"]["name"]
        for wl in manager.all_of(WORKLOAD)
        if wl["status"].get("nominatedClusterNames") == ["worker-1"]
        and "fits now"
        in DispatchRecord.from_annotation(wl["metadata"]["annotations"][RECORD_ANNOTATION]).reason
    ]
    assert sorted(there) == ["job-gang", "job-gang-0"]
    assert sum(members) <= 40 * 2 * 2 + 2 * 2, (sum(members), len(members))


# -- gangcheck's Lease read in the background: a slow worker holds up no pass ------------------


class SlowLease(WatchedWorker):
    """A worker whose answers to the get of gangcheck's Lease, once ``slow``, do not come
    (no answer, ever: only the dispatcher's bound ends one); ``asked`` counts those gets,
    ``waiting`` those not answered now. Its lists and watches answer as usual."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = False
        self.asked = 0
        self.waiting = 0

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Obj:
        if res.kind == LEASE.kind:
            self.asked += 1
            if self.slow:
                self.waiting += 1
                try:
                    await asyncio.Event().wait()
                finally:
                    self.waiting -= 1
        return await super().get(res, name, namespace)


async def test_a_workers_slow_lease_read_holds_up_no_pass() -> None:
    """worker-1 answers its lists (kept by watch) but no longer the get of gangcheck's Lease.
    Running, the dispatcher reads that Lease in the background: its passes go on with the
    last answer (gangcheck up), a gang arriving meanwhile is nominated while that read is
    still unanswered, and the passes ask for no Lease of their own (one get outstanding).
    Before, each pass read the Lease itself and waited for it, up to the bound (a minute
    here), for every Workload: the new gang waited with it."""
    one = worker(kube=SlowLease(), nodes=2)
    assert isinstance(one, SlowLease)
    one.add(gangcheck_lease(datetime.now(UTC)))
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    dispatcher = Dispatcher(
        manager,
        metrics=Metrics(),
        interval=0.01,
        connect=connect,
        answer_within=60.0,
        lease_every=0.01,
    )
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: nominated_of(manager, "job-gang") == ["worker-1"])
        one.slow = True
        await until(lambda: one.waiting == 1)  # the background's read, not answered
        asked, passes = one.asked, dispatcher.passes
        manager.add(workload("job-two"))
        await until(lambda: bool(nominated_of(manager, "job-two")))
        await until(lambda: dispatcher.passes >= passes + 5)
        assert (one.asked, one.waiting) == (asked, 1)  # no pass asked for it, none waited
        assert nominated_of(manager, "job-gang") == ["worker-1"]  # kept: up, as last read
        wl = manager.stored(WORKLOAD, "job-two", NS)
        assert wl is not None
        got = DispatchRecord.from_annotation(wl["metadata"]["annotations"][RECORD_ANNOTATION])
        assert "worker-1" not in got.skipped, got
        assert not one.writes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_lease_read_unanswered_within_the_bound_is_the_workers_silence() -> None:
    """The background read of worker-1's Lease not answered within the bound: the worker is
    skipped as one that does not answer, as when a pass waited for it itself (its lists come
    from its caches: that read is the one that finds a black hole), kept nominated through
    its first window of silence."""
    one = worker(kube=SlowLease(), nodes=2)
    assert isinstance(one, SlowLease)
    one.add(gangcheck_lease(datetime.now(UTC)))
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(nodes=2)})
    dispatcher = Dispatcher(
        manager,
        metrics=Metrics(),
        interval=0.01,
        connect=connect,
        answer_within=BOUND,
        lease_every=0.01,
    )
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: nominated_of(manager, "job-gang") == ["worker-1"])
        one.slow = True
        await until(lambda: "worker-1" in record(manager).skipped)
        got = record(manager)
        assert got.skipped["worker-1"].startswith(f"unreachable: no answer within {BOUND:g}s")
        assert got.nominated == ("worker-1",) and not got.failed, got
        assert not one.writes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- a MultiKueueCluster re-pointed to another cluster while a gang is nominated there -----------


def kube_system(uid: str) -> Obj:
    """The worker's kube-system Namespace: its uid tells one cluster from another."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "kube-system", "uid": uid},
    }


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "after a restart"])
async def test_a_worker_re_pointed_while_nominated_is_given_up_its_copy_said_left(
    restarted: bool,
) -> None:
    """worker-1 nominated, Kueue's copy there; then its Secret is changed to reach another
    cluster (kube-system uid c). Kueue makes its client again and copies the gang into the
    new cluster; the copy in the first stays there, Kueue no longer looks there. The
    dispatcher (and one started afresh, from the record) gives worker-1 up, the record
    saying why and what is left where (diagnose prints it), and nominates worker-2 in the
    same step. Nothing is written in any worker."""
    one, two, other = worker(nodes=2), worker(nodes=2), worker(nodes=2)
    one.add(kube_system("uid-a"))
    two.add(kube_system("uid-b"))
    other.add(kube_system("uid-c"))
    manager, dispatcher, connect = bed({"worker-1": one, "worker-2": two})

    async def connecting(kubeconfig: bytes) -> Kube:
        return other if kubeconfig == b"elsewhere" else await connect(kubeconfig)

    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connecting)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",)
    assert got.identities == {"worker-1": "uid-a"}
    one.add(workload())  # Kueue's copy there
    manager.add(secret("worker-1", b"elsewhere"))
    other.add(workload())  # Kueue's copy in the new cluster, made at once
    if restarted:
        dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connecting)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-2",)
    assert got.identities == {"worker-2": "uid-b"}
    why = got.failed["worker-1"]
    assert why == (
        "re-pointed: its MultiKueueCluster now reaches another cluster (kube-system uid "
        "uid-c; nominated when it reached uid uid-a): Kueue's copy of this Workload (its "
        "namespace and name), if it made one, is left in that earlier cluster, where Kueue no "
        "longer looks: delete it there, with its job"
    )
    assert f"given up: worker-1 ({why})" in describe(got)
    assert manager.applied[-1] == (KUEUE_ADMISSION, ["worker-2"])
    assert [r for r, _ in events(manager)][-2:] == ["DispatchFallback", "Nominated"]
    assert not one.writes and not two.writes and not other.writes


async def test_a_kubeconfig_rotated_to_the_same_cluster_keeps_the_worker_nominated() -> None:
    """worker-1's Secret changed to other credentials for the same cluster (its kube-system
    uid the same): nothing changes for the gang nominated there."""
    one = worker(nodes=2)
    one.add(kube_system("uid-a"))
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(nodes=2)})

    async def connecting(kubeconfig: bytes) -> Kube:
        return one if kubeconfig == b"rotated" else await connect(kubeconfig)

    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connecting)
    await dispatcher.pass_once()
    one.add(workload())
    manager.add(secret("worker-1", b"rotated"))
    writes = len(manager.writes)
    await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.failed
    assert len(manager.writes) == writes


async def test_a_cluster_identity_the_reader_may_not_get_is_not_known_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reader's rights older than the rule on kube-system (403): which cluster the worker
    is cannot be told, said in the log once; the worker is used as before, its identity not
    recorded (a re-pointing is then not noticed)."""
    one = worker(nodes=2)
    one.add(kube_system("uid-a"))
    one.fail("get", "Namespace", error=403, times=10)
    manager, _, connect = bed({"worker-1": one})
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect)
    with caplog.at_level(logging.WARNING, logger="gangcheck.dispatcher"):
        for _ in range(3):
            await dispatcher.pass_once()
    got = record(manager)
    assert got.nominated == ("worker-1",) and not got.identities
    said = [r.getMessage() for r in caplog.records if "cannot be told" in r.getMessage()]
    assert len(said) == 1 and "reader.yaml" in said[0], said


class Chatty(FakeKube):
    """A worker whose nodes' list answers a 503 saying something new each time (a proxy's
    page naming its request, as some load balancers' do)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def list_objects(self, res: Any, *args: Any, **kwargs: Any) -> Obj:
        if res.kind == "Node":
            self.asked += 1
            raise TransientError(
                503, "ServiceUnavailable", f"upstream reset (request {self.asked})", target="nodes"
            )
        return await super().list_objects(res, *args, **kwargs)


async def test_a_worker_erring_in_new_words_at_each_pass_rewrites_no_record() -> None:
    """Before, a worker skipped for an error whose text changed at each read (a request id in
    a proxy's answer) had every waiting gang's record written, and, with no worker
    nominated, a NoWorker Event sent, at every pass (every second). Now a skip whose only
    change is the worker's words is written again at most every ``SKIP_REWORDED_EVERY``
    seconds."""
    one = Chatty()
    worker(kube=one, nodes=2)
    manager, _, connect = bed({"worker-1": one, "worker-2": worker(gangcheck=False)})
    clock = Clock()
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect, clock=clock)
    try:
        for _ in range(5):
            await dispatcher.pass_once()
            clock.now += timedelta(seconds=1)
        assert one.asked == 5
        assert len(manager.writes_of("Workload")) == 1, manager.writes
        assert [r for r, _ in events(manager)] == ["NoWorker"]
        assert "(request 1)" in record(manager).skipped["worker-1"], record(manager)
        clock.now += timedelta(seconds=SKIP_REWORDED_EVERY)
        await dispatcher.pass_once()
        assert len(manager.writes_of("Workload")) == 2, manager.writes
        assert "(request 6)" in record(manager).skipped["worker-1"], record(manager)
    finally:
        await dispatcher.close()


async def test_a_kubeconfig_refused_is_forgotten_with_its_worker() -> None:
    """The refusal kept by digest (b4d05c4: with its reason, which may quote the kubeconfig)
    stayed kept once its MultiKueueCluster was deleted and no MultiKueueConfig listed it
    any more: only workers with a client were forgotten, so one per worker name ever
    refused was held for the process's life. Now it goes with the worker."""
    manager, dispatcher, _ = bed_with_secret(b"not yaml: [")
    try:
        await dispatcher.pass_once()
        assert "worker-1" in record(manager).skipped
        manager.add(multikueue_config("worker-2"))
        manager.remove(MULTIKUEUE_CLUSTER, "worker-1")
        await dispatcher.pass_once()
        assert "worker-1" not in dispatcher._refused_configs
    finally:
        await dispatcher.close()


async def test_a_kubeconfig_is_read_off_the_event_loop() -> None:
    """Reading a Secret's kubeconfig (a MiB of YAML: 5 s) held the event loop, every watch
    and every other gang's pass with it, at each new digest. Now it is parsed and checked in
    a thread; the loop goes on meanwhile."""
    manager, dispatcher, _ = bed_with_secret(b"not yaml: [")
    threads: list[bool] = []
    real = yaml.safe_load

    def parsing(text: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(text)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("gangcheck.dispatcher.yaml.safe_load", parsing)
            await dispatcher.pass_once()
    finally:
        await dispatcher.close()
    assert threads and not any(threads), threads  # worker-1's and worker-2's
    assert (
        record(manager)
        .skipped["worker-1"]
        .startswith("Secret kueue-system/worker-1: unusable kubeconfig (not YAML")
    )


def of_flavor(wl: Obj, gpu: str) -> Obj:
    """``wl`` with the quota reservation the manager's Kueue writes: its pod set assigned the
    GPU flavor ``gpu`` (and ``default`` for its cpu)."""
    wl["status"]["admission"] = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "main", "count": 2, "flavors": {"nvidia.com/gpu": gpu, "cpu": "default"}}
        ],
    }
    return wl


async def test_a_stockout_of_one_flavor_sends_only_gangs_of_that_flavor_elsewhere() -> None:
    """An H100 gang's stockout in worker-1, remembered by its record after worker-1 let its
    copy and request go: the next H100 gang goes to worker-2 first, an A100 gang (a kind of
    node that stockout says nothing of) is tried in worker-1 as if nothing were known."""
    one, two = worker(), worker()
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": two})
    gang = manager.stored(WORKLOAD, "job-gang", NS)
    assert gang is not None
    manager.add(of_flavor(copy.deepcopy(gang), "h100"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-1"]
    one.add(workload(), not_found_request())
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-2"]
    one.remove(WORKLOAD, "job-gang", NS)
    one.remove(PROVISIONING_REQUEST, "job-gang-gpu-1", NS)
    manager.add(of_flavor(workload("job-a100"), "a100"), of_flavor(workload("job-h100"), "h100"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-a100") == ["worker-1"]
    assert nominated_of(manager, "job-h100") == ["worker-2"]
    a100 = manager.stored(WORKLOAD, "job-a100", NS)
    assert a100 is not None
    said = DispatchRecord.from_annotation(a100["metadata"]["annotations"][RECORD_ANNOTATION])
    assert "worker-1 has no record of its capacity sources" in said.reason


async def test_a_workers_source_history_counts_only_gangs_of_the_same_flavor() -> None:
    """Worker-1's source stocked out for an H100 gang the dispatcher sent there (its copy and
    request still there; the gang since placed in worker-2, so no give-up is recent in its
    record): an A100 gang is tried there by name, nothing known of its kind of node; an H100
    gang goes to worker-2."""
    one = worker()
    sent = of_flavor(workload("job-sent"), "h100")
    sent["status"]["clusterName"] = "worker-2"
    one.add(dispatched_copy("job-sent"), outcome_request("s", "job-sent", **STOCKOUT))
    manager, dispatcher, _ = bed({"worker-1": one, "worker-2": worker()})
    manager.remove(WORKLOAD, "job-gang", NS)
    manager.add(sent, of_flavor(workload("job-a100"), "a100"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-a100") == ["worker-1"]
    manager.add(of_flavor(workload("job-h100"), "h100"))
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-h100") == ["worker-2"]


async def test_a_stockout_is_remembered_after_the_gang_that_met_it_is_deleted() -> None:
    """The H100 gang given up on worker-1 (stocked out) is deleted while it waits in worker-2
    (a person tired of waiting): the next H100 gang still goes to worker-2 first, for
    FAILURE_MEMORY seconds from the give-up, then to worker-1 by name again. The memory is the
    process's: a restarted dispatcher, reading only the Workloads there are, has none. (Each
    gang is removed before the next, so that none is pending anywhere to spread from.)"""
    one, two = worker(), worker()
    manager, _, connect = bed({"worker-1": one, "worker-2": two})
    now = [datetime(2026, 12, 7, 5, 0, tzinfo=UTC)]
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect, clock=lambda: now[0])
    gang = manager.stored(WORKLOAD, "job-gang", NS)
    assert gang is not None
    manager.add(of_flavor(copy.deepcopy(gang), "h100"))
    await dispatcher.pass_once()
    one.add(workload(), not_found_request())
    await dispatcher.pass_once()
    assert nominated_of(manager, "job-gang") == ["worker-2"]
    manager.remove(WORKLOAD, "job-gang", NS)
    one.remove(WORKLOAD, "job-gang", NS)
    one.remove(PROVISIONING_REQUEST, "job-gang-gpu-1", NS)

    async def next_gang(name: str, by: Dispatcher) -> list[str]:
        manager.add(of_flavor(workload(name), "h100"))
        await by.pass_once()
        went = nominated_of(manager, name)
        manager.remove(WORKLOAD, name, NS)
        return went

    now[0] += timedelta(seconds=60)
    assert await next_gang("job-b", dispatcher) == ["worker-2"]
    restarted = Dispatcher(manager, metrics=Metrics(), connect=connect, clock=lambda: now[0])
    assert await next_gang("job-c", restarted) == ["worker-1"]
    now[0] += timedelta(seconds=61)  # 121 s after the give-up
    assert await next_gang("job-d", dispatcher) == ["worker-1"]


T0 = datetime(2026, 12, 7, 7, 0, tzinfo=UTC)


def publishing(kube: FakeKube, *outcomes: Seen) -> FakeKube:
    """``kube`` (a worker) with its gangcheck's check publishing ``outcomes``."""
    check = kube.stored(ADMISSION_CHECK, "gpu")
    assert check is not None
    conditions = [*check["status"]["conditions"], published.condition(outcomes, None, T0, 1)]
    kube.add({**check, "status": {"conditions": conditions}})
    return kube


async def test_a_stockout_a_worker_published_sends_the_gang_elsewhere_before_a_try() -> None:
    """Worker-1's gangcheck published that its source stocked out lately for H100 gangs (its
    own gangs, or gangs whose requests it deleted since): nothing of it is in the manager's
    records nor in any request there, yet an H100 gang goes to worker-2 first; an A100 gang,
    of a kind of node that says nothing of, to worker-1 by name; with the stockout past its
    keep, the H100 gang by name again."""
    one = publishing(worker(), Seen(("default", "h100"), "pool-a", Outcome.STOCKOUT, T0))
    manager, _, connect = bed({"worker-1": one, "worker-2": worker()})
    manager.remove(WORKLOAD, "job-gang", NS)
    clock = [T0 + timedelta(seconds=30)]
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect, clock=lambda: clock[0])
    try:
        manager.add(of_flavor(workload("job-h100"), "h100"))
        await dispatcher.pass_once()
        assert nominated_of(manager, "job-h100") == ["worker-2"]
        h100 = manager.stored(WORKLOAD, "job-h100", NS)
        assert h100 is not None
        said = DispatchRecord.from_annotation(h100["metadata"]["annotations"][RECORD_ANNOTATION])
        said = said.reason
        assert said == (
            "worker-2 has no record of its capacity sources; tried by name; after worker-1,"
            " whose capacity sources last stocked out for such gangs"
        ), said
        manager.remove(WORKLOAD, "job-h100", NS)
        manager.add(of_flavor(workload("job-a100"), "a100"))
        await dispatcher.pass_once()
        assert nominated_of(manager, "job-a100") == ["worker-1"]
        manager.remove(WORKLOAD, "job-a100", NS)
        clock[0] = T0 + timedelta(seconds=KEEP_SECONDS + 1)
        manager.add(of_flavor(workload("job-later"), "h100"))
        await dispatcher.pass_once()
        assert nominated_of(manager, "job-later") == ["worker-1"]
    finally:
        await dispatcher.close()


@pytest.mark.parametrize(
    ("published_after_the_request", "first"), [(True, "worker-2"), (False, "worker-1")]
)
async def test_a_stockout_published_since_a_delivery_was_recorded_outweighs_it(
    published_after_the_request: bool, first: str
) -> None:
    """Worker-1 runs an H100 gang the dispatcher sent there, its request's record a delivery
    (made at T0 - 1 h; a gang that runs for days keeps it); worker-1's gangcheck published
    since that its source stocked out for H100 gangs (their requests deleted, none recorded
    in the worker): a new H100 gang goes to worker-2 first. A stockout published before the
    request of the delivery recorded was made says less than it: worker-1, its source open."""
    made = T0 - timedelta(hours=1)
    said_at = made + (
        timedelta(minutes=30) if published_after_the_request else -timedelta(minutes=5)
    )
    one = publishing(worker(), Seen(("default", "h100"), "pool-a", Outcome.STOCKOUT, said_at))
    delivered = outcome_request("d", "job-sent", **{PHASE_ANNOTATION: FULFILLED})
    delivered["metadata"]["creationTimestamp"] = made.strftime("%Y-%m-%dT%H:%M:%SZ")
    one.add(dispatched_copy("job-sent"), delivered)
    manager, _, connect = bed({"worker-1": one, "worker-2": worker()})
    manager.remove(WORKLOAD, "job-gang", NS)
    sent = of_flavor(workload("job-sent"), "h100")
    sent["status"]["clusterName"] = "worker-1"
    manager.add(sent, of_flavor(workload("job-h100"), "h100"))
    clock = [said_at + timedelta(seconds=60)]
    dispatcher = Dispatcher(manager, metrics=Metrics(), connect=connect, clock=lambda: clock[0])
    try:
        await dispatcher.pass_once()
        assert nominated_of(manager, "job-h100") == [first]
    finally:
        await dispatcher.close()
