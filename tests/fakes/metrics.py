"""Attempt metrics, recorded as calls for a test to read (an `AttemptMetrics`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RecordedMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def attempt(self, outcome: str) -> None:
        self.calls.append(("attempt", (outcome,)))

    def rollback(self, reason: str) -> None:
        self.calls.append(("rollback", (reason,)))

    def reclaimed(self, nodes: int, node_seconds: int) -> None:
        self.calls.append(("reclaimed", (nodes, node_seconds)))

    def reclaim_failed(self, error: str) -> None:
        self.calls.append(("reclaim_failed", (error,)))

    def reclaimed_not_removed(self) -> None:
        self.calls.append(("reclaimed_not_removed", ()))

    def capacity_used(self, used: Mapping[str, int]) -> None:
        self.calls.append(("capacity_used", (dict(used),)))

    def quota_to_ready(self, seconds: float) -> None:
        self.calls.append(("quota_to_ready", (seconds,)))

    def provisioned_to_fit(self, seconds: float) -> None:
        self.calls.append(("provisioned_to_fit", (seconds,)))

    def source(self, source: str, outcome: str, reason: str, seconds: float) -> None:
        self.calls.append(("source", (source, outcome, reason, seconds)))
