"""The optional components on top of etcd + kube-apiserver: the rest of a cluster.

Each :class:`Addon` becomes one :class:`~gangcheck_dev.testbed.process.Component` of a
:class:`~gangcheck_dev.testbed.launcher.ControlPlane`, started in this order:

- ``kube-scheduler`` and ``kube-controller-manager`` with their own client certificates
  (CN ``system:kube-scheduler`` / ``system:kube-controller-manager``), so the bootstrap RBAC
  roles apply as in a real cluster; ready when ``/readyz`` / ``/healthz`` answer 200.
- ``kwok``: fake Nodes (annotated ``kwok.x-k8s.io/node: fake``) and their pods, driven by Stage
  objects read from the kwok module in the Go module cache; ready on its ``/healthz``.
- ``kueue``: the Kueue manager out of cluster; its webhooks (and CRD conversion) registered by
  ``url:`` on 127.0.0.1 with the cluster CA as ``caBundle``; ready when ``/readyz`` answers and
  a dry-run create through its webhooks succeeds.
- ``cluster-autoscaler`` with the kwok provider and ProvisioningRequests; its node groups come
  from :class:`~gangcheck_dev.testbed.nodes.NodeGroup` specs, written to ConfigMaps before it
  starts (it reads them once); ready when ``/health-check`` answers and its first loop wrote
  the status ConfigMap.
- ``karpenter`` (instead of cluster-autoscaler, never beside it) with its kwok cloud provider:
  its CRDs from the module cache, a KWOKNodeClass, the instance types and NodePools of
  :mod:`~gangcheck_dev.testbed.karpenter`; leader election off, no webhooks (v1.15 has none);
  ready when ``/readyz`` answers (its caches synced, NodePool/NodeClaim served).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gangcheck_dev.testbed import crds
from gangcheck_dev.testbed import karpenter as karp
from gangcheck_dev.testbed.binaries import cache_dir
from gangcheck_dev.testbed.certs import KeyPair
from gangcheck_dev.testbed.kubeconfig import write_kubeconfig
from gangcheck_dev.testbed.nodes import (
    KWOK_ANNOTATION,
    KWOK_ANNOTATION_VALUE,
    NodeGroup,
    autoscaler_configmaps,
)
from gangcheck_dev.testbed.process import Component, ComponentError, Probe, free_ports
from gangcheck_dev.testbed.rest import RestClient, tls_context

if TYPE_CHECKING:
    from gangcheck_dev.testbed.launcher import ControlPlane

SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
KWOK = "kwok"
KUEUE = "kueue"
AUTOSCALER = "cluster-autoscaler"
KARPENTER = "karpenter"
#: Start order of the optional components.
ORDER = (SCHEDULER, CONTROLLER_MANAGER, KWOK, KUEUE, AUTOSCALER, KARPENTER)
#: The autoscalers: a stack runs one of them (both would provision for the same pods).
AUTOSCALERS = (AUTOSCALER, KARPENTER)
#: Short names accepted for them.
ALIASES = {
    "scheduler": SCHEDULER,
    "controller-manager": CONTROLLER_MANAGER,
    "kcm": CONTROLLER_MANAGER,
    "autoscaler": AUTOSCALER,
    "ca": AUTOSCALER,
}
#: Everything, with cluster-autoscaler: ``ControlPlane(components=FULL_STACK)``; with
#: ``autoscaler="karpenter"`` Karpenter takes cluster-autoscaler's place.
FULL_STACK = (SCHEDULER, CONTROLLER_MANAGER, KWOK, KUEUE, AUTOSCALER)
#: Binary family (``hack/build.sh`` argument) of each component.
FAMILY = {
    SCHEDULER: "kubernetes",
    CONTROLLER_MANAGER: "kubernetes",
    KWOK: "kwok",
    KUEUE: "kueue",
    AUTOSCALER: "autoscaler",
    KARPENTER: "karpenter",
}

ROOT_CA_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt"
KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_NAME_PREFIX = "kueue-"  # what Kueue's config/default kustomization prefixes names with
KUEUE_FRAMEWORKS = ("batch/job",)
#: VisibilityOnDemand serves an aggregated API (visibility.kueue.x-k8s.io) that would need an
#: APIService pointing at a Service in the cluster; off out of cluster.
#: ElasticJobsViaWorkloadSlices (alpha in v0.17) makes workload slices of the Jobs annotated
#: ``kueue.x-k8s.io/elastic-job: "true"`` only (tests/e2e/test_elastic.py); every other Job
#: is admitted as before (its pods carry one more annotation, the workload slice's name).
KUEUE_FEATURE_GATES = ("VisibilityOnDemand=false", "ElasticJobsViaWorkloadSlices=true")
#: Kueue v0.17 reads its metrics serving certificate from this hard-coded folder whenever
#: internal cert management is off (cmd/kueue/main.go), and exits if the files are missing.
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
KWOK_MODULE = "sigs.k8s.io/kwok"
#: Stages from the kwok module: nodes become Ready and keep a lease; pods become Running and
#: stay so (no pod-complete: gang members must keep running); deleted pods go away (no kubelet
#: would finish a graceful deletion otherwise).
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
KWOK_NODE_LEASE_SECONDS = 40
KWOK_POD_CIDR = "10.244.0.0/16"
AUTOSCALER_NAMESPACE = "kube-system"
AUTOSCALER_STATUS_CONFIGMAP = "cluster-autoscaler-status"
#: ``--kube-api-content-type=application/json``: CA 1.33.0 sends protobuf by default, also
#: for ProvisioningRequests (a CRD), and every status write fails with "object
#: *v1.ProvisioningRequest does not implement the protobuf marshalling interface"
#: (kubernetes/autoscaler#8855; fixed after 1.33.0 by #9546, cherry-picked in #10014).
#: Client rate limit 50/100 instead of 5/10: the defaults throttle its start (1.2 s "client-side
#: throttling" while syncing informers) and node creation for large gangs.
#: Short timers so tests see scale-down within a minute (defaults: 10 min each).
AUTOSCALER_DEFAULT_ARGS = (
    "--kube-api-content-type=application/json",
    "--kube-client-qps=50",
    "--kube-client-burst=100",
    "--scan-interval=2s",
    "--scale-down-unneeded-time=10s",
    "--scale-down-delay-after-add=10s",
    "--v=2",
)


def canonical(name: str) -> str:
    """The component name for ``name`` or one of its aliases (``scheduler`` ...)."""
    full = ALIASES.get(name, name)
    if full not in ORDER:
        raise ValueError(f"unknown component {name!r}; known: {', '.join(ORDER)} (or aliases)")
    return full


def with_autoscaler(components: Sequence[str], autoscaler: str) -> list[str]:
    """``components`` (canonical names) with cluster-autoscaler, if there, swapped for
    ``autoscaler`` (a stack option: ``FULL_STACK`` names cluster-autoscaler)."""
    if autoscaler not in AUTOSCALERS:
        raise ValueError(f"unknown autoscaler {autoscaler!r}; known: {', '.join(AUTOSCALERS)}")
    return [autoscaler if name == AUTOSCALER else name for name in components]


#: Health probes go straight to loopback, whatever *_proxy variables say.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str) -> int:
    try:
        with _DIRECT.open(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Addon:
    """One optional component: files and cluster objects it needs, its process, its checks."""

    name: str = ""
    #: Needs the CRDs the control plane installs (Kueue's, ProvisioningRequest).
    needs_crds: bool = False

    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        self.extra_args = list(extra_args)
        self.ports: dict[str, int] = {}
        self.component: Component | None = None

    @property
    def family(self) -> str:
        return FAMILY[self.name]

    def folder(self, plane: ControlPlane) -> Path:
        path = plane.root / self.name
        path.mkdir(exist_ok=True)
        return path

    def start(self, plane: ControlPlane) -> Component:
        """Prepares, starts, waits for readiness and runs the post-start steps."""
        self.prepare(plane)
        self.component = self.build(plane)
        plane.components[self.name] = self.component
        self.component.start()
        self.component.wait_ready()
        self.after_ready(plane, self.component)
        return self.component

    def prepare(self, plane: ControlPlane) -> None:
        """Files and cluster objects needed before the process starts."""

    def build(self, plane: ControlPlane) -> Component:
        raise NotImplementedError

    def after_ready(self, plane: ControlPlane, component: Component) -> None:
        """Steps after the probe passed (registering webhooks ...)."""

    def cleanup(self) -> None:
        """After the process has stopped: undo what lives outside the control plane's folder."""

    def _component(
        self,
        plane: ControlPlane,
        argv: Sequence[str],
        probe: Probe,
        env: Mapping[str, str] | None = None,
    ) -> Component:
        return Component(
            name=self.name,
            argv=[*argv, *self.extra_args],
            log_path=plane.logs / f"{self.name}.log",
            probe=probe,
            env=env,
            ready_timeout=plane.ready_timeout,
        )


