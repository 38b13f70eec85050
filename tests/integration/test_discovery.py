"""PodGroup API discovery against a real kube-apiserver (v1.37, GenericWorkload on,
scheduling.k8s.io/v1beta1 enabled, the scheduler-plugins PodGroup CRD installed)."""

from __future__ import annotations

import asyncio

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.discovery import (
    PodGroupApiWatcher,
    ServedPodGroups,
    served_pod_group_apis,
    served_resources,
)
from gangcheck.kube.resources import (
    PLUGINS_POD_GROUP,
    UPSTREAM_POD_GROUP_V1ALPHA2,
    UPSTREAM_POD_GROUP_V1BETA1,
    Resource,
)

pytestmark = pytest.mark.integration


async def test_upstream_v1beta1_and_plugins_pod_groups_are_discovered(kube: Kube) -> None:
    served = await served_pod_group_apis(kube)
    assert served == ServedPodGroups(upstream=UPSTREAM_POD_GROUP_V1BETA1, plugins=PLUGINS_POD_GROUP)
    assert str(served) == "scheduling.k8s.io/v1beta1, scheduling.x-k8s.io/v1alpha1"
    for res in served.resources:  # what discovery found is really there
        listing = await kube.list_objects(res)
        assert listing["kind"] == "PodGroupList"


async def test_resource_lists_of_the_served_group_versions(kube: Kube) -> None:
    found = await served_resources(
        kube, [UPSTREAM_POD_GROUP_V1BETA1, UPSTREAM_POD_GROUP_V1ALPHA2, PLUGINS_POD_GROUP]
    )
    assert {"podgroups", "workloads"} <= found["scheduling.k8s.io/v1beta1"]
    assert "podgroups" in found["scheduling.x-k8s.io/v1alpha1"]
    assert "scheduling.k8s.io/v1alpha2" not in found  # not enabled on the test bed


async def test_groups_and_versions_not_served_are_absent_not_errors(kube: Kube) -> None:
    absent_group = Resource("nothing.gangcheck.io", "v1", "podgroups", "PodGroup")
    absent_version = Resource("scheduling.x-k8s.io", "v9", "podgroups", "PodGroup")
    assert await served_resources(kube, [absent_group, absent_version]) == {}


async def test_watcher_reports_the_real_servers_answer(kube: Kube) -> None:
    seen: asyncio.Queue[ServedPodGroups] = asyncio.Queue()
    watcher = PodGroupApiWatcher.for_kube(kube)
    task = asyncio.create_task(watcher.run(seen.put, interval=0.05))
    try:
        first = await asyncio.wait_for(seen.get(), timeout=10)
        await asyncio.sleep(0.3)  # several more rounds: same answer, not reported again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert first.upstream == UPSTREAM_POD_GROUP_V1BETA1
    assert first.plugins == PLUGINS_POD_GROUP
    assert seen.empty()
    assert watcher.current == first
