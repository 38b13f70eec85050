"""The fault suite: many gangs through gangcheck under injected faults and chaos, then the tally.

gangcheck runs as real processes (two replicas with leader election, each through its own
fault-injecting proxy to the test bed's kube-apiserver); the suite plays Kueue core and the
autoscaler for every gang, following a plan drawn from a seed: full deliveries, partial
deliveries rolled back at the deadline, late failures, gangs deleted mid-attempt. Chaos kills
replicas with SIGKILL at random moments and starts them again; an adversary binds pods
tolerating every taint to nodes about to be reclaimed, at random moments around their fence.

At the end it counts, from durable records only (the objects on the server and the proxies'
logs of every write): duplicate requests per attempt, leaked requests / templates / nodes,
unsafe reclaims, gangs not converged, writes made by a replica while another held the lease,
and writes refused by RBAC or an admission policy (the replicas run as gangcheck's
ServiceAccount under the shipped RBAC and policies: the proxies impersonate it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gangcheck_dev.testbed.identity import HARNESS
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.process import free_ports

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, GoneError, NotFoundError
from gangcheck.kube.resources import NODE, POD, PROVISIONING_REQUEST, WORKLOAD
from gangcheck.logic.attempt import naming
from gangcheck.model.names import ARRIVED_FOR, FENCE_LABEL, OPT_OUT_LABEL
from gangcheck.model.objects import request_of
from tests.builders import WorkloadBuilder, container, pod_template
from tests.faults.proxy import STATUS, FaultProxy, Faults, Rates, Rule, Write, proxies
from tests.integration.harness import Cluster, eventually
from tests.waiting import cancelled

FULL, PARTIAL, FAILED, DELETED = "full", "partial", "late failure", "deleted mid-attempt"
#: The checks' retryStrategy.backoffLimitCount: the attempts a gang may have.
BACKOFF_LIMIT = 5
ADVERSARY_LABEL = "gangcheck-test/adversary"
LEASE_NAMESPACE = HARNESS.namespace
LEASE_NAME = "gangcheck"
"""The Lease the shipped leader-election Role lets the ServiceAccount hold (in its namespace)."""


@dataclass(frozen=True)
class Scenario:
    """What one run does: gangs, their plans, the faults and the chaos."""

    name: str
    seed: int
    gangs: int = 6
    members: int = 3
    rates: Rates = field(default_factory=Rates)
    replicas: int = 2
    kills: int = 0
    """SIGKILLs of a random replica, at random moments, each restarted after a moment."""
    not_found_bursts: int = 0
    """Moments the Workload watches are cut and the next lists and watches answered 404."""
    restarts: int = 0
    """kube-apiserver restarts (stopped and started again on the same port and etcd)."""
    binds: int = 0
    """Adversarial binds: pods tolerating every taint bound (pods/binding, as kube-scheduler
    binds) to nodes arrived for attempts that will be rolled back, at random moments, most to
    a node gangcheck is fencing at that moment."""
    deadline: int = 6
    timeout: float = 240.0


@dataclass
class GangPlan:
    name: str
    attempts: list[str]
    """The outcome of each attempt, the last one FULL or DELETED."""


@dataclass
class Tally:
    """What one run counted."""

    scenario: str
    gangs: int = 0
    converged: int = 0
    attempts: int = 0
    duplicates: int = 0
    leaked_requests: int = 0
    leaked_templates: int = 0
    leaked_nodes: int = 0
    unsafe_reclaims: int = 0
    reclaimed: int = 0
    unrecorded: int = 0
    overlapping_writes: int = 0
    refused_writes: int = 0
    """gangcheck's writes the API server refused (RBAC or an admission policy)."""
    kills: int = 0
    restarts: int = 0
    binds_accepted: int = 0
    binds_refused: int = 0
    binds_after_delete: int = 0
    """Binds accepted after the node's delete (by revision): they landed on no node."""
    seconds: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (
            self.converged == self.gangs
            and not self.duplicates
            and not (self.leaked_requests + self.leaked_templates + self.leaked_nodes)
            and not self.unsafe_reclaims
            and not self.overlapping_writes
            and not self.refused_writes
        )


