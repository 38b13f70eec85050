"""Leader election under faults: never two leaders acting, and no exit over a short outage.

Real kube-apiserver and Lease; the faults (a lease call that hangs, an outage) come from the
fault-injecting proxy (tests/faults/proxy.py) in front of it, one per replica, which also logs
every write that reached the server with the replica that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from gangcheck.kube.errors import ApiError, FencedError, NotFoundError
from gangcheck.kube.resources import LEASE, Resource
from gangcheck.runtime.leader import LeaderElector, LeaseConfig, LostLeadershipError
from tests.faults.proxy import HANG, Faults, Rule, proxies
from tests.integration.harness import Cluster, eventually

pytestmark = pytest.mark.integration
CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")


@dataclass
class Replica:
    """One candidate: its elector, and a `lead` that writes as fast as it may."""

    identity: str
    kube: Kube
    config: LeaseConfig
    elector: LeaderElector = field(init=False)
    refused: int = 0
    led_at: float | None = None
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.elector = LeaderElector(self.kube, self.config)

    async def lead(self) -> None:
        self.led_at = time.monotonic()
        writer = self.kube.fenced(self.elector.write_fence)
        patch = {"metadata": {"annotations": {"writer": self.identity}}}
        while True:
            try:
                await writer.merge_patch(CONFIG_MAP, "leader-writes", patch, self.config.namespace)
            except FencedError:
                self.refused += 1
            except ApiError:  # the server unreachable: the proxy counts what got through
                pass
            await asyncio.sleep(0.05)

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self.lead))


@contextlib.asynccontextmanager
async def replicas(
    control_plane: ControlPlane, faults: Faults, tmp_path: Path, config: LeaseConfig, n: int
) -> AsyncIterator[list[Replica]]:
    names = [f"replica-{chr(ord('a') + i)}" for i in range(n)]
    # The elector alone, with a Lease and a ConfigMap of the test's namespace: as the admin
    # (gangcheck's own Role grants its one Lease, in its namespace; the suites prove that).
    async with proxies(control_plane.kubeconfig, faults, names, tmp_path, identity=None):
        kubes = [await Kube.connect(str(tmp_path / f"{name}.kubeconfig")) for name in names]
        made = [
            Replica(name, kube, LeaseConfig(**{**config.__dict__, "identity": name}))
            for name, kube in zip(names, kubes, strict=True)
        ]
        try:
            yield made
        finally:
            for replica in made:
                if replica.task is not None:
                    replica.task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, LostLeadershipError):
                        await replica.task
            faults.enabled = False
            for kube in kubes:
                await kube.close()


async def _config_map(kube: Kube, namespace: str) -> None:
    await kube.create(CONFIG_MAP, {"metadata": {"name": "leader-writes", "namespace": namespace}})


async def test_a_leader_whose_renew_hangs_stops_writing_before_another_leads(
    control_plane: ControlPlane, kube: Kube, cluster: Cluster, tmp_path: Path
) -> None:
    """Replica a leads, then its lease calls hang (as in the reported run, where a hung renew
    let the old leader write for 14.6 s beside a new one). Every write a sent that reached the
    server was answered before b's takeover was even sent."""
    await _config_map(kube, cluster.ns)
    config = LeaseConfig(
        cluster.ns, "gangcheck", "", lease_duration=4, renew_deadline=2.5, retry_period=0.3
    )
    faults = Faults()
    async with replicas(control_plane, faults, tmp_path, config, 2) as (a, b):
        a.start()
        await eventually(_leads(a), what="a to lead")
        b.start()
        await asyncio.sleep(1)
        assert b.led_at is None
        faults.rules.append(Rule(HANG, path=r"/leases/", replica=a.identity))
        await eventually(_leads(b), timeout=30, what="b to take the lease over")
        assert a.task is not None
        with pytest.raises(LostLeadershipError):
            await asyncio.wait_for(a.task, 15)
        a.task = None
    takeover = min(
        w.sent
        for w in faults.writes
        if w.replica == b.identity and "/leases/" in w.path and w.status < 300
    )
    a_writes = [
        w
        for w in faults.writes
        if w.replica == a.identity and "/configmaps/" in w.path and w.status < 300
    ]
    assert a_writes, "a wrote while it led"
    last = max(w.answered for w in a_writes)
    assert last < takeover, f"a wrote {last - takeover:.2f}s after b took the lease over"
    assert a.refused > 0, "a's writes were refused once its lease was not known valid"


async def test_an_outage_shorter_than_the_lease_pauses_the_leader_without_ending_it(
    control_plane: ControlPlane, kube: Kube, cluster: Cluster, tmp_path: Path
) -> None:
    """kube-apiserver unreachable for longer than the renew deadline but shorter than the
    lease (the proxy refusing every call, as during a restart): the leader stops writing,
    renews as soon as the server is back, and leads on; the lease never changed hands."""
    await _config_map(kube, cluster.ns)
    config = LeaseConfig(
        cluster.ns, "gangcheck", "", lease_duration=8, renew_deadline=2, retry_period=0.3
    )
    faults = Faults()
    async with replicas(control_plane, faults, tmp_path, config, 1) as (a,):
        a.start()
        await eventually(_leads(a), what="a to lead")
        transitions = await _transitions(kube, cluster.ns)
        faults.down = True
        await asyncio.sleep(4.5)
        faults.down = False
        refused = a.refused
        assert refused > 0, "writes were refused while the lease was not known valid"
        back = time.monotonic()
        await eventually(
            lambda: _wrote_after(faults, a.identity, back), what="a to write again after"
        )
        assert a.task is not None and not a.task.done(), "the leader kept leading"
        assert await _transitions(kube, cluster.ns) == transitions
        lease = await kube.get(LEASE, "gangcheck", cluster.ns)
        assert lease["spec"]["holderIdentity"] == a.identity


def _leads(replica: Replica) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return replica.led_at is not None

    return probe


async def _wrote_after(faults: Faults, replica: str, since: float) -> bool:
    return any(
        w.replica == replica and "/configmaps/" in w.path and w.status < 300 and w.sent > since
        for w in faults.writes
    )


async def _transitions(kube: Kube, namespace: str) -> int:
    try:
        lease = await kube.get(LEASE, "gangcheck", namespace)
    except NotFoundError:
        return -1
    return int(lease["spec"].get("leaseTransitions") or 0)


async def test_a_lease_namespace_that_does_not_exist_is_named_with_its_setting(
    kube: Kube,
) -> None:
    """`gangcheck run` outside the manifests (no gangcheck-system namespace) stopped with the
    API server's words alone: 'namespaces "gangcheck-system" not found'. The answer now says
    it is the leader Lease's namespace, and which setting names it."""
    config = LeaseConfig(namespace="no-such-namespace", name="gangcheck", identity="a")
    with pytest.raises(NotFoundError) as refused:
        await LeaderElector(kube, config).try_acquire_or_renew()
    said = str(refused.value.message)
    assert "the leader Lease's namespace 'no-such-namespace' does not exist" in said
    assert "leaderElection.namespace" in said and "--lease-namespace" in said
