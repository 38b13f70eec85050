"""A PodGroup's earlier attempts, as its Events tell: what a Workload's diagnosis says of its
own (``diagnosis.earlier_attempts``), in the same terms (``Ended``, said by ``turn_line``).

A Workload's attempt ends as its check turns Retry or Rejected (Kueue's
AdmissionCheckUpdated Event keeps why); a PodGroup has no check, and its attempt ends as the
rollback of its request is done: gangcheck's RolledBack Event on the group says which request,
why, and what it reclaimed or kept. The group's annotations keep only the attempt it stands in
(and, while it backs off, the last one's end, in its message). Pure; here rather than beside
the group's diagnosis since it reads a Workload's terms, and the two gang sources' logic does
not import each other.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime

from gangcheck.logic.attempt import rollback
from gangcheck.logic.attempt.records import kept_restated
from gangcheck.logic.workloads.diagnosis import Ended, attempt_named, event_time
from gangcheck.model.objects import Obj
from gangcheck.model.podgroups import PodGroup

ROLLED_BACK = rollback.rolled_back(rollback.RolledBack("", "")).reason
"""The reason of the Event on the group each time a rollback of one of its requests is done
(``rollback.rolled_back``'s)."""

_EPOCH = datetime.fromtimestamp(0, UTC)


def group_attempts(
    events: Sequence[Obj], group: PodGroup, attempt: int, message: str, exists: Collection[str]
) -> tuple[Ended, ...]:
    """The rollbacks done of the requests of the group's attempts before `attempt` (the one
    it stands in), from its Events, oldest first, each message as it reads now (a node a
    rollback kept, gone since, said gone: `kept_restated`, as `exists` says) with the attempt
    its request was made for. One attempt may have more than one (a place that could not
    deliver and the next asked in the same attempt; a race's racers). Not the one the
    group's `message` (as it reads now) says already (the last attempt's, while it backs
    off), nor a growth's (said with the growth); none when no Event is left (Events expire)."""
    found = []
    for event in events:
        if event.get("reason") != ROLLED_BACK:
            continue
        said = str(event.get("message") or "")
        ended = attempt_named(said, group.ref.name, group.short)
        if ended is None or ended >= attempt:
            continue
        now_said = kept_restated(said, exists)
        if now_said and now_said in message:
            continue
        found.append(Ended(ROLLED_BACK, now_said, event_time(event), ended))
    return tuple(sorted(found, key=lambda t: (t.attempt or 0, t.at or _EPOCH)))
