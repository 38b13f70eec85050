"""End-to-end fixtures: a whole cluster, started once per session.

By default the session starts the full local stack (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kwok, Kueue, cluster-autoscaler with the kwok provider) with the node
groups in ``E2E_NODE_GROUPS``. With ``GANGCHECK_E2E_KUBECONFIG`` set, it starts nothing and
uses that cluster instead; that cluster must run the same components, with cluster-autoscaler's
kwok provider configured with the node groups below (label ``gangcheck.io/nodegroup``).

Missing binaries are built before the first test, outside the per-test timeout, with the
build's progress shown (as in ``tests/integration``). So is the controller's image, when a
collected test uses ``controller_image`` (``hack/image.sh build``: the docker engine is
installed and started if need be, and a daemon the session started is stopped at its end).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from gangcheck_dev.testbed.binaries import ALL_FAMILIES, BuildError, ensure_binaries
from gangcheck_dev.testbed.container import DockerEngine, Image, ensure_image, let_go
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.nodes import GPU_RESOURCE, NodeGroup, Taint
from gangcheck_dev.testbed.stack import FULL_STACK

from gangcheck.kube.client import Kube
from tests.conftest import measurements
from tests.e2e.helpers import fresh_namespace

KUBECONFIG_ENV = "GANGCHECK_E2E_KUBECONFIG"
GPU_TAINT = Taint(GPU_RESOURCE, "present", "NoSchedule")
#: The taint of the kept-nodes group's nodes: no pod of another test tolerates it.
KEPT_TAINT = Taint("e2e.gangcheck.io/group", "kept", "NoSchedule")
#: A GPU group large enough for the provisioning tests, one too small for them, and one of
#: the kept-nodes test's own (test_capacity_sources.py): labelled and tainted so that no other
#: test's pods, flavors or node selectors match it, with room for exactly the two nodes that
#: test has the autoscaler add (a third could be claimed for its gang: docs/testing.md).
E2E_NODE_GROUPS = (
    NodeGroup(
        name="e2e-gpu",
        max=4,
        cpu="32",
        memory="256Gi",
        gpus=8,
        labels={"gangcheck.io/gpu-type": "e2e"},
        taints=(GPU_TAINT,),
    ),
    NodeGroup(
        name="e2e-gpu-small",
        max=2,
        cpu="32",
        memory="256Gi",
        gpus=8,
        labels={"gangcheck.io/gpu-type": "e2e"},
        taints=(GPU_TAINT,),
    ),
    NodeGroup(
        name="e2e-gpu-kept",
        max=2,
        cpu="32",
        memory="256Gi",
        gpus=8,
        labels={"gangcheck.io/gpu-type": "e2e-kept"},
        taints=(GPU_TAINT, KEPT_TAINT),
    ),
)

#: The families the e2e suite needs: the full stack's, and helm for the chart's tests.
E2E_FAMILIES = (*ALL_FAMILIES, "helm")
_BUILD_ERROR = pytest.StashKey[BuildError]()
_IMAGE = pytest.StashKey[Image | BuildError]()
_ENGINE = pytest.StashKey[DockerEngine]()
_IMAGE_FIXTURE = "controller_image"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs a whole cluster (the local full stack)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e = [item for item in items if item.path.is_relative_to(os.path.dirname(__file__))]
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    if config.option.collectonly or not e2e:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            ensure_binaries(("helm",) if os.environ.get(KUBECONFIG_ENV) else E2E_FAMILIES)
        except BuildError as exc:
            config.stash[_BUILD_ERROR] = exc
        if any(_IMAGE_FIXTURE in getattr(item, "fixturenames", ()) for item in e2e):
            _build_image(config)


def _build_image(config: pytest.Config) -> None:
    """The image, on a daemon this session holds (and stops at its end if it started it)."""
    engine = DockerEngine()
    engine.acquire()
    config.stash[_ENGINE] = engine
    began = time.monotonic()
    try:
        config.stash[_IMAGE] = ensure_image()
    except BuildError as exc:
        config.stash[_IMAGE] = exc
        return
    measurements(config).append(
        f"image built or reused in {time.monotonic() - began:.1f}s (hack/image.sh build)"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    image = config.stash.get(_IMAGE, None)
    if isinstance(image, Image):
        let_go(image)
    engine = config.stash.get(_ENGINE, None)
    if engine is not None:
        engine.release()


@dataclass
class Cluster:
    """The cluster under test: a kubeconfig, and the local stack if this session started it."""

    kubeconfig: str
    plane: ControlPlane | None = None
    measurements: list[str] = field(default_factory=list)

    def record(self, text: str) -> None:
        """A measurement to show in the session summary (and to copy into docs/testbed.md)."""
        self.measurements.append(text)


@pytest.fixture(scope="session")
def controller_image(pytestconfig: pytest.Config) -> Image:
    """The controller's image, built at collection (see the module's doc)."""
    built = pytestconfig.stash.get(_IMAGE, None)
    if isinstance(built, BuildError):
        raise built
    assert built is not None, "the image is built at collection for the tests that use it"
    return built


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    shown = measurements(pytestconfig)
    foreign = os.environ.get(KUBECONFIG_ENV)
    if foreign:
        yield Cluster(kubeconfig=foreign, measurements=shown)
        return
    failed = pytestconfig.stash.get(_BUILD_ERROR, None)
    if failed is not None:
        raise failed
    plane = ControlPlane(components=FULL_STACK, node_groups=E2E_NODE_GROUPS)
    plane.start()
    try:
        timings = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in plane.timings.items())
        shown.append(f"stack started in {plane.startup_seconds:.1f}s: {timings}")
        yield Cluster(kubeconfig=str(plane.kubeconfig), plane=plane, measurements=shown)
    finally:
        plane.stop()


@pytest.fixture
async def kube(cluster: Cluster) -> AsyncIterator[Kube]:
    client = await Kube.connect(cluster.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def namespace(kube: Kube) -> AsyncIterator[str]:
    """A fresh namespace, deleted (not awaited) after the test."""
    async with fresh_namespace(kube) as name:
        yield name
