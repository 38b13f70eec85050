"""The reconcile rate of gangcheck with tracing off and on, side by side, in the same run.

One control plane, one OpenTelemetry Collector (``hack/otelcol``), and ``gangcheck run`` as its
own process twice per round, one after the other: without traces and sending them to the
collector (the order alternates from round to round). A round starts once the process has
finished its startup pass over the gangs already there.
Each round submits the same burst of gangs (TrustProvisioned, so every reconcile is the same
work), marks their requests provisioned, and waits until every check is Ready. The script plays
Kueue core.

Figures per round, from gangcheck's own metrics (deltas over the round):
- workload reconciles, and their mean duration (the histogram's sum / count);
- reconciles per second of reconcile work (1 / mean), the rate one worker sustains;
- wall seconds from the first request marked provisioned to the last gang Ready;
- spans the collector received from the round's process (flushed at its exit; they include
  the startup reconciles of the gangs earlier rounds left), and spans dropped.

Usage: python benchmarks/tracing_overhead.py [--gangs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from gangcheck_dev.testbed.binaries import CONTROL_PLANE, ensure_binaries
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.otelcol import OtelCollector
from gangcheck_dev.testbed.process import free_ports

from gangcheck.kube.client import Kube
from gangcheck.logic.attempt import naming
from tests.builders import WorkloadBuilder, pod_template
from tests.integration.harness import Cluster, eventually
from tests.integration.test_operations import parse_exposition

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
WORKLOAD = (("controller", "workload"),)


@dataclass
class Round:
    tracing: str
    gangs: int
    reconciles: float = 0.0
    reconcile_seconds: float = 0.0
    wall_seconds: float = 0.0
    received: int = 0
    dropped: float = 0.0

    @property
    def mean_ms(self) -> float:
        return 1000 * self.reconcile_seconds / self.reconciles if self.reconciles else 0.0

    @property
    def rate(self) -> float:
        return self.reconciles / self.reconcile_seconds if self.reconcile_seconds else 0.0

    @property
    def wall_rate(self) -> float:
        return self.reconciles / self.wall_seconds if self.wall_seconds else 0.0


class Process:
    """``gangcheck run`` with the given environment; its /metrics read as samples."""

    def __init__(self, kubeconfig: str, env: dict[str, str], log: Path) -> None:
        self.health, self.metrics_port = free_ports(2)
        argv = [
            sys.executable, "-m", "gangcheck", "run", "--kubeconfig", kubeconfig,
            "--health-port", str(self.health), "--metrics-port", str(self.metrics_port),
            "--bind-address", "127.0.0.1", "--workers", "4",
        ]  # fmt: skip
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    "GANGCHECK_LEADER_ELECTION__ENABLED": "false",
                    "GANGCHECK_LOGGING__LEVEL": "WARNING",
                    **env,
                },
                start_new_session=True,
            )

    async def metrics(self) -> Samples:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as resp,
        ):
            return parse_exposition(await resp.text())

    async def ready(self) -> bool:
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{self.health}/readyz") as resp,
            ):
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def settled(process: Process) -> Samples:
    """The metrics once the process has stopped reconciling (its startup pass over every
    gang earlier rounds left included), so that a round measures its own gangs only."""
    key = ("gangcheck_reconcile_duration_seconds_count", WORKLOAD)
    last = await process.metrics()
    while True:
        await asyncio.sleep(1.5)
        now = await process.metrics()
        if now.get(key, 0) == last.get(key, 0):
            return now
        last = now


def _dropped(samples: Samples) -> float:
    return sum(v for (n, _), v in samples.items() if n == "gangcheck_trace_spans_dropped_total")


async def one_round(
    kube: Kube,
    *,
    kubeconfig: str,
    tracing: str,
    env: dict[str, str],
    gangs: int,
    collector: OtelCollector,
) -> Round:
    received_before = len(collector.spans())
    process = Process(kubeconfig, env, collector.workdir / f"gangcheck-{tracing}.log")
    try:
        await eventually(process.ready, what="gangcheck ready", timeout=60)
        cluster = await Cluster.create(kube)
        await cluster.install_check({"fulfillment": {"mode": "TrustProvisioned"}})
        names = [f"g{i}" for i in range(gangs)]
        for name in names:
            builder = WorkloadBuilder(name).pod_set("w", 2, pod_template(gpu=1))
            await cluster.submit(builder.reserve_quota().check())
        for name in names:
            await cluster.wait_request(naming.request_name(name, cluster.check, 1), timeout=120)
        before = await settled(process)
        started = time.monotonic()
        for name in names:
            await cluster.set_request_conditions(
                naming.request_name(name, cluster.check, 1), {"Provisioned": ""}
            )
        for name in names:
            await cluster.wait_check(name, "Ready", timeout=120)
        wall = time.monotonic() - started
        after = await process.metrics()
    finally:
        process.stop()  # what is still queued is sent on the way out
    key_count = ("gangcheck_reconcile_duration_seconds_count", WORKLOAD)
    key_sum = ("gangcheck_reconcile_duration_seconds_sum", WORKLOAD)
    return Round(
        tracing=tracing,
        gangs=gangs,
        reconciles=after.get(key_count, 0) - before.get(key_count, 0),
        reconcile_seconds=after.get(key_sum, 0) - before.get(key_sum, 0),
        wall_seconds=wall,
        received=len(collector.spans()) - received_before,
        dropped=_dropped(after),
    )


async def main_async(
    kubeconfig: str, collector: OtelCollector, gangs: int, rounds: int
) -> list[Round]:
    results = []
    async with await Kube.connect(kubeconfig) as kube:
        modes = [("off", {}), ("on", {"GANGCHECK_TRACING__OTLP_ENDPOINT": collector.endpoint})]
        for number in range(rounds):
            for tracing, env in modes if number % 2 == 0 else modes[::-1]:
                results.append(
                    await one_round(
                        kube,
                        kubeconfig=kubeconfig,
                        tracing=tracing,
                        env=env,
                        gangs=gangs,
                        collector=collector,
                    )
                )
    return results


def print_table(rows: list[Round], collector: OtelCollector) -> None:
    print(f"OpenTelemetry Collector {collector.version()} at {collector.endpoint}")
    print(
        f"{'tracing':8} {'gangs':>5} {'reconciles':>10} {'mean ms':>8} {'rec/s work':>10} "
        f"{'rec/s wall':>10} {'wall s':>7} {'spans received':>14} {'dropped':>7}"
    )
    for r in rows:
        print(
            f"{r.tracing:8} {r.gangs:5d} {r.reconciles:10.0f} {r.mean_ms:8.2f} {r.rate:10.1f} "
            f"{r.wall_rate:10.1f} {r.wall_seconds:7.2f} {r.received:14d} {r.dropped:7.0f}"
        )
    for mode in ("off", "on"):
        of = [r for r in rows if r.tracing == mode]
        print(
            f"median, tracing {mode:3}: {statistics.median(r.mean_ms for r in of):.2f} ms per "
            f"reconcile, {statistics.median(r.wall_rate for r in of):.1f} reconciles/s wall"
        )


def print_sample(collector: OtelCollector) -> None:
    """One traced reconcile that made a gang Ready, with its child spans."""
    spans = collector.spans()
    root = next(
        s
        for s in spans
        if s.name == "reconcile workload"
        and s.attributes.get("gangcheck.decision.outcome") == "ready"
        and s.attributes.get("gangcheck.decision.changed")
    )
    print(f"\n{root.name}  {(root.end_ns - root.start_ns) / 1e6:.2f} ms")
    for key, value in sorted(root.attributes.items()):
        print(f"    {key} = {value!r}")
    for child in (s for s in spans if s.parent_id == root.span_id):
        attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(child.attributes.items()))
        print(f"  {child.name}  {(child.end_ns - child.start_ns) / 1e6:.2f} ms  {attrs}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gangs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sample", action="store_true", help="print one traced reconcile")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="gangcheck-tracing-") as workdir,
        ControlPlane(binaries=ensure_binaries(CONTROL_PLANE)) as plane,
        OtelCollector(Path(workdir) / "otelcol") as collector,
    ):
        rows = asyncio.run(main_async(str(plane.kubeconfig), collector, args.gangs, args.rounds))
        print_table(rows, collector)
        if args.sample:
            print_sample(collector)
    return 0


if __name__ == "__main__":
    sys.exit(main())
