"""Across clusters, four ways side by side: where MultiKueue sends a gang and what each worker
scales up for it (issue 33).

(a) Kueue's AllAtOnce dispatcher + Kueue's built-in ProvisioningRequest check in the workers;
(b) Kueue's Incremental dispatcher + Kueue's check;
(c) AllAtOnce + gangcheck as the workers' check;
(d) gangcheck's dispatcher (``gangcheck run --role dispatcher``) + gangcheck.

Everything is real but the cloud: the multi-cluster test bed
(:mod:`gangcheck_dev.testbed.multicluster`: a manager with etcd, kube-apiserver, the garbage
collector and Kueue v0.17 with MultiKueue; two workers each with etcd, kube-apiserver,
kube-scheduler, kube-controller-manager, kwok and Kueue), every Kueue with its controllers'
concurrency as its manifests ship it; in each worker gangcheck as its own process (its
ServiceAccount's rights) and the simulated cloud answering the ProvisioningRequests of both
checks (class ``best-effort-atomic-scale-up``) by creating real kwok Nodes. MultiKueue copies
the Jobs, kube-scheduler binds the pods, kwok runs them. Nothing plays Kueue.

Four scenarios, each a burst of GANGS gangs (a Job of MEMBERS pods of 8 GPUs, one pod per
8-GPU node), the worker clouds' room in nodes:

- ``stockout``: worker-1 stocked out (room for no node: ``CapacityIsNotFound``), worker-2
  room for every gang;
- ``room``: both workers with room for every gang;
- ``half``: each worker with room for half the gangs;
- ``learned``: as ``stockout``, after a first wave of as many gangs of the same flavors, run
  to their start (or the horizon) in the same namespace before the measured gangs are made,
  and left running: what each side kept of it (the dispatcher's give-ups and what gangcheck
  in worker-1 publishes; Kueue's dispatchers choose without such a record) is there when
  the measured gangs come, ``SETTLE`` seconds after the first wave started. worker-2 has
  room for both waves. A stockout lasts (a region out of a GPU type stays so for hours):
  ``stockout`` is its first minute, ``learned`` the rest of it.

The configurations run one after another on one bed: (a) and (c) under AllAtOnce, then (b)
(the manager's Kueue restarted with Incremental), then (d) (restarted with gangcheck's
dispatcher name, the dispatcher deployed with the RBAC of ``manifests/dispatcher``); each
scenario in a namespace and queues of its own, a node group of its own in each cloud, and
between two runs every Job, request and node of the run is removed (so neither the clouds'
room nor the dispatcher's view of the workers carries over; the give-ups the dispatcher keeps
for 120 s after a gang's deletion, and the outcomes each worker's gangcheck publishes on its
AdmissionCheck, count only for gangs of the same flavors, and each run's flavor, in the manager
and in the workers, is named for its namespace).

Per gang, over a fixed horizon from the Jobs' creation, sampled every SAMPLE seconds:

- the clusters that scaled up for it: the workers whose cloud delivered a node for one of
  its requests (the cloud's ``NodeDelivered`` Events, which outlive the nodes, and the
  nodes seen);
- stranded node-minutes, as ``benchmarks/capacity_sources.py`` counts them, for several
  gangs: node time of the nodes that came for the gang (the cloud records on each node the
  request it came for) while they run no member of a gang that has started (all its pods
  Running): nodes waiting for their gang, or left behind; and of which in the clusters the
  gang did not run in. Kueue's check does not keep a gang's nodes for it, so a member may run
  on a node that came for the other gang: the node is of use, whichever gang it came for;
- Job -> all pods Running (in one worker), or "did not start".

With ``--trace``, each run also watches, in every cluster, the run's Workloads,
ProvisioningRequests, pods and nodes, and prints per gang when each changed, from the Job's
creation (seconds, as the watch event arrived here): the manager's Workload created, quota
reserved, the dispatcher's record and nomination written, each worker's copy created, its
check's state and message, gangcheck's or Kueue's request and its conditions, the nodes,
the admissions, the pods Running. That is where a gang's time goes; a table after the
figures gives per gang when it reached each milestone (MILESTONES: nominated, request made,
Provisioned, its nodes created, check Ready, copy Admitted, placed by MultiKueue, all pods
Running; a worker's milestones in the worker it ran in), and how long MultiKueue took to place
it once its copy was admitted (Kueue v0.17 acts on a worker's change after a 1 s batch, on a
change of the manager's Workload at once).

With ``--runs K`` each configuration runs its scenarios K times (one after another, on the
same bed), the table above shows the first run, and a summary after it gives per scenario and
configuration, over every gang of the K runs: Job -> all pods Running (median and worst;
sampled, and with ``--trace`` as the watch saw it), how many started, the clusters scaled up
per gang and the stranded node-minutes elsewhere in all. One run moves by up to a second per
gang (kube-scheduler's retries, MultiKueue's batches): a comparison of start times reads the
medians of several runs.

Usage: python benchmarks/multicluster_side_by_side.py [--horizon S] [--configs a,b,c,d]
[--scenarios stockout,room,half,learned] [--gangs N] [--runs K] [--json] [--trace]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gangcheck_dev.simcloud.cloud import DELIVERED_REASON
from gangcheck_dev.simcloud.model import NODEGROUP_LABEL, REQUEST_ANNOTATION
from gangcheck_dev.testbed.deploy import (
    ManagedProcess,
    deploy_dispatcher,
    deploy_gangcheck,
    start_sim_cloud,
)
from gangcheck_dev.testbed.multicluster import (
    ALL_AT_ONCE,
    CHECK,
    INCREMENTAL,
    WORKERS,
    MultiCluster,
)

from benchmarks.kueue_scale import KUEUE_SHIPPED_CONCURRENCY
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    EVENT,
    JOB,
    LOCAL_QUEUE,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    SERVICE_ACCOUNT,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.dispatch import DISPATCHER

Obj = dict[str, Any]

GANGS = 2
MEMBERS = 2
GPU = "nvidia.com/gpu"
SAMPLE = 0.5
HORIZON = 45.0
MANAGER = "manager"
W1, W2 = WORKERS
CONFIGS = ("a", "b", "c", "d")
#: The order they run in: the manager's Kueue restarted as few times as can be.
RUN_ORDER = ("a", "c", "b", "d")
LABELS = {
    "a": "(a) AllAtOnce + Kueue's check",
    "b": "(b) Incremental + Kueue's check",
    "c": "(c) AllAtOnce + gangcheck",
    "d": "(d) gangcheck's dispatcher + gangcheck",
}
DISPATCHERS = {"a": ALL_AT_ONCE, "b": INCREMENTAL, "c": ALL_AT_ONCE, "d": DISPATCHER}
CHECK_KIND = {"a": "kueue", "b": "kueue", "c": "gangcheck", "d": "gangcheck"}
SCENARIOS = ("stockout", "room", "half", "learned")
TITLES = {
    "stockout": "1. worker-1 stocked out, worker-2 has room for every gang",
    "room": "2. both workers have room for every gang",
    "half": "3. each worker has room for half the gangs",
    "learned": "4. as 1, after a first wave of as many gangs of the same flavors, left running",
}
#: The scenarios whose measured gangs come after a first wave (``first_wave``).
AFTER_A_WAVE = frozenset({"learned"})
#: Seconds between the first wave's start and the measured gangs, and after each run's
#: removals before the next run: MultiKueue's remote clients run at client-go's default 5
#: requests/s per worker (Kueue v0.17 builds them from the kubeconfig without a QPS), and
#: every change of a manager's Workload has it read the copy in each worker, so a first wave
#: leaves a backlog that would delay the next gangs' copies on both sides (and a run's
#: removals, the next run's); the measured gangs come once it is drained, as gangs of a
#: lasting stockout come over minutes, not in one burst.
SETTLE = 10.0
#: With ``--trace``, what a gang's time is read in (the table's columns), in order.
MILESTONES = (
    ("nominated", "nominated"),  # the manager's Workload names a worker (the dispatcher's)
    ("request", "request"),  # the worker's check made its ProvisioningRequest
    ("provisioned", "Provisioned"),  # the cloud said Provisioned=True
    ("nodes", "nodes"),  # the cloud's nodes for the gang created (MEMBERS of them)
    ("ready", "Ready"),  # the worker's check Ready
    ("admitted", "Admitted"),  # the worker's copy Admitted
    ("placed", "placed"),  # MultiKueue placed the manager's Workload there (clusterName)
    ("running", "Running"),  # all the gang's pods Running there
)
SCENARIO_LABEL = "gangcheck.io/bench-scenario"
OUR_CONTROLLER = "gangcheck.io/atomic-provisioning"
KUEUE_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PROVREQ_CONFIG = Resource(
    "kueue.x-k8s.io", "v1beta2", "provisioningrequestconfigs", "ProvisioningRequestConfig", False
)
SIM_CONFIG_MAP = "gangcheck-system/bench-multicluster-sim"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: gangcheck's settings in the workers that are not its defaults (printed under the tables).
GANGCHECK_DEADLINE = 15
GANGCHECK_BACKOFF = 5
GANGCHECK_RECLAIMER = "DeleteNode"


def room(scenario: str, worker: str, gangs: int) -> int:
    """Nodes the worker's cloud has room for in ``scenario``."""
    whole = gangs * MEMBERS
    if scenario == "stockout":
        return 0 if worker == W1 else whole
    if scenario in AFTER_A_WAVE:
        return 0 if worker == W1 else 2 * whole
    if scenario == "half":
        return (gangs // 2) * MEMBERS
    return whole


def sim_config(worker: str, gangs: int) -> Obj:
    groups = [
        {
            "name": f"bench-{scenario}",
            "maxNodes": room(scenario, worker, gangs),
            "cpu": "32",
            "memory": "256Gi",
            "gpus": 8,
            "labels": {SCENARIO_LABEL: scenario},
        }
        for scenario in SCENARIOS
    ]
    return {
        "provisioningClassNames": [CLASS],
        "nodeGroups": groups,
        "scenarios": [{"name": "whole", "bookingSeconds": 3600}],
    }


# -- one run ------------------------------------------------------------------------------------


@dataclass
class Gang:
    name: str
    created: float = 0.0
    started_at: float | None = None
    ran_in: str = ""
    cluster: str = ""  # the manager Workload's status.clusterName at the end
    idle: dict[tuple[str, str], float] = field(default_factory=dict)  # (worker, node) -> s
    seen: set[tuple[str, str]] = field(default_factory=set)
    idle_now: set[tuple[str, str]] = field(default_factory=set)
    scaled: set[str] = field(default_factory=set)

    @property
    def prefix(self) -> str:
        """How its Workload's name (and so its requests' names) begin."""
        return f"job-{self.name}-"

    def figures(self) -> Obj:
        outside = [k for k in self.idle if k[0] != self.ran_in]
        return {
            "gang": self.name,
            "clusters_scaled_up": sorted(self.scaled),
            "ran_in": self.ran_in or None,
            "stranded_node_min": round(sum(self.idle.values()) / 60, 2),
            "stranded_node_min_elsewhere": round(sum(self.idle[k] for k in outside) / 60, 2),
            "nodes_left": len(self.idle_now),
            "time_to_start_s": (
                None if self.started_at is None else round(self.started_at - self.created, 1)
            ),
        }


def gang_of(gangs: Sequence[Gang], request: str) -> Gang | None:
    for gang in gangs:
        if request.startswith(gang.prefix):
            return gang
    return None


async def items(kube: Kube, res: Resource, namespace: str | None = None, **kw: str) -> list[Obj]:
    return list((await kube.list_objects(res, namespace, **kw)).get("items") or [])


async def sample(
    kubes: Mapping[str, Kube], scenario: str, ns: str, gangs: Sequence[Gang], dt: float
) -> None:
    now = time.monotonic()
    for worker in WORKERS:
        kube = kubes[worker]
        nodes = await items(kube, NODE, label_selector=f"{NODEGROUP_LABEL}=bench-{scenario}")
        pods = await items(kube, POD, ns)
        running: dict[str, list[Obj]] = {}
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Running":
                job = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")
                running.setdefault(job, []).append(pod)
        for gang in gangs:
            mine = running.get(gang.name, [])
            if gang.started_at is None and len(mine) >= MEMBERS:
                gang.started_at, gang.ran_in = now, worker
        for gang in gangs:
            gang.idle_now = {k for k in gang.idle_now if k[0] != worker}
        # A node is of use while it runs a member of a gang that has started (a scheduler
        # may put one gang's member on another's node: Kueue's check holds none for its gang)
        busy = {
            p["spec"].get("nodeName")
            for gang in gangs
            if gang.started_at is not None and gang.ran_in == worker
            for p in running.get(gang.name, [])
        }
        for node in nodes:
            made_for = (node["metadata"].get("annotations") or {}).get(REQUEST_ANNOTATION, "")
            req_ns, _, request = made_for.partition("/")
            gang = gang_of(gangs, request) if req_ns == ns else None
            if gang is None:
                continue
            key = (worker, node["metadata"]["name"])
            gang.seen.add(key)
            gang.scaled.add(worker)
            if key[1] not in busy:
                gang.idle[key] = gang.idle.get(key, 0.0) + dt
                gang.idle_now.add(key)


class Tracer:
    """With ``--trace``: watches of the run's objects in every cluster, each change that
    matters to a gang's timeline kept as (seconds since ``t0``, cluster, what, gang)."""

    def __init__(self, kubes: Mapping[str, Kube], ns: str, scenario: str, gangs: Sequence[Gang]):
        self.kubes, self.ns, self.scenario, self.gangs = kubes, ns, scenario, gangs
        self.t0 = time.monotonic()
        self.lines: list[tuple[float, str, str, str]] = []
        #: (gang, cluster) -> milestone (MILESTONES) -> when first reached (since ``t0``)
        self.marks: dict[tuple[str, str], dict[str, float]] = {}
        self._seen: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._counted: dict[tuple[str, str, str], set[str]] = {}  # nodes, pods Running
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        opened: list[asyncio.Event] = []
        for cluster, kube in self.kubes.items():
            watched: list[tuple[Resource, str | None, str | None]] = [(WORKLOAD, self.ns, None)]
            if cluster != MANAGER:
                selector = f"{NODEGROUP_LABEL}=bench-{self.scenario}"
                watched += [
                    (PROVISIONING_REQUEST, self.ns, None),
                    (POD, self.ns, None),
                    (NODE, None, selector),
                ]
            for res, namespace, selector in watched:
                ready = asyncio.Event()
                opened.append(ready)
                self._tasks.append(
                    asyncio.create_task(
                        self._watch(
                            cluster,
                            kube=kube,
                            res=res,
                            namespace=namespace,
                            selector=selector,
                            ready=ready,
                        )
                    )
                )
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), 30)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _watch(
        self,
        cluster: str,
        *,
        kube: Kube,
        res: Resource,
        namespace: str | None,
        selector: str | None,
        ready: asyncio.Event,
    ) -> None:
        listing = await kube.list_objects(res, namespace, label_selector=selector)
        version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        while True:
            try:
                async for event in kube.watch(
                    res,
                    namespace,
                    resource_version=version,
                    label_selector=selector,
                    opened=ready.set,
                ):
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self._note(cluster, res, str(event.get("type")), obj)
            except ApiError:
                await asyncio.sleep(0.1)
            except Exception as exc:  # a defect here must not end the trace unseen
                self.lines.append((time.monotonic() - self.t0, cluster, f"trace broke: {exc}", ""))
                raise

    def _note(
        self, cluster: str, res: Resource, kind: str, obj: Obj, at: float | None = None
    ) -> None:
        at = time.monotonic() - self.t0 if at is None else at
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        gang = self._gang_of(res, obj)
        if gang is None:
            return
        key = (cluster, res.kind, name)
        if kind == "DELETED":
            self._seen.pop(key, None)
            self.lines.append((at, cluster, f"{res.kind} {name} deleted", gang.name))
            return
        self._reach(at, cluster, res, obj, gang)
        new = _signature(res, obj)
        old = self._seen.get(key)
        self._seen[key] = new
        if old is None:
            said = "created" if kind == "ADDED" else "seen"
            self.lines.append((at, cluster, f"{res.kind} {name} {said}: {_show(new)}", gang.name))
        elif new != old:
            changed = [str(a) for a in new if a not in old]  # checks come and go
            self.lines.append((at, cluster, f"{res.kind} {name}: {'; '.join(changed)}", gang.name))

    def _reach(self, at: float, cluster: str, res: Resource, obj: Obj, gang: Gang) -> None:
        """The milestones (MILESTONES) the object shows the gang at, each kept when first
        seen in that cluster."""
        status = obj.get("status") or {}
        reached: list[str] = []
        if res is WORKLOAD and cluster == MANAGER:
            reached += ["nominated"] if status.get("nominatedClusterNames") else []
            reached += ["placed"] if status.get("clusterName") else []
        elif res is WORKLOAD:
            checks = status.get("admissionChecks") or []
            reached += ["ready"] if any(c.get("state") == "Ready" for c in checks) else []
            reached += ["admitted"] if _is_true(status, "Admitted") else []
        elif res is PROVISIONING_REQUEST:
            reached += ["request", *(["provisioned"] if _is_true(status, "Provisioned") else [])]
        elif res is NODE or (res is POD and status.get("phase") == "Running"):
            what = "nodes" if res is NODE else "running"
            counted = self._counted.setdefault((gang.name, cluster, what), set())
            counted.add(str(obj["metadata"].get("name")))
            reached += [what] if len(counted) >= MEMBERS else []
        marks = self.marks.setdefault((gang.name, cluster), {})
        for milestone in reached:
            marks.setdefault(milestone, at)

    def milestones(self, gang: Gang) -> Obj:
        """When the gang reached each milestone, in seconds from its Job's creation: the
        manager's (nominated, placed) and those of the worker it ran in (where all its pods
        were seen Running, else where the sampler saw it start); None if not reached."""
        offset = gang.created - self.t0
        ran = [c for (g, c), m in self.marks.items() if g == gang.name and "running" in m]
        worker = min(ran, key=lambda c: self.marks[(gang.name, c)]["running"], default=gang.ran_in)
        marks = {
            **self.marks.get((gang.name, MANAGER), {}),
            **self.marks.get((gang.name, worker), {}),
        }
        out: Obj = {"worker": worker or None}
        for milestone, _ in MILESTONES:
            at = marks.get(milestone)
            out[milestone] = None if at is None else round(at - offset, 2)
        return out

    def _gang_of(self, res: Resource, obj: Obj) -> Gang | None:
        meta = obj.get("metadata") or {}
        if res is POD:
            job = (meta.get("labels") or {}).get(JOB_NAME_LABEL, "")
            return next((g for g in self.gangs if g.name == job), None)
        if res is NODE:
            made_for = (meta.get("annotations") or {}).get(REQUEST_ANNOTATION, "")
            req_ns, _, request = made_for.partition("/")
            return gang_of(self.gangs, request) if req_ns == self.ns else None
        return gang_of(self.gangs, str(meta.get("name") or ""))

    def timeline(self, gang: Gang) -> list[str]:
        offset = gang.created - self.t0
        return [
            f"{at - offset:7.2f} {cluster:9} {what}"
            for at, cluster, what, name in sorted(self.lines)
            if name == gang.name
        ]


