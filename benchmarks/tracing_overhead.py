"""The reconcile rate of gangcheck with tracing off and on, side by side, in the same run.

One control plane, one OpenTelemetry Collector (``hack/otelcol``), and ``gangcheck run`` as its
own process twice, one after the other: without traces, then sending them to the collector.
Each round submits the same burst of gangs (TrustProvisioned, so every reconcile is the same
work), marks their requests provisioned, and waits until every check is Ready. The script plays
Kueue core.

Figures per round, from gangcheck's own metrics (deltas over the round):
- workload reconciles, and their mean duration (the histogram's sum / count);
- reconciles per second of reconcile work (1 / mean), the rate one worker sustains;
- wall seconds from the first request marked provisioned to the last gang Ready;
- spans the collector accepted, and spans dropped.

Usage: python benchmarks/tracing_overhead.py [--gangs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from gangcheck.kube.client import Kube
from gangcheck.logic import naming
from gangcheck.testbed.binaries import CONTROL_PLANE, ensure_binaries
from gangcheck.testbed.launcher import ControlPlane
from gangcheck.testbed.otelcol import OtelCollector
from gangcheck.testbed.process import free_ports
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
    exported: float = 0.0
    dropped: float = 0.0

    @property
    def mean_ms(self) -> float:
        return 1000 * self.reconcile_seconds / self.reconciles if self.reconciles else 0.0

    @property
    def rate(self) -> float:
        return self.reconciles / self.reconcile_seconds if self.reconcile_seconds else 0.0


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


def _dropped(samples: Samples) -> float:
    return sum(v for (n, _), v in samples.items() if n == "gangcheck_trace_spans_dropped_total")


async def one_round(
    kube: Kube, *, kubeconfig: str, tracing: str, env: dict[str, str], gangs: int, logs: Path
) -> Round:
    process = Process(kubeconfig, env, logs / f"gangcheck-{tracing}.log")
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
        await asyncio.sleep(1)  # the startup's own reconciles are done
        before = await process.metrics()
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
        process.stop()
    key_count = ("gangcheck_reconcile_duration_seconds_count", WORKLOAD)
    key_sum = ("gangcheck_reconcile_duration_seconds_sum", WORKLOAD)
    exported = ("gangcheck_trace_spans_exported_total", ())
    return Round(
        tracing=tracing,
        gangs=gangs,
        reconciles=after.get(key_count, 0) - before.get(key_count, 0),
        reconcile_seconds=after.get(key_sum, 0) - before.get(key_sum, 0),
        wall_seconds=wall,
        exported=after.get(exported, 0),
        dropped=_dropped(after),
    )


async def main_async(
    kubeconfig: str, collector: OtelCollector, gangs: int, rounds: int
) -> list[Round]:
    results = []
    async with await Kube.connect(kubeconfig) as kube:
        for _ in range(rounds):
            for tracing, env in (
                ("off", {}),
                ("on", {"GANGCHECK_TRACING__OTLP_ENDPOINT": collector.endpoint}),
            ):
                results.append(
                    await one_round(
                        kube,
                        kubeconfig=kubeconfig,
                        tracing=tracing,
                        env=env,
                        gangs=gangs,
                        logs=collector.workdir,
                    )
                )
    return results


def print_table(rows: list[Round], collector: OtelCollector) -> None:
    print(f"OpenTelemetry Collector {collector.version()} at {collector.endpoint}")
    print(
        f"{'tracing':8} {'gangs':>5} {'reconciles':>10} {'mean ms':>8} {'rec/s':>7} "
        f"{'wall s':>7} {'spans sent':>10} {'dropped':>7}"
    )
    for r in rows:
        print(
            f"{r.tracing:8} {r.gangs:5d} {r.reconciles:10.0f} {r.mean_ms:8.2f} {r.rate:7.0f} "
            f"{r.wall_seconds:7.2f} {r.exported:10.0f} {r.dropped:7.0f}"
        )
    print(f"spans received by the collector: {len(collector.spans())}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gangs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="gangcheck-tracing-") as workdir,
        ControlPlane(binaries=ensure_binaries(CONTROL_PLANE)) as plane,
        OtelCollector(Path(workdir) / "otelcol") as collector,
    ):
        rows = asyncio.run(main_async(str(plane.kubeconfig), collector, args.gangs, args.rounds))
        print_table(rows, collector)
    return 0


if __name__ == "__main__":
    sys.exit(main())
