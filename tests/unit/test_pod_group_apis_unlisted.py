"""A PodGroup API served whose list is refused (RBAC) or failing does not stop the others:
discovery waits for its informer a while, says it (ERROR, `gangcheck_caches_synced` 0),
serves the APIs that listed, and serves it too once it lists. Its groups' members are told
nothing meanwhile (a group missing from a cache that never listed is not known missing)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from gangcheck.app import Controller
from gangcheck.kube.discovery import ServedPodGroups
from gangcheck.kube.resources import PLUGINS_POD_GROUP, UPSTREAM_POD_GROUP_V1BETA1, Resource
from gangcheck.logic.podgroups.gating import COSCHEDULING_LABEL, OPT_IN_VALUE
from gangcheck.model.names import GATE, OPT_IN_LABEL
from gangcheck.model.objects import Obj
from gangcheck.telemetry import Metrics
from tests.fakes.kube import FakeKube, api_error
from tests.waiting import until

UPSTREAM, PLUGINS = UPSTREAM_POD_GROUP_V1BETA1, PLUGINS_POD_GROUP


class _Kube(FakeKube):
    """The fake with watches that stay open and say nothing, and the plugins PodGroups'
    list refused (403) while `refused`."""

    refused = True

    async def watch(self, res: Resource, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        await asyncio.Event().wait()
        yield {}  # pragma: no cover

    async def list_objects(self, res: Resource, *args: Any, **kwargs: Any) -> Obj:
        if res == PLUGINS and self.refused:
            raise api_error(403, kind="podgroups")
        return await super().list_objects(res, *args, **kwargs)


def _objects() -> list[Obj]:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "ns", "labels": {OPT_IN_LABEL: OPT_IN_VALUE}},
    }
    groups = [
        {
            "apiVersion": res.api_version,
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns"},
        }
        for res, name in ((UPSTREAM, "up"), (PLUGINS, "co"))
    ]
    gated = {"containers": [{"name": "c", "image": "x"}], "schedulingGates": [{"name": GATE}]}
    members = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "up-0", "namespace": "ns"},
            "spec": {**gated, "schedulingGroup": {"podGroupName": "up"}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "co-0", "namespace": "ns", "labels": {COSCHEDULING_LABEL: "co"}},
            "spec": gated,
        },
    ]
    return [namespace, *groups, *members]


def _queued(controller: Controller) -> set[str]:
    return set(controller.queue._queued)


async def test_a_pod_group_api_not_listable_is_skipped_said_and_served_once_it_lists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gangcheck.app")
    kube = _Kube()
    kube.add(*_objects())
    metrics = Metrics()
    controller = Controller(kube, metrics=metrics, pod_group_sync_seconds=0.2)
    kube.sync(controller.caches)  # the main caches listed: only the PodGroup APIs remain
    caches = controller.caches
    async with asyncio.TaskGroup() as tg:
        try:
            served = ServedPodGroups(upstream=UPSTREAM, plugins=PLUGINS)
            await asyncio.wait_for(controller._serve_pod_groups(tg, served), 5)

            # discovery answered: the upstream API served, the plugins one skipped and said
            assert caches.pod_groups_discovered and controller.served_pod_groups == served
            assert caches.pod_groups_known(UPSTREAM.group)
            assert not caches.pod_groups_known(PLUGINS.group)
            assert {"pg:pg/ns/up", "pg:coscheduling/ns/co"} <= _queued(controller)
            said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(said) == 1, said
            assert "scheduling.x-k8s.io/v1alpha1" in said[0] and "403" in said[0]
            assert "gangcheck_caches_synced 0" in metrics.render()

            # the skipped API's group is not known missing: its member is told nothing
            assert controller.group_reconciler is not None
            await controller.group_reconciler.reconcile("coscheduling/ns/co")
            await asyncio.sleep(0.05)  # Events are sent in the background
            assert kube.writes == []

            # the list allowed again: listed on the informer's own backoff, then served
            kube.refused = False
            plugins = caches.pod_groups[PLUGINS.group]
            await until(plugins.synced.is_set, "the plugins PodGroups listed")
            await until(lambda: not controller._unlisted_tasks, "the listed API taken up")
            assert caches.pod_groups_known(PLUGINS.group)
            assert plugins.store.get("co", "ns") is not None
            assert "gangcheck_caches_synced 1" in metrics.render()
            assert any("PodGroups listed" in r.getMessage() for r in caplog.records)
        finally:
            for task in [*controller._group_tasks.values(), *controller._unlisted_tasks.values()]:
                task.cancel()