class _SecureComponent(Addon):
    """kube-scheduler / kube-controller-manager: own client cert, serving cert, kubeconfig."""

    user: str = ""

    def prepare(self, plane: ControlPlane) -> None:
        folder = self.folder(plane)
        (self.ports["secure"],) = free_ports(1)
        plane.issue_client_cert(self.user).write(folder / "client.crt", folder / "client.key")
        plane.issue_serving_cert("127.0.0.1", ["localhost"]).write(
            folder / "serving.crt", folder / "serving.key"
        )
        write_kubeconfig(
            self.kubeconfig(plane),
            server=plane.server,
            ca=plane.pki.ca_cert,
            cert=folder / "client.crt",
            key=folder / "client.key",
            user=self.user,
        )

    def kubeconfig(self, plane: ControlPlane) -> Path:
        return self.folder(plane) / "kubeconfig"

    def serving_args(self, plane: ControlPlane) -> list[str]:
        folder = self.folder(plane)
        kubeconfig = self.kubeconfig(plane)
        return [
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['secure']}",
            f"--tls-cert-file={folder / 'serving.crt'}",
            f"--tls-private-key-file={folder / 'serving.key'}",
            # Delegated authentication/authorization as kubeadm sets them up, so the admin
            # certificate is accepted on every endpoint (health paths are always allowed).
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
        ]

    def probe_path(self, plane: ControlPlane, path: str) -> Probe:
        context = tls_context(plane.pki.ca_cert, plane.pki.admin_cert, plane.pki.admin_key)
        client = RestClient(f"https://127.0.0.1:{self.ports['secure']}", context, timeout=3)
        return lambda: client.ok(path)


