"""The orphan sweep: never from a cache that cannot prove absence, and what arrived is reclaimed.

Real kube-apiserver; gangcheck's controller talks to it through the fault-injecting proxy
(tests/faults/proxy.py), which produces what a real server will not do on demand: a 404 on the
Workload list and watch, a list answered without its items. The test plays Kueue core and the
autoscaler, as in test_fulfillment.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
    WORKLOAD,
)
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import (
    CONFIG_ANNOTATION,
    DEADLINE_ANNOTATION,
    GROUP_UID_ANNOTATION,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    WORKLOAD_UID_ANNOTATION,
)
from gangcheck.model.objects import Obj
from tests.faults.proxy import EMPTY, STATUS, FaultProxy, Faults, Rule
from tests.integration.harness import Cluster, RunningController, eventually, never
from tests.integration.test_fulfillment import (
    GPU_TAINT,
    _check_message,
    arrived_for,
    fit,
    gang,
    req_name,
)
from tests.integration.test_podgroups import Groups, controller_running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def control_plane(testbed_binaries: dict[str, Path]) -> Iterator[ControlPlane]:
    """A control plane of this module's own (it overrides the session's): every call goes
    through the proxy, which on a plane full of other tests' objects lists slowly, and a
    fault injected here should reach no other test."""
    with ControlPlane(binaries=testbed_binaries) as plane:
        yield plane


@pytest.fixture
async def faults() -> Faults:
    return Faults()


@pytest.fixture
async def proxy(control_plane: ControlPlane, faults: Faults) -> AsyncIterator[FaultProxy]:
    started = await FaultProxy(control_plane.kubeconfig, faults, replica="gangcheck").start()
    yield started
    await started.stop()


@pytest.fixture
async def proxied(proxy: FaultProxy, tmp_path: Path) -> AsyncIterator[RunningController]:
    """gangcheck's controller, every call of it through the proxy."""
    running = RunningController(str(proxy.kubeconfig(tmp_path / "gangcheck.kubeconfig")))
    await running.start()
    yield running
    proxy.faults.enabled = False
    await running.stop()


async def _in_flight(cluster: Cluster) -> tuple[str, dict[str, str]]:
    """A gang with its request and templates made; (request name, {name: uid})."""
    await cluster.install_check(fit(deadline=120))
    await cluster.submit(gang())
    name = req_name(cluster)
    request = await cluster.wait_request(name)
    made = {request["metadata"]["name"]: request["metadata"]["uid"]}
    for template in await cluster.templates():
        made[template["metadata"]["name"]] = template["metadata"]["uid"]
    return name, made


async def _still_there(cluster: Cluster) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["uid"] for o in await _objects(cluster)}


async def _objects(cluster: Cluster) -> list[dict[str, object]]:
    return [*await cluster.requests(), *await cluster.templates()]


def _deletes(faults: Faults, plural: str) -> list[str]:
    return [w.path for w in faults.writes if w.method == "DELETE" and f"/{plural}/" in w.path]


async def test_a_404_on_the_workload_list_and_watch_deletes_no_request(
    cluster: Cluster, proxied: RunningController, proxy: FaultProxy, faults: Faults
) -> None:
    """Reported: one 404 emptied the optional Workload cache, every Workload looked deleted
    and its request and templates were removed. Now the cache is kept, not trusted, until a
    list succeeds again; nothing is deleted meanwhile."""
    _, made = await _in_flight(cluster)
    not_served = Rule(STATUS, status=404, path=r"/workloads$", methods=frozenset({"GET"}), times=3)
    faults.rules.append(not_served)
    assert proxy.cut(r"/workloads$") >= 1
    assert proxied.controller is not None
    workloads = proxied.controller.caches.workloads

    async def recovered() -> bool:
        return not_served.times == 0 and workloads.authoritative

    await eventually(recovered, timeout=40, what="three 404s answered, then a list again")
    assert await _still_there(cluster) == made
    assert not _deletes(faults, "provisioningrequests")
    assert not _deletes(faults, "podtemplates")
    assert workloads.store.get("wl", cluster.ns) is not None


