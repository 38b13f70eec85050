"""`gangcheck-dev dev up --stack karpenter`, as a person runs it: a stack in the background with
Karpenter (its kwok cloud provider) in cluster-autoscaler's place and a NodePool `gpu`; a
pending 8-GPU pod gets a NodeClaim, a kwok node, and runs; `dev down` removes it all."""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from gangcheck_dev.cli import main
from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.nodes import GPU_RESOURCE

pytestmark = pytest.mark.integration

GPU_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer", "namespace": "default"},
    "spec": {
        "containers": [
            {"name": "c", "image": "x",
             "resources": {"requests": {GPU_RESOURCE: "8"}, "limits": {GPU_RESOURCE: "8"}}}
        ],
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
    },
}  # fmt: skip


def _kubectl(state: dict[str, Any], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [state["kubectl"], f"--kubeconfig={state['kubeconfig']}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _phase(state: dict[str, Any]) -> str:
    """The pod's phase (the API server gives a new pod `Pending`); a pod gone fails, saying
    what the cluster said of it."""
    phase = ("get", "pod", "trainer", "--ignore-not-found", "-o", "jsonpath={.status.phase}")
    result = subprocess.run(
        [state["kubectl"], f"--kubeconfig={state['kubeconfig']}", *phase],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if not result.stdout:  # applied, then gone: someone deleted it (seen once, in make soak)
        raise AssertionError(_why(state, "the pod applied is gone"))
    return result.stdout


def _why(state: dict[str, Any], what: str) -> str:
    """``what``, with the cluster's Events, its nodes and NodeClaims, and Karpenter's last
    log lines: the stack is removed when the test ends."""
    said = [what]
    for args in (
        ("get", "events", "-A", "--sort-by=.lastTimestamp"),
        ("get", "nodes,nodeclaims.karpenter.sh", "-o", "wide"),
    ):
        got = subprocess.run(
            [state["kubectl"], f"--kubeconfig={state['kubeconfig']}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        said.append(got.stdout + got.stderr)
    log = Path(state["root"]) / "logs" / "karpenter.log"
    if log.exists():
        said.append("karpenter.log, the end:\n" + "\n".join(log.read_text().splitlines()[-60:]))
    return "\n".join(said)


@pytest.mark.soak  # a Karpenter stack of its own, 20 s (docs/testing.md)
@pytest.mark.timeout(1500)  # builds Karpenter first where it is not cached yet
def test_dev_up_stack_karpenter_runs_a_gpu_pod_on_a_node_karpenter_made(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    try:
        assert main(["dev", "up", "--stack", "karpenter", "--state-dir", str(state_dir)]) == 0
        state = json.loads((state_dir / dev.STATE_FILE).read_text())
        assert "karpenter" in state["components"]
        assert "cluster-autoscaler" not in state["components"]
        assert (
            _kubectl(state, "get", "nodepools.karpenter.sh", "-o", "name")
            == "nodepool.karpenter.sh/gpu\n"
        )
        _kubectl(state, "apply", "-f", "-", stdin=json.dumps(GPU_POD))
        deadline = time.monotonic() + 120
        while _phase(state) != "Running":
            assert time.monotonic() < deadline, _why(state, "the pod did not run within 120 s")
            time.sleep(0.5)
        node = _kubectl(state, "get", "pod", "trainer", "-o", "jsonpath={.spec.nodeName}")
        claims = json.loads(_kubectl(state, "get", "nodeclaims.karpenter.sh", "-o", "json"))[
            "items"
        ]
        assert [c["status"]["nodeName"] for c in claims] == [node]
    finally:
        dev.down(state_dir, out=io.StringIO())
    assert not state_dir.exists()
