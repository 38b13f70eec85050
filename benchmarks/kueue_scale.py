"""A burst of N gangs through gangcheck's check beside the same burst through Kueue's built-in
ProvisioningRequest check, in one run on the local full stack: figures side by side, with the
ratio gangcheck / Kueue (machines are noisy; the ratio from one run is what to compare).

Run it:

    make bench                                     # N = 500, then N = 2000
    make bench BENCH_SIZES=50                      # another list of N
    python benchmarks/kueue_scale.py --sizes 20,100 [--json] [--timeout 1800]

It needs the test bed's binaries (``make binaries``; built on first use otherwise) and, like
the e2e suite, writes Kueue's metrics certificate where Kueue v0.17 insists on it (as root).
Each N gets a fresh stack (nothing cached from the previous N): etcd, kube-apiserver (with an
audit log, see below), kube-scheduler, kube-controller-manager, kwok and Kueue, no
cluster-autoscaler. Then:

- gangcheck runs as its own process (``python -m gangcheck run`` with its ServiceAccount's
  token, as ``gangcheck_dev.testbed.deploy`` starts it), so its API requests, RSS and CPU are
  its own;
- the capacity exists before the burst (kwok nodes enough for every pod of both sides, with
  room to spare) and one provisioner answers the requests of both sides (one class) at once,
  so the controllers, not the cloud, are measured. By default that is the benchmark's own
  ``instant`` provisioner: on the watch event of a new request, one status write with
  ``Accepted`` and ``Provisioned`` (as cluster-autoscaler answers a request whose capacity
  exists). ``--provisioner sim-cloud`` runs the simulated cloud (``gangcheck_dev sim-cloud``,
  a rule that answers at once and delivers no node) instead; it decides one request at a
  time (a read of the request and its PodTemplates, a list of Nodes, a write of its plan), so
  at N = 50 it took 3.5 s p50 / 12 s p99 from request to Provisioned, on both sides: then it,
  not the controllers, sets the pace. The table shows the provisioner's own delay either way;
- two ClusterQueues, each with its own ResourceFlavor, LocalQueue and namespace, the same
  quota (room for every gang at once): ``gangcheck`` (AdmissionCheck of controller
  ``gangcheck.io/atomic-provisioning``, an AtomicProvisioningConfig in ``NodesFit`` mode) and
  ``kueue`` (controller ``kueue.x-k8s.io/provisioning-request``, a ProvisioningRequestConfig);
- the burst: N Jobs of 4 pods per side (suspended, queued through Kueue's webhook), the two
  sides' Jobs created interleaved; the run ends when every Workload is admitted (or at
  ``--timeout``).

Figures per side (the table prints them with the ratio):

- gangs admitted per second: N / (last Admitted - burst start);
- Provisioned -> check Ready p50 / p99: from the request's ``Provisioned=True`` to the
  Workload's admission check state ``Ready``;
- quota reserved -> request created p50 / p99: from ``QuotaReserved=True`` to the request;
- these three are timed with watch-event receive times (a watcher of Workloads and
  ProvisioningRequests started before the burst, in this process), not with the API's
  condition times, which have 1 s resolution; the JSON output has the condition-time figures
  too;
- API requests per gang, from the apiserver's audit log (policy level Metadata, only for
  gangcheck's ServiceAccount and the admin user Kueue runs as, told apart from kwok by user
  agent), every verb but watch, between the burst start and the last admission (Event writes
  until neither controller has written one for 10 s after it: Kueue's recorder, client-go's,
  sends its Events one at a time from a queue, so under a burst many come after the last
  admission; those are also shown apart): gangcheck's
  user (its Node patches, the node ledger, its patches that only set a request's phase
  annotation, the request's part of that ledger (``Fulfilled``: it claims no more new nodes;
  ``Started``: its nodes are released to the gang's pods; told apart by the patch's body, which
  the audit policy keeps for these patches alone), and its leader election's Lease requests
  counted apart: Kueue's Lease, in its own namespace, is not counted either), Kueue's user in
  each side's namespace (plus the side's ClusterQueue, AdmissionCheck and config), both
  together, and the check alone (gangcheck's user; for Kueue's check, Kueue's requests per gang
  of its side minus those per gang of gangcheck's side: the rest of Kueue's work is the same),
  with the Events among them apart, and ProvisioningRequestCreated Events per request created
  (the audit policy keeps the body of Event creates, so they are counted by reason);
- RSS at the end and CPU seconds during the burst (``/proc/PID/status`` and ``/proc/PID/stat``)
  of gangcheck's process and of the Kueue manager. Kueue's figures cover both sides (one
  manager runs both queues and the Jobs of both); gangcheck's only its own side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import math
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from gangcheck_dev.testbed import deploy
from gangcheck_dev.testbed.certs import ADMIN_USER
from gangcheck_dev.testbed.deploy import (
    NAMESPACE as GANGCHECK_NAMESPACE,
)
from gangcheck_dev.testbed.deploy import (
    SERVICE_ACCOUNT as GANGCHECK_ACCOUNT,
)
from gangcheck_dev.testbed.deploy import (
    ManagedProcess,
    deploy_gangcheck,
    start_sim_cloud,
)
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.nodes import Taint, kwok_node
from gangcheck_dev.testbed.process import Component, free_ports
from gangcheck_dev.testbed.stack import (
    CONTROLLER_MANAGER,
    KUEUE,
    KUEUE_NAMESPACE,
    KWOK,
    SCHEDULER,
    Addon,
    Kueue,
    Scheduler,
)

from benchmarks import ready_path
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    NODE,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    WORKLOAD,
    Resource,
)
from gangcheck.logic.timefmt import format_time
from gangcheck.model.names import PHASE_ANNOTATION, WORKLOAD_UID_ANNOTATION

Obj = dict[str, Any]

MEMBERS = 4
SIDES = ("gangcheck", "kueue")
LABELS = {"gangcheck": "gangcheck (NodesFit)", "kueue": "Kueue's built-in check"}
OUR_CONTROLLER = "gangcheck.io/atomic-provisioning"
KUEUE_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
SIM_CLASS = "sim.gangcheck.io"
POOL_LABEL = "gangcheck.io/bench-pool"
POOL = "bench"
KWOK_TAINT = Taint("kwok.x-k8s.io/node", "fake", "NoSchedule")
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
GANGCHECK_USER = f"system:serviceaccount:{GANGCHECK_NAMESPACE}:{GANGCHECK_ACCOUNT}"
PROVREQ_CONFIG = Resource(
    "kueue.x-k8s.io", "v1beta2", "provisioningrequestconfigs", "ProvisioningRequestConfig", False
)
#: One member: small, so that pods, not cpu or memory, bound what a node holds.
MEMBER_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
NODE_PODS = 250
#: Nodes get this many pods of the burst at most (the rest is room to spare).
NODE_FILL = 200
SIM_CONFIG_MAP = f"{GANGCHECK_NAMESPACE}/bench-sim-cloud"
CREATE_CONCURRENCY = 16
#: How often the progress of a run is shown (on stderr).
PROGRESS_SECONDS = 30
#: Kueue's controller concurrency as its manifests and Helm chart ship it
#: (config/components/manager/controller_manager_config.yaml, ``controller.groupKindConcurrency``).
#: Kueue v0.17 has no default for it: unset, every Kueue controller, its ProvisioningRequest
#: check among them, runs one worker.
KUEUE_SHIPPED_CONCURRENCY = {
    "Job.batch": 5,
    "Pod": 5,
    "Workload.kueue.x-k8s.io": 5,
    "LocalQueue.kueue.x-k8s.io": 1,
    "Cohort.kueue.x-k8s.io": 1,
    "ClusterQueue.kueue.x-k8s.io": 1,
    "ResourceFlavor.kueue.x-k8s.io": 1,
}
#: One client rate limit for every component with one (Kueue, kube-scheduler,
#: kube-controller-manager). Kueue ships 50 requests/s (bursts of 100), kube-scheduler and
#: kube-controller-manager default to 50/100 and 20/30: any of them then sets the pace of the
#: burst (at N = 20, Kueue at 20/s sent exactly 20 requests in every second of the run), not
#: the controllers compared. gangcheck's client has no rate limiter.
CLIENT_QPS, CLIENT_BURST = 500, 1000
KUEUE_CLIENT = {"qps": CLIENT_QPS, "burst": CLIENT_BURST}
CONTROLLER_MANAGER_ARGS = (f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}")
#: How long each CPU profile of Kueue (its pprof endpoint) lasts during the burst: the share
#: of its samples in its ProvisioningRequest check's package apportions its CPU to the check.
PROFILE_SECONDS = 15
KUEUE_CHECK_PACKAGE = "pkg/controller/admissionchecks/provisioning"
KUEUE_CHECK_CONTROLLER = "provisioning_workload"
GANGCHECK_WORKLOAD_CONTROLLER = "workload"
#: Verbs that write.
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: Events are counted until neither controller has sent one for this long after the last gang
#: was admitted (at most EVENTS_DRAIN_SECONDS): client-go's recorder, Kueue's, sends its Events
#: one at a time from a queue, so under a burst they come well after what they tell of.
EVENTS_QUIET_SECONDS = 10.0
EVENTS_DRAIN_SECONDS = 600.0
#: The audit policy: Metadata for the two controllers' users, nothing for the others; the body
#: of gangcheck's patches of requests too, to tell its phase records apart, and of Events, to
#: count them by reason.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "Request",
            "users": [GANGCHECK_USER],
            "verbs": ["patch"],
            "resources": [
                {"group": PROVISIONING_REQUEST.group, "resources": ["provisioningrequests"]}
            ],
        },
        {
            "level": "Request",
            "users": [GANGCHECK_USER, ADMIN_USER],
            "verbs": ["create"],
            "resources": [{"group": "", "resources": ["events"]}, {"group": "events.k8s.io"}],
        },
        {"level": "Metadata", "users": [GANGCHECK_USER, ADMIN_USER]},
        {"level": "None"},
    ],
}


# -- the stack --------------------------------------------------------------------------------


@dataclass
class Stack:
    plane: ControlPlane
    gangcheck: ManagedProcess
    sim: ManagedProcess | None
    audit_dir: Path

    def other_pids(self) -> dict[str, int]:
        """The pids of the rest of the stack (their CPU during the burst goes in the JSON)."""
        pids = {name: c.pid for name, c in self.plane.components.items() if name != KUEUE and c.pid}
        if self.sim is not None:
            pids["sim-cloud"] = self.sim.pid
        pids["benchmark"] = os.getpid()
        return pids

    @property
    def kueue_pid(self) -> int:
        pid = self.plane.components[KUEUE].pid
        assert pid is not None, "Kueue is not running"
        return pid


class BenchScheduler(Scheduler):
    """kube-scheduler with the benchmark's client rate limit (its flags for it are ignored
    once it reads a config file, as the test bed's does)."""

    def build(self, plane: ControlPlane) -> Component:
        config = self.folder(plane) / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.kubeconfig(plane)),
                        "qps": CLIENT_QPS,
                        "burst": CLIENT_BURST,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        argv = [
            str(plane.binary("kube-scheduler")),
            f"--config={config}",
            *self.serving_args(plane),
            f"--feature-gates={','.join(plane.feature_gates)}",
        ]
        return self._component(plane, argv, self.probe_path(plane, "/readyz"))


