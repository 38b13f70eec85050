"""Smoke test of the scale benchmark (``benchmarks/kueue_scale.py``): at a tiny N it runs end to
end on a local full stack of its own (its kube-apiserver writes an audit log) and reports every
figure for both sides. Nothing about the figures' values is asserted: timings on a shared test
machine say nothing; ``make bench`` is where they are read.
"""

from __future__ import annotations

import math

import pytest

from benchmarks import kueue_scale

N = 6
#: Rows of the table that have no figure on Kueue's side by design.
ONE_SIDED = (
    "  of which node ledger writes",
    "  of which request phase records",
    "  of which leader election",
    "  of which Lease writes",
)


@pytest.mark.timeout(600)
def test_scale_benchmark_reports_every_figure_for_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = kueue_scale.run_size(N, 300, (), keep=False, sim_cloud=False)

    assert result["complete"], result
    for side in kueue_scale.SIDES:
        figures = result["sides"][side]
        assert figures["admitted"] == N, (side, figures)
        assert figures["requests_created"] >= N, (side, figures)
        for key in (
            "ready_after_provisioned_s",
            "request_after_quota_s",
            "provisioned_after_request_s",
        ):
            assert figures[key] is not None and len(figures[key]) == 2, (side, key, figures)
        for key in ("admitted_per_s", "rss_mib", "controllers_requests_per_gang"):
            assert figures[key] > 0 and not math.isnan(figures[key]), (side, key, figures)
        assert figures["cpu_s"] >= 0, (side, figures)
        # each check's own work: its Workload reconciles (metrics) and CPU (Kueue's: its
        # share of Kueue's CPU profile)
        assert figures["workload_reconciles_per_gang"] > 0, (side, figures)
        # a CPU profile samples every 10 ms: at this N Kueue's check may do less work than one
        # sample (CI once saw 0 of its samples); a share of 0 is a measurement, not a gap
        cpu_ms = figures["check_cpu_ms_per_workload"]
        assert cpu_ms >= 0 and not math.isnan(cpu_ms), (side, figures)
        if side == "gangcheck":
            assert cpu_ms > 0, figures
        # Kueue's check's writes are Kueue's writes per gang of its side less those per gang of
        # gangcheck's side: at this N one retried Workload write on gangcheck's side (a
        # conflict with gangcheck's check write) outweighs them (CI saw -1.67); a figure, not
        # a gap. gangcheck's are its own, counted.
        writes = figures["check_writes_per_gang"]
        assert not math.isnan(writes), (side, figures)
        if side == "gangcheck":
            assert writes > 0, figures
    assert result["sides"]["gangcheck"]["gangcheck_requests_per_gang"] > 0
    # every gang's request was marked Fulfilled when its check turned Ready, before admission
    assert result["sides"]["gangcheck"]["phase_records_per_gang"] >= 1, result["audit"]
    assert result["sides"]["kueue"]["kueue_requests_per_gang"] > 0
    # Kueue was profiled while the burst ran, and its profiles held samples (a NaN share says
    # none did, or pprof could not read them)
    assert result["kueue_profiles"] >= 1, result
    assert not math.isnan(result["kueue_check_cpu_share"]), result
    # Events are counted until both recorders went quiet: every request's Event, on each side
    for side in kueue_scale.SIDES:
        assert result["sides"][side]["created_events_per_request"] >= 1, result["audit"]

    for label, ours, theirs, _ in kueue_scale.rows(result):
        assert ours != "-", label
        assert theirs != "-" or label.startswith(ONE_SIDED), label
    kueue_scale.print_table(result)
    printed = capsys.readouterr().out
    assert "groupKindConcurrency" in printed  # every setting that is not a default is stated
    assert f"N = {N} gangs" in printed
    assert kueue_scale.LABELS["gangcheck"] in printed and kueue_scale.LABELS["kueue"] in printed
