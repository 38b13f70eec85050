"""The demo: the local full stack, gangcheck running as a user deploys it, three GPU gangs.

``gangcheck-dev demo up`` starts the stack (building it on first use), deploys gangcheck with its
own ServiceAccount, its webhook and the simulated cloud, then submits two batch/v1 Jobs through
Kueue: ``whole`` gets all its nodes; ``partial`` gets half of them on its first attempt, which
gangcheck rolls back (reclaiming those nodes) and retries until the gang starts. The third,
``ddp``, never passes through Kueue: a PodGroup whose members the webhook gates at creation,
released together once their nodes exist. A live table follows all three; a summary ends
it. The stack stays up to explore; ``gangcheck-dev demo down`` (or
``make demo-down``) removes all of it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import AlreadyExistsError, NotFoundError
from gangcheck.kube.resources import (
    ADMISSION_CHECK,
    ATOMIC_CONFIG,
    CLUSTER_QUEUE,
    JOB,
    LOCAL_QUEUE,
    MUTATING_WEBHOOK,
    NAMESPACE,
    NODE,
    POD,
    PROVISIONING_REQUEST,
    RESOURCE_FLAVOR,
    UPSTREAM_POD_GROUP_V1BETA1,
    WORKLOAD,
)
from gangcheck.logic.podgroups.gating import OPT_IN_VALUE
from gangcheck.model.names import (
    ARRIVED_FOR,
    ATTEMPT_ANNOTATION,
    GATE,
    MESSAGE_ANNOTATION,
    OPT_IN_LABEL,
    STATE_ANNOTATION,
)
from gangcheck.model.objects import Obj
from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.certs import CertificateAuthority
from gangcheck_dev.testbed.deploy import deploy_gangcheck, http_ok, start_sim_cloud
from gangcheck_dev.testbed.process import (
    free_ports,
    kill_group,
    log_tail,
    pid_alive,
    pid_cmdline,
    processes_mentioning,
)

NAMESPACE_NAME = "demo"
SIM_CLASS = "sim.gangcheck.io"
POOL_LABEL = "gangcheck.io/pool"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
MEMBERS, GPUS_PER_MEMBER = 4, 8
PROCESSES_FILE = "demo-processes.json"
SIM_CONFIG_MAP = f"{NAMESPACE_NAME}/sim-cloud"
JOB_GANGS = ("whole", "partial")
GROUP = "ddp"
"""The PodGroup gang (no Kueue): gated by the webhook, released together."""
GANGS = (*JOB_GANGS, GROUP)
WEBHOOK_NAME = "gangcheck-demo"
READY_TIMEOUT = 60.0
"""How long the controller left running may take to answer /readyz."""
STOP_TIMEOUT = 15.0
#: How long `stop_recorded` waits for what it SIGKILLed to be gone (a loaded machine takes
#: a moment to tear a process down).
KILL_WAIT = 10.0
"""How long `demo down` waits for what it stops before SIGKILL."""


def sim_config() -> dict[str, Any]:
    """One GPU node group per gang (a shared pool would go to the oldest gang waiting)."""
    return {
        "provisioningClassNames": [SIM_CLASS],
        "namespaces": [NAMESPACE_NAME],
        "nodeGroups": [
            {
                "name": f"demo-{gang}",
                "maxNodes": 8,
                "cpu": "32",
                "memory": "256Gi",
                "gpus": 8,
                "labels": {POOL_LABEL: gang},
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            }
            for gang in GANGS
        ],
        "scenarios": [
            {"name": "half", "match": {"name": "job-partial-.*-1"}, "deliver": MEMBERS // 2,
             "nodeDelaySeconds": [2, 3]},
            {"name": "whole", "nodeDelaySeconds": [2, 3, 4, 5]},
        ],
    }  # fmt: skip


def setup_objects() -> list[tuple[Any, Obj]]:
    objects: list[tuple[Any, Obj]] = [
        (NAMESPACE, {"metadata": {"name": NAMESPACE_NAME}}),
        (ATOMIC_CONFIG, {"metadata": {"name": "demo"}, "spec": {
            "provisioningClassName": SIM_CLASS,
            "allowCustomProvisioningClass": True,
            "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 5},
            "fulfillment": {"mode": "NodesFit", "deadlineSeconds": 20, "reclaimer": "DeleteNode"},
        }}),
        (ADMISSION_CHECK, {"metadata": {"name": "atomic"}, "spec": {
            "controllerName": "gangcheck.io/atomic-provisioning",
            "parameters": {"apiGroup": "gangcheck.io", "kind": "AtomicProvisioningConfig",
                           "name": "demo"},
        }}),
    ]  # fmt: skip
    for gang in JOB_GANGS:
        objects += _queue_objects(gang)
    return objects


def pod_group() -> Obj:
    return {
        "metadata": {"name": GROUP, "namespace": NAMESPACE_NAME,
                     "annotations": {"gangcheck.io/provisioning-config": "demo"}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": MEMBERS}}},
    }  # fmt: skip


def member(index: int) -> Obj:
    spec = job(GROUP)["spec"]["template"]["spec"]
    return {
        "metadata": {"name": f"{GROUP}-{index}", "namespace": NAMESPACE_NAME},
        "spec": {**spec, "schedulingGroup": {"podGroupName": GROUP},
                 "nodeSelector": {POOL_LABEL: GROUP}, "tolerations": [GPU_TOLERATION]},
    }  # fmt: skip


def webhook_configuration(url: str, ca_pem: bytes) -> Obj:
    """manifests/base/webhook.yaml, reaching gangcheck on loopback by URL."""
    rule = {
        "operations": ["CREATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
        "scope": "Namespaced",
    }
    return {
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [{
            "name": "pods.gangcheck.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [rule],
            "namespaceSelector": {"matchLabels": {OPT_IN_LABEL: OPT_IN_VALUE}},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
        }],
    }  # fmt: skip


def _queue_objects(gang: str) -> list[tuple[Any, Obj]]:
    """A flavor on the gang's node group, a ClusterQueue using our check, a LocalQueue."""
    quota = [
        {"name": "cpu", "nominalQuota": "128"},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": "64"},
    ]
    flavor = f"demo-{gang}"
    return [
        (RESOURCE_FLAVOR, {"metadata": {"name": flavor},
                           "spec": {"nodeLabels": {POOL_LABEL: gang},
                                    "tolerations": [GPU_TOLERATION]}}),
        (CLUSTER_QUEUE, {"metadata": {"name": flavor}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                "flavors": [{"name": flavor, "resources": quota}]}],
            "admissionChecksStrategy": {"admissionChecks": [{"name": "atomic"}]},
        }}),
        (LOCAL_QUEUE, {"metadata": {"name": gang, "namespace": NAMESPACE_NAME},
                       "spec": {"clusterQueue": flavor}}),
    ]  # fmt: skip


