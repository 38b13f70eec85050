"""Operating gangcheck: two replicas under leader election, health and metrics endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from gangcheck_dev.testbed.process import free_ports

from gangcheck.app import RunOptions, run_controller
from gangcheck.kube.client import Kube
from gangcheck.kube.errors import NotFoundError
from gangcheck.kube.resources import LEASE, NAMESPACE
from gangcheck.logic.attempt import naming
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import TRUST, Cluster, eventually
from tests.waiting import cancelled

pytestmark = pytest.mark.integration


def gang(name: str) -> WorkloadBuilder:
    return WorkloadBuilder(name).pod_set("workers", 2, pod_template(gpu=1)).reserve_quota().check()


class Replica:
    """`gangcheck run --leader-elect` as a real process."""

    def __init__(self, kubeconfig: str, identity: str, lease_ns: str) -> None:
        self.identity = identity
        self.health, self.metrics = free_ports(2)
        argv = [
            sys.executable, "-m", "gangcheck", "run", "--kubeconfig", kubeconfig,
            "--leader-elect", "--lease-namespace", lease_ns, "--identity", identity,
            "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5",
            "--health-port", str(self.health), "--metrics-port", str(self.metrics),
            "--bind-address", "127.0.0.1", "--workers", "2",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def replicas(control_plane: Any) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.stop(signal.SIGKILL)


async def holder(kube: Kube, namespace: str) -> str | None:
    try:
        lease = await kube.get(LEASE, "gangcheck", namespace)
    except NotFoundError:
        return None
    return (lease.get("spec") or {}).get("holderIdentity") or None


async def test_leader_fails_over_and_no_request_is_created_twice(
    control_plane: Any, kube: Kube, cluster: Cluster, replicas: list[Replica]
) -> None:
    lease_ns = f"lease-{cluster.ns}"
    await kube.create(NAMESPACE, {"metadata": {"name": lease_ns}})
    await cluster.install_check(TRUST)
    config = str(control_plane.kubeconfig)
    replicas.append(Replica(config, "replica-a", lease_ns))
    await eventually(lambda: _holder_is(kube, lease_ns, "replica-a"), what="a leads", timeout=30)
    replicas.append(Replica(config, "replica-b", lease_ns))
    await cluster.submit(gang("before"))
    await cluster.wait_request(naming.request_name("before", cluster.check, 1), timeout=30)

    replicas[0].stop(signal.SIGKILL)  # the leader dies without releasing the lease
    await eventually(
        lambda: _holder_is(kube, lease_ns, "replica-b"), what="b takes over", timeout=20
    )
    await cluster.submit(gang("after"))
    await cluster.wait_request(naming.request_name("after", cluster.check, 1), timeout=30)
    await asyncio.sleep(1)  # the two reconciles that could race have had time to
    names = sorted(r["metadata"]["name"] for r in await cluster.requests())
    assert names == sorted(naming.request_name(w, cluster.check, 1) for w in ("after", "before"))

    replicas[1].stop(signal.SIGTERM)  # graceful: the lease is released at once
    assert replicas[1].proc.returncode == 0
    assert await holder(kube, lease_ns) is None


async def _holder_is(kube: Kube, namespace: str, identity: str) -> bool:
    return await holder(kube, namespace) == identity


async def test_health_readiness_and_metrics_are_served(
    control_plane: Any, cluster: Cluster
) -> None:
    await cluster.install_check(TRUST)
    health, metrics = free_ports(2)
    options = RunOptions(
        workers=2, bind_address="127.0.0.1", health_port=health, metrics_port=metrics
    )
    kube = await Kube.connect(str(control_plane.kubeconfig))
    task = asyncio.create_task(run_controller(kube, options))
    try:
        async with aiohttp.ClientSession() as http:
            await eventually(lambda: _status(http, health, "/readyz", 200), what="ready")
            assert await _status(http, health, "/healthz", 200)
            await cluster.submit(gang("wl"))
            name = naming.request_name("wl", cluster.check, 1)
            await cluster.wait_request(name)
            asking = parse_exposition(await _scrape(http, metrics))
            await cluster.set_request_conditions(name, {"Provisioned": ""})
            await cluster.wait_check("wl", "Ready")
            text = await _scrape(http, metrics)
            samples = parse_exposition(text)
    finally:
        await cancelled(task)
        await kube.close()
    assert samples[("gangcheck_attempts_total", (("outcome", "ready"),))] >= 1
    assert (
        samples[("gangcheck_reconcile_duration_seconds_count", (("controller", "workload"),))] > 0
    )
    assert samples[("gangcheck_quota_to_ready_seconds_count", ())] >= 1
    assert samples[("gangcheck_provisioned_to_fit_seconds_count", ())] >= 1
    # a gang waiting for its request is in flight; once Ready on what it asked, not (before:
    # every request cached counted, the running gang's too). Other tests' gangs, left in the
    # control plane, are counted in both.
    in_flight = ("gangcheck_inflight_gangs", ())
    assert asking[in_flight] >= 1
    assert asking[in_flight] - samples[in_flight] == 1
    # a counter's TYPE line names its samples' family (<name>_total), as parsers file them
    assert "# TYPE gangcheck_attempts_total counter" in text.splitlines()
    # no leader election here: this replica counts as leading; its work queue is served
    assert samples[("gangcheck_leader", ())] == 1
    assert samples[("gangcheck_workqueue_depth", ())] >= 0


async def _scrape(http: aiohttp.ClientSession, port: int) -> str:
    """/metrics as Prometheus reads it, said to be the text format's version 0.0.4."""
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return await resp.text()


async def _status(http: aiohttp.ClientSession, port: int, path: str, want: int) -> bool:
    try:
        async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
            return resp.status == want
    except aiohttp.ClientError:
        return False


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A strict little parser of the Prometheus text format: every line must parse."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        pairs = tuple(
            (k, v.strip('"'))
            for k, v in (p.split("=", 1) for p in labels.rstrip("}").split(",") if p)
        )
        samples[(name, pairs)] = float(value)
    return samples
