"""The Events on DRA objects gangcheck cannot use: said once each, and what is remembered of
them stays as large as the problems there are now."""

from __future__ import annotations

from typing import Any

from gangcheck.kube.resources import EVENT
from gangcheck.reconcile.devices import DeviceProblemReconciler
from gangcheck.reconcile.events import EventRecorder
from tests.fakes.kube import FakeKube

Obj = dict[str, Any]


def stray_slice(version: int) -> Obj:
    """A ResourceSlice of a driver no DeviceClass selects."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "stray", "uid": "uid-stray", "resourceVersion": str(version)},
        "spec": {
            "driver": "unknown.example.com",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [{"name": "gpu-0"}],
        },
    }


async def test_a_problem_is_said_once_and_forgotten_once_its_object_is_gone() -> None:
    kube = FakeKube()
    kube.add(stray_slice(1))
    caches = kube.caches()
    reconciler = DeviceProblemReconciler(caches, EventRecorder(kube))
    for _ in range(3):
        await reconciler.reconcile("devices")
    (said,) = kube.all_of(EVENT)
    assert (said["reason"], said["involvedObject"]["name"]) == ("DeviceProblem", "stray")
    for version in (2, 3, 4):  # republished by its driver, the problem the same
        caches.resource_slices.store.put_if_newer(stray_slice(version))
        await reconciler.reconcile("devices")
    assert len(reconciler._said) == 1  # before: one more kept for every version, for ever
    caches.resource_slices.store._pop(stray_slice(4))  # as its watch says it was deleted
    await reconciler.reconcile("devices")
    assert reconciler._said == set()
