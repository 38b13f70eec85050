"""Traces of a real gangcheck process, received by a real OpenTelemetry Collector.

Everything here is real: the kube-apiserver and etcd of the test bed, ``gangcheck run`` as
its own process (configured as an operator would: the collector's base address, or the
standard OTEL_EXPORTER_OTLP_* variables), and the collector built from ``hack/otelcol``,
whose spans the test reads back. The test plays Kueue core and the cloud. A collector that
is down is a port nothing listens on; a slow one is a loopback listener that accepts and
never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.otelcol import OtelCollector, ReceivedSpan
from gangcheck_dev.testbed.process import free_ports

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import NAMESPACE
from gangcheck.logic.attempt import naming
from gangcheck.logic.podgroups.podgroup import WAITING
from gangcheck.settings import TracingSettings, otlp_traces
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, eventually
from tests.integration.test_manifests import build, documents, overlay, the
from tests.integration.test_operations import parse_exposition
from tests.integration.test_podgroups import Groups

pytestmark = pytest.mark.integration
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fit(deadline: int) -> dict[str, Any]:
    return {
        "fulfillment": {"mode": "NodesFit", "deadlineSeconds": deadline, "reclaimer": "DeleteNode"},
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 10},
    }


def gang(name: str, members: int = 4) -> WorkloadBuilder:
    return WorkloadBuilder(name).pod_set("workers", members, pod_template(gpu=1)).reserve_quota()


class Gangcheck:
    """``gangcheck run`` as a process of its own, with the environment a Deployment sets."""

    def __init__(self, kubeconfig: str, env: dict[str, str], log: Path) -> None:
        self.health, self.metrics_port = free_ports(2)
        argv = [
            sys.executable, "-m", "gangcheck", "run", "--kubeconfig", kubeconfig,
            "--health-port", str(self.health), "--metrics-port", str(self.metrics_port),
            "--bind-address", "127.0.0.1", "--workers", "2",
        ]  # fmt: skip
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "GANGCHECK_LEADER_ELECTION__ENABLED": "false", **env},
                start_new_session=True,
            )

    async def metrics(self) -> Samples:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as resp,
        ):
            return parse_exposition(await resp.text())

    async def ready(self) -> bool:
        assert self.proc.poll() is None, f"gangcheck exited:\n{self.log.read_text()[-3000:]}"
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{self.health}/readyz") as resp,
            ):
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    def stop(self) -> float:
        """SIGTERM, as the kubelet sends; the seconds until the process had exited."""
        started = time.monotonic()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return time.monotonic() - started


@pytest.fixture
def collector(otelcol_binary: Path, tmp_path: Path) -> Iterator[OtelCollector]:
    with OtelCollector(tmp_path / "otelcol", otelcol_binary) as running:
        yield running


class Launcher:
    """Starts gangcheck processes against the session's control plane; stops them all."""

    def __init__(self, kubeconfig: str, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.started: list[Gangcheck] = []

    async def start(self, env: dict[str, str]) -> Gangcheck:
        log = self.workdir / f"gangcheck{len(self.started)}.log"
        process = Gangcheck(self.kubeconfig, env, log)
        self.started.append(process)
        await eventually(process.ready, what="gangcheck ready", timeout=30)
        return process


@pytest.fixture
def gangchecks(control_plane: Any, tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(str(control_plane.kubeconfig), tmp_path)
    yield launcher
    for process in launcher.started:
        process.stop()


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def reconciles_of(spans: list[ReceivedSpan], cluster: Cluster, name: str) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.name == "reconcile workload"
        and s.attributes.get("k8s.namespace.name") == cluster.ns
        and s.attributes.get("k8s.object.name") == name
    ]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id]