def plan(scenario: Scenario) -> list[GangPlan]:
    rng = random.Random(scenario.seed)
    plans = []
    for i in range(scenario.gangs):
        first = [FULL, PARTIAL, FAILED, DELETED][i % 4]
        attempts = [first] if first in (FULL, DELETED) else [first, FULL]
        if rng.random() < 0.3 and first != DELETED:
            attempts = [rng.choice([PARTIAL, FAILED]), *attempts]
        plans.append(GangPlan(f"g{i}", attempts))
    return plans


# ---- the replicas ----------------------------------------------------------------------


class Replica:
    """One gangcheck process (python -m gangcheck run) behind its own proxy."""

    def __init__(self, identity: str, kubeconfig: Path, folder: Path) -> None:
        self.identity = identity
        self.kubeconfig = kubeconfig
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start (again): each start is a new process with an identity of its own."""
        self.kill()
        self.starts += 1
        health, metrics = free_ports(2)
        settings = {
            "controller": {"workers": 4, "watchTimeoutSeconds": 60},
            "leaderElection": {
                "enabled": True,
                "namespace": LEASE_NAMESPACE,
                "name": LEASE_NAME,
                "identity": f"{self.identity}-{self.starts}",
                "leaseDurationSeconds": 4,
                "renewDeadlineSeconds": 3,
                "retryPeriodSeconds": 0.5,
            },
            "server": {"healthPort": health, "metricsPort": metrics, "bindAddress": "127.0.0.1"},
            "logging": {"level": "INFO", "json": False},
        }
        config = self.folder / f"{self.identity}.yaml"
        config.write_text(yaml.safe_dump(settings))
        log = (self.folder / f"{self.identity}.{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "gangcheck", "run"),
                *("--kubeconfig", str(self.kubeconfig), "--config", str(config)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            start_new_session=True,
        )
        log.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Fleet:
    """The replicas and their proxies."""

    replicas: list[Replica]
    proxies: list[FaultProxy]


@contextlib.asynccontextmanager
async def fleet(
    control_plane: ControlPlane, faults: Faults, count: int, folder: Path
) -> AsyncIterator[Fleet]:
    names = [f"replica-{chr(ord('a') + i)}" for i in range(count)]
    async with proxies(control_plane.kubeconfig, faults, names, folder) as started:
        # A previous run's Lease, held by a replica gone: this run starts without waiting it out.
        lease = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}"
        await asyncio.to_thread(control_plane.client().request, "DELETE", lease)
        made = [Replica(name, folder / f"{name}.kubeconfig", folder) for name in names]
        try:
            for replica in made:
                replica.start()
            yield Fleet(made, started)
        finally:
            for replica in made:
                await asyncio.to_thread(replica.stop)


@contextlib.asynccontextmanager
async def _background(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run `work` while the block runs; cancelled when it ends, however it ends."""
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        await cancelled(task)


async def supervise(made: list[Replica]) -> None:
    """As a Deployment does: a replica that exited (it lost the lease) is started again."""
    while True:
        await asyncio.sleep(0.5)
        for replica in made:
            if not replica.alive():
                replica.start()


async def chaos(
    fleet: Fleet, scenario: Scenario, tally: Tally, control_plane: ControlPlane
) -> None:
    """At random moments: SIGKILL a replica (started again shortly), cut the Workload
    watches and answer the next lists and watches 404, restart kube-apiserver."""
    rng = random.Random(scenario.seed + 1)
    events = (
        ["kill"] * scenario.kills
        + ["404"] * scenario.not_found_bursts
        + ["restart"] * scenario.restarts
    )
    rng.shuffle(events)
    for event in events:
        await asyncio.sleep(rng.uniform(0.5, 3))
        if event == "kill":
            victim = rng.choice(fleet.replicas)
            victim.kill()
            tally.kills += 1
            await asyncio.sleep(rng.uniform(0.2, 2))
            if not victim.alive():
                victim.start()
        elif event == "404":
            rule = Rule(STATUS, status=404, path=r"/workloads$", methods=frozenset({"GET"}))
            rule.times = rng.randint(1, 3)
            fleet.proxies[0].faults.rules.append(rule)
            for proxy in fleet.proxies:
                proxy.cut(r"/workloads$")
        else:
            await asyncio.to_thread(control_plane.restart_apiserver)
            tally.restarts += 1


