"""The dev tooling's own tests (gangcheck-dev: the test bed, the simulated cloud, the demo, the
kind script and the make targets around them), run by `make test` beside tests/.

The tests on a real control plane use the integration suite's fixtures, as they are: the
binaries built before the first test (never skipped), and a control plane of this folder's
own (its test of an API server restart does not share one with gangcheck's tests). The soak
split is tests/conftest.py's (docs/testing.md), here too when this folder runs alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gangcheck_dev.testbed.binaries import ALL_FAMILIES, CONTROL_PLANE, KARPENTER

from tests import conftest as soak
from tests.integration import conftest as integration
from tests.integration.conftest import control_plane, kube, testbed_binaries

__all__ = ["control_plane", "kube", "testbed_binaries"]
#: This folder's own binaries, by fixture: every family of the stack, and the control plane
#: with kwok and Karpenter (the stack with Karpenter, cluster-autoscaler's families not built).
_KARPENTER_STACK = (*CONTROL_PLANE, "kwok", *KARPENTER)
_BINARY_FIXTURES = {"full_stack_binaries": ALL_FAMILIES, "karpenter_binaries": _KARPENTER_STACK}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak split first (it deselects nothing twice), then the binaries built for the
    tests kept."""
    soak.pytest_collection_modifyitems(config, items)
    integration.pytest_collection_modifyitems(config, items)
    integration.build_binaries(config, items, _BINARY_FIXTURES)


@pytest.fixture(scope="session")
def full_stack_binaries(pytestconfig: pytest.Config) -> dict[str, Path]:
    """Folders of every binary family of the stack (etcd, kubernetes, kwok, kueue, both
    autoscalers)."""
    return integration.built(pytestconfig, "full_stack_binaries", ALL_FAMILIES)


@pytest.fixture(scope="session")
def karpenter_binaries(pytestconfig: pytest.Config) -> dict[str, Path]:
    """Folders of the control plane's, kwok's and Karpenter's binaries."""
    return integration.built(pytestconfig, "karpenter_binaries", _KARPENTER_STACK)
