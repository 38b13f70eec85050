"""Falling back to a second place, two ways, side by side: gangcheck's capacity sources (and
its asks scoped to one topology domain) beside Kueue's built-in ProvisioningRequest check given
the same two places as two ResourceFlavors of one ClusterQueue (Kueue's only way to fall back:
it moves to the next flavor only when it re-queues the Workload).

Everything is real but the cloud: one local stack (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kwok, Kueue v0.17 with its webhooks; no cluster-autoscaler), gangcheck
as its own process (its ServiceAccount's rights, its defaults), and the simulated cloud
(``gangcheck_dev sim-cloud``) answering both sides' ProvisioningRequests (class
``best-effort-atomic-scale-up``) by creating kwok Nodes in node groups told apart by labels.
Kueue admits the Jobs, kube-scheduler binds their pods, kwok runs them. Nothing plays Kueue.

Three scenarios (the third in two forms), each run for both sides at once, each side in a
namespace, ClusterQueue and node groups of its own (so nothing of one side can serve the
other); a gang is a Job of MEMBERS pods of one GPU each, and every node holds one member:

1. ``stockout``: pool A has no capacity (its node group has room for no node: the cloud
   answers ``CapacityIsNotFound``), pool B has room for the gang;
2. ``partial``: pool A delivers DELIVERED of the MEMBERS nodes and no more; pool B all;
3. ``racks``: the gang must sit in one rack; rack 1 (which ranks first) has room for
   RACK1_MAX nodes only, rack 2 for the gang. gangcheck: one flavor over both racks and the
   Job's pod template annotated ``gangcheck.io/podset-required-topology: <rack label>``
   (gangcheck's form of Kueue's annotation, which Kueue does not read). Kueue: one flavor per
   rack (the flavor's node labels pin the rack), no annotation. With Kueue's own
   ``kueue.x-k8s.io/podset-required-topology`` instead (measured in an earlier run), Kueue
   v0.17 never reserves quota for gangcheck's Job ("Flavor ... does not support
   TopologyAwareScheduling": it refuses the annotation on a flavor without topology-aware
   scheduling; on a TAS flavor it would place the gang on the nodes that exist before any
   check runs, as it delays that only for its own ProvisioningRequest check);
3b. ``racks-sources``: the same racks, gangcheck given them as ``capacitySources`` [rack 1
   (deadlineSeconds SOURCE_DEADLINE), rack 2] (each source's nodeSelector names its rack), no
   annotation; Kueue as in 3.

gangcheck: one AdmissionCheck; for ``stockout`` and ``partial`` ``capacitySources`` [pool A
(deadlineSeconds SOURCE_DEADLINE), pool B] under a flavor that leaves the pool open; for
``racks`` no sources (the domains are asked in turn). Kueue: a ClusterQueue with flavors
[A, B], each flavor with its own AdmissionCheck (``onFlavors``) and ProvisioningRequestConfig
(so the cloud can tell a pool's requests apart by name), both at Kueue's defaults.

Per side, sampled every SAMPLE seconds over the horizon:
- time to start: from the Job's creation to all its pods Running (or "did not start");
- stranded node-minutes: node time of the side's nodes (from each node's creation to its
  deletion or the end of the horizon) while the gang had not started, and after it started,
  of the nodes that run none of its members; in total and in the place given up on (pool A,
  rack 1): for gangcheck the place it left, for Kueue the place it stays on (Kueue never
  leaves it: see the results in docs/benchmarks.md); and of that, the node time of the nodes
  there that never carried a member of the started gang (all of them when it did not start):
  what was thrown away there, as opposed to held until the gang started on it (gangcheck
  keeps a source's partial delivery and tops it up from the next, logic/attempt/topup.py);
- nodes left behind at the end (stranded in the last sample) in that place and in all, and
  the ProvisioningRequests at the end.

Usage: python benchmarks/capacity_sources.py [--horizon SECONDS] [--scenarios a,b] [--json]
It starts (and stops) the stack, gangcheck and the simulated cloud. One horizon for all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gangcheck_dev.testbed.deploy import ManagedProcess, deploy_gangcheck, start_sim_cloud
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.nodes import kwok_node
from gangcheck_dev.testbed.stack import CONTROLLER_MANAGER, KUEUE, KWOK, SCHEDULER, Addon, Kueue

from benchmarks.kueue_scale import KUEUE_SHIPPED_CONCURRENCY
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    WORKLOAD,
    Resource,
)

Obj = dict[str, Any]

MEMBERS = 8
DELIVERED = 5
RACK1_MAX = 4
#: Pool A's own deadline on gangcheck's side (the whole gang must be there by then).
SOURCE_DEADLINE = 20
SAMPLE = 0.5
SCENARIOS = ("stockout", "partial", "racks", "racks-sources")
SIDES = ("gangcheck", "kueue")
LABELS = {"gangcheck": "gangcheck (capacity sources)", "kueue": "Kueue's check, 2 flavors"}
GPU = "nvidia.com/gpu"
ARM_LABEL = "gangcheck.io/bench-arm"
PLACE_LABEL = "gangcheck.io/bench-place"
RACK_LABEL = "gangcheck.io/bench-rack"
REQUIRED_TOPOLOGY = "gangcheck.io/podset-required-topology"
OUR_CONTROLLER = "gangcheck.io/atomic-provisioning"
KUEUE_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
PROVREQ_CONFIG = Resource(
    "kueue.x-k8s.io", "v1beta2", "provisioningrequestconfigs", "ProvisioningRequestConfig", False
)
SIM_CONFIG_MAP = "gangcheck-system/bench-sim-cloud"
NODE_SHAPE = {"cpu": "8", "memory": "32Gi", "gpus": 1, "pods": 110}
#: gangcheck's settings that are not its defaults (stated under the tables).
GANGCHECK_FULFILLMENT = {"reclaimer": "DeleteNode"}


# -- what each side gets -----------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """One place a gang can come from: a node group of the simulated cloud."""

    key: str  # "a"/"b" (pools) or "r1"/"r2" (racks)
    max_nodes: int
    labels: dict[str, str]


@dataclass
class Arm:
    scenario: str
    side: str
    namespace: str = ""
    job_created: float = 0.0
    started_at: float | None = None
    idle: dict[str, float] = field(default_factory=dict)  # node -> idle seconds
    place_of: dict[str, str] = field(default_factory=dict)  # node -> place key
    idle_now: set[str] = field(default_factory=set)
    carried: set[str] = field(default_factory=set)  # nodes that ran a member once started
    left: dict[str, int] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    check_state: str = ""
    check_message: str = ""

    @property
    def name(self) -> str:
        return f"{self.scenario}-{self.side}"

    @property
    def first_place(self) -> str:
        return "r1" if self.scenario.startswith("racks") else "a"


def places(arm: Arm) -> list[Place]:
    base = {ARM_LABEL: arm.name}
    if arm.scenario.startswith("racks"):
        return [
            Place("r1", RACK1_MAX, {**base, RACK_LABEL: "r1"}),
            Place("r2", 2 * MEMBERS, {**base, RACK_LABEL: "r2"}),
        ]
    a_max = 0 if arm.scenario == "stockout" else 2 * MEMBERS
    return [
        Place("a", a_max, {**base, PLACE_LABEL: "a"}),
        Place("b", 2 * MEMBERS, {**base, PLACE_LABEL: "b"}),
    ]


def kueue_check_name(arm: Arm, place: Place) -> str:
    return f"{arm.name}-{place.key}"


def sim_config(arms: Sequence[Arm], stockout_fails_after: float | None = None) -> Obj:
    """The node groups of every arm and the rules for the first place's requests: in
    ``partial``, DELIVERED nodes and no more; in ``stockout``, with ``stockout_fails_after``,
    ``Failed`` that many seconds after ``CapacityIsNotFound`` (cluster-autoscaler 1.33 fails
    such a request only after 7 days: without it the request waits, as there)."""
    groups = [
        {
            "name": f"{arm.name}-{place.key}",
            "maxNodes": place.max_nodes,
            **NODE_SHAPE,
            "labels": dict(place.labels),
        }
        for arm in arms
        for place in places(arm)
    ]
    rules: list[Obj] = []
    for arm in arms:
        if arm.scenario == "partial":
            first: Obj = {"deliver": DELIVERED, "nodeDelaySeconds": 1, "bookingSeconds": 3600}
        elif arm.scenario == "stockout" and stockout_fails_after is not None:
            first = {"failAfterSeconds": stockout_fails_after}
        else:
            continue
        if arm.side == "gangcheck":
            # the first source's requests are <workload>-<check>-<attempt>; later sources' end
            # in -s<n>
            rules.append(
                {
                    "name": f"{arm.name}-later-sources",
                    "nodeDelaySeconds": 1,
                    "bookingSeconds": 3600,
                    "match": {"namespace": arm.namespace, "name": ".*-s[0-9]+"},
                }
            )
            rules.append(
                {"name": f"{arm.name}-first", **first, "match": {"namespace": arm.namespace}}
            )
        else:
            check = kueue_check_name(arm, places(arm)[0])
            rules.append(
                {
                    "name": f"{arm.name}-first",
                    **first,
                    "match": {"namespace": arm.namespace, "name": f".*-{check}-[0-9]+"},
                }
            )
    rules.append({"name": "whole", "nodeDelaySeconds": 1, "bookingSeconds": 3600})
    return {
        "namespaces": [arm.namespace for arm in arms],
        "nodeGroups": groups,
        "scenarios": rules,
    }


def quota() -> list[Obj]:
    return [
        {"name": "cpu", "nominalQuota": str(2 * MEMBERS)},
        {"name": "memory", "nominalQuota": f"{2 * MEMBERS}Gi"},
        {"name": GPU, "nominalQuota": str(MEMBERS)},
    ]


def gangcheck_spec(arm: Arm) -> Obj:
    spec: Obj = {
        "managedResources": [GPU],
        "fulfillment": dict(GANGCHECK_FULFILLMENT),
    }
    if arm.scenario != "racks":
        first, second = places(arm)
        label, names = (
            (RACK_LABEL, ("rack-1", "rack-2"))
            if arm.scenario == "racks-sources"
            else (PLACE_LABEL, ("pool-a", "pool-b"))
        )
        spec["capacitySources"] = [
            {
                "name": names[0],
                "nodeSelector": {label: first.key},
                "deadlineSeconds": SOURCE_DEADLINE,
            },
            {"name": names[1], "nodeSelector": {label: second.key}},
        ]
    return spec


async def make_side(kube: Kube, arm: Arm) -> None:
    """Namespace, flavors, checks (+ configs), ClusterQueue and LocalQueue ``lq`` of one arm."""
    await kube.create(NAMESPACE, {"metadata": {"name": arm.namespace}})
    name = arm.name
    resource_group: Obj = {"coveredResources": ["cpu", "memory", GPU], "flavors": []}
    checks: list[Obj] = []
    if arm.side == "gangcheck":
        # one flavor over both places: the sources' (or the racks') labels choose the place
        flavor = {"nodeLabels": {ARM_LABEL: name}}
        await kube.create(RESOURCE_FLAVOR, {"metadata": {"name": name}, "spec": flavor})
        resource_group["flavors"].append({"name": name, "resources": quota()})
        await kube.create(ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": gangcheck_spec(arm)})
        check = {
            "controllerName": OUR_CONTROLLER,
            "parameters": params("gangcheck.io", "AtomicProvisioningConfig", name),
        }
        await kube.create(ADMISSION_CHECK, {"metadata": {"name": name}, "spec": check})
        checks.append({"name": name})
    else:
        for place in places(arm):
            flavor_name = check_name = kueue_check_name(arm, place)
            flavor = {"nodeLabels": dict(place.labels)}
            await kube.create(RESOURCE_FLAVOR, {"metadata": {"name": flavor_name}, "spec": flavor})
            resource_group["flavors"].append({"name": flavor_name, "resources": quota()})
            await kube.create(
                PROVREQ_CONFIG,
                {
                    "metadata": {"name": check_name},
                    "spec": {
                        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
                    },
                },
            )
            check = {
                "controllerName": KUEUE_CONTROLLER,
                "parameters": params("kueue.x-k8s.io", "ProvisioningRequestConfig", check_name),
            }
            await kube.create(ADMISSION_CHECK, {"metadata": {"name": check_name}, "spec": check})
            checks.append({"name": check_name, "onFlavors": [flavor_name]})
    await kube.create(
        CLUSTER_QUEUE,
        {
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [resource_group],
                "admissionChecksStrategy": {"admissionChecks": checks},
            },
        },
    )
    await kube.create(
        LOCAL_QUEUE, {"metadata": {"name": "lq"}, "spec": {"clusterQueue": name}}, arm.namespace
    )
    if arm.scenario.startswith("racks"):
        # a node in each rack, with no GPU: the racks exist (gangcheck ranks the domains that
        # nodes show); neither can hold a member, so rack 1 ranks first, by name
        for place in places(arm):
            labels = {**place.labels}
            await kube.create(
                NODE, kwok_node(f"{name}-{place.key}-head", cpu="4", memory="8Gi", labels=labels)
            )


def params(group: str, kind: str, name: str) -> Obj:
    return {"apiGroup": group, "kind": kind, "name": name}


def gang_job(arm: Arm) -> Obj:
    template_meta: Obj = {}
    if arm.scenario == "racks" and arm.side == "gangcheck":
        template_meta = {"annotations": {REQUIRED_TOPOLOGY: RACK_LABEL}}
    return {
        "metadata": {"name": "gang", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "suspend": True,
            "parallelism": MEMBERS,
            "completions": MEMBERS,
            "backoffLimit": 0,
            "template": {
                "metadata": template_meta,
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi", GPU: "1"},
                                "limits": {GPU: "1"},
                            },
                        }
                    ],
                },
            },
        },
    }


async def wait_active(kube: Kube, arms: Sequence[Arm], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for arm in arms:
        names = (
            [kueue_check_name(arm, p) for p in places(arm)] if arm.side == "kueue" else [arm.name]
        )
        for res, name in [(CLUSTER_QUEUE, arm.name)] + [(ADMISSION_CHECK, n) for n in names]:
            while not is_true(await get_or_empty(kube, res, name), "Active"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{res.kind} {name} not Active after {timeout:.0f}s")
                await asyncio.sleep(0.25)


async def get_or_empty(kube: Kube, res: Resource, name: str) -> Obj:
    try:
        return await kube.get(res, name)
    except NotFoundError:
        return {}


def is_true(obj: Obj, kind: str) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return bool(cond.get("status") == "True")
    return False


# -- the ledger --------------------------------------------------------------------------------


async def sample(kube: Kube, arms: Sequence[Arm], dt: float) -> None:
    """One sample of every arm: which of its nodes run a member, and whether all run."""
    nodes = (await kube.list_objects(NODE)).get("items") or []
    for arm in arms:
        mine = {
            n["metadata"]["name"]: n["metadata"]["labels"]
            for n in nodes
            if (n["metadata"].get("labels") or {}).get(ARM_LABEL) == arm.name
            and not n["metadata"]["name"].endswith("-head")
        }
        pods = (await kube.list_objects(POD, arm.namespace)).get("items") or []
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        busy = {p["spec"].get("nodeName") for p in running}
        if arm.started_at is None and len(running) >= MEMBERS:
            arm.started_at = time.monotonic()
        if arm.started_at is not None:
            arm.carried.update(n for n in busy if n in mine)
        arm.idle_now = set()
        for name, labels in mine.items():
            arm.place_of.setdefault(name, labels.get(RACK_LABEL) or labels.get(PLACE_LABEL, "?"))
            if arm.started_at is None or name not in busy:
                arm.idle[name] = arm.idle.get(name, 0.0) + dt
                arm.idle_now.add(name)


async def finish(kube: Kube, arm: Arm) -> None:
    """What is left at the end: nodes stranded in the last sample (all of them while the gang
    has not started), the requests, the check's state."""
    for name in arm.idle_now:
        place = arm.place_of.get(name, "?")
        arm.left[place] = arm.left.get(place, 0) + 1
    requests = (await kube.list_objects(PROVISIONING_REQUEST, arm.namespace))["items"]
    arm.requests = sorted(r["metadata"]["name"] for r in requests)
    workloads = (await kube.list_objects(WORKLOAD, arm.namespace))["items"]
    states = [s for w in workloads for s in (w.get("status") or {}).get("admissionChecks") or []]
    arm.check_state = ", ".join(f"{s['name']}: {s.get('state')}" for s in states)
    arm.check_message = "; ".join(str(s.get("message", ""))[:160] for s in states)
    if workloads and not is_true(workloads[0], "QuotaReserved"):
        conds = (workloads[0].get("status") or {}).get("conditions") or []
        arm.check_message = "; ".join(
            f"{c['type']}={c['status']}: {c.get('message', '')}"[:160] for c in conds
        )


