"""The chart's ``resources`` value, with the real helm: requests and limits of cpu, memory and
ephemeral-storage as Kubernetes quantities render into the container; anything else is refused
by ``values.schema.json`` at template time, naming the value."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.testbed.binaries import ensure_binaries, repo_root

CHART = repo_root() / "manifests" / "helm" / "gangcheck"


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_binaries(("helm",))["helm"] / "helm"


def _template(helm: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), "template", "gangcheck", str(CHART), *(f"--set={s}" for s in sets)],
        capture_output=True,
        text=True,
        check=False,
    )


def _container(rendered: str) -> dict[str, Any]:
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param(["resources.limits.cpu=lots"], id="a cpu that is no quantity"),
        pytest.param(["resources.limits.memory=-1Gi"], id="a negative memory"),
        pytest.param(["resources.requests.memory=1GB"], id="a unit Kubernetes does not know"),
        pytest.param(["resources.requests.gpu=1"], id="a resource that is not cpu or memory"),
        pytest.param(["resources.cpu=1"], id="cpu outside requests and limits"),
        pytest.param(["resources.limits=4"], id="limits that are no mapping"),
    ],
)
def test_resources_that_are_no_requests_or_limits_are_refused(helm: Path, sets: list[str]) -> None:
    result = _template(helm, *sets)
    assert result.returncode != 0, f"rendered although {sets}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert "resources" in result.stderr, result.stderr


def test_quantities_render_into_the_container(helm: Path) -> None:
    sets = ["resources.requests.cpu=250m", "resources.limits.memory=2Gi", "resources.limits.cpu=2"]
    result = _template(helm, *sets)
    assert result.returncode == 0, result.stderr
    resources = _container(result.stdout)["resources"]
    assert resources["requests"]["cpu"] == "250m"
    assert resources["limits"]["memory"] == "2Gi"
    assert str(resources["limits"]["cpu"]) == "2"
