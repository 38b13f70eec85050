"""What gangcheck in a cluster publishes of its capacity sources' outcomes, and how it is read
back: a condition on each of its AdmissionChecks (``CONDITION``) whose message lists, per
resource flavors and capacity source, the latest outcome of an attempt there (delivered the
whole gang, or could not deliver) and when. gangcheck's dispatcher in a MultiKueue manager
reads it through the worker's kubeconfig (it lists the worker's AdmissionChecks already) to
rank a worker whose source stocked out lately for a gang's flavors after one whose did not,
before its first try there: a worker's own gangs, a gang withdrawn there long since, and a
dispatcher restarted since all count, where the requests gangcheck deletes would not.

The status of an AdmissionCheck is written by its controller alone (Kueue reads its
``Active``), and gangcheck's writes there are only of its own checks (its
ValidatingAdmissionPolicy): no tenant can put a stockout on it. Pure; a leaf."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from gangcheck.logic.timefmt import format_time, parse_time

CONDITION = "gangcheck.io/CapacitySourcesStockedOut"
"""The condition's type: True while some source's latest outcome for some flavors is a
stockout; its message the outcomes (``message_of``)."""
STOCKED_OUT, DELIVERING, NONE_YET = "StockedOut", "Delivering", "NoOutcomeYet"
KEEP_SECONDS = 1800.0
"""An outcome older than this is no longer published, nor counted by a reader."""
REFRESH_SECONDS = 300.0
"""A source's outcome unchanged is written again (its time moved on) at most this often: a
burst of deliveries makes one write, not one per gang."""
AT_MOST = 64
"""The outcomes published at most (the newest): the message stays a few KB."""
MESSAGE_MAX = 32768
"""A condition's message, at most (metav1.Condition)."""


class Outcome(StrEnum):
    """How an attempt at a capacity source ended."""

    DELIVERED = "Delivered"
    STOCKOUT = "Stockout"


#: The causes of a rollback (``records.RollbackCause``) that say the source could not deliver
#: (its deadline passed, it failed, it said it cannot find the capacity); the others (a race
#: lost, the gang gone, the config changed, a start deadline, stray pods, a booking expired
#: before admission) say nothing of the source's room.
STOCKOUT_CAUSES = frozenset({"Deadline", "Failed", "CapacityIsNotFound"})


@dataclass(frozen=True, order=True)
class Seen:
    """The latest outcome of one capacity source for gangs of some resource flavors."""

    flavors: tuple[str, ...]
    """The names of the resource flavors the gang's quota reservation assigned, sorted."""
    source: str
    """The capacity source's name in the check's config."""
    outcome: Outcome
    at: datetime

    @property
    def key(self) -> tuple[tuple[str, ...], str]:
        return (self.flavors, self.source)


def seen(
    flavors: Iterable[str], source: str, outcome: str, cause: str, at: datetime
) -> Seen | None:
    """An attempt's outcome as ``driver.SourceNote`` says it (``outcome`` delivered, failed,
    ``cause`` the rollback's, or refused: the source says it cannot find the capacity while
    the attempt waits on it), for a gang assigned ``flavors``; None for one that says
    nothing of the source's room (asked, a failure of another cause) or a gang with no
    flavors known."""
    names = tuple(sorted({str(f) for f in flavors}))
    if not names:
        return None
    if outcome == "delivered":
        return Seen(names, source, Outcome.DELIVERED, at)
    if outcome == "refused" or (outcome == "failed" and cause in STOCKOUT_CAUSES):
        return Seen(names, source, Outcome.STOCKOUT, at)
    return None


def merged(published: Sequence[Seen], noted: Iterable[Seen], now: datetime) -> tuple[Seen, ...]:
    """The outcomes to publish: per flavors and source, the latest of those published and
    those noted since, none older than ``KEEP_SECONDS``, the ``AT_MOST`` newest, sorted. A
    time after ``now`` (written by hand, or by a clock ahead since set back) is taken as
    ``now``: it would otherwise outrank every outcome to come, and never age."""
    latest: dict[tuple[tuple[str, ...], str], Seen] = {}
    for given in (*published, *noted):
        one = replace(given, at=now) if given.at > now else given
        held = latest.get(one.key)
        if held is None or one.at >= held.at:
            latest[one.key] = one
    cutoff = now - timedelta(seconds=KEEP_SECONDS)
    kept = sorted((s for s in latest.values() if s.at >= cutoff), key=lambda s: s.at)
    return tuple(sorted(kept[-AT_MOST:]))