async def test_a_workload_missing_from_a_lagging_list_is_read_live_before_any_delete(
    cluster: Cluster, proxied: RunningController, proxy: FaultProxy, faults: Faults
) -> None:
    """A relist answered without the Workload (a cache behind the server) makes it look
    deleted; the live read of the Workload by name and uid finds it, so nothing is deleted."""
    name, made = await _in_flight(cluster)
    lagging = Rule(EMPTY, path=r"/workloads$", methods=frozenset({"GET"}), watch=False, times=1)
    faults.rules.append(lagging)
    gone = Rule(STATUS, status=410, path=r"/workloads$", watch=True, times=1)
    faults.rules.append(gone)  # the watch expired: relist (answered by the lagging list)
    assert proxy.cut(r"/workloads$") >= 1
    assert proxied.controller is not None
    workloads = proxied.controller.caches.workloads

    async def read_live() -> bool:
        return lagging.times == 0 and any(
            c.method == "GET" and c.path.endswith(f"/namespaces/{cluster.ns}/workloads/wl")
            for c in faults.calls
        )

    await eventually(read_live, timeout=40, what="the lagging list, then a live read of wl")
    assert workloads.authoritative
    await never(
        lambda: _async(_deletes(faults, "provisioningrequests")),
        seconds=1.5,
        what="a request deleted after the live read found its Workload",
    )
    assert await _still_there(cluster) == made
    assert await cluster.request(name) is not None


async def _async(value: object) -> object:
    return value


async def test_a_workload_deleted_mid_attempt_has_its_arrived_nodes_reclaimed(
    cluster: Cluster, proxied: RunningController
) -> None:
    """Reported: the Workload deleted during an attempt, the sweep deleted the request and
    left all 20 nodes that had arrived for it. They are reclaimed like any rollback's."""
    await cluster.install_check(fit(deadline=120))
    await cluster.submit(gang(members=4))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    arrived = await cluster.add_nodes(3)

    async def recorded() -> bool:
        return await arrived_for(cluster, name) == sorted(arrived)

    await eventually(recorded, what="3 arrivals recorded")
    uid = (await cluster.kube.get(WORKLOAD, "wl", cluster.ns))["metadata"]["uid"]
    await cluster.kube.delete(WORKLOAD, "wl", cluster.ns)

    async def reclaimed() -> bool:
        return not await cluster.nodes()

    await eventually(reclaimed, what="the 3 arrived nodes reclaimed")
    # Provisioned, before its deadline: the request is kept for what its source still
    # delivers (lifecycle.promise), its reclaim recorded on it; Failed closes the promise.
    await _kept_open(cluster, name, reclaimed=arrived)
    await cluster.set_request_conditions(name, {"Failed": "gave up"})
    await cluster.wait_request_gone(name)
    await eventually(_no_templates(cluster), what="its templates deleted with it")
    listing = await cluster.kube.list_objects(PROVISIONING_REQUEST, cluster.ns)
    assert not listing.get("items")
    # The Workload is gone outright (as MultiKueue removes a worker's copy): an Event on it,
    # by uid, is the record left in the cluster of what arrived for it and was reclaimed.
    (event,) = await cluster.wait_events("ReclaimingArrivals", about="wl")
    assert event["involvedObject"]["uid"] == uid
    assert all(node in event["message"] for node in arrived), event["message"]
    assert "Workload deleted" in event["message"]


async def test_a_workload_deleted_after_ready_before_it_started_has_its_nodes_reclaimed(
    cluster: Cluster, proxied: RunningController
) -> None:
    """A MultiKueue worker whose copy lost the race after its check turned Ready: the manager
    deletes the copy before any member ran. Before, the fulfilled request's nodes were left
    (held for a gang that had left) for the autoscaler; now they are reclaimed by the safe
    path, as a deletion mid-attempt's are."""
    await cluster.install_check(fit(deadline=120))
    await cluster.submit(gang(members=2, gpu=2))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    arrived = await cluster.add_nodes(2, gpu=2)
    await cluster.wait_check("wl", "Ready")
    req = await cluster.request(name)
    assert req is not None and req["metadata"]["annotations"]["gangcheck.io/phase"] == "Fulfilled"
    await cluster.kube.delete(WORKLOAD, "wl", cluster.ns)
    await cluster.wait_request_gone(name)

    async def reclaimed() -> bool:
        return not await cluster.nodes()

    await eventually(reclaimed, what="the 2 nodes of the fulfilled, never started gang reclaimed")
    (event,) = await cluster.wait_events("ReclaimingArrivals", about="wl")
    assert all(node in event["message"] for node in arrived), event["message"]


