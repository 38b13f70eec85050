"""An OpenTelemetry Collector for the tracing tests: built from ``hack/otelcol`` like the
other binaries, run on a free port of 127.0.0.1, every span it receives readable back.

The collector's OTLP/HTTP receiver takes spans at ``endpoint`` (the base address: senders add
``/v1/traces``) and its ``jsonfile`` exporter appends each batch to ``spans.jsonl`` before the
receiver answers, so a span is readable once its export has been acknowledged.
"""

from __future__ import annotations

import json
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gangcheck_dev.testbed.binaries import OTEL_COLLECTOR, ensure_binaries
from gangcheck_dev.testbed.process import Component, free_ports

_CONFIG = """\
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  jsonfile:
    path: {spans}
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jsonfile]
"""


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it: OTLP/JSON flattened to what tests assert on."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    status: str = ""
    """``""`` (unset), ``ok`` or ``error``."""
    status_message: str = ""
    events: tuple[str, ...] = ()
    start_ns: int = 0
    end_ns: int = 0


def binary() -> Path:
    """The collector executable, built first if missing (``hack/build.sh otelcol``)."""
    return ensure_binaries(OTEL_COLLECTOR)["otelcol"] / "otelcol"


class OtelCollector:
    """One collector process; ``start`` and ``stop`` it, read ``spans``."""

    def __init__(self, workdir: Path, executable: Path | None = None) -> None:
        self.workdir = workdir
        self.executable = executable or binary()
        self.port = free_ports(1)[0]
        self.spans_path = workdir / "spans.jsonl"
        config = workdir / "otelcol.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        config.write_text(_CONFIG.format(port=self.port, spans=self.spans_path))
        self._component = Component(
            "otelcol",
            [str(self.executable), "--config", f"file:{config}"],
            workdir / "otelcol.log",
            probe=lambda: _accepts(self.port),
            ready_timeout=30,
        )

    @property
    def endpoint(self) -> str:
        """The base address, as an operator configures it (``/v1/traces`` is added to it)."""
        return f"http://127.0.0.1:{self.port}"

    def version(self) -> str:
        out = subprocess.run(
            [str(self.executable), "--version"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip().rsplit(" ", 1)[-1]

    def start(self) -> None:
        self._component.start()
        self._component.wait_ready()

    def stop(self) -> None:
        self._component.stop()

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order received."""
        try:
            lines = self.spans_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [span for line in lines if line.strip() for span in _flatten(json.loads(line))]

    def __enter__(self) -> OtelCollector:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _flatten(request: dict[str, Any]) -> list[ReceivedSpan]:
    out = []
    for resource_spans in request.get("resourceSpans") or []:
        resource = _attributes((resource_spans.get("resource") or {}).get("attributes"))
        for scope in resource_spans.get("scopeSpans") or []:
            for span in scope.get("spans") or []:
                status = span.get("status") or {}
                out.append(
                    ReceivedSpan(
                        name=span["name"],
                        trace_id=span.get("traceId", ""),
                        span_id=span.get("spanId", ""),
                        parent_id=span.get("parentSpanId", ""),
                        service=str(resource.get("service.name", "")),
                        attributes=_attributes(span.get("attributes")),
                        status={1: "ok", 2: "error"}.get(int(status.get("code", 0)), ""),
                        status_message=status.get("message", ""),
                        events=tuple(e.get("name", "") for e in span.get("events") or []),
                        start_ns=int(span.get("startTimeUnixNano", 0)),
                        end_ns=int(span.get("endTimeUnixNano", 0)),
                    )
                )
    return out


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    """OTLP/JSON key-values as a plain dict (ints arrive as strings in OTLP/JSON)."""
    out: dict[str, Any] = {}
    for item in items or []:
        value = item.get("value") or {}
        if "intValue" in value:
            out[item["key"]] = int(value["intValue"])
        elif value:
            out[item["key"]] = next(iter(value.values()))
    return out
