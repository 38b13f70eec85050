"""Held progress messages: which check writes may wait, and for how long (a table), and the
Workload reconciler writing a gang that turns Ready quickly once, not twice."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gangcheck.kube.resources import WORKLOAD
from gangcheck.model.objects import CheckState
from gangcheck.reconcile.progress import PROGRESS_DELAY_SECONDS, HeldMessages, progress_only
from tests.unit.test_workload_reconciler import KEY, World, gang

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
BEFORE = CheckState("gpu", "Pending", "", "2026-12-01T08:59:00Z")
WORKLOAD_PATCH = ("Workload", "patch")


@pytest.mark.parametrize(
    ("after", "held"),
    [
        (replace(BEFORE, message="provisioning request r created for 4 pods"), True),
        (replace(BEFORE, state="Ready", last_transition_time="2026-12-01T09:00:00Z"), False),
        (replace(BEFORE, state="Ready", message="capacity provisioned"), False),
        (replace(BEFORE, message="m", pod_set_updates=({"name": "workers"},)), False),
        (replace(BEFORE, message="m", retry_count=1), False),
        (replace(BEFORE, message="m", requeue_after_seconds=10), False),
        (BEFORE, False),  # nothing changes: no write is asked for, none is held
    ],
    ids=["message", "state", "state-and-message", "pod-set-updates", "retry", "requeue", "same"],
)
def test_only_a_write_that_changes_the_message_alone_is_progress(
    after: CheckState, held: bool
) -> None:
    assert progress_only(BEFORE, after) is held
    assert progress_only(None, after) is False


def test_a_held_message_falls_due_once_after_the_delay_from_when_it_was_first_held() -> None:
    held = HeldMessages()
    first = replace(BEFORE, message="created")
    assert (
        held.hold("ns/wl", "gpu", message_only=progress_only(BEFORE, first), now=T0)
        == PROGRESS_DELAY_SECONDS
    )
    later = T0 + timedelta(seconds=1)
    assert held.hold("ns/wl", "gpu", message_only=True, now=later) == PROGRESS_DELAY_SECONDS - 1
    assert held.hold("ns/wl", "gpu", message_only=True, now=T0 + timedelta(seconds=3)) is None
    assert len(held) == 0  # due: written now, nothing held any more
    # the next message alone waits its own delay
    assert held.hold("ns/wl", "gpu", message_only=True, now=T0 + timedelta(seconds=4)) == 3.0


def test_a_state_change_is_never_held_and_drops_what_was_held() -> None:
    held = HeldMessages()
    held.hold("ns/wl", "gpu", message_only=True, now=T0)
    held.hold("ns/wl", "other", message_only=True, now=T0)
    ready = replace(BEFORE, state="Ready", message="fits")
    assert held.hold("ns/wl", "gpu", message_only=progress_only(BEFORE, ready), now=T0) is None
    assert len(held) == 1
    held.forget("ns/wl")
    assert len(held) == 0


async def test_a_gang_ready_before_its_held_message_was_written_has_its_check_written_once() -> (
    None
):
    world = World(gang())
    await world.settle()
    assert len(world.kube.writes_of(*WORKLOAD_PATCH)) == 0  # "request created" is held
    assert world.check()["message"] == ""
    world.provision("n1", "n2")
    await world.settle()
    (write,) = world.kube.writes_of(*WORKLOAD_PATCH)
    assert write.subresource == "status"
    assert world.check()["state"] == "Ready"
    assert "fits" in world.check()["message"]
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert len(world.kube.writes_of(*WORKLOAD_PATCH)) == 1  # nothing held was written late


async def test_a_held_message_is_written_when_due_with_what_the_check_says_then() -> None:
    world = World(gang())
    result = await world.reconcile()
    assert result.requeue_after is not None
    assert 0 < result.requeue_after <= PROGRESS_DELAY_SECONDS
    assert world.kube.writes_of(*WORKLOAD_PATCH) == []
    events = [w.body["reason"] for w in world.kube.writes_of("Event", "create")]
    assert "ProvisioningRequestCreated" in events  # the request was made: said at once
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert len(world.kube.writes_of(*WORKLOAD_PATCH)) == 1
    check = world.check()
    assert check["state"] == "Pending"
    assert "provisioning request" in check["message"]
    assert len(world.reconciler.held_messages) == 0  # nothing left held


async def test_a_deleted_workload_leaves_nothing_held() -> None:
    world = World(gang())
    await world.reconcile()
    assert len(world.reconciler.held_messages) == 1
    world.kube.remove(world.caches.workloads.resource, "wl", "default")
    world.kube.sync(world.caches)
    await world.reconciler.reconcile(KEY)
    assert len(world.reconciler.held_messages) == 0


async def test_an_evicted_gangs_withdrawal_is_said_on_its_check_at_once() -> None:
    """Evicted with one node arrived: the pass that withdraws the request writes the check's
    message saying so at once. Held, it was never written: the next pass finds the request
    gone and has nothing to say, so the check kept "capacity requested, not yet usable"."""
    world = World(gang())
    await world.settle()
    world.provision("n1")  # room for 2 of the 4 workers
    await world.settle()
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert "capacity requested, not yet usable" in world.check()["message"]
    wl = world.kube.stored(WORKLOAD, "wl", "default")
    assert wl is not None
    wl["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted",
         "lastTransitionTime": "2026-11-30T10:03:00Z"}
    )  # fmt: skip
    world.kube.add(wl)
    await world.reconcile()
    said = world.check()
    assert said["state"] == "Pending"
    assert said["message"].startswith("Workload evicted: provisioning request")
    assert "the 1 node(s) that arrived for it are reclaimed safely" in said["message"]
    await world.settle()
    world.now += timedelta(seconds=PROGRESS_DELAY_SECONDS)
    await world.settle()
    assert world.check()["message"] == said["message"]
    assert world.requests() == []
