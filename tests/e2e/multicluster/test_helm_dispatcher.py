"""gangcheck's capacity-aware dispatcher installed with the real helm, end to end, on the
multi-cluster bed of conftest.py (no control plane of its own), as docs/multicluster.md tells
a user to install it:

- in the manager, ``helm install gangcheck manifests/helm/gangcheck --set role=dispatcher``
  (Kueue there restarted with ``multiKueue.dispatcherName: gangcheck.io/capacity-aware``);
- in each worker, whose gangcheck the bed deployed from ``manifests/base``,
  ``helm install gangcheck ... --set role=reader``: the dispatcher's read-only rights for
  the identity of the kubeconfig Secret MultiKueue already holds for that worker (Kueue's
  ``multikueue-sa``). The user points nothing anywhere: the dispatcher reads each worker
  through the Secret its MultiKueueCluster names; the user finds who that Secret's
  kubeconfig is (``kubectl auth whoami``) and names it in ``dispatcherReader.serviceAccount``.
  The test proves the chart grants that identity what it lacked: before the install it may
  not list the worker's nodes, after it may (``kubectl auth can-i`` with that kubeconfig);
- the installed Deployment's container run from the image as its pod would be
  (``run_controller_container``: its args, env, confinement, and a token of the
  ServiceAccount helm created): what it may do is what the chart's RBAC grants; a write
  the API server refuses fails the test at teardown. No container runtime, no image: the
  ``controller_image`` fixture fails the test (it never skips).

The test then places a gang where it fits now (worker-2 has two idle 8-GPU nodes, worker-1
is stocked out) and asserts durable records: the manager Workload's ``status.clusterName``,
the dispatcher's record (annotation ``gangcheck.io/dispatch``: worker-2 alone tried and
nominated), its one ``Nominated`` Event, the gang's pods Running in worker-2 on those nodes,
and in worker-1 no copy of the Workload, no Event on one and no node delivered for it.

One dispatcher at a time. Kueue has one ``dispatcherName``, so this dispatcher and the one
test_dispatcher.py and test_unreachable.py deploy from ``manifests/dispatcher`` (a process
with the manifests' ServiceAccount) serve the same Workloads if both run. They never do:
theirs is a module-scoped fixture, finalized by pytest when its module ends (before this
module's first test sets up), the folder runs on one pytest worker (tests/conftest.py,
``worker_group``) in file order, and this module does not request it. And should one still
run: this module first deletes the manifests' dispatcher objects (helm installs only objects
it owns, and the chart's have the same names), so the manifests' ServiceAccount may no
longer write a nomination or a record; and the Lease the chart names is asserted to be held
by this container. After the module the releases are uninstalled; test_unreachable.py
applies the manifests again.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gangcheck_dev.testbed.container import Image
from gangcheck_dev.testbed.deploy import ManagedProcess, find_kubectl, run_controller_container
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.stack import KUEUE_NAMESPACE

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import LEASE, NODE
from gangcheck.logic.dispatch import DISPATCHER
from tests.e2e.helpers import eventually, get_or_none
from tests.e2e.multicluster.conftest import STOCKED_OUT, WITH_ROOM, Bed
from tests.e2e.multicluster.test_dispatcher import (
    Obj,
    assert_placed_where_it_fits_now,
    free_nodes,
    gang_submitted,
    items,
)
from tests.e2e.multicluster.test_multikueue import (
    MANAGER,
    admitted_in_a_worker,
    gang_running,
)
from tests.e2e.test_helm import CHART, helm, manifest_objects, rbac, run_helm, template

__all__ = ["free_nodes", "helm"]  # fixtures, used here

RELEASE = "gangcheck"
NAMESPACE = "gangcheck-system"
#: The chart's names for the release ``gangcheck``: the manifests' (test_helm.py checks it).
DISPATCHER_NAME = f"{RELEASE}-dispatcher"
MANIFESTS = CHART.parents[1] / "dispatcher"


def kubectl_run(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(find_kubectl()), f"--kubeconfig={kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"kubectl {' '.join(args[:3])}: {result.stderr}"
    return result.stdout


def get_json(kubeconfig: Path, kind: str, name: str, namespace: str = "") -> Obj:
    scope = [f"--namespace={namespace}"] if namespace else []
    return dict(json.loads(kubectl_run(kubeconfig, "get", kind, name, *scope, "-o", "json")))


def remove_manifests_objects(bed: Bed) -> None:
    """What an earlier module applied of ``manifests/dispatcher`` (the Namespace stays):
    helm would refuse to install over objects it does not own, and the chart must be what
    grants the rights here."""
    rbac = yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text())
    manager_objects = [o for o in rbac if o and o["kind"] != "Namespace"]
    stream = yaml.safe_dump_all(manager_objects)
    kubectl_run(bed.manager.kubeconfig, "delete", "--ignore-not-found", "-f", "-", stdin=stream)
    reader = (MANIFESTS / "worker" / "reader.yaml").read_text()
    for worker in bed.workers.values():
        kubectl_run(worker.kubeconfig, "delete", "--ignore-not-found", "-f", "-", stdin=reader)


def secret_kubeconfigs(bed: Bed, folder: Path) -> dict[str, Path]:
    """Per worker, the kubeconfig in the Secret its MultiKueueCluster names (what MultiKueue
    and the dispatcher use), written to a file."""
    found = {}
    for name in bed.workers:
        cluster = get_json(bed.manager.kubeconfig, "multikueuecluster", name)
        location = cluster["spec"]["clusterSource"]["kubeConfig"]["location"]
        secret = get_json(bed.manager.kubeconfig, "secret", location, KUEUE_NAMESPACE)
        path = folder / f"{name}.secret.kubeconfig"
        path.touch(mode=0o600)
        path.write_bytes(base64.b64decode(secret["data"]["kubeconfig"]))
        found[name] = path
    return found


def may_list_nodes(kubeconfig: Path) -> bool:
    """``kubectl auth can-i list nodes`` as the kubeconfig's identity (exit 0: yes, 1: no)."""
    result = subprocess.run(
        [str(find_kubectl()), f"--kubeconfig={kubeconfig}", "auth", "can-i", "list", "nodes"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode == 0


def whoami(kubeconfig: Path) -> tuple[str, str]:
    """The ServiceAccount (namespace, name) a kubeconfig authenticates as: ``kubectl auth
    whoami``, as docs/multicluster.md has the user find MultiKueue's identity in a worker."""
    result = subprocess.run(
        [str(find_kubectl()), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    user = str(json.loads(result.stdout)["status"]["userInfo"]["username"])
    prefix, _, account = user.partition("system:serviceaccount:")
    namespace, _, name = account.partition(":")
    assert not prefix and namespace and name, f"not a ServiceAccount: {user}"
    return namespace, name


def install(helm: Path, plane: ControlPlane, *sets: str) -> None:
    result = run_helm(
        helm, "install", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--create-namespace",
        *(f"--set={s}" for s in sets), kubeconfig=str(plane.kubeconfig),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def uninstall(helm: Path, plane: ControlPlane) -> None:
    result = run_helm(
        helm, "uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait",
        kubeconfig=str(plane.kubeconfig),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_role_reader_renders_the_workers_reader_alone(helm: Path) -> None:
    """What ``role=reader`` installs in a worker: the rights of
    ``manifests/dispatcher/worker/reader.yaml``, object for object, and nothing else (no
    controller, no dispatcher). Rendering only: no cluster."""
    objects = template(helm, "role=reader")
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ]
    assert rbac(objects) == rbac(manifest_objects(MANIFESTS / "worker" / "reader.yaml"))
    # gangcheck's leader Lease, that one and get only (whether gangcheck is up there), in its
    # namespace; nothing else namespaced, and no write anywhere
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gangcheck"],
            "verbs": ["get"],
        }
    ]
    verbs = {v for o in objects for rule in o.get("rules") or [] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, verbs
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # another gangcheck's Lease: named in the values
    other = template(helm, "role=reader", "dispatcherReader.lease.namespace=ops",
                     "dispatcherReader.lease.name=gc")  # fmt: skip
    (moved,) = [o for o in other if o["kind"] == "Role"]
    assert moved["metadata"]["namespace"] == "ops"
    assert moved["rules"][0]["resourceNames"] == ["gc"]


@pytest.fixture(scope="module")
def chart_dispatcher(
    bed: Bed, helm: Path, controller_image: Image, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    """Kueue with the dispatcher's name, the chart installed in the three clusters, and the
    installed dispatcher Deployment's container running; all removed after the module."""
    began = time.monotonic()
    bed.clusters.set_dispatcher(DISPATCHER)
    folder = tmp_path_factory.mktemp("helm-dispatcher")
    remove_manifests_objects(bed)
    identities = secret_kubeconfigs(bed, folder)
    assert not [w for w, config in identities.items() if may_list_nodes(config)], (
        "MultiKueue's identity may list a worker's nodes before the chart is installed"
    )
    repository, _, tag = controller_image.tag.partition(":")
    installed: list[ControlPlane] = []
    try:
        # DEBUG: the end of a watch (a refused one among them) is logged at that level
        install(helm, bed.manager, "role=dispatcher", f"image.repository={repository}",
                f"image.tag={tag}", "logLevel=DEBUG")  # fmt: skip
        installed.append(bed.manager)
        for name, worker in bed.workers.items():
            namespace, account = whoami(identities[name])
            install(helm, worker, "role=reader", f"dispatcherReader.serviceAccount.name={account}",
                    f"dispatcherReader.serviceAccount.namespace={namespace}")  # fmt: skip
            installed.append(worker)
        refused = [w for w, config in identities.items() if not may_list_nodes(config)]
        assert not refused, f"the chart's reader did not grant MultiKueue's identity: {refused}"
        deployment = get_json(bed.manager.kubeconfig, "deployment", DISPATCHER_NAME, NAMESPACE)
        process = run_controller_container(
            bed.manager.kubeconfig,
            deployment=deployment,
            image=controller_image.id,
            workdir=folder,
            name=DISPATCHER_NAME,
        )
        bed.measurements.append(
            f"helm dispatcher: 3 releases installed and its container ready in "
            f"{time.monotonic() - began:.1f}s"
        )
        try:
            yield process
        finally:
            process.stop()  # fails on a write the API server refused
    finally:
        for plane in reversed(installed):
            uninstall(helm, plane)


@pytest.mark.timeout(180)
async def test_the_chart_installed_dispatcher_places_the_gang_where_it_fits_now(
    bed: Bed, kubes: dict[str, Kube], chart_dispatcher: ManagedProcess, free_nodes: list[str]
) -> None:
    """The dispatcher the chart installed (its container, its RBAC in the manager, its
    reader in each worker) leads through its Lease, nominates worker-2 alone, where the gang
    fits now, and the gang runs there; worker-1, stocked out, never gets a copy nor a node."""
    manager = kubes[MANAGER]

    async def leader() -> str | None:
        lease = await get_or_none(manager, LEASE, DISPATCHER_NAME, NAMESPACE)
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "") or None

    holder = await eventually(leader, timeout=30, what=f"a holder of Lease {DISPATCHER_NAME}")
    assert holder == chart_dispatcher.container, holder  # its pod name: $(POD_NAME)
    # the room there now: the idle nodes made for this test, and any an earlier test's gang
    # left that is not gone yet (the gang may run on it: it is room that exists too)
    before = {n["metadata"]["name"] for n in await items(kubes[WITH_ROOM], NODE)}
    assert set(free_nodes) <= before
    async with gang_submitted(kubes) as (namespace, began):
        wl = await admitted_in_a_worker(manager, namespace)
        took = time.monotonic() - began
        pods = await gang_running(kubes[WITH_ROOM], namespace)
        # it ran on nodes that were there before it: nothing was made for it
        assert {p["spec"]["nodeName"] for p in pods} <= before, pods
        record = await assert_placed_where_it_fits_now(kubes, wl)
        assert not record.get("skipped"), record  # both workers read through the reader
        assert chart_dispatcher.running, chart_dispatcher.log_tail(40)
        # nothing refused, reads and watches included (its teardown checks the writes)
        log = chart_dispatcher.log_path.read_text(errors="replace").splitlines()
        assert not [line for line in log if "forbidden" in line.lower()], log[-40:]
        bed.measurements.append(
            f"helm dispatcher, room now in {WITH_ROOM}: admitted there {took:.1f}s after "
            f"the Job; {STOCKED_OUT} got no copy and no node"
        )
