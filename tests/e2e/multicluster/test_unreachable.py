"""gangcheck's dispatcher with a worker whose API server is down, on the multi-cluster bed
of conftest.py (Kueue in the manager restarted with the dispatcher's name, the dispatcher
deployed as in test_dispatcher.py).

Kueue v0.17 reads a Workload's copy in every worker it counts as connected and stops at the
first error, before creating any copy (``readGroup`` over ``remoteClientsForAC``,
pkg/controller/admissionchecks/multikueue/workload.go); a worker whose watches have ended is
marked reconnecting and left out (``startWatcher``, multikueuecluster.go). So with worker-1's
kube-apiserver stopped the gang is placed in worker-2, and the dispatcher skips worker-1.

Last in the folder (files run in name order): after worker-1's API server came back and Kueue
showed it Active again, the AllAtOnce race of test_multikueue.py, run next, twice saw worker-1
scale up nothing for its gang (cause not established), so nothing runs after this test.
"""

from __future__ import annotations

import time

import pytest
from gangcheck_dev.testbed.deploy import ManagedProcess, restart
from gangcheck_dev.testbed.launcher import APISERVER
from gangcheck_dev.testbed.stack import KUEUE_NAMESPACE

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import MULTIKUEUE_CLUSTER, SECRET
from tests.e2e.helpers import JOB, delete_quietly, eventually, is_true, unique
from tests.e2e.multicluster.conftest import STOCKED_OUT, WITH_ROOM, Bed
from tests.e2e.multicluster.test_dispatcher import cleanup_delivered, dispatcher, record_of
from tests.e2e.multicluster.test_multikueue import (
    MANAGER,
    admitted_in_a_worker,
    cleanup_winner,
    fresh_namespace,
    gang_job,
    queues,
)

__all__ = ["dispatcher"]  # the module-scoped fixture, deployed again for this module

#: What the simulated cloud logs once it has read its config (and so watches requests).
SIM_LOADED = "sim-cloud config loaded from"


@pytest.mark.timeout(240)
async def test_a_worker_whose_api_server_is_down_is_skipped_and_the_gang_runs_in_the_other(
    bed: Bed, kubes: dict[str, Kube], dispatcher: ManagedProcess
) -> None:
    """worker-1's kube-apiserver stopped (its watches end: Kueue marks the client
    reconnecting and the MultiKueueCluster not Active): the dispatcher skips worker-1 and
    nominates worker-2, and Kueue, which reads the copies only in workers it is connected to,
    places the gang there. worker-1's API server (and its cloud and gangcheck, stopped with it) is
    started again after, and Kueue reconnects to it (its Secret touched, so it does not wait
    out its reconnect backoff)."""
    manager, with_room = kubes[MANAGER], kubes[WITH_ROOM]
    namespace = await fresh_namespace(kubes)
    # worker-1's gangcheck leads through a Lease there: it would exit on losing it (as it
    # must: its Deployment restarts it); its cloud's watches would come back only after their
    # backoff, late for the next test's race. Both stopped first and started again after.
    (keeper,) = [k for k in bed.keepers if k.worker_name == STOCKED_OUT]
    around = [p for p in keeper.processes if p.name in ("sim-cloud", "gangcheck")]
    assert len(around) == 2, [p.name for p in keeper.processes]
    async with queues(kubes, namespace):
        apiserver = bed.workers[STOCKED_OUT].components[APISERVER]
        for process in reversed(around):
            process.stop()
        apiserver.stop()
        try:

            async def kueue_lost_it() -> bool:
                cluster = await manager.get(MULTIKUEUE_CLUSTER, STOCKED_OUT)
                return not is_true(cluster, "Active")

            await eventually(kueue_lost_it, timeout=60, what=f"{STOCKED_OUT} not Active")
            began = time.monotonic()
            await manager.create(JOB, gang_job("gang"), namespace)
            wl = await admitted_in_a_worker(manager, namespace)
            took = time.monotonic() - began
            assert wl["status"]["clusterName"] == WITH_ROOM
            record = record_of(wl)
            assert record["tried"] == [WITH_ROOM], record
            assert STOCKED_OUT in record["skipped"], record
            assert not record["failed"], record
            bed.measurements.append(
                f"dispatcher, {STOCKED_OUT}'s API server down: admitted in {WITH_ROOM} "
                f"{took:.1f}s after the Job ({STOCKED_OUT} skipped: "
                f"{record['skipped'][STOCKED_OUT][:60]})"
            )
        finally:
            await delete_quietly(manager, JOB, "gang", namespace)
            # in this thread: a child of the bed is bound to the thread that starts it
            apiserver.start()
            apiserver.wait_ready()
            for process in around:
                loaded = process.log_path.read_text(errors="replace").count(SIM_LOADED)
                restart(process)
                if process.name == "sim-cloud":  # its probe reads the log from its first start

                    async def reloaded(process: ManagedProcess = process, n: int = loaded) -> bool:
                        text = process.log_path.read_text(errors="replace")
                        return text.count(SIM_LOADED) > n

                    await eventually(reloaded, timeout=30, what="worker-1's cloud started again")
            touch = {"metadata": {"annotations": {"gangcheck.io/e2e-reconnect": unique("r")}}}
            await manager.merge_patch(SECRET, STOCKED_OUT, touch, KUEUE_NAMESPACE)

            async def reconnected() -> bool:
                return is_true(await manager.get(MULTIKUEUE_CLUSTER, STOCKED_OUT), "Active")

            await eventually(reconnected, timeout=90, what=f"{STOCKED_OUT} Active again")
            await cleanup_winner(with_room, namespace)
            await cleanup_delivered(with_room, namespace)
