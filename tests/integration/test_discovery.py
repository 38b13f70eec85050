"""PodGroup API discovery against a real kube-apiserver (v1.37, GenericWorkload on,
scheduling.k8s.io/v1beta1 enabled, the scheduler-plugins PodGroup CRD installed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.app import Controller
from gangcheck.kube.client import Kube
from gangcheck.kube.discovery import (
    PodGroupApiWatcher,
    ServedPodGroups,
    served_pod_group_apis,
    served_resources,
)
from gangcheck.kube.errors import ForbiddenError, NotFoundError
from gangcheck.kube.resources import (
    ATOMIC_CONFIG,
    NAMESPACE,
    PLUGINS_POD_GROUP,
    PROVISIONING_REQUEST,
    SERVICE_ACCOUNT,
    UPSTREAM_POD_GROUP_V1ALPHA2,
    UPSTREAM_POD_GROUP_V1BETA1,
    WORKLOAD,
    Resource,
)
from gangcheck.telemetry import Metrics
from tests.integration.harness import eventually, token_kubeconfig
from tests.waiting import cancelled

pytestmark = pytest.mark.integration
Obj = dict[str, Any]


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


# ---- a PodGroup API served whose list RBAC refuses ---------------------------------------

#: What the controller's caches read, but the scheduler-plugins PodGroups (scheduling.x-k8s.io).
_READ_BUT_PLUGINS = [
    "",
    WORKLOAD.group,
    ATOMIC_CONFIG.group,
    PROVISIONING_REQUEST.group,
    "resource.k8s.io",
    "karpenter.sh",
    UPSTREAM_POD_GROUP_V1BETA1.group,
]


def _role(name: str, groups: list[str]) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": groups, "resources": ["*"], "verbs": ["get", "list", "watch"]}],
    }


@contextlib.asynccontextmanager
async def reader_but_plugins(
    kube: Kube, cp: ControlPlane, folder: Path, namespace: str
) -> AsyncIterator[tuple[Path, str]]:
    """A ServiceAccount of `namespace` that may read what gangcheck caches but the plugins
    PodGroups: its kubeconfig, and its ClusterRole's name (removed at the end)."""
    name = f"gangcheck-test-{namespace}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await kube.create(SERVICE_ACCOUNT, {"metadata": {"name": "reader"}}, namespace)
    await kube.request("POST", f"{rbac}/clusterroles", body=_role(name, _READ_BUT_PLUGINS))
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    await kube.request("POST", f"{rbac}/clusterrolebindings", body=binding)
    try:
        token = await kube.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/reader/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        user = f"system:serviceaccount:{namespace}:reader"
        path = token_kubeconfig(cp, user, token["status"]["token"], folder / "reader.kubeconfig")
        yield path, name
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(NotFoundError):
                await kube.request("DELETE", f"{rbac}/{kind}/{name}")


def _pod_group(res: Resource, name: str, namespace: str) -> Obj:
    spec = (
        {"schedulingPolicy": {"gang": {"minCount": 1}}} if res.group == "scheduling.k8s.io" else {}
    )
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


@pytest.mark.timeout(120)
async def test_a_pod_group_api_rbac_refuses_to_list_is_skipped_and_served_once_allowed(
    kube: Kube, control_plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The plugins PodGroups' list refused (403, a real RBAC answer): the upstream PodGroups
    and the rest are served, the refusal said (ERROR, gangcheck_caches_synced 0); the right
    granted, the plugins PodGroups are listed on the informer's own backoff and served."""
    caplog.set_level(logging.INFO, logger="gangcheck.app")
    namespace = f"pg-unlisted-{uuid.uuid4().hex[:8]}"
    await kube.create(NAMESPACE, {"metadata": {"name": namespace}})
    try:
        for res, name in ((UPSTREAM_POD_GROUP_V1BETA1, "up"), (PLUGINS_POD_GROUP, "co")):
            await kube.create(res, _pod_group(res, name, namespace), namespace)
        granted = reader_but_plugins(kube, control_plane, tmp_path, namespace)
        async with granted as (path, role), await Kube.connect(str(path)) as reader:
            # the grant in force: the upstream list allowed, the plugins one refused
            await eventually(lambda: _lists(reader, UPSTREAM_POD_GROUP_V1BETA1), what="the grant")
            with pytest.raises(ForbiddenError):
                await reader.list_objects(PLUGINS_POD_GROUP)
            metrics = Metrics()
            controller = Controller(
                reader, metrics=metrics, watch_timeout=30, pod_group_sync_seconds=1.0
            )
            running = asyncio.create_task(controller.run())
            try:
                caches = controller.caches
                await eventually(
                    lambda: _true(caches.pod_groups_discovered), what="discovery answered"
                )
                upstream = caches.pod_groups[UPSTREAM_POD_GROUP_V1BETA1.group]
                assert upstream.store.get("up", namespace) is not None
                assert caches.pod_groups_known(UPSTREAM_POD_GROUP_V1BETA1.group)
                assert not caches.pod_groups_known(PLUGINS_POD_GROUP.group)
                assert "gangcheck_caches_synced 0" in metrics.render()
                said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
                assert any(
                    "cannot list scheduling.x-k8s.io/v1alpha1 PodGroups" in m and "403" in m
                    for m in said
                ), said

                # the right granted: listed, served, said
                await kube.request(
                    "PUT",
                    f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}",
                    body=_role(role, [*_READ_BUT_PLUGINS, PLUGINS_POD_GROUP.group]),
                )
                plugins = caches.pod_groups[PLUGINS_POD_GROUP.group]
                await eventually(
                    lambda: _true(caches.pod_groups_known(PLUGINS_POD_GROUP.group)),
                    what="the plugins PodGroups listed",
                    timeout=60,
                )
                assert plugins.store.get("co", namespace) is not None
                assert "gangcheck_caches_synced 1" in metrics.render()
            finally:
                await cancelled(running)
    finally:
        await kube.delete(NAMESPACE, namespace)


async def _lists(kube: Kube, res: Resource) -> bool:
    try:
        await kube.list_objects(res)
    except ForbiddenError:
        return False
    return True


async def _true(value: bool) -> bool:
    return value