async def test_a_workload_deleted_mid_attempt_has_the_arrivals_it_passed_over_reclaimed(
    cluster: Cluster, proxied: RunningController
) -> None:
    """An arrival the gang passed over (a taint its members do not tolerate: it could take
    none of them, so it was never recorded while the gang waited) came for it all the same:
    when the Workload is deleted mid-attempt it is recorded and reclaimed with the rest."""
    await cluster.install_check(fit(deadline=120))
    await cluster.submit(gang(members=4))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    usable = await cluster.add_nodes(2)
    tainted = await cluster.add_nodes(1, taints=[GPU_TAINT])

    async def seen() -> Any:
        recorded = await arrived_for(cluster, name) == sorted(usable)
        return recorded and await _check_message(cluster, "wl", GPU_TAINT["key"])

    await eventually(seen, what="2 arrivals recorded and the tainted one named")
    assert await arrived_for(cluster, name) == sorted(usable)  # the tainted one is not
    await cluster.kube.delete(WORKLOAD, "wl", cluster.ns)

    async def reclaimed() -> bool:
        return not await cluster.nodes()

    await eventually(reclaimed, what=f"the arrived nodes reclaimed, {tainted} too")
    await _kept_open(cluster, name, reclaimed=[*usable, *tainted])
    await cluster.set_request_conditions(name, {"Failed": "gave up"})
    await cluster.wait_request_gone(name)


async def _kept_open(cluster: Cluster, name: str, *, reclaimed: list[str]) -> Obj:
    """The request of a gang that is gone, kept open (no rollback recorded, not being
    deleted), once its reclaims' outcome names `reclaimed` (durable: on the request)."""

    async def recorded() -> Obj | None:
        req = await cluster.request(name)
        notes = (req or {}).get("metadata", {}).get("annotations") or {}
        outcome = json.loads(notes.get(OUTCOME_ANNOTATION) or "{}")
        return req if sorted(outcome.get("reclaimed") or ()) == sorted(reclaimed) else None

    req = await eventually(recorded, what=f"{name} kept, its reclaim of {reclaimed} recorded")
    assert not req["metadata"].get("deletionTimestamp")
    assert PHASE_ANNOTATION not in req["metadata"]["annotations"]
    return req


async def _one_of_two_arrived_then_deleted(cluster: Cluster, deadline: int) -> tuple[str, str]:
    """A gang of two members of 2 GPUs, its request Provisioned, one node of the two arrived
    and recorded, then its Workload deleted: (request name, the node)."""
    await cluster.install_check(fit(deadline=deadline))
    await cluster.submit(gang(members=2, gpu=2))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (first,) = await cluster.add_nodes(1, gpu=2)

    async def recorded() -> bool:
        return await arrived_for(cluster, name) == [first]

    await eventually(recorded, what="the first arrival recorded")
    await cluster.kube.delete(WORKLOAD, "wl", cluster.ns)
    return name, first


async def _none_left(cluster: Cluster) -> bool:
    return not await cluster.nodes()


def _no_templates(cluster: Cluster) -> Callable[[], Awaitable[bool]]:
    async def none() -> bool:
        return not await cluster.templates()

    return none


async def test_a_node_delivered_after_the_workload_was_deleted_is_reclaimed(
    cluster: Cluster, proxied: RunningController
) -> None:
    """Issue 33: the autoscaler's Provisioned=True is a committed scale-up, which deleting
    the request does not take back. Before, the withdrawal deleted the request at once and a
    node registering after was recorded for nothing and left to the autoscaler's scale-down.
    Now what arrived is reclaimed at once, the request kept while its promise is open (until
    its deadline); a new controller resumes it; the node that comes after is recorded for
    it and reclaimed; everything asked for having come (two nodes for two members, the
    reclaims' outcome naming both), the request and its templates are deleted before the
    deadline. The templates are owned by nothing: no garbage collector runs here, but none
    would delete them with the Workload (test_admission_check.py asserts they have no
    owner)."""
    name, first = await _one_of_two_arrived_then_deleted(cluster, deadline=60)
    await eventually(lambda: _none_left(cluster), what="the arrived node reclaimed at once")
    kept = await _kept_open(cluster, name, reclaimed=[first])
    assert "gangcheck.io/gang-gone" in kept["metadata"]["annotations"]
    deadline = parse_time(kept["metadata"]["annotations"][DEADLINE_ANNOTATION])
    assert deadline is not None
    assert len(await cluster.templates()) == 1  # kept with it: the ledger reads them
    (event,) = await cluster.wait_events("ReclaimingArrivals", about="wl")
    assert first in event["message"] and "Workload deleted" in event["message"]

    await proxied.stop()  # a restart: everything the sweep reads is on the request
    await proxied.start()
    (second,) = await cluster.add_nodes(1, gpu=2)
    await eventually(lambda: _none_left(cluster), what="the late node reclaimed")

    async def told() -> bool:
        said = [e["message"] for e in await cluster.events("ReclaimingArrivals")]
        return any(second in m for m in said)

    await eventually(told, what=f"an Event naming {second} reclaimed")
    await cluster.wait_request_gone(name, timeout=40)  # everything asked for came
    assert datetime.now(UTC) < deadline  # closed early, not by the deadline
    await eventually(_no_templates(cluster), what="its templates deleted with it")
    assert not await cluster.nodes()


