"""Integration fixtures: a real control plane (etcd + kube-apiserver v1.37) on loopback.

The binaries are built from the pinned Go modules when missing (a cold build takes tens of
minutes); that happens once, before the first test, outside the per-test timeout, with the
build's progress shown. Tests never skip for lack of binaries.

gangcheck's INFO records (its decisions: a withdrawal, a wait for a cache, a write skipped)
are captured with each test's log (`gangcheck_info_captured`), so a failed test's report says
what the controller decided and when; a passing test's log is not shown.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
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

_BUILD_ERRORS = pytest.StashKey[dict[str, BuildError]]()
_BINARY_FIXTURES = {"testbed_binaries": CONTROL_PLANE, "otelcol_binary": OTEL_COLLECTOR}


def build_binaries(
    config: pytest.Config, items: list[pytest.Item], fixtures: Mapping[str, Sequence[str]]
) -> None:
    """Build the binary families of those `fixtures` (name: families) the collected tests
    use, once, before the first test: outside the per-test timeout, the build's progress
    shown. A failed build is kept for each of those fixtures to raise (`built`): their tests
    fail, never skip."""
    if config.option.collectonly:
        return
    used = {name for item in items for name in getattr(item, "fixturenames", ())}
    wanted = [name for name in fixtures if name in used]
    if not wanted:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            ensure_binaries([f for name in wanted for f in fixtures[name]])
    except BuildError as exc:
        failed = config.stash.setdefault(_BUILD_ERRORS, {})
        failed.update(dict.fromkeys(wanted, exc))


def built(config: pytest.Config, fixture: str, families: Sequence[str]) -> dict[str, Path]:
    """The folders of `families` (built before the first test by `build_binaries`); the
    build's error, if it failed for `fixture`."""
    failed = config.stash.get(_BUILD_ERRORS, {}).get(fixture)
    if failed is not None:
        raise failed
    return ensure_binaries(families)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    build_binaries(config, items, _BINARY_FIXTURES)


@pytest.fixture(autouse=True)
def gangcheck_info_captured() -> Iterator[None]:
    """The ``gangcheck`` loggers at INFO for the test, as it was again afterwards: the root
    logger stays at WARNING (no library's INFO), and the test's own ``caplog.set_level`` on
    a ``gangcheck.*`` logger still decides for that one."""
    logger = logging.getLogger("gangcheck")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)


@pytest.fixture(scope="session")
def testbed_binaries(pytestconfig: pytest.Config) -> dict[str, Path]:
    """Folders of the built binaries (``etcd``, ``kubernetes``)."""
    return built(pytestconfig, "testbed_binaries", CONTROL_PLANE)


@pytest.fixture(scope="session")
def otelcol_binary(pytestconfig: pytest.Config) -> Path:
    """The OpenTelemetry Collector of ``hack/otelcol`` (built before the first test)."""
    return built(pytestconfig, "otelcol_binary", OTEL_COLLECTOR)["otelcol"] / "otelcol"


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
