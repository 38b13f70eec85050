"""What gangcheck's MultiKueue dispatcher (``gangcheck run --role dispatcher``) costs the
manager cluster it runs in, for two gangcheck trees side by side in one run (issue 33): a
manager holding N Workloads, none waiting, and the dispatcher of each tree run in turn against
it for ``--seconds``, then (``--burst K``) with K of them turned waiting.

Run it:

    python benchmarks/dispatcher_load.py          # before = HEAD, after = this checkout
    python benchmarks/dispatcher_load.py --before-rev HEAD~1      # before = that commit
    python benchmarks/dispatcher_load.py --before DIR --after DIR [--workloads 2000]
        [--seconds 60] [--burst 10] [--burst-seconds 20] [--json] [--keep]

The trees: ``--before DIR`` / ``--after DIR`` are source trees of gangcheck (a checkout or a
``git worktree``); each tree's dispatcher runs its own package and its own
``manifests/dispatcher`` RBAC, as ``benchmarks/kueue_scale.py --gangcheck-source`` runs gangcheck
(:func:`benchmarks.kueue_scale.run_gangcheck_from`). Without ``--before``, the benchmark makes a
``git worktree`` of ``--before-rev`` (default ``HEAD``: the last commit, so that a change not
committed yet is compared with what it changes) in a temporary folder and removes it at the
end; without ``--after``, after is this checkout as it is (committed or not). Once a change is
committed, compare it with its parent: ``--before-rev HEAD~1`` (or the commit before it).

The bed, lean (the multi-cluster test bed's helpers, :mod:`gangcheck_dev.testbed`, no Kueue):

- the manager: etcd and kube-apiserver (its audit log on, for the dispatcher's user alone), the
  CRDs the test bed installs (Kueue's, from the pinned Go module); in it, as Kueue's MultiKueue
  setup has them (:mod:`gangcheck_dev.testbed.multicluster`): an AdmissionCheck of controller
  ``kueue.x-k8s.io/multikueue``, a MultiKueueConfig listing one worker, its MultiKueueCluster
  and kubeconfig Secret (``worker_kubeconfig``: MultiKueue's restricted identity in the worker),
  the check's and the cluster's ``Active`` condition written by the benchmark (Kueue does not
  run: the dispatcher only reads and writes objects);
- one worker: etcd and kube-apiserver with the same CRDs, an AdmissionCheck of gangcheck's
  controller ``Active`` (so the dispatcher takes the worker as running gangcheck), no nodes,
  no gangcheck Lease (not known: not skipped). It is only read in the burst;
- N Workloads (``--workloads``, default 2000) in one namespace, created before any dispatcher
  starts, each as Kueue makes it for a Job of 8 pods of 8 GPUs (one pod set, a container
  template with GPU requests, command, env, mounts; an ownerReference to its Job) with a
  status of a pending Workload (the MultiKueue check Pending; ``QuotaReserved`` False,
  ``Admitted`` False, ``Requeued`` True): none waits for the dispatcher (no quota reserved).

Each tree in turn (before first): its dispatcher deployed as a user deploys it
(``gangcheck_dev.testbed.deploy.deploy_dispatcher``: its ServiceAccount's token and the RBAC of
its tree's ``manifests/dispatcher``), ready (its first pass done), ``SETTLE`` seconds more, then:

- idle, ``--seconds``: nothing changes in the manager;
- burst (``--burst K``, K > 0): K Workloads turned waiting at once (quota reserved, as Kueue's
  scheduler writes it), then ``--burst-seconds``; the dispatcher nominates the worker (no nodes
  there: the gang does not fit now, it may still be tried) and passes go on while they stay
  unplaced. Afterwards the dispatcher is stopped and the K set back as they were (status,
  its record annotation), so the next tree starts from the same state.

Figures per phase, per tree (the table prints before | after | after/before):

- the dispatcher's API requests per second to the manager, by verb and resource, from the
  kube-apiserver's audit log (policy level Metadata, only the dispatcher's ServiceAccount;
  read as ``benchmarks/kueue_scale.py`` reads it, :func:`benchmarks.kueue_scale.audit_events`),
  its leader election's Lease requests apart; watches opened counted apart (a watch is one
  long request);
- response bytes per second, from the kube-apiserver's ``apiserver_response_sizes`` histogram
  (its sum, by verb and resource, what the server wrote: gzip-compressed when the client asks
  for it and the body is large) and the watch events' bytes
  (``apiserver_watch_events_sizes``); in this bed only the dispatcher lists or watches
  Workloads; and the Workload JSON the dispatcher decodes per second: its LISTs of Workloads
  times the size of one LIST of them all, unzipped (measured once, printed above the table);
- the dispatcher's CPU seconds (``/proc/PID/stat``), its RSS at the end and its peak
  (``VmHWM``); the manager's kube-apiserver's and etcd's CPU seconds in the same window (and,
  once before any dispatcher, ``BASELINE`` seconds of them with no dispatcher).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed.deploy import DISPATCHER_ACCOUNT, NAMESPACE, deploy_dispatcher
from gangcheck_dev.testbed.launcher import APISERVER, ETCD, ControlPlane
from gangcheck_dev.testbed.multicluster import (
    CHECK,
    CHECKS_PATH,
    wire_multikueue,
)
from gangcheck_dev.testbed.stack import KUEUE_NAMESPACE

from benchmarks.kueue_scale import (
    api_time,
    audit_events,
    cpu_seconds,
    rss_mib,
    run_gangcheck_from,
)
from gangcheck.kube.client import Kube
from gangcheck.kube.resources import ADMISSION_CHECK, MULTIKUEUE_CLUSTER, WORKLOAD
from gangcheck.logic.dispatch import RECORD_ANNOTATION
from gangcheck.logic.timefmt import format_time
from tests.builders import WorkloadBuilder, pod_template

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parent.parent
WORKER = "worker-1"
BENCH_NAMESPACE = "bench"
GANGCHECK_CONTROLLER = "gangcheck.io/atomic-provisioning"
DISPATCHER_USER = f"system:serviceaccount:{NAMESPACE}:{DISPATCHER_ACCOUNT}"
#: A Job's Workload: one pod set of MEMBERS pods, each of GPUS GPUs.
MEMBERS, GPUS = 8, 8
CREATE_CONCURRENCY = 16
#: Seconds after the dispatcher is ready (its first pass done) before a window starts.
SETTLE = 3.0
#: Seconds of the manager's kube-apiserver and etcd with no dispatcher, measured once.
BASELINE = 10.0
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "users": [DISPATCHER_USER]}, {"level": "None"}],
}
TREES = ("before", "after")


# -- the bed ----------------------------------------------------------------------------------


def start_planes(workdir: Path) -> tuple[ControlPlane, ControlPlane]:
    """The manager (audit log on) and the worker, started side by side."""
    audit = workdir / "audit"
    audit.mkdir(parents=True)
    policy = audit / "policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
    manager = ControlPlane(
        workdir / "manager",
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=100000",  # MB: never rotated during a run
        ],
    )
    worker = ControlPlane(workdir / WORKER)
    failures: list[BaseException] = []

    def start(plane: ControlPlane) -> None:
        try:
            plane.start()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in (manager, worker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        manager.stop()
        worker.stop()
        raise failures[0]
    return manager, worker


def wire(manager: ControlPlane, worker: ControlPlane) -> None:
    """MultiKueue's objects in the manager for the one worker (as the multi-cluster bed makes
    them), gangcheck's AdmissionCheck in the worker; the namespaces the dispatcher's RBAC and
    MultiKueue's identity need."""
    for plane, names in (
        (manager, (KUEUE_NAMESPACE, BENCH_NAMESPACE)),
        (worker, (KUEUE_NAMESPACE, NAMESPACE)),
    ):
        for name in names:
            plane.ensure_namespace(name)
    wire_multikueue(manager.client(), {WORKER: worker})
    worker.client().apply(
        f"{CHECKS_PATH}/gangcheck",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": "gangcheck"},
            "spec": {"controllerName": GANGCHECK_CONTROLLER},
        },
        crds.FIELD_MANAGER,
    )


