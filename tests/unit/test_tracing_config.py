"""Where traces go: ``tracing.otlpEndpoint`` and the standard OTEL_EXPORTER_OTLP_* variables
resolved to one OTLP/HTTP traces URL (pure), and the bounded span queue in front of the
exporter (a fake exporter stands in for the network: the real collector is in
tests/integration/test_tracing.py)."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gangcheck import cli
from gangcheck.settings import SettingsError, TracingSettings, load_settings, otlp_traces
from gangcheck.telemetry import BoundedSpanQueue, Metrics, SpanExportStats, setup_tracing

BASE = "http://otel-collector.observability:4318"


@pytest.mark.parametrize(
    ("setting", "env", "endpoint", "source"),
    [
        pytest.param(BASE, {}, f"{BASE}/v1/traces", "tracing.otlpEndpoint",
                     id="the documented base address gets the traces path appended"),
        pytest.param(f"{BASE}/", {}, f"{BASE}/v1/traces", "tracing.otlpEndpoint",
                     id="a trailing slash on the base address is not doubled"),
        pytest.param(f"{BASE}/v1/traces", {}, f"{BASE}/v1/traces", "tracing.otlpEndpoint",
                     id="a full traces URL in the setting is kept as it is"),
        pytest.param("https://gw.example/otlp", {}, "https://gw.example/otlp/v1/traces",
                     "tracing.otlpEndpoint", id="a base address with a path keeps its path"),
        pytest.param(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE}, f"{BASE}/v1/traces",
                     "OTEL_EXPORTER_OTLP_ENDPOINT",
                     id="the generic variable is a base: the traces path is appended"),
        pytest.param(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"},
                     "http://c:4318/custom", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                     id="the traces variable is used exactly as it is"),
        pytest.param(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
                            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/v1/traces"},
                     "http://traces:4318/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                     id="the traces variable wins over the generic one"),
        pytest.param(BASE, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://other:4318/v1/traces"},
                     f"{BASE}/v1/traces", "tracing.otlpEndpoint",
                     id="gangcheck's own setting wins over the variables"),
        pytest.param(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, None, None,
                     id="an empty variable is unset: no traces"),
        pytest.param(None, {}, None, None, id="nothing configured: no traces"),
        pytest.param(BASE, {"OTEL_SDK_DISABLED": "true"}, None, None,
                     id="OTEL_SDK_DISABLED turns traces off"),
    ],
)  # fmt: skip
def test_the_traces_url_is_resolved_as_the_otel_specification_says(
    setting: str | None, env: dict[str, str], endpoint: str | None, source: str | None
) -> None:
    target = otlp_traces(TracingSettings(otlp_endpoint=setting), env)
    if endpoint is None:
        assert target is None
        return
    assert target is not None
    assert (target.endpoint, target.source) == (endpoint, source)


def test_headers_timeout_and_queue_come_from_the_variables() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": BASE,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-generic=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20abc, x-tenant = gpu",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_BSP_MAX_QUEUE_SIZE": "64",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    target = otlp_traces(TracingSettings(), env)
    assert target is not None
    assert dict(target.headers) == {"authorization": "Bearer abc", "x-tenant": "gpu"}
    assert target.timeout_seconds == 2.5  # milliseconds, as the specification says
    assert (target.queue_size, target.delay_seconds) == (64, 0.2)
    defaults = otlp_traces(TracingSettings(otlp_endpoint=BASE), {})
    assert defaults is not None
    assert (defaults.timeout_seconds, defaults.queue_size, dict(defaults.headers)) == (10, 2048, {})


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        pytest.param("tracing:\n  otlpEndpoint: otel-collector:4318\n", {},
                     "tracing.otlpEndpoint: must be an http:// or https:// URL",
                     id="an endpoint without a scheme is refused naming the field"),
        pytest.param("tracing:\n  otlpEndpoint: grpc://otel-collector:4317\n", {},
                     "tracing.otlpEndpoint: must be an http:// or https:// URL",
                     id="a scheme other than http or https is refused naming the field"),
        pytest.param("tracing:\n  otlpEndpoint: 'http://'\n", {},
                     "tracing.otlpEndpoint: must be an http:// or https:// URL with a host",
                     id="a URL without a host is refused"),
        pytest.param("tracing:\n  otlpEndpoint: 'http://collector:99999'\n", {},
                     "tracing.otlpEndpoint: must be an http:// or https:// URL",
                     id="a port out of range is refused"),
        pytest.param("", {"GANGCHECK_TRACING__OTLP_ENDPOINT": "collector"},
                     "(from GANGCHECK_TRACING__OTLP_ENDPOINT)",
                     id="a bad endpoint from gangcheck's variable names the variable"),
        pytest.param("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4318"},
                     "OTEL_EXPORTER_OTLP_ENDPOINT: must be an http:// or https:// URL",
                     id="a bad generic variable is refused naming it"),
        pytest.param("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "unix:///run/otel.sock"},
                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: must be an http:// or https:// URL",
                     id="a bad traces variable is refused naming it"),
        pytest.param("", {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE,
                          "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"},
                     "OTEL_EXPORTER_OTLP_TIMEOUT: expected a positive number",
                     id="a timeout that is not a number of milliseconds is refused"),
        pytest.param("", {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE,
                          "OTEL_EXPORTER_OTLP_HEADERS": "novalue"},
                     "OTEL_EXPORTER_OTLP_HEADERS: expected key=value pairs",
                     id="headers that are not key=value pairs are refused"),
        pytest.param("", {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE,
                          "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
                     "OTEL_EXPORTER_OTLP_PROTOCOL: gangcheck exports over OTLP/HTTP",
                     id="the grpc protocol is refused rather than sent to the wrong port"),
    ],
)  # fmt: skip
def test_a_bad_trace_endpoint_is_refused_at_start_naming_the_field(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    path = tmp_path / "gangcheck.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as raised:
        load_settings(path, env)
    assert message in str(raised.value)


class SlowExporter(SpanExporter):
    """Answers only when released, like a collector that accepts and never replies."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.release = threading.Event()
        self.batches: list[int] = []
        self.result = result

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        self.batches.append(len(spans))
        return self.result

    def shutdown(self) -> None:
        self.release.set()


