"""The admission check against a real kube-apiserver: the test plays Kueue core and the
autoscaler by writing Workload and ProvisioningRequest status, as Kueue's own suite does."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from datetime import datetime
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import ATOMIC_CONFIG, POD_TEMPLATE, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.logic.attempt import deletion, naming
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import (
    TRUST,
    Cluster,
    CrashingController,
    RunningController,
    eventually,
    never,
    req_name,
)

pytestmark = pytest.mark.integration

CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS = "autoscaling.x-k8s.io/provisioning-class-name"


def gang(name: str = "wl", workers: int = 4) -> WorkloadBuilder:
    """A driver (2 CPUs) and `workers` one-GPU workers, quota reserved, the check
    Pending."""
    return (
        WorkloadBuilder(name)
        .pod_set("driver", 1, pod_template(cpu="2"))
        .pod_set("workers", workers, pod_template(gpu=1))
        .reserve_quota()
        .check()
    )


async def test_happy_path_one_request_then_ready(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    req = await cluster.wait_request(name)
    assert [(p["podTemplateRef"]["name"], p["count"]) for p in req["spec"]["podSets"]] == [
        (naming.template_name(name, "driver"), 1),
        (naming.template_name(name, "workers"), 4),
    ]
    assert (
        req["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    )
    wl = await cluster.workload("wl")
    assert req["metadata"]["annotations"]["gangcheck.io/workload-uid"] == wl["metadata"]["uid"]
    assigned = wl["status"]["admission"]["podSetAssignments"]
    flavors = sorted({f for a in assigned for f in a["flavors"].values()})
    # the flavors it asked under, on the request (its source's refusal is published for them)
    assert req["metadata"]["annotations"]["gangcheck.io/resource-flavors"] == ",".join(flavors)
    assert "ownerReferences" not in req["metadata"]
    # stamped with when gangcheck made it, to the microsecond, within its creation second
    asked_at = req["metadata"]["annotations"]["gangcheck.io/asked-at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", asked_at), asked_at
    created = datetime.fromisoformat(req["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    asked = datetime.fromisoformat(asked_at.replace("Z", "+00:00"))
    assert abs((asked - created).total_seconds()) < 5  # one machine's clock, the server's

    async def both_templates() -> list[Any] | None:
        found = await cluster.templates()
        return found if len(found) == 2 else None

    made = await eventually(both_templates, what="the request's two templates")
    assert [t["metadata"].get("ownerReferences") for t in made] == [None] * 2
    named = [t["metadata"]["annotations"]["gangcheck.io/workload-uid"] for t in made]
    assert named == [wl["metadata"]["uid"]] * 2  # the orphan sweep deletes them by it
    template = next(
        t for t in await cluster.templates() if t["metadata"]["name"].endswith("workers")
    )
    assert template["template"]["spec"]["nodeSelector"] == cluster.pool

    await cluster.set_request_conditions(name, {"Accepted": "", "Provisioned": "resize ok"})
    check = await cluster.wait_check("wl", "Ready")
    updates = {u["name"]: u["annotations"] for u in check["podSetUpdates"]}
    assert updates == {
        "driver": {CONSUME: name, CLASS: req["spec"]["provisioningClassName"]},
        "workers": {CONSUME: name, CLASS: req["spec"]["provisioningClassName"]},
    }
    assert len(await cluster.requests()) == 1
    assert await cluster.wait_events("ProvisioningRequestCreated")
    assert await cluster.wait_events("AdmissionCheckUpdated")


async def test_failed_retries_with_backoff_then_rejects(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(
        {**TRUST, "retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 30}}
    )
    builder = gang()
    await cluster.submit(builder)
    await cluster.set_request_conditions(req_name(cluster), {"Failed": "CapacityIsNotFound"})
    check = await cluster.wait_check("wl", "Retry")
    assert check["requeueAfterSeconds"] == 30
    assert check["message"] == "Retrying after failure: CapacityIsNotFound"

    await cluster.evict_and_requeue("wl")
    await cluster.wait_request_gone(req_name(cluster))
    await cluster.reserve_again("wl", builder)
    second = await cluster.wait_request(req_name(cluster, attempt=2))
    assert second["metadata"]["annotations"]["gangcheck.io/attempt"] == "2"

    await cluster.set_request_conditions(req_name(cluster, attempt=2), {"Failed": "still nothing"})
    check = await cluster.wait_check("wl", "Rejected")
    assert check["message"] == "still nothing"
    assert [r["metadata"]["name"] for r in await cluster.requests()] == [
        req_name(cluster, attempt=2)
    ]


async def test_booking_expired_before_admission_retries(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    await cluster.set_request_conditions(req_name(cluster), {"BookingExpired": "booking over"})
    check = await cluster.wait_check("wl", "Retry")
    assert check["message"] == "Retrying after booking expired: booking over"


async def test_booking_expired_after_admission_changes_nothing(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    await cluster.set_request_conditions(req_name(cluster), {"Provisioned": ""})
    await cluster.wait_check("wl", "Ready")
    await cluster.set_workload_condition("wl", "Admitted")
    await cluster.set_request_conditions(req_name(cluster), {"BookingExpired": "over"})

    async def not_ready() -> str | None:
        state = (await cluster.check_state("wl"))["state"]
        return None if state == "Ready" else state

    await never(not_ready, seconds=1.5, what="check left Ready after booking expired")


async def test_capacity_revoked_rejects(cluster: Cluster, controller: RunningController) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    await cluster.set_request_conditions(req_name(cluster), {"CapacityRevoked": "revoked"})
    check = await cluster.wait_check("wl", "Rejected")
    assert check["message"] == "revoked"


async def test_existing_pod_template_is_reused(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    name = req_name(cluster)
    wl_name = await cluster.submit(gang(), reserve=False)
    wl = await cluster.workload(wl_name)
    owner = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "name": "wl",
        "uid": wl["metadata"]["uid"],
        "controller": True,
    }
    await cluster.kube.create(
        POD_TEMPLATE,
        {
            "metadata": {
                "name": naming.template_name(name, "workers"),
                "namespace": cluster.ns,
                "labels": {"app.kubernetes.io/managed-by": "gangcheck"},
                "annotations": {"gangcheck.io/workload": "wl", "gangcheck.io/check": cluster.check},
                "ownerReferences": [owner],
            },
            "template": pod_template(gpu=1),
        },
    )
    status = gang().build()["status"]
    for entry in status["admissionChecks"]:
        entry["name"] = cluster.check
    cluster.use_my_flavor(status)
    wl["status"] = status
    await cluster.kube.replace(WORKLOAD, wl, subresource="status")
    await cluster.wait_request(name)
    templates = await eventually(lambda: _templates_if(cluster, 2), what="both templates present")
    assert {t["metadata"]["name"] for t in templates} == {
        naming.template_name(name, "driver"),
        naming.template_name(name, "workers"),
    }


async def _templates_if(cluster: Cluster, count: int) -> list[Any] | None:
    templates = await cluster.templates()
    return templates if len(templates) == count else None


async def test_config_missing_then_invalid_then_fixed(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(None)  # the check names a config that does not exist

    async def active() -> Any:
        return await cluster.active_condition()

    cond = await eventually(active, what="Active condition")
    assert (cond["status"], cond["reason"]) == ("False", "BadParametersRef")
    assert cluster.config in cond["message"]
    await cluster.submit(gang())
    check = await eventually(
        lambda: _check_with_message(cluster, "not active"), what="inactive check message"
    )
    assert "not found" in check["message"]
    assert await cluster.requests() == []

    await cluster.kube.create(
        ATOMIC_CONFIG,
        {
            "metadata": {"name": cluster.config},
            "spec": {"provisioningClassName": "mine.example.com"},
        },
    )
    cond = await eventually(
        lambda: _active_is(cluster, "False", "InvalidConfig"), what="invalid config"
    )
    assert "mine.example.com" in cond["message"]

    await cluster.set_config(
        {**TRUST, "provisioningClassName": "mine.example.com", "allowCustomProvisioningClass": True}
    )
    await eventually(lambda: _active_is(cluster, "True", "Active"), what="active again")
    req = await cluster.wait_request(req_name(cluster))
    assert req["spec"]["provisioningClassName"] == "mine.example.com"


async def _templates_of(cluster: Cluster, req: Any, count: int) -> list[Any] | None:
    wanted = {p["podTemplateRef"]["name"] for p in req["spec"]["podSets"]}
    found = [t for t in await cluster.templates() if t["metadata"]["name"] in wanted]
    return found if len(found) == count else None


async def _check_with_message(cluster: Cluster, text: str) -> Any:
    entry = await cluster.check_state("wl")
    return entry if text in entry["message"] else None


async def _active_is(cluster: Cluster, status: str, reason: str) -> Any:
    cond = await cluster.active_condition()
    return cond if cond and (cond["status"], cond["reason"]) == (status, reason) else None


async def test_config_changed_mid_flight_starts_a_new_attempt(
    cluster: Cluster, controller: RunningController
) -> None:
    """A class change before Provisioned ends the attempt (Retry); the next attempt, under
    a new name, uses the new config: never the same name with a new uid."""
    await cluster.install_check({**TRUST, "parameters": {"a": "1"}})
    builder = gang()
    await cluster.submit(builder)
    name = req_name(cluster)
    first = await cluster.wait_request(name)
    await cluster.set_request_conditions(name, {"Accepted": ""})
    await cluster.set_config(
        {
            **TRUST,
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "parameters": {"a": "2"},
        }
    )
    check = await cluster.wait_check("wl", "Retry")
    assert "Retrying after config change: class" in check["message"]
    assert await cluster.wait_events("ProvisioningRequestReplaced")
    kept = await cluster.request(name)
    assert kept is not None and kept["metadata"]["uid"] == first["metadata"]["uid"]

    await cluster.evict_and_requeue("wl")
    await cluster.wait_request_gone(name)
    await cluster.reserve_again("wl", builder)
    second = await cluster.wait_request(req_name(cluster, attempt=2))
    assert second["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
    assert second["spec"]["parameters"] == {"a": "2"}


async def test_no_pod_set_needs_provisioning(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check({**TRUST, "managedResources": ["example.com/fpga"]})
    await cluster.submit(gang())
    check = await cluster.wait_check("wl", "Ready")
    assert check["message"] == "the provisioning request is not needed"
    assert "podSetUpdates" not in check
    assert await cluster.requests() == []


async def test_merged_pod_sets_all_get_pod_set_updates(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check({**TRUST, "podSetMergePolicy": "IdenticalPodTemplates"})
    builder = WorkloadBuilder().pod_set("ranks-a", 2).pod_set("ranks-b", 3).reserve_quota().check()
    await cluster.submit(builder)
    name = req_name(cluster)
    req = await cluster.wait_request(name)
    assert [p["count"] for p in req["spec"]["podSets"]] == [5]
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    check = await cluster.wait_check("wl", "Ready")
    assert sorted(u["name"] for u in check["podSetUpdates"]) == ["ranks-a", "ranks-b"]
    assert all(u["annotations"][CONSUME] == name for u in check["podSetUpdates"])


async def test_workload_deleted_mid_flight_leaves_nothing(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    await cluster.wait_request(req_name(cluster))
    await cluster.delete_workload("wl")

    async def nothing_left() -> bool:
        return not await cluster.requests() and not await cluster.templates()

    await eventually(nothing_left, what="requests and templates removed")


@pytest.mark.parametrize("condition", ["Finished", "Evicted"])
async def test_finished_or_evicted_workload_loses_its_request(
    cluster: Cluster, controller: RunningController, condition: str
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    await cluster.wait_request(req_name(cluster))
    await cluster.set_workload_condition("wl", condition)

    async def nothing_left() -> bool:
        return not await cluster.requests() and not await cluster.templates()

    await eventually(nothing_left, what="requests and templates removed")
    assert (await cluster.check_state("wl"))["state"] == "Pending"


async def test_long_names_are_cut_and_a_bad_check_does_not_stop_others(
    cluster: Cluster, controller: RunningController
) -> None:
    """Workload names of 250 characters with a dot where Kueue's limiter (and gangcheck's,
    before) cut them, and where gangcheck cuts them now: each gets its request and templates
    (the API server refused `x.-hash` before), and an Event named after it."""
    await cluster.install_check(TRUST)
    for cut in (246, 241):
        long_name = "w" * cut + "." + "x" * (249 - cut)
        await cluster.submit(gang(long_name))
        name = req_name(cluster, long_name)
        assert len(name) <= 253
        req = await cluster.wait_request(name)
        await eventually(lambda r=req: _templates_of(cluster, r, 2), what=f"templates of {name}")
        assert await cluster.wait_events("ProvisioningRequestCreated", about=long_name)

    other = await Cluster.create(cluster.kube)
    await other.install_check(None)  # dangling reference: inactive, reported
    await other.submit(gang("broken"))
    await eventually(lambda: _active_is(other, "False", "BadParametersRef"), what="inactive check")
    await cluster.submit(gang("healthy"))
    await cluster.wait_request(req_name(cluster, "healthy"))


async def test_restart_between_any_two_writes(control_plane: Any, cluster: Cluster) -> None:
    """Kill the controller right after its n-th write, restart it: one request, state intact.
    n runs over the writes of a gang's first reconcile, learnt from a controller that does not
    crash (later writes, such as a held message, come at times no test should bet on)."""
    await cluster.install_check(TRUST)
    counting = CrashingController(str(control_plane.kubeconfig), after_writes=sys.maxsize)
    await counting.start()
    try:
        await cluster.submit(gang("wl0"))

        async def first_reconcile() -> list[str] | None:
            ns = f"/namespaces/{cluster.ns}/"
            writes = [w for w in counting.written if ns in w]
            for i, w in enumerate(writes):
                if w.startswith("PATCH") and w.endswith("/wl0/status"):
                    return writes[: i + 1]
            return None

        gang_writes = await eventually(first_reconcile, what="the first reconcile's writes")
        # wl0 made Ready, so that it writes nothing while the others crash.
        await cluster.set_request_conditions(req_name(cluster, "wl0"), {"Provisioned": ""})
        await cluster.wait_check("wl0", "Ready")
    finally:
        await counting.stop()
    # Templates first, then the request, then the check; no template handed to its request.
    assert [(w.split()[0], w.split("/")[-1]) for w in gang_writes] == [
        ("POST", "podtemplates"),
        ("POST", "podtemplates"),
        ("POST", "provisioningrequests"),
        ("PATCH", "status"),
    ]
    for n in range(1, len(gang_writes) + 1):
        workload = f"wl{n}"
        crashing = CrashingController(str(control_plane.kubeconfig), after_writes=n)
        await crashing.start()
        try:
            await cluster.submit(gang(workload))
            await eventually(crashing.crashed, timeout=20, what=f"crash after write {n}")
        finally:
            await crashing.stop()
        fresh = RunningController(str(control_plane.kubeconfig))
        await fresh.start()
        try:
            name = req_name(cluster, workload)
            await cluster.wait_request(name)
            await cluster.set_request_conditions(name, {"Provisioned": ""})
            await cluster.wait_check(workload, "Ready")
        finally:
            await fresh.stop()
        mine = [
            r
            for r in await cluster.requests()
            if r["metadata"]["annotations"]["gangcheck.io/workload"] == workload
        ]
        assert [r["metadata"]["name"] for r in mine] == [name], f"after write {n}"


async def test_watches_recover_after_apiserver_restart(
    control_plane: Any, cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await asyncio.to_thread(control_plane.restart_apiserver)
    async with await Kube.connect(str(control_plane.kubeconfig)) as kube:
        after = Cluster(kube, cluster.ns)
        after.check, after.config = cluster.check, cluster.config
        await after.submit(gang("after-restart"))
        req = await after.wait_request(req_name(after, "after-restart"), timeout=60)
        await after.set_request_conditions(req["metadata"]["name"], {"Provisioned": ""})
        await after.wait_check("after-restart", "Ready", timeout=30)
    # The restarted API server refuses writes until its RBAC informers have synced: those are
    # the restart's, not the shipped RBAC's (a refusal by a policy still fails the test).
    controller.forgive_rbac_refusals()


async def test_a_request_held_in_deletion_by_a_finalizer_is_said_not_polled_silently(
    cluster: Cluster, controller: RunningController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's request is deleted while another controller's finalizer holds it: the
    gang waits (its next ask is made under the same name). Past the grace the check message
    says so, naming the request, its finalizer and since when; one RequestStuckDeleting
    Warning; the finalizer is left alone. Once someone removes it, the ask is made again.
    Before, it was polled every second for ever with nothing said."""
    monkeypatch.setattr(deletion, "GRACE_SECONDS", 2.0)  # 30 s in production
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    first = await cluster.wait_request(name)
    keep = {"metadata": {"finalizers": ["example.com/keep"]}}
    await cluster.kube.merge_patch(PROVISIONING_REQUEST, name, keep, cluster.ns)
    try:
        await cluster.kube.delete(PROVISIONING_REQUEST, name, cluster.ns)
        held = await cluster.wait_request(name)
        since = held["metadata"]["deletionTimestamp"]
        said = (
            f"waiting for ProvisioningRequest {name} to be deleted: finalizers "
            f"[example.com/keep] remain since {since}"
        )

        async def saying() -> dict[str, Any] | None:
            check = await cluster.check_state("wl")
            return check if check.get("message") == said else None

        check = await eventually(saying, what="the check to say the request is held")
        assert check["state"] == "Pending"
        (event,) = await cluster.wait_events("RequestStuckDeleting")
        assert event["type"] == "Warning" and event["message"] == said

        async def said_again() -> object:
            events = await cluster.events("RequestStuckDeleting")
            return len(events) > 1 or any(e.get("count", 1) > 1 for e in events)

        await never(said_again, seconds=4, what="the Warning said again")
        still = await cluster.request(name)
        assert still is not None and still["metadata"]["finalizers"] == ["example.com/keep"]
        assert [r["metadata"]["name"] for r in await cluster.requests()] == [name]
    finally:
        gone = {"metadata": {"finalizers": None}}
        with contextlib.suppress(NotFoundError):
            await cluster.kube.merge_patch(PROVISIONING_REQUEST, name, gone, cluster.ns)

    async def asked_again() -> dict[str, Any] | None:
        req = await cluster.request(name)
        if req is None or req["metadata"].get("deletionTimestamp"):
            return None
        return req if req["metadata"]["uid"] != first["metadata"]["uid"] else None

    await eventually(asked_again, what="the ask made again once the request is gone")

    async def moved_on() -> dict[str, Any] | None:
        check = await cluster.check_state("wl")
        return None if "to be deleted" in check["message"] else check

    check = await eventually(moved_on, what="the check to follow the new ask")
    assert check["state"] == "Pending" and name in check["message"]