class BenchPlane(ControlPlane):
    """The test bed's control plane: Kueue configured as it ships (its controllers'
    concurrency), every component's client at one rate limit, Kueue's pprof served."""

    pprof_port = 0

    def _make_addons(self) -> list[Addon]:
        addons = super()._make_addons()
        for i, addon in enumerate(addons):
            if isinstance(addon, Kueue):
                (self.pprof_port,) = free_ports(1)
                addon.config_overrides["clientConnection"] = dict(KUEUE_CLIENT)
                addon.config_overrides["controller"] = {
                    "groupKindConcurrency": dict(KUEUE_SHIPPED_CONCURRENCY)
                }
                addon.config_overrides["pprofBindAddress"] = f"127.0.0.1:{self.pprof_port}"
            elif isinstance(addon, Scheduler):
                addons[i] = BenchScheduler(addon.extra_args)
        return addons

    @property
    def kueue_metrics_port(self) -> int:
        (kueue,) = [a for a in self.addons if isinstance(a, Kueue)]
        return int(kueue.ports["metrics"])


def settings_lines(gangcheck_args: Sequence[str]) -> list[str]:
    """Every setting of the run that differs from the components' defaults, both sides."""
    concurrency = ", ".join(f"{k} {v}" for k, v in KUEUE_SHIPPED_CONCURRENCY.items())
    return [
        f"Kueue (as its manifests ship it): groupKindConcurrency {concurrency}; "
        f"client qps {CLIENT_QPS}, burst {CLIENT_BURST} (ships 50/100); pprof served; "
        "no leader election, internal cert management off (the local stack)",
        f"kube-scheduler: client qps {CLIENT_QPS}, burst {CLIENT_BURST} (default 50/100); "
        f"kube-controller-manager: --kube-api-qps={CLIENT_QPS} --kube-api-burst={CLIENT_BURST} "
        "(default 20/30)",
        f"gangcheck: its defaults ({gangcheck_defaults()}; no client rate limiter; leader "
        "election on, its Lease requests counted)"
        + (f", flags {' '.join(gangcheck_args)}" if gangcheck_args else ""),
        "checks: AtomicProvisioningConfig NodesFit, deadlineSeconds and startDeadlineSeconds "
        "7200; ProvisioningRequestConfig with the provisioning class only",
    ]


