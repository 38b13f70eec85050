"""A leader whose caches do not sync says so: at ERROR, in `gangcheck_caches_synced`, and on
its AdmissionChecks (Active=False, CachesNotSynced), until they sync and the check's
reconcile sets Active again."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from gangcheck.app import CACHES_NOT_SYNCED, Controller
from gangcheck.kube.resources import ADMISSION_CHECK, ATOMIC_CONFIG, PROVISIONING_REQUEST, Resource
from gangcheck.model.objects import Obj
from gangcheck.telemetry import Metrics
from tests.builders import CHECK, admission_check
from tests.fakes.kube import FakeKube, api_error
from tests.waiting import cancelled, until


class _Kube(FakeKube):
    """The fake with watches that stay open and say nothing."""

    async def watch(self, res: Resource, *args: Any, **kwargs: Any) -> AsyncGenerator[Obj]:
        await asyncio.Event().wait()
        yield {}  # pragma: no cover


def _active(kube: FakeKube) -> Obj:
    check = kube.stored(ADMISSION_CHECK, CHECK) or {}
    conditions = (check.get("status") or {}).get("conditions") or []
    return next(c for c in conditions if c.get("type") == "Active")


async def test_a_cache_not_synced_turns_our_checks_inactive_until_it_syncs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = _Kube()
    # ProvisioningRequests not served: every list answers 404, as without their CRD
    not_served = api_error(404, kind=PROVISIONING_REQUEST.plural)
    kube.fail("list", PROVISIONING_REQUEST.kind, error=not_served, times=sys.maxsize)
    kube.add(
        {**admission_check(), "apiVersion": ADMISSION_CHECK.api_version, "kind": "AdmissionCheck"},
        {
            "apiVersion": ATOMIC_CONFIG.api_version,
            "kind": "AtomicProvisioningConfig",
            "metadata": {"name": "cfg"},
            "spec": {},
        },
    )
    metrics = Metrics()
    controller = Controller(kube, metrics=metrics, pod_groups=None)
    controller.caches.requests._retry_delay = 0.01  # listed again soon once served
    run = asyncio.create_task(controller.run(unsynced_grace=0.1))
    try:
        await until(lambda: _active(kube)["status"] == "False", "the check inactive")
        active = _active(kube)
        assert active["reason"] == CACHES_NOT_SYNCED
        assert "provisioningrequests.autoscaling.x-k8s.io: " in active["message"]
        assert "404" in active["message"]
        assert "gangcheck_caches_synced 0" in metrics.render()
        said = [r for r in caplog.records if r.levelname == "ERROR"]
        assert said and "provisioningrequests" in said[0].getMessage()
        assert not controller.caches.synced

        kube.mend("list", PROVISIONING_REQUEST.kind)  # the CRD back
        await until(lambda: _active(kube)["status"] == "True", "the check active again")
        assert _active(kube)["reason"] == "Active"
        assert controller.caches.synced
        assert "gangcheck_caches_synced 1" in metrics.render()
    finally:
        await cancelled(run)


async def test_without_kueue_there_is_no_check_to_say_it_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = _Kube()
    kube.fail("list", "AdmissionCheck", 404)
    controller = Controller(kube, pod_groups=None)
    controller.caches.requests.last_error = "404 the server could not find the resource"
    await controller._say_unsynced()  # no other cache listed yet: every one named
    assert [c.kind for c in kube.calls] == ["AdmissionCheck"]
    assert kube.writes == []
    [said] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "provisioningrequests.autoscaling.x-k8s.io: 404 the server" in said
    assert "pods: no answer yet" in said


async def test_caches_still_listing_without_an_error_leave_the_checks_as_they_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A large cluster's first lists take longer than the grace: said as a warning only, the
    AdmissionChecks neither read nor written (Kueue would stop admitting for nothing)."""
    kube = _Kube()
    controller = Controller(kube, pod_groups=None)
    await controller._say_unsynced()
    assert kube.calls == []
    assert kube.writes == []
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    [said] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "pods: no answer yet" in said
