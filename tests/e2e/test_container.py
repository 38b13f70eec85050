"""gangcheck end to end as its image runs it: the controller is the container of the Deployment
in ``manifests/base`` (plus the ``reclaim-delete-node`` component), run by docker as a kubelet
would run it: uid 65532, read-only root filesystem, every capability dropped, no privilege
escalation, the memory and CPU limits, and only its ServiceAccount's token (a kubeconfig,
mounted). The Deployment's ``/tmp`` emptyDir is left out: with ``--kubeconfig`` the image
writes nothing, not even the kubeconfig's CA to a temporary file (issue 29, item 5). The
host's network stands in for the pod's.

The image is the one ``hack/image.sh`` builds here on a debootstrapped Debian base (no
registry), from the hashed lock files. First what the image promises on its own (a real
docker, no cluster), then the scenarios of ``test_gangcheck`` (their functions, called as
they are) against the real local stack: a full delivery by the real cluster-autoscaler, and a
partial delivery from the simulated cloud rolled back, retried and admitted.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from gangcheck_dev.testbed.binaries import repo_root
from gangcheck_dev.testbed.container import Image
from gangcheck_dev.testbed.deploy import ManagedProcess, deploy_gangcheck

from gangcheck.kube.client import Kube
from tests.e2e import test_gangcheck as scenarios
from tests.e2e.conftest import Cluster

#: The confinement of manifests/base's Deployment, on the command line.
CONFINED = ["--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges"]
#: Found in the image, these would be test or build tooling.
TOOLING = ("pytest", "hypothesis", "mypy", "ruff", "pip", "setuptools", "wheel")


def docker(*args: str) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"docker {' '.join(args[:3])}: {result.stderr}"
    return result.stdout


def in_image(image: Image, code: str) -> str:
    """Runs Python ``code`` with the image's venv, confined as the Deployment confines it."""
    return docker(
        "run", "--rm", "--network=none", *CONFINED,
        "--entrypoint=/opt/gangcheck/bin/python", image.id, "-c", code,
    )  # fmt: skip


def locked_versions() -> dict[str, str]:
    """name -> version pinned in requirements/image.lock."""
    text = (repo_root() / "requirements" / "image.lock").read_text()
    return {
        m.group(1).lower(): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE)
    }


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- the image on its own ---------------------------------------------------------------------


def test_image_answers_its_version_confined_with_no_network(controller_image: Image) -> None:
    out = docker("run", "--rm", "--network=none", *CONFINED, controller_image.id, "--version")
    assert out.strip() == f"gangcheck {version('gangcheck')}"


def test_image_runs_as_the_nonroot_user_by_default(controller_image: Image) -> None:
    config = json.loads(docker("image", "inspect", controller_image.id))[0]["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["gangcheck"]
    assert in_image(controller_image, "import os; print(os.getuid(), os.getgid())").split() == [
        "65532",
        "65532",
    ]


def test_image_holds_the_locked_versions_and_no_test_or_build_tooling(
    controller_image: Image,
) -> None:
    listing = in_image(
        controller_image,
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
    )
    installed = {canonical(name): got for name, got in json.loads(listing).items()}
    assert installed.pop("gangcheck") == version("gangcheck")
    assert installed == {canonical(name): pin for name, pin in locked_versions().items()}
    assert not set(TOOLING) & set(installed)
    # Nor in the base's own Python (pip is uninstalled where the base has it).
    probe = f"import importlib.util as u; print([m for m in {TOOLING!r} if u.find_spec(m)])"
    found = in_image(
        controller_image,
        "import subprocess, sys;"
        f"subprocess.run([sys._base_executable, '-c', {probe!r}], check=True)",
    )
    assert found.strip() == "[]"


def test_image_can_export_traces_over_otlp_http(controller_image: Image) -> None:
    out = in_image(
        controller_image,
        "from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter;"
        "print(OTLPSpanExporter.__name__)",
    )
    assert out.strip() == "OTLPSpanExporter"


# -- the scenarios, with the controller in its container --------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gangcheck-container")


@pytest.fixture(scope="module")
def controller(
    cluster: Cluster, workdir: Path, controller_image: Image
) -> Iterator[ManagedProcess]:
    """The Deployment's container, from the image, with only its ServiceAccount's token, and
    no writable ``/tmp``."""
    began = time.monotonic()
    process = deploy_gangcheck(
        Path(cluster.kubeconfig),
        workdir=workdir,
        extra_args=["--workers=4"],
        image=controller_image.id,
        without_mounts=["/tmp"],
    )
    cluster.record(f"gangcheck container deployed and ready in {time.monotonic() - began:.1f}s")
    try:
        yield process
    finally:
        alive = process.running
        process.stop()
        assert alive, f"the gangcheck container died during the tests:\n{process.log_tail(40)}"


@pytest.fixture(scope="module")
def sim(cluster: Cluster, workdir: Path) -> Iterator[scenarios.SimCloud]:
    cloud = scenarios.SimCloud(cluster, workdir)
    try:
        yield cloud
    finally:
        if cloud.process is not None:
            cloud.process.stop()


@pytest.mark.timeout(300)
async def test_container_gets_a_gang_provisioned_by_cluster_autoscaler_running(
    kube: Kube, namespace: str, cluster: Cluster, controller: ManagedProcess
) -> None:
    # It started and serves (its fixture waited for /readyz) on a read-only root with
    # --kubeconfig and nothing writable at /tmp (issue 29, item 5): none is mounted there,
    # and a file cannot be made there.
    assert controller.container is not None
    (inspected,) = json.loads(docker("container", "inspect", controller.container))
    assert inspected["HostConfig"]["ReadonlyRootfs"] is True
    assert "/tmp" not in (inspected["HostConfig"].get("Tmpfs") or {})
    assert "/tmp" not in [m["Destination"] for m in inspected["Mounts"]]
    assert "--kubeconfig" in " ".join(inspected["Args"])
    probe = await asyncio.to_thread(
        subprocess.run,
        ["docker", "exec", controller.container, "/opt/gangcheck/bin/python", "-c",
         "import tempfile; tempfile.mkstemp(dir='/tmp')"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe.stderr
    await scenarios.test_gang_provisioned_by_cluster_autoscaler_runs_on_new_nodes(
        kube, namespace, cluster, controller
    )


@pytest.mark.soak  # the container's second scenario (docs/testing.md)
@pytest.mark.timeout(240)
async def test_container_rolls_back_a_partial_delivery_retries_and_admits(
    kube: Kube,
    namespace: str,
    cluster: Cluster,
    controller: ManagedProcess,
    sim: scenarios.SimCloud,
) -> None:
    await scenarios.test_partial_delivery_is_rolled_back_retried_and_admitted(
        kube, namespace, cluster, controller, sim
    )