@contextlib.contextmanager
def full_stack(workdir: Path, gangcheck_args: Sequence[str], *, sim_cloud: bool) -> Iterator[Stack]:
    """The stack for one N: the control plane with an audit log, gangcheck, the simulated cloud.

    Started from the calling (main) thread: the children die with it (see deploy.py)."""
    audit_dir = workdir / "audit"
    audit_dir.mkdir(parents=True)
    policy = audit_dir / "policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
    plane = BenchPlane(
        components=(SCHEDULER, CONTROLLER_MANAGER, KWOK, KUEUE),
        component_args={CONTROLLER_MANAGER: CONTROLLER_MANAGER_ARGS},
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_dir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=100000",  # MB: never rotated during a run
        ],
    )
    plane.start()
    try:
        gangcheck = deploy_gangcheck(
            plane.kubeconfig, workdir=workdir / "gangcheck", extra_args=list(gangcheck_args)
        )
        try:
            sim = None
            if sim_cloud:
                sim = start_sim_cloud(
                    plane.kubeconfig,
                    workdir=workdir / "sim",
                    config_map=SIM_CONFIG_MAP,
                    config=sim_config(),
                )
            try:
                yield Stack(plane, gangcheck, sim, audit_dir)
            finally:
                if sim is not None:
                    sim.stop()
        finally:
            gangcheck.stop()
    finally:
        plane.stop()


def sim_config() -> Obj:
    """One class for both sides, answered at once; no node delivered (they exist already)."""
    return {
        "provisioningClassNames": [SIM_CLASS],
        "nodeGroups": [
            {
                "name": "bench",
                "maxNodes": 100000,
                "cpu": "256",
                "memory": "1Ti",
                "pods": NODE_PODS,
                "labels": {POOL_LABEL: POOL},
                "taints": [KWOK_TAINT.to_dict()],
            }
        ],
        "scenarios": [
            {
                "name": "at-once",
                "acceptAfterSeconds": 0,
                "provisionAfterSeconds": 0,
                "deliver": 0,
                "bookingSeconds": 86400,
            }
        ],
    }


# -- the queues and the gangs ----------------------------------------------------------------


def node_count(n: int) -> int:
    return math.ceil(2 * n * MEMBERS / NODE_FILL) + 1


async def create_nodes(kube: Kube, count: int) -> None:
    for i in range(count):
        node = kwok_node(
            f"bench-{i:04d}",
            cpu="256",
            memory="1Ti",
            pods=NODE_PODS,
            labels={POOL_LABEL: POOL},
            taints=[KWOK_TAINT],
        )
        await kube.create(NODE, node)


async def create_queue(kube: Kube, side: str, namespace: str, n: int) -> None:
    """Flavor, check (+ its config), ClusterQueue and LocalQueue ``lq`` of one side, all
    named after the side."""
    name = f"bench-{side}"
    if side == "gangcheck":
        spec = {
            "provisioningClassName": SIM_CLASS,
            "allowCustomProvisioningClass": True,
            "fulfillment": {
                "mode": "NodesFit",
                "deadlineSeconds": 7200,
                "startDeadlineSeconds": 7200,
            },
        }
        await kube.create(ATOMIC_CONFIG, {"metadata": {"name": name}, "spec": spec})
        check = {
            "controllerName": OUR_CONTROLLER,
            "parameters": params("gangcheck.io", "AtomicProvisioningConfig", name),
        }
    else:
        await kube.create(
            PROVREQ_CONFIG,
            {"metadata": {"name": name}, "spec": {"provisioningClassName": SIM_CLASS}},
        )
        check = {
            "controllerName": KUEUE_CONTROLLER,
            "parameters": params("kueue.x-k8s.io", "ProvisioningRequestConfig", name),
        }
    await kube.create(ADMISSION_CHECK, {"metadata": {"name": name}, "spec": check})
    await kube.create(
        RESOURCE_FLAVOR, {"metadata": {"name": name}, "spec": {"nodeLabels": {POOL_LABEL: POOL}}}
    )
    room = n * MEMBERS
    quota = [
        {"name": "cpu", "nominalQuota": str(room)},
        {"name": "memory", "nominalQuota": f"{room}Gi"},
    ]
    await kube.create(
        CLUSTER_QUEUE,
        {
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": name, "resources": quota}],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": name}]},
            },
        },
    )
    await kube.create(
        LOCAL_QUEUE, {"metadata": {"name": "lq"}, "spec": {"clusterQueue": name}}, namespace
    )


def params(group: str, kind: str, name: str) -> Obj:
    return {"apiGroup": group, "kind": kind, "name": name}


async def wait_active(kube: Kube, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for res in (ADMISSION_CHECK, CLUSTER_QUEUE):
        for side in SIDES:
            while not is_true(await kube.get(res, f"bench-{side}"), "Active"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{res.kind} bench-{side} not Active after {timeout:.0f}s")
                await asyncio.sleep(0.25)


def gang_job(name: str) -> Obj:
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
                            "name": "main",
                            "image": "bench-placeholder:1",
                            "resources": {"requests": dict(MEMBER_REQUESTS)},
                        }
                    ],
                    "tolerations": [KWOK_TOLERATION],
                }
            },
        },
    }


async def burst(kube: Kube, namespaces: dict[str, str], n: int) -> None:
    """N Jobs per side, interleaved (gang i of one side, then gang i of the other)."""
    order = [(side, i) for i in range(n) for side in SIDES]
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(side: str, i: int) -> None:
        async with limit:
            await kube.create(JOB, gang_job(f"gang-{i:05d}"), namespaces[side])

    await asyncio.gather(*(create(side, i) for side, i in order))


# -- what the watcher records -----------------------------------------------------------------


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: Obj, kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def api_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Seen:
    """First receive time (epoch seconds, this process's clock) and API time of milestones."""

    side: str
    received: dict[str, float] = field(default_factory=dict)
    api: dict[str, float] = field(default_factory=dict)
    owner: str = ""

    def mark(self, milestone: str, api_text: str | None, now: float) -> None:
        if milestone not in self.received:
            self.received[milestone] = now
            stamp = api_time(api_text)
            if stamp is not None:
                self.api[milestone] = stamp


