"""A request of the Karpenter class with only the base rights (manifests/components/karpenter not
installed): the real API server refuses the provisioner's calls (403); it says so once, on an
Event naming the component, and backs off instead of warning every second."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import EVENT, NAMESPACE, POD_TEMPLATE, PROVISIONING_REQUEST
from gangcheck.logic.sources.karpenter import access
from gangcheck.model.names import MANAGED_BY, MANAGED_BY_LABEL
from gangcheck.model.provisioning_config import KARPENTER_CLASS
from gangcheck.reconcile.caches import Caches
from gangcheck.reconcile.karpenter import KarpenterProvisioner
from tests.integration.harness import eventually
from tests.integration.test_manifests import (
    base_installed,
    remove_namespace,
    service_account_kubeconfig,
)
from tests.waiting import Passes, PassesEnded, cancelled

pytestmark = pytest.mark.integration
Obj = dict[str, Any]
LOGGER = "gangcheck.reconcile.karpenter"
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}


def karpenter_request(namespace: str) -> Obj:
    return {
        "metadata": {"name": "gang-check-1", "namespace": namespace, "labels": MANAGED},
        "spec": {
            "provisioningClassName": KARPENTER_CLASS,
            "parameters": {"nodePools": "gpu"},
            "podSets": [{"podTemplateRef": {"name": "ppt-gang"}, "count": 2}],
        },
    }


def pod_template(namespace: str) -> Obj:
    gpus = {"nvidia.com/gpu": "8"}
    container = {"name": "c", "image": "x", "resources": {"requests": gpus, "limits": gpus}}
    return {
        "metadata": {"name": "ppt-gang", "namespace": namespace, "labels": MANAGED},
        "template": {"spec": {"containers": [container]}},
    }


@pytest.mark.timeout(120)
async def test_without_the_karpenter_rights_it_says_so_once_and_backs_off(
    control_plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    namespace = f"karp-rights-{uuid.uuid4().hex[:8]}"
    with base_installed(control_plane):
        kubeconfig = service_account_kubeconfig(control_plane, tmp_path)
        try:
            async with (
                await Kube.connect(str(control_plane.kubeconfig)) as admin,
                await Kube.connect(str(kubeconfig)) as account,
            ):
                await admin.create(NAMESPACE, {"metadata": {"name": namespace}})
                await admin.create(POD_TEMPLATE, pod_template(namespace), namespace)
                request = await admin.create(
                    PROVISIONING_REQUEST, karpenter_request(namespace), namespace
                )
                caches = Caches.create(account, watch_timeout=30)
                watching = asyncio.create_task(caches.requests.run())
                try:
                    await asyncio.wait_for(caches.requests.synced.wait(), 30)
                    sleep = Passes(8, fraction=1 / 40)  # a fortieth of each wait
                    karpenter = KarpenterProvisioner(account, caches, sleep=sleep)
                    with contextlib.suppress(PassesEnded):
                        await karpenter.run()
                finally:
                    await cancelled(watching)

                async def told() -> list[Obj]:
                    listed = await admin.list_objects(EVENT, namespace)
                    return [e for e in listed["items"] if e["reason"] == access.REASON]

                events = await eventually(told, what="the KarpenterNotPermitted Event")
                fresh = await admin.get(PROVISIONING_REQUEST, "gang-check-1", namespace)
        finally:
            remove_namespace(control_plane, namespace)
    warned = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING
    ]
    assert len(warned) == 1, warned
    assert access.COMPONENT in warned[0] and "403 Forbidden" in warned[0]
    (event,) = events
    assert event["involvedObject"]["uid"] == request["metadata"]["uid"]
    assert event["type"] == "Warning" and access.COMPONENT in event["message"]
    # Eight passes, the waits between them doubling (not one a second).
    assert sleep.waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    # The base may not write the request's status: the Event is the record, nothing else.
    assert not (fresh.get("status") or {}).get("conditions")
