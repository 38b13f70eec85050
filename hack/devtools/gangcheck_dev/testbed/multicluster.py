"""Kueue's MultiKueue on the test bed: a manager cluster and worker clusters, each its own etcd
and kube-apiserver on 127.0.0.1.

    with MultiCluster(workers=("worker-1", "worker-2")) as bed:
        bed.manager.kubeconfig                  # where Jobs are queued
        bed.workers["worker-1"].kubeconfig      # where they run
        bed.set_dispatcher(INCREMENTAL)         # restarts the manager's Kueue

- The manager runs Kueue with MultiKueue (``multiKueue`` in its Configuration) and a
  kube-controller-manager that runs only the garbage collector and the namespace controller:
  a Job deleted on the manager takes its Workload with it (and with it the workers' copies)
  only through the garbage collector. No scheduler, no nodes: nothing runs there.
- Each worker runs kube-scheduler, kube-controller-manager (the Job controller among them),
  kwok and Kueue; the capacity source and gangcheck are deployed into it by the caller
  (:func:`gangcheck_dev.testbed.deploy.start_sim_cloud`, ``deploy_gangcheck``).
- As Kueue's MultiKueue setup describes: one Secret per worker in the manager's Kueue
  namespace, its key ``kubeconfig`` holding a kubeconfig of the worker for a ServiceAccount
  there with only what MultiKueue does in a worker (:func:`worker_kubeconfig`: its token,
  the CA inline; Kueue v0.17 refuses file paths and token files unless
  ``MultiKueueAllowInsecureKubeconfigs`` is on), a ``MultiKueueCluster`` per worker naming
  its Secret (``locationType: Secret``), one ``MultiKueueConfig`` listing them and an
  ``AdmissionCheck`` of controller ``kueue.x-k8s.io/multikueue`` with that config as its
  parameters. ``start()`` returns once every MultiKueueCluster is ``Active`` and the check
  too.

The three control planes start side by side (threads); nothing else is shared but the binary
cache and Kueue's metrics certificate (:class:`gangcheck_dev.testbed.stack.MetricsCert`).
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from gangcheck_dev.testbed import crds, stack
from gangcheck_dev.testbed.binaries import CONTROL_PLANE, ensure_binaries
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.process import Component
from gangcheck_dev.testbed.rest import RestClient

#: MultiKueue's names in Kueue v0.17 (apis/kueue/v1beta2/multikueue_types.go,
#: apis/config/v1beta2/configuration_types.go).
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
ALL_AT_ONCE = "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"
INCREMENTAL = "kueue.x-k8s.io/multikueue-dispatcher-incremental"
KUBECONFIG_KEY = "kubeconfig"
#: The manager's objects this bed makes: the AdmissionCheck queues name, and its config.
CHECK = "multikueue"
CONFIG = "multikueue"
WORKERS = ("worker-1", "worker-2")
WORKER_COMPONENTS = (stack.SCHEDULER, stack.CONTROLLER_MANAGER, stack.KWOK, stack.KUEUE)
#: What the manager's kube-controller-manager runs.
MANAGER_CONTROLLERS = ("garbagecollector", "namespace")
#: How often Kueue's MultiKueue garbage collector looks for copies whose original is gone
#: (default 1 min); it only backs up the removal done when the original goes.
GC_INTERVAL = "10s"

_KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
CLUSTERS_PATH = f"{_KUEUE_API}/multikueueclusters"
CONFIGS_PATH = f"{_KUEUE_API}/multikueueconfigs"
CHECKS_PATH = f"{_KUEUE_API}/admissionchecks"
FAMILIES = (*CONTROL_PLANE, "kwok", "kueue")


class ManagerKueue(stack.Kueue):
    """Kueue with MultiKueue configured: the dispatcher named, a short garbage-collection
    interval. :meth:`restart` takes another dispatcher (Kueue reads it once, at start)."""

    def __init__(
        self, dispatcher: str = ALL_AT_ONCE, config_overrides: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(config_overrides=config_overrides)
        self.dispatcher = dispatcher

    def configuration(self, plane: ControlPlane) -> dict[str, Any]:
        config = super().configuration(plane)
        config["multiKueue"] = {"gcInterval": GC_INTERVAL, "dispatcherName": self.dispatcher}
        return config

    def restart(self, plane: ControlPlane, dispatcher: str) -> None:
        """Stops Kueue, writes its configuration with ``dispatcher`` and starts it again on
        the same ports and certificates; returns once its webhooks answer."""
        self.dispatcher = dispatcher
        self.reconfigure(plane, self.config_overrides)


class GarbageCollector(stack.ControllerManager):
    """kube-controller-manager with only ``MANAGER_CONTROLLERS``; ready on ``/healthz`` (the
    root CA publisher, which the full one's probe waits for, does not run here)."""

    def build(self, plane: ControlPlane) -> Component:
        full = super().build(plane)
        only = f"--controllers={','.join(MANAGER_CONTROLLERS)}"
        argv = [only if arg == "--controllers=*" else arg for arg in full.argv]
        return Component(
            name=self.name,
            argv=argv,
            log_path=full.log_path,
            probe=self.probe_path(plane, "/healthz"),
            ready_timeout=plane.ready_timeout,
        )


class ManagerPlane(ControlPlane):
    """The manager: etcd, kube-apiserver, the garbage collector and Kueue with MultiKueue."""

    def __init__(self, kueue: ManagerKueue, **kwargs: Any) -> None:
        self.kueue = kueue
        super().__init__(components=(stack.CONTROLLER_MANAGER, stack.KUEUE), **kwargs)

    def _make_addons(self) -> list[stack.Addon]:
        return [GarbageCollector(self.component_args.get(stack.CONTROLLER_MANAGER, ())), self.kueue]


class WorkerPlane(ControlPlane):
    """A worker: its Kueue given ``kueue_overrides`` (top-level keys of its Configuration)."""

    def __init__(self, kueue_overrides: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.kueue_overrides = dict(kueue_overrides or {})
        super().__init__(**kwargs)

    def _make_addons(self) -> list[stack.Addon]:
        addons = super()._make_addons()
        for addon in addons:
            if isinstance(addon, stack.Kueue):
                addon.config_overrides.update(self.kueue_overrides)
        return addons


class MultiCluster:
    """A manager and ``workers`` (names), each a :class:`ControlPlane`, wired by MultiKueue."""

    def __init__(
        self,
        root: Path,
        *,
        workers: Sequence[str] = WORKERS,
        dispatcher: str = ALL_AT_ONCE,
        binaries: Mapping[str, Path] | None = None,
        ready_timeout: float = 90.0,
        kueue_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """``kueue_overrides``: top-level keys of every Kueue's Configuration, the manager's
        and the workers' (e.g. ``controller.groupKindConcurrency`` as Kueue's manifests ship
        it); the manager's ``multiKueue`` is always the bed's."""
        self.root = root
        self.ready_timeout = ready_timeout
        self._binaries = dict(binaries) if binaries is not None else None
        self.kueue_overrides = dict(kueue_overrides or {})
        self.manager_kueue = ManagerKueue(dispatcher, self.kueue_overrides)
        self.manager: ControlPlane | None = None
        self.workers: dict[str, ControlPlane] = {}
        self._worker_names = list(workers)
        #: Seconds each start phase took: one entry per control plane, then ``multikueue``.
        self.timings: dict[str, float] = {}
        self.startup_seconds: float | None = None
        self._made_root = False

    @property
    def binaries(self) -> dict[str, Path]:
        if self._binaries is None:
            self._binaries = ensure_binaries(FAMILIES)
        return self._binaries

    @property
    def planes(self) -> dict[str, ControlPlane]:
        return {"manager": self._manager(), **self.workers}

    def _manager(self) -> ControlPlane:
        if self.manager is None:
            raise RuntimeError("the multi-cluster bed is not started")
        return self.manager

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> MultiCluster:
        began = time.monotonic()
        binaries = self.binaries
        self._made_root = not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        self.manager = ManagerPlane(
            self.manager_kueue,
            root=self.root / "manager",
            binaries=binaries,
            ready_timeout=self.ready_timeout,
        )
        for name in self._worker_names:
            self.workers[name] = WorkerPlane(
                self.kueue_overrides,
                root=self.root / name,
                binaries=binaries,
                components=WORKER_COMPONENTS,
                ready_timeout=self.ready_timeout,
            )
        try:
            self._start_planes()
            wired = time.monotonic()
            self._wire()
            self.timings["multikueue"] = time.monotonic() - wired
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start_planes(self) -> None:
        """Every control plane at once, each in a thread; the first failure is raised."""
        failures: dict[str, BaseException] = {}

        def run(name: str, plane: ControlPlane) -> None:
            began = time.monotonic()
            try:
                plane.start()
            except BaseException as exc:
                failures[name] = exc
            self.timings[name] = time.monotonic() - began

        threads = [
            threading.Thread(target=run, args=(name, plane), name=f"start-{name}")
            for name, plane in self.planes.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            name, exc = next(iter(failures.items()))
            raise RuntimeError(f"the {name} control plane did not start: {exc}") from exc

    def stop(self) -> None:
        """Stops every control plane, side by side, and removes their folders. Idempotent.
        The manager's Kueue first: left talking to workers that are gone, it takes its full
        stop timeout to end."""
        if self.manager_kueue.component is not None:
            self.manager_kueue.component.stop()
        planes = [*([self.manager] if self.manager else []), *self.workers.values()]
        threads = [threading.Thread(target=plane.stop, name="stop-plane") for plane in planes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._made_root:
            with contextlib.suppress(OSError):  # only if empty: the planes removed theirs
                self.root.rmdir()

    def __enter__(self) -> MultiCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- MultiKueue -------------------------------------------------------------------------

    def set_dispatcher(self, dispatcher: str) -> None:
        """Restarts the manager's Kueue with ``dispatcher`` (``multiKueue.dispatcherName``)
        and waits until it sees every worker again; nothing when it runs that one already."""
        if dispatcher == self.manager_kueue.dispatcher:
            return
        self.manager_kueue.restart(self._manager(), dispatcher)
        self._wait_active()

    def _wire(self) -> None:
        wire_multikueue(self._manager().client(), self.workers)
        self._wait_active()

    def _wait_active(self) -> None:
        """Every MultiKueueCluster and the AdmissionCheck ``Active``."""
        admin = self._manager().client()
        paths = [f"{CLUSTERS_PATH}/{name}" for name in self.workers] + [f"{CHECKS_PATH}/{CHECK}"]
        deadline = time.monotonic() + self.ready_timeout
        while True:
            inactive = {p: _active(admin, p) for p in paths}
            waiting = {p: why for p, why in inactive.items() if why}
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"MultiKueue not active after {self.ready_timeout:.0f}s: {waiting}"
                )
            time.sleep(0.2)

    def describe(self) -> dict[str, Any]:
        return {name: plane.describe() for name, plane in self.planes.items()}


#: The identity the manager's Kueue has in a worker, as Kueue's MultiKueue setup makes it: a
#: ServiceAccount in the worker's Kueue namespace, bound to a ClusterRole that lets it manage
#: the copies of Workloads and the Jobs it creates there, and a token for it.
IDENTITY = "multikueue-sa"
TOKEN_SECONDS = 24 * 3600
IDENTITY_RULES = (
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "delete", "get", "list", "watch"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["workloads"],
        "verbs": ["create", "delete", "get", "list", "watch"],
    },
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["workloads/status"],
        "verbs": ["get", "patch", "update"],
    },
)


def wire_multikueue(admin: RestClient, workers: Mapping[str, ControlPlane]) -> None:
    """MultiKueue's objects in the manager (``admin``: its client) for ``workers`` (by name):
    each one's kubeconfig Secret in Kueue's namespace (``worker_kubeconfig``) and its
    MultiKueueCluster; the MultiKueueConfig ``CONFIG`` listing them all, and MultiKueue's
    AdmissionCheck ``CHECK`` naming it."""
    namespace = stack.KUEUE_NAMESPACE
    for name, worker in workers.items():
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {KUBECONFIG_KEY: _b64(worker_kubeconfig(worker))},
        }
        admin.apply(f"/api/v1/namespaces/{namespace}/secrets/{name}", secret, crds.FIELD_MANAGER)
        cluster = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "MultiKueueCluster",
            "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": name}}},
        }
        admin.apply(f"{CLUSTERS_PATH}/{name}", cluster, crds.FIELD_MANAGER)
    config = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "MultiKueueConfig",
        "metadata": {"name": CONFIG},
        "spec": {"clusters": list(workers)},
    }
    admin.apply(f"{CONFIGS_PATH}/{CONFIG}", config, crds.FIELD_MANAGER)
    check = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {
            "controllerName": MULTIKUEUE_CONTROLLER,
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "MultiKueueConfig",
                "name": CONFIG,
            },
        },
    }
    admin.apply(f"{CHECKS_PATH}/{CHECK}", check, crds.FIELD_MANAGER)


