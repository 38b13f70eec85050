"""What the image is built from, checked without building it (pure file reading).

The lock file pins every dependency that pyproject.toml declares (with the ``tracing`` extra the
image installs) at a version inside pyproject's range, with hashes; and a Deployment becomes
the ``docker run`` a kubelet would amount to (``gangcheck_dev.testbed.container``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from gangcheck_dev.testbed.container import KUBECONFIG_IN_CONTAINER, PodIdentity, docker_run_argv
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", re.MULTILINE)


def pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / lock).read_text()
    return {canonicalize_name(name): version for name, version in PIN.findall(text)}


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["tracing"]
    return [Requirement(dep) for dep in deps]


@pytest.mark.parametrize("requirement", declared(), ids=lambda r: f"{r.name} is locked in range")
def test_every_declared_dependency_is_locked_within_its_range(requirement: Requirement) -> None:
    pinned = pins("image.lock").get(canonicalize_name(requirement.name))
    assert pinned is not None, f"{requirement.name} is not in requirements/image.lock"
    assert requirement.specifier.contains(pinned, prereleases=True), (requirement, pinned)


def test_every_declared_range_has_an_upper_bound() -> None:
    unbounded = [str(r) for r in declared() if not any(s.operator == "<" for s in r.specifier)]
    assert unbounded == []


@pytest.mark.parametrize("lock", ["image.lock", "build.lock"])
def test_every_pin_carries_hashes(lock: str) -> None:
    text = (ROOT / "requirements" / lock).read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 6)[-1])
    unhashed = [b.split()[0] for b in blocks if "==" in b and "--hash=sha256:" not in b]
    assert pins(lock) and unhashed == []


def base_deployment() -> dict[str, object]:
    return dict(yaml.safe_load((ROOT / "manifests" / "base" / "deployment.yaml").read_text()))


def run_argv(tmp_path: Path) -> list[str]:
    return docker_run_argv(
        base_deployment(),
        image="sha256:abc",
        container_name="gc-1",
        pod=PodIdentity(name="gc-1", namespace="gangcheck-system"),
        kubeconfig=tmp_path / "kubeconfig",
        workdir=tmp_path,
        extra_args=["--health-port=18081"],
    )


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param("--user=65532:65532", id="runs as the pod's user and group"),
        pytest.param("--read-only", id="has a read-only root filesystem"),
        pytest.param("--cap-drop=ALL", id="drops every capability"),
        pytest.param("--security-opt=no-new-privileges", id="cannot escalate privileges"),
        pytest.param("--tmpfs=/tmp:rw,nosuid,nodev,mode=1777,size=16777216", id="has tmp"),
        pytest.param("--memory=1073741824", id="has the memory limit"),
        pytest.param("--cpus=1", id="has the cpu limit"),
        pytest.param("--network=host", id="uses the hosts network"),
        pytest.param("--env=POD_NAMESPACE=gangcheck-system", id="knows its namespace"),
        pytest.param("--lease-namespace=gangcheck-system", id="expands the args variables"),
        pytest.param("--identity=gc-1", id="leads under its pod name"),
        pytest.param(f"--kubeconfig={KUBECONFIG_IN_CONTAINER}", id="uses the mounted token"),
    ],
)
def test_the_base_deployment_runs_confined_as_its_pod(tmp_path: Path, expected: str) -> None:
    assert expected in run_argv(tmp_path)


def test_the_container_gets_no_in_cluster_flag_and_the_extra_args_last(tmp_path: Path) -> None:
    argv = run_argv(tmp_path)
    assert "--in-cluster" not in argv
    assert argv[-1] == "--health-port=18081"
    assert argv[argv.index("sha256:abc") + 1] == "run"


def test_an_optional_secret_that_is_absent_mounts_as_an_empty_read_only_folder(
    tmp_path: Path,
) -> None:
    mount = f"--volume={tmp_path / 'gc-1-empty'}:/tmp/k8s-webhook-server/serving-certs:ro"
    assert mount in run_argv(tmp_path)


def test_the_dockerfiles_default_base_is_pinned_by_digest() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", default)
