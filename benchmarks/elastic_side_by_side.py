"""One scale-up of an elastic Job, two checks, side by side: gangcheck's check beside Kueue's
own ProvisioningRequest check, each on a Job of BEFORE pods scaled to AFTER (Kueue's workload
slices, ``ElasticJobsViaWorkloadSlices``, on in the test bed).

Kueue v0.17's ProvisioningRequest check has no code for slices
(``pkg/controller/admissionchecks/provisioning`` never reads ``pkg/workloadslicing``): the new
slice is a Workload like any other, so its request is sized by ``mergePodSets`` from the
slice's admitted count, the Job's whole new size (AFTER, not the AFTER - BEFORE added), and the
check turns Ready on ``Provisioned=True``. gangcheck asks for the difference only
(docs/elastic.md) and turns Ready when the added members fit on nodes that exist.

Everything is real but the cloud: one local stack (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kwok, Kueue v0.17 with its controllers' concurrency as its manifests
ship it; no cluster-autoscaler), gangcheck as its own process (its ServiceAccount's rights),
and the simulated cloud (``gangcheck_dev sim-cloud``) answering both sides' ProvisioningRequests
(class ``best-effort-atomic-scale-up``) by creating kwok Nodes, one GPU each, in a node group
of each side's own (so nothing of one side can serve the other). Kueue admits the Jobs and its
slices, kube-scheduler binds the pods, kwok runs them. Nothing plays Kueue. Both sides run at
once, each in a namespace and ClusterQueue of its own.

Per side, from the scale-up (``spec.parallelism`` BEFORE -> AFTER), sampled every SAMPLE s
over the horizon:
- time to AFTER Running (or "did not reach");
- the nodes that came for the scale-up, and the pods the scale-up's ProvisioningRequest asked
  for;
- stranded node-minutes: node time of the side's nodes running no member of the Job;
- nodes left at the end running no member;
- the BEFORE members that ran at the scale-up: how many still run, on the node they ran on;
- the new slice's check state (and message) at the end.

Usage: python benchmarks/elastic_side_by_side.py [--horizon SECONDS] [--json]
It starts (and stops) the stack, gangcheck and the simulated cloud.
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
from gangcheck_dev.testbed.stack import CONTROLLER_MANAGER, KUEUE, KWOK, SCHEDULER

from benchmarks.capacity_sources import (
    GPU,
    KUEUE_CONTROLLER,
    NODE_SHAPE,
    OUR_CONTROLLER,
    PROVREQ_CONFIG,
    BenchPlane,
    get_or_empty,
    is_true,
    params,
)
from benchmarks.kueue_scale import KUEUE_SHIPPED_CONCURRENCY
from gangcheck.kube.client import Kube
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
)

Obj = dict[str, Any]

BEFORE, AFTER = 4, 8
SAMPLE = 0.5
SIDES = ("gangcheck", "kueue")
LABELS = {"gangcheck": "gangcheck's check", "kueue": "Kueue's ProvisioningRequest check"}
ARM_LABEL = "gangcheck.io/bench-arm"
ELASTIC = "kueue.x-k8s.io/elastic-job"
REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
HOLD_AS = "gangcheck.io/hold-as"
CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
SIM_CONFIG_MAP = "gangcheck-system/bench-sim-cloud"
MAX_NODES = 3 * AFTER
#: gangcheck's settings that are not its defaults (stated under the table).
GANGCHECK_FULFILLMENT = {"reclaimer": "DeleteNode"}


@dataclass
class Side:
    side: str
    namespace: str = ""
    nodes_before: set[str] = field(default_factory=set)
    members_before: dict[str, str] = field(default_factory=dict)  # pod -> node at the scale-up
    scaled_at: float = 0.0
    reached_at: float | None = None
    stranded_s: float = 0.0
    nodes_seen: set[str] = field(default_factory=set)
    idle_now: set[str] = field(default_factory=set)
    members_kept: int = 0
    running_end: int = 0
    asked: list[str] = field(default_factory=list)  # request name: pods asked
    check_state: str = ""
    check_message: str = ""
    held_as: list[str] = field(default_factory=list)  # gangcheck: whose hold its nodes carry
    slice_asked: int | None = None  # pods the new slice's request asked for
    first_left: int = 0  # requests of the first slice still there at the end

    @property
    def name(self) -> str:
        return f"elastic-{self.side}"


def sim_config(sides: Sequence[Side]) -> Obj:
    return {
        "namespaces": [s.namespace for s in sides],
        "nodeGroups": [
            {
                "name": s.name,
                "maxNodes": MAX_NODES,
                **NODE_SHAPE,
                "labels": {ARM_LABEL: s.name},
            }
            for s in sides
        ],
        "scenarios": [{"name": "whole", "nodeDelaySeconds": 1, "bookingSeconds": 3600}],
    }


def quota() -> list[Obj]:
    return [
        {"name": "cpu", "nominalQuota": str(4 * AFTER)},
        {"name": "memory", "nominalQuota": f"{4 * AFTER}Gi"},
        {"name": GPU, "nominalQuota": str(2 * AFTER)},
    ]


async def make_side(kube: Kube, s: Side) -> None:
    """Namespace, flavor, check (+ its config), ClusterQueue and LocalQueue ``lq`` of a side."""
    await kube.create(NAMESPACE, {"metadata": {"name": s.namespace}})
    await kube.create(
        RESOURCE_FLAVOR, {"metadata": {"name": s.name}, "spec": {"nodeLabels": {ARM_LABEL: s.name}}}
    )
    if s.side == "gangcheck":
        spec = {"managedResources": [GPU], "fulfillment": dict(GANGCHECK_FULFILLMENT)}
        await kube.create(ATOMIC_CONFIG, {"metadata": {"name": s.name}, "spec": spec})
        check = {
            "controllerName": OUR_CONTROLLER,
            "parameters": params("gangcheck.io", "AtomicProvisioningConfig", s.name),
        }
    else:
        await kube.create(
            PROVREQ_CONFIG,
            {"metadata": {"name": s.name}, "spec": {"provisioningClassName": CLASS}},
        )
        check = {
            "controllerName": KUEUE_CONTROLLER,
            "parameters": params("kueue.x-k8s.io", "ProvisioningRequestConfig", s.name),
        }
    await kube.create(ADMISSION_CHECK, {"metadata": {"name": s.name}, "spec": check})
    group: Obj = {
        "coveredResources": ["cpu", "memory", GPU],
        "flavors": [{"name": s.name, "resources": quota()}],
    }
    await kube.create(
        CLUSTER_QUEUE,
        {
            "metadata": {"name": s.name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [group],
                "admissionChecksStrategy": {"admissionChecks": [{"name": s.name}]},
            },
        },
    )
    await kube.create(
        LOCAL_QUEUE, {"metadata": {"name": "lq"}, "spec": {"clusterQueue": s.name}}, s.namespace
    )


def elastic_job() -> Obj:
    """A Job of BEFORE pods of one GPU that may grow (no completions: parallelism scales)."""
    return {
        "metadata": {
            "name": "gang",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
            "annotations": {ELASTIC: "true"},
        },
        "spec": {
            "suspend": True,
            "parallelism": BEFORE,
            "backoffLimit": 0,
            "template": {
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


async def wait_active(kube: Kube, sides: Sequence[Side], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for s in sides:
        for res in (CLUSTER_QUEUE, ADMISSION_CHECK):
            while not is_true(await get_or_empty(kube, res, s.name), "Active"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{res.kind} {s.name} not Active after {timeout:.0f}s")
                await asyncio.sleep(0.25)


async def running_members(kube: Kube, s: Side) -> dict[str, str]:
    pods = (await kube.list_objects(POD, s.namespace)).get("items") or []
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
    }


async def side_nodes(kube: Kube, s: Side) -> set[str]:
    nodes = (await kube.list_objects(NODE)).get("items") or []
    return {
        n["metadata"]["name"]
        for n in nodes
        if (n["metadata"].get("labels") or {}).get(ARM_LABEL) == s.name
    }


async def until_before_runs(kube: Kube, sides: Sequence[Side], timeout: float) -> None:
    """Each side's Job at BEFORE Running; its members and nodes then recorded."""
    deadline = time.monotonic() + timeout
    for s in sides:
        while len(members := await running_members(kube, s)) < BEFORE:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{s.side}: {len(members)} of {BEFORE} running after {timeout}s")
            await asyncio.sleep(SAMPLE)
        s.members_before = members
        s.nodes_before = await side_nodes(kube, s)


