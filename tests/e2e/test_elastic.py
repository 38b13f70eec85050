"""Elastic Jobs end to end: Kueue's workload slices (``ElasticJobsViaWorkloadSlices``, on in
the test bed) with gangcheck's check, on the real Kueue, kube-scheduler, controller-manager and
kwok. The nodes of a. and b. come from the simulated cloud (``gangcheck-dev sim-cloud``): a
partial delivery of the added members cannot be produced on demand with the real
cluster-autoscaler; c. runs on the real cluster-autoscaler, for its scale-down.

a. a Job of 4 whole-node pods scaled to 8: the new slice asks for the 4 added only, they get
   their nodes, the Job runs 8, the first 4 never moved; then scaled back to 4: nothing
   gangcheck recorded is reclaimed, the members left keep running on their nodes;
b. scaled 4 -> 8 with capacity for 3 of the 4 added: the difference is rolled back (its 3
   nodes deleted), the slice stays Pending (no Retry: Kueue would suspend the whole Job), the
   4 running members untouched, the Job stays at 4 running;
c. on cluster-autoscaler's nodes, a Job of 2 scaled to 4 and back to 2: the 2 members left run
   untouched, gangcheck reclaims nothing and withdraws the slice's request (its members are
   gone; left Provisioned, cluster-autoscaler would book its capacity on the emptied nodes for
   10 minutes), and cluster-autoscaler's own scale-down removes the 2 emptied nodes;
d. scaled 4 -> 8 -> 12 while the slice for 8 waits on the check: Kueue's slice for 12
   replaces the pending one, and asks for the 8 beyond the 4 the first slice runs;
e. a slice evicted while it waits (deactivated: Kueue stops the whole Job) and activated
   again asks for the whole Job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.deploy import ManagedProcess

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import NODE, POD, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.hold import HOLD_TAINT
from gangcheck.logic.workloads import slices
from gangcheck.model.names import HOLD_AS
from tests.e2e.conftest import Cluster
from tests.e2e.helpers import (
    CONFIG_MAP,
    JOB,
    delete_quietly,
    events_of,
    eventually,
    get_or_none,
    is_true,
    messages,
    unique,
)
from tests.e2e.test_gangcheck import (
    ARRIVED_FOR,
    BIG,
    GPU_TYPE,
    NODE_GROUP_LABEL,
    SIM_CLASS,
    SIM_POOL,
    Queue,
    SimCloud,
    _drain_and_delete_new_nodes,
    check_state,
    delete_nodes,
    gang_job,
    gpu_queue,
    job_pods,
    nodes_with,
    our_config,
    running,
    sim_group,
)
from tests.e2e.test_gangcheck import controller as controller  # noqa: PLC0414 (the fixture)

Obj = dict[str, Any]
ELASTIC = {"kueue.x-k8s.io/elastic-job": "true"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gangcheck-e2e-elastic")


@pytest.fixture(scope="module")
def sim(cluster: Cluster, workdir: Path) -> Iterator[SimCloud]:
    cloud = SimCloud(cluster, workdir)
    try:
        yield cloud
    finally:
        if cloud.process is not None:
            cloud.process.stop()


def elastic_job(name: str, count: int, pool: str, *, label: str = SIM_POOL) -> Obj:
    """A Job of `count` whole-node pods that may grow and shrink: no completions (they are
    immutable; parallelism is what scales). Its pods go to the nodes labelled `label=pool`."""
    job = gang_job(name, count, 8, {label: pool})
    job["metadata"]["annotations"] = dict(ELASTIC)
    del job["spec"]["completions"]
    return job


@contextlib.asynccontextmanager
async def elastic_setup(
    kube: Kube,
    namespace: str,
    sim: SimCloud,
    *,
    max_nodes: int,
    scenarios: list[Obj],
    backoff_limit: int = 3,
) -> AsyncIterator[tuple[str, Queue]]:
    pool = unique("elastic")
    sim.configure(sim_group(pool, max_nodes), *scenarios)
    labels = {GPU_TYPE: "e2e", SIM_POOL: pool}
    ours = our_config(klass=SIM_CLASS, deadline=8, backoff_limit=backoff_limit)
    async with gpu_queue(kube, namespace, labels, ours=ours) as queue:
        try:
            yield pool, queue
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)

            async def no_pods() -> bool:
                return not (await kube.list_objects(POD, namespace))["items"]

            with contextlib.suppress(AssertionError):
                await eventually(no_pods, timeout=30, what="the Job's pods to go")
            await delete_nodes(kube, await nodes_with(kube, f"{SIM_POOL}={pool}"))


async def placed(kube: Kube, namespace: str, count: int) -> dict[str, str] | None:
    """The Job's running pods by name -> node, once exactly `count` run."""
    pods = running(await job_pods(kube, namespace, "gang"))
    return (
        {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods} if len(pods) == count else None
    )


