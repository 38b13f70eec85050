"""Logs as JSON lines carrying the object reference; metrics through the OpenTelemetry SDK,
exposed in the Prometheus text format; traces (one span per reconcile) when configured."""

from __future__ import annotations

import importlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
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
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and every `extra` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
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


class Metrics:
    """The controller's metrics (DESIGN.md §5), recorded through one OpenTelemetry meter."""

    def __init__(self, *, in_flight: Callable[[], int] = lambda: 0) -> None:
        self._reader = InMemoryMetricReader()
        seconds = View(
            instrument_type=HistogramInstrument,
            aggregation=ExplicitBucketHistogramAggregation(SECONDS_BUCKETS),
        )
        self.provider = MeterProvider(metric_readers=[self._reader], views=[seconds])
        meter = self.provider.get_meter("gangcheck")
        self._attempts = meter.create_counter(
            "gangcheck_attempts", description="Check state changes by outcome"
        )
        self._rollbacks = meter.create_counter(
            "gangcheck_rollbacks", description="Rollbacks by reason"
        )
        self._reclaimed = meter.create_counter(
            "gangcheck_nodes_reclaimed", description="Nodes reclaimed after rollbacks"
        )
        self._reclaim_failures = meter.create_counter(
            "gangcheck_reclaim_failures",
            description="Reclaims that failed with an error and will be retried, by error",
        )
        self._stranded = meter.create_counter(
            "gangcheck_stranded_node_seconds",
            description="Node time held by gangs that did not start",
        )
        self._api_errors = meter.create_counter(
            "gangcheck_api_errors", description="API errors by status code"
        )
        self._to_ready = meter.create_histogram(
            "gangcheck_quota_to_ready_seconds", description="Quota reserved to check Ready"
        )
        self._to_fit = meter.create_histogram(
            "gangcheck_provisioned_to_fit_seconds",
            description="Provisioned=True to the whole gang fitting on nodes",
        )
        self._members = meter.create_counter(
            "gangcheck_gang_members",
            description=(
                "Members of gangs made ready, by the capacity they use: reserved (placed on "
                "reservation-backed nodes), existing (other nodes that were there), new "
                "(asked for)"
            ),
        )
        self._gated = meter.create_counter(
            "gangcheck_webhook_gated_pods", description="PodGroup members gated at creation"
        )
        self._webhook_errors = meter.create_counter(
            "gangcheck_webhook_errors", description="Admission reviews the webhook could not serve"
        )
        self._reconcile = meter.create_histogram(
            "gangcheck_reconcile_duration_seconds", description="Reconcile latency"
        )

        def observe(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(in_flight())

        meter.create_observable_gauge(
            "gangcheck_inflight_gangs", callbacks=[observe], description="Gangs with a request"
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

    def capacity_used(self, used: Mapping[str, int]) -> None:
        for capacity, members in used.items():
            self._members.add(members, {"capacity": capacity})

    def pod_gated(self, api_group: str) -> None:
        self._gated.add(1, {"api_group": api_group})

    def webhook_error(self, reason: str) -> None:
        self._webhook_errors.add(1, {"reason": reason})

    def api_error(self, status: int) -> None:
        self._api_errors.add(1, {"code": str(status)})

    def quota_to_ready(self, seconds: float) -> None:
        self._to_ready.record(seconds)

    def provisioned_to_fit(self, seconds: float) -> None:
        self._to_fit.record(seconds)

    def reconciled(self, controller: str, seconds: float) -> None:
        self._reconcile.record(seconds, {"controller": controller})

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
    if isinstance(data, Sum):
        kind, suffix = ("counter", "_total") if data.is_monotonic else ("gauge", "")
        points = [(f"{name}{suffix}", p.attributes, p.value) for p in _numbers(data.data_points)]
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


def setup_tracing(otlp_endpoint: str | None, service_name: str = "gangcheck") -> None:
    """Send one span per reconcile to an OTLP endpoint, if one is configured.

    The OTLP exporter is an optional package (`opentelemetry-exporter-otlp-proto-http`);
    asking for traces without it stops startup with that name, rather than tracing nothing.
    """
    if not otlp_endpoint:
        return
    try:
        exporter_module = importlib.import_module(
            "opentelemetry.exporter.otlp.proto.http.trace_exporter"
        )
    except ImportError as e:
        raise RuntimeError(
            "tracing.otlpEndpoint is set but opentelemetry-exporter-otlp-proto-http "
            "is not installed"
        ) from e
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = exporter_module.OTLPSpanExporter(endpoint=otlp_endpoint)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


tracer = trace.get_tracer("gangcheck")
