"""Smoke test of the capacity-sources benchmark (``benchmarks/capacity_sources.py``): its three
scenarios run end to end at once, on a local stack of its own (real Kueue, gangcheck as its own
process, the simulated cloud), with a short horizon, and every figure is reported for both
sides. Nothing about the figures' values is asserted: timings on a shared test machine say
nothing; ``make bench`` is where they are read.
"""

from __future__ import annotations

import pytest

from benchmarks import capacity_sources

HORIZON = 40.0
FIGURES = (
    "stranded_node_min",
    "stranded_node_min_first_place",
    "thrown_node_min_first_place",
    "nodes_seen",
    "nodes_seen_first_place",
    "nodes_left",
    "nodes_left_first_place",
)


@pytest.mark.soak  # a benchmark smoke of its own; test_bench keeps the kind in make test
@pytest.mark.timeout(300)
def test_capacity_sources_benchmark_reports_every_figure_for_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = capacity_sources.run(capacity_sources.SCENARIOS, HORIZON)

    assert result["horizon_s"] >= HORIZON
    assert set(result["scenarios"]) == set(capacity_sources.SCENARIOS)
    for scenario, sides in result["scenarios"].items():
        assert set(sides) == set(capacity_sources.SIDES), scenario
        for side, figures in sides.items():
            start = figures["time_to_start_s"]
            assert start is None or start > 0, (scenario, side, figures)
            for key in FIGURES:
                assert isinstance(figures[key], int | float), (scenario, side, key, figures)
                assert figures[key] >= 0, (scenario, side, key, figures)
            # the Job went through Kueue to the side's check: a check state was read
            assert figures["check"], (scenario, side, figures)
        for label, ours, theirs, _ in capacity_sources.rows(scenario, result):
            assert ours and theirs, (scenario, label)

    capacity_sources.print_tables(result)
    printed = capsys.readouterr().out
    for title in capacity_sources.TITLES.values():
        assert title in printed
    assert capacity_sources.LABELS["gangcheck"] in printed
    assert capacity_sources.LABELS["kueue"] in printed
    # every setting that is not a default is stated, of both sides
    assert "groupKindConcurrency" in printed and "fulfillment.reclaimer DeleteNode" in printed