async def new_slice(kube: Kube, namespace: str) -> Obj | None:
    for wl in (await kube.list_objects(WORKLOAD, namespace))["items"]:
        if slices.REPLACEMENT_FOR in (wl["metadata"].get("annotations") or {}):
            return dict(wl)
    return None


async def slice_request(kube: Kube, namespace: str) -> Obj | None:
    for req in (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]:
        if slices.SLICE_ANNOTATION in (req["metadata"].get("annotations") or {}):
            return dict(req)
    return None


async def untouched(kube: Kube, namespace: str, before: dict[str, str]) -> None:
    """The members that ran before still run where they ran, on nodes gangcheck neither
    cordoned nor fenced."""
    for pod, node in before.items():
        got = await kube.get(POD, pod, namespace)
        assert got["spec"]["nodeName"] == node and got["status"]["phase"] == "Running"
        n = await kube.get(NODE, node)
        assert not n["spec"].get("unschedulable"), f"{node} cordoned"
        assert not [t for t in n["spec"].get("taints") or [] if "gangcheck" in t["key"]]


@pytest.mark.timeout(180)
async def test_a_job_scaled_up_gets_the_added_members_all_at_once_and_scaled_down_keeps_its_own(
    kube: Kube, namespace: str, cluster: Cluster, controller: ManagedProcess | None, sim: SimCloud
) -> None:
    async with elastic_setup(kube, namespace, sim, max_nodes=8, scenarios=[]) as (pool, queue):
        began = time.monotonic()
        await kube.create(JOB, elastic_job("gang", 4, pool), namespace)
        first = await eventually(lambda: placed(kube, namespace, 4), timeout=60, what="4 running")
        at_four = time.monotonic() - began

        await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 8}}, namespace)
        scaled = time.monotonic()
        req = await eventually(lambda: slice_request(kube, namespace), what="the slice's ask")
        assert [p["count"] for p in req["spec"]["podSets"]] == [4]
        eight = await eventually(lambda: placed(kube, namespace, 8), timeout=60, what="8 running")
        at_eight = time.monotonic() - scaled
        await untouched(kube, namespace, first)
        added = {node for pod, node in eight.items() if pod not in first}
        assert len(added) == 4 and not added & set(first.values())
        key = f"{namespace}/{req['metadata']['name']}"
        for node in added:
            got = await kube.get(NODE, node)
            assert got["metadata"]["annotations"][ARRIVED_FOR] == key
        wl = await new_slice(kube, namespace)
        assert wl is not None and is_true(wl, "Admitted")
        state = check_state(wl, queue.check)
        old = wl["metadata"]["annotations"][slices.REPLACEMENT_FOR]
        assert state["state"] == "Ready"
        assert f"adds 4 members to {old} running 4" in state["message"]
        # the added nodes were held as the Job's pods tolerate: the first slice's request,
        # read from the slice's template as Kueue copied it from the Job
        old_ns, _, old_name = old.partition("/")
        first_request = naming.request_name(old_name, queue.check, 1)
        assert req["metadata"]["annotations"][HOLD_AS] == f"{old_ns}/{first_request}"
        for node in added:  # and opened once the 8 ran
            got = await kube.get(NODE, node)
            assert not [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]

        await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 4}}, namespace)
        kept = await eventually(lambda: placed(kube, namespace, 4), timeout=60, what="back to 4")
        await untouched(kube, namespace, kept)
        # Nothing gangcheck recorded was reclaimed: the nodes left empty are the normal
        # scale-down's (the simulated cloud has none), every one of the 8 is still there.
        assert len(await nodes_with(kube, f"{SIM_POOL}={pool}")) == 8
        wl = await new_slice(kube, namespace)
        assert wl is not None and check_state(wl, queue.check)["state"] == "Ready"
        assert not messages(await events_of(kube, wl), "RolledBack")
        cluster.record(
            f"elastic a. sim, whole-node pods: 4 running after {at_four:.1f}s; scaled to 8, "
            f"8 running {at_eight:.1f}s later (the slice asked for 4); scaled back to 4, "
            "nothing reclaimed"
        )