async def measure(kubeconfig: Path, arms: Sequence[Arm], horizon: float) -> float:
    async with await Kube.connect(str(kubeconfig)) as kube:
        await wait_active(kube, arms)
        for arm in arms:
            await kube.create(JOB, gang_job(arm), arm.namespace)
            arm.job_created = time.monotonic()
        begin = time.monotonic()
        last = begin
        while time.monotonic() - begin < horizon:
            await asyncio.sleep(SAMPLE)
            now = time.monotonic()
            await sample(kube, arms, now - last)
            last = now
            progress = ", ".join(
                f"{a.name} {'started' if a.started_at else 'waiting'}" for a in arms
            )
            if int(now - begin) % 15 == 0 and now - begin > 1:
                print(f"{now - begin:.0f}s: {progress}", file=sys.stderr)
        for arm in arms:
            await finish(kube, arm)
        return last - begin


async def setup(kubeconfig: Path, arms: Sequence[Arm]) -> None:
    async with await Kube.connect(str(kubeconfig)) as kube:
        for arm in arms:
            await make_side(kube, arm)


# -- the stack ---------------------------------------------------------------------------------


class BenchPlane(ControlPlane):
    """The test bed's control plane, Kueue's controllers at the concurrency its manifests ship."""

    def _make_addons(self) -> list[Addon]:
        addons = super()._make_addons()
        for addon in addons:
            if isinstance(addon, Kueue):
                addon.config_overrides["controller"] = {
                    "groupKindConcurrency": dict(KUEUE_SHIPPED_CONCURRENCY)
                }
        return addons


