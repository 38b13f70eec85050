"""Integration fixtures: a real control plane (etcd + kube-apiserver v1.37) on loopback.

The binaries are built from the pinned Go modules when missing (a cold build takes tens of
minutes); that happens once, before the first test, outside the per-test timeout, with the
build's progress shown. Tests never skip for lack of binaries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from gangcheck_dev.testbed.binaries import (
    CONTROL_PLANE,
    OTEL_COLLECTOR,
    BuildError,
    ensure_binaries,
)
from gangcheck_dev.testbed.launcher import ControlPlane

from gangcheck.kube.client import Kube
from tests.integration.harness import Cluster, RunningController
from tests.integration.karpenter_bed import claim_crd, node_pool_crd  # noqa: F401 (fixtures)

_BUILD_ERROR = pytest.StashKey[BuildError]()
_BINARY_FIXTURES = {"testbed_binaries": CONTROL_PLANE, "otelcol_binary": OTEL_COLLECTOR}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.collectonly:
        return
    used = {name for item in items for name in getattr(item, "fixturenames", ())}
    families = [f for name, fs in _BINARY_FIXTURES.items() if name in used for f in fs]
    if not families:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            ensure_binaries(families)
    except BuildError as exc:
        config.stash[_BUILD_ERROR] = exc


@pytest.fixture(scope="session")
def testbed_binaries(pytestconfig: pytest.Config) -> dict[str, Path]:
    """Folders of the built binaries (``etcd``, ``kubernetes``)."""
    failed = pytestconfig.stash.get(_BUILD_ERROR, None)
    if failed is not None:
        raise failed
    return ensure_binaries(CONTROL_PLANE)


@pytest.fixture(scope="session")
def otelcol_binary(pytestconfig: pytest.Config) -> Path:
    """The OpenTelemetry Collector of ``hack/otelcol`` (built before the first test)."""
    failed = pytestconfig.stash.get(_BUILD_ERROR, None)
    if failed is not None:
        raise failed
    return ensure_binaries(OTEL_COLLECTOR)["otelcol"] / "otelcol"


@pytest.fixture(scope="session")
def control_plane(testbed_binaries: dict[str, Path]) -> Iterator[ControlPlane]:
    """One started control plane for the whole session, with every CRD installed."""
    plane = ControlPlane(binaries=testbed_binaries)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Kube]:
    """A client of the session's control plane, as the test's own identity (admin)."""
    async with await Kube.connect(str(control_plane.kubeconfig)) as k:
        yield k


@pytest.fixture
async def controller(control_plane: ControlPlane) -> AsyncIterator[RunningController]:
    """gangcheck's controller, running in the test's event loop with its own connection."""
    running = RunningController(str(control_plane.kubeconfig))
    await running.start()
    yield running
    await running.stop()


@pytest.fixture
async def cluster(kube: Kube) -> AsyncIterator[Cluster]:
    """A namespace of the test's own, and the nodes the test adds, removed at the end."""
    c = await Cluster.create(kube)
    yield c
    await c.remove_nodes()
