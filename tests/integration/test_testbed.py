"""The local control plane is real: versions, APIs, RBAC, restarts and a clean teardown."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from gangcheck.testbed import ComponentError, ControlPlane
from gangcheck.testbed.crds import crd_files, load_crds
from gangcheck.testbed.process import pid_alive, pid_cmdline, port_is_free
from gangcheck.testbed.rest import RestClient

pytestmark = pytest.mark.integration


def _resources(client: RestClient, group_version: str) -> dict[str, str]:
    """Discovery: resource name -> kind for ``/apis/<group_version>``."""
    listing = client.get(f"/apis/{group_version}")
    return {r["name"]: r["kind"] for r in listing["resources"]}


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (e.g. a control plane's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        pid = int(entry.name) if entry.name.isdigit() else 0
        if pid and pid_alive(pid) and any(text in arg for arg in pid_cmdline(pid)):
            found.append(pid)
    return found


def test_apiserver_is_v1_37_2(control_plane: ControlPlane) -> None:
    version = control_plane.client().get("/version")
    assert version["gitVersion"] == "v1.37.2"
    kubectl = json.loads(control_plane.run_kubectl("version", "-o", "json").stdout)
    assert kubectl["clientVersion"]["gitVersion"] == "v1.37.2"
    assert kubectl["serverVersion"]["gitVersion"] == "v1.37.2"


def test_kueue_workload_served_at_v1beta2(control_plane: ControlPlane) -> None:
    admin = control_plane.client()
    assert _resources(admin, "kueue.x-k8s.io/v1beta2")["workloads"] == "Workload"
    listing = admin.get("/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads")
    assert listing["kind"] == "WorkloadList"
    assert "admissionchecks" in _resources(admin, "kueue.x-k8s.io/v1beta2")


def test_provisioning_request_served_at_v1(control_plane: ControlPlane) -> None:
    resources = _resources(control_plane.client(), "autoscaling.x-k8s.io/v1")
    assert resources["provisioningrequests"] == "ProvisioningRequest"


def test_scheduling_v1beta1_workload_and_podgroup_served(control_plane: ControlPlane) -> None:
    resources = _resources(control_plane.client(), "scheduling.k8s.io/v1beta1")
    assert resources["workloads"] == "Workload"
    assert resources["podgroups"] == "PodGroup"


def test_own_crds_established(control_plane: ControlPlane) -> None:
    ours = {crd["metadata"]["name"] for crd in load_crds(crd_files())}
    assert ours <= set(control_plane.crds)
    assert len(control_plane.crds) >= 12  # 11 Kueue + ProvisioningRequest


def test_rbac_is_enforced(control_plane: ControlPlane) -> None:
    pods = "/api/v1/namespaces/default/pods"
    nobody = control_plane.client(control_plane.issue_client_cert("nobody"))
    denied = nobody.request("GET", pods)
    assert denied.status == 403, denied.body
    assert denied.json()["reason"] == "Forbidden"
    assert control_plane.client().request("GET", pods).status == 200
    answer = control_plane.run_kubectl("auth", "can-i", "list", "pods", "--as=nobody", check=False)
    assert answer.stdout.strip() == "no"


def test_default_namespace_accepts_pods(control_plane: ControlPlane) -> None:
    name = f"probe-{uuid.uuid4().hex[:8]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    admin = control_plane.client()
    created = admin.request("POST", "/api/v1/namespaces/default/pods", json.dumps(pod).encode())
    assert created.status == 201, created.body
    assert admin.request("DELETE", f"/api/v1/namespaces/default/pods/{name}").status == 200


async def test_kubeconfig_works_with_kubernetes_asyncio(control_plane: ControlPlane) -> None:
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    async with k8s.ApiClient(configuration) as api:
        version = await k8s.VersionApi(api).get_code()
        namespaces = await k8s.CoreV1Api(api).list_namespace()
    assert version.git_version == "v1.37.2"
    assert "default" in {ns.metadata.name for ns in namespaces.items}


def test_serving_cert_for_webhooks_verifies_against_the_ca(control_plane: ControlPlane) -> None:
    pair = control_plane.issue_serving_cert("127.0.0.1")
    folder = control_plane.root / f"webhook-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    pair.write(folder / "tls.crt", folder / "tls.key")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    client_context = ssl.create_default_context(cafile=str(control_plane.pki.ca_cert))
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve_one() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as tls:
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve_one)
        thread.start()
        port = listener.getsockname()[1]
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client_context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(5)


def test_restart_apiserver_keeps_data(control_plane: ControlPlane) -> None:
    admin = control_plane.client()
    name = f"survivor-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}
    created = admin.create("/api/v1/namespaces/default/configmaps", body).json()
    server, pid = control_plane.server, control_plane.components["kube-apiserver"].pid

    control_plane.restart_apiserver()

    assert control_plane.server == server
    assert control_plane.components["kube-apiserver"].pid != pid
    assert pid is not None
    assert not pid_alive(pid)
    again = admin.get(f"/api/v1/namespaces/default/configmaps/{name}")
    assert again["metadata"]["uid"] == created["metadata"]["uid"]
    assert again["data"] == {"k": "v"}


def test_stop_leaves_nothing_behind(testbed_binaries: dict[str, Path]) -> None:
    plane = ControlPlane(binaries=testbed_binaries, install_crds=False)
    plane.start()
    root, ports = plane.root, plane.ports
    pids = [c.pid for c in plane.components.values()]
    assert len(pids) == 2
    assert all(pid is not None and pid_alive(pid) for pid in pids)
    assert not port_is_free(ports.apiserver)

    plane.stop()

    assert not any(pid is not None and pid_alive(pid) for pid in pids)
    assert all(port_is_free(p) for p in (ports.etcd_client, ports.etcd_peer, ports.apiserver))
    assert not root.exists()
    assert _processes_mentioning(str(root)) == []
    plane.stop()  # idempotent


def test_failed_start_names_the_component_and_cleans_up(
    testbed_binaries: dict[str, Path],
) -> None:
    plane = ControlPlane(
        binaries=testbed_binaries, install_crds=False, apiserver_args=["--no-such-flag"]
    )
    with pytest.raises(ComponentError) as failure:
        plane.start()
    assert failure.value.component == "kube-apiserver"
    assert "unknown flag: --no-such-flag" in str(failure.value)
    root = failure.value.log_path.parent.parent
    assert not root.exists()
    assert _processes_mentioning(str(root)) == []


def test_dev_up_and_down(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    command = [sys.executable, "-m", "gangcheck.testbed"]
    up = subprocess.run(
        [*command, "up", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    info = json.loads((state / "state.json").read_text())
    assert f"export KUBECONFIG={info['kubeconfig']}" in up.stdout
    supervisor = info["pid"]
    pids = [supervisor, *(c["pid"] for c in info["components"].values())]
    assert all(pid_alive(pid) for pid in pids)
    assert Path(f"/proc/{supervisor}/stat").read_text().split()[3] != str(os.getpid())
    namespaces = subprocess.run(
        [info["kubectl"], f"--kubeconfig={info['kubeconfig']}", "get", "ns", "default"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert namespaces.returncode == 0, namespaces.stderr

    down = subprocess.run(
        [*command, "down", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    assert not state.exists()
    assert port_is_free(info["ports"]["apiserver"])
