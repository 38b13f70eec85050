"""The test bed's check that the API server refused none of gangcheck's own writes: a
deployed controller's log is read when it stops (gangcheck_dev.testbed.deploy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from gangcheck_dev.testbed.deploy import DeployError, ManagedProcess
from gangcheck_dev.testbed.process import Component

from gangcheck.kube.errors import ForbiddenError, InvalidError


class _Stopped:
    def stop(self) -> None:
        pass


def _process(log: Path, *lines: Any) -> ManagedProcess:
    log.write_text("".join(f"{line}\n" for line in lines))
    component = cast(Component, _Stopped())
    return ManagedProcess("gangcheck", component, log, log, refusals_checked=True)


def test_a_write_refused_by_rbac_or_a_policy_fails_the_stop(tmp_path: Path) -> None:
    rbac = ForbiddenError(403, "Forbidden", "cannot delete nodes", target="DELETE /api/v1/nodes/n")
    policy = InvalidError(
        422,
        "Invalid",
        "ValidatingAdmissionPolicy 'gangcheck-writes-only-its-own' denied request",
        target="PATCH /api/v1/nodes/n",
    )
    for error in (rbac, policy):
        process = _process(tmp_path / "gangcheck.log", "started", f"reconcile failed: {error}")
        assert process.refused_writes() == [f"reconcile failed: {error}"]
        with pytest.raises(DeployError, match="refused"):
            process.stop()


def test_reads_refused_other_errors_and_a_terminating_namespace_do_not(tmp_path: Path) -> None:
    read = ForbiddenError(403, "Forbidden", "cannot list", target="GET /apis/karpenter.sh/v1/x")
    conflict = ForbiddenError(409, "Conflict", "changed", target="PATCH /api/v1/nodes/n")
    # the API server's NamespaceLifecycle, as a full run's teardown met it: an Event of a
    # reclaim that followed the test's namespace deletion
    terminating = ForbiddenError(
        403,
        "Forbidden",
        'events "wl.1" is forbidden: unable to create new content in namespace e2e-1 because '
        "it is being terminated",
        target="POST /api/v1/namespaces/e2e-1/events",
    )
    process = _process(
        tmp_path / "gangcheck.log", read, conflict, f"could not record: {terminating}"
    )
    assert process.refused_writes() == []
    process.stop()
