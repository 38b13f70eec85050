"""The dev tooling's own tests (gangcheck-dev: the test bed, the simulated cloud, the demo, the
kind script and the make targets around them), run by `make test` beside tests/.

The tests on a real control plane use the integration suite's fixtures, as they are: the
binaries built before the first test (never skipped), and a control plane of this folder's
own (its test of an API server restart does not share one with gangcheck's tests). The soak
split is tests/conftest.py's (docs/testing.md), here too when this folder runs alone.
"""

from __future__ import annotations

import pytest

from tests import conftest as soak
from tests.integration import conftest as integration
from tests.integration.conftest import control_plane, kube, testbed_binaries

__all__ = ["control_plane", "kube", "testbed_binaries"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak split first (it deselects nothing twice), then the binaries built for the
    tests kept."""
    soak.pytest_collection_modifyitems(config, items)
    integration.pytest_collection_modifyitems(config, items)
