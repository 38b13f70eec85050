"""Kubernetes timestamps (RFC 3339, seconds, UTC) to and from datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(when: datetime) -> str:
    """RFC 3339 in UTC to the microsecond (a Lease's MicroTime; a request's asked-at)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(raw: str) -> datetime | None:
    """Parse an RFC 3339 timestamp; None when it is empty or malformed."""
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