async def sample(kube: Kube, sides: Sequence[Side], dt: float) -> None:
    for s in sides:
        members = await running_members(kube, s)
        nodes = await side_nodes(kube, s)
        s.nodes_seen |= nodes
        busy = set(members.values())
        s.idle_now = nodes - busy
        s.stranded_s += dt * len(s.idle_now)
        if s.reached_at is None and len(members) >= AFTER:
            s.reached_at = time.monotonic()


async def finish(kube: Kube, s: Side) -> None:
    members = await running_members(kube, s)
    s.running_end = len(members)
    s.members_kept = sum(1 for p, n in s.members_before.items() if members.get(p) == n)
    requests = (await kube.list_objects(PROVISIONING_REQUEST, s.namespace))["items"]
    workloads = (await kube.list_objects(WORKLOAD, s.namespace))["items"]
    slice_names = [
        w["metadata"]["name"]
        for w in workloads
        if REPLACEMENT_FOR in (w["metadata"].get("annotations") or {})
    ]
    for r in requests:  # requests are named <workload>-<check>-<attempt>
        name = r["metadata"]["name"]
        pods = sum(int(p.get("count", 0)) for p in r["spec"]["podSets"])
        whose = "slice" if any(name.startswith(f"{n}-") for n in slice_names) else "first"
        s.asked.append(f"{name} ({whose}): {pods}")
        if whose == "slice":
            s.slice_asked = pods
        else:
            s.first_left += 1
    s.asked.sort()
    s.held_as = sorted(
        f"{r['metadata']['name']} held as {held}"
        for r in requests
        if (held := (r["metadata"].get("annotations") or {}).get(HOLD_AS))
    )
    for wl in workloads:
        if REPLACEMENT_FOR not in (wl["metadata"].get("annotations") or {}):
            continue
        states = (wl.get("status") or {}).get("admissionChecks") or []
        s.check_state = ", ".join(str(c.get("state")) for c in states)
        s.check_message = "; ".join(str(c.get("message", ""))[:200] for c in states)
        if is_true(wl, "Admitted"):
            s.check_state += " (slice admitted)"