# ---- the gangs, played as Kueue core and the autoscaler -----------------------------------


@dataclass
class Revisions:
    """The etcd revisions at which nodes were deleted and adversary pods bound, read off
    watches: they order a bind and a delete whose calls overlapped in time. Binding a pod to a
    node that no longer exists is accepted (nothing checks the node, and the fence policy has
    no fenced node left to match), so a bind sent while a delete is in flight may land after
    it: no pod ran on the node then."""

    deleted: dict[str, int] = field(default_factory=dict)
    """node -> the revision of its deletion"""
    bound: dict[str, int] = field(default_factory=dict)
    """adversary pod -> the revision at which it got its node"""

    def order(self, bind: Bind) -> bool | None:
        """Whether the bind landed before the node's delete; None when a revision is
        missing (a watch could not resume across a gap)."""
        deleted, bound = self.deleted.get(bind.node), self.bound.get(bind.pod)
        if deleted is None or bound is None:
            return None
        return bound < deleted


@dataclass
class Ledger:
    """What the suite (as the cloud) made, to judge each reclaim and count leaks."""

    made_for: dict[str, str] = field(default_factory=dict)
    """node -> the request key (ns/name) it was made for."""
    may_reclaim: set[str] = field(default_factory=set)
    """Nodes made for an attempt that was rolled back or abandoned: the only ones gangcheck
    may reclaim (and then only if not opted out)."""
    opted_out: set[str] = field(default_factory=set)
    unrecorded: set[str] = field(default_factory=set)
    """Nodes an attempt ended without recording (their claim lost to faults)."""
    converged: set[str] = field(default_factory=set)
    ready_at: dict[str, str] = field(default_factory=dict)
    """namespace -> the request its gang turned Ready on before its plan ran out (a partial
    delivery it fit on all the same, with nodes an earlier rollback kept)."""
    attempts: int = 0
    binds: list[Bind] = field(default_factory=list)
    revisions: Revisions = field(default_factory=Revisions)

    def bound(self) -> set[str]:
        """Nodes a pod was bound to: gangcheck must keep them (or have deleted them before)."""
        return {b.node for b in self.binds if b.accepted}


@dataclass(frozen=True)
class Bind:
    """One adversarial bind and the API server's answer."""

    pod: str
    node: str
    fenced: bool
    """The node carried gangcheck's fence label when it was picked."""
    sent: float
    answered: float
    accepted: bool


def spec(deadline: int) -> dict[str, Any]:
    return {
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": deadline, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": BACKOFF_LIMIT, "backoffBaseSeconds": 1},
    }


def builder(name: str, members: int) -> WorkloadBuilder:
    return (
        WorkloadBuilder(name)
        .pod_set("workers", members, pod_template(gpu=1))
        .reserve_quota()
        .check()
    )


