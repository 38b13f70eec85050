"""Kueue's MultiKueue across three clusters, started once for the folder (``bed`` is
package-scoped: test_multikueue.py and test_dispatcher.py share it).

A manager (etcd, kube-apiserver, the garbage collector, Kueue with MultiKueue) and two
workers (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok, Kueue), each
worker with its own capacity source, the simulated cloud, and gangcheck as its provisioning
check, deployed as a user deploys it (its ServiceAccount's token, the RBAC of
``manifests/base``): :mod:`gangcheck_dev.testbed.multicluster`.

The two clouds differ on purpose:

- worker-1 is stocked out: it delivers 1 node of any request, as soon as it can, and no more;
- worker-2 has room: it delivers every node, 3 s after the request (so worker-1's node has
  arrived by the time worker-2's gang fits); a request of a Job named ``*-partial-*`` gets
  its first node there at once and the other ``LATE_DELAY`` s later (a node that comes after
  the gang went, when the test deletes it meanwhile).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.testbed.deploy import ManagedProcess, deploy_gangcheck, start_sim_cloud
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.multicluster import WORKERS, MultiCluster
from gangcheck_dev.testbed.nodes import GPU_RESOURCE, Taint

from gangcheck.kube.client import Kube
from tests.conftest import measurements

GPU_TAINT = Taint(GPU_RESOURCE, "present", "NoSchedule")
SIM_CLASS = "sim.gangcheck.io"
SIM_CONFIG_MAP = "gangcheck-system/multicluster-sim"
#: The label every node of the clouds carries, and the flavors of the workers select.
SIM_POOL = "gangcheck.io/sim-pool"
POOL = "mc-gpu"
GPU_TYPE = "gangcheck.io/gpu-type"
STOCKED_OUT, WITH_ROOM = WORKERS
#: Seconds worker-2's cloud takes before delivering a request in full.
ROOM_DELAY = 3.0
#: Seconds after its first node that worker-2's cloud delivers the second of a ``*-partial-*``
#: Job's request.
LATE_DELAY = 12.0
GROUP = {
    "name": POOL,
    "maxNodes": 16,
    "cpu": "32",
    "memory": "256Gi",
    "gpus": 8,
    "labels": {GPU_TYPE: "e2e", SIM_POOL: POOL},
    "taints": [GPU_TAINT.to_dict()],
}
SCENARIOS: dict[str, list[dict[str, Any]]] = {
    STOCKED_OUT: [
        {
            "name": "stockout-after-one",
            "deliver": 1,
            "provisionAfterSeconds": 0,
            "nodeDelaySeconds": 0,
        }
    ],
    WITH_ROOM: [
        {
            "name": "late",
            "match": {"name": ".*-partial-.*"},
            "provisionAfterSeconds": 0,
            "nodeDelaySeconds": [0, LATE_DELAY],
        },
        {"name": "room", "provisionAfterSeconds": ROOM_DELAY},
    ],
}


class Keeper(threading.Thread):
    """Starts a worker's cloud and its gangcheck, and keeps them until released. A child of
    the test bed gets a parent-death signal bound to the thread that started it
    (``deploy._GUARD``), so that thread lives until it has stopped them; two keepers deploy
    into the two workers side by side."""

    def __init__(self, name: str, worker: ControlPlane, folder: Path) -> None:
        super().__init__(name=f"keep-{name}", daemon=True)
        self.worker_name = name
        self.worker = worker
        self.folder = folder
        self.processes: list[ManagedProcess] = []
        self.error: BaseException | None = None
        self.problems: list[str] = []
        self.ready = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        try:
            self.processes.append(
                start_sim_cloud(
                    self.worker.kubeconfig,
                    workdir=self.folder,
                    config_map=SIM_CONFIG_MAP,
                    config={
                        "provisioningClassNames": [SIM_CLASS],
                        "nodeGroups": [GROUP],
                        "scenarios": SCENARIOS[self.worker_name],
                    },
                    kubectl=self.worker.kubectl,
                )
            )
            self.processes.append(
                deploy_gangcheck(
                    self.worker.kubeconfig, workdir=self.folder, kubectl=self.worker.kubectl
                )
            )
        except BaseException as exc:  # raised by the fixture, in the test's thread
            self.error = exc
        finally:
            self.ready.set()
        self.release.wait()
        for process in reversed(self.processes):
            alive = process.running
            try:
                process.stop()
            except Exception as exc:  # reported by the fixture, once the rest has stopped
                self.problems.append(f"{self.worker_name}/{process.name}: {exc}")
            if not alive:
                tail = process.log_tail(40)
                self.problems.append(f"{self.worker_name}/{process.name} died:\n{tail}")


@dataclass
class Bed:
    """The three clusters; in each worker its cloud and its gangcheck."""

    clusters: MultiCluster
    workdir: Path
    keepers: list[Keeper] = field(default_factory=list)
    measurements: list[str] = field(default_factory=list)

    @property
    def manager(self) -> ControlPlane:
        assert self.clusters.manager is not None
        return self.clusters.manager

    @property
    def workers(self) -> dict[str, ControlPlane]:
        return self.clusters.workers


@pytest.fixture(scope="package")
def bed(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    workdir = tmp_path_factory.mktemp("multicluster")
    began = time.monotonic()
    clusters = MultiCluster(workdir / "planes")
    clusters.start()
    found = Bed(clusters, workdir, measurements=measurements(pytestconfig))
    try:
        planes = time.monotonic() - began
        for name, worker in clusters.workers.items():
            keeper = Keeper(name, worker, workdir / name)
            found.keepers.append(keeper)
            keeper.start()
        for keeper in found.keepers:
            keeper.ready.wait()
            if keeper.error is not None:
                raise keeper.error
        timings = ", ".join(f"{k} {v:.1f}s" for k, v in clusters.timings.items())
        found.measurements.append(
            f"multi-cluster bed up in {time.monotonic() - began:.1f}s: control planes "
            f"{planes:.1f}s ({timings}), then the clouds and gangchecks"
        )
        yield found
    finally:
        _teardown(found)


def _teardown(bed: Bed) -> None:
    """Every process stopped and every cluster too, whatever fails on the way; then the
    first failure (gangcheck dead or refused a write) is raised."""
    for keeper in bed.keepers:
        keeper.release.set()
    for keeper in bed.keepers:
        keeper.join()
    bed.clusters.stop()
    problems = [problem for keeper in bed.keepers for problem in keeper.problems]
    assert not problems, "\n".join(problems)


@pytest.fixture
async def kubes(bed: Bed) -> AsyncIterator[dict[str, Kube]]:
    """A client per cluster: ``manager``, ``worker-1``, ``worker-2``."""
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(await Kube.connect(str(plane.kubeconfig)))
            for name, plane in bed.clusters.planes.items()
        }
        yield clients
