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
import yaml
from gangcheck_dev.testbed import ComponentError, ControlPlane
from gangcheck_dev.testbed.certs import CertificateAuthority
from gangcheck_dev.testbed.crds import crd_files, load_crds, module_dir
from gangcheck_dev.testbed.nodes import (
    MAX_COUNT_ANNOTATION,
    NODE_GROUP_LABEL,
    NodeGroup,
    Taint,
    autoscaler_configmaps,
    load_node_groups,
)
from gangcheck_dev.testbed.process import pid_alive, port_is_free, processes_mentioning
from gangcheck_dev.testbed.rest import RestClient
from gangcheck_dev.testbed.stack import (
    FULL_STACK,
    KUEUE_METRICS_CERT_DIR,
    MetricsCert,
    kueue_conversion_patches,
    kueue_webhook_configurations,
)
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

pytestmark = pytest.mark.integration


def _resources(client: RestClient, group_version: str) -> dict[str, str]:
    """Discovery: resource name -> kind for ``/apis/<group_version>``."""
    listing = client.get(f"/apis/{group_version}")
    return {r["name"]: r["kind"] for r in listing["resources"]}


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


def test_scheduler_plugins_podgroup_served(control_plane: ControlPlane) -> None:
    assert "podgroups.scheduling.x-k8s.io" in control_plane.crds
    assert "elasticquotas.scheduling.x-k8s.io" not in control_plane.crds  # PodGroup only
    resources = _resources(control_plane.client(), "scheduling.x-k8s.io/v1alpha1")
    assert resources == {"podgroups": "PodGroup", "podgroups/status": "PodGroup"}
    listing = control_plane.client().get("/apis/scheduling.x-k8s.io/v1alpha1/podgroups")
    assert listing["kind"] == "PodGroupList"


def test_own_crds_established(control_plane: ControlPlane) -> None:
    ours = {crd["metadata"]["name"] for crd in load_crds(crd_files())}
    assert ours <= set(control_plane.crds)
    assert len(control_plane.crds) >= 13  # 11 Kueue + ProvisioningRequest + PodGroup


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
    assert processes_mentioning(str(root)) == []
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
    assert processes_mentioning(str(root)) == []