def _is_true(status: Obj, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    )


def _signature(res: Resource, obj: Obj) -> tuple[Any, ...]:
    """What of an object the trace follows, as labelled strings (a change of any is noted)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conds = {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}

    def cond(kind: str) -> str:
        c = conds.get(kind)
        if c is None:
            return f"{kind}=-"
        reason = f" {c.get('reason')}" if c.get("status") != "True" or kind == "Provisioned" else ""
        return f"{kind}={c.get('status')}{reason}"

    if res is WORKLOAD:
        notes = meta.get("annotations") or {}
        record = notes.get("gangcheck.io/dispatch")
        if record:
            data = json.loads(record)
            failed = sorted(data.get("failed") or {})
            record = f"record nominated={data.get('nominated')} failed={failed}"
            if data.get("admitted"):
                record += f" admitted={data['admitted']}"
        checks = [
            f"check {c.get('name')}={c.get('state')}: {str(c.get('message') or '')[:90]}"
            for c in status.get("admissionChecks") or []
        ]
        return (
            cond("QuotaReserved"),
            cond("Admitted"),
            cond("Evicted"),
            f"nominatedClusterNames={status.get('nominatedClusterNames')}",
            f"clusterName={status.get('clusterName')}",
            f"{record or 'no record'}",
            *checks,
        )
    if res is PROVISIONING_REQUEST:
        notes = meta.get("annotations") or {}
        phase = notes.get("gangcheck.io/phase")
        return (
            cond("Accepted"),
            cond("Provisioned"),
            cond("Failed"),
            f"phase={phase}",
            f"deleting={bool(meta.get('deletionTimestamp'))}",
        )
    if res is POD:
        return (f"phase={status.get('phase')}", f"node={(obj.get('spec') or {}).get('nodeName')}")
    if res is NODE:  # when it turned Ready, and when gangcheck recorded it for a request
        arrived = (meta.get("annotations") or {}).get("gangcheck.io/arrived-for")
        return (
            cond("Ready"),
            f"arrived-for={arrived}",
            f"deleting={bool(meta.get('deletionTimestamp'))}",
        )
    return (f"deleting={bool(meta.get('deletionTimestamp'))}",)


def _show(signature: tuple[Any, ...]) -> str:
    return "; ".join(
        str(s) for s in signature if not str(s).endswith(("=-", "=None", "=False", "no record"))
    )


async def run_one(
    kubes: Mapping[str, Kube],
    config: str,
    scenario: str,
    gangs_n: int,
    horizon: float,
    *,
    trace: bool = False,
) -> list[Obj]:
    ns = f"{scenario}-{config}-{int(time.time()) % 100000}"
    async with queues(kubes, ns, config, scenario):
        if scenario in AFTER_A_WAVE:
            await first_wave(kubes, config, scenario, ns, gangs_n, horizon=horizon)
        gangs = [Gang(f"g{i + 1}") for i in range(gangs_n)]
        tracer = Tracer(kubes, ns, scenario, gangs) if trace else None
        if tracer is not None:
            await tracer.start()
        await launch(kubes, scenario, ns, gangs)
        await follow(kubes, scenario, ns, gangs, horizon)
        for worker in WORKERS:
            for event in await items(
                kubes[worker], EVENT, ns, field_selector=f"reason={DELIVERED_REASON}"
            ):
                gang = gang_of(gangs, str(event["involvedObject"].get("name", "")))
                if gang is not None:
                    gang.scaled.add(worker)
        for wl in await items(kubes[MANAGER], WORKLOAD, ns):
            gang = gang_of(gangs, wl["metadata"]["name"])
            if gang is not None:
                gang.cluster = str((wl.get("status") or {}).get("clusterName") or "")
        started = sum(1 for g in gangs if g.started_at is not None)
        print(f"  {LABELS[config]}, {scenario}: {started} of {gangs_n} started", file=sys.stderr)
        figures = [g.figures() for g in gangs]
        if tracer is not None:
            await tracer.stop()
            for gang, fig in zip(gangs, figures, strict=True):
                fig["trace"] = tracer.timeline(gang)
                fig["milestones"] = tracer.milestones(gang)
                print(f"  trace {LABELS[config]}, {scenario}, {gang.name}:", file=sys.stderr)
                for line in fig["trace"]:
                    print(f"    {line}", file=sys.stderr)
        try:
            return figures
        finally:
            await clean(kubes, ns, scenario)


async def first_wave(
    kubes: Mapping[str, Kube], config: str, scenario: str, ns: str, gangs_n: int, *, horizon: float
) -> None:
    """``gangs_n`` gangs (``w1``, ``w2``, ...) of the scenario's flavors, made at once and
    waited for until all started or ``horizon`` passed, then ``SETTLE`` seconds; left
    running. Said on stderr."""
    wave = [Gang(f"w{i + 1}") for i in range(gangs_n)]
    await launch(kubes, scenario, ns, wave)
    took = await follow(kubes, scenario, ns, wave, horizon, until_started=True)
    started = sum(1 for g in wave if g.started_at is not None)
    print(
        f"  {LABELS[config]}, {scenario}: first wave, {started} of {gangs_n} started in "
        f"{took:.1f} s; the measured gangs {SETTLE:.0f} s after",
        file=sys.stderr,
    )
    await asyncio.sleep(SETTLE)


async def launch(kubes: Mapping[str, Kube], scenario: str, ns: str, gangs: Sequence[Gang]) -> None:
    """Each gang's Job made in the manager, one after another, its time noted."""
    for gang in gangs:
        await kubes[MANAGER].create(JOB, gang_job(gang.name, scenario), ns)
        gang.created = time.monotonic()


