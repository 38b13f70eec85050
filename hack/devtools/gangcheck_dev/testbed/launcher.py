"""A real Kubernetes control plane on loopback: etcd + kube-apiserver, built from Go modules.

    with ControlPlane() as cp:          # or cp = ControlPlane().start(); ...; cp.stop()
        cp.kubeconfig                   # admin kubeconfig (client cert, CN gangcheck-admin)
        cp.run_kubectl("get", "ns")

    # The rest of a cluster, optional (see gangcheck_dev.testbed.stack):
    ControlPlane(components=FULL_STACK, node_groups=[NodeGroup("gpu", max=4, gpus=8)])
    # ... with Karpenter (kwok provider) instead of cluster-autoscaler:
    ControlPlane(components=FULL_STACK, autoscaler="karpenter", node_pools=[NodePool("gpu")])

Everything lives in one folder (a fresh temp dir unless ``root`` is given; it must not exist
yet): certificates, etcd's data, the kubeconfig and one log file per component. ``stop()``
terminates every process it started, waits for them and removes that folder.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from gangcheck_dev.testbed import crds, stack
from gangcheck_dev.testbed.binaries import CONTROL_PLANE, ensure_binaries
from gangcheck_dev.testbed.certs import ADMIN_USER, FRONT_PROXY_USER, KeyPair, PKIPaths, write_pki
from gangcheck_dev.testbed.karpenter import DEFAULT_INSTANCE_TYPES, InstanceType, NodePool
from gangcheck_dev.testbed.kubeconfig import write_kubeconfig
from gangcheck_dev.testbed.nodes import DEFAULT_NODE_GROUPS, NodeGroup
from gangcheck_dev.testbed.process import Component, free_ports
from gangcheck_dev.testbed.rest import RestClient, tls_context

ETCD = "etcd"
APISERVER = "kube-apiserver"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ETCD_QUOTA_BYTES = 4 * 1024**3
#: Workload and PodGroup (scheduling.k8s.io/v1beta1) are beta in 1.37: off unless asked for.
#: A PodGroup's schedulingConstraints.topology is dropped on write unless the alpha
#: TopologyAwareWorkloadScheduling gate is on too.
FEATURE_GATES = ("GenericWorkload=true", "TopologyAwareWorkloadScheduling=true")
RUNTIME_CONFIG = ("scheduling.k8s.io/v1beta1=true",)


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class ControlPlane:
    """etcd and kube-apiserver on 127.0.0.1 with RBAC, the CRDs installed and a kubeconfig;
    optionally the rest of a cluster (``components``, see :mod:`gangcheck_dev.testbed.stack`).

    ``components``: names from ``stack.ORDER`` or aliases (``scheduler``, ``controller-manager``,
    ``kwok``, ``kueue``, ``autoscaler``), started in that order whatever the order given;
    ``stack.FULL_STACK`` is all of them. ``node_groups``: cluster-autoscaler's node groups
    (default ``nodes.DEFAULT_NODE_GROUPS``). ``component_args``: extra flags by component.
    ``autoscaler``: which autoscaler the requested ``autoscaler`` component is,
    ``"cluster-autoscaler"`` (default) or ``"karpenter"``; Karpenter launches
    ``instance_types`` (default ``karpenter.DEFAULT_INSTANCE_TYPES``) for ``node_pools``.
    """

    #: Feature gates of kube-apiserver, kube-scheduler and kube-controller-manager.
    feature_gates: tuple[str, ...] = FEATURE_GATES

    def __init__(
        self,
        root: Path | None = None,
        *,
        binaries: Mapping[str, Path] | None = None,
        install_crds: bool = True,
        apiserver_args: Sequence[str] = (),
        ready_timeout: float = 90.0,
        components: Sequence[str] = (),
        node_groups: Sequence[NodeGroup] | None = None,
        component_args: Mapping[str, Sequence[str]] | None = None,
        autoscaler: str = stack.AUTOSCALER,
        node_pools: Sequence[NodePool] = (),
        instance_types: Sequence[InstanceType] = DEFAULT_INSTANCE_TYPES,
    ) -> None:
        self._requested_root = root
        self._binaries = dict(binaries) if binaries is not None else None
        self.install_crds = install_crds
        self.apiserver_args = list(apiserver_args)
        self.ready_timeout = ready_timeout
        self.node_groups = list(DEFAULT_NODE_GROUPS if node_groups is None else node_groups)
        self.component_args = {k: list(v) for k, v in (component_args or {}).items()}
        self.node_pools = list(node_pools)
        self.instance_types = list(instance_types)
        self.requested = stack.with_autoscaler(
            [stack.canonical(name) for name in components], stack.canonical(autoscaler)
        )
        self.addons: list[stack.Addon] = self._make_addons()  # validates the arguments
        needing = [a.name for a in self.addons if a.needs_crds]
        if needing and not install_crds:
            raise ValueError(f"{', '.join(needing)} need the CRDs: install_crds=True")
        self.components: dict[str, Component] = {}
        self.crds: list[str] = []
        self.startup_seconds: float | None = None
        #: Seconds each start phase took (prepare, etcd, kube-apiserver, bootstrap, then one
        #: entry per optional component).
        self.timings: dict[str, float] = {}
        self._root: Path | None = None
        self._ports: Ports | None = None

    # -- where things are -------------------------------------------------------------------

    @property
    def families(self) -> tuple[str, ...]:
        """The binary families (``hack/build.sh`` arguments) this control plane needs."""
        extra = [stack.FAMILY[a.name] for a in self.addons]
        return tuple(dict.fromkeys([*CONTROL_PLANE, *extra]))

    @property
    def binaries(self) -> dict[str, Path]:
        if self._binaries is None:
            self._binaries = ensure_binaries(self.families)
        return self._binaries

    @property
    def root(self) -> Path:
        if self._root is None:
            raise RuntimeError("the control plane is not started")
        return self._root

    @property
    def ports(self) -> Ports:
        if self._ports is None:
            raise RuntimeError("the control plane is not started")
        return self._ports

    @property
    def pki(self) -> PKIPaths:
        return PKIPaths(self.root / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.etcd_client}"

    @property
    def kubectl(self) -> Path:
        return self.binaries["kubernetes"] / "kubectl"

    def binary(self, name: str) -> Path:
        """A built binary by name: etcd, kube-apiserver, kubectl, kube-scheduler, kwok ..."""
        for folder in self.binaries.values():
            if (folder / name).is_file():
                return folder / name
        raise FileNotFoundError(f"no binary {name!r} in {sorted(self.binaries)}")

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        if self._root is not None:
            raise RuntimeError("the control plane is already started")
        began = time.monotonic()
        atexit.register(self.stop)  # children run in their own sessions: no orphan on exit
        try:
            self._timed("prepare", self._prepare)
            self._timed(ETCD, lambda: self._launch(self._etcd()))
            self._timed(APISERVER, lambda: self._launch(self._apiserver()))
            self._timed("bootstrap", self._bootstrap)
            self.addons = self._make_addons()
            for addon in self.addons:
                self._timed(addon.name, functools.partial(addon.start, self))
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stops every component (last started first) and removes the folder. Idempotent."""
        atexit.unregister(self.stop)
        try:
            for component in reversed(list(self.components.values())):
                component.stop()
        finally:
            for addon in reversed(self.addons):
                addon.cleanup()
            self.components.clear()
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
            self._ports = None

    def restart_apiserver(self) -> None:
        """Stops kube-apiserver and starts it again on the same port, certs and etcd."""
        apiserver = self.components[APISERVER]
        apiserver.stop()
        apiserver.start()
        apiserver.wait_ready()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- clients and credentials ------------------------------------------------------------

    def client(self, credentials: KeyPair | None = None) -> RestClient:
        """A blocking REST client as admin, or as the holder of ``credentials``."""
        if credentials is None:
            context = tls_context(self.pki.ca_cert, self.pki.admin_cert, self.pki.admin_key)
            return RestClient(self.server, context)
        folder = Path(tempfile.mkdtemp(prefix="client-", dir=self.root))
        try:
            credentials.write(folder / "tls.crt", folder / "tls.key")
            context = tls_context(self.pki.ca_cert, folder / "tls.crt", folder / "tls.key")
        finally:
            shutil.rmtree(folder)
        return RestClient(self.server, context)

    def issue_client_cert(self, user: str, groups: Sequence[str] = ()) -> KeyPair:
        """A client certificate for ``user`` (CN) in ``groups`` (O), signed by the cluster CA."""
        return self.pki.load_ca().issue_client(user, groups)

    def issue_serving_cert(self, ip: str = "127.0.0.1", dns_names: Sequence[str] = ()) -> KeyPair:
        """A serving certificate for ``ip`` signed by the cluster CA (webhooks register the CA
        file ``pki.ca_cert`` as their caBundle)."""
        return self.pki.load_ca().issue_serving(ip, [ip], dns_names)

    def ensure_namespace(self, name: str) -> None:
        """Creates namespace ``name`` and its ``default`` ServiceAccount if missing.

        Without kube-controller-manager nothing creates ServiceAccounts, and the ServiceAccount
        admission plugin refuses Pods in a namespace that has no ``default`` one.
        """
        admin = self.client()
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        if admin.request("GET", f"/api/v1/namespaces/{name}").status == 404:
            admin.create("/api/v1/namespaces", namespace)
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        path = f"/api/v1/namespaces/{name}/serviceaccounts"
        if admin.request("GET", f"{path}/default").status == 404:
            admin.create(path, account)

    def kubectl_argv(self, *args: str) -> list[str]:
        return [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args]

    def run_kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.kubectl_argv(*args), input=stdin, capture_output=True, text=True, check=check
        )

    def describe(self) -> dict[str, Any]:
        """What a person or another process needs to use and to clean up this control plane."""
        return {
            "root": str(self.root),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "kubectl": str(self.kubectl),
            "ca": str(self.pki.ca_cert),
            "ports": {
                "etcd_client": self.ports.etcd_client,
                "etcd_peer": self.ports.etcd_peer,
                "apiserver": self.ports.apiserver,
                **{
                    f"{addon.name}:{purpose}": port
                    for addon in self.addons
                    for purpose, port in addon.ports.items()
                },
            },
            "node_groups": [group.name for group in self.node_groups] if self.addons else [],
            "components": {
                name: {"pid": c.pid, "binary": c.argv[0], "log": str(c.log_path)}
                for name, c in self.components.items()
            },
        }

    # -- internals --------------------------------------------------------------------------

    def _prepare(self) -> None:
        binaries = self.binaries
        if self._requested_root is None:
            self._root = Path(tempfile.mkdtemp(prefix="gangcheck-cp-"))
        else:
            self._requested_root.mkdir(parents=True, exist_ok=False)
            self._root = self._requested_root
        write_pki(self.pki.directory)
        self._ports = Ports(*free_ports(3))
        write_kubeconfig(
            self.kubeconfig,
            server=self.server,
            ca=self.pki.ca_cert,
            cert=self.pki.admin_cert,
            key=self.pki.admin_key,
            user=ADMIN_USER,
        )
        missing = [name for name in self.families if name not in binaries]
        if missing:
            raise FileNotFoundError(f"binaries not given for {', '.join(missing)}")

    def _make_addons(self) -> list[stack.Addon]:
        return stack.make_addons(
            self.requested,
            node_groups=self.node_groups,
            component_args=self.component_args,
            node_pools=self.node_pools,
            instance_types=self.instance_types,
        )

    def addon_ports(self) -> dict[str, dict[str, int]]:
        """Ports of the optional components: ``{component: {purpose: port}}``."""
        return {addon.name: dict(addon.ports) for addon in self.addons}

    def _timed(self, phase: str, step: Callable[[], object]) -> None:
        began = time.monotonic()
        step()
        self.timings[phase] = time.monotonic() - began

    def _launch(self, component: Component) -> None:
        self.components[component.name] = component
        component.start()
        component.wait_ready()

    def _etcd(self) -> Component:
        client, peer = self.etcd_url, f"http://127.0.0.1:{self.ports.etcd_peer}"
        argv = [
            str(self.binary("etcd")),
            "--name=gangcheck",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gangcheck={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",
            f"--quota-backend-bytes={ETCD_QUOTA_BYTES}",
        ]
        return Component(
            name=ETCD,
            argv=argv,
            log_path=self.logs / "etcd.log",
            probe=lambda: _http_ok(f"{client}/health"),
            ready_timeout=self.ready_timeout,
        )

    def _apiserver(self) -> Component:
        pki = self.pki
        argv = [
            str(self.binary("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            # 1.37 refuses a loopback advertise address with the default (lease) endpoint
            # reconciler; nothing in this cluster needs the kubernetes Service's endpoints.
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.ports.apiserver}",
            f"--cert-dir={pki.directory}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            # Front proxy (request-header authentication), as kubeadm sets it up: components
            # with delegated authentication read this CA from kube-system and log errors
            # without it; aggregated APIs need it too.
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_USER}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--feature-gates={','.join(self.feature_gates)}",
            f"--runtime-config={','.join(RUNTIME_CONFIG)}",
            *self.apiserver_args,
        ]
        admin = self.client()
        return Component(
            name=APISERVER,
            argv=argv,
            log_path=self.logs / "kube-apiserver.log",
            probe=lambda: admin.ok("/readyz"),
            ready_timeout=self.ready_timeout,
        )

    def _bootstrap(self) -> None:
        admin = self.client()
        self.ensure_namespace("default")
        if self.install_crds:
            self.crds = crds.install_crds(admin, crds.load_crds(crds.crd_files()))