def _dev(verb: str, state: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """The dev stack's command line (`up`, `down`) on `state`, as a user runs it: its own
    process, its output kept for the assertions."""
    return subprocess.run(
        [sys.executable, "-m", "gangcheck_dev.testbed", verb, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dev_up_and_down(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    up = _dev("up", state, timeout=110)
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

    down = _dev("down", state, timeout=90)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    assert not state.exists()
    assert port_is_free(info["ports"]["apiserver"])


@pytest.mark.timeout(300)
def test_full_stack_stop_leaves_nothing_behind(full_stack_binaries: dict[str, Path]) -> None:
    cert_was_there = KUEUE_METRICS_CERT_DIR.exists()
    flexvolume_default = Path("/usr/libexec/kubernetes")
    flexvolume_was_there = flexvolume_default.exists()
    plane = ControlPlane(
        binaries=full_stack_binaries,
        components=FULL_STACK,
        node_groups=[NodeGroup("teardown", max=1)],
    )
    plane.start()
    root, core = plane.root, plane.ports
    ports = [core.etcd_client, core.etcd_peer, core.apiserver]
    ports += [port for by_use in plane.addon_ports().values() for port in by_use.values()]
    pids = [c.pid for c in plane.components.values()]
    names = list(plane.components)
    assert names == [
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
        "kwok",
        "kueue",
        "cluster-autoscaler",
    ]
    assert set(names) <= set(plane.timings)
    assert all(pid is not None and pid_alive(pid) for pid in pids)
    assert len(ports) == 3 + 1 + 1 + 1 + 3 + 1
    assert not any(port_is_free(port) for port in ports)
    assert (KUEUE_METRICS_CERT_DIR / "tls.crt").is_file()

    plane.stop()

    assert not any(pid is not None and pid_alive(pid) for pid in pids)
    assert all(port_is_free(port) for port in ports)
    assert not root.exists()
    assert processes_mentioning(str(root)) == []
    if not cert_was_there and MetricsCert().present:
        # Another stack on this machine (a concurrent test run) may still hold it.
        owners = json.loads((KUEUE_METRICS_CERT_DIR / MetricsCert.OWNERS).read_text())
        assert str(root) not in owners["owners"]
    assert flexvolume_default.exists() == flexvolume_was_there
    plane.stop()  # idempotent


def test_failing_optional_component_is_named_with_its_log(
    full_stack_binaries: dict[str, Path],
) -> None:
    plane = ControlPlane(
        binaries=full_stack_binaries,
        install_crds=False,
        components=["kwok"],
        component_args={"kwok": ["--no-such-flag"]},
    )
    with pytest.raises(ComponentError) as failure:
        plane.start()
    assert failure.value.component == "kwok"
    assert "exited with code" in str(failure.value)
    assert "unknown flag: --no-such-flag" in failure.value.tail
    root = failure.value.log_path.parent.parent
    assert not root.exists()
    assert processes_mentioning(str(root)) == []


def test_unknown_component_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown component 'kubelet'"):
        ControlPlane(components=["kubelet"])
    with pytest.raises(ValueError, match="kueue, cluster-autoscaler need the CRDs"):
        ControlPlane(components=["autoscaler", "kueue"], install_crds=False)


def test_node_groups_become_kwok_provider_configmaps() -> None:
    groups = load_node_groups(
        yaml.safe_load(
            """
            nodeGroups:
            - {name: gpu, max: 4, gpus: 8, cpu: "96", memory: 1Ti,
               labels: {gangcheck.io/gpu-type: h100},
               taints: ["nvidia.com/gpu=present:NoSchedule"]}
            - {name: cpu, max: 2}
            """
        )
    )
    assert groups[0].taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    config_map, templates_map = autoscaler_configmaps(groups)
    config = yaml.safe_load(config_map["data"]["config"])
    assert config["readNodesFrom"] == "configmap"
    assert config["nodegroups"] == {"fromNodeLabelKey": NODE_GROUP_LABEL}
    assert config["nodes"] == {"skipTaint": True}
    assert config["configmap"]["name"] == templates_map["metadata"]["name"]
    templates = yaml.safe_load(templates_map["data"]["templates"])
    assert templates["kind"] == "List"
    gpu = templates["items"][0]
    assert gpu["metadata"]["annotations"][MAX_COUNT_ANNOTATION] == "4"
    assert gpu["metadata"]["labels"][NODE_GROUP_LABEL] == "gpu"
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    cpu = templates["items"][1]
    assert cpu["metadata"]["annotations"] is not None  # the provider panics on a nil map
    assert "nvidia.com/gpu" not in cpu["status"]["allocatable"]
    with pytest.raises(ValueError, match="min <= max"):
        NodeGroup("bad", max=1, min=2)
    with pytest.raises(ValueError, match="unique"):
        autoscaler_configmaps([NodeGroup("a", max=1), NodeGroup("a", max=2)])


def test_kueue_webhooks_are_registered_by_url() -> None:
    module = module_dir("sigs.k8s.io/kueue", wrapper="kueue")
    ca = CertificateAuthority.create().cert_pem
    configs = kueue_webhook_configurations(module, 9443, ca)
    assert {c["metadata"]["name"] for c in configs} == {
        "kueue-mutating-webhook-configuration",
        "kueue-validating-webhook-configuration",
    }
    hooks = [hook for config in configs for hook in config["webhooks"]]
    assert len(hooks) >= 40
    for hook in hooks:
        assert set(hook["clientConfig"]) == {"url", "caBundle"}
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
    by_name = {hook["name"]: hook for hook in hooks}
    assert by_name["mjob.kb.io"]["clientConfig"]["url"].endswith("/mutate-batch-v1-job")
    excluded = by_name["vpod.kb.io"]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert "kube-system" in excluded  # the kustomization's patch is applied
    conversions = kueue_conversion_patches(module, 9443, ca)
    assert "workloads.kueue.x-k8s.io" in conversions
    url = conversions["workloads.kueue.x-k8s.io"]["webhook"]["clientConfig"]["url"]
    assert url == "https://127.0.0.1:9443/convert"


def test_kueue_metrics_cert_is_shared_and_removed_by_the_last_owner(tmp_path: Path) -> None:
    folder = tmp_path / "etc" / "kueue" / "metrics" / "certs"
    cert = MetricsCert(folder)
    pair = CertificateAuthority.create().issue_serving("x", ["127.0.0.1"])
    first, second = tmp_path / "plane-1", tmp_path / "plane-2"
    first.mkdir()
    second.mkdir()
    cert.acquire(first, pair)
    cert.acquire(second, pair)
    assert cert.present
    cert.release(first)
    assert cert.present
    cert.release(second)
    assert not (tmp_path / "etc").exists()  # every folder it created is gone again

    folder.mkdir(parents=True)
    pair.write(folder / "tls.crt", folder / "tls.key")
    cert.acquire(first, pair)  # provided by someone else: used, never removed
    cert.release(first)
    assert cert.present

    stale = tmp_path / "plane-gone"
    other = MetricsCert(tmp_path / "other" / "certs")
    stale.mkdir()
    other.acquire(stale, pair)
    stale.rmdir()  # a killed stack: its folder is gone
    other.acquire(first, pair)
    other.release(first)
    assert not (tmp_path / "other").exists()
