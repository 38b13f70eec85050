"""Which status writes may wait: a progress message, not a new state.

A Pending check's message (or a PodGroup's message annotation) says what gangcheck did or
waits for. While an attempt moves it changes often (request created, accepted, provisioned,
2 of 4 members placeable, ...), and with a fast autoscaler the gang is ready a moment after
the request was made. A write that changes only the message is held for up to
``PROGRESS_DELAY_SECONDS`` and then made with whatever the message is by then; a write that
changes anything else (the state, the podSetUpdates, the retry count, the requeue time, the
request named) is made at once, with the latest message, and replaces the held one. So a
message lags by at most the delay, a state never does, and a gang that is ready within the
delay costs one status write instead of two.

Nothing durable is held: the message is for people (no decision reads it back), and after a
restart the next reconcile computes it again.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from gangcheck.model.objects import CheckState

PROGRESS_DELAY_SECONDS = 3.0


def progress_only(before: CheckState | None, after: CheckState) -> bool:
    """`after` differs from `before` in its message and nothing else."""
    return (
        before is not None
        and before.message != after.message
        and replace(after, message=before.message) == before
    )


class HeldMessages:
    """When each held message-only write falls due, by object key and slot (a Workload's
    check; a PodGroup has one)."""

    def __init__(self, delay: float = PROGRESS_DELAY_SECONDS) -> None:
        self._delay = timedelta(seconds=delay)
        self._due: dict[str, dict[str, datetime]] = {}

    def hold(self, key: str, slot: str, *, message_only: bool, now: datetime) -> float | None:
        """Seconds to wait before making a write that changes the message alone (or not),
        or None: write it now."""
        if not message_only:
            self.forget(key, slot)
            return None
        due = self._due.setdefault(key, {}).setdefault(slot, now + self._delay)
        if now >= due:
            self.forget(key, slot)
            return None
        return (due - now).total_seconds()

    def forget(self, key: str, slot: str | None = None) -> None:
        """Nothing held for this slot (or for any slot of the object) any more."""
        held = self._due.get(key)
        if held is None:
            return
        if slot is not None:
            held.pop(slot, None)
        if slot is None or not held:
            del self._due[key]

    def __len__(self) -> int:
        return sum(len(held) for held in self._due.values())
