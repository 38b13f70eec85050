"""kind/e2e.sh's deploy steps (everything after the kind cluster and the image) run here, on a
local control plane, as they would on kind: ``kind/e2e.sh deploy`` with the KUBECONFIG of a
stack that has a scheduler, a controller manager, kwok and one kwok node, and none of the CRDs.
There is no kubelet here: kwok plays the pods of every Deployment the steps install (Running,
Ready), so each rollout the script waits for completes as it does on kind, and what was applied
is checked: the test bed's CRDs (the ProvisioningRequest's among them), kwok with the test bed's
Stages (pods keep running: no pod-complete), cluster-autoscaler with the e2e node groups,
gangcheck with its webhook's certificate, and Kueue, in the test bed's versions.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.testbed import ControlPlane, kwok_node
from gangcheck_dev.testbed.stack import KWOK_STAGES

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENTS = {
    "kube-system": ["kwok-controller", "cluster-autoscaler"],
    "gangcheck-system": ["gangcheck"],
    "kueue-system": ["kueue-controller-manager"],
}


@pytest.fixture(scope="module")
def bare_stack() -> Iterator[ControlPlane]:
    """Scheduler, controller manager and kwok; no CRD installed; one node for the pods."""
    plane = ControlPlane(components=["scheduler", "controller-manager", "kwok"], install_crds=False)
    plane.start()
    try:
        plane.client().create("/api/v1/nodes", kwok_node("kind-worker", cpu="64", memory="256Gi"))
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def deployed(bare_stack: ControlPlane) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(bare_stack.kubectl.parent), str(Path(sys.executable).parent),
                            os.environ.get("PATH", "")])  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(bare_stack.kubeconfig), "PATH": path,
           "PYTHON": sys.executable, "ROLLOUT_TIMEOUT": "120s"}  # fmt: skip
    return subprocess.run(
        ["bash", "kind/e2e.sh", "deploy"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _get(plane: ControlPlane, *args: str) -> Any:
    # JSON, not YAML: every CRD of the bed (Kueue's, Karpenter's, ...) is megabytes, which
    # PyYAML's pure-Python loader took over the test's 60 s to read on a slow machine
    return json.loads(plane.run_kubectl("get", *args, "-o", "json").stdout)


@pytest.mark.timeout(660)
def test_the_deploy_steps_finish(deployed: subprocess.CompletedProcess[str]) -> None:
    assert deployed.returncode == 0, deployed.stdout[-4000:] + deployed.stderr[-4000:]
    assert "kind/e2e.sh: deployed" in deployed.stderr


@pytest.mark.timeout(60)
def test_the_test_beds_crds_are_installed(
    deployed: subprocess.CompletedProcess[str], bare_stack: ControlPlane
) -> None:
    names = {item["metadata"]["name"] for item in _get(bare_stack, "crd")["items"]}
    assert {
        "provisioningrequests.autoscaling.x-k8s.io",
        "workloads.kueue.x-k8s.io",
        "admissionchecks.kueue.x-k8s.io",
        "podgroups.scheduling.x-k8s.io",
        "atomicprovisioningconfigs.gangcheck.io",
        "stages.kwok.x-k8s.io",
    } <= names


@pytest.mark.timeout(60)
def test_kwok_plays_the_test_beds_stages_and_no_pod_complete(
    deployed: subprocess.CompletedProcess[str], bare_stack: ControlPlane
) -> None:
    stages = {item["metadata"]["name"] for item in _get(bare_stack, "stages")["items"]}
    assert stages == {Path(stage).stem for stage in KWOK_STAGES}
    assert "pod-complete" not in stages


@pytest.mark.timeout(60)
def test_every_deployment_is_available_in_the_test_beds_versions(
    deployed: subprocess.CompletedProcess[str], bare_stack: ControlPlane
) -> None:
    images = {}
    for namespace, names in DEPLOYMENTS.items():
        for name in names:
            deployment = _get(bare_stack, "-n", namespace, "deployment", name)
            status = deployment["status"]
            assert status.get("availableReplicas") == deployment["spec"]["replicas"], name
            (container, *_) = deployment["spec"]["template"]["spec"]["containers"]
            images[name] = container["image"]
    assert images["kueue-controller-manager"] == "registry.k8s.io/kueue/kueue:v0.17.0"
    assert images["kwok-controller"] == "registry.k8s.io/kwok/kwok:v0.8.0"
    assert images["gangcheck"] == "gangcheck:e2e"
    assert images["cluster-autoscaler"].startswith(
        "registry.k8s.io/autoscaling/cluster-autoscaler:"
    )


@pytest.mark.timeout(60)
def test_the_autoscaler_has_the_e2e_node_groups(
    deployed: subprocess.CompletedProcess[str], bare_stack: ControlPlane
) -> None:
    from tests.e2e.conftest import E2E_NODE_GROUPS

    templates = _get(bare_stack, "-n", "kube-system", "configmap", "kwok-provider-templates")
    text = yaml.safe_dump(templates["data"])
    assert all(group.name in text for group in E2E_NODE_GROUPS)


@pytest.mark.timeout(60)
def test_the_webhook_trusts_the_certificate_gangcheck_serves(
    deployed: subprocess.CompletedProcess[str], bare_stack: ControlPlane
) -> None:
    secret = _get(bare_stack, "-n", "gangcheck-system", "secret", "gangcheck-webhook-cert")
    webhook = _get(bare_stack, "mutatingwebhookconfiguration", "gangcheck")
    (hook,) = webhook["webhooks"]
    served = base64.b64decode(secret["data"]["tls.crt"])
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == served
    assert hook["clientConfig"]["service"]["name"] == "gangcheck-webhook"


@pytest.mark.timeout(60)
def test_kueue_runs_with_workload_slices_on_as_the_test_bed(
    deployed: subprocess.CompletedProcess[str], bare_stack: ControlPlane
) -> None:
    """test_elastic.py needs ElasticJobsViaWorkloadSlices, on in the local test bed too."""
    deployment = _get(bare_stack, "-n", "kueue-system", "deployment", "kueue-controller-manager")
    (manager, *_) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--feature-gates=ElasticJobsViaWorkloadSlices=true" in manager["args"]
