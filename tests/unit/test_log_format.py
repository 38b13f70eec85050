"""The JSON log line: its time says its time zone and the part of the second."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from gangcheck.telemetry import JsonFormatter


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("gangcheck.test", logging.INFO, __file__, 1, "hello", (), None)
    record.created = created
    return record


def test_ts_is_rfc3339_in_utc_with_the_part_of_the_second() -> None:
    created = datetime(2026, 12, 4, 20, 15, 43, 123456, tzinfo=UTC).timestamp()
    line = json.loads(JsonFormatter().format(_record(created)))
    assert line["ts"] == "2026-12-04T20:15:43.123456+00:00"
    assert datetime.fromisoformat(line["ts"]).timestamp() == created


def test_two_lines_within_one_second_are_ordered_by_ts() -> None:
    formatter = JsonFormatter()
    first, second = (
        json.loads(formatter.format(_record(1_800_000_000 + t)))["ts"] for t in (0.1, 0.2)
    )
    assert first < second