@contextlib.contextmanager
def stack(
    workdir: Path, arms: Sequence[Arm], stockout_fails_after: float | None = None
) -> Iterator[ControlPlane]:
    plane = BenchPlane(components=(SCHEDULER, CONTROLLER_MANAGER, KWOK, KUEUE))
    plane.start()
    try:
        asyncio.run(setup(plane.kubeconfig, arms))
        gangcheck = deploy_gangcheck(plane.kubeconfig, workdir=workdir / "gangcheck")
        try:
            sim: ManagedProcess = start_sim_cloud(
                plane.kubeconfig,
                workdir=workdir / "sim",
                config_map=SIM_CONFIG_MAP,
                config=sim_config(arms, stockout_fails_after),
            )
            try:
                yield plane
            finally:
                sim.stop()
        finally:
            gangcheck.stop()
    finally:
        plane.stop()


def run(
    scenarios: Sequence[str],
    horizon: float,
    *,
    keep: bool = False,
    stockout_fails_after: float | None = None,
) -> dict[str, Any]:
    stamp = int(time.time()) % 100000
    arms = [Arm(s, side) for s in scenarios for side in SIDES]
    for arm in arms:
        arm.namespace = f"{arm.name}-{stamp}"
    workdir = Path(tempfile.mkdtemp(prefix="capacity-sources-"))
    try:
        with stack(workdir, arms, stockout_fails_after) as plane:
            span = asyncio.run(measure(plane.kubeconfig, arms, horizon))
    finally:
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "horizon_s": round(span, 1),
        "members": MEMBERS,
        "scenarios": {s: {a.side: figures(a) for a in arms if a.scenario == s} for s in scenarios},
        "settings": settings_lines(stockout_fails_after),
    }