def worker_kubeconfig(worker: ControlPlane) -> bytes:
    """A kubeconfig of the worker for the manager's Kueue: the restricted identity's token
    (``IDENTITY``, ``IDENTITY_RULES``) and the worker's CA inline (Kueue v0.17 refuses file
    paths and token files unless ``MultiKueueAllowInsecureKubeconfigs`` is on)."""
    admin = worker.client()
    namespace = stack.KUEUE_NAMESPACE
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": IDENTITY, "namespace": namespace},
    }
    admin.apply(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{IDENTITY}", account, crds.FIELD_MANAGER
    )
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"{IDENTITY}-role"},
        "rules": list(IDENTITY_RULES),
    }
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    admin.apply(f"{rbac}/clusterroles/{IDENTITY}-role", role, crds.FIELD_MANAGER)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{IDENTITY}-crb"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{IDENTITY}-role",
        },
        "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": namespace}],
    }
    admin.apply(f"{rbac}/clusterrolebindings/{IDENTITY}-crb", binding, crds.FIELD_MANAGER)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{IDENTITY}/token"
    token = str(admin.create(path, request).json()["status"]["token"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "worker",
                "cluster": {
                    "server": worker.server,
                    "certificate-authority-data": _b64(worker.pki.ca_cert.read_bytes()),
                },
            }
        ],
        "users": [{"name": IDENTITY, "user": {"token": token}}],
        "contexts": [{"name": "worker", "context": {"cluster": "worker", "user": IDENTITY}}],
        "current-context": "worker",
    }
    return yaml.safe_dump(config, sort_keys=False).encode()


def _active(admin: RestClient, path: str) -> str:
    """'' when the object's ``Active`` condition is True, else what it says instead."""
    reply = admin.request("GET", path)
    if reply.status != 200:
        return f"HTTP {reply.status}"
    for cond in (reply.json().get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Active":
            if cond.get("status") == "True":
                return ""
            return f"{cond.get('reason')}: {cond.get('message')}"
    return "no Active condition yet"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


__all__ = [
    "ALL_AT_ONCE",
    "CHECK",
    "INCREMENTAL",
    "MULTIKUEUE_CONTROLLER",
    "WORKERS",
    "MultiCluster",
]