class Scheduler(_SecureComponent):
    name = SCHEDULER
    user = "system:kube-scheduler"

    def build(self, plane: ControlPlane) -> Component:
        config = self.folder(plane) / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig(plane))},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        argv = [
            str(plane.binary("kube-scheduler")),
            f"--config={config}",
            *self.serving_args(plane),
            f"--feature-gates={','.join(plane.feature_gates)}",
        ]
        return self._component(plane, argv, self.probe_path(plane, "/readyz"))


class ControllerManager(_SecureComponent):
    name = CONTROLLER_MANAGER
    user = "system:kube-controller-manager"

    def build(self, plane: ControlPlane) -> Component:
        argv = [
            str(plane.binary("kube-controller-manager")),
            f"--kubeconfig={self.kubeconfig(plane)}",
            *self.serving_args(plane),
            "--leader-elect=false",
            # Every default controller: none needs a cloud (those live in the
            # cloud-controller-manager); node IPAM is off without --allocate-node-cidrs.
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={plane.pki.service_account_key}",
            f"--root-ca-file={plane.pki.ca_cert}",
            # Its default is a host folder it creates (/usr/libexec/kubernetes/...).
            f"--flex-volume-plugin-dir={self.folder(plane) / 'flexvolume'}",
            f"--feature-gates={','.join(plane.feature_gates)}",
        ]
        healthy = self.probe_path(plane, "/healthz")
        admin = plane.client()

        def probe() -> bool:
            # /healthz answers long before the controllers run (4-6 s later); the CA bundle
            # that root-ca-cert-publisher writes into every namespace shows they do.
            return healthy() and admin.ok(ROOT_CA_CONFIGMAP)

        return self._component(plane, argv, probe)