class InstantProvisioner:
    """Answers every new ProvisioningRequest of the benchmark at once, as cluster-autoscaler
    answers one whose capacity exists: ``Accepted`` and ``Provisioned`` in one status write.

    The requests come from the recorder's watch (no watch, list or read of its own)."""

    def __init__(self, kube: Kube, concurrency: int = 32) -> None:
        self.kube = kube
        self._limit = asyncio.Semaphore(concurrency)
        self._answered: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def offer(self, obj: Obj) -> None:
        meta = obj["metadata"]
        if meta["uid"] in self._answered or (obj.get("status") or {}).get("conditions"):
            return
        self._answered.add(meta["uid"])
        task = asyncio.create_task(self._answer(meta))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, meta: Obj) -> None:
        now = format_time(datetime.now(UTC))
        generation = int(meta.get("generation", 1))
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            }
            for kind, reason, message in (
                ("Accepted", "Accepted", "ProvisioningRequest is accepted by the benchmark"),
                ("Provisioned", "Provisioned", "Capacity is found in the cluster"),
            )
        ]
        async with self._limit:
            with contextlib.suppress(NotFoundError):
                await self.kube.merge_patch(
                    PROVISIONING_REQUEST,
                    meta["name"],
                    {"status": {"conditions": conditions}},
                    meta["namespace"],
                    subresource="status",
                )


class Recorder:
    """Watches Workloads and ProvisioningRequests of both sides' namespaces."""

    def __init__(
        self,
        kube: Kube,
        namespaces: dict[str, str],
        provisioner: InstantProvisioner | None = None,
    ) -> None:
        self.kube = kube
        self.provisioner = provisioner
        self.side_of = {ns: side for side, ns in namespaces.items()}
        self.workloads: dict[str, Seen] = {}
        self.requests: dict[str, Seen] = {}
        self.synced = asyncio.Event()
        self._synced: set[str] = set()

    async def run(self) -> None:
        await asyncio.gather(self._follow(WORKLOAD), self._follow(PROVISIONING_REQUEST))

    async def _follow(self, res: Resource) -> None:
        while True:
            try:
                listing = await self.kube.list_objects(res)
                now = time.time()
                for obj in listing.get("items") or []:
                    self._see(res, obj, now)
                self._synced.add(res.plural)
                if len(self._synced) == 2:
                    self.synced.set()
                rv = listing["metadata"]["resourceVersion"]
                while True:
                    async for event in self.kube.watch(
                        res, resource_version=rv, timeout_seconds=600
                    ):
                        now = time.time()
                        obj = event.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._see(res, obj, now)
            except (ApiError, OSError) as exc:
                print(f"watch of {res.plural} broken ({exc}); listing again", file=sys.stderr)
                await asyncio.sleep(0.5)

    def _see(self, res: Resource, obj: Obj, now: float) -> None:
        meta = obj.get("metadata") or {}
        side = self.side_of.get(meta.get("namespace", ""))
        if side is None:
            return
        uid = meta["uid"]
        if res is WORKLOAD:
            seen = self.workloads.setdefault(uid, Seen(side))
            for kind, milestone in (("QuotaReserved", "quota"), ("Admitted", "admitted")):
                cond = condition(obj, kind)
                if cond and cond.get("status") == "True":
                    seen.mark(milestone, cond.get("lastTransitionTime"), now)
            for state in (obj.get("status") or {}).get("admissionChecks") or []:
                if state.get("name") == f"bench-{side}" and state.get("state") == "Ready":
                    seen.mark("ready", state.get("lastTransitionTime"), now)
        else:
            seen = self.requests.setdefault(uid, Seen(side))
            if not seen.owner:
                seen.owner = request_owner(meta)
            seen.mark("created", meta.get("creationTimestamp"), now)
            if self.provisioner is not None:
                self.provisioner.offer(obj)
            cond = condition(obj, "Provisioned")
            if cond and cond.get("status") == "True":
                seen.mark("provisioned", cond.get("lastTransitionTime"), now)

    def admitted(self, side: str) -> int:
        return sum(
            1 for s in self.workloads.values() if s.side == side and "admitted" in s.received
        )


def request_owner(meta: Obj) -> str:
    """The uid of the Workload a request is for: Kueue's requests are owned by it, gangcheck's
    name it in an annotation (they carry no ownerReference to it)."""
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Workload"]
    if owners:
        return str(owners[0]["uid"])
    return str((meta.get("annotations") or {}).get(WORKLOAD_UID_ANNOTATION, ""))


# -- process figures --------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def cpu_seconds(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


# -- the checks' own work: reconciles, Kueue's check's share of its CPU ------------------------


def gangcheck_defaults() -> str:
    """gangcheck's worker count, as the code it runs has it."""
    code = "from gangcheck.settings import ControllerSettings as C; print(C().workers)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=deploy._python_env(),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = "?"
    return f"{out} workers"


def _get(url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the local stack's self-signed serving certificate
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
        data: bytes = reply.read()
        return data


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            with contextlib.suppress(ValueError):
                total += float(value)
    return total


async def metrics_token(kube: Kube) -> str:
    """A token Kueue's metrics endpoint accepts (it asks the API server: TokenReview and
    SubjectAccessReview): a ServiceAccount allowed GET /metrics."""
    name, ns = "bench-metrics", KUEUE_NAMESPACE
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for path, body in (
        (f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}}),
        (
            f"{rbac}/clusterroles",
            {
                "metadata": {"name": name},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            },
        ),
    ):
        with contextlib.suppress(ApiError):
            await kube.request("POST", path, body=body)
    reply = await kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    return str(reply["status"]["token"])


@dataclass
class Reconciles:
    """Workload reconciles of each check, read from the controllers' metrics."""

    kueue_url: str
    kueue_token: str
    gangcheck_url: str

    async def read(self) -> dict[str, float]:
        out = {"gangcheck": math.nan, "kueue": math.nan}
        with contextlib.suppress(OSError, ValueError):
            text = (await asyncio.to_thread(_get, self.gangcheck_url)).decode()
            out["gangcheck"] = metric_sum(
                text,
                "gangcheck_reconcile_duration_seconds_count",
                controller=GANGCHECK_WORKLOAD_CONTROLLER,
            )
        with contextlib.suppress(OSError, ValueError):
            headers = {"Authorization": f"Bearer {self.kueue_token}"}
            text = (await asyncio.to_thread(_get, self.kueue_url, headers)).decode()
            out["kueue"] = metric_sum(
                text, "controller_runtime_reconcile_total", controller=KUEUE_CHECK_CONTROLLER
            )
        return out


