"""Logs as JSON lines carrying the object reference; metrics through the OpenTelemetry SDK,
exposed in the Prometheus text format; traces when configured: one span per reconcile with
the object and the decision (outcome, reason, check, attempt), child spans for the decision
and for API calls, sent over OTLP/HTTP through a bounded queue that drops rather than waits."""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.metrics import Counter as CounterMetric
from opentelemetry.metrics import Histogram as HistogramMetric
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from gangcheck.logic.attempt.actions import Event, ReclaimArrivals
from gangcheck.logic.attempt.records import RollbackCause
from gangcheck.logic.podgroups import podgroup as pg
from gangcheck.logic.podgroups.podgroup import GroupDecision, GroupSnapshot
from gangcheck.logic.workloads.admission import PENDING, READY, REJECTED, RETRY, Decision, Snapshot
from gangcheck.model.names import MESSAGE_ANNOTATION, STATE_ANNOTATION
from gangcheck.model.podgroups import PLUGINS, UPSTREAM
from gangcheck.settings import OtlpTraces, TracingSettings, otlp_traces

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""Seconds one reconcile takes: most take milliseconds, a slow API server seconds."""
WAIT_BUCKETS = (
    *(1, 5, 10, 15, 30, 45, 60, 90, 120, 180, 240, 300, 420, 600),
    *(900, 1200, 1800, 2700, 3600, 7200, 14400),
)
"""Seconds a gang waits for capacity: seconds to hours, dense around the minutes a deadline
is set in (``fulfillment.deadlineSeconds`` is 420 by default)."""
CLUSTER_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 16)
"""Worker clusters nominated for one gang: a count, not seconds."""
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "gangcheck_quota_to_ready_seconds": WAIT_BUCKETS,
    "gangcheck_provisioned_to_fit_seconds": WAIT_BUCKETS,
    "gangcheck_source_delivery_seconds": WAIT_BUCKETS,
    "gangcheck_reconcile_duration_seconds": RECONCILE_BUCKETS,
    "gangcheck_dispatch_clusters_per_gang": CLUSTER_BUCKETS,
}
"""The bucket bounds of each histogram `Metrics` makes."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and every `extra` field. The
    time is RFC 3339 in UTC to the microsecond (``2026-12-04T20:15:43.123456+00:00``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO", *, json_lines: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    plain = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    handler.setFormatter(JsonFormatter() if json_lines else plain)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class AttemptMetrics(Protocol):
    """What the reconcilers and the applier record about attempts: `Metrics`, or `NO_METRICS`
    where nothing is to be recorded (tests, tools)."""

    def attempt(self, outcome: str) -> None: ...
    def rollback(self, reason: str) -> None: ...
    def reclaimed(self, nodes: int, node_seconds: int) -> None: ...
    def reclaim_failed(self, error: str) -> None: ...
    def reclaimed_not_removed(self) -> None: ...
    def capacity_used(self, used: Mapping[str, int]) -> None: ...
    def quota_to_ready(self, seconds: float) -> None: ...
    def provisioned_to_fit(self, seconds: float) -> None: ...
    def source(self, source: str, outcome: str, reason: str, seconds: float) -> None: ...


class NoMetrics:
    """Records nothing."""

    def attempt(self, outcome: str) -> None:
        pass

    def rollback(self, reason: str) -> None:
        pass

    def reclaimed(self, nodes: int, node_seconds: int) -> None:
        pass

    def reclaim_failed(self, error: str) -> None:
        pass

    def reclaimed_not_removed(self) -> None:
        pass

    def capacity_used(self, used: Mapping[str, int]) -> None:
        pass

    def quota_to_ready(self, seconds: float) -> None:
        pass

    def provisioned_to_fit(self, seconds: float) -> None:
        pass

    def source(self, source: str, outcome: str, reason: str, seconds: float) -> None:
        pass


NO_METRICS: AttemptMetrics = NoMetrics()


METRICS: dict[str, str] = {
    # name: description, of the counters and histograms `Metrics` makes, in this order
    "gangcheck_attempts": "Check state changes by outcome",
    "gangcheck_rollbacks": "Rollbacks by reason",
    "gangcheck_nodes_reclaimed": "Nodes reclaimed after rollbacks",
    "gangcheck_reclaim_failures": (
        "Reclaims that failed with an error and will be retried, by error"
    ),
    "gangcheck_reclaimed_nodes_not_removed": (
        "Times a node CordonAndTaint reclaimed was said still there (not removed by "
        "cluster-autoscaler) past its bound: Event ReclaimedNodeNotRemoved on the Node"
    ),
    "gangcheck_stranded_node_seconds": (
        "Node time held by attempts that were rolled back, reclaimed (what partial deliveries cost)"
    ),
    "gangcheck_api_errors": "API errors by status code",
    "gangcheck_api_requests": (
        "Requests to the API server, each try of a retried one, by HTTP method and the "
        "status answered (0: no answer)"
    ),
    "gangcheck_quota_to_ready_seconds": (
        "Quota reserved to check Ready, for the attempt made Ready (a gang retried counts "
        "from its last reservation)"
    ),
    "gangcheck_provisioned_to_fit_seconds": "Provisioned=True to the whole gang fitting on nodes",
    "gangcheck_gang_members": (
        "Members of gangs made ready, by the capacity they use: reserved (placed on "
        "reservation-backed nodes), existing (other nodes that were there), new "
        "(asked for)"
    ),
    "gangcheck_webhook_gated_pods": "PodGroup members gated at creation",
    "gangcheck_webhook_errors": "Admission reviews the webhook could not serve",
    "gangcheck_source_asks": "Asks of each capacity source",
    "gangcheck_source_deliveries": "Gangs a capacity source delivered whole",
    "gangcheck_source_failures": (
        "Asks a capacity source could not deliver (stockouts and the like), by the "
        "rollback's cause: CapacityIsNotFound, Failed, Deadline, ..."
    ),
    "gangcheck_source_delivery_seconds": (
        "A capacity source asked to the whole gang fitting on its nodes"
    ),
    "gangcheck_source_stranded_node_seconds": (
        "Node time held by what a failed capacity source delivered, reclaimed"
    ),
    "gangcheck_reconcile_duration_seconds": "Reconcile latency",
    "gangcheck_dispatch_nominations": (
        "Worker clusters the dispatcher nominated for a gang, by cluster"
    ),
    "gangcheck_dispatch_fallbacks": (
        "Workers the dispatcher gave up on for a gang (its copy failed, or it became "
        "unreachable while nominated) before nominating the next, by cluster"
    ),
    "gangcheck_dispatch_rounds": (
        "Rounds the dispatcher began again for a gang every worker had failed for"
    ),
    "gangcheck_dispatch_clusters_per_gang": (
        "Worker clusters nominated for a gang, counted once per gang, when its copy is "
        "admitted in one of them"
    ),
}


CHECK_OUTCOMES = tuple(state.lower() for state in (PENDING, READY, RETRY, REJECTED))
"""``gangcheck_attempts_total``'s outcomes: the check states, in lower case."""
CAPACITY = ("reserved", "existing", "new")
"""``gangcheck_gang_members_total``'s capacities (``capacity_used`` of a decision)."""
WEBHOOK_ERRORS = ("malformed", "internal")
"""``gangcheck_webhook_errors_total``'s reasons (the webhook's ``on_error``)."""
FROM_ZERO: dict[str, tuple[dict[str, str], ...]] = {
    "gangcheck_attempts": tuple({"outcome": o} for o in CHECK_OUTCOMES),
    "gangcheck_rollbacks": tuple({"reason": c.value} for c in RollbackCause),
    "gangcheck_nodes_reclaimed": ({},),
    "gangcheck_stranded_node_seconds": ({},),
    "gangcheck_reclaimed_nodes_not_removed": ({},),
    "gangcheck_gang_members": tuple({"capacity": c} for c in CAPACITY),
    "gangcheck_webhook_gated_pods": ({"api_group": UPSTREAM}, {"api_group": PLUGINS}),
    "gangcheck_webhook_errors": tuple({"reason": r} for r in WEBHOOK_ERRORS),
}
"""The series served at 0 before their first count: each counter without labels, and each
value of a label whose values are fixed in the code. Prometheus reads an increase between two
samples, so a series that first appears at its first count (a rollback, 2 nodes reclaimed)
would never show that count in ``increase()`` or ``rate()``. Series of values not known in
advance (an HTTP status, a capacity source, a worker cluster) appear at their first count."""


class Metrics:
    """The controller's metrics (DESIGN.md §5), recorded through one OpenTelemetry meter."""

    def __init__(
        self,
        *,
        in_flight: Callable[[], int] = lambda: 0,
        spans: SpanExportStats | None = None,
        queue_depth: Callable[[], int] = lambda: 0,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._reader = InMemoryMetricReader()
        views = [
            View(
                instrument_type=HistogramInstrument,
                instrument_name=name,
                aggregation=ExplicitBucketHistogramAggregation(bounds),
            )
            for name, bounds in HISTOGRAM_BUCKETS.items()
        ]
        self.provider = MeterProvider(metric_readers=[self._reader], views=views)
        meter = self.provider.get_meter("gangcheck")

        counters: dict[str, CounterMetric] = {}

        def counter(name: str) -> CounterMetric:
            counters[name] = meter.create_counter(name, description=METRICS[name])
            return counters[name]

        def histogram(name: str) -> HistogramMetric:
            return meter.create_histogram(name, description=METRICS[name])

        self._attempts = counter("gangcheck_attempts")
        self._rollbacks = counter("gangcheck_rollbacks")
        self._reclaimed = counter("gangcheck_nodes_reclaimed")
        self._reclaim_failures = counter("gangcheck_reclaim_failures")
        self._not_removed = counter("gangcheck_reclaimed_nodes_not_removed")
        self._stranded = counter("gangcheck_stranded_node_seconds")
        self._api_errors = counter("gangcheck_api_errors")
        self._api_requests = counter("gangcheck_api_requests")
        self._to_ready = histogram("gangcheck_quota_to_ready_seconds")
        self._to_fit = histogram("gangcheck_provisioned_to_fit_seconds")
        self._members = counter("gangcheck_gang_members")
        self._gated = counter("gangcheck_webhook_gated_pods")
        self._webhook_errors = counter("gangcheck_webhook_errors")
        self._source_asks = counter("gangcheck_source_asks")
        self._source_deliveries = counter("gangcheck_source_deliveries")
        self._source_failures = counter("gangcheck_source_failures")
        self._source_delivery = histogram("gangcheck_source_delivery_seconds")
        self._source_stranded = counter("gangcheck_source_stranded_node_seconds")
        self._reconcile = histogram("gangcheck_reconcile_duration_seconds")
        self._nominations = counter("gangcheck_dispatch_nominations")
        self._fallbacks = counter("gangcheck_dispatch_fallbacks")
        self._rounds = counter("gangcheck_dispatch_rounds")
        self._clusters_tried = histogram("gangcheck_dispatch_clusters_per_gang")
        for name, series in FROM_ZERO.items():
            for labels in series:
                counters[name].add(0, labels)
        self._dispatch_waiting = {"nominated": 0, "no_worker": 0}

        def waiting(_: CallbackOptions) -> Iterable[Observation]:
            for state, gangs in sorted(self._dispatch_waiting.items()):
                yield Observation(gangs, {"state": state})

        meter.create_observable_gauge(
            "gangcheck_dispatch_waiting_gangs",
            callbacks=[waiting],
            description=(
                "The dispatcher only: gangs waiting for a worker cluster at its last pass, by "
                "state: nominated (a worker is trying), no_worker (none to nominate: every "
                "worker skipped or given up, said on the Workload)"
            ),
        )

        def observe(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(in_flight())

        meter.create_observable_gauge(
            "gangcheck_inflight_gangs",
            callbacks=[observe],
            description="Gangs with a request capacity may still arrive for",
        )

        def depth(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(queue_depth())

        def leader(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(1 if leading() else 0)

        meter.create_observable_gauge(
            "gangcheck_workqueue_depth",
            callbacks=[depth],
            description=(
                "Keys ready to be reconciled and not yet taken by a worker (delayed ones not "
                "counted): growing, the workers do not keep up"
            ),
        )
        meter.create_observable_gauge(
            "gangcheck_leader",
            callbacks=[leader],
            description="1 while this replica leads (or runs without leader election), else 0",
        )
        self._caches_synced = 1

        def synced(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(self._caches_synced)

        meter.create_observable_gauge(
            "gangcheck_caches_synced",
            callbacks=[synced],
            description=(
                "0 while the leader waits for a cache to sync (no reconcile runs), else 1 "
                "(a standby replica, the dispatcher: nothing waited for)"
            ),
        )
        self._observe_span_export(meter, spans or span_export)

    @staticmethod
    def _observe_span_export(meter: Meter, spans: SpanExportStats) -> None:
        def exported(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(spans.exported)

        def dropped(_: CallbackOptions) -> Iterable[Observation]:
            for reason, count in spans.dropped.items():
                yield Observation(count, {"reason": reason})

        def queued(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(spans.queued())

        meter.create_observable_counter(
            "gangcheck_trace_spans_exported",
            callbacks=[exported],
            description="Spans the OTLP endpoint accepted",
        )
        meter.create_observable_counter(
            "gangcheck_trace_spans_dropped",
            callbacks=[dropped],
            description=(
                "Spans never delivered, by reason: queue_full (the bounded queue was full), "
                "export_failed (the endpoint refused them, was unreachable or too slow)"
            ),
        )
        meter.create_observable_gauge(
            "gangcheck_trace_spans_queued",
            callbacks=[queued],
            description="Spans waiting to be exported (bounded)",
        )

    def attempt(self, outcome: str) -> None:
        self._attempts.add(1, {"outcome": outcome})

    def rollback(self, reason: str) -> None:
        self._rollbacks.add(1, {"reason": reason})

    def reclaimed(self, nodes: int, node_seconds: int) -> None:
        self._reclaimed.add(nodes)
        self._stranded.add(node_seconds)

    def reclaim_failed(self, error: str) -> None:
        self._reclaim_failures.add(1, {"error": error})

    def reclaimed_not_removed(self) -> None:
        self._not_removed.add(1)

    def capacity_used(self, used: Mapping[str, int]) -> None:
        for capacity, members in used.items():
            self._members.add(members, {"capacity": capacity})

    def source(self, source: str, outcome: str, reason: str, seconds: float) -> None:
        labels = {"source": source}
        if outcome == "asked":
            self._source_asks.add(1, labels)
        elif outcome == "delivered":
            self._source_deliveries.add(1, labels)
            self._source_delivery.record(seconds, labels)
        elif outcome == "failed":
            self._source_failures.add(1, {**labels, "reason": reason})
            self._source_stranded.add(int(seconds), labels)

    def caches_synced(self, synced: bool) -> None:
        """The leader waits for its caches to sync (False), or has every one synced (True)."""
        self._caches_synced = 1 if synced else 0

    def pod_gated(self, api_group: str) -> None:
        self._gated.add(1, {"api_group": api_group})

    def webhook_error(self, reason: str) -> None:
        self._webhook_errors.add(1, {"reason": reason})

    def api_error(self, status: int) -> None:
        self._api_errors.add(1, {"code": str(status)})

    def api_request(self, method: str, status: int) -> None:
        """One request answered (``Kube.observed``)."""
        self._api_requests.add(1, {"method": method, "code": str(status)})

    def quota_to_ready(self, seconds: float) -> None:
        self._to_ready.record(seconds)

    def provisioned_to_fit(self, seconds: float) -> None:
        self._to_fit.record(seconds)

    def reconciled(self, controller: str, seconds: float) -> None:
        self._reconcile.record(seconds, {"controller": controller})

    def dispatch_nomination(self, cluster: str) -> None:
        self._nominations.add(1, {"cluster": cluster})

    def dispatch_fallback(self, cluster: str) -> None:
        self._fallbacks.add(1, {"cluster": cluster})

    def dispatch_round(self) -> None:
        """A new round began for a gang every worker had failed for."""
        self._rounds.add(1)

    def dispatch_clusters_tried(self, clusters: int) -> None:
        self._clusters_tried.record(clusters)

    def dispatch_waiting(self, nominated: int, no_worker: int) -> None:
        """The gangs a dispatcher's pass left waiting, nominated or with no worker."""
        self._dispatch_waiting = {"nominated": nominated, "no_worker": no_worker}

    def render(self) -> str:
        """Everything recorded so far, in the Prometheus text exposition format."""
        data = self._reader.get_metrics_data()
        lines: list[str] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    lines.extend(_exposition(metric.name, metric.description or "", metric.data))
        return "\n".join(lines) + "\n"


def _exposition(name: str, help_text: str, data: object) -> list[str]:
    """One family in the text format (0.0.4): its HELP and TYPE lines name the family its
    samples belong to, so a counter's are ``<name>_total`` like its samples (a parser files a
    sample under the family of its own name, and one of another name as untyped)."""
    if isinstance(data, Sum):
        kind, name = ("counter", f"{name}_total") if data.is_monotonic else ("gauge", name)
        points = [(name, p.attributes, p.value) for p in _numbers(data.data_points)]
    elif isinstance(data, Gauge):
        kind, points = "gauge", [(name, p.attributes, p.value) for p in _numbers(data.data_points)]
    elif isinstance(data, Histogram):
        kind, points = (
            "histogram",
            [
                sample
                for p in data.data_points
                if isinstance(p, HistogramDataPoint)
                for sample in _histogram(name, p)
            ],
        )
    else:
        return []
    head = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    return head + [f"{n}{_labels(attrs)} {_number(v)}" for n, attrs, v in points]


def _numbers(points: Iterable[object]) -> list[NumberDataPoint]:
    return [p for p in points if isinstance(p, NumberDataPoint)]


Sample = tuple[str, Mapping[str, Any] | None, float]


def _histogram(name: str, point: HistogramDataPoint) -> list[Sample]:
    out: list[Sample] = []
    running = 0
    for bound, count in zip((*point.explicit_bounds, math.inf), point.bucket_counts, strict=True):
        running += count
        le = "+Inf" if math.isinf(bound) else _number(bound)
        out.append((f"{name}_bucket", {**(point.attributes or {}), "le": le}, float(running)))
    attrs = point.attributes or {}
    out += [(f"{name}_sum", attrs, point.sum), (f"{name}_count", attrs, float(point.count))]
    return out


def _labels(attrs: Mapping[str, Any] | None) -> str:
    if not attrs:
        return ""
    escaped = (
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(attrs.items())
    )
    return "{" + ",".join(escaped) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# ---- traces --------------------------------------------------------------------------

EXPORT_BATCH = 512
EXPORT_DELAY_SECONDS = 5.0
SHUTDOWN_SECONDS = 5.0
"""At exit, how long queued spans may still be sent: a stopping process never waits longer."""
DROP_REASONS = ("queue_full", "export_failed")
_EXPORTER_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class SpanExportStats:
    """Counts of the span export, read by the metrics: exported, dropped by reason, queued."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.exported = 0
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.queued: Callable[[], int] = lambda: 0

    def count_exported(self, spans: int) -> None:
        with self._lock:
            self.exported += spans

    def count_dropped(self, reason: str, spans: int = 1) -> None:
        with self._lock:
            self.dropped[reason] += spans


span_export = SpanExportStats()
"""The process's span export, like the tracer provider it feeds (one per process)."""


class BoundedSpanQueue(SpanProcessor):
    """Ended spans wait in a bounded queue for one background thread that exports them in
    batches. A reconcile only appends under a short lock: when the queue is full the span is
    dropped and counted, so a down or slow collector never blocks or slows reconciling; a
    batch the exporter fails on (after its own retries within its timeout) is counted too."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queued: int,
        stats: SpanExportStats,
        batch: int = EXPORT_BATCH,
        delay_seconds: float = EXPORT_DELAY_SECONDS,
        shutdown_seconds: float = SHUTDOWN_SECONDS,
    ) -> None:
        self._exporter = exporter
        self._max = max_queued
        self._batch = max(1, min(batch, max_queued))
        self._delay = delay_seconds
        self._shutdown_seconds = shutdown_seconds
        self._stats = stats
        self._spans: deque[ReadableSpan] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        stats.queued = lambda: len(self._spans)
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        with self._wake:
            if self._stopping or len(self._spans) >= self._max:
                self._stats.count_dropped("queue_full")
                return
            self._spans.append(span)
            if len(self._spans) >= self._batch:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._stopping and len(self._spans) < self._batch:
                    self._wake.wait(self._delay)
                batch = [self._spans.popleft() for _ in range(min(self._batch, len(self._spans)))]
                done = self._stopping and not self._spans
            if batch:
                self._export(batch)
            if done:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            ok = self._exporter.export(batch) is SpanExportResult.SUCCESS
        except Exception:
            logging.getLogger(__name__).exception("span export failed")
            ok = False
        if ok:
            self._stats.count_exported(len(batch))
        else:
            self._stats.count_dropped("export_failed", len(batch))

    def shutdown(self) -> None:
        """Send what is queued, for at most ``shutdown_seconds``; then stop."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(self._shutdown_seconds)
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        while self._spans and time.monotonic() < deadline:
            with self._wake:
                self._wake.notify()
            time.sleep(0.05)
        return not self._spans


def setup_tracing(
    otlp_endpoint: str | None,
    service_name: str = "gangcheck",
    *,
    env: Mapping[str, str] | None = None,
) -> OtlpTraces | None:
    """Send one span per reconcile over OTLP/HTTP, when configured (``settings.otlp_traces``
    says where, from ``tracing.otlpEndpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables).

    The OTLP exporter is an optional package (`opentelemetry-exporter-otlp-proto-http`);
    asking for traces without it stops startup with that name, rather than tracing nothing.
    """
    target = otlp_traces(
        TracingSettings(otlp_endpoint=otlp_endpoint, service_name=service_name),
        os.environ if env is None else env,
    )
    if target is None:
        return None
    try:
        exporter_module = importlib.import_module(_EXPORTER_MODULE)
    except ImportError as e:
        raise RuntimeError(
            f"traces are configured ({target.source}) but {_EXPORTER_PACKAGE} is not installed"
        ) from e
    exporter = exporter_module.OTLPSpanExporter(
        endpoint=target.endpoint, headers=dict(target.headers), timeout=target.timeout_seconds
    )
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(
        BoundedSpanQueue(
            exporter,
            max_queued=target.queue_size,
            delay_seconds=target.delay_seconds,
            stats=span_export,
        )
    )
    trace.set_tracer_provider(provider)
    logging.getLogger(__name__).info(
        "sending traces to %s (from %s)", target.endpoint, target.source
    )
    return target


tracer = trace.get_tracer("gangcheck")


def reconcile_span(
    controller: str, key: str, *, kind: str = "", namespace: str = "", name: str = ""
) -> AbstractContextManager[Span]:
    """The span of one reconcile: which controller, which object. Exceptions are recorded on
    it (and set its status to error) as they leave it."""
    attributes: dict[str, str] = {"gangcheck.controller": controller, "gangcheck.key": key}
    for attribute, value in (
        ("k8s.object.kind", kind),
        ("k8s.namespace.name", namespace),
        ("k8s.object.name", name),
    ):
        if value:
            attributes[attribute] = value
    return tracer.start_as_current_span(f"reconcile {controller}", attributes=attributes)


@contextmanager
def api_call(method: str, path: str) -> Iterator[Callable[[int], None]]:
    """A child span for one API request made inside a reconcile (none outside one: the
    informers' lists would only add noise). Yields a function that records the status."""
    if not trace.get_current_span().is_recording():
        yield lambda _status: None
        return
    attributes = {"http.request.method": method, "url.path": path}
    with tracer.start_as_current_span(
        f"kube {method}", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield lambda status: span.set_attribute("http.response.status_code", status)


Snap = TypeVar("Snap", Snapshot, GroupSnapshot)
Made = TypeVar("Made", Decision, GroupDecision)
_CHECK_OUTCOMES = {"Pending": "wait", "Ready": "ready", "Retry": "retry", "Rejected": "reject"}
_GROUP_OUTCOMES = {
    pg.WAITING: "wait",
    pg.PROVISIONING: "wait",
    pg.BLOCKED: "wait",
    pg.RELEASED: "ready",
    pg.NOT_A_GANG: "ready",
    pg.BACKING_OFF: "retry",
    pg.FAILED: "reject",
    pg.GAVE_UP: "reject",
}


def traced_decision(decide: Callable[[Snap, datetime], Made], snap: Snap, now: datetime) -> Made:
    """``decide(snap, now)`` in a child span ("decide", whose duration is the decision's,
    the fit of the gang on the nodes included); its outcome (wait, ready, rollback, retry,
    reject, none), reason, check and attempt set on that span and on the reconcile's."""
    reconcile = trace.get_current_span()
    if not reconcile.is_recording():  # tracing off, or no reconcile span: just decide
        return decide(snap, now)
    with tracer.start_as_current_span("decide") as span:
        decision = decide(snap, now)
        if isinstance(snap, Snapshot) and isinstance(decision, Decision):
            attributes = _check_outcome(snap, decision)
        elif isinstance(snap, GroupSnapshot) and isinstance(decision, GroupDecision):
            attributes = _group_outcome(snap, decision)
        else:  # pragma: no cover - the type variables pair them
            attributes = {}
        span.set_attributes(attributes)
    # A reconcile may decide more than once (again on its own writes): it is known by its
    # first decision, or by a later one that changed the check or group, not by one that only
    # carried on what an earlier one began.
    said = getattr(reconcile, "attributes", None) or {}
    if _CHANGED not in said or attributes.get(_CHANGED):
        reconcile.set_attributes(attributes)
    return decision


_CHANGED = "gangcheck.decision.changed"


def _check_outcome(snap: Snapshot, decision: Decision) -> dict[str, AttributeValue]:
    before = snap.workload.checks.get(snap.check)
    after = decision.check or before
    outcome = _CHECK_OUTCOMES.get(after.state, "none") if after else "none"
    reason = after.message if after else ""
    rolling_back = _rollback_reason(decision.actions, decision.events)
    if rolling_back is not None and outcome in ("wait", "ready"):
        outcome, reason = "rollback", rolling_back
    return {
        "gangcheck.check": snap.check,
        "gangcheck.attempt": (before.retry_count if before else 0) + 1,
        "gangcheck.decision.outcome": outcome,
        "gangcheck.decision.reason": reason[:MAX_REASON],
        _CHANGED: decision.check is not None,
        "gangcheck.decision.actions": len(decision.actions) + len(decision.after),
    }


def _group_outcome(snap: GroupSnapshot, decision: GroupDecision) -> dict[str, AttributeValue]:
    annotations = {**snap.group.annotations, **(decision.status or {})}
    state = annotations.get(STATE_ANNOTATION, "")
    outcome = _GROUP_OUTCOMES.get(state, "none")
    reason = annotations.get(MESSAGE_ANNOTATION, "")
    rolling_back = _rollback_reason(decision.actions, decision.events)
    if rolling_back is not None and outcome in ("wait", "ready"):
        outcome, reason = "rollback", rolling_back
    return {
        "gangcheck.attempt": pg.attempt_of(snap.group),
        "gangcheck.decision.outcome": outcome,
        "gangcheck.decision.reason": reason[:MAX_REASON],
        _CHANGED: decision.status is not None,
        "gangcheck.decision.actions": len(decision.actions) + len(decision.after),
    }


MAX_REASON = 1024


def _rollback_reason(actions: Iterable[object], events: Iterable[Event]) -> str | None:
    """Why the decision rolls an attempt back (starts it, or reclaims its nodes), if it does."""
    started = next((e.message for e in events if e.reason == "RollbackStarted"), None)
    if started is not None:
        return started
    if any(isinstance(a, ReclaimArrivals) for a in actions):
        return "reclaiming the nodes that arrived for the attempt"
    return None