async def follow(
    kubes: Mapping[str, Kube],
    scenario: str,
    ns: str,
    gangs: Sequence[Gang],
    horizon: float,
    *,
    until_started: bool = False,
) -> float:
    """The gangs sampled every SAMPLE s for ``horizon`` s (``until_started``: or until all
    started); the seconds it took."""
    begin = last = time.monotonic()
    while time.monotonic() - begin < horizon:
        if until_started and all(g.started_at is not None for g in gangs):
            break
        await asyncio.sleep(SAMPLE)
        now = time.monotonic()
        await sample(kubes, scenario, ns, gangs, now - last)
        last = now
    return time.monotonic() - begin


def gang_job(name: str, scenario: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "suspend": True,
            "parallelism": MEMBERS,
            "completions": MEMBERS,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi", GPU: "8"},
                                "limits": {GPU: "8"},
                            },
                        }
                    ],
                },
            },
        },
    }


def quota(nodes: int) -> list[Obj]:
    return [
        {"name": "cpu", "nominalQuota": str(32 * nodes)},
        {"name": "memory", "nominalQuota": f"{256 * nodes}Gi"},
        {"name": GPU, "nominalQuota": str(8 * nodes)},
    ]


def cluster_queue(name: str, checks: list[Obj], nodes: int) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [{"name": name, "resources": quota(nodes)}],
                }
            ],
            "admissionChecksStrategy": {"admissionChecks": checks},
        },
    }