@pytest.mark.timeout(180)
async def test_a_scale_up_whose_added_members_do_not_all_fit_is_rolled_back_the_job_runs_on(
    kube: Kube, namespace: str, cluster: Cluster, controller: ManagedProcess | None, sim: SimCloud
) -> None:
    scenarios = [
        {"name": f"first-{namespace}", "match": {"namespace": namespace}, "times": 1},
        {
            "name": f"three-of-four-{namespace}",
            "match": {"namespace": namespace},
            "times": 1,
            "deliver": 3,
        },
    ]
    setup = elastic_setup(kube, namespace, sim, max_nodes=8, scenarios=scenarios, backoff_limit=0)
    async with setup as (pool, queue):
        await kube.create(JOB, elastic_job("gang", 4, pool), namespace)
        first = await eventually(lambda: placed(kube, namespace, 4), timeout=60, what="4 running")
        await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 8}}, namespace)
        scaled = time.monotonic()
        req = await eventually(lambda: slice_request(kube, namespace), what="the slice's ask")
        name = req["metadata"]["name"]

        async def rolled_back() -> list[str] | None:
            wl = await new_slice(kube, namespace)
            return messages(await events_of(kube, wl), "SliceRolledBack") if wl else None

        (said,) = await eventually(rolled_back, timeout=40, what="the difference rolled back")
        took = time.monotonic() - scaled
        assert "3 of 4 members placeable" in said and "its 4 running members untouched" in said
        # The 3 nodes that came for the difference are gone; the 4 of the running members not.
        nodes = await nodes_with(kube, f"{SIM_POOL}={pool}")
        assert {n["metadata"]["name"] for n in nodes} == set(first.values())
        assert not [
            n
            for n in nodes
            if (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR, "").endswith(name)
        ]
        await untouched(kube, namespace, first)
        assert await placed(kube, namespace, 4) == first
        wl = await new_slice(kube, namespace)
        assert wl is not None and not is_true(wl, "Admitted")

        async def said_on_the_check() -> Obj | None:
            # a message-only write lags the Event by up to the progress delay (3 s)
            state = check_state(await new_slice(kube, namespace), queue.check)
            return state if "allows no more attempts" in state.get("message", "") else None

        state = await eventually(said_on_the_check, timeout=10, what="the check saying so")
        assert state["state"] == "Pending"
        updates = messages(await events_of(kube, wl), "AdmissionCheckUpdated")
        assert not [m for m in updates if "to Retry" in m or "to Rejected" in m]
        cluster.record(
            f"elastic b. sim, 3 of the 4 added delivered: rolled back {took:.1f}s after the "
            "scale-up, the Job still running its 4"
        )


async def slice_replacing(kube: Kube, namespace: str, key: str) -> Obj | None:
    """The Workload slice replacing `key` (``namespace/name``)."""
    for wl in (await kube.list_objects(WORKLOAD, namespace))["items"]:
        if (wl["metadata"].get("annotations") or {}).get(slices.REPLACEMENT_FOR) == key:
            return dict(wl)
    return None


async def request_of_slice(kube: Kube, namespace: str, workload: str) -> Obj | None:
    """The latest request made for the slice named `workload` (its attempt's, not withdrawn)."""
    for req in (await kube.list_objects(PROVISIONING_REQUEST, namespace))["items"]:
        name = req["metadata"]["name"]
        if name.startswith(f"{workload}-") and not req["metadata"].get("deletionTimestamp"):
            return dict(req)
    return None


def first_only(namespace: str) -> list[Obj]:
    """The simulated cloud's answers for a Job whose scale-up must wait: its first request
    delivered, the next (the slice's) answered with nothing delivered."""
    return [
        {"name": f"first-{namespace}", "match": {"namespace": namespace}, "times": 1},
        {"name": f"none-{namespace}", "match": {"namespace": namespace}, "times": 1, "deliver": 0},
    ]


async def waiting_for_four_more(
    kube: Kube, namespace: str, pool: str
) -> tuple[dict[str, str], str]:
    """A Job of 4 running (where: pod -> node), scaled to 8: the name of its new slice, whose
    request asks for the 4 added and gets nothing (`first_only`)."""
    await kube.create(JOB, elastic_job("gang", 4, pool), namespace)
    first = await eventually(lambda: placed(kube, namespace, 4), timeout=60, what="4 running")
    await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 8}}, namespace)
    pending = await eventually(lambda: new_slice(kube, namespace), what="the slice for 8")
    name = pending["metadata"]["name"]
    asked = await eventually(
        lambda: request_of_slice(kube, namespace, name), what="the slice's ask"
    )
    assert [p["count"] for p in asked["spec"]["podSets"]] == [4]
    return first, name