async def measure(kubeconfig: Path, sides: Sequence[Side], horizon: float) -> float:
    async with await Kube.connect(str(kubeconfig)) as kube:
        await wait_active(kube, sides)
        for s in sides:
            await kube.create(JOB, elastic_job(), s.namespace)
        await until_before_runs(kube, sides, timeout=120)
        for s in sides:
            await kube.merge_patch(JOB, "gang", {"spec": {"parallelism": AFTER}}, s.namespace)
            s.scaled_at = time.monotonic()
        begin = last = time.monotonic()
        while time.monotonic() - begin < horizon:
            await asyncio.sleep(SAMPLE)
            now = time.monotonic()
            await sample(kube, sides, now - last)
            last = now
        for s in sides:
            await finish(kube, s)
        return last - begin


async def setup(kubeconfig: Path, sides: Sequence[Side]) -> None:
    async with await Kube.connect(str(kubeconfig)) as kube:
        for s in sides:
            await make_side(kube, s)


@contextlib.contextmanager
def stack(workdir: Path, sides: Sequence[Side]) -> Iterator[ControlPlane]:
    plane = BenchPlane(components=(SCHEDULER, CONTROLLER_MANAGER, KWOK, KUEUE))
    plane.start()
    try:
        asyncio.run(setup(plane.kubeconfig, sides))
        gangcheck = deploy_gangcheck(plane.kubeconfig, workdir=workdir / "gangcheck")
        try:
            sim: ManagedProcess = start_sim_cloud(
                plane.kubeconfig,
                workdir=workdir / "sim",
                config_map=SIM_CONFIG_MAP,
                config=sim_config(sides),
            )
            try:
                yield plane
            finally:
                sim.stop()
        finally:
            gangcheck.stop()
    finally:
        plane.stop()


def run(horizon: float, *, keep: bool = False) -> dict[str, Any]:
    stamp = int(time.time()) % 100000
    sides = [Side(side) for side in SIDES]
    for s in sides:
        s.namespace = f"{s.name}-{stamp}"
    workdir = Path(tempfile.mkdtemp(prefix="elastic-side-by-side-"))
    try:
        with stack(workdir, sides) as plane:
            span = asyncio.run(measure(plane.kubeconfig, sides, horizon))
    finally:
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "horizon_s": round(span, 1),
        "before": BEFORE,
        "after": AFTER,
        "sides": {s.side: figures(s) for s in sides},
        "settings": settings_lines(),
    }


