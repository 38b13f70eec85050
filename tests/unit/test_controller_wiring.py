"""The controller hands its metrics to everything that records them, at construction."""

from __future__ import annotations

from datetime import UTC, datetime

from gangcheck.app import Controller
from gangcheck.logic.attempt.hold import hold_taint
from gangcheck.model.names import ARRIVED_FOR, RECLAIM_WHEN_IDLE
from gangcheck.telemetry import Metrics
from tests.builders import WorkloadBuilder
from tests.fakes.kube import FakeKube


def test_every_recorder_of_attempt_metrics_gets_the_controllers_metrics() -> None:
    metrics = Metrics()
    controller = Controller(FakeKube(), metrics=metrics)
    assert controller.group_reconciler is not None
    recorders = (
        controller.workload_reconciler,
        controller.workload_reconciler._applier,
        controller.group_reconciler,
        controller.node_reconciler,
    )
    assert all(r.metrics is metrics for r in recorders)


async def test_a_workload_key_is_reconciled_through_the_controller_on_the_fake() -> None:
    kube = FakeKube()
    kube.add(WorkloadBuilder().pod_set("workers", 1).build())
    controller = Controller(kube)
    kube.sync(controller.caches)
    controller.enqueue_everything()
    assert len(controller.queue) == 1
    key = await controller.queue.get()
    assert key == "wl:default/wl"
    await controller.reconcile(key)
    assert kube.writes == []  # no check of ours on it: nothing to do
    assert "gangcheck_reconcile_duration_seconds" in controller.metrics.render()


def test_the_progress_delay_reaches_both_reconcilers() -> None:
    """A message-only write is held for the controller's progressDelaySeconds, by the Workload
    and the PodGroup reconciler alike."""
    controller = Controller(FakeKube(), progress_delay_seconds=0.5)
    assert controller.group_reconciler is not None
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for reconciler in (controller.workload_reconciler, controller.group_reconciler):
        assert reconciler.held_messages.hold("ns/wl", "", message_only=True, now=now) == 0.5


def test_a_node_change_reaches_the_karpenter_provisioner() -> None:
    """The nodes informer tells the Karpenter provisioner of a reclaim's mark coming off a
    node recorded and held (`kept_since`): a pass lifts the hold then, not at the resync."""
    controller = Controller(FakeKube())
    notes = {ARRIVED_FOR: "ns/a", RECLAIM_WHEN_IDLE: "{}"}
    held = {"spec": {"taints": [hold_taint("ns/a")]}}
    marked = {"metadata": {"name": "n0", "annotations": notes}, **held}
    kept = {"metadata": {"name": "n0", "annotations": {ARRIVED_FOR: "ns/a"}}, **held}
    assert not controller.karpenter._woken.is_set()
    controller.caches.nodes._notify(marked, kept)
    assert controller.karpenter._woken.is_set()