async def drive(
    cluster: Cluster, gang: GangPlan, scenario: Scenario, ledger: Ledger, rng: random.Random
) -> None:
    """One gang, attempt by attempt, as its plan says."""
    made = builder(gang.name, scenario.members)
    await cluster.submit(made)
    patience = scenario.timeout
    outcomes = list(gang.attempts)
    for attempt, outcome in enumerate(outcomes, 1):  # grows when a whole delivery is late
        name = naming.request_name(gang.name, cluster.check, attempt)
        key = f"{cluster.ns}/{name}"
        await cluster.wait_request(name, timeout=patience)
        ledger.attempts += 1
        await _retrying(cluster.set_request_conditions, name, {"Provisioned": ""})
        if outcome == FULL:
            nodes = await _deliver(cluster, ledger, key, scenario.members)
            if await _ended(cluster, gang.name, patience) == "Ready":
                ledger.converged.add(key)
                if attempt != len(gang.attempts):
                    ledger.ready_at[cluster.ns] = name
                return
            # Rolled back before the whole delivery was there: its deadline passed while the
            # suite's own calls waited on the server (a kube-apiserver restart, a 404 burst),
            # as gangcheck should. What it recorded is its to reclaim; the gang is asked for
            # whole again, as the next attempt (within the config's backoffLimitCount).
            assert len(outcomes) < BACKOFF_LIMIT, f"{gang.name}: every whole delivery late"
            missed = await _recorded(cluster, gang.name, key, nodes, patience)
            ledger.may_reclaim.update(n for n in nodes if n not in missed)
            await _unrecorded(cluster, ledger, missed)
            await cluster.evict_and_requeue(gang.name)
            await cluster.reserve_again(gang.name, made)
            outcomes.append(FULL)
            continue
        partial = rng.randint(1, scenario.members - 2) if scenario.members > 2 else 1
        nodes = await _deliver(cluster, ledger, key, partial)
        ledger.may_reclaim.update(nodes)
        opted = await _deliver(cluster, ledger, key, 1, opt_out=True)
        ledger.opted_out.update(opted)
        missed = await _recorded(cluster, gang.name, key, [*nodes, *opted], patience)
        nodes = [n for n in nodes if n not in missed]
        await _unrecorded(cluster, ledger, missed)
        if outcome == DELETED:
            await cluster.kube.delete(WORKLOAD, gang.name, cluster.ns)
            await cluster.wait_request_gone(name, timeout=patience)
            await _reclaimed(cluster, nodes, patience, ledger)
            await _retire(cluster, opted)
            ledger.converged.add(key)
            return
        failed = outcome == FAILED and not missed
        if failed:
            await _retrying(cluster.set_request_conditions, name, {"Failed": "no more"})
            # Ready before the Failed was read is rolled back all the same (the capacity
            # may be gone before admission): only Retry ends this attempt.
            await cluster.wait_check(gang.name, "Retry", timeout=patience)
        elif await _ended(cluster, gang.name, patience) == "Ready":
            # Nothing failed: the gang fits, whole, on what exists (this attempt's partial
            # delivery and nodes an earlier rollback kept, e.g. one an adversary's pod was
            # bound to, its GPU free), and a Ready check not failed stays so here (the suite
            # admits nothing). Converged; its nodes are the gang's, none to reclaim.
            assert len(await _schedulable(cluster)) >= scenario.members, gang.name
            ledger.may_reclaim.difference_update(nodes)
            ledger.converged.add(key)
            ledger.ready_at[cluster.ns] = name
            return
        await _retire(cluster, opted)
        await cluster.evict_and_requeue(gang.name)
        await cluster.reserve_again(gang.name, made)


async def _ended(cluster: Cluster, gang: str, patience: float) -> str:
    """The state an attempt with a partial delivery ends in: Retry (rolled back), or Ready
    when the gang fits on what exists all the same."""

    async def ended() -> str | None:
        state = str((await cluster.check_state(gang))["state"])
        return state if state in ("Retry", "Ready") else None

    return str(await eventually(ended, timeout=patience, what=f"check Retry or Ready on {gang}"))


async def _schedulable(cluster: Cluster) -> list[dict[str, Any]]:
    """This cluster's nodes a member could be placed on: not cordoned, not being deleted."""
    return [
        n
        for n in await cluster.nodes()
        if not (n.get("spec") or {}).get("unschedulable")
        and not n["metadata"].get("deletionTimestamp")
    ]


async def _deliver(
    cluster: Cluster, ledger: Ledger, key: str, count: int, *, opt_out: bool = False
) -> list[str]:
    labels = {OPT_OUT_LABEL: "true"} if opt_out else None
    nodes: list[str] = await _retrying(cluster.add_nodes, count, labels=labels)
    for node in nodes:
        ledger.made_for[node] = key
    return nodes


async def _retrying(call: Any, *args: Any, **kwargs: Any) -> Any:
    """The suite's own calls go straight to the server; a conflict with gangcheck's write is
    tried again."""
    for _ in range(30):
        try:
            return await call(*args, **kwargs)
        except ApiError as e:
            if e.status not in (0, 409, 500, 503):
                raise
            await asyncio.sleep(0.5)
    return await call(*args, **kwargs)


