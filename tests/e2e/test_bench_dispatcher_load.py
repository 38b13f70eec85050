"""Smoke test of the dispatcher load benchmark (``benchmarks/dispatcher_load.py``): at a tiny N,
with this checkout as both trees, it runs end to end on a lean bed of its own (a manager and a
worker, etcd and kube-apiserver each, the manager's audit log on) and reports every phase for
both trees. Of the values, only what holds whatever the machine's load: with no Workload
waiting the dispatcher writes nothing, and each tree's burst writes a record on every Workload
turned waiting (so the first tree's burst was undone before the second ran). Figures are read
in ``make bench``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from gangcheck_dev.testbed import deploy

from benchmarks import dispatcher_load as bench

N, K = 20, 2


@pytest.mark.timeout(420)
def test_dispatcher_load_reports_both_trees_and_undoes_each_burst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # run_gangcheck_from changes both: put them back afterwards
    monkeypatch.chdir(bench.REPO)
    monkeypatch.setattr(deploy, "repo_root", deploy.repo_root)
    trees = dict.fromkeys(bench.TREES, bench.REPO)

    result = asyncio.run(bench.run(trees, tmp_path / "bed", n=N, seconds=4, k=K, burst_seconds=6))

    for tree in bench.TREES:
        figures = result[tree]
        assert not figures["exited"], tree
        idle, burst = figures["idle"], figures["burst"]
        writes = {
            key: count
            for key, count in idle["requests"].items()
            if key.split()[0] in ("create", "update", "patch", "delete")
        }
        assert writes == {}, (tree, idle["requests"])
        assert burst["requests"].get("patch workloads", 0) >= K, (tree, burst["requests"])
        for phase in (idle, burst):
            assert phase["cpu_s"]["dispatcher"] >= 0 and phase["rss_mib"] > 0, (tree, phase)
    bench.print_table(result, ["a setting"])
    printed = capsys.readouterr().out
    assert f"N = {N} Workloads" in printed and f"burst: {K} Workloads waiting" in printed
    assert "after/before" in printed and "settings: a setting" in printed
