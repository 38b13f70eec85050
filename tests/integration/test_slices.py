"""Kueue Workload slices (an elastic Job scaled up) against a real kube-apiserver.

The test plays Kueue core as v0.17 does with ElasticJobsViaWorkloadSlices on: the old slice,
admitted, its members running on a node; the new slice with the Job's whole new size,
annotated ``kueue.x-k8s.io/workload-slice-replacement-for: <ns>/<old>``, its quota reserved,
and the old slice Finished (``WorkloadSliceReplaced``, naming the new slice's UID). The cloud
is played by creating Nodes; gangcheck runs in fit mode with short deadlines.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import NODE, POD, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.logic.attempt import naming
from gangcheck.logic.attempt.hold import HOLD_TAINT, hold_taint, hold_toleration
from gangcheck.logic.placement.taints import taint_of, toleration_of
from gangcheck.logic.workloads import slices
from gangcheck.model.names import CONSUME_ANNOTATION as CONSUME
from gangcheck.model.names import HOLD_AS
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import (
    Cluster,
    CrashingController,
    RunningController,
    arrived_for,
    eventually,
    now,
)

pytestmark = pytest.mark.integration

ARRIVED = "gangcheck.io/arrived-for"


def fit(deadline: int) -> dict[str, Any]:
    return {
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": deadline, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 5},
    }


def slice_of(name: str, members: int, *, replaces: str = "", check: str = "Pending") -> Any:
    builder = WorkloadBuilder(name).pod_set("workers", members, pod_template(gpu=1))
    if replaces:
        builder.annotation(slices.REPLACEMENT_FOR, replaces)
    return builder.reserve_quota().check(state=check)


async def running_slice(cluster: Cluster, members: int = 4) -> tuple[str, list[str]]:
    """The old slice as Kueue leaves it once admitted: its check Ready, Admitted, and its
    members running on a node that was there before (not one that arrived for any request)."""
    await cluster.submit(slice_of("old", members, check="Ready"))
    await cluster.set_workload_condition("old", "Admitted")
    (node,) = await cluster.add_nodes(1, gpu=members, prefix="running")
    pods = [
        (await cluster.create_pod(f"job-{i}", node_name=node, consume="first-request"))["metadata"][
            "name"
        ]
        for i in range(members)
    ]
    return node, pods


async def replace_with(cluster: Cluster, members: int, *, old: str = "old") -> str:
    """The new slice, its quota reserved; the old one finished as replaced by it."""
    name = await cluster.submit(slice_of("new", members, replaces=f"{cluster.ns}/{old}"))
    uid = (await cluster.workload(name))["metadata"]["uid"]
    await finish_as_replaced(cluster, old, by=uid)
    return name


async def scale_in_place(cluster: Cluster, name: str, count: int) -> None:
    """As Kueue's EnsureWorkloadSlices on a scale-down: the slice's count lowered in place."""

    def lower(wl: Any) -> None:
        wl["spec"]["podSets"][0]["count"] = count

    await cluster.update_spec(name, lower)


async def finish_as_replaced(cluster: Cluster, name: str, *, by: str) -> None:
    def finish(wl: Any) -> None:
        conds = [c for c in wl["status"].get("conditions") or [] if c["type"] != "Finished"]
        conds.append(
            {
                "type": "Finished",
                "status": "True",
                "reason": slices.REPLACED_REASON,
                "message": f"Replaced to accommodate a workload (UID: {by}, JobUID: j) due to "
                "workload slice aggregation",
                "lastTransitionTime": now(),
            }
        )
        wl["status"]["conditions"] = conds

    await cluster.update_status(name, finish)


async def untouched(cluster: Cluster, node: str, pods: list[str]) -> None:
    """The running members and their node as they were: every pod there, bound, the node
    neither cordoned nor tainted by gangcheck, nor recorded as arrived for anything."""
    got = await cluster.kube.get(NODE, node)
    assert not got["spec"].get("unschedulable")
    assert not [t for t in got["spec"].get("taints") or [] if "gangcheck" in t["key"]]
    assert ARRIVED not in (got["metadata"].get("annotations") or {})
    for pod in pods:
        assert (await cluster.kube.get(POD, pod, cluster.ns))["spec"]["nodeName"] == node


async def _message(cluster: Cluster, text: str) -> Any:
    entry = await cluster.check_state("new")
    return entry if text in entry["message"] else None


async def test_a_scaled_up_slice_asks_for_the_added_members_only_and_turns_ready_when_they_fit(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=60))
    node, pods = await running_slice(cluster)
    await replace_with(cluster, 8)
    name = naming.request_name("new", cluster.check, 1)
    req = await cluster.wait_request(name)
    assert [p["count"] for p in req["spec"]["podSets"]] == [4]
    base = json.loads(req["metadata"]["annotations"][slices.SLICE_ANNOTATION])
    assert base == {"replaces": f"{cluster.ns}/old", "running": {"workers": 4}}
    await eventually(
        lambda: _message(cluster, f"adds 4 members to {cluster.ns}/old running 4"),
        what="the slice's relation in the check message",
    )

    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (added,) = await cluster.add_nodes(1, gpu=4)
    check = await cluster.wait_check("new", "Ready")
    assert f"adds 4 members to {cluster.ns}/old running 4" in check["message"]

    async def opened_and_started() -> bool:
        got = await cluster.kube.get(NODE, added)
        r = await cluster.request(name)
        return (
            r is not None
            and r["metadata"]["annotations"].get("gangcheck.io/phase") == "Started"
            and got["metadata"]["annotations"].get(ARRIVED) == f"{cluster.ns}/{name}"
            and not [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]
        )

    await eventually(opened_and_started, what="the added node recorded, its hold lifted")
    await untouched(cluster, node, pods)
    # the old slice's check, finished, was left as it was: no request made for it
    assert [r["metadata"]["name"] for r in await cluster.requests()] == [name]


async def test_a_slice_whose_added_members_do_not_fit_is_rolled_back_and_stays_pending(
    cluster: Cluster, controller: RunningController
) -> None:
    """3 of the 4 added fit by the deadline: the difference is rolled back (its node
    reclaimed), the check stays Pending (no Retry: Kueue would suspend the whole Job), the
    4 running members untouched; after the backoff the next attempt asks for the 4 again."""
    # The deadline is shortened to 4 s only once the 3-GPU node is recorded for the slice:
    # from the start, the running slice's setup and the node's arrival raced it on a loaded
    # machine. A deadline change applies at once: it has passed, the rollback follows.
    await cluster.install_check(fit(deadline=60))
    node, pods = await running_slice(cluster)
    await replace_with(cluster, 8)
    first = naming.request_name("new", cluster.check, 1)
    await cluster.set_request_conditions(first, {"Provisioned": ""})
    (partial,) = await cluster.add_nodes(1, gpu=3)

    async def recorded() -> bool:
        return partial in await arrived_for(cluster, first)

    await eventually(recorded, what="the 3-GPU node recorded")
    await cluster.set_config(fit(deadline=4))

    event = (await cluster.wait_events("SliceRolledBack", timeout=30))[0]
    assert "3 of 4 members placeable" in event["message"]
    assert "its 4 running members untouched" in event["message"]
    with pytest.raises(NotFoundError):
        await cluster.kube.get(NODE, partial)
    await untouched(cluster, node, pods)
    assert not await cluster.events("AdmissionCheckUpdated") or all(
        "to Retry" not in e["message"] and "to Rejected" not in e["message"]
        for e in await cluster.events("AdmissionCheckUpdated")
    )

    second = naming.request_name("new", cluster.check, 2)
    req = await cluster.wait_request(second, timeout=30)
    assert [p["count"] for p in req["spec"]["podSets"]] == [4]
    await cluster.wait_request_gone(first)
    entry = await cluster.check_state("new")
    assert entry["state"] == "Pending"
    assert int(entry.get("retryCount") or 0) == 0  # Kueue's count: gangcheck never wrote one
    await untouched(cluster, node, pods)


async def test_a_slice_whose_predecessor_is_gone_asks_nothing_and_says_why(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=60))
    await cluster.submit(slice_of("new", 8, replaces=f"{cluster.ns}/vanished"))
    check = await eventually(
        lambda: _message(cluster, "which is gone"), what="the check saying the slice is gone"
    )
    assert check["state"] == "Pending"
    events = await cluster.wait_events("WorkloadSliceUnclear")
    assert all(f"{cluster.ns}/vanished" in e["message"] for e in events)
    assert await cluster.requests() == []


async def test_two_slices_racing_for_one_job_the_loser_asks_nothing(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(fit(deadline=60))
    node, pods = await running_slice(cluster)
    winner = await replace_with(cluster, 8)
    loser = await cluster.submit(slice_of("late", 12, replaces=f"{cluster.ns}/old"))
    assert winner != loser

    async def raced() -> Any:
        wl = await cluster.kube.get(WORKLOAD, loser, cluster.ns)
        entries = (wl.get("status") or {}).get("admissionChecks") or []
        entry = next(e for e in entries if e["name"] == cluster.check)
        return entry if "two slices raced" in entry["message"] else None

    assert (await eventually(raced, what="the losing slice saying so"))["state"] == "Pending"
    await cluster.wait_events("WorkloadSliceUnclear", about=loser)
    names = [r["metadata"]["name"] for r in await cluster.requests()]
    assert names == [naming.request_name("new", cluster.check, 1)]
    await untouched(cluster, node, pods)


def job_template(namespace: str, first: str) -> Any:
    """The Job's pod template as Kueue leaves it once the first slice started: the first
    slice's podSetUpdates merged in (its consume annotation, the toleration of its hold).
    Kueue builds every later slice from this template and applies no slice's updates to the
    running Job, so the added members carry the same."""
    template = pod_template(gpu=1, tolerations=[hold_toleration(f"{namespace}/{first}")])
    template["metadata"] = {"annotations": {CONSUME: first}}
    return template


def request_path(cluster: Cluster, name: str) -> str:
    return f"/apis/autoscaling.x-k8s.io/v1/namespaces/{cluster.ns}/provisioningrequests/{name}"


async def slice_of_four_running(cluster: Cluster) -> tuple[str, str, list[str], str]:
    """A slice "new" of 8 replacing "old", whose 4 members run on one node consuming the
    first slice's request: (that request's name, the node, the running pods, the new slice's
    request name)."""
    await cluster.install_check(fit(deadline=60))
    first = "first-request"
    template = job_template(cluster.ns, first)
    await cluster.submit(
        WorkloadBuilder("old").pod_set("workers", 4, template).reserve_quota().check(state="Ready")
    )
    await cluster.set_workload_condition("old", "Admitted")
    (node,) = await cluster.add_nodes(1, gpu=4, prefix="running")
    pods = [
        (await cluster.create_pod(f"job-{i}", node_name=node, consume=first))["metadata"]["name"]
        for i in range(4)
    ]
    new = await cluster.submit(
        WorkloadBuilder("new")
        .pod_set("workers", 8, template)
        .annotation(slices.REPLACEMENT_FOR, f"{cluster.ns}/old")
        .reserve_quota()
        .check(state="Pending")
    )
    await finish_as_replaced(cluster, "old", by=(await cluster.workload(new))["metadata"]["uid"])
    return first, node, pods, naming.request_name("new", cluster.check, 1)


async def bind_the_added_until_opened_and_started(
    cluster: Cluster, added: str, first: str, name: str
) -> None:
    """Kueue lifts the elastic gate and the scheduler binds the 4 added members (job-4 to
    job-7) on the node `added`; then the hold on it is lifted and the request `name` marked
    Started."""
    for i in range(4, 8):
        await cluster.create_pod(f"job-{i}", node_name=added, consume=first)

    async def opened_and_started() -> bool:
        n = await cluster.kube.get(NODE, added)
        r = await cluster.request(name)
        return (
            r is not None
            and r["metadata"]["annotations"].get("gangcheck.io/phase") == "Started"
            and not [t for t in n["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]
        )

    await eventually(opened_and_started, what="the hold lifted once the 8 members run")


async def test_the_added_nodes_stay_held_for_the_jobs_pods_after_ready_until_its_members_run(
    cluster: Cluster, controller: RunningController
) -> None:
    """The slice turns Ready when its 4 added members fit on the node that came; that node
    stays held, as the Job's pods tolerate it (the first slice's hold), so no other pod can be
    scheduled there before Kueue lifts the elastic gate; once every member of the slice is
    scheduled the hold is lifted and the attempt is marked started."""
    first, node, pods, name = await slice_of_four_running(cluster)
    req = await cluster.wait_request(name)
    assert req["metadata"]["annotations"][HOLD_AS] == f"{cluster.ns}/{first}"

    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (added,) = await cluster.add_nodes(1, gpu=4)
    await cluster.wait_check("new", "Ready")
    # gangcheck writes the check after the decision's other writes: what Ready was decided
    # with is on the Node and the request now
    got = await cluster.kube.get(NODE, added)
    assert got["metadata"]["annotations"].get(ARRIVED) == f"{cluster.ns}/{name}"
    holds = [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]
    assert holds == [hold_taint(f"{cluster.ns}/{first}")]
    # the Job's added pods may go there; a pod without the toleration may not
    template = job_template(cluster.ns, first)
    assert toleration_of(template["spec"]["tolerations"][0]).tolerates(taint_of(holds[0]))
    assert holds[0]["effect"] == "NoSchedule"
    r = await cluster.request(name)
    assert r is not None and r["metadata"]["annotations"].get("gangcheck.io/phase") != "Started"

    await bind_the_added_until_opened_and_started(cluster, added, first, name)
    check = await cluster.check_state("new")
    assert check["state"] == "Ready"
    await untouched(cluster, node, pods)


async def test_a_controller_killed_as_the_slice_turns_ready_leaves_it_held_and_asked_once(
    control_plane: Any, cluster: Cluster
) -> None:
    """The slice's request Provisioned and its node come (recorded and held as the Job's
    pods tolerate); the controller dies right after marking the request Fulfilled, before
    writing the check Ready. A fresh one finds the slice where that left it: Ready, the node
    still held as the Job's pods tolerate, nothing asked again nor reclaimed, no rollback;
    once the 4 added members are bound, the hold lifted and the attempt marked started."""
    first, node, pods, name = await slice_of_four_running(cluster)
    controller = RunningController(str(control_plane.kubeconfig))
    await controller.start()
    try:
        await cluster.wait_request(name)
    finally:
        await controller.stop()
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (added,) = await cluster.add_nodes(1, gpu=4)
    crashing = CrashingController(
        str(control_plane.kubeconfig), after_path=request_path(cluster, name)
    )
    await crashing.start()
    await eventually(crashing.crashed, timeout=20, what="a crash after the request's mark")
    await crashing.stop()
    # it died after marking the request Fulfilled, before writing the check Ready: nothing of
    # this namespace written after the mark (writes of other tests' objects on the shared API
    # server, in flight as it died, may be answered after it)
    mark = f"PATCH {request_path(cluster, name)}"
    assert mark in crashing.written, crashing.written
    after = crashing.written[crashing.written.index(mark) + 1 :]
    assert not [w for w in after if f"/namespaces/{cluster.ns}/" in w], crashing.written
    marked = await cluster.request(name)
    assert marked is not None
    assert marked["metadata"]["annotations"].get("gangcheck.io/phase") == "Fulfilled"
    assert (await cluster.check_state("new"))["state"] == "Pending"
    fresh = RunningController(str(control_plane.kubeconfig))
    await fresh.start()
    try:
        await cluster.wait_check("new", "Ready")
        got = await cluster.kube.get(NODE, added)
        assert got["metadata"]["annotations"].get(ARRIVED) == f"{cluster.ns}/{name}"
        holds = [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]
        assert holds == [hold_taint(f"{cluster.ns}/{first}")]
        await bind_the_added_until_opened_and_started(cluster, added, first, name)
    finally:
        await fresh.stop()
    assert [r["metadata"]["name"] for r in await cluster.requests()] == [name]
    assert added in {n["metadata"]["name"] for n in await cluster.nodes()}
    assert not await cluster.events("ReclaimingArrivals")
    assert not await cluster.events("SliceRolledBack")
    await untouched(cluster, node, pods)


async def test_a_job_scaled_again_while_its_slice_waits_asks_only_beyond_what_runs(
    cluster: Cluster, controller: RunningController
) -> None:
    """4 running, scaled to 8 (slice 'mid' asks for 4), then to 12 before mid is admitted:
    Kueue makes 'new' replacing mid (never admitted) and finishes mid as replaced. new asks
    for the 8 beyond the 4 the first slice runs, not for 12 (mid ran nothing, the first
    slice's members do); mid's request is withdrawn; the running members untouched."""
    await cluster.install_check(fit(deadline=60))
    node, pods = await running_slice(cluster)
    mid = await cluster.submit(slice_of("mid", 8, replaces=f"{cluster.ns}/old"))
    await finish_as_replaced(cluster, "old", by=(await cluster.workload(mid))["metadata"]["uid"])
    mid_request = naming.request_name("mid", cluster.check, 1)
    asked = await cluster.wait_request(mid_request)
    assert [p["count"] for p in asked["spec"]["podSets"]] == [4]

    await replace_with(cluster, 12, old="mid")
    name = naming.request_name("new", cluster.check, 1)
    req = await cluster.wait_request(name)
    assert [p["count"] for p in req["spec"]["podSets"]] == [8]
    base = json.loads(req["metadata"]["annotations"][slices.SLICE_ANNOTATION])
    assert base == {"replaces": f"{cluster.ns}/mid", "running": {"workers": 4}}
    await eventually(
        lambda: _message(cluster, f"adds 8 members to {cluster.ns}/mid running 4"),
        what="the slice's relation in the check message",
    )
    await cluster.wait_request_gone(mid_request)
    await untouched(cluster, node, pods)


async def test_a_pending_slice_replaced_while_provisioned_has_its_arrivals_reclaimed_once(
    cluster: Cluster, controller: RunningController
) -> None:
    """4 running, scaled to 8 ('mid' asks for 4, Provisioned, 2 of its nodes arrive and are
    recorded for it), then to 12 before mid is admitted: mid, finished as replaced, has its
    request withdrawn and its 2 nodes reclaimed (nothing runs on them: the added pods wait
    behind Kueue's elastic gate); they are not carried over: 'new' asks for the 8 beyond the
    4 that run, and is the only request left (nothing asked twice); the running members
    untouched."""
    await cluster.install_check(fit(deadline=60))
    node, pods = await running_slice(cluster)
    mid = await cluster.submit(slice_of("mid", 8, replaces=f"{cluster.ns}/old"))
    await finish_as_replaced(cluster, "old", by=(await cluster.workload(mid))["metadata"]["uid"])
    mid_request = naming.request_name("mid", cluster.check, 1)
    await cluster.wait_request(mid_request)
    await cluster.set_request_conditions(mid_request, {"Provisioned": ""})
    arrived = await cluster.add_nodes(2, gpu=1)

    async def recorded() -> bool:
        for n in arrived:
            notes = (await cluster.kube.get(NODE, n))["metadata"].get("annotations") or {}
            if notes.get(ARRIVED) != f"{cluster.ns}/{mid_request}":
                return False
        return True

    await eventually(recorded, what="the 2 nodes recorded as arrived for mid's request")

    await replace_with(cluster, 12, old="mid")
    name = naming.request_name("new", cluster.check, 1)
    req = await cluster.wait_request(name)
    assert [p["count"] for p in req["spec"]["podSets"]] == [8]
    await cluster.wait_request_gone(mid_request)

    async def reclaimed() -> bool:
        names = {n["metadata"]["name"] for n in await cluster.nodes()}
        return not names & set(arrived)

    await eventually(reclaimed, timeout=30, what="mid's 2 arrived nodes reclaimed")
    (event,) = await cluster.wait_events("ReclaimingArrivals", about="mid")
    assert all(n in event["message"] for n in arrived), event["message"]
    left = await cluster.requests()
    assert [(r["metadata"]["name"], [p["count"] for p in r["spec"]["podSets"]]) for r in left] == [
        (name, [8])
    ]
    await untouched(cluster, node, pods)


async def test_a_job_scaled_down_after_its_admission_then_up_asks_beyond_what_runs_now(
    cluster: Cluster, controller: RunningController
) -> None:
    """8 running, scaled down to 6 (Kueue v0.17 lowers the admitted slice's spec count in
    place, a plain Update: its admission still says 8; the Job controller deletes 2
    members), then up to 10: the new slice asks for the 4 beyond the 6 that run, as Kueue's
    quota counts them, not for the 2 beyond the 8 admitted (2 added members would have found
    no room)."""
    await cluster.install_check(fit(deadline=60))
    node, pods = await running_slice(cluster, 8)
    await scale_in_place(cluster, "old", 6)
    for pod in pods[6:]:  # the Job controller deletes the members beyond 6
        await cluster.kube.delete(POD, pod, cluster.ns)
    assert (await cluster.workload("old"))["status"]["admission"]["podSetAssignments"][0][
        "count"
    ] == 8

    await replace_with(cluster, 10)
    name = naming.request_name("new", cluster.check, 1)
    req = await cluster.wait_request(name)
    assert [p["count"] for p in req["spec"]["podSets"]] == [4]
    base = json.loads(req["metadata"]["annotations"][slices.SLICE_ANNOTATION])
    assert base == {"replaces": f"{cluster.ns}/old", "running": {"workers": 6}}
    await eventually(
        lambda: _message(cluster, f"adds 4 members to {cluster.ns}/old running 6"),
        what="the slice's relation in the check message",
    )
    await untouched(cluster, node, pods[:6])


async def test_an_elastic_jobs_first_workload_scaled_down_before_it_started_is_not_stopped(
    cluster: Cluster, controller: RunningController
) -> None:
    """An elastic Job's first Workload (no slice: a whole gang, with a start watchdog),
    Ready and admitted at 4, 3 members bound, scaled down to 3 before the 4th is scheduled
    (Kueue lowers the spec's count in place; the Job controller deletes the 4th): the
    watchdog counts the 3 the Job has, so the attempt is marked started and the check stays
    Ready. Before, it waited for 4 of 4, rolled back at the start deadline and set Retry,
    on which Kueue evicts the Workload and stops the whole Job, its running members too."""
    config = fit(deadline=60)
    config["fulfillment"]["startDeadlineSeconds"] = 3
    await cluster.install_check(config)
    await cluster.submit(slice_of("first", 4))
    name = naming.request_name("first", cluster.check, 1)
    await cluster.wait_request(name)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    nodes = await cluster.add_nodes(4, gpu=1)
    await cluster.wait_check("first", "Ready")
    await cluster.set_workload_condition("first", "Admitted")
    for i, node_name in enumerate(nodes[:3]):
        await cluster.create_pod(f"member-{i}", node_name=node_name, consume=name)
    await cluster.create_pod("member-3", consume=name)  # not scheduled yet
    await scale_in_place(cluster, "first", 3)
    await cluster.kube.delete(POD, "member-3", cluster.ns, grace_period_seconds=0)

    async def started() -> bool:
        r = await cluster.request(name)
        return r is not None and r["metadata"]["annotations"].get("gangcheck.io/phase") == "Started"

    await eventually(started, what="the attempt marked started on the 3 the Job has")
    await asyncio.sleep(4)  # past the start deadline
    assert (await cluster.check_state("first"))["state"] == "Ready"
    assert not await cluster.events("RolledBack")
    assert {n["metadata"]["name"] for n in await cluster.nodes()} >= set(nodes[:3])


async def test_an_elastic_jobs_first_workload_scaled_down_while_pending_is_judged_on_the_rest(
    cluster: Cluster, controller: RunningController
) -> None:
    """An elastic Job's first Workload with quota, its request for 4 in flight, scaled down
    to 3 (Kueue lowers the spec's count in place; its admission still says 4): Provisioned
    with room for 3, the check turns Ready on the 3 the Job has. Before, it waited for room
    for 4 until its deadline and rolled back."""
    await cluster.install_check(fit(deadline=60))
    await cluster.submit(slice_of("first", 4))
    name = naming.request_name("first", cluster.check, 1)
    asked = await cluster.wait_request(name)
    assert [p["count"] for p in asked["spec"]["podSets"]] == [4]
    await scale_in_place(cluster, "first", 3)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    arrived = await cluster.add_nodes(3, gpu=1)
    check = await cluster.wait_check("first", "Ready")
    assert "the whole gang fits" in check["message"], check["message"]
    for n in arrived:
        notes = (await cluster.kube.get(NODE, n))["metadata"].get("annotations") or {}
        assert notes.get(ARRIVED) == f"{cluster.ns}/{name}"


async def test_a_slice_evicted_and_admitted_again_asks_for_the_whole_job(
    cluster: Cluster, controller: RunningController
) -> None:
    """4 running, scaled to 8 (the slice asks for 4); the slice is evicted, so Kueue stops
    the whole Job (its 4 running members deleted), then admitted again (Evicted reset to
    False, as Kueue's SetQuotaReservation does, the check Pending): nothing runs, so the
    slice asks for all 8, not for the 4 it added before."""
    await cluster.install_check(fit(deadline=60))
    await running_slice(cluster)
    await replace_with(cluster, 8)
    name = naming.request_name("new", cluster.check, 1)
    first = await cluster.wait_request(name)
    assert [p["count"] for p in first["spec"]["podSets"]] == [4]

    await cluster.set_workload_condition("new", "Evicted")
    await cluster.wait_request_gone(name)
    for i in range(4):  # Kueue stopped the Job
        await cluster.kube.delete(POD, f"job-{i}", cluster.ns)
    await cluster.set_workload_condition("new", "Evicted", "False")

    async def asked_again() -> Any:
        req = await cluster.request(name)
        return req if req is not None and not req["metadata"].get("deletionTimestamp") else None

    again = await eventually(asked_again, what="the slice asked again")
    assert [p["count"] for p in again["spec"]["podSets"]] == [8]
    base = json.loads(again["metadata"]["annotations"][slices.SLICE_ANNOTATION])
    assert base == {"replaces": f"{cluster.ns}/old", "running": {}}
    await eventually(
        lambda: _message(cluster, f"adds 8 members to {cluster.ns}/old running 0"),
        what="the slice's relation in the check message",
    )


async def test_a_job_scaled_back_while_its_slice_waits_withdraws_the_ask_and_reclaims_arrivals(
    cluster: Cluster, controller: RunningController
) -> None:
    """4 running, scaled to 8 (the slice asks for 4, Provisioned, 2 of its nodes arrive),
    then back to 4 before the slice is admitted: Kueue lowers the slice's counts in place
    (a scale-down), so it adds 0 members; its check turns Ready with nothing to ask, its
    request is withdrawn and the 2 nodes that arrived for it are reclaimed (DeleteNode), the
    4 running members and their node untouched."""
    await cluster.install_check(fit(deadline=120))
    node, pods = await running_slice(cluster)
    await replace_with(cluster, 8)
    name = naming.request_name("new", cluster.check, 1)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    arrived = await cluster.add_nodes(2, gpu=1)

    async def recorded() -> bool:
        for n in arrived:
            notes = (await cluster.kube.get(NODE, n))["metadata"].get("annotations") or {}
            if notes.get(ARRIVED) != f"{cluster.ns}/{name}":
                return False
        return True

    await eventually(recorded, what="the 2 nodes recorded as arrived for the slice's request")
    await scale_in_place(cluster, "new", 4)

    check = await cluster.wait_check("new", "Ready")
    assert f"adds 0 members to {cluster.ns}/old running 4" in check["message"]
    await cluster.wait_request_gone(name)

    async def reclaimed() -> bool:
        names = {n["metadata"]["name"] for n in await cluster.nodes()}
        return not names & set(arrived)

    await eventually(reclaimed, timeout=30, what="the 2 arrived nodes reclaimed")
    await untouched(cluster, node, pods)


async def test_a_job_deleted_while_its_slice_is_provisioned_leaves_nothing_held(
    cluster: Cluster, controller: RunningController
) -> None:
    """The slice's request Provisioned, a node come for it (recorded for it, held as the
    Job's pods tolerate) and another still bringing a member of the Job's own (bound to it);
    then the Job is deleted, its Workloads with it: the request is withdrawn, the empty node
    reclaimed, the one a pod runs on kept (nothing running touched) and its hold lifted."""
    first, node, pods, name = await slice_of_four_running(cluster)
    await cluster.wait_request(name)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    empty, busy = await cluster.add_nodes(2, gpu=2)

    async def recorded() -> bool:
        for n in (empty, busy):
            got = await cluster.kube.get(NODE, n)
            if (got["metadata"].get("annotations") or {}).get(ARRIVED) != f"{cluster.ns}/{name}":
                return False
            if not [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]:
                return False
        return True

    await eventually(recorded, what="both nodes recorded for the slice's request and held")
    await cluster.create_pod("job-4", node_name=busy, consume=first)  # a member got there
    for wl in ("new", "old"):  # the Job deleted: its Workloads go with it
        await cluster.kube.delete(WORKLOAD, wl, cluster.ns)
    await cluster.wait_request_gone(name)

    async def settled() -> bool:
        names = {n["metadata"]["name"] for n in await cluster.nodes()}
        if empty in names or busy not in names:
            return False
        got = await cluster.kube.get(NODE, busy)
        return not [t for t in got["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]

    await eventually(settled, timeout=30, what="the empty node reclaimed, the busy one opened")
    assert (await cluster.kube.get(POD, "job-4", cluster.ns))["spec"]["nodeName"] == busy
    await untouched(cluster, node, pods)


async def test_a_ready_slices_request_deleted_by_hand_has_the_hold_it_left_lifted(
    cluster: Cluster, controller: RunningController
) -> None:
    """The slice turns Ready, the node that came for its 4 added members held as the Job's
    pods; 3 of them are bound, then its request is deleted outside gangcheck: no record is
    left whose end would lift that hold (the slice never starts), so it is lifted once the
    API server confirms the request gone, a HoldLifted Warning Event on the slice naming the
    node; nothing is asked again, the check stays Ready, the running members untouched."""
    first, node, pods, name = await slice_of_four_running(cluster)
    await cluster.wait_request(name)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (added,) = await cluster.add_nodes(1, gpu=4)
    await cluster.wait_check("new", "Ready")
    for i in range(4, 7):  # 3 of the 4 added bound: the slice has not started
        await cluster.create_pod(f"job-{i}", node_name=added, consume=first)
    await _deleted_by_hand_lifts_the_hold(cluster, name, added)
    await untouched(cluster, node, pods)


async def test_a_slice_ready_after_an_eviction_whose_request_is_deleted_by_hand_lifts_its_hold(
    cluster: Cluster, controller: RunningController
) -> None:
    """The slice is evicted (Kueue stops the Job: its 4 running members deleted) and
    admitted again, asks for the whole 8 and turns Ready on the node that came, held as the
    Job's pods; its podSetUpdates keep the Job's own consume annotation, naming no request of
    the slice. 3 members bound, its request deleted outside gangcheck: no record names the
    request any more but the node's, so the hold is lifted once the API server confirms it
    gone, a HoldLifted Warning Event on the slice naming the node and the request; nothing is
    asked again, the check stays Ready, the node is not reclaimed."""
    first, _, pods, name = await slice_of_four_running(cluster)
    await cluster.wait_request(name)
    await cluster.set_workload_condition("new", "Evicted")
    await cluster.wait_request_gone(name)
    for pod in pods:  # Kueue stopped the Job
        await cluster.kube.delete(POD, pod, cluster.ns)
    await cluster.set_workload_condition("new", "Evicted", "False")

    async def asked_again() -> Any:
        req = await cluster.request(name)
        return req if req is not None and not req["metadata"].get("deletionTimestamp") else None

    again = await eventually(asked_again, what="the slice asked again")
    assert [p["count"] for p in again["spec"]["podSets"]] == [8]
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    (added,) = await cluster.add_nodes(1, gpu=8)
    check = await cluster.wait_check("new", "Ready")
    consumed = [(u.get("annotations") or {}).get(CONSUME) for u in check.get("podSetUpdates") or []]
    assert name not in consumed, check
    for i in range(3):  # 3 of the 8 bound: the slice has not started
        await cluster.create_pod(f"again-{i}", node_name=added, consume=first)
    await _deleted_by_hand_lifts_the_hold(cluster, name, added)


async def _deleted_by_hand_lifts_the_hold(cluster: Cluster, name: str, added: str) -> None:
    """The Ready slice's request `name` deleted outside gangcheck: the hold on `added`, the
    node that came for it, is lifted, said in a HoldLifted Warning naming both; the check
    stays Ready and the node is not reclaimed."""
    await cluster.kube.delete(PROVISIONING_REQUEST, name, cluster.ns)
    await cluster.wait_request_gone(name)

    async def opened() -> bool:
        n = await cluster.kube.get(NODE, added)
        return not [t for t in n["spec"].get("taints") or [] if t["key"] == HOLD_TAINT]

    await eventually(opened, what="the hold of the deleted request lifted")
    (event,) = await cluster.wait_events("HoldLifted", about="new")
    assert event["type"] == "Warning"
    assert added in event["message"] and name in event["message"], event["message"]
    assert (await cluster.check_state("new"))["state"] == "Ready"
    assert await cluster.request(name) is None
    got = await cluster.kube.get(NODE, added)
    assert got["metadata"]["annotations"].get(ARRIVED) == f"{cluster.ns}/{name}"  # not reclaimed
