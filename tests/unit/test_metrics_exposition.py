"""What a Prometheus scrape of gangcheck reads: every family in the text format as a parser
files it, histogram buckets fit for what each measures, labels from a bounded set, and the
in-flight gauge counting gangs waiting for capacity, not every request ever made."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gangcheck.kube.errors import ApiError, ForbiddenError, TransientError
from gangcheck.kube.informer import Store
from gangcheck.logic.attempt.records import RollbackCause
from gangcheck.model.names import PHASE_ANNOTATION, STARTED
from gangcheck.reclaim.safely import failure_cause
from gangcheck.reconcile.caches import InFlight
from gangcheck.runtime.queue import WorkQueue
from gangcheck.telemetry import CAPACITY, CHECK_OUTCOMES, HISTOGRAM_BUCKETS, METRICS, Metrics
from tests.builders import provisioning_request


def everything_recorded() -> str:
    metrics = Metrics()
    metrics.attempt("ready")
    metrics.rollback("Deadline")
    metrics.reclaimed(2, 600)
    metrics.reclaim_failed("Forbidden")
    metrics.capacity_used({"new": 4})
    metrics.quota_to_ready(95.0)
    metrics.provisioned_to_fit(30.0)
    metrics.source("dws", "asked", "", 0)
    metrics.source("dws", "delivered", "", 300.0)
    metrics.source("dws", "failed", "Deadline", 120)
    metrics.pod_gated("scheduling.k8s.io")
    metrics.webhook_error("malformed")
    metrics.api_error(409)
    metrics.api_request("GET", 429)
    metrics.reconciled("workload", 0.003)
    metrics.dispatch_nomination("worker-1")
    metrics.dispatch_fallback("worker-1")
    metrics.dispatch_round()
    metrics.dispatch_clusters_tried(2)
    return metrics.render()


@dataclass
class Family:
    kind: str
    help_lines: int
    samples: list[str]


def families(text: str) -> dict[str, Family]:
    """The families of the text format (0.0.4) as Prometheus' own parser reads them: a sample
    belongs to the family of its name (a histogram's `_bucket`, `_sum`, `_count` to the
    histogram's); one of another name starts a family of its own, untyped."""
    out: dict[str, Family] = {}
    for line in text.splitlines():
        if m := re.fullmatch(r"# (HELP|TYPE) (\S+) (.*)", line):
            family = out.setdefault(m[2], Family("", 0, []))
            if m[1] == "TYPE":
                family.kind = m[3]
            else:
                family.help_lines += 1
            continue
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
        assert name is not None, line
        base = re.sub(r"_(bucket|sum|count)$", "", name[0])
        if base in out and out[base].kind == "histogram":
            out[base].samples.append(line)
        else:
            out.setdefault(name[0], Family("untyped", 0, [])).samples.append(line)
    return out


def test_every_sample_is_filed_under_the_family_its_type_line_names() -> None:
    """Before, a counter's TYPE line named `gangcheck_attempts` and its samples
    `gangcheck_attempts_total`: a parser filed them as an untyped family without help."""
    read = families(everything_recorded())
    assert not [name for name, f in read.items() if f.kind == "untyped"]
    assert not [name for name, f in read.items() if f.help_lines != 1]
    assert not [name for name, f in read.items() if not f.samples and f.kind != "counter"]


def test_a_counters_family_ends_in_total_and_no_other_does() -> None:
    for name, family in families(everything_recorded()).items():
        assert name.endswith("_total") == (family.kind == "counter"), name


def test_every_metric_made_is_served() -> None:
    read = families(everything_recorded())
    for name in METRICS:
        assert name in read or f"{name}_total" in read, name


def bounds(text: str, name: str) -> list[str]:
    return re.findall(rf'^{name}_bucket\{{(?:[^}}]*,)?le="([^"]+)"', text, re.M)


def test_every_histogram_has_buckets_of_its_own() -> None:
    histograms = {n for n, f in families(everything_recorded()).items() if f.kind == "histogram"}
    assert histograms == set(HISTOGRAM_BUCKETS)


@pytest.mark.parametrize(
    ("histogram", "bound"),
    [
        ("gangcheck_reconcile_duration_seconds", "0.001"),  # most reconciles: milliseconds
        ("gangcheck_reconcile_duration_seconds", "0.005"),
        ("gangcheck_quota_to_ready_seconds", "420"),  # the default deadlineSeconds
        ("gangcheck_quota_to_ready_seconds", "900"),
        ("gangcheck_provisioned_to_fit_seconds", "7200"),  # slow capacity: hours
        ("gangcheck_source_delivery_seconds", "180"),
        ("gangcheck_dispatch_clusters_per_gang", "1"),  # a count of clusters
        ("gangcheck_dispatch_clusters_per_gang", "2"),
        ("gangcheck_dispatch_clusters_per_gang", "3"),
    ],
)
def test_a_histogram_has_the_bound_its_quantity_needs(histogram: str, bound: str) -> None:
    assert bound in bounds(everything_recorded(), histogram)


def test_a_count_of_clusters_is_not_bucketed_as_seconds() -> None:
    """Before, every histogram had the seconds' buckets: 0.05, 0.1, ... for 1, 2, 3 clusters."""
    assert "0.05" not in bounds(everything_recorded(), "gangcheck_dispatch_clusters_per_gang")


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("Deadline: the gang did not fit within 420s (2 of 4 placed)", "Deadline"),
        ("StartDeadline: 3 of 4 members scheduled within 300s of admission", "StartDeadline"),
        ("CapacityIsNotFound: no zone has room", "CapacityIsNotFound"),
        ("the members it added to wl-1 are gone (the Job scaled back)", "GangGone"),
        ("stopped short", "GangGone"),
        ("Workload team-a/train-7f3 was deleted: its request is withdrawn", "GangGone"),
    ],
    ids=lambda v: v[:40],
)
def test_a_rollback_is_counted_by_a_cause_from_a_few(reason: str, cause: str) -> None:
    """The label is the cause, never the reason's text (which names objects)."""
    assert RollbackCause.of(reason).value == cause


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (ForbiddenError(403, "Forbidden", "nodes is forbidden"), "Forbidden"),
        (TransientError(0, "ConnectionError", "connection reset by peer"), "ConnectionError"),
        (TransientError(503, "ServiceUnavailable", "the server is busy"), "ServiceUnavailable"),
        (TransientError(502, "502", "<html>bad gateway</html>"), "5xx"),  # a proxy's page
        (ApiError(400, "a reason of many words", "denied"), "4xx"),
        (ApiError(0, "", "?"), "Unknown"),
    ],
    ids=lambda v: str(getattr(v, "reason", v)) or "empty",
)
def test_a_reclaim_failure_is_counted_by_one_word(error: ApiError, cause: str) -> None:
    assert failure_cause(error) == cause


