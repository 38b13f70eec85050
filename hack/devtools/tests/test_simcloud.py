"""The simulated cloud against a real kube-apiserver: real requests in, real Nodes out.

Each test has its own namespace, ConfigMap and node group (named after the namespace), and
the sim watches only that namespace, so tests never see each other's requests or nodes.
Nodes are cluster-scoped: every test deletes the nodes of its group at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from gangcheck_dev.simcloud import SimCloud, model
from gangcheck_dev.simcloud.cloud import DELIVERED_REASON

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import CONFIG_MAP, EVENT, NODE, POD_TEMPLATE, PROVISIONING_REQUEST
from gangcheck.logic.timefmt import parse_time
from tests.integration.harness import eventually, never
from tests.waiting import cancelled

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
_ids = itertools.count(1)


class World:
    """One test's namespace, node group, ConfigMap and sims."""

    def __init__(self, kube: Kube, kubeconfig: str, namespace: str) -> None:
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.ns = namespace
        self.group = namespace
        self.config_map = "sim"
        self._running: list[tuple[asyncio.Task[None], Kube]] = []

    # ---- the sim ------------------------------------------------------------------------

    def group_spec(self, **overrides: Any) -> Obj:
        spec = {
            "name": self.group,
            "maxNodes": 16,
            "cpu": "32",
            "memory": "256Gi",
            "gpus": 8,
            "labels": {"pool": "gpu"},
            "taints": [GPU_TAINT],
        }
        return {**spec, **overrides}

    async def configure(self, *scenarios: Obj, **group: Any) -> str:
        """Write the ConfigMap (create or replace); returns its resourceVersion."""
        config = {
            "namespaces": [self.ns],
            "nodeGroups": [self.group_spec(**group)],
            "scenarios": list(scenarios),
        }
        body: Obj = {
            "metadata": {"name": self.config_map, "namespace": self.ns},
            "data": {"config": json.dumps(config)},
        }
        try:
            current = await self.kube.get(CONFIG_MAP, self.config_map, self.ns)
        except NotFoundError:
            created = await self.kube.create(CONFIG_MAP, body)
            return str(created["metadata"]["resourceVersion"])
        current["data"] = body["data"]
        replaced = await self.kube.replace(CONFIG_MAP, current)
        return str(replaced["metadata"]["resourceVersion"])

    async def start_sim(self) -> SimCloud:
        own = await Kube.connect(self.kubeconfig)
        sim = SimCloud(own, f"{self.ns}/{self.config_map}", watch_timeout=30)
        task = asyncio.create_task(sim.run())
        self._running.append((task, own))
        await asyncio.wait_for(sim.ready.wait(), 20)
        return sim

    async def stop_sims(self) -> None:
        while self._running:
            task, own = self._running.pop()
            await cancelled(task)
            await own.close()

    # ---- requests -----------------------------------------------------------------------

    async def request(
        self, name: str, count: int, *, gpus: int = 8, parameters: Obj | None = None
    ) -> Obj:
        """A PodTemplate of GPU members and a request for ``count`` of them."""
        container = {
            "name": "worker",
            "image": "trainer",
            "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": str(gpus)}},
        }
        spec = {
            "containers": [container],
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }
        template: Obj = {
            "metadata": {"name": f"ppt-{name}", "namespace": self.ns},
            "template": {"spec": spec},
        }
        await self.kube.create(POD_TEMPLATE, template)
        return await self.create_request(name, [(f"ppt-{name}", count)], parameters=parameters)

    async def create_request(
        self, name: str, pod_sets: list[tuple[str, int]], *, parameters: Obj | None = None
    ) -> Obj:
        spec: Obj = {
            "provisioningClassName": CLASS,
            "podSets": [{"podTemplateRef": {"name": t}, "count": c} for t, c in pod_sets],
        }
        if parameters:
            spec["parameters"] = parameters
        body = {"metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        return await self.kube.create(PROVISIONING_REQUEST, body)

    async def conditions(self, name: str) -> dict[str, Obj]:
        req = await self.kube.get(PROVISIONING_REQUEST, name, self.ns)
        return {c["type"]: c for c in (req.get("status") or {}).get("conditions") or []}

    async def wait_condition(
        self, name: str, kind: str, status: str = "True", *, timeout: float = 15
    ) -> Obj:
        async def probe() -> Obj | None:
            cond = (await self.conditions(name)).get(kind)
            return cond if cond is not None and cond["status"] == status else None

        return await eventually(probe, timeout=timeout, what=f"{kind}={status} on {name}")

    async def plan(self, name: str) -> model.Plan:
        plan = model.plan_from_annotations(await self.kube.get(PROVISIONING_REQUEST, name, self.ns))
        assert plan is not None
        return plan

    async def plan_when(
        self, name: str, done: Callable[[model.Plan], bool], what: str
    ) -> model.Plan:
        """The plan as the sim saved it, once it says `done`: the sim saves it after the step
        it records (a node is usable a moment before the plan counts it delivered)."""

        async def probe() -> model.Plan | None:
            plan = await self.plan(name)
            return plan if done(plan) else None

        return await eventually(probe, what=what)

    # ---- nodes --------------------------------------------------------------------------

    async def nodes(self) -> list[Obj]:
        selector = f"{model.NODEGROUP_LABEL}={self.group}"
        return list((await self.kube.list_objects(NODE, label_selector=selector))["items"])

    async def wait_nodes(self, count: int, *, timeout: float = 15) -> list[Obj]:
        async def probe() -> tuple[list[Obj]] | None:
            nodes = await self.nodes()
            return (nodes,) if len(nodes) == count and all(map(is_usable, nodes)) else None

        (nodes,) = await eventually(probe, timeout=timeout, what=f"{count} usable nodes")
        return nodes

    async def delete_nodes(self) -> None:
        for node in await self.nodes():
            with contextlib.suppress(NotFoundError):
                await self.kube.delete(NODE, node["metadata"]["name"])


def is_usable(node: Obj) -> bool:
    """Ready, and without the not-ready taint the API server puts on every new node."""
    conditions = (node.get("status") or {}).get("conditions") or []
    taints = (node.get("spec") or {}).get("taints") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready and all(t["key"] != model.NOT_READY_TAINT for t in taints)


def when(stamp: str) -> datetime:
    parsed = parse_time(stamp)
    assert parsed is not None, stamp
    return parsed


@pytest.fixture
async def world(control_plane: Any, kube: Kube) -> AsyncIterator[World]:
    namespace = f"sim{next(_ids)}-{int(time.time() * 1000) % 100000}"
    control_plane.ensure_namespace(namespace)
    w = World(kube, str(control_plane.kubeconfig), namespace)
    try:
        yield w
    finally:
        await w.stop_sims()
        await w.delete_nodes()


# ---- deliveries ---------------------------------------------------------------------------


async def test_full_delivery_sets_provisioned_before_any_node_exists(world: World) -> None:
    await world.configure({"provisionAfterSeconds": 0.2, "nodeDelaySeconds": 1.5})
    await world.start_sim()
    await world.request("full", 4)

    provisioned = await world.wait_condition("full", "Provisioned")
    assert await world.nodes() == [], "Provisioned=True must come before the nodes (like CA)"
    nodes = await world.wait_nodes(4)

    assert provisioned["reason"] == "CapacityIsProvisioned"
    assert provisioned["observedGeneration"] == 1
    accepted = (await world.conditions("full"))["Accepted"]
    assert (accepted["reason"], accepted["message"]) == ("Accepted", model.ACCEPTED_MSG)
    for node in nodes:
        meta = node["metadata"]
        assert when(meta["creationTimestamp"]) > when(provisioned["lastTransitionTime"])
        created_at = datetime.fromisoformat(meta["annotations"][model.CREATED_AT_ANNOTATION])
        assert created_at > when(provisioned["lastTransitionTime"])
        assert meta["name"].startswith(f"{world.group}-")
        assert meta["labels"]["pool"] == "gpu"
        assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert meta["annotations"][model.REQUEST_ANNOTATION] == f"{world.ns}/full"
        assert node["spec"]["providerID"] == f"sim://{meta['name']}"
        assert node["spec"]["taints"] == [GPU_TAINT]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    plan = await world.plan_when("full", lambda p: len(p.delivered) >= len(nodes), "saved")
    assert sorted(plan.delivered) == sorted(n["metadata"]["name"] for n in nodes)


async def test_partial_delivery_brings_11_of_16(world: World) -> None:
    await world.configure({"deliver": 11, "nodeDelaySeconds": 0.1})
    await world.start_sim()
    await world.request("partial", 16)

    await world.wait_nodes(11)
    provisioned = await world.wait_condition("partial", "Provisioned")
    assert provisioned["reason"] == "CapacityIsProvisioned"

    async def more_than_11() -> int:
        count = len(await world.nodes())
        return count if count != 11 else 0

    await never(more_than_11, seconds=1.0, what="a node beyond the 11 delivered")
    plan = await world.plan_when("partial", lambda p: len(p.delivered) >= 11, "11, saved")
    assert (plan.needed, len(plan.delivered)) == (16, 11)
    # Each delivery is recorded as an Event on the request, naming the node.
    events = await world.kube.list_objects(
        EVENT, world.ns, field_selector=f"reason={DELIVERED_REASON}"
    )
    named = sorted(e["message"].split()[1] for e in events["items"])
    assert named == sorted(plan.delivered)
    assert {e["involvedObject"]["name"] for e in events["items"]} == {"partial"}


# ---- failures -----------------------------------------------------------------------------


async def test_stockout_reports_not_found_then_fails(world: World) -> None:
    await world.configure({"stockout": True, "provisionAfterSeconds": 0.1, "failAfterSeconds": 1})
    await world.start_sim()
    await world.request("stock", 2)

    not_found = await world.wait_condition("stock", "Provisioned", "False")
    assert (not_found["reason"], not_found["message"]) == (
        "CapacityIsNotFound",
        model.NOT_FOUND_MSG,
    )
    failed = await world.wait_condition("stock", "Failed")
    assert failed["reason"] == "CapacityIsNotFound"
    assert when(failed["lastTransitionTime"]) >= when(not_found["lastTransitionTime"])
    assert await world.nodes() == []


async def test_late_failure_after_provisioning_stops_further_nodes(world: World) -> None:
    await world.configure({"nodeDelaySeconds": [0.2, 6], "failAfterSeconds": 1.5})
    await world.start_sim()
    await world.request("late", 2)

    await world.wait_nodes(1)
    failed = await world.wait_condition("late", "Failed")
    assert failed["message"].endswith("1 of 2 arrived")
    assert (await world.conditions("late"))["Provisioned"]["status"] == "True"
    assert len(await world.nodes()) == 1, "the sim never deletes nodes after a failure"


async def test_revocation_deletes_the_delivered_nodes(world: World) -> None:
    await world.configure({"nodeDelaySeconds": 0.2, "revokeAfterSeconds": 2})
    await world.start_sim()
    await world.request("revoked", 2)

    await world.wait_nodes(2)
    revoked = await world.wait_condition("revoked", "CapacityRevoked")
    assert revoked["reason"] == "CapacityRevoked"
    await world.wait_nodes(0)
    await world.plan_when("revoked", lambda p: p.revoked, "the revocation saved")


async def test_too_big_for_max_nodes_is_not_found_counting_existing_nodes(world: World) -> None:
    await world.configure({"nodeDelaySeconds": 0.1}, maxNodes=4)
    await world.start_sim()
    await world.request("fits", 3)
    await world.wait_nodes(3)

    await world.request("big", 2)
    not_found = await world.wait_condition("big", "Provisioned", "False")
    assert not_found["reason"] == "CapacityIsNotFound"
    assert "room for 1" in (await world.plan("big")).message
    await world.request("big-no-retry", 2, parameters={"noRetry": "true"})
    failed = await world.wait_condition("big-no-retry", "Failed")
    assert (failed["reason"], failed["message"]) == (
        "CapacityIsNotFound",
        model.NOT_FOUND_FAILED_MSG,
    )
    assert "Failed" not in await world.conditions("big"), "without noRetry CA keeps trying"

    await world.create_request("no-template", [("ppt-missing", 1)])
    invalid = await world.wait_condition("no-template", "Failed")
    assert invalid["reason"] == "FailedToCreatePods"
    assert len(await world.nodes()) == 3


# ---- state and config ---------------------------------------------------------------------


async def test_restarted_sim_continues_without_delivering_twice(world: World) -> None:
    await world.configure({"provisionAfterSeconds": 0, "nodeDelaySeconds": [0.2, 0.2, 3, 3]})
    await world.start_sim()
    await world.request("restart", 4)
    first_two = await world.wait_nodes(2)
    await world.stop_sims()

    reclaimed = first_two[0]["metadata"]["name"]  # as gangcheck would reclaim a stranded node
    await world.kube.delete(NODE, reclaimed)
    await world.start_sim()
    nodes = await world.wait_nodes(3)

    names = {n["metadata"]["name"] for n in nodes}
    assert reclaimed not in names
    plan = await world.plan_when("restart", lambda p: len(p.delivered) >= 4, "4 delivered, saved")
    assert sorted(plan.delivered) == sorted(names | {reclaimed})  # each once, none twice
    started = datetime.fromtimestamp(plan.started_at, UTC)
    for node in nodes:
        created = datetime.fromisoformat(
            node["metadata"]["annotations"][model.CREATED_AT_ANNOTATION]
        )
        late = node["metadata"]["name"] not in {n["metadata"]["name"] for n in first_two}
        assert not late or (created - started).total_seconds() >= 3, "kept the planned delay"

    async def recreated() -> bool:
        return reclaimed in {n["metadata"]["name"] for n in await world.nodes()}

    await never(recreated, seconds=1.0, what="the reclaimed node delivered again")


async def test_config_change_applies_to_the_next_request(world: World) -> None:
    await world.configure({"nodeDelaySeconds": 0.1})
    sim = await world.start_sim()
    await world.request("before", 1)
    await world.wait_nodes(1)

    stockout_once = {"name": "stockout-once", "stockout": True, "times": 1}
    version = await world.configure(stockout_once, {"nodeDelaySeconds": 0.1})

    async def reloaded() -> bool:
        return sim.config_resource_version == version

    await eventually(reloaded, what="the sim re-read its config")
    await world.request("during", 1)
    not_found = await world.wait_condition("during", "Provisioned", "False")
    assert not_found["reason"] == "CapacityIsNotFound"
    assert (await world.plan("during")).rule == "stockout-once"

    await world.request("after", 1)
    await world.wait_nodes(2)
    config_map = await world.kube.get(CONFIG_MAP, world.config_map, world.ns)
    uses = json.loads(config_map["metadata"]["annotations"][model.RULE_USES_ANNOTATION])
    assert list(uses.values()) == [1]


# ---- the command line ---------------------------------------------------------------------


async def test_cli_runs_the_sim_as_a_process(world: World, control_plane: Any) -> None:
    await world.configure({"nodeDelaySeconds": 0.1})
    argv = [sys.executable, "-m", "gangcheck_dev.simcloud", "--kubeconfig", world.kubeconfig]
    argv += ["--config-map", f"{world.ns}/{world.config_map}", "--log-level", "WARNING"]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        await world.request("cli", 2)
        await world.wait_nodes(2, timeout=25)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()