@contextlib.asynccontextmanager
async def queues(
    kubes: Mapping[str, Kube], ns: str, config: str, scenario: str
) -> AsyncIterator[None]:
    """The namespace in every cluster; LocalQueue ``lq`` in each: in the manager through
    MultiKueue's check, in each worker through the configuration's check on a flavor pinned
    to the scenario's node group. Every queue object removed after."""
    made: list[tuple[Kube, Resource, str, str | None]] = []
    nodes = 64  # quota is never what holds a gang back

    async def create(kube: Kube, res: Resource, body: Obj, namespace: str | None = None) -> None:
        await kube.create(res, body, namespace)
        made.append((kube, res, body["metadata"]["name"], namespace))

    name = ns
    try:
        for kube in kubes.values():
            await kube.create(NAMESPACE, {"metadata": {"name": ns}})
        manager = kubes[MANAGER]
        await create(manager, RESOURCE_FLAVOR, {"metadata": {"name": name}})
        await create(manager, CLUSTER_QUEUE, cluster_queue(name, [{"name": CHECK}], nodes))
        lq = {"metadata": {"name": "lq"}, "spec": {"clusterQueue": name}}
        await create(manager, LOCAL_QUEUE, lq, ns)
        for worker in WORKERS:
            kube = kubes[worker]
            if CHECK_KIND[config] == "gangcheck":
                spec = {
                    "provisioningClassName": CLASS,
                    "managedResources": [GPU],
                    "retryStrategy": {"backoffBaseSeconds": GANGCHECK_BACKOFF},
                    "fulfillment": {
                        "deadlineSeconds": GANGCHECK_DEADLINE,
                        "reclaimer": GANGCHECK_RECLAIMER,
                    },
                }
                await create(kube, ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": spec})
                params = {"apiGroup": "gangcheck.io", "kind": "AtomicProvisioningConfig"}
                controller = OUR_CONTROLLER
            else:
                spec = {"provisioningClassName": CLASS}
                await create(kube, PROVREQ_CONFIG, {"metadata": {"name": name}, "spec": spec})
                params = {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig"}
                controller = KUEUE_CONTROLLER
            check = {"controllerName": controller, "parameters": {**params, "name": name}}
            await create(kube, ADMISSION_CHECK, {"metadata": {"name": name}, "spec": check})
            flavor = {"nodeLabels": {SCENARIO_LABEL: scenario}}
            await create(kube, RESOURCE_FLAVOR, {"metadata": {"name": name}, "spec": flavor})
            await create(kube, CLUSTER_QUEUE, cluster_queue(name, [{"name": name}], nodes))
            await create(kube, LOCAL_QUEUE, lq, ns)
        for cluster, kube in kubes.items():
            await until(lambda kube=kube: active(kube, name), f"{cluster}: queue {name} Active")
            if cluster != MANAGER:
                await until(
                    lambda kube=kube: exists(kube, SERVICE_ACCOUNT, "default", ns),
                    f"{cluster}: ServiceAccount {ns}/default",
                )
        yield
    finally:
        for kube, res, obj, namespace in reversed(made):
            with contextlib.suppress(ApiError):
                await kube.delete(res, obj, namespace)


async def active(kube: Kube, name: str) -> bool:
    found = await kube.get_if_exists(CLUSTER_QUEUE, name)
    conds = ((found or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conds)


async def exists(kube: Kube, res: Resource, name: str, ns: str) -> bool:
    return await kube.get_if_exists(res, name, ns) is not None


async def until(probe: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f}s: {what}")
        await asyncio.sleep(0.25)


async def clean(kubes: Mapping[str, Kube], ns: str, scenario: str) -> None:
    """Every Job, request and node of the run gone, and the namespace (so the next run starts
    on empty clouds and the dispatcher sees no node nor request of this one); then
    ``SETTLE`` seconds, so that MultiKueue's requests to the workers for the removals (at
    its clients' 5 per second) are not still queued when the next run's gangs come."""
    manager = kubes[MANAGER]
    for job in await items(manager, JOB, ns):
        with contextlib.suppress(ApiError):
            await manager.delete(JOB, job["metadata"]["name"], ns)

    async def manager_empty() -> bool:
        return not await items(manager, WORKLOAD, ns)

    await until(manager_empty, "the manager's Workloads gone")
    selector = f"{NODEGROUP_LABEL}=bench-{scenario}"
    for worker in WORKERS:
        kube = kubes[worker]
        for res in (JOB, PROVISIONING_REQUEST):
            for obj in await items(kube, res, ns):
                with contextlib.suppress(ApiError):
                    await kube.delete(res, obj["metadata"]["name"], ns)
        # The pods before their nodes: a pod whose node is gone first stays Terminating until
        # the pod garbage collector's quarantine of such pods ends (40 s and its period).
        for pod in await items(kube, POD, ns):
            with contextlib.suppress(ApiError):
                await kube.delete(POD, pod["metadata"]["name"], ns, grace_period_seconds=0)
        for node in await items(kube, NODE, label_selector=selector):
            with contextlib.suppress(ApiError):
                await kube.delete(NODE, node["metadata"]["name"])

        async def empty(kube: Kube = kube) -> bool:
            return not (
                await items(kube, NODE, label_selector=selector)
                or await items(kube, POD, ns)
                or await items(kube, WORKLOAD, ns)
                or await items(kube, PROVISIONING_REQUEST, ns)
            )

        await until(empty, f"{worker}: the run's nodes, pods, Workloads and requests gone")
    for kube in kubes.values():
        with contextlib.suppress(ApiError):
            await kube.delete(NAMESPACE, ns)
    await asyncio.sleep(SETTLE)


async def run_config(
    bed: MultiCluster,
    config: str,
    scenarios: Sequence[str],
    gangs: int,
    horizon: float,
    *,
    trace: bool = False,
    runs: int = 1,
) -> list[dict[str, list[Obj]]]:
    """Per run, each scenario's figures (``runs`` of them, one after another)."""
    async with contextlib.AsyncExitStack() as stack:
        kubes = {
            name: await stack.enter_async_context(await Kube.connect(str(plane.kubeconfig)))
            for name, plane in bed.planes.items()
        }
        return [
            {s: await run_one(kubes, config, s, gangs, horizon, trace=trace) for s in scenarios}
            for _ in range(runs)
        ]


# -- the bed ------------------------------------------------------------------------------------


@contextlib.contextmanager
def testbed(workdir: Path, gangs: int) -> Iterator[tuple[MultiCluster, list[ManagedProcess]]]:
    """The bed, Kueue as its manifests ship it everywhere; in each worker the simulated cloud
    and gangcheck. Stopped after, whatever fails."""
    bed = MultiCluster(
        workdir / "planes",
        kueue_overrides={"controller": {"groupKindConcurrency": dict(KUEUE_SHIPPED_CONCURRENCY)}},
    )
    bed.start()
    processes: list[ManagedProcess] = []
    try:
        for name, worker in bed.workers.items():
            processes.append(
                start_sim_cloud(
                    worker.kubeconfig,
                    workdir=workdir / name,
                    config_map=SIM_CONFIG_MAP,
                    config=sim_config(name, gangs),
                    kubectl=worker.kubectl,
                )
            )
            processes.append(
                deploy_gangcheck(worker.kubeconfig, workdir=workdir / name, kubectl=worker.kubectl)
            )
        yield bed, processes
    finally:
        stop_all(processes)
        bed.stop()


def stop_all(processes: list[ManagedProcess]) -> None:
    for process in reversed(processes):
        try:
            process.stop()
        except Exception as exc:  # a refused write: said, never hidden
            print(f"{process.name}: {exc}", file=sys.stderr)
    processes.clear()


def run(
    configs: Sequence[str],
    scenarios: Sequence[str],
    gangs: int,
    horizon: float,
    keep: bool,
    *,
    trace: bool = False,
    runs: int = 1,
) -> Obj:
    workdir = Path(tempfile.mkdtemp(prefix="multicluster-bench-"))
    results: dict[str, list[dict[str, list[Obj]]]] = {}
    began = time.monotonic()
    try:
        with testbed(workdir, gangs) as (bed, processes):
            print(f"bed up in {time.monotonic() - began:.0f}s", file=sys.stderr)
            for config in [c for c in RUN_ORDER if c in configs]:
                bed.set_dispatcher(DISPATCHERS[config])
                if config == "d":
                    manager = bed.planes[MANAGER]
                    processes.append(
                        deploy_dispatcher(
                            manager.kubeconfig,
                            [w.kubeconfig for w in bed.workers.values()],
                            workdir=workdir / "dispatcher",
                            kubectl=manager.kubectl,
                        )
                    )
                results[config] = asyncio.run(
                    run_config(bed, config, scenarios, gangs, horizon, trace=trace, runs=runs)
                )
    finally:
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "gangs": gangs,
        "members": MEMBERS,
        "horizon_s": horizon,
        "runs": runs,
        "results": {s: {c: results[c][0][s] for c in CONFIGS if c in results} for s in scenarios},
        "every_run": {
            s: {c: [run[s] for run in results[c]] for c in CONFIGS if c in results}
            for s in scenarios
        },
        "settings": settings_lines(gangs),
        "took_s": round(time.monotonic() - began),
    }


# -- the table ----------------------------------------------------------------------------------


def table_lines(result: Obj) -> list[str]:
    out = [
        f"{result['gangs']} gangs of {result['members']} pods x 8 GPUs per scenario, "
        f"horizon {result['horizon_s']:.0f} s per run, "
        + ("one run" if result.get("runs", 1) == 1 else f"run 1 of {result['runs']}")
    ]
    gangs = result["gangs"]
    for scenario, by_config in result["results"].items():
        w1, w2 = (room(scenario, w, gangs) // MEMBERS for w in WORKERS)
        out += ["", f"{TITLES[scenario]} (room for {w1} and {w2} gangs)"]
        head = (
            f"{'':42} {'gang':>4} {'scaled up':>18} {'ran in':>9} {'stranded node-min':>17} "
            f"{'elsewhere':>9} {'Job -> all Running':>18}"
        )
        out.append(head)
        for config, figures in by_config.items():
            for i, f in enumerate(figures):
                label = LABELS[config] if i == 0 else ""
                scaled = ", ".join(f["clusters_scaled_up"]) or "none"
                start = (
                    "did not start" if f["time_to_start_s"] is None else f"{f['time_to_start_s']} s"
                )
                out.append(
                    f"{label:42} {f['gang']:>4} {scaled:>18} {f['ran_in'] or '-':>9} "
                    f"{f['stranded_node_min']:>17} {f['stranded_node_min_elsewhere']:>9} "
                    f"{start:>18}"
                )
    out += milestone_lines(result)
    out += runs_lines(result)
    out += [f"settings: {line}" for line in result["settings"]]
    return out


def runs_lines(result: Obj) -> list[str]:
    """With ``--runs`` K > 1: per scenario and configuration, over every gang of the runs
    (from K >= 3 the first run of each configuration left out: it is the cold one, the first
    after the bed came up or the manager's Kueue restarted, its gangs started a second or more
    later in both configurations), Job -> all pods Running (median and worst, of those that
    started: sampled every SAMPLE s, and as the watch saw it with ``--trace``), how many
    started, clusters scaled up per gang (mean) and stranded node-minutes elsewhere (those runs
    together)."""
    runs = int(result.get("runs", 1))
    if runs < 2:
        return []
    first = 1 if runs >= 3 else 0
    counted = f"runs 2-{runs}, the first (cold) left out" if first else f"{runs} runs"
    out = [
        "",
        f"over {counted}, every gang of each: Job -> all Running, median / worst of those "
        "that started (sampled; as watched with --trace)",
        f"{'':52} {'started':>8} {'sampled':>13} {'watched':>13} {'clusters/gang':>13} "
        f"{'elsewhere':>9}",
    ]
    for scenario, by_config in result["every_run"].items():
        for config, per_run in by_config.items():
            gangs = [f for figures in per_run[first:] for f in figures]
            sampled = [f["time_to_start_s"] for f in gangs if f["time_to_start_s"] is not None]
            watched = [
                f["milestones"]["running"]
                for f in gangs
                if (f.get("milestones") or {}).get("running") is not None
            ]
            clusters = sum(len(f["clusters_scaled_up"]) for f in gangs) / max(len(gangs), 1)
            elsewhere = sum(f["stranded_node_min_elsewhere"] for f in gangs)
            out.append(
                f"{f'{scenario}: {LABELS[config]}':52} {f'{len(sampled)}/{len(gangs)}':>8} "
                f"{_spread(sampled):>13} {_spread(watched):>13} {clusters:>13.2f} "
                f"{elsewhere:>9.2f}"
            )
    return out


def _spread(values: Sequence[float]) -> str:
    """Median / worst, seconds; "-" without any."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def milestone_lines(result: Obj) -> list[str]:
    """With ``--trace``: per gang, when it reached each milestone (MILESTONES), and how long
    MultiKueue took to place it once its copy was admitted in the worker ("placed after")."""
    rows = [
        (scenario, config, i, f)
        for scenario, by_config in result["results"].items()
        for config, figures in by_config.items()
        for i, f in enumerate(figures)
        if f.get("milestones")
    ]
    if not rows:
        return []
    out = [
        "",
        "where the time went (--trace): seconds from the Job's creation, as the watch events "
        "arrived; the worker's milestones in the worker the gang ran in",
        f"{'':52} {'gang':>4} {'in':>8} "
        + " ".join(f"{title:>{max(len(title), 5)}}" for _, title in MILESTONES)
        + f" {'placed after Admitted':>21}",
    ]
    for scenario, config, i, f in rows:
        m = f["milestones"]
        label = f"{scenario}: {LABELS[config]}" if i == 0 else ""
        cells = " ".join(
            f"{_seconds(m.get(key)):>{max(len(title), 5)}}" for key, title in MILESTONES
        )
        lag = (
            m["placed"] - m["admitted"]
            if m.get("placed") is not None and m.get("admitted") is not None
            else None
        )
        out.append(
            f"{label:52} {f['gang']:>4} {m.get('worker') or '-':>8} {cells} {_seconds(lag):>21}"
        )
    return out


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def settings_lines(gangs: int) -> list[str]:
    concurrency = ", ".join(f"{k} {v}" for k, v in KUEUE_SHIPPED_CONCURRENCY.items())
    return [
        f"Kueue v0.17 in every cluster (as its manifests ship it): groupKindConcurrency "
        f"{concurrency}; leader election off, internal cert management off (the local stack); "
        "manager: multiKueue.dispatcherName per configuration, gcInterval 10s (default 1m; the "
        "bed's), MultiKueue's other fields at their defaults",
        f"Kueue's check in the workers ((a), (b)): ProvisioningRequestConfig naming the class "
        f"{CLASS} only (retryStrategy at its defaults: backoffLimitCount 3, "
        "backoffBaseSeconds 60)",
        f"gangcheck in the workers ((c), (d)): its own process at its defaults; "
        f"AtomicProvisioningConfig managedResources [{GPU}], fulfillment.deadlineSeconds "
        f"{GANGCHECK_DEADLINE} (default 420), retryStrategy.backoffBaseSeconds "
        f"{GANGCHECK_BACKOFF} (default 60), fulfillment.reclaimer {GANGCHECK_RECLAIMER} "
        "(default CordonAndTaint), the rest at its defaults",
        "gangcheck's dispatcher ((d)): gangcheck run --role dispatcher at its defaults (a pass "
        "on each change of a manager's Workload, on each change in a worker of a Workload "
        "nominated there and waiting or of its request, and every 1 s; one worker at a time), "
        "the RBAC of manifests/dispatcher",
        "cloud: the simulated cloud in each worker answering both checks' requests by creating "
        "real kwok Nodes (32 cpu, 256Gi, 8 GPUs; one member each; about 1 s after the request); "
        "a request that does not fit the room left is answered CapacityIsNotFound and never "
        "looked at again (cluster-autoscaler would try again each loop; the room is held by "
        "the nodes that came, which no one here scales down); no cluster-autoscaler",
        f"gang: a Job of {MEMBERS} pods of 8 GPUs, {gangs} created at once per scenario "
        f"(in learned, after a first wave of {gangs} more, waited for until started and "
        f"{SETTLE:.0f} s more); "
        "kube-scheduler and kwok start the pods",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--horizon", type=float, default=HORIZON)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--gangs", type=int, default=GANGS)
    parser.add_argument(
        "--runs", type=int, default=1, help="run each configuration's scenarios this many times"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument(
        "--trace", action="store_true", help="print each gang's timeline (watched) to stderr"
    )
    args = parser.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if set(configs) - set(CONFIGS) or set(scenarios) - set(SCENARIOS):
        parser.error(f"configs among {CONFIGS}, scenarios among {SCENARIOS}")
    if args.gangs < 2 or args.gangs % 2:
        parser.error("--gangs must be even (half the gangs fit in each worker)")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    result = run(
        configs, scenarios, args.gangs, args.horizon, args.keep, trace=args.trace, runs=args.runs
    )
    print("\n".join(table_lines(result)))
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
