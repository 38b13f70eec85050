"""Where the admission check follows Kueue's built-in provisioning check, or improves on it
on purpose, against a real kube-apiserver: the test plays Kueue core and the autoscaler by
writing Workload and ProvisioningRequest status, as Kueue's own integration suite does.

No kube-controller-manager runs in this bed, so no garbage collector: where a test needs
one, `collect_garbage` deletes, as the collector would, every PodTemplate none of whose
owners exists any more.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    POD_TEMPLATE,
    PROVISIONING_REQUEST,
    WORKLOAD,
)
from gangcheck.logic.attempt import naming
from tests.builders import CONTROLLER
from tests.integration.harness import TRUST, Cluster, RunningController, eventually, never, req_name
from tests.integration.test_admission_check import gang

pytestmark = pytest.mark.integration


async def collect_garbage(cluster: Cluster) -> list[str]:
    """As the garbage collector: delete the PodTemplates whose owners are all gone."""
    alive = {
        o["metadata"]["uid"]
        for res in (WORKLOAD, PROVISIONING_REQUEST)
        for o in (await cluster.kube.list_objects(res, cluster.ns)).get("items") or []
    }
    collected = []
    for t in await cluster.templates():
        owners = {r["uid"] for r in t["metadata"].get("ownerReferences") or []}
        if owners and not owners & alive:
            await cluster.kube.delete(POD_TEMPLATE, t["metadata"]["name"], cluster.ns)
            collected.append(t["metadata"]["name"])
    return collected


async def templates_of(cluster: Cluster, req: Any) -> list[Any] | None:
    """The request's PodTemplates, once every one it points at exists."""
    wanted = {p["podTemplateRef"]["name"] for p in req["spec"]["podSets"]}
    found = [t for t in await cluster.templates() if t["metadata"]["name"] in wanted]
    return found if len(found) == len(wanted) else None


async def test_a_request_deleted_by_hand_costs_no_attempt(
    cluster: Cluster, controller: RunningController
) -> None:
    """The request is deleted by hand; its templates are owned by nothing (they name the
    Workload's uid), so the garbage collector keeps them and the recreated request of the
    same attempt points at templates that exist, even with backoffLimitCount 0. No write ever
    hands a template to its request (Kueue's does, a patch per template)."""
    await cluster.install_check({**TRUST, "retryStrategy": {"backoffLimitCount": 0}})
    await cluster.submit(gang())
    name = req_name(cluster)
    first = await cluster.wait_request(name)
    uid = first["metadata"]["uid"]
    await eventually(lambda: templates_of(cluster, first), what="templates present")
    await cluster.kube.delete(PROVISIONING_REQUEST, name, cluster.ns)
    assert await collect_garbage(cluster) == []

    async def recreated() -> Any:
        req = await cluster.request(name)
        return req if req and req["metadata"]["uid"] != uid else None

    second = await eventually(recreated, what="request recreated")
    assert second["metadata"]["annotations"]["gangcheck.io/attempt"] == "1"
    assert await eventually(lambda: templates_of(cluster, second), what="templates present")
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    check = await cluster.wait_check("wl", "Ready")
    assert not check.get("retryCount")
    templates = await templates_of(cluster, second) or []
    wl = await cluster.workload("wl")
    assert [t["metadata"].get("ownerReferences") for t in templates] == [None] * 2
    named = [t["metadata"]["annotations"]["gangcheck.io/workload-uid"] for t in templates]
    assert named == [wl["metadata"]["uid"]] * 2


