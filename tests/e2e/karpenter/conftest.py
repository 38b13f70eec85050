"""The Karpenter e2e package: the full stack with Karpenter (kwok provider) in
cluster-autoscaler's place, started once for this package (its NodePools are made per test),
and gangcheck deployed with the ``karpenter`` and ``reclaim-nodeclaim`` components, serving
its webhook on loopback (the PodGroup test registers it by URL)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gangcheck_dev.testbed.certs import CertificateAuthority
from gangcheck_dev.testbed.deploy import deploy_gangcheck
from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.process import free_ports
from gangcheck_dev.testbed.stack import FULL_STACK

from tests.conftest import measurements
from tests.e2e.conftest import KUBECONFIG_ENV, Cluster
from tests.e2e.test_podgroups import Hooked


@pytest.fixture(scope="package")
def cluster(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    """The stack with Karpenter; never a foreign cluster (GANGCHECK_E2E_KUBECONFIG names one
    running cluster-autoscaler)."""
    assert not os.environ.get(KUBECONFIG_ENV), "the Karpenter e2e tests start their own stack"
    shown = measurements(pytestconfig)
    plane = ControlPlane(components=FULL_STACK, autoscaler="karpenter")
    plane.start()
    try:
        timings = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in plane.timings.items())
        shown.append(f"Karpenter stack started in {plane.startup_seconds:.1f}s: {timings}")
        yield Cluster(kubeconfig=str(plane.kubeconfig), plane=plane, measurements=shown)
    finally:
        plane.stop()


@pytest.fixture(scope="package")
def controller(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hooked]:
    workdir = tmp_path_factory.mktemp("gangcheck-karpenter")
    authority = CertificateAuthority.create("gangcheck-e2e-webhook-ca")
    certs = workdir / "certs"
    certs.mkdir()
    authority.issue_serving("gangcheck-webhook", ["127.0.0.1"]).write(
        certs / "tls.crt", certs / "tls.key"
    )
    (port,) = free_ports(1)
    began = time.monotonic()
    process = deploy_gangcheck(
        Path(cluster.kubeconfig),
        workdir=workdir,
        extra_args=["--workers=4", f"--webhook-port={port}", f"--webhook-cert-dir={certs}"],
        components=("karpenter", "reclaim-nodeclaim"),
    )
    cluster.record(f"gangcheck deployed and ready in {time.monotonic() - began:.1f}s")
    try:
        yield Hooked(process, f"https://127.0.0.1:{port}/mutate-pods", authority.cert_pem)
    finally:
        alive = process.running
        process.stop()
        assert alive, f"gangcheck died during the tests:\n{process.log_tail(40)}"