async def _recorded(
    cluster: Cluster, gang: str, key: str, nodes: list[str], patience: float
) -> list[str]:
    """Wait until gangcheck recorded each node as arrived for the request (or reclaimed it
    already), or the attempt ended first: under faults a claim can miss the deadline. The
    nodes the attempt ended without recording."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        claims = {
            n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(ARRIVED_FOR)
            for n in await cluster.nodes()
        }
        missing = [n for n in nodes if claims.get(n, key) != key]
        if not missing:
            return []
        if (await cluster.check_state(gang))["state"] != "Pending":
            return missing
        await asyncio.sleep(0.2)
    raise AssertionError(f"{nodes} not recorded for {key} in {patience}s")


async def _unrecorded(cluster: Cluster, ledger: Ledger, nodes: list[str]) -> None:
    """Nodes the attempt ended without recording are not gangcheck's to reclaim: counted,
    then removed as the cloud's own scale-down would."""
    for name in nodes:
        ledger.may_reclaim.discard(name)
        ledger.unrecorded.add(name)
        with contextlib.suppress(NotFoundError):
            await _retrying(cluster.kube.delete, NODE, name)


async def _retire(cluster: Cluster, opted: list[str]) -> None:
    """The rollback is over and kept the opted-out node (the tally checks gangcheck never
    deleted it): its owner, not gangcheck, removes it, so it adds no capacity to the next
    attempt."""
    for name in opted:
        with contextlib.suppress(NotFoundError):
            await _retrying(cluster.kube.delete, NODE, name)