def open_requests(*requests: dict[str, object]) -> InFlight:
    store = Store()
    in_flight = InFlight(store, Store())
    store.add_indexer(in_flight.on_request)
    for req in requests:
        store.put_if_newer(req)
    return in_flight


def request(name: str, gang: str, **annotations: str) -> dict[str, object]:
    return provisioning_request(name, annotations={"gangcheck.io/workload": gang, **annotations})


def gangs_cases() -> Iterator[tuple[str, InFlight, int]]:
    yield "no request: none", open_requests(), 0
    yield "two gangs asking: two", open_requests(request("a-1", "a"), request("b-1", "b")), 2
    yield (
        "one gang racing two sources: one",
        open_requests(request("a-1-0", "a"), request("a-1-1", "a")),
        1,
    )
    running = request("a-1", "a", **{PHASE_ANNOTATION: STARTED})
    yield "a gang running on its capacity: none", open_requests(running), 0
    failed = provisioning_request("b-1", conditions={"Failed": "no capacity"})
    yield "a request the autoscaler failed: none", open_requests(failed), 0
    kept = request("c-1", "c", **{"gangcheck.io/gang-gone": "2026-11-30T10:00:00Z"})
    yield "a request kept open after its gang went: none", open_requests(kept), 0


@pytest.mark.parametrize(("_", "in_flight", "gangs"), list(gangs_cases()), ids=lambda v: v)
def test_the_in_flight_gauge_counts_gangs_waiting_for_capacity(
    _: str, in_flight: InFlight, gangs: int
) -> None:
    """Before, it was every cached request: running gangs' too, a racing gang's twice."""
    assert in_flight.gangs() == gangs


