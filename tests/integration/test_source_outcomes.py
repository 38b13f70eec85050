"""What gangcheck publishes of its capacity sources' outcomes on its AdmissionCheck (for the
capacity-aware dispatcher of a MultiKueue manager to read), against a real kube-apiserver:
the test plays Kueue core and the cloud (requests' conditions, Node objects), gangcheck runs
as its own controller."""

from __future__ import annotations

import pytest

from gangcheck.kube.resources import ADMISSION_CHECK
from gangcheck.logic.attempt import published
from gangcheck.logic.attempt.published import CONDITION, Outcome, Seen
from gangcheck.model.objects import Obj
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, RunningController, eventually, now, req_name

pytestmark = pytest.mark.integration

FIT = {
    "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 60, "reclaimer": "DeleteNode"},
    "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
}


def gang(name: str) -> WorkloadBuilder:
    return WorkloadBuilder(name).pod_set("workers", 2, pod_template(gpu=1)).reserve_quota().check()


async def _published(cluster: Cluster, outcome: Outcome) -> tuple[Obj, tuple[Seen, ...]] | None:
    check = await cluster.kube.get(ADMISSION_CHECK, cluster.check)
    said = published.on_check(check)
    mine = [s for s in said if s.flavors == (cluster.flavor,) and s.source == "default"]
    if [s.outcome for s in mine] != [outcome]:
        return None
    conditions = check["status"]["conditions"]
    return next(c for c in conditions if c["type"] == CONDITION), said


async def test_the_check_says_its_source_stocked_out_then_delivered_for_the_gangs_flavor(
    cluster: Cluster, controller: RunningController
) -> None:
    await cluster.install_check(FIT)
    await cluster.submit(gang("first"))
    await cluster.set_request_conditions(
        req_name(cluster, "first"), {"Failed": "CapacityIsNotFound"}
    )
    await cluster.wait_check("first", "Retry")
    found = await eventually(
        lambda: _published(cluster, Outcome.STOCKOUT), what="the stockout published", timeout=20
    )
    cond, _ = found
    assert (cond["status"], cond["reason"]) == ("True", "StockedOut")
    active = await cluster.active_condition()
    assert active is not None and active["status"] == "True"  # kept beside it

    await cluster.submit(gang("second"))
    await cluster.set_request_conditions(req_name(cluster, "second"), {"Provisioned": ""})
    await cluster.add_nodes(2)
    await cluster.wait_check("second", "Ready")
    found = await eventually(
        lambda: _published(cluster, Outcome.DELIVERED), what="the delivery published", timeout=20
    )
    cond, said = found
    assert (cond["status"], cond["reason"]) == ("False", "Delivering")
    assert len(said) == 1  # the latest per flavors and source


async def test_a_source_that_says_it_cannot_find_the_capacity_is_published_while_it_is_waited_on(
    cluster: Cluster, controller: RunningController
) -> None:
    """cluster-autoscaler's `Provisioned=False` `CapacityIsNotFound`, with no source next: the
    check stays Pending (it tries again, until the deadline), and the check says the source
    stocked out for the gang's flavor; once it delivers, that it delivered."""
    await cluster.install_check(FIT)
    await cluster.submit(gang("waiting"))
    name = req_name(cluster, "waiting")
    refused = {
        "conditions": [
            {
                "type": "Provisioned",
                "status": "False",
                "reason": "CapacityIsNotFound",
                "message": "Capacity is not found, CA will try to find it later.",
                "lastTransitionTime": now(),
            }
        ]
    }
    await cluster.update_request_status(name, lambda status: status.update(refused))
    cond, _ = await eventually(
        lambda: _published(cluster, Outcome.STOCKOUT), what="the refusal published", timeout=20
    )
    assert (cond["status"], cond["reason"]) == ("True", "StockedOut")
    assert (await cluster.check_state("waiting"))["state"] == "Pending"

    await cluster.set_request_conditions(name, {"Provisioned": ""})
    await cluster.add_nodes(2)
    await cluster.wait_check("waiting", "Ready")
    cond, _ = await eventually(
        lambda: _published(cluster, Outcome.DELIVERED), what="the delivery published", timeout=20
    )
    assert (cond["status"], cond["reason"]) == ("False", "Delivering")
