"""The fake API server answers like the real one where the reconcilers rely on it."""

from __future__ import annotations

import pytest

from gangcheck.kube.errors import (
    AlreadyExistsError,
    ChangedError,
    ConflictError,
    NotFoundError,
    TransientError,
)
from gangcheck.kube.resources import NODE, POD, POD_TEMPLATE, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.model.names import MANAGED_BY, MANAGED_BY_LABEL
from tests.builders import WorkloadBuilder, node, provisioning_request
from tests.fakes.kube import FakeKube


async def test_a_get_of_a_missing_object_is_a_404_naming_it() -> None:
    kube = FakeKube()
    with pytest.raises(NotFoundError) as caught:
        await kube.get(NODE, "n1")
    assert caught.value.names_object("n1")
    assert await kube.get_if_exists(NODE, "n1") is None


async def test_every_write_moves_the_resource_version_on() -> None:
    kube = FakeKube()
    kube.add(node("n1"))
    before = (await kube.get(NODE, "n1"))["metadata"]["resourceVersion"]
    after = await kube.merge_patch(NODE, "n1", {"metadata": {"labels": {"a": "b"}}})
    assert int(after["metadata"]["resourceVersion"]) > int(before)
    assert after["metadata"]["labels"]["a"] == "b"


async def test_a_patch_at_a_stale_resource_version_is_a_conflict() -> None:
    kube = FakeKube()
    kube.add(node("n1"))
    with pytest.raises(ConflictError):
        await kube.merge_patch(NODE, "n1", {"metadata": {"resourceVersion": "1"}})
    assert kube.writes_of("Node") == [kube.calls[-1]]
    assert kube.stored(NODE, "n1") is not None


async def test_a_taken_name_is_already_exists() -> None:
    kube = FakeKube()
    body = {"metadata": {"name": "t", "namespace": "ns"}, "template": {}}
    await kube.create(POD_TEMPLATE, body)
    with pytest.raises(AlreadyExistsError):
        await kube.create(POD_TEMPLATE, body)


async def test_generate_name_gives_a_fresh_name_each_time() -> None:
    kube = FakeKube()
    body = {"metadata": {"generateName": "ev-", "namespace": "ns"}}
    first = await kube.create(POD_TEMPLATE, body)
    second = await kube.create(POD_TEMPLATE, body)
    assert first["metadata"]["name"].startswith("ev-")
    assert first["metadata"]["name"] != second["metadata"]["name"]


async def test_a_failed_json_patch_test_is_a_change_and_changes_nothing() -> None:
    kube = FakeKube()
    kube.add(WorkloadBuilder().check().build())
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
        {"op": "replace", "path": "/status/admissionChecks/0/state", "value": "Ready"},
    ]
    with pytest.raises(ChangedError):  # as the client reads kube-apiserver's 422
        await kube.json_patch(WORKLOAD, "wl", ops, "default", subresource="status")
    stored = kube.stored(WORKLOAD, "wl", "default")
    assert stored is not None
    assert stored["status"]["admissionChecks"][0]["state"] == "Pending"


async def test_a_status_write_changes_only_the_status_and_others_leave_it() -> None:
    kube = FakeKube()
    kube.add(WorkloadBuilder().check().build())
    patch = {"spec": {"queueName": "other"}, "status": {"admissionChecks": []}}
    await kube.merge_patch(WORKLOAD, "wl", patch, "default", subresource="status")
    await kube.merge_patch(WORKLOAD, "wl", {"status": {"x": 1}}, "default")
    stored = kube.stored(WORKLOAD, "wl", "default")
    assert stored is not None
    assert stored["spec"]["queueName"] == "lq"
    assert stored["status"] == {"admissionChecks": []}


async def test_a_delete_with_a_stale_uid_is_a_conflict() -> None:
    kube = FakeKube()
    kube.add(provisioning_request("r1"))
    with pytest.raises(ConflictError):
        await kube.delete(PROVISIONING_REQUEST, "r1", "default", uid="someone-else")
    await kube.delete(PROVISIONING_REQUEST, "r1", "default", uid="uid-r1")
    assert kube.stored(PROVISIONING_REQUEST, "r1", "default") is None


async def test_an_injected_failure_fails_that_many_calls_then_lets_them_through() -> None:
    kube = FakeKube()
    kube.add(node("n1"))
    kube.fail("patch", "Node", "n1", 503, times=2)
    for _ in range(2):
        with pytest.raises(TransientError):
            await kube.merge_patch(NODE, "n1", {"metadata": {"labels": {"a": "b"}}})
    await kube.merge_patch(NODE, "n1", {"metadata": {"labels": {"a": "b"}}})
    assert len(kube.writes_of("Node", "patch")) == 3


async def test_a_mended_failure_lets_the_calls_through_however_many_times_were_left() -> None:
    kube = FakeKube()
    kube.fail("list", "Node", error=404, times=1_000)
    kube.fail("list", "Pod", error=404, times=1_000)
    with pytest.raises(NotFoundError):
        await kube.list_objects(NODE)
    kube.mend("list", "Node")
    assert (await kube.list_objects(NODE))["items"] == []
    with pytest.raises(NotFoundError):
        await kube.list_objects(POD)


async def test_an_answer_lost_on_the_way_back_still_took_effect() -> None:
    kube = FakeKube()
    kube.fail("create", "PodTemplate", error=503, applied=True)
    with pytest.raises(TransientError):
        await kube.create(POD_TEMPLATE, {"metadata": {"name": "t", "namespace": "ns"}})
    assert kube.stored(POD_TEMPLATE, "t", "ns") is not None


async def test_pods_are_listed_by_field_selector() -> None:
    kube = FakeKube()
    for name, where in (("a", "n1"), ("b", "n2")):
        kube.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                  "spec": {"nodeName": where}})  # fmt: skip
    listed = await kube.list_objects(POD, field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]


def test_caches_show_the_store_through_each_informers_selector() -> None:
    kube = FakeKube()
    ours = provisioning_request("ours")
    ours["metadata"]["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
    kube.add(node("n1"), ours, provisioning_request("theirs"))
    caches = kube.caches()
    assert caches.nodes.store.get("n1") is not None
    assert caches.requests.store.get("ours", "default") is not None
    assert caches.requests.store.get("theirs", "default") is None
    assert caches.synced
    assert caches.workloads.authoritative