class Kwok(Addon):
    name = KWOK

    def stage_files(self) -> list[Path]:
        module = crds.module_dir(KWOK_MODULE, wrapper="kwok")
        files = [module / stage for stage in KWOK_STAGES]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"kwok stages missing from the module cache: {missing}")
        return files

    def build(self, plane: ControlPlane) -> Component:
        (self.ports["server"],) = free_ports(1)
        argv = [
            str(plane.binary("kwok")),
            f"--kubeconfig={plane.kubeconfig}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
            *(f"--config={path}" for path in self.stage_files()),
            f"--server-address=127.0.0.1:{self.ports['server']}",
            f"--node-lease-duration-seconds={KWOK_NODE_LEASE_SECONDS}",
            f"--cidr={KWOK_POD_CIDR}",
        ]
        url = f"http://127.0.0.1:{self.ports['server']}/healthz"
        return self._component(plane, argv, lambda: _http_status(url) == 200)


# -- Kueue --------------------------------------------------------------------------------


@contextlib.contextmanager
def _metrics_cert_lock() -> Iterator[None]:
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "kueue-metrics-cert.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class MetricsCert:
    """The certificate Kueue insists on in a fixed folder, shared by every stack on the machine.

    Created (with the folders that were missing) by the first stack that needs it, removed by
    the last one that stops. A certificate that was there before (not created by gangcheck) is
    used and never touched. Owners are the control planes' folders; an owner whose folder is
    gone (a stack that was killed) no longer counts.
    """

    OWNERS = ".gangcheck-owners.json"

    def __init__(self, directory: Path = KUEUE_METRICS_CERT_DIR) -> None:
        self.directory = directory

    @property
    def _owners_file(self) -> Path:
        return self.directory / self.OWNERS

    def _read(self) -> dict[str, list[str]] | None:
        try:
            data: dict[str, list[str]] = json.loads(self._owners_file.read_text())
        except (OSError, ValueError):
            return None
        return data

    def _write(self, data: dict[str, list[str]]) -> None:
        self._owners_file.write_text(json.dumps(data, indent=1))

    @property
    def present(self) -> bool:
        return (self.directory / "tls.crt").is_file() and (self.directory / "tls.key").is_file()

    def acquire(self, owner: Path, pair: KeyPair) -> None:
        with _metrics_cert_lock():
            data = self._read()
            if data is None and self.present:
                return  # provided by someone else: use as is
            if data is None:
                created = []
                for folder in reversed([self.directory, *self.directory.parents]):
                    if not folder.exists():
                        folder.mkdir(mode=0o755)
                        created.append(str(folder))
                pair.write(self.directory / "tls.crt", self.directory / "tls.key")
                data = {"created": created, "owners": []}
            data["owners"] = [o for o in data["owners"] if Path(o).exists()] + [str(owner)]
            self._write(data)

    def release(self, owner: Path) -> None:
        with _metrics_cert_lock():
            data = self._read()
            if data is None:
                return
            data["owners"] = [o for o in data["owners"] if o != str(owner) and Path(o).exists()]
            if data["owners"]:
                self._write(data)
                return
            for name in ("tls.crt", "tls.key", self.OWNERS):
                (self.directory / name).unlink(missing_ok=True)
            for folder in reversed(data["created"]):
                with contextlib.suppress(OSError):
                    Path(folder).rmdir()  # only if empty


def _service_to_url(client_config: dict[str, Any], port: int, ca_bundle: str) -> dict[str, Any]:
    service = client_config["service"]
    return {"url": f"https://127.0.0.1:{port}{service['path']}", "caBundle": ca_bundle}


