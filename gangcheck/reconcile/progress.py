"""Which check writes may wait: a progress message, not a new state.

A Pending check's message says what gangcheck did or waits for. While an attempt moves it
changes often (request created, accepted, provisioned, 2 of 4 members placeable, ...), and
with a fast autoscaler the check turns Ready a moment after the request was made. A write
that changes only the message is held for up to ``PROGRESS_DELAY_SECONDS`` and then made
with whatever the message is by then; a write that changes anything else (the state, the
podSetUpdates, the retry count, the requeue time) is made at once, with the latest message,
and replaces the held one. So a message lags by at most the delay, a state never does, and
a gang that turns Ready within the delay costs one Workload write instead of two.

Nothing durable is held: the message is for people (the decision never reads it back), and
after a restart the next reconcile computes it again.
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
    """When each held message-only write falls due, by Workload key and check."""

    def __init__(self, delay: float = PROGRESS_DELAY_SECONDS) -> None:
        self._delay = timedelta(seconds=delay)
        self._due: dict[str, dict[str, datetime]] = {}

    def hold(
        self, key: str, check: str, before: CheckState | None, after: CheckState, now: datetime
    ) -> float | None:
        """Seconds to wait before writing `after`, or None: write it now."""
        if not progress_only(before, after):
            self.forget(key, check)
            return None
        due = self._due.setdefault(key, {}).setdefault(check, now + self._delay)
        if now >= due:
            self.forget(key, check)
            return None
        return (due - now).total_seconds()

    def forget(self, key: str, check: str | None = None) -> None:
        """Nothing held for this check (or for any check of the Workload) any more."""
        held = self._due.get(key)
        if held is None:
            return
        if check is not None:
            held.pop(check, None)
        if check is None or not held:
            del self._due[key]

    def __len__(self) -> int:
        return sum(len(held) for held in self._due.values())