def job(name: str) -> Obj:
    gpus = str(GPUS_PER_MEMBER)
    container = {
        "name": "trainer",
        "image": "trainer:demo",
        "resources": {
            "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": gpus},
            "limits": {"nvidia.com/gpu": gpus},
        },
    }
    return {
        "metadata": {"name": name, "namespace": NAMESPACE_NAME,
                     "labels": {"kueue.x-k8s.io/queue-name": name}},
        "spec": {"parallelism": MEMBERS, "completions": MEMBERS, "suspend": True,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }  # fmt: skip


@dataclass
class Gang:
    name: str
    submitted: float
    started: float | None = None
    state: str = "-"
    attempt: int = 1
    message: str = ""
    arrived: int = 0
    running: int = 0
    rollbacks: int = 0


async def _create_all(kube: Kube, objects: list[tuple[Any, Obj]]) -> None:
    for res, body in objects:
        with contextlib.suppress(AlreadyExistsError):
            await kube.create(res, body)


async def _observe(kube: Kube, gang: Gang) -> None:
    if gang.name == GROUP:
        await _observe_group(kube, gang)
        return
    wl = await _workload_of(kube, gang.name)
    if wl is None:
        gang.state, gang.message = "queued", "waiting for Kueue to create the Workload"
    else:
        checks: list[Obj] = (wl.get("status") or {}).get("admissionChecks") or []
        entry: Obj = checks[0] if checks else {}
        gang.state = entry.get("state", "-")
        gang.attempt = int(entry.get("retryCount") or 0) + 1
        gang.message = entry.get("message", "")
        request = f"{NAMESPACE_NAME}/{wl['metadata']['name']}-atomic-{gang.attempt}"
        nodes = (await kube.list_objects(NODE)).get("items") or []
        gang.arrived = sum(
            1 for n in nodes if (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR) == request
        )
    pods = await kube.list_objects(
        POD, NAMESPACE_NAME, label_selector=f"batch.kubernetes.io/job-name={gang.name}"
    )
    gang.running = sum(1 for p in pods.get("items") or [] if p["status"].get("phase") == "Running")
    gang.rollbacks = max(gang.rollbacks, gang.attempt - 1)
    if gang.running >= MEMBERS and gang.started is None:
        gang.started = time.monotonic()


async def _observe_group(kube: Kube, gang: Gang) -> None:
    group = await kube.get(UPSTREAM_POD_GROUP_V1BETA1, GROUP, NAMESPACE_NAME)
    notes = group["metadata"].get("annotations") or {}
    gang.state = notes.get(STATE_ANNOTATION, "-")
    gang.message = notes.get(MESSAGE_ANNOTATION, "")
    gang.attempt = int(notes.get(ATTEMPT_ANNOTATION, "1"))
    request = f"{NAMESPACE_NAME}/{GROUP}-pg-{gang.attempt}"
    nodes = (await kube.list_objects(NODE)).get("items") or []
    gang.arrived = sum(
        1 for n in nodes if (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR) == request
    )
    pods = (await kube.list_objects(POD, NAMESPACE_NAME)).get("items") or []
    mine = [p for p in pods if p["metadata"]["name"].startswith(f"{GROUP}-")]
    gang.running = sum(1 for p in mine if (p.get("status") or {}).get("phase") == "Running")
    gang.rollbacks = max(gang.rollbacks, gang.attempt - 1)
    if gang.running >= MEMBERS and gang.started is None:
        gang.started = time.monotonic()


async def _workload_of(kube: Kube, job_name: str) -> Obj | None:
    listing = await kube.list_objects(WORKLOAD, NAMESPACE_NAME)
    for wl in listing.get("items") or []:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Job" and o.get("name") == job_name for o in owners):
            return dict(wl)
    return None


def _table(gangs: list[Gang], out: TextIO) -> None:
    now = time.monotonic()
    out.write(f"\n{'gang':8} {'age':>5} {'state':12} {'try':>3} {'nodes':>5} {'running':>7}  why\n")
    for g in gangs:
        age = f"{(g.started or now) - g.submitted:.0f}s"
        why = g.message if len(g.message) <= 70 else g.message[:67] + "..."
        out.write(
            f"{g.name:8} {age:>5} {g.state[:12]:12} {g.attempt:>3} {g.arrived:>5} "
            f"{g.running:>5}/{MEMBERS}  {why}\n"
        )
    out.flush()


async def run_scenario(kube: Kube, out: TextIO, *, timeout: float = 240.0) -> list[Gang]:
    await _create_all(kube, setup_objects())
    gangs = []
    for name in JOB_GANGS:
        await _create_all(kube, [(JOB, job(name))])
        gangs.append(Gang(name, time.monotonic()))
    await _create_all(kube, [(UPSTREAM_POD_GROUP_V1BETA1, pod_group())])
    gangs.append(Gang(GROUP, time.monotonic()))
    await _create_all(kube, [(POD, member(i)) for i in range(MEMBERS)])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(g.started for g in gangs):
        for gang in gangs:
            await _observe(kube, gang)
        _table(gangs, out)
        await asyncio.sleep(3)
    return gangs


def _summary(gangs: list[Gang], kube_requests: int, out: TextIO) -> None:
    out.write("\nsummary\n")
    for g in gangs:
        if g.started:
            line = f"started after {g.started - g.submitted:.0f}s, attempt {g.attempt}"
        else:
            line = f"not started ({g.message})"
        out.write(f"  {g.name:8} {line}\n")
    out.write(f"  provisioning requests left: {kube_requests}\n")


def up(state_dir: Path | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    state_dir = state_dir or dev.default_state_dir()
    info = dev.up(state_dir, out=out, stack="full")
    stop_recorded(state_dir)  # a demo already up: its processes make way for this one's
    stop_leftovers(state_dir)
    work = state_dir / "demo"
    work.mkdir(parents=True, exist_ok=True)
    out.write("starting gangcheck (its own ServiceAccount, its webhook) and the simulated cloud\n")
    asyncio.run(_namespace(info.kubeconfig))
    certs, url, ca_pem = _webhook_certs(work)
    webhook = ["--webhook-port", url.rsplit(":", 1)[1].split("/")[0], "--webhook-cert-dir", certs]
    # Deployed as a user deploys it (RBAC, a token of its ServiceAccount), then run detached on
    # that token: the controller that runs the gangs stays up to explore, its metrics with them.
    controller = deploy_gangcheck(info.kubeconfig, workdir=work, extra_args=webhook)
    controller.stop()
    health, metrics = free_ports(2)
    run = explore_run_args(controller.kubeconfig, health, metrics, webhook)
    log = work / "gangcheck.log"
    pids = [_detached("gangcheck", run, log)]
    (state_dir / PROCESSES_FILE).write_text(json.dumps(pids))  # `demo down` stops it
    if not _ready(pids[0], f"http://127.0.0.1:{health}/readyz"):
        out.write(f"\ngangcheck did not start (its log: {log}):\n{log_tail(log)}\n")
        out.write("remove everything with: make demo-down\n")
        return 1
    sim = start_sim_cloud(
        info.kubeconfig, workdir=work, config_map=SIM_CONFIG_MAP, config=sim_config()
    )
    try:
        asyncio.run(_register_webhook(info.kubeconfig, url, ca_pem))
        gangs = asyncio.run(_scenario(info.kubeconfig, out))
    finally:
        sim.stop()
    controller.stop()  # again: raises if the log tells of writes the API server refused
    # The simulated cloud stopped with this command's process; start it again, detached.
    sim_args = ["sim-cloud", "--kubeconfig", str(info.kubeconfig), "--config-map", SIM_CONFIG_MAP]
    pids.append(_detached("gangcheck_dev", sim_args, work / "sim-cloud.log"))
    (state_dir / PROCESSES_FILE).write_text(json.dumps(pids))
    if not pid_alive(pids[0]):
        out.write(f"\ngangcheck did not stay up (its log: {log}):\n{log_tail(log)}\n")
        out.write("remove everything with: make demo-down\n")
        return 1
    out.write(explore_hints(info.kubeconfig, info.kubectl, metrics))
    return 0 if all(g.started for g in gangs) else 1


def explore_run_args(
    kubeconfig: Path, health_port: int, metrics_port: int, webhook: list[str]
) -> list[str]:
    """`gangcheck run`'s arguments for the demo's controller, which stays running: the demo's
    ServiceAccount, its webhook, health and metrics on the ports given (`gangcheck run` takes
    no 0)."""
    run = ["run", "--kubeconfig", str(kubeconfig), "--bind-address", "127.0.0.1"]
    return [*run, "--health-port", str(health_port), "--metrics-port", str(metrics_port), *webhook]


def _ready(pid: int, url: str, timeout: float = READY_TIMEOUT) -> bool:
    """Whether the process `pid` answers `url` within `timeout`; False once it has exited."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        if http_ok(url):
            return True
        time.sleep(0.2)
    return False


#: What the demo made, each by its full resource name: on Kubernetes 1.37 a bare `workloads`
#: is scheduling.k8s.io's Workload, not Kueue's, and `podgroups` could be either PodGroup.
EXPLORE = (
    "workloads.kueue.x-k8s.io",
    "provisioningrequests.autoscaling.x-k8s.io",
    "podgroups.scheduling.k8s.io",
    "nodes",
)


def explore_hints(kubeconfig: Path, kubectl: Path, metrics_port: int) -> str:
    """What to type to look around the stack the demo leaves running."""
    gangcheck = Path(sys.executable).parent / "gangcheck"  # the one beside this Python
    return (
        f"\nthe stack keeps running: export KUBECONFIG={kubeconfig}\n"
        f"  {kubectl} get {','.join(EXPLORE)} -A\n"
        f"  {gangcheck} status\n"
        f"  {gangcheck} diagnose job/demo/partial\n"
        f"  {gangcheck} diagnose podgroup/demo/ddp\n"
        f"  curl -s http://127.0.0.1:{metrics_port}/metrics   # gangcheck's metrics "
        "(docs/metrics.md)\n"
        "remove everything with: make demo-down\n"
    )


def _detached(module: str, args: list[str], log: Path) -> int:
    """`python -m MODULE ARGS` in a session of its own, outliving this command; its pid.
    Spawned, not a `Popen` dropped while it runs (which warns of a process still running)."""
    sink = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        return os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", module, *args],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, sink, 1),
                (os.POSIX_SPAWN_DUP2, sink, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(sink)


async def _namespace(kubeconfig: Path) -> None:
    async with await Kube.connect(str(kubeconfig)) as kube:
        await _create_all(kube, setup_objects()[:1])
        labels = {"metadata": {"labels": {OPT_IN_LABEL: OPT_IN_VALUE}}}
        await kube.merge_patch(NAMESPACE, NAMESPACE_NAME, labels)


def _webhook_certs(work: Path) -> tuple[str, str, bytes]:
    """A CA and a serving certificate for 127.0.0.1 (kept in the demo's folder), and the URL
    of a free port for the webhook."""
    certs = work / "webhook-certs"
    certs.mkdir(parents=True, exist_ok=True)
    authority = CertificateAuthority.create("gangcheck-demo-webhook-ca")
    authority.issue_serving("gangcheck-webhook", ["127.0.0.1"]).write(
        certs / "tls.crt", certs / "tls.key"
    )
    (port,) = free_ports(1)
    return str(certs), f"https://127.0.0.1:{port}/mutate-pods", authority.cert_pem


async def _register_webhook(kubeconfig: Path, url: str, ca_pem: bytes) -> None:
    """Register the webhook by URL and wait until the API server calls it (a probe member
    comes out gated)."""
    async with await Kube.connect(str(kubeconfig)) as kube:
        with contextlib.suppress(NotFoundError):
            await kube.delete(MUTATING_WEBHOOK, WEBHOOK_NAME)
        await kube.create(MUTATING_WEBHOOK, webhook_configuration(url, ca_pem))
        probe = {
            "metadata": {"name": "webhook-probe", "namespace": NAMESPACE_NAME,
                         "labels": {"scheduling.x-k8s.io/pod-group": "probe"}},
            "spec": {"containers": [{"name": "c", "image": "probe:1"}]},
        }  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            created = await kube.create(POD, probe)
            await kube.delete(POD, "webhook-probe", NAMESPACE_NAME, grace_period_seconds=0)
            gates = (created.get("spec") or {}).get("schedulingGates") or []
            if any(g.get("name") == GATE for g in gates):
                return
            await _gone(kube, "webhook-probe")
        raise RuntimeError("the API server did not call gangcheck's webhook within 30 s")


async def _gone(kube: Kube, pod: str) -> None:
    for _ in range(50):
        try:
            await kube.get(POD, pod, NAMESPACE_NAME)
        except NotFoundError:
            return
        await asyncio.sleep(0.1)


async def _scenario(kubeconfig: Path, out: TextIO) -> list[Gang]:
    async with await Kube.connect(str(kubeconfig)) as kube:
        gangs = await run_scenario(kube, out)
        requests = await kube.list_objects(PROVISIONING_REQUEST, NAMESPACE_NAME)
        _summary(gangs, len(requests.get("items") or []), out)
        return gangs


def down(state_dir: Path | None = None, out: TextIO | None = None) -> int:
    """`dev down`: it stops what `demo up` left running (`stop_recorded`, `stop_leftovers`),
    then the stack."""
    dev.down(state_dir or dev.default_state_dir(), out=out)
    return 0


def stop_recorded(state_dir: Path, timeout: float = STOP_TIMEOUT) -> None:
    """Stops what the last `demo up` left running (its gangcheck and simulated cloud, by the
    pids it recorded), each only while it is still that process; SIGKILL after `timeout`."""
    processes = state_dir / PROCESSES_FILE
    if not processes.exists():
        return
    pids = [int(pid) for pid in json.loads(processes.read_text())]
    _stop([pid for pid in pids if _ours(pid)], timeout)
    processes.unlink()


def stop_leftovers(state_dir: Path, timeout: float = STOP_TIMEOUT) -> list[int]:
    """Stops any demo process still running on this state folder that the record missed (a
    `demo up` interrupted before it wrote it, a record lost): a `python -m gangcheck` or
    `python -m gangcheck_dev` whose command line names the folder. The stack's own processes
    (its supervisor, `-m gangcheck_dev.testbed`, and the Go binaries) are `dev down`'s. Not
    this process: `demo down --state-dir <folder>` names the folder too."""
    folder = str(state_dir).rstrip("/")
    mentioning = processes_mentioning(folder)
    left = [
        pid
        for pid in mentioning
        if pid != os.getpid() and _ours(pid) and _names_folder(pid_cmdline(pid), folder)
    ]
    _stop(left, timeout)
    return left


def _names_folder(args: list[str], folder: str) -> bool:
    """Whether an argument is the folder or a path in it (`/x/demo`, `--kubeconfig=/x/demo/k`),
    not one of another folder the name begins (`/x/demo2`)."""
    return any(arg == folder or arg.endswith(f"={folder}") or f"{folder}/" in arg for arg in args)


def _ours(pid: int) -> bool:
    return pid_alive(pid) and pid_cmdline(pid)[1:3] in _MODULES


def _stop(ours: list[int], timeout: float) -> None:
    """SIGTERM to each process's group, SIGKILL to what is left after `timeout`; returns once
    they are gone (or KILL_WAIT has passed)."""
    for pid in ours:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(pid_alive(pid) for pid in ours) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in ours:
        if pid_alive(pid):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT  # gone, not only signalled, when this returns
    while any(pid_alive(pid) for pid in ours) and time.monotonic() < deadline:
        time.sleep(0.1)


def _signal(pid: int, sig: signal.Signals) -> None:
    """The process and its group (`demo up` starts each in a session of its own; the process
    itself too, should it lead no group)."""
    kill_group(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


#: The command lines (after the interpreter) of the processes `demo up` leaves running.
_MODULES = (["-m", "gangcheck"], ["-m", "gangcheck_dev"])