class KueueProfiler:
    """CPU profiles of Kueue, one after another, while the burst runs (its pprof endpoint)."""

    def __init__(self, port: int, folder: Path) -> None:
        self.url = f"http://127.0.0.1:{port}/debug/pprof/profile?seconds={PROFILE_SECONDS}"
        self.folder = folder
        self.files: list[Path] = []
        self.first = asyncio.Event()
        folder.mkdir(parents=True, exist_ok=True)

    async def run(self) -> None:
        while True:
            try:
                data = await asyncio.to_thread(_get, self.url, None, PROFILE_SECONDS + 30)
            except OSError as exc:
                print(f"Kueue profile failed: {exc}", file=sys.stderr)
                await asyncio.sleep(1)
                continue
            path = self.folder / f"kueue-{len(self.files):03d}.pb.gz"
            path.write_bytes(data)
            self.files.append(path)
            self.first.set()

    async def stop(self, task: asyncio.Task[None]) -> None:
        """Stop profiling; a burst shorter than one profile waits for its first to end."""
        if not self.files:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.first.wait(), PROFILE_SECONDS + 30)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def check_share(self) -> float:
        """The share of Kueue's CPU samples with a frame in its ProvisioningRequest check's
        package (its reconciles and event handlers; the shared caches and client not)."""
        if not self.files:
            return math.nan
        try:
            traces = subprocess.run(
                ["go", "tool", "pprof", "-traces", *map(str, self.files)],
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"go tool pprof failed: {exc}", file=sys.stderr)
            return math.nan
        total = ours = 0.0
        for block in traces.split("-----------+")[1:]:
            lines = [ln for ln in block.splitlines()[1:] if ln.strip()]
            if not lines:
                continue
            value = _duration(lines[0].split()[0])
            if value is None:
                continue
            total += value
            if any(KUEUE_CHECK_PACKAGE in ln for ln in lines):
                ours += value
        return ours / total if total else math.nan


def _duration(text: str) -> float | None:
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            with contextlib.suppress(ValueError):
                return float(text[: -len(unit)]) * units[unit]
            return None
    return None


# -- the audit log ----------------------------------------------------------------------------


def audit_events(folder: Path) -> Iterator[Obj]:
    for path in sorted(glob.glob(str(folder / "audit*.log"))):
        with open(path) as log:
            for line in log:
                with contextlib.suppress(ValueError):
                    yield json.loads(line)