def _spans(processor: BoundedSpanQueue, count: int) -> float:
    """End ``count`` spans through the processor; the seconds it took."""
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("test")
    started = time.monotonic()
    for i in range(count):
        span = tracer.start_span(f"s{i}")
        span.end()
        processor.on_end(span)  # type: ignore[arg-type]
    return time.monotonic() - started


def test_a_stuck_exporter_never_blocks_and_the_overflow_is_dropped_and_counted() -> None:
    stats, exporter = SpanExportStats(), SlowExporter()
    queue = BoundedSpanQueue(
        exporter, max_queued=8, stats=stats, batch=4, delay_seconds=0.01, shutdown_seconds=1
    )
    took = _spans(queue, 4)  # the first batch is taken by the exporter, which hangs
    deadline = time.monotonic() + 5
    while stats.queued() and time.monotonic() < deadline:
        time.sleep(0.01)
    took += _spans(queue, 20)
    assert took < 1.0, f"ending spans took {took:.2f}s with the exporter stuck"
    assert stats.queued() == 8
    assert stats.dropped["queue_full"] == 12
    exporter.release.set()
    queue.shutdown()
    assert stats.exported == 12 == sum(exporter.batches)
    rendered = Metrics(spans=stats).render()
    assert 'gangcheck_trace_spans_dropped_total{reason="queue_full"} 12' in rendered
    assert "gangcheck_trace_spans_exported_total 12" in rendered


def test_a_failed_export_is_counted_as_dropped() -> None:
    stats, exporter = SpanExportStats(), SlowExporter(SpanExportResult.FAILURE)
    exporter.release.set()
    queue = BoundedSpanQueue(exporter, max_queued=8, stats=stats, batch=2, delay_seconds=0.01)
    _spans(queue, 3)
    queue.shutdown()
    assert stats.dropped == {"queue_full": 0, "export_failed": 3}
    assert stats.exported == 0


def test_traces_asked_for_without_the_exporter_package_stop_startup_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = importlib.import_module

    def without_exporter(name: str, package: str | None = None) -> object:
        if name.startswith("opentelemetry.exporter.otlp"):
            raise ImportError(name)
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", without_exporter)
    with pytest.raises(RuntimeError, match="opentelemetry-exporter-otlp-proto-http"):
        setup_tracing(None, env={"OTEL_EXPORTER_OTLP_ENDPOINT": BASE})


def test_gangcheck_run_refuses_a_bad_otel_endpoint_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "grpc://otel-collector:4317")
    assert cli.main(["run", "--kubeconfig", "no-such-kubeconfig"]) == 2
    assert "OTEL_EXPORTER_OTLP_ENDPOINT: must be an http:// or https:// URL" in (
        capsys.readouterr().err
    )


def test_a_reconcile_deciding_again_is_known_by_its_first_decision_or_one_that_changed() -> None:
    """A reconcile decides again on its own writes: its span keeps the first decision's
    outcome unless a later decision changed the check (the Ready written on the second pass)."""
    from datetime import UTC, datetime

    from opentelemetry import trace

    from gangcheck import telemetry
    from gangcheck.logic.workloads.admission import Decision, Snapshot
    from gangcheck.model.objects import CheckState, workload_of
    from tests.builders import CHECK, WorkloadBuilder

    snap = Snapshot(
        workload=workload_of(WorkloadBuilder().pod_set("w", 1).reserve_quota().check().build()),
        check=CHECK,
        config=None,
    )
    ready = CheckState(CHECK, "Ready", "the whole gang fits", "2026-11-30T10:00:00Z")
    provider = TracerProvider(shutdown_on_exit=False)
    tracer = provider.get_tracer("test")
    later = Decision(requeue_after=1.0, actions=(object(),))  # type: ignore[arg-type]
    with tracer.start_as_current_span("reconcile workload") as span:
        telemetry.traced_decision(lambda _s, _n: Decision(), snap, datetime.now(UTC))
        first = dict(span.attributes or {})  # type: ignore[attr-defined]
        telemetry.traced_decision(lambda _s, _n: later, snap, datetime.now(UTC))
        assert dict(span.attributes or {}) == first  # type: ignore[attr-defined]
        telemetry.traced_decision(lambda _s, _n: Decision(check=ready), snap, datetime.now(UTC))
        telemetry.traced_decision(lambda _s, _n: later, snap, datetime.now(UTC))
        said = dict(span.attributes or {})  # type: ignore[attr-defined]
    assert said["gangcheck.decision.outcome"] == "ready"
    assert said["gangcheck.decision.changed"] is True
    assert trace.get_current_span() is not span
