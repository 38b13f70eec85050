"""kind/e2e.sh without a cluster: which e2e tests it runs against the gangcheck it deploys, and
what it installs from where (its deploy steps run in tests/e2e/test_kind_deploy.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = (REPO / "kind" / "e2e.sh").read_text()


def _e2e_tests() -> list[str]:
    listed = subprocess.run(
        ["bash", "-c", f"{_assignment('E2E_TESTS')}\nprintf '%s\\n' \"${{E2E_TESTS[@]}}\""],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return listed.split()


def _assignment(name: str) -> str:
    found = re.search(rf"^{name}=\(.*?\)$", SCRIPT, re.MULTILINE | re.DOTALL)
    assert found, f"{name} not assigned in kind/e2e.sh"
    return found.group(0)


def test_it_runs_the_e2e_tests_that_suit_an_in_cluster_controller() -> None:
    tests = _e2e_tests()
    assert tests and all((REPO / test).is_file() for test in tests)
    assert "tests/e2e/test_gangcheck.py" in tests and "tests/e2e/test_podgroups.py" in tests
    unsuited = {"test_container.py", "test_helm.py", "test_bench.py", "test_kind_deploy.py"}
    assert not {Path(test).name for test in tests} & unsuited
    assert not any("karpenter" in test for test in tests)


def test_the_suite_is_pointed_at_the_deployed_gangcheck() -> None:
    assert "GANGCHECK_E2E_DEPLOYED=1 GANGCHECK_E2E_KUBECONFIG=$kubeconfig" in SCRIPT
    assert '-m pytest "${E2E_TESTS[@]}"' in SCRIPT


def test_kwok_stages_are_the_test_beds_and_downloads_are_none() -> None:
    assert "stage-fast" not in SCRIPT and "pod-complete.yaml" not in SCRIPT
    assert "kind/manifests.py kwok-stages" in SCRIPT
    assert "releases/download" not in SCRIPT  # everything from the pinned Go modules


def test_the_deploy_step_needs_a_kubeconfig() -> None:
    result = subprocess.run(
        ["bash", str(REPO / "kind" / "e2e.sh"), "deploy"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "deploy: set KUBECONFIG" in result.stderr