async def activate(manager: Kube, worker: Kube) -> None:
    """The ``Active`` conditions Kueue (manager) and gangcheck (worker) would write."""
    active = {
        "status": {
            "conditions": [
                {
                    "type": "Active",
                    "status": "True",
                    "reason": "Active",
                    "message": "written by the benchmark",
                    "lastTransitionTime": format_time(_now()),
                    "observedGeneration": 1,
                }
            ]
        }
    }
    await manager.merge_patch(MULTIKUEUE_CLUSTER, WORKER, active, subresource="status")
    await manager.merge_patch(ADMISSION_CHECK, CHECK, active, subresource="status")
    await worker.merge_patch(ADMISSION_CHECK, "gangcheck", active, subresource="status")


def _now() -> datetime:
    return datetime.now(UTC)


# -- the Workloads ----------------------------------------------------------------------------


def job_workload(i: int) -> tuple[Obj, Obj]:
    """(the object to create, its status): a Job's Workload as Kueue makes it, pending."""
    name = f"train-{i:05d}"
    template = pod_template(
        cpu="90",
        gpu=GPUS,
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        node_selector={"gangcheck.io/gpu-type": "h100"},
    )
    template["metadata"] = {
        "labels": {
            "batch.kubernetes.io/job-name": name,
            "batch.kubernetes.io/controller-uid": f"00000000-0000-4000-8000-{i:012d}",
            "kueue.x-k8s.io/queue-name": "lq",
        },
        "annotations": {"kueue.x-k8s.io/podset": "main"},
    }
    main = template["spec"]["containers"][0]
    main["image"] = "registry.example/ml/trainer:2026.11.3"
    main["resources"]["requests"]["memory"] = "900Gi"
    main["command"] = ["torchrun"]
    main["args"] = [
        f"--nnodes={MEMBERS}",
        f"--nproc-per-node={GPUS}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{name}:29500",
        "train.py",
        "--config=/etc/train/config.yaml",
    ]
    main["env"] = [
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "CHECKPOINT_DIR", "value": f"/checkpoints/{name}"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    main["volumeMounts"] = [
        {"name": "config", "mountPath": "/etc/train"},
        {"name": "checkpoints", "mountPath": "/checkpoints"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    template["spec"]["volumes"] = [
        {"name": "config", "configMap": {"name": f"{name}-config"}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
    ]
    template["spec"]["subdomain"] = name
    built = (
        WorkloadBuilder(f"job-{name}-{i % 100000:05x}", BENCH_NAMESPACE)
        .pod_set("main", MEMBERS, template)
        .check(CHECK, "Pending")
        .condition("QuotaReserved", "False", "Pending")
        .condition("Admitted", "False", "NoReservation")
        .condition("Requeued", "True", "BackoffFinished")
        .build()
    )
    messages = {
        "QuotaReserved": "couldn't assign flavors to pod set main: insufficient unused quota "
        "for nvidia.com/gpu in flavor h100, 64 more needed",
        "Admitted": "The workload has no reservation",
        "Requeued": "The workload backoff was finished",
    }
    status = built.pop("status")
    stamp = format_time(_now())
    for cond in status["conditions"]:
        cond["message"] = messages[cond["type"]]
        cond["lastTransitionTime"] = stamp
    for entry in status["admissionChecks"]:
        entry["lastTransitionTime"] = stamp
    meta = built["metadata"]
    for key in ("uid", "resourceVersion"):
        meta.pop(key, None)
    meta["labels"] = {"kueue.x-k8s.io/job-uid": f"00000000-0000-4000-8000-{i:012d}"}
    meta["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    built["spec"]["priority"] = 0
    return built, status


async def create_workloads(kube: Kube, n: int) -> list[str]:
    """N Workloads with their pending status; their names."""
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    names: list[str] = []

    async def one(i: int) -> None:
        obj, status = job_workload(i)
        async with limit:
            created = await kube.create(WORKLOAD, obj, BENCH_NAMESPACE)
            created["status"] = status
            await kube.replace(WORKLOAD, created, subresource="status")
        names.append(str(obj["metadata"]["name"]))

    await asyncio.gather(*(one(i) for i in range(n)))
    return sorted(names)


@dataclass
class Burst:
    """K Workloads turned waiting (quota reserved) and set back afterwards."""

    kube: Kube
    names: Sequence[str]
    saved: dict[str, Obj] = field(default_factory=dict)

    async def reserve(self) -> None:
        async def one(name: str) -> None:
            wl = await self.kube.get(WORKLOAD, name, BENCH_NAMESPACE)
            self.saved[name] = copy.deepcopy(wl.get("status") or {})
            status = wl["status"]
            status["admission"] = {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "flavors": {"nvidia.com/gpu": "h100", "cpu": "h100", "memory": "h100"},
                        "count": MEMBERS,
                        "resourceUsage": {
                            "nvidia.com/gpu": str(MEMBERS * GPUS),
                            "cpu": str(MEMBERS * 90),
                            "memory": f"{MEMBERS * 900}Gi",
                        },
                    }
                ],
            }
            stamp = format_time(_now())
            status["conditions"] = [
                c for c in status["conditions"] if c["type"] not in ("QuotaReserved", "Admitted")
            ] + [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "Quota reserved in ClusterQueue cq",
                    "lastTransitionTime": stamp,
                },
                {
                    "type": "Admitted",
                    "status": "False",
                    "reason": "NoReservationUnsatisfiedChecks",
                    "message": "The workload has not all checks ready",
                    "lastTransitionTime": stamp,
                },
            ]
            await self.kube.replace(WORKLOAD, wl, subresource="status")

        await asyncio.gather(*(one(name) for name in self.names))

    async def restore(self) -> None:
        """Each Workload's status as it was, its dispatch record removed."""

        async def one(name: str) -> None:
            wl = await self.kube.get(WORKLOAD, name, BENCH_NAMESPACE)
            wl["status"] = self.saved[name]
            await self.kube.replace(WORKLOAD, wl, subresource="status")
            drop = {"metadata": {"annotations": {RECORD_ANNOTATION: None}}}
            await self.kube.merge_patch(WORKLOAD, name, drop, BENCH_NAMESPACE)

        await asyncio.gather(*(one(name) for name in self.saved))
        self.saved.clear()


# -- what is measured -------------------------------------------------------------------------


_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


Sums = dict[str, float]


def metric_sums(text: str, name: str) -> Sums:
    """``NAME_sum`` samples of a histogram by "verb resource[/subresource]", resources only."""
    out: Sums = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != f"{name}_sum":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        resource = labels.get("resource", "")
        if not resource:  # a path (/openapi, /metrics ...), not the dispatcher's
            continue
        if labels.get("subresource"):
            resource += f"/{labels['subresource']}"
        verb = labels.get("verb", "WATCH")
        key = f"{verb} {resource}".strip()
        out[key] = out.get(key, 0.0) + float(match.group(3))
    return out


def grown(after: Sums, before: Sums) -> Sums:
    """What each sum grew by (those that grew)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}


def scrape(plane: ControlPlane) -> tuple[Sums, Sums]:
    """(response bytes, watch event bytes) the kube-apiserver has counted so far."""
    reply = plane.client().request("GET", "/metrics")
    text = reply.body.decode()
    return (
        metric_sums(text, "apiserver_response_sizes"),
        metric_sums(text, "apiserver_watch_events_sizes"),
    )


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


@dataclass
class Window:
    start: float
    cpu: dict[str, float]
    sizes: tuple[Sums, Sums]


def open_window(plane: ControlPlane, pids: dict[str, int]) -> Window:
    return Window(time.time(), {k: cpu_seconds(p) for k, p in pids.items()}, scrape(plane))


def close_window(plane: ControlPlane, pids: dict[str, int], window: Window, audit_dir: Path) -> Obj:
    end = time.time()
    cpu = {k: cpu_seconds(p) - window.cpu[k] for k, p in pids.items()}
    sizes = scrape(plane)
    seconds = end - window.start
    out: Obj = {
        "seconds": seconds,
        "cpu_s": cpu,
        "response_bytes": grown(sizes[0], window.sizes[0]),
        "watch_event_bytes": grown(sizes[1], window.sizes[1]),
    }
    if "dispatcher" in pids:
        out["rss_mib"] = rss_mib(pids["dispatcher"])
        out["peak_rss_mib"] = peak_rss_mib(pids["dispatcher"])
        time.sleep(1.0)  # the audit log's last records
        out["requests"] = count_requests(audit_dir, (window.start, end))
    return out


def count_requests(audit_dir: Path, window: tuple[float, float]) -> dict[str, int]:
    """The dispatcher's requests received in the window, by "verb resource[/sub]"; watches
    opened as "watch ...", its leader election's as "lease ..."."""
    counts: Counter[str] = Counter()
    for event in audit_events(audit_dir):
        if (event.get("user") or {}).get("username") != DISPATCHER_USER:
            continue
        began = api_time(event.get("requestReceivedTimestamp"))
        if began is None or not window[0] <= began <= window[1]:
            continue
        ref = event.get("objectRef") or {}
        resource = str(ref.get("resource") or event.get("requestURI") or "?")
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
        verb = str(event.get("verb"))
        key = f"lease {verb}" if resource == "leases" else f"{verb} {resource}"
        counts[key] += 1
    return dict(counts)


async def measure_tree(
    tree: Path,
    *,
    manager: ControlPlane,
    worker: ControlPlane,
    kube: Kube,
    workdir: Path,
    seconds: float,
    burst: Sequence[str],
    burst_seconds: float,
) -> Obj:
    """One tree's dispatcher: deployed, idle window, burst window, stopped, burst undone."""
    run_gangcheck_from(tree)
    apiserver, etcd = manager.components[APISERVER].pid, manager.components[ETCD].pid
    assert apiserver is not None and etcd is not None
    # Started and stopped from this (the main) thread: the child's parent-death signal is
    # bound to the thread that started it (gangcheck_dev.testbed.deploy).
    dispatcher = deploy_dispatcher(manager.kubeconfig, [worker.kubeconfig], workdir=workdir)
    result: Obj = {"tree": describe_tree(tree)}
    undo = Burst(kube, burst)
    try:
        pids = {"dispatcher": dispatcher.pid, "kube-apiserver": apiserver, "etcd": etcd}
        await asyncio.sleep(SETTLE)
        window = open_window(manager, pids)
        await asyncio.sleep(seconds)
        result["idle"] = await asyncio.to_thread(
            close_window, manager, pids, window, workdir.parent / "audit"
        )
        if burst:
            await undo.reserve()
            window = open_window(manager, pids)
            await asyncio.sleep(burst_seconds)
            result["burst"] = await asyncio.to_thread(
                close_window, manager, pids, window, workdir.parent / "audit"
            )
        result["exited"] = not dispatcher.running
    finally:
        if not dispatcher.running:
            print(f"the {tree} dispatcher exited:\n{dispatcher.log_tail(30)}", file=sys.stderr)
        dispatcher.stop()
        await undo.restore()
    return result


def describe_tree(tree: Path) -> str:
    """The tree's commit, '+ changes' when gangcheck/ differs from it."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--", "gangcheck", "manifests"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git tree)"
    return commit + (" + changes not committed" if changed else "")


# -- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def tree_of(rev: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``rev`` in a temporary folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="dispatcher-load-before-"))
    path = folder / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev],
        check=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False
        )
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)


async def run(
    trees: dict[str, Path],
    workdir: Path,
    *,
    n: int,
    seconds: float,
    k: int,
    burst_seconds: float,
) -> Obj:
    manager, worker = start_planes(workdir)
    try:
        wire(manager, worker)
        result: Obj = {"workloads": n, "seconds": seconds, "burst": k}
        async with (
            await Kube.connect(str(manager.kubeconfig)) as kube,
            await Kube.connect(str(worker.kubeconfig)) as worker_kube,
        ):
            await activate(kube, worker_kube)
            began = time.monotonic()
            names = await create_workloads(kube, n)
            result["created_s"] = time.monotonic() - began
            listing = manager.client().request(
                "GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{BENCH_NAMESPACE}/workloads"
            )
            result["list_json_bytes"] = len(listing.body)
            pids = {
                "kube-apiserver": manager.components[APISERVER].pid or 0,
                "etcd": manager.components[ETCD].pid or 0,
            }
            await asyncio.sleep(SETTLE)
            window = open_window(manager, pids)
            await asyncio.sleep(BASELINE)
            result["baseline"] = close_window(manager, pids, window, workdir / "audit")
            for side in TREES:
                print(f"{side}: {trees[side]}", file=sys.stderr)
                result[side] = await measure_tree(
                    trees[side],
                    manager=manager,
                    worker=worker,
                    kube=kube,
                    workdir=workdir / side,
                    seconds=seconds,
                    burst=names[:k],
                    burst_seconds=burst_seconds,
                )
        return result
    finally:
        manager.stop()
        worker.stop()


# -- the table --------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(before: float | None, after: float | None) -> str:
    if before is None or after is None or math.isnan(before) or math.isnan(after):
        return "-"
    if before == 0:
        return "-" if after == 0 else "new"
    return f"{after / before:.3f}"


def phase_rows(result: Obj, phase: str) -> list[tuple[str, float | None, float | None]]:
    sides = [result[t].get(phase) or {} for t in TREES]
    rows: list[tuple[str, float | None, float | None]] = []

    def per_s(side: Obj, value: float) -> float:
        return value / side["seconds"] if side.get("seconds") else math.nan

    def add(label: str, values: list[float | None]) -> None:
        rows.append((label, values[0], values[1]))

    requests = [side.get("requests") or {} for side in sides]
    keys = sorted(set().union(*requests))
    add(
        "requests/s (not watch, lease)",
        [
            per_s(s, sum(v for k, v in r.items() if not k.startswith(("watch", "lease"))))
            for s, r in zip(sides, requests, strict=True)
        ],
    )
    for key in keys:
        add(f"  {key} /s", [per_s(s, r.get(key, 0)) for s, r in zip(sides, requests, strict=True)])
    responses = [side.get("response_bytes") or {} for side in sides]
    add(
        "response KiB/s (all)",
        [per_s(s, sum(r.values()) / 1024) for s, r in zip(sides, responses, strict=True)],
    )
    for key in sorted(set().union(*responses)):
        if any(per_s(s, r.get(key, 0)) >= 1024 for s, r in zip(sides, responses, strict=True)):
            add(
                f"  {key} KiB/s",
                [per_s(s, r.get(key, 0) / 1024) for s, r in zip(sides, responses, strict=True)],
            )
    add(
        "  Workload JSON decoded MiB/s",
        [
            per_s(s, r.get("list workloads", 0) * result["list_json_bytes"] / 1024 / 1024)
            for s, r in zip(sides, requests, strict=True)
        ],
    )
    watched = [side.get("watch_event_bytes") or {} for side in sides]
    add(
        "watch event KiB/s",
        [per_s(s, sum(w.values()) / 1024) for s, w in zip(sides, watched, strict=True)],
    )
    for who in ("dispatcher", "kube-apiserver", "etcd"):
        add(
            f"{who} CPU s/min",
            [per_s(s, 60 * (s.get("cpu_s") or {}).get(who, math.nan)) for s in sides],
        )
    add("dispatcher RSS MiB (end)", [s.get("rss_mib") for s in sides])
    add("dispatcher RSS MiB (peak)", [s.get("peak_rss_mib") for s in sides])
    return rows


def print_table(result: Obj, settings: Sequence[str]) -> None:
    print(
        f"\nN = {result['workloads']} Workloads in the manager (created in "
        f"{result['created_s']:.0f} s; a LIST of them all is "
        f"{result['list_json_bytes'] / 1024 / 1024:.1f} MiB of JSON)"
    )
    for side in TREES:
        print(f"{side}: {result[side]['tree']}")
    base = result["baseline"]
    print(
        f"with no dispatcher ({base['seconds']:.0f} s): kube-apiserver "
        f"{60 * base['cpu_s']['kube-apiserver'] / base['seconds']:.2f} CPU s/min, etcd "
        f"{60 * base['cpu_s']['etcd'] / base['seconds']:.2f} CPU s/min"
    )
    for phase, title in (
        ("idle", f"idle, {result['seconds']:.0f} s, no Workload waiting"),
        ("burst", f"burst: {result['burst']} Workloads waiting"),
    ):
        if not any(phase in result[t] for t in TREES):
            continue
        print(f"\n{title}")
        print(f"{'':40} {'before':>12} {'after':>12} {'after/before':>13}")
        for label, before, after in phase_rows(result, phase):
            print(f"{label:40} {_num(before):>12} {_num(after):>12} {_ratio(before, after):>13}")
    for side in TREES:
        if result[side].get("exited"):
            print(f"THE {side.upper()} DISPATCHER EXITED during its run: its figures stop there")
    for line in settings:
        print(f"settings: {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--before", type=Path, help="gangcheck source tree run as 'before'")
    parser.add_argument(
        "--before-rev",
        default="HEAD",
        help="without --before: a git worktree of this revision (default HEAD)",
    )
    parser.add_argument(
        "--after",
        type=Path,
        default=REPO,
        help="gangcheck source tree run as 'after' (default: this checkout)",
    )
    parser.add_argument("--workloads", type=int, default=2000, help="N (default 2000)")
    parser.add_argument("--seconds", type=float, default=60, help="idle window (default 60)")
    parser.add_argument(
        "--burst", type=int, default=10, help="K Workloads turned waiting (0: none)"
    )
    parser.add_argument("--burst-seconds", type=float, default=20, help="burst window (default 20)")
    parser.add_argument("--json", action="store_true", help="print the full figures as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, audit)")
    args = parser.parse_args(argv)
    if not 0 <= args.burst <= args.workloads:
        parser.error("--burst must be between 0 and --workloads")
    settings = [
        f"--workloads {args.workloads} --seconds {args.seconds:g} --burst {args.burst} "
        f"--burst-seconds {args.burst_seconds:g}",
        f"a Workload: 1 pod set of {MEMBERS} pods of {GPUS} GPUs, pending (3 conditions, the "
        "MultiKueue check Pending); one worker listed, read only in the burst",
        "the dispatcher: as deploy_dispatcher runs it (its defaults; leader election on, "
        "its Lease requests apart); before runs first, then after, on the same manager",
    ]
    cwd = Path.cwd()
    workdir = Path(tempfile.mkdtemp(prefix="dispatcher-load-"))
    try:
        with contextlib.ExitStack() as stack:
            before = args.before or stack.enter_context(tree_of(args.before_rev))
            trees = {"before": before.resolve(), "after": args.after.resolve()}
            try:
                result = asyncio.run(
                    run(
                        trees,
                        workdir,
                        n=args.workloads,
                        seconds=args.seconds,
                        k=args.burst,
                        burst_seconds=args.burst_seconds,
                    )
                )
            finally:
                os.chdir(cwd)  # out of the trees (run_gangcheck_from), before one is removed
            print_table(result, settings)
            if args.json:
                print(json.dumps(result, indent=1))
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