async def test_reconciles_arrive_at_a_real_collector_with_object_decision_and_api_calls(
    cluster: Cluster, collector: OtelCollector, gangchecks: Launcher
) -> None:
    # The form the docs show: the collector's base address (it used to post to "/": 404).
    gangcheck = await gangchecks.start(
        {"GANGCHECK_TRACING__OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    )
    await cluster.install_check(fit(deadline=6))
    # rollback, then retry: provisioned, but no node arrives before the deadline
    await cluster.submit(gang("rolled").check())
    rolled_request = naming.request_name("rolled", cluster.check, 1)
    await cluster.set_request_conditions(rolled_request, {"Provisioned": ""})
    # reject: the capacity is revoked
    await cluster.submit(gang("revoked").check())
    revoked_request = naming.request_name("revoked", cluster.check, 1)
    await cluster.set_request_conditions(revoked_request, {"CapacityRevoked": "revoked by test"})
    await cluster.wait_check("revoked", "Rejected")
    await cluster.wait_check("rolled", "Retry", timeout=30)
    for gone in (rolled_request, revoked_request):
        await cluster.wait_request_gone(gone)
    # ready: the whole gang fits on nodes that exist once its request is provisioned
    await cluster.submit(gang("ready").check())
    ready_request = naming.request_name("ready", cluster.check, 1)
    await cluster.wait_request(ready_request)
    await cluster.add_nodes(2, gpu=2)
    await cluster.set_request_conditions(ready_request, {"Provisioned": ""})
    await cluster.wait_check("ready", "Ready")
    # a PodGroup (scheduler-plugins) waiting for its second member
    groups = Groups(cluster)
    await groups.coscheduling("pg", 2)
    await groups.member("pg-0", "pg", plugins=True)
    await groups.wait_state("pg", WAITING, plugins=True)
    # an error: the API server refuses to create anything in a namespace being deleted
    doomed = await Cluster.create(cluster.kube)
    await doomed.submit(gang("refused").check())  # before the check is ours: left alone
    await cluster.kube.delete(NAMESPACE, doomed.ns)  # Terminating for good (no kcm here)
    await doomed.install_check(fit(deadline=6))
    await eventually(
        lambda: _message_has(doomed, "refused", "being terminated"), what="FailedCreate on check"
    )

    samples = await gangcheck.metrics()
    assert sample(samples, "gangcheck_trace_spans_dropped_total", reason="queue_full") == 0
    reconciled = sum(
        v for (n, _), v in samples.items() if n == "gangcheck_reconcile_duration_seconds_count"
    )
    gangcheck.stop()  # the spans still queued are sent on the way out
    spans = collector.spans()

    # one span per reconcile, each the root of its own trace
    reconciles = [s for s in spans if s.name.startswith("reconcile ")]
    assert len(reconciles) >= reconciled > 0
    assert all(s.parent_id == "" and s.service == "gangcheck" for s in reconciles)
    assert len({s.trace_id for s in reconciles}) == len(reconciles)

    outcomes = {
        name: {s.attributes.get("gangcheck.decision.outcome") for s in of}
        for name in ("ready", "rolled", "revoked")
        if (of := reconciles_of(spans, cluster, name))
    }
    assert {"wait", "ready"} <= outcomes["ready"]
    assert {"wait", "rollback", "retry"} <= outcomes["rolled"]
    assert "reject" in outcomes["revoked"]

    ready = next(
        s
        for s in reconciles_of(spans, cluster, "ready")
        if s.attributes.get("gangcheck.decision.outcome") == "ready"
        and s.attributes.get("gangcheck.decision.changed")
    )
    assert ready.attributes["k8s.object.kind"] == "Workload"
    assert ready.attributes["gangcheck.check"] == cluster.check
    assert ready.attributes["gangcheck.attempt"] == 1
    assert "the whole gang fits" in ready.attributes["gangcheck.decision.reason"]
    below = children(spans, ready)
    decide = next(s for s in below if s.name == "decide")
    assert decide.attributes["gangcheck.decision.outcome"] == "ready"
    assert ready.start_ns <= decide.start_ns <= decide.end_ns <= ready.end_ns
    status_write = next(
        s
        for s in below
        if s.name == "kube PATCH" and s.attributes["url.path"].endswith("/workloads/ready/status")
    )
    assert status_write.attributes["http.response.status_code"] == 200

    group = next(
        s
        for s in spans
        if s.name == "reconcile podgroup"
        and s.attributes.get("k8s.namespace.name") == cluster.ns
        and s.attributes.get("gangcheck.decision.outcome") == "wait"
    )
    assert (group.attributes["k8s.object.kind"], group.attributes["k8s.object.name"]) == (
        "PodGroup",
        "pg",
    )
    assert group.attributes["gangcheck.attempt"] == 1
    assert "1 of 2" in group.attributes["gangcheck.decision.reason"]

    rolled_back = next(
        s
        for s in reconciles_of(spans, cluster, "rolled")
        if s.attributes.get("gangcheck.decision.outcome") == "rollback"
    )
    assert rolled_back.attributes["gangcheck.decision.reason"].startswith("Rolling back")

    failed = [
        s
        for s in spans
        if s.name == "reconcile workload"
        and s.attributes.get("k8s.namespace.name") == doomed.ns
        and s.status == "error"
    ]
    assert failed, "the refused create is recorded as an error on its reconcile's span"
    assert "exception" in failed[0].events
    refused = [s for s in children(spans, failed[0]) if s.name == "kube POST"]
    assert refused and refused[-1].attributes["http.response.status_code"] == 403
    assert refused[-1].status == "error"
    await _finalize(cluster.kube, doomed.ns)


async def _finalize(kube: Kube, namespace: str) -> None:
    """No kube-controller-manager runs here: do the namespace controller's last step."""
    path = f"/api/v1/namespaces/{namespace}"
    obj = await kube.request("GET", path)
    obj["spec"]["finalizers"] = []
    await kube.request("PUT", f"{path}/finalize", body=obj)


async def _message_has(cluster: Cluster, name: str, text: str) -> bool:
    return text in (await cluster.check_state(name)).get("message", "")


@contextlib.asynccontextmanager
async def silent_listener() -> AsyncIterator[int]:
    """A loopback port that accepts connections and never answers (a stuck collector)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        # A connection accepted but not handed to ``hold`` yet (its callback is a task of
        # the next turns of the loop) would be left open, and found unclosed by a later
        # test's garbage collection (a socket of this port, and "loop is closed", once).
        await asyncio.sleep(0.1)
        for writer in held:
            writer.close()
        for writer in held:  # closed before the loop ends: Python 3.11's wait_closed of
            with contextlib.suppress(OSError):  # the server does not wait for them
                await writer.wait_closed()
        await server.wait_closed()


@pytest.mark.parametrize("collector_state", ["down", "slow"])
async def test_a_collector_down_or_slow_never_stops_or_slows_reconciling(
    cluster: Cluster, gangchecks: Launcher, collector_state: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        if collector_state == "slow":
            port = await stack.enter_async_context(silent_listener())
        else:
            port = free_ports(1)[0]  # nothing listens there
        env = {  # the standard variables, as a platform sets them
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1500",
            "OTEL_BSP_MAX_QUEUE_SIZE": "8",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        gangcheck = await gangchecks.start(env)
        await cluster.install_check({"fulfillment": {"mode": "TrustProvisioned"}})
        started = time.monotonic()
        for name in ("a", "b", "c"):
            await cluster.submit(gang(name, members=2).check())
        for name in ("a", "b", "c"):
            await cluster.set_request_conditions(
                naming.request_name(name, cluster.check, 1), {"Provisioned": ""}
            )
        for name in ("a", "b", "c"):
            await cluster.wait_check(name, "Ready")
        took = time.monotonic() - started

        async def dropped() -> Samples | None:
            samples = await gangcheck.metrics()
            failed = sample(samples, "gangcheck_trace_spans_dropped_total", reason="export_failed")
            return samples if failed > 0 else None

        samples = await eventually(dropped, what="spans counted as dropped, the export failing")
        assert sample(samples, "gangcheck_trace_spans_exported_total") == 0
        assert sample(samples, "gangcheck_trace_spans_queued") <= 8
        assert took < 15, f"three gangs took {took:.1f}s to turn Ready"
        stopped_in = gangcheck.stop()
        assert stopped_in < 10, f"gangcheck took {stopped_in:.1f}s to stop"
        assert gangcheck.proc.returncode == 0


def test_the_tracing_component_points_the_controller_at_the_collector_base_address(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    manifests = documents(build(control_plane, overlay(tmp_path, "tracing")))
    container = the(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    target = otlp_traces(TracingSettings(), env)
    assert target is not None
    assert target.endpoint == "http://otel-collector.observability:4318/v1/traces"