async def _reclaimed(cluster: Cluster, nodes: list[str], patience: float, ledger: Ledger) -> None:
    """Wait until the nodes are reclaimed, but those a pod was bound to (kept, rightly)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        present = {n["metadata"]["name"] for n in await cluster.nodes()}
        if not present & (set(nodes) - ledger.bound()):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{nodes} not reclaimed in {patience}s")


async def follow_revisions(kube: Kube, revisions: Revisions) -> None:
    """Record node deletions and adversary binds until cancelled."""

    def on_node(event: dict[str, Any]) -> None:
        obj = event["object"]
        if event["type"] == "DELETED":
            revisions.deleted[obj["metadata"]["name"]] = int(obj["metadata"]["resourceVersion"])

    def on_pod(event: dict[str, Any]) -> None:
        obj = event["object"]
        name = obj["metadata"]["name"]
        if (obj.get("spec") or {}).get("nodeName") and name not in revisions.bound:
            revisions.bound[name] = int(obj["metadata"]["resourceVersion"])

    await asyncio.gather(
        _follow(kube, NODE, None, on_node),
        _follow(kube, POD, f"{ADVERSARY_LABEL}=true", on_pod),
    )


async def _follow(kube: Kube, res: Any, selector: str | None, handle: Any) -> None:
    """List, then watch from the list's revision, resuming across broken watches (and an
    apiserver restart); a watch too old to resume lists again (what was missed stays
    unknown, never guessed)."""
    version = ""
    while True:
        try:
            if not version:
                listed = await kube.list_objects(res, label_selector=selector)
                version = listed["metadata"]["resourceVersion"]
            async for event in kube.watch(res, resource_version=version, label_selector=selector):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    version = "" if obj.get("code") == 410 else version
                    break
                if event.get("type") != "BOOKMARK":
                    handle(event)
                version = obj.get("metadata", {}).get("resourceVersion") or version
        except GoneError:
            version = ""
        except ApiError:
            await asyncio.sleep(0.5)


async def adversary(
    kube: Kube, scenario: Scenario, ledger: Ledger, rng: random.Random, stop: asyncio.Event
) -> None:
    """Bind pods tolerating every taint to nodes arrived for attempts that will be rolled
    back, at random moments, until `stop`: most to a node gangcheck is fencing (its label on
    it) when one is, else to any such node. A bind the API server accepts makes the node one
    gangcheck must keep; the fence policy refuses a bind to a fenced node."""
    for i in range(scenario.binds):
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        picked = await _pick(kube, ledger, rng, prefer_fenced=rng.random() < 0.7, stop=stop)
        if picked is None:
            return
        node, fenced = picked
        namespace = ledger.made_for[node].split("/", 1)[0]
        name = f"adversary-{i}"
        spec = {"tolerations": [{"operator": "Exists"}], "containers": [container()]}
        labels = {ADVERSARY_LABEL: "true"}
        pod = {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}
        await _retrying(kube.create, POD, pod)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        sent = time.monotonic()
        try:
            await kube.request("POST", POD.object_path(name, namespace) + "/binding", body=binding)
            accepted = True
        except ApiError as e:
            if e.status not in (403, 409):
                raise
            # 409: the client retried a bind whose answer was lost; the pod says if it landed
            landed = (await kube.get(POD, name, namespace))["spec"].get("nodeName")
            accepted = e.status == 409 and landed == node
        ledger.binds.append(Bind(name, node, fenced, sent, time.monotonic(), accepted))


async def _pick(
    kube: Kube, ledger: Ledger, rng: random.Random, *, prefer_fenced: bool, stop: asyncio.Event
) -> tuple[str, bool] | None:
    """A node arrived for an attempt that will be rolled back, present now, not opted out and
    not bound to yet, with whether it is fenced; fenced ones first for up to 10 s when
    preferred. None once `stop` is set."""
    deadline = time.monotonic() + 10
    while not stop.is_set():
        listed = (await kube.list_objects(NODE)).get("items") or []
        nodes = {
            n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(FENCE_LABEL) == "true"
            for n in listed
        }
        open_ = sorted(set(nodes) & (ledger.may_reclaim - ledger.opted_out - ledger.bound()))
        fenced = [n for n in open_ if nodes[n]]
        if fenced or (open_ and (not prefer_fenced or time.monotonic() > deadline)):
            node = rng.choice(fenced or open_)
            return node, nodes[node]
        await asyncio.sleep(0.1)
    return None


# ---- one run -------------------------------------------------------------------------------


async def run(scenario: Scenario, control_plane: ControlPlane, folder: Path) -> Tally:
    """Run the scenario; always returns the tally (a gang not converged is counted, not
    raised), and removes everything it made."""
    tally = Tally(scenario.name)
    faults = Faults(seed=scenario.seed, rates=scenario.rates)
    plans = plan(scenario)
    tally.gangs = len(plans)
    patient = await Kube.connect(
        str(control_plane.kubeconfig), retry_attempts=60, retry_seconds=90
    )  # the suite's own calls outlast an apiserver restart
    try:
        return await _run(scenario, control_plane, patient, folder, tally, faults, plans)
    finally:
        await patient.close()


async def _run(  # noqa: PLR0917
    scenario: Scenario,
    control_plane: ControlPlane,
    kube: Kube,
    folder: Path,
    tally: Tally,
    faults: Faults,
    plans: list[GangPlan],
) -> Tally:
    clusters = [await Cluster.create(kube) for _ in plans]
    ledger = Ledger()
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        for cluster in clusters:
            await cluster.install_check(spec(scenario.deadline))
        async with (
            _background(follow_revisions(kube, ledger.revisions)),
            fleet(control_plane, faults, scenario.replicas, folder) as running,
            _background(supervise(running.replicas)),
        ):
            rng = random.Random(scenario.seed + 2)
            killing = asyncio.create_task(chaos(running, scenario, tally, control_plane))
            binds, stop = random.Random(scenario.seed + 3), asyncio.Event()
            binding = asyncio.create_task(adversary(kube, scenario, ledger, binds, stop))
            gangs = [
                asyncio.create_task(drive(c, g, scenario, ledger, random.Random(rng.random())))
                for c, g in zip(clusters, plans, strict=True)
            ]
            done = await asyncio.gather(*gangs, return_exceptions=True)
            tally.seconds = time.monotonic() - began
            await killing
            stop.set()
            await binding
            for gang, outcome in zip(plans, done, strict=True):
                if isinstance(outcome, BaseException):
                    tally.problems.append(f"{gang.name}: {outcome}")
            await _settle(clusters, ledger)
            faults.enabled = False
            await _caught_up(ledger, faults)
        await count(tally, clusters=clusters, ledger=ledger, faults=faults, plans=plans)
    finally:
        for cluster in clusters:
            await _remove(cluster)
    tally.faults = faults.injected
    return tally


async def _caught_up(ledger: Ledger, faults: Faults) -> None:
    """Let the revision watches see every node delete the proxies answered (a few seconds at
    most; one they never see is judged by the calls' times alone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        deleted = {
            w.path.rsplit("/", 1)[-1]
            for w in faults.writes
            if w.method == "DELETE" and "/api/v1/nodes/" in w.path and w.status < 300
        }
        if deleted <= set(ledger.revisions.deleted):
            return
        await asyncio.sleep(0.2)


