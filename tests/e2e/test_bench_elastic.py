"""Smoke test of the elastic side-by-side benchmark (``benchmarks/elastic_side_by_side.py``):
an elastic Job scaled 4 -> 8 under gangcheck's check and under Kueue's ProvisioningRequest
check at once, on a local stack of its own (real Kueue with workload slices, gangcheck as its
own process, the simulated cloud), with a short horizon; every figure is reported for both
sides. Timings are not asserted (a shared test machine says nothing of them); what each check
asked for is: the figure the comparison rests on.
"""

from __future__ import annotations

import pytest

from benchmarks import elastic_side_by_side as bench

HORIZON = 20.0
NUMBERS = ("nodes_came", "stranded_node_min", "nodes_idle_at_end", "members_before")


@pytest.mark.soak  # about 70 s with its own stack; test_elastic.py keeps the behaviour
@pytest.mark.timeout(300)
def test_elastic_benchmark_reports_every_figure_for_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = bench.run(HORIZON)

    assert result["horizon_s"] >= HORIZON
    assert set(result["sides"]) == set(bench.SIDES)
    for side, figures in result["sides"].items():
        for key in NUMBERS:
            assert isinstance(figures[key], int | float) and figures[key] >= 0, (side, key)
        assert figures["members_before"] == bench.BEFORE, (side, figures)
        assert figures["check"], (side, figures)  # the slice went to the side's check
    # gangcheck's request for the slice asks for the 4 added; Kueue's for the slice's 8
    assert result["sides"]["gangcheck"]["slice_asked"] == bench.AFTER - bench.BEFORE
    assert result["sides"]["kueue"]["slice_asked"] == bench.AFTER

    bench.print_table(result)
    printed = capsys.readouterr().out
    for label, _, _ in bench.rows(result):
        assert label in printed
    assert "groupKindConcurrency" in printed and "fulfillment.reclaimer DeleteNode" in printed
