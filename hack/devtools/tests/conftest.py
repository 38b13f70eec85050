"""The dev tooling's own tests (gangcheck-dev: the test bed, the simulated cloud, the demo, the
kind script and the make targets around them), run by `make test` beside tests/.

The tests on a real control plane use the integration suite's fixtures, as they are: the
binaries built before the first test (never skipped), and a control plane of this folder's
own (its test of an API server restart does not share one with gangcheck's tests).
"""

from __future__ import annotations

from tests.integration.conftest import (
    control_plane,
    kube,
    pytest_collection_modifyitems,
    testbed_binaries,
)

__all__ = ["control_plane", "kube", "pytest_collection_modifyitems", "testbed_binaries"]
