"""Where the admission check follows Kueue's built-in provisioning check, or improves on it
on purpose, against a real kube-apiserver: the test plays Kueue core and the autoscaler by
writing Workload and ProvisioningRequest status, as Kueue's own integration suite does.

No kube-controller-manager runs in this bed, so no garbage collector: where a test needs
one, `collect_garbage` deletes, as the collector would, every PodTemplate none of whose
owners exists any more.
"""

from __future__ import annotations

from typing import Any

import pytest

from gangcheck.kube.resources import POD_TEMPLATE, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.logic import naming
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, RunningController, eventually

pytestmark = pytest.mark.integration

TRUST: dict[str, Any] = {"fulfillment": {"mode": "TrustProvisioned"}}


def gang(name: str = "wl", workers: int = 4) -> WorkloadBuilder:
    return (
        WorkloadBuilder(name)
        .pod_set("driver", 1, pod_template(cpu="2"))
        .pod_set("workers", workers, pod_template(gpu=1))
        .reserve_quota()
        .check()
    )


def req_name(cluster: Cluster, workload: str = "wl", attempt: int = 1) -> str:
    return naming.request_name(workload, cluster.check, attempt)


async def collect_garbage(cluster: Cluster) -> list[str]:
    """As the garbage collector: delete the PodTemplates whose owners are all gone."""
    alive = {
        o["metadata"]["uid"]
        for res in (WORKLOAD, PROVISIONING_REQUEST)
        for o in (await cluster.kube.list_objects(res, cluster.ns)).get("items") or []
    }
    collected = []
    for t in await cluster.templates():
        owners = {r["uid"] for r in t["metadata"].get("ownerReferences") or []}
        if owners and not owners & alive:
            await cluster.kube.delete(POD_TEMPLATE, t["metadata"]["name"], cluster.ns)
            collected.append(t["metadata"]["name"])
    return collected


async def templates_of(cluster: Cluster, req: Any) -> list[Any] | None:
    """The request's PodTemplates, once every one it points at exists."""
    wanted = {p["podTemplateRef"]["name"] for p in req["spec"]["podSets"]}
    found = [t for t in await cluster.templates() if t["metadata"]["name"] in wanted]
    return found if len(found) == len(wanted) else None


async def test_a_request_deleted_by_hand_costs_no_attempt(
    cluster: Cluster, controller: RunningController
) -> None:
    """The request is deleted by hand once it owns its templates; the garbage collector then
    finds the templates still owned by the Workload and keeps them, so the recreated request
    of the same attempt points at templates that exist, even with backoffLimitCount 0."""
    await cluster.install_check({**TRUST, "retryStrategy": {"backoffLimitCount": 0}})
    await cluster.submit(gang())
    name = req_name(cluster)
    first = await cluster.wait_request(name)
    uid = first["metadata"]["uid"]

    async def adopted() -> bool:
        found = await templates_of(cluster, first) or []
        owners = [{r["uid"] for r in t["metadata"]["ownerReferences"]} for t in found]
        return len(owners) == 2 and all(uid in o for o in owners)

    await eventually(adopted, what="templates owned by the request")
    await cluster.kube.delete(PROVISIONING_REQUEST, name, cluster.ns)
    assert await collect_garbage(cluster) == []

    async def recreated() -> Any:
        req = await cluster.request(name)
        return req if req and req["metadata"]["uid"] != uid else None

    second = await eventually(recreated, what="request recreated")
    assert second["metadata"]["annotations"]["gangcheck.io/attempt"] == "1"
    assert await eventually(lambda: templates_of(cluster, second), what="templates present")
    await cluster.set_request_conditions(name, {"Provisioned": ""})
    check = await cluster.wait_check("wl", "Ready")
    assert not check.get("retryCount")


async def test_a_template_lost_while_its_request_is_in_flight_is_recreated(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(TRUST)
    await cluster.submit(gang())
    req = await cluster.wait_request(req_name(cluster))
    lost = naming.template_name(req["metadata"]["name"], "workers")
    await eventually(lambda: templates_of(cluster, req), what="templates present")
    await cluster.kube.delete(POD_TEMPLATE, lost, cluster.ns)

    async def back() -> Any:
        found = await templates_of(cluster, req) or []
        return next((t for t in found if t["metadata"]["name"] == lost), None)

    template = await eventually(back, what=f"{lost} recreated")
    owners = {r["kind"]: r["uid"] for r in template["metadata"]["ownerReferences"]}
    assert owners["ProvisioningRequest"] == req["metadata"]["uid"]
    assert "Workload" in owners