async def test_a_template_lost_while_its_request_is_in_flight_is_recreated(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    req = await cluster.wait_request(req_name(cluster))
    lost = naming.template_name(req["metadata"]["name"], "workers")
    await eventually(lambda: templates_of(cluster, req), what="templates present")
    await cluster.kube.delete(POD_TEMPLATE, lost, cluster.ns)

    async def back() -> Any:
        found = await templates_of(cluster, req) or []
        return next((t for t in found if t["metadata"]["name"] == lost), None)

    template = await eventually(back, what=f"{lost} recreated")
    wl = await cluster.workload("wl")
    assert "ownerReferences" not in template["metadata"]
    assert template["metadata"]["annotations"]["gangcheck.io/workload-uid"] == wl["metadata"]["uid"]


async def test_ready_check_retries_when_the_booking_expires_before_admission(
    cluster: Cluster, controller: RunningController
) -> None:
    """Another check keeps Kueue from admitting; meanwhile the booking expires: as Kueue,
    the Ready check goes to Retry instead of letting the gang in onto capacity now gone."""
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    await cluster.wait_check("wl", "Ready")
    await cluster.set_request_conditions(name, {"BookingExpired": "booking over"})
    check = await cluster.wait_check("wl", "Retry")
    assert check["message"] == "Retrying after booking expired: booking over"


async def test_an_inactive_config_keeps_the_request_in_flight(
    cluster: Cluster, controller: RunningController
) -> None:
    """Kueue deletes the request when the check's config goes; gangcheck keeps the attempt in
    flight under the config it recorded (docs/kueue-differences.md, 'Config deleted or made
    invalid while an attempt is in flight')."""
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    await cluster.wait_request(name)
    await cluster.kube.delete(ATOMIC_CONFIG, cluster.config)

    async def says_inactive() -> Any:
        entry = await cluster.check_state("wl")
        return entry if "the check is not active" in entry["message"] else None

    check = await eventually(says_inactive, what="the check saying it is not active")
    assert check["state"] == "Pending"
    assert "the attempt in flight goes on under the config it was made with" in check["message"]
    assert [r["metadata"]["name"] for r in await cluster.requests()] == [name]
    assert not await cluster.events("ProvisioningRequestDeleted")


async def test_a_request_no_longer_needed_is_deleted(
    cluster: Cluster, controller: RunningController
) -> None:
    """managedResources edited to exclude every pod set: Ready, and the request deleted."""
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    await cluster.wait_request(name)
    await cluster.set_config({**TRUST, "managedResources": ["example.com/fpga"]})
    await cluster.wait_request_gone(name)
    check = await cluster.wait_check("wl", "Ready")
    assert check["message"] == "the provisioning request is not needed"


async def test_a_check_removed_from_the_workload_loses_its_request(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    await cluster.wait_request(name)

    def drop_check(wl: Any) -> None:
        wl["status"]["admissionChecks"] = [
            c for c in wl["status"]["admissionChecks"] if c["name"] != cluster.check
        ]

    await cluster.update_status("wl", drop_check)
    await cluster.wait_request_gone(name)


async def test_rejected_without_a_message_says_why(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check({**TRUST, "retryStrategy": {"backoffLimitCount": 0}})
    await cluster.submit(gang())
    await cluster.set_request_conditions(req_name(cluster), {"Failed": ""})
    check = await cluster.wait_check("wl", "Rejected")
    assert check["message"] == (
        "provisioning ended by failure, with no message from the autoscaler, on attempt 1; "
        "backoffLimitCount 0 allows no more retries"
    )


async def test_quota_lost_outside_eviction_keeps_the_request(
    cluster: Cluster, controller: RunningController
) -> None:
    """As Kueue: only finishing or eviction ends the request. Quota released and reserved
    again without an eviction finds the same request (same uid), which then makes it Ready."""
    await cluster.install_check(TRUST)
    builder = gang()
    await cluster.submit(builder)
    name = req_name(cluster)
    first = await cluster.wait_request(name)
    await cluster.set_workload_condition("wl", "QuotaReserved", "False")

    async def gone() -> bool:
        return await cluster.request(name) is None

    await never(gone, seconds=1.5, what="request deleted when the quota was lost")
    await cluster.reserve_again("wl", builder)
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    await cluster.wait_check("wl", "Ready")
    req = await cluster.request(name)
    assert req is not None and req["metadata"]["uid"] == first["metadata"]["uid"]


async def test_a_name_taken_by_someone_else_is_reported_not_called_created(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    name = req_name(cluster)
    foreign = await cluster.kube.create(
        PROVISIONING_REQUEST,
        {
            "metadata": {"name": name, "namespace": cluster.ns},
            "spec": {
                "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                "podSets": [{"podTemplateRef": {"name": "theirs"}, "count": 1}],
            },
        },
    )
    await cluster.submit(gang())

    async def reported() -> Any:
        entry = await cluster.check_state("wl")
        return entry if "not made by gangcheck" in entry["message"] else None

    check = await eventually(reported, what="collision reported on the check")
    assert check["state"] == "Pending"
    assert "created" not in check["message"].split("Error creating")[-1]
    assert await cluster.wait_events("FailedCreate")
    still = await cluster.request(name)
    assert still is not None and still["metadata"]["uid"] == foreign["metadata"]["uid"]


async def test_a_create_refused_on_every_retry_is_one_event_counted_not_one_per_retry(
    cluster: Cluster, controller: RunningController, caplog: pytest.LogCaptureFixture
) -> None:
    """The name taken by someone else stays taken: every retry of the Workload (0.5 s, 1 s,
    2 s ... backoff) is refused the same way. Before, each made a FailedCreate Event of its
    own (with 2,000 gangs stuck so, an Event storm); now the first is created and the
    retries are counted into the next one said after events.REPEAT_SECONDS."""
    caplog.set_level(logging.DEBUG, logger="gangcheck.reconcile.events")
    await cluster.install_check(TRUST)
    await cluster.kube.create(
        PROVISIONING_REQUEST,
        {
            "metadata": {"name": req_name(cluster), "namespace": cluster.ns},
            "spec": {
                "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                "podSets": [{"podTemplateRef": {"name": "theirs"}, "count": 1}],
            },
        },
    )
    await cluster.submit(gang())

    async def said() -> int:  # how often the recorder was told FailedCreate about this Workload
        return max(
            (
                getattr(r, "count", 0)
                for r in caplog.records
                if getattr(r, "reason", "") == "FailedCreate"
                and getattr(r, "object", "").endswith(f"{cluster.ns}/wl")
            ),
            default=0,
        )

    async def retried() -> bool:
        return await said() >= 4

    await eventually(retried, what="four refused creates told as FailedCreate")
    events = await cluster.wait_events("FailedCreate", about="wl")
    assert [e["count"] for e in events] == [1]
    assert "\n" not in events[0]["message"]


async def test_two_provisioning_checks_on_one_workload_are_reported_before_any_request(
    cluster: Cluster, controller: RunningController
) -> None:
    """Two gangcheck checks on one Workload: both say so, no request is made, the Workload
    keeps its quota and stays neither Ready nor Rejected (Kueue would finish it)."""
    await cluster.install_check(TRUST)
    second = Cluster(cluster.kube, cluster.ns)
    await cluster.kube.create(ATOMIC_CONFIG, {"metadata": {"name": second.config}, "spec": TRUST})
    await cluster.kube.create(
        ADMISSION_CHECK,
        {
            "metadata": {"name": second.check},
            "spec": {
                "controllerName": CONTROLLER,
                "parameters": {
                    "apiGroup": "gangcheck.io",
                    "kind": "AtomicProvisioningConfig",
                    "name": second.config,
                },
            },
        },
    )
    await cluster.submit(gang().check(second.check))

    async def both_report() -> bool:
        wl = await cluster.workload("wl")
        entries = wl["status"]["admissionChecks"]
        return len(entries) == 2 and all(
            "a pod can consume only one ProvisioningRequest" in e["message"] for e in entries
        )

    await eventually(both_report, what="both checks report the conflict")
    assert await cluster.requests() == []
    assert await cluster.wait_events("ConflictingAdmissionChecks")
    states = {e["state"] for e in (await cluster.workload("wl"))["status"]["admissionChecks"]}
    assert states == {"Pending"}


async def test_an_inconsistent_admission_is_reported(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang(), reserve=False)
    status = gang().build()["status"]
    status["admissionChecks"][0]["name"] = cluster.check
    cluster.use_my_flavor(status)
    for assignment in status["admission"]["podSetAssignments"]:
        if assignment["name"] == "workers":  # the API requires as many assignments as pod sets
            assignment["name"] = "workerz"

    def reserve(wl: Any) -> None:
        wl["status"] = status

    await cluster.update_status("wl", reserve)

    async def reported() -> Any:
        entry = await cluster.check_state("wl")
        return entry if "inconsistent" in entry["message"] else None

    check = await eventually(reported, what="inconsistent admission reported")
    assert "no podSetAssignment for pod set workers" in check["message"]
    assert await cluster.requests() == []


async def test_capacity_revoked_does_not_reject_a_deactivated_workload(
    cluster: Cluster, controller: RunningController
) -> None:
    """As Kueue: CapacityRevoked rejects only an active Workload. The controller is stopped
    while the user deactivates the Workload and the capacity is revoked, so it sees both
    at once when it starts again; it says so and leaves the eviction to Kueue."""
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    name = req_name(cluster)
    await cluster.wait_request(name)
    await controller.stop()
    await cluster.kube.merge_patch(WORKLOAD, "wl", {"spec": {"active": False}}, cluster.ns)
    await cluster.set_request_conditions(name, {"CapacityRevoked": "revoked"})
    await controller.start()

    async def said() -> Any:
        entry = await cluster.check_state("wl")
        return entry if "deactivated" in entry["message"] else None

    check = await eventually(said, what="revocation noted on the check")
    assert check["state"] == "Pending"
    assert check["message"] == (
        "revoked; the Workload is deactivated, so the check is not rejected"
    )


async def test_a_deadline_change_applies_to_the_attempt_in_flight(
    cluster: Cluster, controller: RunningController
) -> None:
    """NodesFit: the request was made under a 420 s deadline; the config is changed to 1 s,
    the attempt's deadline moves to its creation + 1 s, so it rolls back now (no node came)."""
    await cluster.install_check({})
    await cluster.submit(gang())
    name = req_name(cluster)
    await cluster.wait_request(name)
    await cluster.set_request_conditions(name, {"Accepted": ""})
    await cluster.set_config({"fulfillment": {"deadlineSeconds": 1}})
    check = await cluster.wait_check("wl", "Retry", timeout=30)
    assert f"rolled back {name} (Deadline: the gang did not fit within 1s" in check["message"]
    assert [e["reason"] for e in await cluster.wait_events("RolledBack")] == ["RolledBack"]


async def test_a_class_change_in_flight_rolls_back_and_retries_under_a_new_name(
    cluster: Cluster, controller: RunningController
) -> None:
    """NodesFit: a class change before Provisioned rolls the attempt back (nothing arrived),
    then Retry; the next attempt (a new name) is made with the new class."""
    await cluster.install_check({})
    builder = gang()
    await cluster.submit(builder)
    name = req_name(cluster)
    await cluster.wait_request(name)
    await cluster.set_request_conditions(name, {"Accepted": ""})
    await cluster.set_config({"provisioningClassName": "check-capacity.autoscaling.x-k8s.io"})
    check = await cluster.wait_check("wl", "Retry")
    assert "Retrying after config change: rolled back" in check["message"]
    assert "ConfigChanged: class" in check["message"]
    await cluster.evict_and_requeue("wl")
    await cluster.reserve_again("wl", builder)
    second = await cluster.wait_request(req_name(cluster, attempt=2))
    assert second["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
