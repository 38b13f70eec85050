"""Deploy gangcheck (and the simulated cloud) against a cluster as a user would: as a process,
or as the container of its image.

:func:`deploy_gangcheck` installs what ``manifests/base`` grants the controller (Namespace,
CRD, ServiceAccount, ClusterRole + binding, leader-election Role + binding) plus the
``reclaim-delete-node`` component (or the components asked for) and every admission policy of
the base (the ServiceAccount's and the fence), mints a token for the
ServiceAccount (TokenRequest API), writes a kubeconfig holding only that token, and runs
``python -m gangcheck run`` with it: the controller has exactly the permissions the manifests
give it, nothing of the admin's.
:func:`start_sim_cloud` writes the simulated cloud's ConfigMap and runs
``python -m gangcheck_dev sim-cloud``. Both return a :class:`ManagedProcess`.

Only these are applied, never the Deployment: on this test bed there is no
kubelet to run an image, so the controller runs here as a child process, or, given an image
(:func:`gangcheck_dev.testbed.container.ensure_image`), as the container the Deployment
describes, run by docker on the host's network (:func:`run_controller_container`).

Everything goes through ``kubectl`` with the given kubeconfig, so this works against the local
test bed and any other cluster (kind ...). The kubectl used is the test bed's own (built from
the pinned Go modules), else the first on ``PATH``.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gangcheck_dev.testbed.binaries import BuildError, ensure_binaries, repo_root
from gangcheck_dev.testbed.container import (
    PodIdentity,
    docker_run_argv,
    readable_by,
    remove_container,
)
from gangcheck_dev.testbed.process import Component, ComponentError, free_ports, log_tail

__all__ = [
    "NAMESPACE",
    "SERVICE_ACCOUNT",
    "DeployError",
    "ManagedProcess",
    "deploy_dispatcher",
    "deploy_gangcheck",
    "restart",
    "run_controller_container",
    "start_sim_cloud",
]

#: Where ``manifests/base`` puts the controller and its ServiceAccount.
NAMESPACE = "gangcheck-system"
SERVICE_ACCOUNT = "gangcheck"
#: What is applied of the kustomize output: permissions and the CRD, never workloads.
_APPLIED_KINDS = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    }
)
#: Every admission policy of the base: the ServiceAccount's (it may write only what gangcheck
#: writes), so that a scenario passing proves none refuses gangcheck's own writes, and the
#: fence (kube-apiserver refuses binds to a node gangcheck is reclaiming), so kube-scheduler's
#: binds meet it as in a cluster installed from the base.
_POLICY_KINDS = frozenset({"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})
_FIELD_MANAGER = "gangcheck-testbed"
_TOKEN_SECONDS = 24 * 3600
_READY_TIMEOUT = 60.0
_STOP_TIMEOUT = 10.0
#: The simulated cloud logs this once its ConfigMap is read (it is then about to serve).
_SIM_READY_LINE = "sim-cloud config loaded from"


class DeployError(RuntimeError):
    """A kubectl step of the deployment failed; carries its output."""


#: How gangcheck logs an API error (``METHOD path: status reason: message``) of a refused
#: write, or any refusal by an admission policy.
_REFUSED_WRITE = re.compile(r"ValidatingAdmissionPolicy|\b(POST|PUT|PATCH|DELETE) /\S+: 403 ")
#: A 403 that refuses no right of gangcheck's: the API server's NamespaceLifecycle admission
#: creates nothing in a namespace being deleted (an Event of a reclaim that follows a test's
#: namespace deletion), whoever asks.
_TERMINATING = "because it is being terminated"


@dataclass
class ManagedProcess:
    """One child process of ours, in its own session, its output in ``log_path``."""

    name: str
    component: Component
    log_path: Path
    kubeconfig: Path
    health_port: int | None = None
    metrics_port: int | None = None
    #: The docker container this process runs (``docker run``), removed when it stops.
    container: str | None = None
    #: gangcheck's controller: :meth:`stop` fails if its log tells of a write the API server
    #: refused (:meth:`refused_writes`), so a suite passing proves the shipped RBAC and
    #: admission policies refuse none of gangcheck's own writes.
    refusals_checked: bool = False

    @property
    def pid(self) -> int:
        pid = self.component.pid
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        return pid

    @property
    def running(self) -> bool:
        return self.component.running

    def log_tail(self, n: int = 30) -> str:
        return log_tail(self.log_path, n)

    def refused_writes(self) -> list[str]:
        """The log's lines telling of a write the API server refused: by an admission policy,
        or forbidden (403) on a create, update, patch or delete; not a create refused because
        its namespace is being deleted (no right of gangcheck's is in question)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        return [line for line in lines if _REFUSED_WRITE.search(line) and _TERMINATING not in line]

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 10 s; returns once it is gone. Raises
        :class:`DeployError` naming them if gangcheck's writes were refused."""
        self.component.stop()
        if self.container is not None:
            remove_container(self.container)
        refused = self.refused_writes() if self.refusals_checked else []
        if refused:
            shown = "\n".join(line[:400] for line in refused[:10])
            raise DeployError(
                f"the API server refused {len(refused)} writes of {self.name}:\n{shown}"
            )

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


# -- kubectl ----------------------------------------------------------------------------------


def find_kubectl() -> Path:
    """The test bed's kubectl (built, or cached, by ``hack/build.sh``), else the one on PATH."""
    try:
        return ensure_binaries(("kubernetes",))["kubernetes"] / "kubectl"
    except BuildError:
        found = shutil.which("kubectl")
        if found is None:
            raise DeployError("no kubectl: neither the test bed's nor one on PATH") from None
        return Path(found)


def _kubectl(kubectl: Path, kubeconfig: Path | None, *args: str, stdin: str | None = None) -> str:
    argv = [str(kubectl), *([f"--kubeconfig={kubeconfig}"] if kubeconfig else []), *args]
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shown = " ".join(args[:4])
        raise DeployError(f"kubectl {shown} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _apply(kubectl: Path, kubeconfig: Path, objects: Sequence[Mapping[str, Any]]) -> None:
    stream = yaml.safe_dump_all(list(objects), sort_keys=False)
    _kubectl(
        kubectl,
        kubeconfig,
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={_FIELD_MANAGER}",
        "-f",
        "-",
        stdin=stream,
    )


# -- gangcheck --------------------------------------------------------------------------------


def kustomize_objects(
    kubectl: Path, workdir: Path, components: Sequence[str]
) -> list[dict[str, Any]]:
    """``manifests/base`` with ``components`` (names under ``manifests/components``), rendered
    by ``kubectl kustomize``."""
    manifests = repo_root() / "manifests"
    # kustomize refuses absolute paths: the overlay names the base relative to itself.
    overlay = (workdir / "overlay").resolve()
    overlay.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(manifests / "base", overlay)],
        "components": [
            os.path.relpath(manifests / "components" / name, overlay) for name in components
        ],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    rendered = _kubectl(kubectl, None, "kustomize", str(overlay))
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def rbac_objects(kubectl: Path, workdir: Path, components: Sequence[str]) -> list[dict[str, Any]]:
    """:func:`kustomize_objects`, keeping only what :func:`deploy_gangcheck` applies."""
    return [doc for doc in kustomize_objects(kubectl, workdir, components) if _applied(doc)]


def _applied(doc: dict[str, Any]) -> bool:
    return doc.get("kind") in _APPLIED_KINDS | _POLICY_KINDS


def _token_kubeconfig(
    kubectl: Path, admin: Path, token: str, path: Path, *, embed_ca: bool = False
) -> Path:
    """A kubeconfig with the admin kubeconfig's server and CA and the ServiceAccount's token;
    with ``embed_ca``, the CA's data rather than its path (for a container to read)."""
    view = json.loads(_kubectl(kubectl, admin, "config", "view", "--minify", "--raw", "-o", "json"))
    cluster = dict(view["clusters"][0]["cluster"])
    ca_file = cluster.pop("certificate-authority", None)
    if ca_file and "certificate-authority-data" not in cluster:
        ca_path = (admin.parent / ca_file).resolve()
        if embed_ca:
            cluster["certificate-authority-data"] = base64.b64encode(ca_path.read_bytes()).decode()
        else:
            cluster["certificate-authority"] = str(ca_path)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [
            {"name": "gangcheck", "context": {"cluster": "cluster", "user": SERVICE_ACCOUNT}}
        ],
        "current-context": "gangcheck",
    }
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def http_ok(url: str) -> bool:
    """True when ``url`` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status) == 200
    except OSError:
        return False


def _start(component: Component) -> None:
    component.start()
    try:
        component.wait_ready()
    except ComponentError:
        component.stop()
        raise


#: Run as ``python -c _GUARD PARENT_PID -m gangcheck ...``: asks Linux to SIGTERM this process
#: when its parent dies (``PR_SET_PDEATHSIG``, kept across exec), then runs the module. A
#: test session killed without teardown (SIGKILL, ``timeout``) must not leave a controller
#: running: two controllers on one cluster fight over every Workload. Linux signals on the exit
#: of the *thread* that started the child: start processes from a long-lived thread (the main
#: thread, not a short-lived worker).
_GUARD = (
    "import ctypes, os, runpy, signal, sys\n"
    "if sys.platform == 'linux':\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        sys.exit('parent gone before start')\n"
    "module = sys.argv[3]\n"
    "sys.argv = [module, *sys.argv[4:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


#: Run as ``python -c _EXEC_GUARD PARENT_PID ARGV...``: the same parent-death signal, then
#: exec of ARGV (the signal is kept across exec). A ``docker run`` client passes the SIGTERM on
#: to its container, which then stops and is removed (``--rm``).
_EXEC_GUARD = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform == 'linux':\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        sys.exit('parent gone before start')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _python_module(module: str, *args: str) -> list[str]:
    """argv running ``python -m module args`` that ends when this process ends."""
    return [sys.executable, "-c", _GUARD, str(os.getpid()), "-m", module, *args]


def _python_env() -> dict[str, str]:
    """The child runs this checkout's gangcheck, whatever the current directory."""
    env = dict(os.environ)
    root = str(repo_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def deploy_gangcheck(
    kubeconfig: Path,
    *,
    workdir: Path,
    name: str = "gangcheck",
    extra_args: Sequence[str] = (),
    components: Sequence[str] = ("reclaim-delete-node",),
    kubectl: Path | None = None,
    image: str | None = None,
    without_mounts: Sequence[str] = (),
) -> ManagedProcess:
    """Apply the RBAC (and CRD) of ``manifests/base`` + ``components``, mint a ServiceAccount
    token, and run the controller with it until ``/readyz`` answers 200: as a process, or
    given ``image``, as the container of the base's Deployment (:func:`run_controller_container`),
    less its volume mounts at the paths ``without_mounts``.

    ``extra_args`` go to ``gangcheck run`` (e.g. ``--workers 2``, ``--leader-elect``). Raises
    :class:`~gangcheck_dev.testbed.process.ComponentError` (with the log's tail) if the process
    exits or is not ready within 60 s, :class:`DeployError` if a kubectl step fails.
    """
    kubeconfig = Path(kubeconfig)
    workdir.mkdir(parents=True, exist_ok=True)
    kubectl = kubectl or find_kubectl()
    rendered = kustomize_objects(kubectl, workdir / name, components)
    objects = [o for o in rendered if _applied(o)]
    # The namespace and CRD first: the namespaced objects and the config informer need them.
    first = [o for o in objects if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    _apply(kubectl, kubeconfig, first)
    _kubectl(
        kubectl,
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/atomicprovisioningconfigs.gangcheck.io",
    )
    _apply(kubectl, kubeconfig, [o for o in objects if o not in first])
    if image is not None:
        (deployment,) = [o for o in rendered if o.get("kind") == "Deployment"]
        return run_controller_container(
            kubeconfig,
            deployment=deployment,
            image=image,
            workdir=workdir,
            name=name,
            extra_args=extra_args,
            kubectl=kubectl,
            without_mounts=without_mounts,
        )
    return _run_as(
        kubectl,
        kubeconfig,
        SERVICE_ACCOUNT,
        workdir=workdir,
        name=name,
        # one identity, as a pod's name: started again after a kill it holds the Lease at once
        args=(f"--identity={name}-0", *extra_args),
    )


DISPATCHER_ACCOUNT = "gangcheck-dispatcher"


def deploy_dispatcher(
    manager: Path,
    workers: Sequence[Path],
    *,
    workdir: Path,
    name: str = "gangcheck-dispatcher",
    extra_args: Sequence[str] = (),
    kubectl: Path | None = None,
) -> ManagedProcess:
    """gangcheck's MultiKueue dispatcher as a user deploys it: the manager's RBAC of
    ``manifests/dispatcher/rbac.yaml`` (its ServiceAccount, ClusterRole, the Role on Kueue's
    Secrets), in each worker ``manifests/dispatcher/worker/reader.yaml`` (read-only rights
    for the identity MultiKueue's Secret holds), then ``gangcheck run --role dispatcher``
    with the ServiceAccount's token until ``/readyz`` answers 200 (its first pass done).
    Writes refused by the API server fail :meth:`ManagedProcess.stop`."""
    workdir.mkdir(parents=True, exist_ok=True)
    kubectl = kubectl or find_kubectl()
    folder = repo_root() / "manifests" / "dispatcher"
    objects = [o for o in yaml.safe_load_all((folder / "rbac.yaml").read_text()) if o]
    _apply(kubectl, manager, [o for o in objects if o["kind"] == "Namespace"])
    _apply(kubectl, manager, [o for o in objects if o["kind"] != "Namespace"])
    reader = [o for o in yaml.safe_load_all((folder / "worker" / "reader.yaml").read_text()) if o]
    for worker in workers:
        _apply(kubectl, worker, reader)
    return _run_as(
        kubectl,
        manager,
        DISPATCHER_ACCOUNT,
        workdir=workdir,
        name=name,
        args=("--role=dispatcher", *extra_args),
    )


def _run_as(
    kubectl: Path, admin: Path, account: str, *, workdir: Path, name: str, args: Sequence[str]
) -> ManagedProcess:
    """``gangcheck run *args`` with a token of `account` (in gangcheck's namespace, where it
    holds its Lease), health and metrics on free ports, until ``/readyz`` answers 200. Writes
    the API server refused fail :meth:`ManagedProcess.stop`."""
    token = _service_account_token(kubectl, admin, NAMESPACE, account)
    token_config = _token_kubeconfig(kubectl, admin, token, workdir / f"{name}.kubeconfig")
    health, metrics = free_ports(2)
    argv = _python_module(
        "gangcheck",
        "run",
        f"--kubeconfig={token_config}",
        f"--health-port={health}",
        f"--metrics-port={metrics}",
        "--bind-address=127.0.0.1",
        f"--lease-namespace={NAMESPACE}",
        *args,
    )
    log_path = workdir / f"{name}.log"
    component = Component(
        name=name,
        argv=argv,
        log_path=log_path,
        probe=lambda: http_ok(f"http://127.0.0.1:{health}/readyz"),
        env=_python_env(),
        ready_timeout=_READY_TIMEOUT,
        stop_timeout=_STOP_TIMEOUT,
    )
    _start(component)
    process = ManagedProcess(name, component, log_path, token_config, health, metrics)
    process.refusals_checked = True
    return process


def restart(process: ManagedProcess) -> None:
    """Starts a stopped process again, as it was started; returns once it is ready."""
    _start(process.component)


def _service_account_token(kubectl: Path, admin: Path, namespace: str, account: str) -> str:
    """A token of the ServiceAccount from the TokenRequest API, valid for a day."""
    return _kubectl(
        kubectl,
        admin,
        "create",
        "token",
        account,
        f"--namespace={namespace}",
        f"--duration={_TOKEN_SECONDS}s",
    ).strip()


def run_controller_container(
    kubeconfig: Path,
    *,
    deployment: Mapping[str, Any],
    image: str,
    workdir: Path,
    name: str = "gangcheck",
    extra_args: Sequence[str] = (),
    kubectl: Path | None = None,
    without_mounts: Sequence[str] = (),
) -> ManagedProcess:
    """Run the ``controller`` container of ``deployment`` (already applied RBAC: its
    ServiceAccount exists) from ``image`` with docker, as its pod would run, until ``/readyz``
    answers 200 (see :mod:`gangcheck_dev.testbed.container` for what differs from a kubelet);
    its volume mounts at the paths ``without_mounts`` are left out (e.g. ``/tmp``).

    The container gets a kubeconfig with a token of the Deployment's ServiceAccount, and free
    ports on 127.0.0.1 for health, metrics and the webhook; ``extra_args`` follow.
    """
    kubeconfig = Path(kubeconfig)
    kubectl = kubectl or find_kubectl()
    if without_mounts:
        deployment = _without_mounts(deployment, without_mounts)
    meta, pod_spec = deployment["metadata"], deployment["spec"]["template"]["spec"]
    namespace = meta.get("namespace") or NAMESPACE
    token = _service_account_token(kubectl, kubeconfig, namespace, pod_spec["serviceAccountName"])
    token_config = _token_kubeconfig(
        kubectl, kubeconfig, token, workdir / f"{name}.container.kubeconfig", embed_ca=True
    )
    readable_by(token_config, int((pod_spec.get("securityContext") or {}).get("runAsUser", 0)))
    health, metrics, webhook = free_ports(3)
    container_name = f"{name}-{os.getpid()}-{health}"
    docker_argv = docker_run_argv(
        deployment,
        image=image,
        container_name=container_name,
        pod=PodIdentity(name=container_name, namespace=namespace),
        kubeconfig=token_config,
        workdir=workdir,
        extra_args=[
            f"--health-port={health}",
            f"--metrics-port={metrics}",
            "--bind-address=127.0.0.1",
            *([f"--webhook-port={webhook}"] if _serves_webhook(deployment) else []),
            *extra_args,
        ],
    )
    log_path = workdir / f"{name}.container.log"
    component = Component(
        name=f"{name} (container)",
        argv=[sys.executable, "-c", _EXEC_GUARD, str(os.getpid()), *docker_argv],
        log_path=log_path,
        probe=lambda: http_ok(f"http://127.0.0.1:{health}/readyz"),
        ready_timeout=_READY_TIMEOUT,
        stop_timeout=_STOP_TIMEOUT,
    )
    try:
        _start(component)
    except ComponentError:
        remove_container(container_name)
        raise
    return ManagedProcess(
        name,
        component,
        log_path,
        token_config,
        health,
        metrics,
        container=container_name,
        refusals_checked=True,
    )


def _without_mounts(deployment: Mapping[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """A copy of ``deployment`` whose containers mount nothing at ``paths``."""
    changed: dict[str, Any] = copy.deepcopy(dict(deployment))
    for container in changed["spec"]["template"]["spec"]["containers"]:
        mounts = container.get("volumeMounts") or []
        container["volumeMounts"] = [m for m in mounts if m["mountPath"] not in paths]
    return changed


def _serves_webhook(deployment: Mapping[str, Any]) -> bool:
    """Whether the controller container serves the webhook (an env setting or a flag)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    args = container.get("args") or []
    flagged = any(str(a).startswith("--webhook-port") for a in args)
    return flagged or str(env.get("GANGCHECK_WEBHOOK__ENABLED", "")).lower() == "true"


# -- the simulated cloud ----------------------------------------------------------------------


def start_sim_cloud(
    kubeconfig: Path,
    *,
    workdir: Path,
    config_map: str = "gangcheck-system/sim-cloud",
    config: Mapping[str, Any],
    name: str = "sim-cloud",
    kubectl: Path | None = None,
) -> ManagedProcess:
    """Create or update the ConfigMap ``config_map`` (``NS/NAME``; key ``config``) with
    ``config`` (see :mod:`gangcheck_dev.simcloud.model`) and run the simulated cloud on it, with
    the given (admin) kubeconfig, until it has read its config."""
    kubeconfig = Path(kubeconfig)
    workdir.mkdir(parents=True, exist_ok=True)
    kubectl = kubectl or find_kubectl()
    namespace, _, cm_name = config_map.partition("/")
    if not namespace or not cm_name:
        raise ValueError(f"config_map must be NS/NAME, got {config_map!r}")
    namespace_obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm_name, "namespace": namespace},
        "data": {"config": yaml.safe_dump(dict(config), sort_keys=False)},
    }
    _apply(kubectl, kubeconfig, [namespace_obj])
    _apply(kubectl, kubeconfig, [cm])
    log_path = workdir / f"{name}.log"
    start_offset = log_path.stat().st_size if log_path.exists() else 0

    def loaded() -> bool:
        try:
            with log_path.open("rb") as log:
                log.seek(start_offset)
                return _SIM_READY_LINE.encode() in log.read()
        except FileNotFoundError:
            return False

    component = Component(
        name=name,
        argv=_python_module(
            "gangcheck_dev", "sim-cloud", f"--kubeconfig={kubeconfig}", f"--config-map={config_map}"
        ),
        log_path=log_path,
        probe=loaded,
        env=_python_env(),
        ready_timeout=_READY_TIMEOUT,
        stop_timeout=_STOP_TIMEOUT,
    )
    _start(component)
    return ManagedProcess(name, component, log_path, kubeconfig)