def kueue_webhook_configurations(module: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations from its module, pointed at 127.0.0.1:``port``.

    Applies the patches of ``config/components/webhook/kustomization.yaml`` (namespace
    selectors that keep kube-system out), the ``kueue-`` name prefix of ``config/default``, and
    turns every ``clientConfig.service`` into ``url`` + ``caBundle``.
    """
    folder = module / "config" / "components" / "webhook"
    docs = [d for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()) if d]
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    patches = [yaml.safe_load(p["patch"]) for p in kustomization.get("patches", []) if "patch" in p]
    ca_bundle = _b64(ca_pem)
    for doc in docs:
        for patch in patches:
            if (patch["kind"], patch["metadata"]["name"]) != (doc["kind"], doc["metadata"]["name"]):
                continue
            by_name = {hook["name"]: hook for hook in doc["webhooks"]}
            for hook_patch in patch.get("webhooks", []):
                if hook_patch["name"] in by_name:
                    by_name[hook_patch["name"]].update(hook_patch)
        doc["metadata"] = {"name": KUEUE_NAME_PREFIX + doc["metadata"]["name"]}
        for hook in doc["webhooks"]:
            hook["clientConfig"] = _service_to_url(hook["clientConfig"], port, ca_bundle)
    return docs


def kueue_conversion_patches(module: Path, port: int, ca_pem: bytes) -> dict[str, dict[str, Any]]:
    """CRD name -> ``spec.conversion`` for the CRDs Kueue's kustomization converts by webhook."""
    folder = module / "config" / "components" / "crd"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    patches: dict[str, dict[str, Any]] = {}
    for entry in kustomization.get("patches", []):
        if "path" not in entry:
            continue
        patch = yaml.safe_load((folder / entry["path"]).read_text())
        conversion = patch["spec"]["conversion"]
        webhook = conversion["webhook"]
        webhook["clientConfig"] = _service_to_url(webhook["clientConfig"], port, _b64(ca_pem))
        patches[patch["metadata"]["name"]] = conversion
    return patches


_ADMISSION = "/apis/admissionregistration.k8s.io/v1"
WEBHOOK_PATHS = {
    "MutatingWebhookConfiguration": f"{_ADMISSION}/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": f"{_ADMISSION}/validatingwebhookconfigurations",
}
RESOURCE_FLAVORS = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"


class Kueue(Addon):
    name = KUEUE
    needs_crds = True

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        metrics_cert: MetricsCert | None = None,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(extra_args)
        self.metrics_cert = metrics_cert or MetricsCert()
        self.config_overrides = dict(config_overrides or {})
        self._owner: Path | None = None
        self.webhooks: list[str] = []
        self.converted_crds: list[str] = []

    def configuration(self, plane: ControlPlane) -> dict[str, Any]:
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['health']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.ports['metrics']}"},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.ports["webhook"],
                "certDir": str(self.folder(plane) / "webhook-certs"),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        }
        config.update(self.config_overrides)
        return config

    def reconfigure(self, plane: ControlPlane, overrides: Mapping[str, Any]) -> None:
        """Stops Kueue, writes its configuration with ``overrides`` (top-level keys, in place
        of those given before) and starts it again on the same ports and certificates;
        returns once its webhooks answer. Kueue reads its configuration once, at start."""
        if self.component is None:
            raise RuntimeError("Kueue is not started")
        self.config_overrides = dict(overrides)
        self.component.stop()
        (self.folder(plane) / "config.yaml").write_text(yaml.safe_dump(self.configuration(plane)))
        self.component.start()
        self.component.wait_ready()
        self.after_ready(plane, self.component)

    def prepare(self, plane: ControlPlane) -> None:
        folder = self.folder(plane)
        self.ports.update(zip(("webhook", "health", "metrics"), free_ports(3), strict=True))
        certs = folder / "webhook-certs"
        certs.mkdir()
        plane.issue_serving_cert("127.0.0.1", ["localhost"]).write(
            certs / "tls.crt", certs / "tls.key"
        )
        plane.ensure_namespace(KUEUE_NAMESPACE)
        try:
            self.metrics_cert.acquire(plane.root, plane.issue_serving_cert("127.0.0.1"))
        except OSError as exc:
            raise ComponentError(
                self.name,
                f"Kueue v0.17 needs {self.metrics_cert.directory}/tls.{{crt,key}} when internal "
                f"cert management is off (hard-coded) and it cannot be created: {exc}. "
                "Run as root (as CI does) or create that certificate once.",
                plane.logs / f"{self.name}.log",
                "",
            ) from exc
        self._owner = plane.root
        (folder / "config.yaml").write_text(yaml.safe_dump(self.configuration(plane)))

    def build(self, plane: ControlPlane) -> Component:
        argv = [
            str(plane.binary("kueue")),
            f"--kubeconfig={plane.kubeconfig}",
            f"--config={self.folder(plane) / 'config.yaml'}",
            f"--feature-gates={','.join(KUEUE_FEATURE_GATES)}",
        ]
        url = f"http://127.0.0.1:{self.ports['health']}/readyz"
        return self._component(plane, argv, lambda: _http_status(url) == 200)

    def after_ready(self, plane: ControlPlane, component: Component) -> None:
        admin = plane.client()
        module = crds.module_dir(KUEUE_MODULE, wrapper="kueue")
        ca_pem = plane.pki.ca_cert.read_bytes()
        port = self.ports["webhook"]
        for config in kueue_webhook_configurations(module, port, ca_pem):
            name = config["metadata"]["name"]
            admin.apply(f"{WEBHOOK_PATHS[config['kind']]}/{name}", config, crds.FIELD_MANAGER)
            if name not in self.webhooks:  # registered again by a restart (reconfigure)
                self.webhooks.append(name)
        conversions = kueue_conversion_patches(module, port, ca_pem)
        for crd, conversion in conversions.items():
            body = json.dumps({"spec": {"conversion": conversion}}).encode()
            path = f"{crds.CRD_API}/{crd}"
            reply = admin.request("PATCH", path, body, "application/merge-patch+json")
            if reply.status != 200:
                raise component.error(f"cannot patch the conversion of {crd}: {reply.body!r}")
            if crd not in self.converted_crds:
                self.converted_crds.append(crd)
        # A CRD whose conversion changed re-initialises its storage for a moment.
        changed = [admin.get(f"{crds.CRD_API}/{crd}") for crd in conversions]
        crds.wait_listable(admin, changed, plane.ready_timeout)
        self._wait_webhook(admin, component, plane.ready_timeout)

    def _wait_webhook(self, admin: RestClient, component: Component, timeout: float) -> None:
        """A dry-run create goes through Kueue's mutating and validating webhooks."""
        flavor = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "gangcheck-webhook-probe"},
        }
        body = json.dumps(flavor).encode()
        deadline = time.monotonic() + timeout
        while True:
            if not component.running:
                raise component.error("exited while its webhooks were being registered")
            reply = admin.request("POST", f"{RESOURCE_FLAVORS}?dryRun=All", body)
            if reply.status == 201:
                return
            if time.monotonic() > deadline:
                raise component.error(
                    f"webhook not answering after {timeout:.0f}s: HTTP {reply.status} "
                    f"{reply.body.decode(errors='replace')[:500]}"
                )
            time.sleep(0.2)

    def cleanup(self) -> None:
        if self._owner is not None:
            self.metrics_cert.release(self._owner)
            self._owner = None