def due(published: Sequence[Seen], wanted: Sequence[Seen]) -> bool:
    """Whether ``wanted`` is worth a write over what is ``published``: an outcome new or
    changed for some flavors and source, one dropped, one unchanged whose time moved on by
    ``REFRESH_SECONDS`` or more, or one whose time was in the future (``merged``)."""
    before = {s.key: s for s in published}
    if set(before) != {s.key for s in wanted}:
        return True
    for one in wanted:
        held = before[one.key]
        if held.outcome is not one.outcome or one.at < held.at:
            return True
        if (one.at - held.at).total_seconds() >= REFRESH_SECONDS:
            return True
    return False


def message_of(outcomes: Sequence[Seen]) -> str:
    """The condition's message: the outcomes as JSON, the oldest left out while it is too
    long."""
    kept = sorted(outcomes, key=lambda s: s.at, reverse=True)
    while True:
        rows = [
            {
                "flavors": list(s.flavors),
                "source": s.source,
                "outcome": str(s.outcome),
                "at": format_time(s.at),
            }
            for s in sorted(kept)
        ]
        text = json.dumps(rows, sort_keys=True, separators=(",", ":"))
        if len(text) <= MESSAGE_MAX or not kept:
            return text
        kept.pop()  # the oldest


def condition(
    outcomes: Sequence[Seen], previous: Mapping[str, object] | None, now: datetime, generation: int
) -> dict[str, object]:
    """The condition saying ``outcomes`` (its transition time kept while its status is)."""
    stocked_out = any(s.outcome is Outcome.STOCKOUT for s in outcomes)
    status = "True" if stocked_out else "False"
    reason = STOCKED_OUT if stocked_out else (DELIVERING if outcomes else NONE_YET)
    since = format_time(now)
    if previous is not None and previous.get("status") == status:
        since = str(previous.get("lastTransitionTime") or since)
    return {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message_of(outcomes),
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def of_condition(cond: Mapping[str, object] | None) -> tuple[Seen, ...]:
    """The outcomes a condition of ``CONDITION`` lists; what cannot be read is left out (a
    message cut, written by hand, or by a later version)."""
    if not cond:
        return ()
    try:
        rows = json.loads(str(cond.get("message") or ""))
    except ValueError:
        return ()
    out = []
    for row in rows if isinstance(rows, list) else []:
        one = _row(row)
        if one is not None:
            out.append(one)
    return tuple(out)


def _row(row: object) -> Seen | None:
    if not isinstance(row, Mapping):
        return None
    flavors, source, at = row.get("flavors"), row.get("source"), row.get("at")
    try:
        outcome = Outcome(str(row.get("outcome")))
    except ValueError:
        return None
    when = parse_time(at) if isinstance(at, str) else None
    if not isinstance(flavors, list) or not flavors or not isinstance(source, str) or when is None:
        return None
    return Seen(tuple(sorted(str(f) for f in flavors)), source, outcome, when)


def on_check(check: Mapping[str, object]) -> tuple[Seen, ...]:
    """The outcomes an AdmissionCheck publishes (none: no such condition)."""
    status = check.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == CONDITION:
            return of_condition(cond)
    return ()


def same_but_outcomes(old: Mapping[str, object], new: Mapping[str, object]) -> bool:
    """Whether an AdmissionCheck changed in nothing but the outcomes published on it: its
    spec and its other conditions as they were (what a Workload's decision reads of it)."""
    return _without(old) == _without(new)


def _without(check: Mapping[str, object]) -> tuple[object, list[object]]:
    status = check.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    others = [
        c
        for c in (conditions if isinstance(conditions, list) else [])
        if not (isinstance(c, Mapping) and c.get("type") == CONDITION)
    ]
    return (check.get("spec"), others)