def figures(s: Side) -> dict[str, Any]:
    reached = None if s.reached_at is None else round(s.reached_at - s.scaled_at, 1)
    return {
        "time_to_after_s": reached,
        "nodes_came": len(s.nodes_seen - s.nodes_before),
        "stranded_node_min": round(s.stranded_s / 60, 2),
        "nodes_idle_at_end": len(s.idle_now),
        "members_before": len(s.members_before),
        "members_kept": s.members_kept,
        "running_at_end": s.running_end,
        "requests": s.asked,
        "slice_asked": s.slice_asked,
        "first_requests_left": s.first_left,
        "held_as": s.held_as,
        "check": s.check_state,
        "message": s.check_message,
    }


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    g, k = result["sides"]["gangcheck"], result["sides"]["kueue"]

    def reached(f: dict[str, Any]) -> str:
        return "did not reach" if f["time_to_after_s"] is None else f"{f['time_to_after_s']} s"

    def kept(f: dict[str, Any]) -> str:
        return f"{f['members_kept']} of {f['members_before']} on their nodes"

    def asked(f: dict[str, Any]) -> str:
        return "-" if f["slice_asked"] is None else f"{f['slice_asked']} pods"

    def left(f: dict[str, Any]) -> str:
        return "kept" if f["first_requests_left"] else "withdrawn"

    after = result["after"]
    return [
        (f"scale-up -> {after} Running", reached(g), reached(k)),
        ("the new slice's ProvisioningRequest asked for", asked(g), asked(k)),
        ("the first slice's ProvisioningRequest", left(g), left(k)),
        ("nodes that came for the scale-up", str(g["nodes_came"]), str(k["nodes_came"])),
        ("stranded node-minutes", str(g["stranded_node_min"]), str(k["stranded_node_min"])),
        (
            "nodes running no member at the end",
            str(g["nodes_idle_at_end"]),
            str(k["nodes_idle_at_end"]),
        ),
        ("the running members", kept(g), kept(k)),
        ("pods Running at the end", str(g["running_at_end"]), str(k["running_at_end"])),
        ("the new slice's check at the end", g["check"] or "-", k["check"] or "-"),
    ]


def settings_lines() -> list[str]:
    concurrency = ", ".join(f"{k} {v}" for k, v in KUEUE_SHIPPED_CONCURRENCY.items())
    return [
        f"Kueue v0.17 (as its manifests ship it): groupKindConcurrency {concurrency}; feature "
        "gate ElasticJobsViaWorkloadSlices on (the test bed); leader election off, internal "
        "cert management off (the local stack); one flavor and one AdmissionCheck per side; "
        f"Kueue's side: ProvisioningRequestConfig with provisioningClassName {CLASS} only "
        "(retryStrategy and the rest at their defaults)",
        f"gangcheck: its own process at its defaults; AtomicProvisioningConfig managedResources "
        f"[{GPU}], fulfillment.reclaimer DeleteNode (default CordonAndTaint); other fields at "
        "their defaults (NodesFit, deadlineSeconds 420, retryStrategy 3 / 60 s)",
        f"cloud: simulated, nodes of {NODE_SHAPE['cpu']} cpu, {NODE_SHAPE['memory']}, 1 GPU "
        f"(one member each), about 1 s per node, up to {MAX_NODES} per side, every request "
        f"delivered whole, no scale-down; Job: kueue.x-k8s.io/elastic-job, {BEFORE} pods of "
        f"1 GPU scaled to {AFTER} once {BEFORE} run; kube-scheduler and kwok start the pods",
    ]


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nan elastic Job scaled {result['before']} -> {result['after']}, horizon "
        f"{result['horizon_s']:.0f} s from the scale-up, one run"
    )
    head = ("", LABELS["gangcheck"], LABELS["kueue"])
    print(f"{head[0]:46} {head[1]:>30} {head[2]:>36}")
    for label, a, b in rows(result):
        print(f"{label:46} {a:>30} {b:>36}")
    for side in SIDES:
        f = result["sides"][side]
        print(f"  {side} requests at the end (pods asked): {', '.join(f['requests']) or '-'}")
        if f["held_as"]:
            print(f"  {side} the added nodes held as: {', '.join(f['held_as'])}")
        print(f"  {side} check message: {f['message'] or '-'}")
    for line in result["settings"]:
        print(f"settings: {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--horizon", type=float, default=60.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args(argv)
    result = run(args.horizon, keep=args.keep)
    print_table(result)
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