# -- cluster-autoscaler -------------------------------------------------------------------


class Autoscaler(Addon):
    name = AUTOSCALER
    needs_crds = True

    def __init__(self, node_groups: Sequence[NodeGroup], extra_args: Sequence[str] = ()) -> None:
        super().__init__([*AUTOSCALER_DEFAULT_ARGS, *extra_args])
        if not node_groups:
            raise ValueError("cluster-autoscaler needs at least one node group")
        self.node_groups = list(node_groups)

    def prepare(self, plane: ControlPlane) -> None:
        admin = plane.client()
        for configmap in autoscaler_configmaps(self.node_groups, AUTOSCALER_NAMESPACE):
            name = configmap["metadata"]["name"]
            path = f"/api/v1/namespaces/{AUTOSCALER_NAMESPACE}/configmaps/{name}"
            admin.apply(path, configmap, crds.FIELD_MANAGER)
        (self.ports["address"],) = free_ports(1)

    def build(self, plane: ControlPlane) -> Component:
        argv = [
            str(plane.binary("cluster-autoscaler")),
            "--cloud-provider=kwok",
            f"--kubeconfig={plane.kubeconfig}",
            "--enable-provisioning-requests",
            "--leader-elect=false",
            f"--namespace={AUTOSCALER_NAMESPACE}",
            f"--address=127.0.0.1:{self.ports['address']}",
        ]
        # The kwok provider builds its own client from $KUBECONFIG (it ignores --kubeconfig)
        # and reads its ConfigMaps from $POD_NAMESPACE.
        env = {
            **os.environ,
            "KWOK_PROVIDER_MODE": "local",
            "KUBECONFIG": str(plane.kubeconfig),
            "POD_NAMESPACE": AUTOSCALER_NAMESPACE,
        }
        admin = plane.client()
        health = f"http://127.0.0.1:{self.ports['address']}/health-check"
        status = (
            f"/api/v1/namespaces/{AUTOSCALER_NAMESPACE}/configmaps/{AUTOSCALER_STATUS_CONFIGMAP}"
        )

        def probe() -> bool:
            # /health-check answers at once, and the status ConfigMap says "Initializing" from
            # the start; "Running" is written at the end of the first loop.
            if _http_status(health) != 200:
                return False
            reply = admin.request("GET", status)
            if reply.status != 200:
                return False
            text = (reply.json().get("data") or {}).get("status", "")
            return bool((yaml.safe_load(text) or {}).get("autoscalerStatus") == "Running")

        return self._component(plane, argv, probe, env)