@pytest.mark.timeout(240)
async def test_a_job_scaled_up_again_while_its_slice_waits_asks_beyond_what_runs(
    kube: Kube, namespace: str, cluster: Cluster, controller: ManagedProcess | None, sim: SimCloud
) -> None:
    """4 running; scaled to 8, and to 12 while the slice for 8 still waits on the check (its
    capacity not delivered): Kueue makes a new slice replacing the pending one, and that
    slice asks for the 8 beyond the 4 the first slice runs (the pending slice ran nothing,
    the first slice's members do); the Job runs 12, the first 4 never moved."""
    setup = elastic_setup(kube, namespace, sim, max_nodes=12, scenarios=first_only(namespace))
    async with setup as (pool, queue):
        first, pending_name = await waiting_for_four_more(kube, namespace, pool)

        await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 12}}, namespace)
        key = f"{namespace}/{pending_name}"
        again = await eventually(
            lambda: slice_replacing(kube, namespace, key), timeout=30, what="a slice for 12"
        )
        name = again["metadata"]["name"]
        req = await eventually(
            lambda: request_of_slice(kube, namespace, name), timeout=30, what="its ask"
        )
        assert [p["count"] for p in req["spec"]["podSets"]] == [8]
        twelve = await eventually(
            lambda: placed(kube, namespace, 12), timeout=90, what="12 running"
        )
        await untouched(kube, namespace, first)
        assert set(first) <= set(twelve)
        state = check_state(await kube.get(WORKLOAD, name, namespace), queue.check)
        assert f"adds 8 members to {key} running 4" in state["message"]
        cluster.record(
            "elastic d. sim, scaled 4 -> 8 -> 12 while the slice for 8 waited: the slice for "
            "12 asked for 8 (beyond the 4 running), 12 running, the first 4 never moved"
        )


@pytest.mark.timeout(240)
async def test_a_slice_evicted_while_it_waits_asks_for_the_whole_job_once_admitted_again(
    kube: Kube, namespace: str, cluster: Cluster, controller: ManagedProcess | None, sim: SimCloud
) -> None:
    """4 running, scaled to 8 (the slice asks for 4, nothing delivered); the slice is
    deactivated (evicted: Kueue stops the whole Job, its 4 running pods go) and activated
    again: nothing runs, so once admitted again it asks for all 8, and turns Ready with
    podSetUpdates that agree with the Job's template on every key (Kueue refuses to start a
    Job whose template and an update disagree). Kueue v0.17 still does not start the Job:
    its own `kueue.x-k8s.io/workload` annotation for the slice disagrees with the template's,
    naming the first slice (recorded below; docs/elastic.md, Limits)."""
    setup = elastic_setup(kube, namespace, sim, max_nodes=12, scenarios=first_only(namespace))
    async with setup as (pool, queue):
        _, name = await waiting_for_four_more(kube, namespace, pool)

        await kube.merge_patch(WORKLOAD, name, {"spec": {"active": False}}, namespace)

        async def stopped() -> bool:
            return not running(await job_pods(kube, namespace, "gang"))

        await eventually(stopped, timeout=60, what="the Job stopped")
        await kube.merge_patch(WORKLOAD, name, {"spec": {"active": True}}, namespace)

        async def asked_again() -> Obj | None:
            req = await request_of_slice(kube, namespace, name)
            counts = [p["count"] for p in req["spec"]["podSets"]] if req else []
            return req if counts == [8] else None

        req = await eventually(asked_again, timeout=60, what="the slice asking for 8")
        base = req["metadata"]["annotations"][slices.SLICE_ANNOTATION]
        assert '"running": {}' in base, base

        async def ready() -> Obj | None:
            wl = await kube.get(WORKLOAD, name, namespace)
            return wl if check_state(wl, queue.check).get("state") == "Ready" else None

        wl = await eventually(ready, timeout=60, what="the slice's check Ready")
        templates = {ps["name"]: ps["template"] for ps in wl["spec"]["podSets"]}
        for update in check_state(wl, queue.check).get("podSetUpdates") or []:
            has = (templates[update["name"]].get("metadata") or {}).get("annotations") or {}
            for key, value in (update.get("annotations") or {}).items():
                assert has.get(key, value) == value, (key, value, has.get(key))

        async def kueue_said() -> str | None:
            """What became of the Job: its 8 running, or why Kueue finished the slice."""
            if await placed(kube, namespace, 8):
                return "8 running"
            got = await kube.get(WORKLOAD, name, namespace)
            conds = {c["type"]: c for c in (got.get("status") or {}).get("conditions") or []}
            finished = conds.get("Finished", {})
            return str(finished.get("message")) if finished.get("status") == "True" else None

        said = await eventually(kueue_said, timeout=60, what="the Job started, or Kueue's no")
        # gangcheck's updates are no part of Kueue's no (asserted above)
        assert "consume-provisioning-request" not in said, said
        cluster.record(
            "elastic e. sim, a slice for 8 evicted while it waited (the Job stopped) and "
            f"activated again: it asked for 8, Ready; Kueue: {said}"
        )


