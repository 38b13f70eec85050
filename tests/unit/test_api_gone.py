"""The gangs' API removed (Kueue's CRDs, a PodGroup CRD) while gangcheck's requests for them
are there: nothing is withdrawn or reclaimed (no cache can read the gangs), and that is said,
at ERROR and as a Warning Event on each such request, again while it lasts."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from gangcheck.app import (
    API_GONE_REPEAT_SECONDS,
    API_NOT_SERVED,
    GONE_KEY,
    WORKLOADS_GONE,
    Controller,
    requests_of_api,
)
from gangcheck.kube.discovery import ServedPodGroups
from gangcheck.kube.resources import (
    PLUGINS_POD_GROUP,
    PROVISIONING_REQUEST,
    UPSTREAM_POD_GROUP_V1BETA1,
    WORKLOAD,
    Resource,
)
from gangcheck.model.names import (
    GROUP_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WORKLOAD_ANNOTATION,
)
from gangcheck.model.objects import Obj
from tests.fakes.kube import FakeKube, api_error
from tests.waiting import until


def _request(name: str, **annotations: str) -> Obj:
    return {
        "apiVersion": PROVISIONING_REQUEST.api_version,
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": annotations,
        },
        "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io", "podSets": []},
    }


@pytest.mark.parametrize(
    ("gone", "expected"),
    [
        (WORKLOADS_GONE, ["wl-a"]),
        ("pg", ["pg-b"]),
        ("coscheduling", ["co-c"]),
    ],
)
def test_the_requests_of_the_api_gone(gone: str, expected: list[str]) -> None:
    requests = [
        _request("wl-a", **{WORKLOAD_ANNOTATION: "a"}),
        _request("pg-b", **{GROUP_ANNOTATION: "pg/b"}),
        _request("co-c", **{GROUP_ANNOTATION: "coscheduling/c"}),
        _request("none"),
    ]
    assert [r["metadata"]["name"] for r in requests_of_api(requests, gone)] == expected


class _Kube(FakeKube):
    """Watches that stay open and say nothing; Kueue's discovery document 404 while `gone`."""

    gone = False

    async def watch(self, res: Resource, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        await asyncio.Event().wait()
        yield {}  # pragma: no cover

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        if self.gone and path.startswith(f"/apis/{WORKLOAD.group}"):
            raise api_error(404)
        return await super().request(method, path, **kwargs)


async def test_kueue_removed_with_a_request_in_flight_keeps_it_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = _Kube()
    workload = {
        "apiVersion": WORKLOAD.api_version,
        "kind": "Workload",
        "metadata": {"name": "a", "namespace": "ns", "uid": "uid-a"},
        "spec": {},
    }
    kube.add(workload, _request("a-check-1", **{WORKLOAD_ANNOTATION: "a"}))
    controller = Controller(kube, pod_groups=None)
    kube.sync(controller.caches)
    informer = controller.caches.workloads
    informer._absent_grace = 0.0  # emptied at once once discovery says not served

    # Kueue's CRDs removed: lists answer 404, and discovery agrees
    kube.gone = True
    kube.fail("list", "Workload", error=api_error(404), times=sys.maxsize)
    running = asyncio.create_task(informer.run())
    try:
        await until(lambda: not informer.served, "the Workloads not served")
    finally:
        running.cancel()
    assert GONE_KEY + WORKLOADS_GONE in controller.queue._queued
    before = len(kube.calls)

    result = await controller.reconcile(GONE_KEY + WORKLOADS_GONE)
    await controller.reconcile("wl:ns/a")  # the Workload's own: nothing proves it gone
    await until(lambda: bool(kube.writes_of("Event")), "the Event")

    assert result.requeue_after == API_GONE_REPEAT_SECONDS
    [event] = [w.body for w in kube.writes_of("Event")]
    assert event["reason"] == API_NOT_SERVED and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "a-check-1"
    assert "Kueue's Workload API is no longer served" in event["message"]
    assert "nothing withdrawn or reclaimed" in event["message"]
    # nothing else written: the request stays, no node touched
    assert [c.kind for c in kube.calls[before:] if c.verb not in {"list", "get"}] == ["Event"]
    assert kube.stored(PROVISIONING_REQUEST, "a-check-1", "ns") is not None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("Kueue's Workload API is no longer served: 1 requests" in m for m in said), said

    # served again: said no more
    informer.served = True
    assert (await controller.reconcile(GONE_KEY + WORKLOADS_GONE)).requeue_after is None


async def test_a_pod_group_api_removed_with_a_request_in_flight_keeps_it_and_says_so() -> None:
    kube = _Kube()
    kube.add(_request("co-c-1", **{GROUP_ANNOTATION: "coscheduling/c"}))
    controller = Controller(kube, pod_group_sync_seconds=1.0)
    kube.sync(controller.caches)
    both = ServedPodGroups(upstream=UPSTREAM_POD_GROUP_V1BETA1, plugins=PLUGINS_POD_GROUP)
    async with asyncio.TaskGroup() as tg:
        try:
            await controller._serve_pod_groups(tg, both)
            # the scheduler-plugins CRD removed: discovery no longer lists it
            await controller._serve_pod_groups(tg, ServedPodGroups(UPSTREAM_POD_GROUP_V1BETA1))
        finally:
            for task in controller._group_tasks.values():
                task.cancel()
    assert GONE_KEY + "coscheduling" in controller.queue._queued
    result = await controller.reconcile(GONE_KEY + "coscheduling")
    await until(lambda: bool(kube.writes_of("Event")), "the Event")
    assert result.requeue_after == API_GONE_REPEAT_SECONDS
    [event] = [w.body for w in kube.writes_of("Event")]
    assert event["reason"] == API_NOT_SERVED
    assert event["involvedObject"]["name"] == "co-c-1"
    assert "the scheduling.x-k8s.io PodGroup API is no longer served" in event["message"]
    assert kube.writes_of("ProvisioningRequest") == []


async def test_a_pod_group_api_gone_before_this_process_started_is_said_too() -> None:
    """A restart, or a new leader, after the scheduler-plugins CRD was removed: its first
    discovery never served that API, and the requests made for its groups are said all the
    same (before: only a drop seen by the process itself was, so it went unsaid for ever)."""
    kube = _Kube()
    kube.add(_request("co-c-1", **{GROUP_ANNOTATION: "coscheduling/c"}))
    controller = Controller(kube, pod_group_sync_seconds=1.0)
    kube.sync(controller.caches)
    async with asyncio.TaskGroup() as tg:
        try:
            await controller._serve_pod_groups(tg, ServedPodGroups(UPSTREAM_POD_GROUP_V1BETA1))
        finally:
            for task in controller._group_tasks.values():
                task.cancel()
    assert GONE_KEY + "coscheduling" in controller.queue._queued
    assert GONE_KEY + "pg" not in controller.queue._queued  # served
    result = await controller.reconcile(GONE_KEY + "coscheduling")
    await until(lambda: bool(kube.writes_of("Event")), "the Event")
    assert result.requeue_after == API_GONE_REPEAT_SECONDS
    [event] = [w.body for w in kube.writes_of("Event")]
    assert event["reason"] == API_NOT_SERVED and event["involvedObject"]["name"] == "co-c-1"