def test_the_leader_and_work_queue_gauges_read_the_replica_at_each_scrape() -> None:
    """``gangcheck_leader`` 1 while the replica leads, 0 while it stands by;
    ``gangcheck_workqueue_depth`` the keys ready and not yet taken, as the queue says at the
    scrape (saturation: the workers do not keep up)."""
    state = {"leading": False, "ready": 0}
    metrics = Metrics(
        leading=lambda: bool(state["leading"]), queue_depth=lambda: int(state["ready"])
    )
    assert "gangcheck_leader 0" in metrics.render().splitlines()
    state.update(leading=True, ready=7)
    lines = metrics.render().splitlines()
    assert "gangcheck_leader 1" in lines
    assert "gangcheck_workqueue_depth 7" in lines


async def test_the_work_queues_ready_keys_leave_out_the_delayed_and_the_taken() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add("b")
    queue.add("c", after=60)
    assert queue.ready == 2
    assert await queue.get() == "a"
    assert queue.ready == 1


def test_a_counter_of_a_few_known_values_is_served_at_zero_before_its_first_count() -> None:
    """Prometheus reads an increase from two samples of a series: a series that first
    appears at its first count (a rollback, 2 nodes reclaimed) starts at that count, and
    `increase()` and `rate()` never see it (the dashboard's 'Nodes reclaimed (1h)' said
    nothing for a controller's first rollbacks). The counters without labels, and those
    whose labels take a few values fixed in the code, are served at 0 from the start."""
    lines = Metrics().render().splitlines()
    zero = [
        "gangcheck_nodes_reclaimed_total 0",
        "gangcheck_stranded_node_seconds_total 0",
        *(f'gangcheck_attempts_total{{outcome="{o}"}} 0' for o in CHECK_OUTCOMES),
        *(f'gangcheck_rollbacks_total{{reason="{c.value}"}} 0' for c in RollbackCause),
        *(f'gangcheck_gang_members_total{{capacity="{c}"}} 0' for c in CAPACITY),
        'gangcheck_webhook_gated_pods_total{api_group="scheduling.k8s.io"} 0',
        'gangcheck_webhook_gated_pods_total{api_group="scheduling.x-k8s.io"} 0',
        'gangcheck_webhook_errors_total{reason="malformed"} 0',
        'gangcheck_webhook_errors_total{reason="internal"} 0',
    ]
    assert [line for line in zero if line not in lines] == []
    assert set(CHECK_OUTCOMES) == {"pending", "ready", "retry", "rejected"}
    assert set(CAPACITY) == {"reserved", "existing", "new"}


def test_a_series_served_at_zero_counts_from_zero() -> None:
    metrics = Metrics()
    metrics.rollback("Deadline")
    metrics.reclaimed(2, 600)
    metrics.attempt("ready")
    lines = metrics.render().splitlines()
    assert 'gangcheck_rollbacks_total{reason="Deadline"} 1' in lines
    assert 'gangcheck_rollbacks_total{reason="Failed"} 0' in lines
    assert "gangcheck_nodes_reclaimed_total 2" in lines
    assert "gangcheck_stranded_node_seconds_total 600" in lines
    assert 'gangcheck_attempts_total{outcome="ready"} 1' in lines


def test_series_of_open_values_appear_at_their_first_count() -> None:
    """An API status, a reclaim's error, a capacity source or a worker cluster: values not
    known in advance are not made up at 0."""
    text = Metrics().render()
    for family in (
        "gangcheck_api_errors_total",
        "gangcheck_api_requests_total",
        "gangcheck_reclaim_failures_total",
        "gangcheck_source_asks_total",
        "gangcheck_dispatch_nominations_total",
    ):
        assert f"\n{family}" not in text, family


def test_the_help_of_a_per_attempt_metric_says_so() -> None:
    """The demo's gang 'partial' started on its second attempt: its first attempt's nodes
    are stranded node time (not time of a gang that never started), and its quota-to-Ready
    counts from Kueue's reservation for the second attempt (Kueue evicts a Workload on a
    Retry and reserves its quota again)."""
    metrics = Metrics()
    metrics.quota_to_ready(7.0)
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", metrics.render(), re.M))
    assert "rolled back" in helps["gangcheck_stranded_node_seconds_total"]
    assert "did not start" not in helps["gangcheck_stranded_node_seconds_total"]
    assert "last reservation" in helps["gangcheck_quota_to_ready_seconds"]