async def test_a_promise_nothing_more_came_for_closes_at_the_deadline(
    cluster: Cluster, proxied: RunningController
) -> None:
    """No node comes after the withdrawal: the request is kept until its deadline, then
    deleted with its templates, nothing held."""
    name, first = await _one_of_two_arrived_then_deleted(cluster, deadline=12)
    await eventually(lambda: _none_left(cluster), what="the arrived node reclaimed at once")
    req = await _kept_open(cluster, name, reclaimed=[first])
    deadline = parse_time(req["metadata"]["annotations"][DEADLINE_ANNOTATION])
    assert deadline is not None
    await cluster.wait_request_gone(name, timeout=30)
    assert datetime.now(UTC) >= deadline
    await eventually(_no_templates(cluster), what="its templates deleted with it")
    assert not await cluster.nodes()


async def big_group_waiting_with_one_node(cluster: Cluster, groups: Groups, config: str) -> None:
    """PodGroup "big" of 2 members of 2 GPUs under `config`, its request Provisioned, one
    node of the two arrived and recorded for it."""
    await groups.upstream("big", 2, annotations={CONFIG_ANNOTATION: config})
    await groups.member("big-0", "big", gpu=2)
    await groups.member("big-1", "big", gpu=2)
    await cluster.set_request_conditions("big-pg-1", {"Provisioned": "ok"})
    arrived = await cluster.add_nodes(1, gpu=2)  # one of two

    async def recorded() -> bool:
        return await arrived_for(cluster, "big-pg-1") == arrived

    await eventually(recorded, what="the node recorded as arrived")


async def _groups_reclaimed_by_delete_node(cluster: Cluster) -> tuple[Groups, str]:
    """The namespace opted in to PodGroup gangs, and a config (its name returned) whose
    reclaimer is DeleteNode, its deadline long enough to be withdrawn before it."""
    groups = Groups(cluster)
    await groups.opt_in()
    config = f"pg-{cluster.ns}"
    spec = {"fulfillment": {"deadlineSeconds": 120, "reclaimer": "DeleteNode"}}
    await cluster.kube.create(ATOMIC_CONFIG, {"metadata": {"name": config}, "spec": spec})
    return groups, config


async def test_a_podgroup_deleted_mid_attempt_has_its_arrived_nodes_reclaimed(
    control_plane: ControlPlane, cluster: Cluster
) -> None:
    """The same for a PodGroup gang: the group deleted while its request waits for the rest
    of the delivery; the node that arrived is reclaimed by the reclaimer of the group's
    config (recorded on the request, the group being gone), then the request is deleted."""
    groups, config = await _groups_reclaimed_by_delete_node(cluster)
    try:
        async with controller_running(str(control_plane.kubeconfig)):
            await big_group_waiting_with_one_node(cluster, groups, config)
            await cluster.kube.delete(UPSTREAM_POD_GROUP_V1BETA1, "big", cluster.ns)
            await cluster.wait_request_gone("big-pg-1")

            async def reclaimed() -> bool:
                return not await cluster.nodes()

            await eventually(reclaimed, what="the arrived node reclaimed")
    finally:
        await cluster.kube.delete(ATOMIC_CONFIG, config)


