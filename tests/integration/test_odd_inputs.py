"""Odd objects against a real kube-apiserver: each is said where the user looks, and what the
API server answers is read for what it is."""

from __future__ import annotations

import pytest

from gangcheck.kube.errors import ConflictError, InvalidError, refused
from gangcheck.kube.resources import WORKLOAD
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, RunningController, eventually

pytestmark = pytest.mark.integration


def gang(name: str = "wl") -> WorkloadBuilder:
    return WorkloadBuilder(name).pod_set("workers", 2, pod_template(gpu=1)).reserve_quota().check()


async def test_a_failed_patch_test_is_a_change_and_a_schema_refusal_is_refused(
    cluster: Cluster,
) -> None:
    """`kube.errors.refused` on kube-apiserver's own answers: a JSON-patch ``test`` that fails
    (the Workload changed meanwhile) is a 422 naming no causes; the CRD's schema refusing a
    check entry is a 422 naming them."""
    await cluster.install_check(None)
    name = await cluster.submit(gang())
    wl = await cluster.workload(name)
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/status/admissionChecks/0/message", "value": "x"},
    ]
    with pytest.raises(InvalidError) as changed:
        await cluster.kube.json_patch(WORKLOAD, name, stale, cluster.ns, subresource="status")
    assert not refused(changed.value)
    version = wl["metadata"]["resourceVersion"]
    bogus = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "replace", "path": "/status/admissionChecks/0/state", "value": "Bogus"},
    ]
    with pytest.raises((InvalidError, ConflictError)) as invalid:
        await cluster.kube.json_patch(WORKLOAD, name, bogus, cluster.ns, subresource="status")
    assert isinstance(invalid.value, InvalidError) and refused(invalid.value), invalid.value


async def test_a_config_pinning_a_label_kubernetes_refuses_is_inactive_until_fixed(
    cluster: Cluster, controller: RunningController
) -> None:
    """Before, the config was Active and each gang's PodTemplate was refused by the API
    server (nodeSelector: 'bad key'), retried for ever."""
    bad = {"capacitySources": [{"name": "a", "nodeSelector": {"bad key": "x"}}]}
    await cluster.install_check(bad)

    async def inactive() -> dict[str, str] | None:
        cond = await cluster.active_condition()
        return cond if cond is not None and cond["status"] == "False" else None

    cond = await eventually(inactive, what="the check inactive")
    assert cond["reason"] == "InvalidConfig"
    assert "spec.capacitySources[0].nodeSelector: 'bad key' is not a label key" in cond["message"]
    await cluster.submit(gang())

    async def said() -> dict[str, str] | None:
        check = await cluster.check_state("wl")
        return check if "'bad key' is not a label key" in check["message"] else None

    check = await eventually(said, what="the check saying why nothing is asked")
    assert check["state"] == "Pending"
    assert "no provisioning request is made" in check["message"]
    assert not await cluster.requests() and not await cluster.templates()

    await cluster.set_config({"capacitySources": [{"name": "a", "nodeSelector": cluster.pool}]})
    await cluster.wait_request(f"wl-{cluster.check}-1")
