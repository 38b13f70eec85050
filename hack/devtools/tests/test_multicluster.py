"""The multi-cluster test bed's pieces that need no process (the bed itself runs in
tests/e2e/multicluster, which starts it once)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.multicluster import (
    ALL_AT_ONCE,
    IDENTITY_RULES,
    INCREMENTAL,
    WORKER_COMPONENTS,
    ManagerKueue,
    MultiCluster,
    WorkerPlane,
)
from gangcheck_dev.testbed.stack import Kueue


def _plane(root: Path) -> ControlPlane:
    return cast(ControlPlane, SimpleNamespace(root=root))


def test_the_managers_kueue_names_its_dispatcher_and_keeps_the_stacks_settings(
    tmp_path: Path,
) -> None:
    kueue = ManagerKueue(INCREMENTAL)
    kueue.ports.update(webhook=1, health=2, metrics=3)
    config: dict[str, Any] = kueue.configuration(_plane(tmp_path))
    assert config["multiKueue"]["dispatcherName"] == INCREMENTAL
    assert config["multiKueue"]["gcInterval"] == "10s"
    assert config["namespace"] == "kueue-system"
    assert config["integrations"]["frameworks"] == ["batch/job"]


def test_the_workers_identity_may_not_update_workloads_nor_touch_anything_else() -> None:
    """What Kueue's MultiKueue setup grants: Jobs and Workloads, their status; a copy has no
    finalizer, so no update of a Workload is needed (the e2e proves it with this role)."""
    granted = {
        (group, resource, verb)
        for rule in IDENTITY_RULES
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {g for g, _, _ in granted} == {"batch", "kueue.x-k8s.io"}
    assert ("kueue.x-k8s.io", "workloads", "update") not in granted
    assert ("batch", "jobs", "create") in granted
    assert ("kueue.x-k8s.io", "workloads/status", "patch") in granted


def test_a_bed_never_started_stops_and_keeps_its_dispatcher(tmp_path: Path) -> None:
    bed = MultiCluster(tmp_path / "bed")
    bed.set_dispatcher(ALL_AT_ONCE)  # the one it has: nothing to restart
    bed.stop()
    bed.stop()
    assert not (tmp_path / "bed").exists()


def test_kueue_overrides_reach_every_kueue_and_the_manager_keeps_its_multikueue(
    tmp_path: Path,
) -> None:
    """As the side-by-side benchmark runs Kueue: its controllers' concurrency as shipped, in
    the manager and in each worker; the manager's multiKueue is the bed's whatever is given."""
    shipped = {"controller": {"groupKindConcurrency": {"Workload.kueue.x-k8s.io": 5}}}
    bed = MultiCluster(tmp_path / "bed", kueue_overrides=shipped, dispatcher=INCREMENTAL)
    bed.manager_kueue.ports.update(webhook=1, health=2, metrics=3)
    config: dict[str, Any] = bed.manager_kueue.configuration(_plane(tmp_path))
    assert config["controller"] == shipped["controller"]
    assert config["multiKueue"]["dispatcherName"] == INCREMENTAL
    worker = WorkerPlane(shipped, root=tmp_path / "worker", components=WORKER_COMPONENTS)
    (kueue,) = [a for a in worker._make_addons() if isinstance(a, Kueue)]
    assert kueue.config_overrides == shipped
