"""`gangcheck-dev dev up --stack NAME`: what each stack starts (no process is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.stack import FULL_STACK


def test_the_full_stack_runs_cluster_autoscaler() -> None:
    plane = dev._plane(Path("unused"), "full", None)
    assert "cluster-autoscaler" in plane.requested and "karpenter" not in plane.requested


def test_the_karpenter_stack_runs_karpenter_in_cluster_autoscalers_place() -> None:
    plane = dev._plane(Path("unused"), "karpenter", None)
    assert plane.requested[-1] == "karpenter"
    assert "cluster-autoscaler" not in plane.requested
    assert set(plane.requested) >= set(FULL_STACK) - {"cluster-autoscaler"}
    assert "karpenter" in plane.families
    assert [pool.name for pool in plane.node_pools] == ["gpu"]


def test_node_groups_are_refused_for_the_karpenter_stack(tmp_path: Path) -> None:
    groups = tmp_path / "groups.yaml"
    groups.write_text("- {name: gpu, max: 2}\n")
    with pytest.raises(dev.DevError, match="--node-groups are cluster-autoscaler's"):
        dev._plane(Path("unused"), "karpenter", groups)