async def test_a_podgroup_gone_at_once_keeps_its_request_for_the_node_that_comes_after(
    control_plane: ControlPlane, cluster: Cluster
) -> None:
    """A PodGroup that vanishes at once (no finalizer holds it: its deletion is never seen
    pending), its request Provisioned, one node of two arrived: the orphan sweep keeps the
    request while the promise is open, as a Workload's (lifecycle.promise); the node that
    comes after is recorded for it and reclaimed, and everything asked for having come, the
    request and its templates are deleted (its deadline is 120 s away)."""
    groups, config = await _groups_reclaimed_by_delete_node(cluster)
    try:
        async with controller_running(str(control_plane.kubeconfig)):
            await big_group_waiting_with_one_node(cluster, groups, config)
            (arrived,) = [n["metadata"]["name"] for n in await cluster.nodes()]
            no_finalizers = {"metadata": {"finalizers": None}}
            await cluster.kube.merge_patch(
                UPSTREAM_POD_GROUP_V1BETA1, "big", no_finalizers, cluster.ns
            )
            await cluster.kube.delete(UPSTREAM_POD_GROUP_V1BETA1, "big", cluster.ns)
            await eventually(lambda: _none_left(cluster), what="the arrived node reclaimed")
            await _kept_open(cluster, "big-pg-1", reclaimed=[arrived])
            await cluster.add_nodes(1, gpu=2)
            await eventually(lambda: _none_left(cluster), what="the late node reclaimed")
            await cluster.wait_request_gone("big-pg-1")
            await eventually(_no_templates(cluster), what="its templates deleted with it")
    finally:
        await cluster.kube.delete(ATOMIC_CONFIG, config)


async def test_a_workload_made_again_under_its_name_while_gangcheck_was_down(
    cluster: Cluster, proxied: RunningController
) -> None:
    """The Workload is deleted and made again under the same name (a new uid) while gangcheck
    is down: on its start it finds the new Workload and the old one's request, waiting with
    one node arrived. The old attempt is withdrawn, its node reclaimed, and the new Workload
    asked for under its own uid. Before, the old request and its held node stayed, and the
    new Workload's ask met its name at every retry: FailedCreate 'ProvisioningRequest ...
    already exists and was not made by gangcheck for this attempt'."""
    await cluster.install_check(fit(deadline=120))
    await cluster.submit(gang(members=4))
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    arrived = await cluster.add_nodes(1)  # one of the four members' room: waiting

    async def recorded() -> bool:
        return await arrived_for(cluster, name) == arrived

    await eventually(recorded, what="the arrival recorded")
    old = (await cluster.kube.get(WORKLOAD, "wl", cluster.ns))["metadata"]["uid"]
    await proxied.stop()
    await cluster.kube.delete(WORKLOAD, "wl", cluster.ns)
    await cluster.submit(gang(members=4))
    new = (await cluster.kube.get(WORKLOAD, "wl", cluster.ns))["metadata"]["uid"]
    assert new != old
    await proxied.start()

    async def asked_anew() -> bool:
        req = await cluster.request(name)
        return bool(req) and req["metadata"]["annotations"][WORKLOAD_UID_ANNOTATION] == new

    await eventually(asked_anew, what="the request made for the new Workload's uid")

    async def reclaimed() -> bool:
        return not await cluster.nodes()

    await eventually(reclaimed, what="the old attempt's arrived node reclaimed")
    assert not await cluster.events("FailedCreate")


async def test_a_podgroup_made_again_under_its_name_while_gangcheck_was_down(
    control_plane: ControlPlane, cluster: Cluster
) -> None:
    """The same for a PodGroup: deleted and made again under its name while gangcheck is
    down, its members still gated; the old group's attempt is withdrawn, its arrived node
    reclaimed, and the new group asked for under its own uid."""
    groups, config = await _groups_reclaimed_by_delete_node(cluster)
    try:
        async with controller_running(str(control_plane.kubeconfig)):
            await big_group_waiting_with_one_node(cluster, groups, config)
        await cluster.kube.delete(UPSTREAM_POD_GROUP_V1BETA1, "big", cluster.ns)
        # its protection finalizer, lifted by kube-controller-manager (not run here) once
        # no member is bound: none is
        no_finalizers = {"metadata": {"finalizers": None}}
        with contextlib.suppress(NotFoundError):
            await cluster.kube.merge_patch(
                UPSTREAM_POD_GROUP_V1BETA1, "big", no_finalizers, cluster.ns
            )
        made = await groups.upstream("big", 2, annotations={CONFIG_ANNOTATION: config})
        async with controller_running(str(control_plane.kubeconfig)):

            async def asked_anew() -> bool:
                req = await cluster.request("big-pg-1")
                annotations = (req or {}).get("metadata", {}).get("annotations", {})
                return bool(annotations.get(GROUP_UID_ANNOTATION) == made["metadata"]["uid"])

            await eventually(asked_anew, what="the request made for the new group's uid")

            async def reclaimed() -> bool:
                return not await cluster.nodes()

            await eventually(reclaimed, what="the old attempt's arrived node reclaimed")
            assert not await cluster.events("FailedCreate")
    finally:
        await cluster.kube.delete(ATOMIC_CONFIG, config)
