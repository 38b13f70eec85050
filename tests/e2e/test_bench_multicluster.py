"""Smoke test of the multi-cluster side-by-side benchmark
(``benchmarks/multicluster_side_by_side.py``): Kueue's AllAtOnce with its own check, and
gangcheck's dispatcher with gangcheck, in the scenario where each worker has room for half the
gangs, on a multi-cluster bed of its own, with a short horizon; every figure is reported for
every gang and every setting is printed. Of the values, only what the dispatcher guarantees
whatever the machine's load: one cluster scales up per gang, and nothing is stranded outside
the cluster a gang ran in. Timings are read in ``make bench``.
"""

from __future__ import annotations

import pytest

from benchmarks import multicluster_side_by_side as bench

HORIZON = 40.0


@pytest.mark.soak  # a bed of its own and two configurations: 134 s
@pytest.mark.timeout(420)
def test_multicluster_benchmark_reports_every_gang_and_the_dispatcher_scales_up_one_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = bench.run(["a", "d"], ["half"], bench.GANGS, HORIZON, keep=False)

    by_config = result["results"]["half"]
    assert set(by_config) == {"a", "d"}
    for config, gangs in by_config.items():
        assert [g["gang"] for g in gangs] == [f"g{i + 1}" for i in range(bench.GANGS)], config
        for g in gangs:
            assert g["stranded_node_min"] >= g["stranded_node_min_elsewhere"] >= 0, g
            start = g["time_to_start_s"]
            assert start is None or start > 0, g
    for g in by_config["d"]:
        assert len(g["clusters_scaled_up"]) <= 1, g
        assert g["stranded_node_min_elsewhere"] == 0, g

    print("\n".join(bench.table_lines(result)))
    printed = capsys.readouterr().out
    assert bench.TITLES["half"] in printed
    assert bench.LABELS["a"] in printed and bench.LABELS["d"] in printed
    assert "groupKindConcurrency" in printed and "fulfillment.deadlineSeconds" in printed
    assert "simulated cloud" in printed and "kwok Nodes" in printed
