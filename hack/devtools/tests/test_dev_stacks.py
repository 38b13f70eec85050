"""`gangcheck-dev dev up --stack NAME`: what each stack starts (no process is started here)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from gangcheck_dev.testbed import dev
from gangcheck_dev.testbed.stack import FULL_STACK, MetricsCert


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


@pytest.fixture
def no_kueue_cert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`down` releases Kueue's metrics certificate: here one of a folder of the test's own."""
    monkeypatch.setattr(dev, "MetricsCert", lambda: MetricsCert(tmp_path / "certs"))


@pytest.mark.usefixtures("no_kueue_cert")
def test_down_removes_the_default_state_folder_and_its_gangcheck_folder_if_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo-down` / `make dev-down` left an empty `~/.local/state/gangcheck` behind."""
    monkeypatch.delenv("GANGCHECK_STATE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "gangcheck" / "dev").mkdir(parents=True)
    assert dev.down(out=io.StringIO())
    assert list(tmp_path.iterdir()) == []

    (tmp_path / "gangcheck" / "dev").mkdir(parents=True)
    (tmp_path / "gangcheck" / "notes").write_text("someone's")
    assert dev.down(out=io.StringIO())
    assert [p.name for p in (tmp_path / "gangcheck").iterdir()] == ["notes"]


@pytest.mark.usefixtures("no_kueue_cert")
def test_down_leaves_the_folder_above_a_state_folder_named_by_gangcheck_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANGCHECK_STATE", str(tmp_path / "mine" / "dev"))
    (tmp_path / "mine" / "dev").mkdir(parents=True)
    assert dev.down(out=io.StringIO())
    assert (tmp_path / "mine").is_dir() and not (tmp_path / "mine" / "dev").exists()