async def _settle(clusters: list[Cluster], ledger: Ledger) -> None:
    """Give the last reclaims of converged gangs a moment to land (they run after Retry)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        present = {n["metadata"]["name"] for c in clusters for n in await c.nodes()}
        if not present & (ledger.may_reclaim - ledger.opted_out - ledger.bound()):
            return
        await asyncio.sleep(0.3)


async def count(
    tally: Tally,
    *,
    clusters: list[Cluster],
    ledger: Ledger,
    faults: Faults,
    plans: list[GangPlan],
) -> None:
    tally.attempts = ledger.attempts
    tally.unrecorded = len(ledger.unrecorded)
    tally.converged = sum(1 for c, g in zip(clusters, plans, strict=True) if _done(c, g, ledger))
    tally.duplicates = _duplicates(faults.writes)
    live_templates: set[str] = set()
    for cluster, gang in zip(clusters, plans, strict=True):
        early = ledger.ready_at.get(cluster.ns)
        final = _final(cluster, gang, ledger)
        for req in await cluster.requests():
            req_name = req["metadata"]["name"]
            if (gang.attempts[-1] == FULL or early) and req_name == final:
                live_templates.update(p.template_name for p in request_of(req).pod_sets)
                continue
            tally.leaked_requests += 1
            tally.problems.append(f"leaked request {cluster.ns}/{req_name}")
        for template in await cluster.templates():
            # owned by nothing: the gang it names, or a live request it belongs to
            made = template["metadata"]["name"]
            gang_of = (template["metadata"].get("annotations") or {}).get("gangcheck.io/workload")
            of_live = made in live_templates
            if not (of_live or gang_of == gang.name) or gang.attempts[-1] == DELETED:
                tally.leaked_templates += 1
                tally.problems.append(f"leaked template {template['metadata']['name']}")
        for node in await cluster.nodes():
            name = node["metadata"]["name"]
            if name in ledger.may_reclaim - ledger.opted_out - ledger.bound():
                tally.leaked_nodes += 1
                tally.problems.append(f"leaked node {name} (made for {ledger.made_for[name]})")
    node_deletes = [w for w in faults.writes if w.method == "DELETE" and "/api/v1/nodes/" in w.path]
    deleted = [w.path.rsplit("/", 1)[-1] for w in node_deletes if w.status < 300]
    tally.reclaimed = len(deleted)
    safe = ledger.may_reclaim - ledger.opted_out - ledger.unrecorded
    unsafe = [n for n in deleted if n not in safe]
    unsafe += [n for n in deleted if n in safe and _ran_a_pod(n, node_deletes, ledger)]
    tally.unsafe_reclaims = len(unsafe)
    tally.problems.extend(f"unsafe reclaim of {n}" for n in unsafe)
    tally.binds_accepted = sum(1 for b in ledger.binds if b.accepted)
    tally.binds_refused = sum(1 for b in ledger.binds if not b.accepted)
    tally.binds_after_delete = sum(
        1 for b in ledger.binds if b.accepted and ledger.revisions.order(b) is False
    )
    overlaps = overlapping_writes(faults.writes)
    tally.overlapping_writes = len(overlaps)
    tally.problems.extend(f"write while another led: {w}" for w in overlaps[:5])
    tally.refused_writes = len(faults.refused)
    tally.problems.extend(f"write refused: {r}" for r in faults.refused[:5])


def _ran_a_pod(node: str, deletes: list[Write], ledger: Ledger) -> bool:
    """A pod was bound to the node before gangcheck deleted it. A bind sent before the delete
    was answered is ordered by the revisions (a bind that landed on a node already deleted ran
    no pod there); one the watches missed counts as unsafe."""
    gone = max((w.answered for w in deletes if w.path.rsplit("/", 1)[-1] == node), default=0.0)
    overlapping = [b for b in ledger.binds if b.node == node and b.accepted and b.sent < gone]
    return any(ledger.revisions.order(b) is not False for b in overlapping)


def _final(cluster: Cluster, gang: GangPlan, ledger: Ledger) -> str:
    """The request a gang ends on: the one it turned Ready on early, else its plan's last."""
    planned = naming.request_name(gang.name, cluster.check, len(gang.attempts))
    return ledger.ready_at.get(cluster.ns) or planned