@pytest.mark.timeout(300)
async def test_a_job_scaled_down_on_autoscaler_nodes_leaves_the_emptied_nodes_to_its_scale_down(
    kube: Kube, namespace: str, cluster: Cluster, controller: ManagedProcess | None
) -> None:
    assert BIG.max >= 4
    group = f"{NODE_GROUP_LABEL}={BIG.name}"
    before = {n["metadata"]["name"] for n in await nodes_with(kube, group)}
    labels = {GPU_TYPE: "e2e", NODE_GROUP_LABEL: BIG.name}
    async with gpu_queue(kube, namespace, labels, ours=our_config(deadline=60)) as queue:
        try:
            began = time.monotonic()
            job = elastic_job("gang", 2, BIG.name, label=NODE_GROUP_LABEL)
            await kube.create(JOB, job, namespace)
            first = await eventually(
                lambda: placed(kube, namespace, 2), timeout=120, what="2 running"
            )
            at_two = time.monotonic() - began
            assert not set(first.values()) & before

            await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 4}}, namespace)
            scaled = time.monotonic()
            req = await eventually(lambda: slice_request(kube, namespace), what="the slice's ask")
            assert [p["count"] for p in req["spec"]["podSets"]] == [2]
            four = await eventually(
                lambda: placed(kube, namespace, 4), timeout=120, what="4 running"
            )
            at_four = time.monotonic() - scaled
            await untouched(kube, namespace, first)
            added = {node for pod, node in four.items() if pod not in first}
            assert len(added) == 2 and not added & set(first.values()) and not added & before

            await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": 2}}, namespace)
            down = time.monotonic()
            kept = await eventually(
                lambda: placed(kube, namespace, 2), timeout=60, what="back to 2"
            )
            await untouched(kube, namespace, kept)
            emptied = set(four.values()) - set(kept.values())
            assert len(emptied) == 2
            gone = {name: await kube.get(NODE, name) for name in emptied}

            async def scaled_down() -> bool:
                return not {n["metadata"]["name"] for n in await nodes_with(kube, group)} & emptied

            await eventually(scaled_down, timeout=120, what="the emptied nodes removed")
            removed_after = time.monotonic() - down
            # By cluster-autoscaler's scale-down, on its own records: an Event on each node,
            # two on its status ConfigMap for each (its "nodes removed" Event on the node, written
            # after the deletion, was not found on the deleted node's uid).
            status = await get_or_none(kube, CONFIG_MAP, "cluster-autoscaler-status", "kube-system")
            assert status is not None

            async def recorded() -> dict[str, list[str]] | None:
                said = {"status": messages(await events_of(kube, status), "ScaleDownEmpty")}
                for name, node in gone.items():
                    said[name] = messages(await events_of(kube, node), "ScaleDown")
                done = all(
                    "marked the node as toBeDeleted/unschedulable" in said[name]
                    and f'Scale-down: removing empty node "{name}"' in said["status"]
                    and f"Scale-down: empty node {name} removed" in said["status"]
                    for name in gone
                )
                seen.append(said)
                return said if done else None

            seen: list[dict[str, list[str]]] = []
            try:
                await eventually(recorded, timeout=20, what="cluster-autoscaler's Events")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; Events seen: {seen[-1:]}") from None
            # The members left untouched; gangcheck reclaimed nothing.
            await untouched(kube, namespace, kept)
            assert await placed(kube, namespace, 2) == kept
            wl = await new_slice(kube, namespace)
            assert wl is not None and check_state(wl, queue.check)["state"] == "Ready"
            # its request withdrawn once the members it asked for were gone: a Provisioned
            # request left has cluster-autoscaler book its capacity on the emptied nodes
            assert await slice_request(kube, namespace) is None
            events = await events_of(kube, wl)
            assert not messages(events, "ReclaimingArrivals")
            assert not [e for e in events if "RolledBack" in str(e.get("reason"))]
            cluster.record(
                f"elastic c. real CA, whole-node pods: 2 running after {at_two:.1f}s; scaled to "
                f"4, 4 running {at_four:.1f}s later (the slice asked for 2); scaled back to 2, "
                f"the 2 emptied nodes removed by CA's scale-down {removed_after:.1f}s later"
            )
        finally:
            await delete_quietly(kube, JOB, "gang", namespace)
            await _drain_and_delete_new_nodes(kube, namespace, group, before)
