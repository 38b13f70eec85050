"""DRA objects as the real kube-apiserver (v1.37, resource.k8s.io/v1) returns them, fed to the fit.

The test creates DeviceClasses, ResourceSlices (a partitionable GPU whose counter set sits in a
slice of its own), ResourceClaimTemplates and an allocated ResourceClaim, reads them back with
gangcheck's client, and checks the verdicts of the pure fit on them: this proves the parser
reads what the API server actually stores and serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import InvalidError, NotFoundError
from gangcheck.kube.resources import (
    DEVICE_CLASS,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    RESOURCE_SLICE,
)
from gangcheck.logic.placement.dra import DraContext, Inventory, build_inventory
from gangcheck.logic.placement.fit import (
    FitResult,
    GangPodSet,
    fit_gang,
    member_from_template,
    node_view,
)
from gangcheck.logic.placement.fit import summarize as summary_of
from tests.integration.harness import Cluster

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


class Devices:
    """The cluster-scoped DRA objects of one test, deleted at its end."""

    def __init__(self, kube: Kube, cluster: Cluster) -> None:
        self.kube, self.cluster = kube, cluster
        self.driver = f"gpu-{cluster.ns}.example.com"
        self.classes: list[str] = []
        self.slices: list[str] = []

    def name(self, suffix: str) -> str:
        return f"{self.cluster.ns}-{suffix}"

    async def device_class(self, suffix: str, *expressions: str) -> str:
        name = self.name(suffix)
        selectors = [{"cel": {"expression": e}} for e in expressions]
        await self.kube.create(
            DEVICE_CLASS, {"metadata": {"name": name}, "spec": {"selectors": selectors}}
        )
        self.classes.append(name)
        return name

    async def resource_slice(self, suffix: str, spec: Obj, driver: str = "") -> Obj:
        name = self.name(suffix)
        body = {"metadata": {"name": name}, "spec": {"driver": driver or self.driver, **spec}}
        created = await self.kube.create(RESOURCE_SLICE, body)
        self.slices.append(name)
        return created

    async def remove(self) -> None:
        for res, names in ((RESOURCE_SLICE, self.slices), (DEVICE_CLASS, self.classes)):
            for name in names:
                with contextlib.suppress(NotFoundError):
                    await self.kube.delete(res, name)


@pytest.fixture
async def devices(kube: Kube, cluster: Cluster) -> AsyncIterator[Devices]:
    made = Devices(kube, cluster)
    try:
        yield made
    finally:
        await made.remove()


def gpu(name: str, profile: str, memory: str = "", counters: Obj | None = None) -> Obj:
    entry: Obj = {
        "name": name,
        "attributes": {"model": {"string": "a100"}, "profile": {"string": profile}},
    }
    if memory:
        entry["capacity"] = {"memory": {"value": memory}}
    if counters:
        entry["consumesCounters"] = [
            {"counterSet": "gpu-0", "counters": {k: {"value": v} for k, v in counters.items()}}
        ]
    return entry


def claim_template(name: str, device_class: str, selector: str, count: int = 1) -> Obj:
    request = {
        "name": "g",
        "exactly": {
            "deviceClassName": device_class,
            "count": count,
            "selectors": [{"cel": {"expression": selector}}],
        },
    }
    return {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [request]}}}}


def pod_template(claim_template_name: str, node_selector: dict[str, str] | None = None) -> Obj:
    spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": "trainer:1",
                "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template_name}],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"spec": spec}


async def test_dra_objects_read_back_from_the_api_server_give_the_fits_verdicts(
    kube: Kube, cluster: Cluster, devices: Devices
) -> None:
    driver, ns = devices.driver, cluster.ns
    plain, partitioned = await cluster.add_nodes(2, gpu=0)
    gpu_class = await devices.device_class("gpu", f'device.driver == "{driver}"')

    # node `plain`: four whole GPUs; one of them is held by an allocated claim.
    await devices.resource_slice(
        "plain",
        {
            "pool": {"name": plain, "generation": 1, "resourceSliceCount": 1},
            "nodeName": plain,
            "devices": [gpu(f"gpu-{i}", "whole", "80Gi") for i in range(4)],
        },
    )
    # node `partitioned`: one GPU as a whole device or two halves, sharing one counter set
    # that 1.37 keeps in a slice of its own (same pool).
    pool = {"name": partitioned, "generation": 1, "resourceSliceCount": 2}
    counters = await devices.resource_slice(
        "counters",
        {
            "pool": pool,
            "nodeName": partitioned,
            "sharedCounters": [
                {"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}, "sms": {"value": "8"}}}
            ],
        },
    )
    await devices.resource_slice(
        "partitions",
        {
            "pool": pool,
            "nodeName": partitioned,
            "devices": [
                gpu("whole", "whole", "80Gi", {"memory": "80Gi", "sms": "8"}),
                gpu("half-0", "half", "40Gi", {"memory": "40Gi", "sms": "4"}),
                gpu("half-1", "half", "40Gi", {"memory": "40Gi", "sms": "4"}),
            ],
        },
    )
    # A driver no DeviceClass names, reaching every node.
    nic = f"nic-{ns}.example.com"
    await devices.resource_slice(
        "nics",
        {
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [{"name": "nic-0"}],
        },
        driver=nic,
    )
    assert counters["spec"]["sharedCounters"][0]["counters"]["sms"] == {"value": "8"}

    attribute = f'device.attributes["{driver}"]'
    for name, selector, count in (
        ("two-whole", f'{attribute}.profile == "whole"', 2),
        ("one-whole", f'{attribute}["profile"] == "whole"', 1),
        ("half", f'{attribute}.profile == "half" && {attribute}.model == "a100"', 1),
    ):
        await kube.create(
            RESOURCE_CLAIM_TEMPLATE, claim_template(name, gpu_class, selector, count), ns
        )
    busy = await kube.create(
        RESOURCE_CLAIM,
        {
            "metadata": {"name": "busy"},
            "spec": {
                "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": gpu_class}}]}
            },
        },
        ns,
    )
    busy["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "g", "driver": driver, "pool": plain, "device": "gpu-0"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [plain]}]}
                ]
            },
        }
    }
    await kube.replace(RESOURCE_CLAIM, busy, subresource="status")

    # Everything from here on is what the API server serves.
    slices = (await kube.list_objects(RESOURCE_SLICE, field_selector=f"spec.driver={driver}"))[
        "items"
    ]
    slices += (await kube.list_objects(RESOURCE_SLICE, field_selector=f"spec.driver={nic}"))[
        "items"
    ]
    classes = [await kube.get(DEVICE_CLASS, name) for name in devices.classes]
    claims = (await kube.list_objects(RESOURCE_CLAIM, ns))["items"]
    templates = (await kube.list_objects(RESOURCE_CLAIM_TEMPLATE, ns))["items"]
    views = [node_view(n) for n in await cluster.nodes()]
    inventory = build_inventory(slices, classes, claims)
    context = DraContext.of(templates, claims)

    served = {s["metadata"]["name"]: s["spec"] for s in slices}
    assert served[devices.name("partitions")]["devices"][1]["consumesCounters"] == [
        {"counterSet": "gpu-0", "counters": {"memory": {"value": "40Gi"}, "sms": {"value": "4"}}}
    ]
    defaults = next(t for t in templates if t["metadata"]["name"] == "one-whole")
    exact = defaults["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exact["allocationMode"] == "ExactCount"  # filled in by the API server
    assert [str(p) for p in inventory.problems] == [
        f'ResourceSlice "{devices.name("nics")}": driver "{nic}" is not selected by any DeviceClass'
    ]

    def fit(*pod_sets: tuple[str, int, str, dict[str, str] | None]) -> FitResult:
        gang = [
            GangPodSet(name, count, member_from_template(pod_template(tpl, selector), context))
            for name, count, tpl, selector in pod_sets
        ]
        return fit_gang(gang, views, (), inventory)

    # Whole GPUs: three free on `plain` (the claim holds one), one on `partitioned`.
    assert fit(("workers", 1, "two-whole", None)).fits
    two = fit(("workers", 2, "two-whole", None))
    assert not two.fits
    assert two.placements == {plain: ("workers",)}
    assert str(two.node_reasons[partitioned]) == (
        f'claim "gpu" request "g": 2 devices of class "{gpu_class}" needed, 1 free'
    )
    assert f'claim "gpu" request "g": too few free devices of class "{gpu_class}"' in summary_of(
        two
    )
    assert fit(("workers", 4, "one-whole", None)).fits

    # Halves: two, while the whole device is not taken; taking it exhausts the counters.
    on_partitioned = {"kubernetes.io/hostname": partitioned}
    assert fit(("halves", 2, "half", None)).fits
    assert not fit(("halves", 3, "half", None)).fits
    mixed = fit(("whole", 1, "one-whole", on_partitioned), ("halves", 1, "half", None))
    assert not mixed.fits
    assert mixed.unplaced == {"whole": 1}  # the half went first (same demand, by name)
    assert str(mixed.in_use_reasons[partitioned]) == (
        f'claim "gpu" request "g": 1 device of class "{gpu_class}" needed, 0 free'
    )

    # Without the DRA objects nothing is free: the verdict never says Ready by mistake.
    blind = fit_gang(
        [GangPodSet("workers", 1, member_from_template(pod_template("two-whole"), context))],
        views,
        (),
        Inventory(),
    )
    assert not blind.fits


async def test_the_api_server_refuses_ordering_quantities_in_cel(devices: Devices) -> None:
    """Why gangcheck's CEL subset has `compareTo` but not `>=` between quantities."""
    with pytest.raises(InvalidError, match="no matching overload"):
        await devices.device_class(
            "ordered", f'device.capacity["{devices.driver}"].memory >= quantity("40Gi")'
        )
    compared = f'device.capacity["{devices.driver}"].memory.compareTo(quantity("40Gi")) >= 0'
    assert await devices.device_class("compared", compared)


async def test_devices_and_shared_counters_may_not_share_a_slice(devices: Devices) -> None:
    with pytest.raises(InvalidError, match="only one of `sharedCounters` or `devices`"):
        await devices.resource_slice(
            "both",
            {
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "sharedCounters": [{"name": "c", "counters": {"m": {"value": "1"}}}],
                "devices": [{"name": "d"}],
            },
        )