def figures(arm: Arm) -> dict[str, Any]:
    started = None if arm.started_at is None else round(arm.started_at - arm.job_created, 1)
    first = [n for n, p in arm.place_of.items() if p == arm.first_place]
    return {
        "time_to_start_s": started,
        "stranded_node_min": round(sum(arm.idle.values()) / 60, 2),
        "stranded_node_min_first_place": round(sum(arm.idle.get(n, 0.0) for n in first) / 60, 2),
        "thrown_node_min_first_place": round(
            sum(arm.idle.get(n, 0.0) for n in first if n not in arm.carried) / 60, 2
        ),
        "nodes_seen": len(arm.place_of),
        "nodes_seen_first_place": len(first),
        "nodes_left": sum(arm.left.values()),
        "nodes_left_first_place": arm.left.get(arm.first_place, 0),
        "requests": arm.requests,
        "check": arm.check_state,
        "message": arm.check_message,
    }


# -- the table ---------------------------------------------------------------------------------

TITLES = {
    "stockout": "1. pool A stocked out, pool B has room",
    "partial": f"2. pool A delivers {DELIVERED} of {MEMBERS} nodes, pool B all",
    "racks": f"3. one rack required: rack 1 has room for {RACK1_MAX} nodes, rack 2 for all",
    "racks-sources": "3b. the same racks, gangcheck given them as capacity sources [rack 1, "
    "rack 2] (no annotation)",
}
FIRST_PLACE = {
    "stockout": "pool A",
    "partial": "pool A",
    "racks": "rack 1",
    "racks-sources": "rack 1",
}


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None:
        return "-"
    if theirs == 0:
        return "-" if ours else "1.00x"
    return f"{ours / theirs:.2f}x"