class AuditTail:
    """The audit log's records as they are written: each `new()` reads what was added since
    the last (the first, what was added since the tail was made)."""

    def __init__(self, folder: Path) -> None:
        self._path = folder / "audit.log"
        self._offset = self._path.stat().st_size
        self._rest = b""

    def new(self) -> Iterator[Obj]:
        with open(self._path, "rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if b'"events"' in line:  # only Event records are asked for; skip parsing the rest
                with contextlib.suppress(ValueError):
                    yield json.loads(line)


def is_controller_event(event: Obj) -> bool:
    """A record of gangcheck or Kueue writing an Event."""
    return (
        client_of(event) is not None
        and (event.get("objectRef") or {}).get("resource") == "events"
        and event.get("verb") in ("create", "patch", "update")
    )


async def events_settled(
    tail: AuditTail, *, quiet: float = EVENTS_QUIET_SECONDS, cap: float = EVENTS_DRAIN_SECONDS
) -> float:
    """Wait until neither controller has written an Event for `quiet` seconds (at most `cap`
    seconds); the time it settled."""
    began = last = time.monotonic()
    while time.monotonic() - last < quiet and time.monotonic() - began < cap:
        if any(is_controller_event(e) for e in tail.new()):
            last = time.monotonic()
        await asyncio.sleep(1.0)
    return time.time()


def client_of(event: Obj) -> str | None:
    user = (event.get("user") or {}).get("username")
    if user == GANGCHECK_USER:
        return "gangcheck"
    agent = str(event.get("userAgent") or "").lower()
    if user == ADMIN_USER and "kueue" in agent:
        return "kueue"
    return None


def is_phase_record(event: Obj) -> bool:
    """A patch of a request that sets its phase annotation and nothing else: the record of
    NodesFit's ledger that the request stopped claiming new nodes (Fulfilled) or released them
    to the gang's pods (Started). The request's uid may ride along: a precondition, not a
    change (the record goes only to the request it was decided for)."""
    body = event.get("requestObject")
    return (
        event.get("verb") == "patch"
        and isinstance(body, dict)
        and set(body) == {"metadata"}
        and set(body["metadata"]) - {"uid"} == {"annotations"}
        and set(body["metadata"]["annotations"]) == {PHASE_ANNOTATION}
    )


def count_requests(
    events: Iterable[Obj],
    window: tuple[float, float],
    namespaces: dict[str, str],
    events_until: float | None = None,
) -> dict[str, Any]:
    """Requests (no watches) of each client in the window, by side, verb and resource; Event
    writes and gangcheck's phase records (`Started` follows the gang's pods, after admission)
    until `events_until` (the end of the window if None), those after the window counted
    apart too."""
    late_until = window[1] if events_until is None else max(events_until, window[1])
    side_of = {ns: side for side, ns in namespaces.items()}
    names = {f"bench-{side}": side for side in SIDES}
    counts: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    detail: dict[str, Counter[str]] = {}
    reasons: dict[str, Counter[str]] = {}
    agents: Counter[str] = Counter()
    late: Counter[str] = Counter()
    for event in events:
        if event.get("verb") == "watch":
            continue
        ref = event.get("objectRef") or {}
        began = api_time(event.get("requestReceivedTimestamp"))
        if began is None or not window[0] <= began <= late_until:
            continue
        resource = ref.get("resource", "") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        if began > window[1] and not (resource == "events" or is_phase_record(event)):
            continue
        client = client_of(event)
        if (event.get("user") or {}).get("username") == ADMIN_USER:
            agents[str(event.get("userAgent") or "").split(" ")[0]] += 1
        if client is None:
            continue
        what = f"{event.get('verb')} {resource}"
        if client == "gangcheck":
            key = "gangcheck"
            if resource == "nodes" and event["verb"] in ("patch", "update"):
                key = "gangcheck_node_writes"
            elif resource == "leases":
                key = "gangcheck_leases"  # as Kueue's, in its own namespace, are not counted
            elif resource == "provisioningrequests" and is_phase_record(event):
                key = "gangcheck_phase_records"
        else:
            side = side_of.get(ref.get("namespace", "")) or names.get(ref.get("name", ""))
            key = f"kueue_{side}" if side else "kueue_other"
        counts[key] += 1
        if event.get("verb") in WRITES:
            writes[key] += 1
        detail.setdefault(key, Counter())[what] += 1
        if began > window[1]:
            late[f"{key} {what}"] += 1
        if resource == "events" and isinstance(event.get("requestObject"), dict):
            reasons.setdefault(key, Counter())[str(event["requestObject"].get("reason"))] += 1
    return {
        "counts": dict(counts),
        "writes": dict(writes),
        "detail": {k: dict(v.most_common()) for k, v in detail.items()},
        "event_reasons": {k: dict(v.most_common()) for k, v in reasons.items()},
        "admin_agents": dict(agents),
        "after_window": dict(late),
    }


# -- one N ------------------------------------------------------------------------------------


def quantiles(values: Sequence[float]) -> tuple[float, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(ordered), p99


async def measure(stack: Stack, n: int, timeout: float) -> dict[str, Any]:
    namespaces = {side: f"bench-{side}" for side in SIDES}
    for ns in namespaces.values():
        stack.plane.ensure_namespace(ns)
    async with await Kube.connect(str(stack.plane.kubeconfig)) as kube:
        await create_nodes(kube, node_count(n))
        for side, ns in namespaces.items():
            await create_queue(kube, side, ns, n)
        await wait_active(kube)
        plane = stack.plane
        assert isinstance(plane, BenchPlane)
        reconciles = Reconciles(
            kueue_url=f"https://127.0.0.1:{plane.kueue_metrics_port}/metrics",
            kueue_token=await metrics_token(kube),
            gangcheck_url=f"http://127.0.0.1:{stack.gangcheck.metrics_port}/metrics",
        )
        profiler = KueueProfiler(plane.pprof_port, stack.audit_dir.parent / "pprof")
        provisioner = None if stack.sim is not None else InstantProvisioner(kube)
        recorder = Recorder(kube, namespaces, provisioner)
        watching = asyncio.create_task(recorder.run())
        try:
            await asyncio.wait_for(recorder.synced.wait(), 60)
            pids = {"gangcheck": stack.gangcheck.pid, "kueue": stack.kueue_pid}
            others = stack.other_pids()
            cpu_before = {side: cpu_seconds(pid) for side, pid in pids.items()}
            others_before = {name: cpu_seconds(pid) for name, pid in others.items()}
            reconciles_before = await reconciles.read()
            profiling = asyncio.create_task(profiler.run())
            start = time.time()
            await burst(kube, namespaces, n)
            created = time.time()
            usage, exited = await follow(
                stack, recorder, n, pids=pids, start=start, timeout=timeout
            )
            end = time.time()
            await profiler.stop(profiling)
            reconciles_after = await reconciles.read()
            cpu = {side: usage[side][0] - cpu_before[side] for side in SIDES}
            rss = {side: usage[side][1] for side in SIDES}
            others_cpu = {
                name: round(cpu_seconds(pid) - others_before[name], 2)
                for name, pid in others.items()
            }
            settled = await events_settled(AuditTail(stack.audit_dir))
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    audit = count_requests(audit_events(stack.audit_dir), (start, end), namespaces, settled)
    path = ready_path.breakdown(audit_events(stack.audit_dir))
    result = figures(
        n, recorder=recorder, start=start, created=created, end=end, cpu=cpu, rss=rss, audit=audit
    )
    share = await asyncio.to_thread(profiler.check_share)
    add_check_figures(result, n, cpu, share, (reconciles_before, reconciles_after))
    result["kueue_profiles"] = len(profiler.files)
    result["ready_path"] = path
    result["other_cpu_s"] = others_cpu
    result["events_settled_s"] = settled - end
    result["gangcheck_exited_s"] = exited
    return result


async def follow(
    stack: Stack,
    recorder: Recorder,
    n: int,
    *,
    pids: dict[str, int],
    start: float,
    timeout: float,
) -> tuple[dict[str, tuple[float, float]], float | None]:
    """Wait until every gang of both sides is admitted (or the timeout), sampling the
    controllers' CPU and RSS; (the last samples, when gangcheck exited or None). The last
    sample is taken once every gang is seen admitted, not up to a period before: a small
    burst admitted within one period otherwise counted none of the work it took."""
    deadline = time.monotonic() + timeout
    shown = time.monotonic()
    usage = {side: sample(pid) for side, pid in pids.items()}
    exited: float | None = None
    while True:
        if exited is None and not stack.gangcheck.running:
            exited = time.time() - start
            print(
                f"gangcheck exited {exited:.0f} s after the burst started; waiting for "
                f"Kueue's side alone. Its log's end:\n{stack.gangcheck.log_tail(20)}",
                file=sys.stderr,
            )
        admitted = all(recorder.admitted(side) >= n for side in waited_for(exited))
        for side, pid in pids.items():
            if side != "gangcheck" or exited is None:
                usage[side] = sample(pid, usage[side])
        if admitted or time.monotonic() > deadline:
            return usage, exited
        if time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            done = ", ".join(f"{side} {recorder.admitted(side)}" for side in SIDES)
            print(f"N = {n}: {time.time() - start:.0f} s, admitted {done}", file=sys.stderr)
        await asyncio.sleep(0.5)


def add_check_figures(
    result: dict[str, Any],
    n: int,
    cpu: dict[str, float],
    share: float,
    reconciles: tuple[dict[str, float], dict[str, float]],
) -> None:
    """Workload reconciles of each check per gang, and each check's CPU per Workload it
    handles: gangcheck's process is its check; Kueue's check is its share of Kueue's CPU."""
    for side in SIDES:
        made = reconciles[1][side] - reconciles[0][side]
        g = result["sides"][side]
        g["workload_reconciles_per_gang"] = made / n
        check_cpu = cpu[side] if side == "gangcheck" else cpu[side] * share
        g["check_cpu_s"] = check_cpu
        g["check_cpu_ms_per_workload"] = 1000 * check_cpu / n
        # Kueue's manager handles the Workloads of both sides (queues, Jobs, its check's
        # controller reconciles every Workload): its whole CPU over the 2N it handles.
        g["process_cpu_ms_per_workload"] = 1000 * cpu[side] / (n if side == "gangcheck" else 2 * n)
    result["kueue_check_cpu_share"] = share


def waited_for(exited: float | None) -> tuple[str, ...]:
    """The sides still followed: gangcheck's no longer once its process has exited."""
    return SIDES if exited is None else tuple(s for s in SIDES if s != "gangcheck")


def sample(pid: int, last: tuple[float, float] = (0.0, math.nan)) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of a process; ``last`` when it is gone."""
    try:
        return cpu_seconds(pid), rss_mib(pid)
    except (OSError, ValueError):
        return last


def late_events(audit: dict[str, Any], side: str) -> int:
    """The Events both controllers created for a side after its last admission: gangcheck's
    and Kueue's for gangcheck's side, Kueue's for its own."""
    late = audit.get("after_window", {})
    keys = ("gangcheck", "kueue_gangcheck") if side == "gangcheck" else ("kueue_kueue",)
    return sum(late.get(f"{key} create events", 0) for key in keys)


def figures(
    n: int,
    *,
    recorder: Recorder,
    start: float,
    created: float,
    end: float,
    cpu: dict[str, float],
    rss: dict[str, float],
    audit: dict[str, Any],
) -> dict[str, Any]:
    by_owner: dict[str, list[Seen]] = {}
    for request in recorder.requests.values():
        by_owner.setdefault(request.owner, []).append(request)
    counts = audit["counts"]
    sides: dict[str, Any] = {}
    for side in SIDES:
        workloads = [s for s in recorder.workloads.values() if s.side == side]
        admitted = [s.received["admitted"] for s in workloads if "admitted" in s.received]
        last = max(admitted, default=math.nan)
        ready_watch, ready_api, quota_watch, quota_api = [], [], [], []
        answered: list[float] = []
        uids = {uid for uid, s in recorder.workloads.items() if s.side == side}
        for uid in uids:
            seen = recorder.workloads[uid]
            requests = sorted(by_owner.get(uid, []), key=lambda r: r.received.get("created", 0))
            if not requests:
                continue
            first = requests[0]
            if "quota" in seen.received and "created" in first.received:
                quota_watch.append(first.received["created"] - seen.received["quota"])
                if "quota" in seen.api and "created" in first.api:
                    quota_api.append(first.api["created"] - seen.api["quota"])
            provisioned = [r for r in requests if "provisioned" in r.received]
            answered.extend(
                r.received["provisioned"] - r.received["created"]
                for r in provisioned
                if "created" in r.received
            )
            if "ready" in seen.received and provisioned:
                last_request = provisioned[-1]
                ready_watch.append(seen.received["ready"] - last_request.received["provisioned"])
                if "ready" in seen.api and "provisioned" in last_request.api:
                    ready_api.append(seen.api["ready"] - last_request.api["provisioned"])
        writes = audit.get("writes", {})
        if side == "gangcheck":
            own = counts.get("gangcheck", 0)
            node_writes = counts.get("gangcheck_node_writes", 0)
            leases = counts.get("gangcheck_leases", 0)
            phases = counts.get("gangcheck_phase_records", 0)
            all_writes = sum(v for k, v in writes.items() if k.startswith("gangcheck"))
            lease_writes = writes.get("gangcheck_leases", 0)
        else:
            own = node_writes = leases = phases = lease_writes = 0
            all_writes = writes.get("kueue_kueue", 0) - writes.get("kueue_gangcheck", 0)
        kueue_requests = counts.get(f"kueue_{side}", 0)
        # The check's own requests: gangcheck's; for Kueue's check, what Kueue sends for a gang
        # of its side beyond what it sends for one of gangcheck's side (same Jobs, Workloads,
        # scheduler; only the check differs).
        detail, reasons = audit["detail"], audit.get("event_reasons", {})
        events = {key: detail.get(key, {}).get("create events", 0) for key in detail}
        if side == "gangcheck":
            check_requests = own + node_writes + leases + phases
            check_events, sender = events.get("gangcheck", 0), "gangcheck"
        else:
            check_requests = kueue_requests - counts.get("kueue_gangcheck", 0)
            check_events = events.get("kueue_kueue", 0) - events.get("kueue_gangcheck", 0)
            sender = "kueue_kueue"
        requests_created = sum(len(by_owner.get(uid, [])) for uid in uids)
        created_events = reasons.get(sender, {}).get("ProvisioningRequestCreated", 0)
        sides[side] = {
            "admitted": len(admitted),
            "workloads": len(workloads),
            "requests_created": requests_created,
            "admitted_per_s": len(admitted) / (last - start) if admitted else 0.0,
            "ready_after_provisioned_s": quantiles(ready_watch),
            "ready_after_provisioned_api_s": quantiles(ready_api),
            "request_after_quota_s": quantiles(quota_watch),
            "request_after_quota_api_s": quantiles(quota_api),
            "provisioned_after_request_s": quantiles(answered),
            "gangcheck_requests_per_gang": own / n,
            "node_ledger_writes_per_gang": node_writes / n,
            "leader_election_requests_per_gang": leases / n,
            "phase_records_per_gang": phases / n,
            "kueue_requests_per_gang": kueue_requests / n,
            "controllers_requests_per_gang": (own + kueue_requests) / n,
            "check_requests_per_gang": check_requests / n,
            "check_events_per_gang": check_events / n,
            "check_writes_per_gang": all_writes / n,
            "lease_writes_per_gang": lease_writes / n,
            "late_events_per_gang": late_events(audit, side) / n,
            "created_events_per_request": (
                created_events / requests_created if requests_created else math.nan
            ),
            "rss_mib": rss[side],
            "cpu_s": cpu[side],
            "cpu_ms_per_gang": 1000 * cpu[side] / n,
        }
    return {
        "n": n,
        "members": MEMBERS,
        "nodes": node_count(n),
        "jobs_created_s": created - start,
        "burst_s": end - start,
        "complete": all(sides[s]["admitted"] == n for s in SIDES),
        "sides": sides,
        "audit": audit,
    }


def run_size(
    n: int, timeout: float, gangcheck_args: Sequence[str], *, keep: bool, sim_cloud: bool
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"kueue-scale-{n}-"))
    try:
        with full_stack(workdir, gangcheck_args, sim_cloud=sim_cloud) as stack:
            result = asyncio.run(measure(stack, n, timeout))
            result["provisioner"] = "sim-cloud" if sim_cloud else "instant"
            result["settings"] = settings_lines(gangcheck_args)
            return result
    finally:
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# -- the table --------------------------------------------------------------------------------


def _num(value: float | None, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}{unit}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or theirs == 0 or math.isnan(ours) or math.isnan(theirs):
        return "-"
    return f"{ours / theirs:.2f}x"


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    g, k = result["sides"]["gangcheck"], result["sides"]["kueue"]
    out: list[tuple[str, str, str, str]] = []

    def add(label: str, a: float | None, b: float | None, unit: str = "", digits: int = 2) -> None:
        out.append((label, _num(a, unit, digits), _num(b, unit, digits), _ratio(a, b)))

    def pair(label: str, key: str) -> None:
        a, b = g[key], k[key]
        add(f"{label} p50", a and a[0], b and b[0], " s", 3)
        add(f"{label} p99", a and a[1], b and b[1], " s", 3)

    add("gangs admitted", g["admitted"], k["admitted"], digits=0)
    add("gangs admitted per second", g["admitted_per_s"], k["admitted_per_s"])
    pair("Provisioned -> check Ready", "ready_after_provisioned_s")
    pair("quota reserved -> request created", "request_after_quota_s")
    pair("(provisioner) request -> Provisioned", "provisioned_after_request_s")
    add(
        "API req/gang, both controllers",
        g["controllers_requests_per_gang"],
        k["controllers_requests_per_gang"],
    )
    add(
        "  of which gangcheck's user",
        g["gangcheck_requests_per_gang"],
        k["gangcheck_requests_per_gang"],
    )
    add("  of which Kueue's user", g["kueue_requests_per_gang"], k["kueue_requests_per_gang"])
    add(
        "  of which Events after the burst",
        g["late_events_per_gang"],
        k["late_events_per_gang"],
    )
    add(
        "API req/gang, the check alone (all)",
        g["check_requests_per_gang"],
        k["check_requests_per_gang"],
    )
    add("  of which Events", g["check_events_per_gang"], k["check_events_per_gang"])
    add("  of which node ledger writes", g["node_ledger_writes_per_gang"], None)
    add("  of which request phase records", g["phase_records_per_gang"], None)
    add("  of which leader election (Leases)", g["leader_election_requests_per_gang"], None)
    add(
        "API writes/gang, the check alone (all)",
        g["check_writes_per_gang"],
        k["check_writes_per_gang"],
    )
    add("  of which Lease writes", g["lease_writes_per_gang"], None)
    add(
        "Workload reconciles/gang, the check",
        g.get("workload_reconciles_per_gang"),
        k.get("workload_reconciles_per_gang"),
    )
    add(
        "ProvisioningRequestCreated Events/request",
        g["created_events_per_request"],
        k["created_events_per_request"],
    )
    add("controller RSS at the end", g["rss_mib"], k["rss_mib"], " MiB", 0)
    add("process CPU during the burst", g["cpu_s"], k["cpu_s"], " s", 1)
    add("check CPU during the burst", g.get("check_cpu_s"), k.get("check_cpu_s"), " s", 1)
    add(
        "check CPU per Workload handled",
        g.get("check_cpu_ms_per_workload"),
        k.get("check_cpu_ms_per_workload"),
        " ms",
        2,
    )
    add(
        "process CPU per Workload handled",
        g.get("process_cpu_ms_per_workload"),
        k.get("process_cpu_ms_per_workload"),
        " ms",
        2,
    )
    return out


def print_table(result: dict[str, Any]) -> None:
    n = result["n"]
    state = (
        ""
        if result["complete"]
        else (
            "  (INCOMPLETE: not every gang was admitted; per-gang figures divide by N and do not "
            "compare)"
        )
    )
    if result.get("gangcheck_exited_s") is not None:
        state += (
            f"\nGANGCHECK EXITED {result['gangcheck_exited_s']:.0f} s after the burst started: "
            "its figures stop there (RSS and CPU: last sample before it exited)"
        )
    print(
        f"\nN = {n} gangs of {result['members']} pods per side, {result['nodes']} nodes; "
        f"Jobs created in {result['jobs_created_s']:.1f} s, run {result['burst_s']:.1f} s "
        f"(Events until {result['events_settled_s']:.0f} s after), "
        f"provisioner {result['provisioner']}{state}"
    )
    head = ("", LABELS["gangcheck"], LABELS["kueue"], "ratio")
    print(f"{head[0]:36} {head[1]:>22} {head[2]:>22} {head[3]:>8}")
    for label, a, b, ratio in rows(result):
        print(f"{label:36} {a:>22} {b:>22} {ratio:>8}")
    print(
        "times: watch-event receive times in this process (API conditions have 1 s resolution); "
        "Kueue's RSS and process CPU: one manager for both sides; Kueue's check CPU: "
        f"{_num(100 * result.get('kueue_check_cpu_share', math.nan), ' %', 1)} of its CPU "
        f"samples ({result.get('kueue_profiles', 0)} profiles of {PROFILE_SECONDS} s) have a "
        f"frame in {KUEUE_CHECK_PACKAGE}; gangcheck's: its whole process. Process CPU per "
        "Workload handled: gangcheck's over its N, Kueue's manager's over the 2N of both sides"
    )
    if "ready_path" in result:
        print("\n".join(ready_path.lines(result["ready_path"])))
    for line in result.get("settings", []):
        print(f"settings: {line}")


def run_gangcheck_from(source: Path) -> None:
    """gangcheck's processes started from now on (``deploy_gangcheck``, ``deploy_dispatcher``)
    run the package and apply the manifests of the source tree ``source`` (an earlier
    commit's checkout or worktree), not this checkout's. Changes the working folder."""
    source = source.resolve()
    deploy.repo_root = lambda: source  # type: ignore[attr-defined]
    # The child's sys.path starts with its working folder (python -c), ahead of its
    # PYTHONPATH: run it from the source folder, or this checkout's package is imported.
    os.chdir(source)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--sizes", default="500,2000", help="comma-separated N (gangs per side)")
    parser.add_argument("--timeout", type=float, default=0, help="seconds per N (default 120 + N)")
    parser.add_argument("--json", action="store_true", help="print the full figures as JSON too")
    parser.add_argument(
        "--provisioner",
        choices=("instant", "sim-cloud"),
        default="instant",
        help="what answers the requests (default: instant, see the module's doc)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, audit)")
    parser.add_argument(
        "--gangcheck-arg", action="append", default=[], help="an extra flag of gangcheck run"
    )
    parser.add_argument(
        "--gangcheck-source",
        type=Path,
        help="run gangcheck's package (and manifests) from this folder: an earlier commit's",
    )
    args = parser.parse_args(argv)
    if args.gangcheck_source is not None:
        run_gangcheck_from(args.gangcheck_source)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results = []
    for n in sizes:
        timeout = args.timeout or 120 + n
        result = run_size(
            n,
            timeout,
            args.gangcheck_arg,
            keep=args.keep,
            sim_cloud=args.provisioner == "sim-cloud",
        )
        print_table(result)
        results.append(result)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