# -- Karpenter ----------------------------------------------------------------------------


class Karpenter(Addon):
    """Karpenter out of cluster with its kwok cloud provider (binary ``karpenter``)."""

    name = KARPENTER

    def __init__(
        self,
        node_pools: Sequence[karp.NodePool],
        instance_types: Sequence[karp.InstanceType] = karp.DEFAULT_INSTANCE_TYPES,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(extra_args)
        self.node_pools = list(node_pools)
        self.instance_types = list(instance_types)

    def crd_files(self) -> list[Path]:
        module = crds.module_dir(
            karp.KARPENTER_MODULE, wrapper="karpenter", toolchain=karp.KARPENTER_TOOLCHAIN
        )
        files = [f for folder in karp.CRD_FOLDERS for f in sorted((module / folder).glob("*.yaml"))]
        if not files:
            raise FileNotFoundError(f"no Karpenter CRDs under {karp.CRD_FOLDERS} in {module}")
        return files

    def prepare(self, plane: ControlPlane) -> None:
        admin = plane.client()
        crds.install_crds(admin, crds.load_crds(self.crd_files()), plane.ready_timeout)
        node_class = karp.node_class()
        admin.apply(
            f"{karp.NODE_CLASSES}/{node_class['metadata']['name']}", node_class, crds.FIELD_MANAGER
        )
        for pool in self.node_pools:
            admin.apply(f"{karp.NODE_POOLS}/{pool.name}", pool.to_dict(), crds.FIELD_MANAGER)
        karp.write_instance_types(self.folder(plane) / "instance-types.json", self.instance_types)
        self.ports.update(zip(("metrics", "health"), free_ports(2), strict=True))

    def build(self, plane: ControlPlane) -> Component:
        argv = [
            str(plane.binary("karpenter")),
            f"--instance-types-file-path={self.folder(plane) / 'instance-types.json'}",
            "--disable-leader-election=true",
            f"--metrics-port={self.ports['metrics']}",
            f"--health-probe-port={self.ports['health']}",
            # Short batching windows: a gang's pods arrive within a second of each other.
            "--batch-idle-duration=1s",
            "--batch-max-duration=3s",
            "--log-level=debug",
        ]
        # controller-runtime reads $KUBECONFIG; Karpenter has no --kubeconfig flag.
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
        url = f"http://127.0.0.1:{self.ports['health']}/readyz"
        return self._component(plane, argv, lambda: _http_status(url) == 200, env)


def make_addons(
    components: Sequence[str],
    *,
    node_groups: Sequence[NodeGroup],
    component_args: Mapping[str, Sequence[str]],
    node_pools: Sequence[karp.NodePool] = (),
    instance_types: Sequence[karp.InstanceType] = karp.DEFAULT_INSTANCE_TYPES,
) -> list[Addon]:
    """The addons for ``components`` (any order, aliases allowed), in start order."""
    wanted = {canonical(c) for c in components}
    if set(AUTOSCALERS) <= wanted:
        raise ValueError(f"choose one autoscaler, not both: {', '.join(AUTOSCALERS)}")
    args = {canonical(k): list(v) for k, v in component_args.items() if canonical(k) in ORDER}
    addons: list[Addon] = []
    for name in ORDER:
        if name not in wanted:
            continue
        extra = args.get(name, [])
        if name == SCHEDULER:
            addons.append(Scheduler(extra))
        elif name == CONTROLLER_MANAGER:
            addons.append(ControllerManager(extra))
        elif name == KWOK:
            addons.append(Kwok(extra))
        elif name == KUEUE:
            addons.append(Kueue(extra))
        elif name == KARPENTER:
            addons.append(Karpenter(node_pools, instance_types, extra))
        else:
            addons.append(Autoscaler(node_groups, extra))
    return addons