def rows(scenario: str, result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    g, k = result["scenarios"][scenario]["gangcheck"], result["scenarios"][scenario]["kueue"]
    first = FIRST_PLACE[scenario]

    def start(f: dict[str, Any]) -> str:
        return "did not start" if f["time_to_start_s"] is None else f"{f['time_to_start_s']} s"

    def number(key: str) -> tuple[str, str, str]:
        return str(g[key]), str(k[key]), _ratio(g[key], k[key])

    horizon = result["horizon_s"]
    start_ratio = _ratio(
        g["time_to_start_s"] if g["time_to_start_s"] is not None else None,
        k["time_to_start_s"] if k["time_to_start_s"] is not None else None,
    )
    if g["time_to_start_s"] is not None and k["time_to_start_s"] is None:
        start_ratio = f"< {g['time_to_start_s'] / horizon:.2f}x"
    return [
        ("time to start (Job -> all pods Running)", start(g), start(k), start_ratio),
        ("stranded node-minutes, total", *number("stranded_node_min")),
        (f"  of which in {first}", *number("stranded_node_min_first_place")),
        (
            f"  thrown away in {first} (ran no member)",
            *number("thrown_node_min_first_place"),
        ),
        (
            f"nodes that came, in {first}",
            str(g["nodes_seen_first_place"]),
            str(k["nodes_seen_first_place"]),
            "",
        ),
        ("nodes that came, in all", str(g["nodes_seen"]), str(k["nodes_seen"]), ""),
        (f"nodes left behind at the end, in {first}", *number("nodes_left_first_place")),
        ("nodes left behind at the end, in all", *number("nodes_left")),
        ("ProvisioningRequests at the end", str(len(g["requests"])), str(len(k["requests"])), ""),
    ]


def settings_lines(stockout_fails_after: float | None = None) -> list[str]:
    concurrency = ", ".join(f"{k} {v}" for k, v in KUEUE_SHIPPED_CONCURRENCY.items())
    return [
        f"Kueue v0.17 (as its manifests ship it): groupKindConcurrency {concurrency}; leader "
        "election off, internal cert management off (the local stack); ClusterQueue with two "
        "flavors [A, B] (racks: [rack 1, rack 2]), each with its own AdmissionCheck (onFlavors) "
        "and ProvisioningRequestConfig (class best-effort-atomic-scale-up only: retryStrategy "
        "at its defaults, backoffLimitCount 3, backoffBaseSeconds 60); flavorFungibility default",
        f"gangcheck: its own process at its defaults; AtomicProvisioningConfig managedResources "
        f"[{GPU}], fulfillment.reclaimer DeleteNode (default CordonAndTaint); stockout/partial: "
        f"capacitySources [pool A (deadlineSeconds {SOURCE_DEADLINE}), pool B], InOrder; racks: "
        f"one flavor over both racks, the Job annotated {REQUIRED_TOPOLOGY}; racks-sources: "
        f"capacitySources [rack 1 (deadlineSeconds {SOURCE_DEADLINE}), rack 2]; other fields at "
        "their defaults (deadlineSeconds 420, retryStrategy 3 / 60 s)",
        f"cloud: simulated, nodes of {NODE_SHAPE['cpu']} cpu, {NODE_SHAPE['memory']}, 1 GPU "
        f"(one member each), about 1 s per node; gang: a Job of {MEMBERS} pods of 1 GPU; "
        "kube-scheduler and kwok start the pods; pool A's stockout: "
        + (
            f"its requests Failed {stockout_fails_after:.0f} s after CapacityIsNotFound"
            if stockout_fails_after is not None
            else "CapacityIsNotFound, never Failed (as cluster-autoscaler within 7 days)"
        ),
    ]


def print_tables(result: dict[str, Any]) -> None:
    print(f"\n{result['members']}-pod gangs, horizon {result['horizon_s']:.0f} s, one run")
    for scenario, sides in result["scenarios"].items():
        print(f"\n{TITLES[scenario]}")
        head = ("", LABELS["gangcheck"], LABELS["kueue"], "ratio")
        print(f"{head[0]:42} {head[1]:>28} {head[2]:>26} {head[3]:>8}")
        for label, a, b, ratio in rows(scenario, result):
            print(f"{label:42} {a:>28} {b:>26} {ratio:>8}")
        for side in SIDES:
            f = sides[side]
            print(f"  {side} check at the end: {f['check'] or '-'}; {f['message'] or ''}")
    for line in result["settings"]:
        print(f"settings: {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--horizon", type=float, default=180.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument(
        "--stockout-fails-after",
        type=float,
        help="pool A's stocked-out requests turn Failed this many seconds after "
        "CapacityIsNotFound (default: never, as cluster-autoscaler within 7 days)",
    )
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    result = run(
        scenarios, args.horizon, keep=args.keep, stockout_fails_after=args.stockout_fails_after
    )
    print_tables(result)
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