def _done(cluster: Cluster, gang: GangPlan, ledger: Ledger) -> bool:
    return f"{cluster.ns}/{_final(cluster, gang, ledger)}" in ledger.converged


def _duplicates(writes: list[Write]) -> int:
    """Requests created more than once under one name (one name per attempt)."""
    created = Counter(
        (w.path, w.name)
        for w in writes
        if w.method == "POST" and w.path.endswith("/provisioningrequests") and w.status == 201
    )
    return sum(n - 1 for n in created.values())


def overlapping_writes(writes: list[Write]) -> list[Write]:
    """Writes a replica made while another held the lease.

    A takeover is a successful lease write by a replica other than the last one that wrote
    the lease. A write by X (not to the lease) conflicts with a takeover by Y if the takeover
    was sent before the write was answered, and X had not taken the lease back between the
    takeover's answer and the write's sending.
    """
    lease = sorted(
        (w for w in writes if "/leases" in w.path and w.status < 300), key=lambda w: w.sent
    )
    takeovers, holder = [], None
    for w in lease:
        if w.replica != holder:
            takeovers.append(w)
            holder = w.replica
    bad = []
    for w in writes:
        if "/leases" in w.path or w.status >= 300:
            continue
        mine = [t for t in takeovers if t.replica == w.replica and t.answered <= w.sent]
        since = mine[-1].answered if mine else float("-inf")
        if any(
            t.replica != w.replica and since < t.answered and t.sent < w.answered for t in takeovers
        ):
            bad.append(w)
    return bad


async def _remove(cluster: Cluster) -> None:
    with contextlib.suppress(ApiError):
        for wl in (await cluster.kube.list_objects(WORKLOAD, cluster.ns)).get("items") or []:
            with contextlib.suppress(NotFoundError):
                await cluster.kube.delete(WORKLOAD, wl["metadata"]["name"], cluster.ns)
        for req in await cluster.requests():
            with contextlib.suppress(NotFoundError):
                await cluster.kube.delete(PROVISIONING_REQUEST, req["metadata"]["name"], cluster.ns)
        for node in await cluster.nodes():
            with contextlib.suppress(NotFoundError):
                await cluster.kube.delete(NODE, node["metadata"]["name"])


# ---- the table -----------------------------------------------------------------------------


def table(tallies: list[Tally], baseline: Tally | None) -> str:
    """One row per scenario, plus the faults injected by type and count."""
    head = (
        f"{'scenario':<28} {'gangs':>5} {'conv':>5} {'att':>4} {'dup':>4} {'leak r/t/n':>10} "
        f"{'unsafe':>6} {'reclaim':>7} {'unrec':>5} {'2 leaders':>9} {'kills':>5} {'restarts':>8} "
        f"{'binds ok/no':>11} {'seconds':>7} {'vs base':>7}"
    )
    rows = [head, "-" * len(head)]
    for t in tallies:
        ratio = f"{t.seconds / baseline.seconds:.2f}x" if baseline and baseline.seconds else "-"
        leaks = f"{t.leaked_requests}/{t.leaked_templates}/{t.leaked_nodes}"
        binds = f"{t.binds_accepted}/{t.binds_refused}"
        rows.append(
            f"{t.scenario:<28} {t.gangs:>5} {t.converged:>5} {t.attempts:>4} {t.duplicates:>4} "
            f"{leaks:>10} {t.unsafe_reclaims:>6} {t.reclaimed:>7} {t.unrecorded:>5} "
            f"{t.overlapping_writes:>9} "
            f"{t.kills:>5} {t.restarts:>8} {binds:>11} {t.seconds:>7.1f} {ratio:>7}"
        )
    rows.append("")
    rows.append("faults injected:")
    for t in tallies:
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(t.faults.items())) or "none"
        rows.append(f"  {t.scenario}: {faults}")
    late = [f"{t.scenario}: {t.binds_after_delete}" for t in tallies if t.binds_after_delete]
    if late:
        rows.append(f"binds accepted after their node was deleted (no pod ran): {', '.join(late)}")
    return "\n".join(rows)
