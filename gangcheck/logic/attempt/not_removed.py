"""When a node CordonAndTaint left for cluster-autoscaler, and still there, is said again.

Time past the bound (``LEFT_FOR_SCALE_DOWN_SECONDS`` after the node's ``reclaimed-at``) is cut
into slots of ``NOT_REMOVED_REPEAT_SECONDS``: slot k begins at reclaimed-at + bound +
k * repeat. The node is said once per slot, by an Event whose name is the slot's own
(``not_removed_slot``): the node's name, ``not-removed-<k>`` and a digest of its uid and its
``reclaimed-at``. Creating it is the test of whether the slot was said: the API server takes
the first create of that name and answers every later one 409 AlreadyExists. So the schedule
lives in the record the node already carries and in the Event itself: a restart, a new
leader or an old leader still finishing its last reconcile says nothing in a slot already
said, and no write is added per node per repeat (an in-memory note of the slot said only
spares a create per node update).

Why slots and names rather than when it was last said, read back from the Events: a read
needs ``list`` on Events, which gangcheck is not granted (``create`` only), and a read then a
create is a race two replicas can both win; a name taken is atomic. The slots come from the
node's record, not from any replica's clock, so two replicas whose clocks differ by d agree
on every slot's name but within d of its start, where the one behind creates the name of
the slot before (taken already: 409) and the one ahead the next slot's a little early: at
most one Event per slot whatever the skew. An unreadable ``reclaimed-at`` (one no release
wrote) has its slots counted from the epoch instead. The Event must outlive its slot for
the name to hold: the API server's ``--event-ttl`` (1 h by default) is longer than a slot
(30 min); a shorter TTL lets a restart late in a slot say it once more.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gangcheck.logic.attempt.naming import event_name
from gangcheck.logic.attempt.reclaim import LEFT_FOR_SCALE_DOWN_SECONDS
from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import RECLAIMED_AT
from gangcheck.model.objects import Obj

NOT_REMOVED_REPEAT_SECONDS = 1800.0
"""A node left for scale-down and still there is said again this often (an Event expires in an
hour: a slot's Event is there for the whole slot); not more often, however often the node
changes or gangcheck restarts."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DIGEST_LENGTH = 10


@dataclass(frozen=True)
class NotRemovedSlot:
    """The slot a node left and still there is in: `index` (0 from the bound on), the name of
    the Event that says it in this slot (`event`), and the seconds until the next one
    begins (`ends_in`: when to look again)."""

    index: int
    event: str
    ends_in: float


def not_removed_slot(
    node: Obj, now: datetime, *, repeat: float = NOT_REMOVED_REPEAT_SECONDS
) -> NotRemovedSlot:
    """The slot of a node overdue (``scale_down_watch``: ``overdue``) at `now`, counted from
    its ``reclaimed-at`` plus the bound (from the epoch if that is unreadable). Its Event's
    name is the same for every replica and every restart within the slot, and another for
    another slot, another record of when it was left, or another node of the same name."""
    meta = node.get("metadata") or {}
    raw = str((meta.get("annotations") or {}).get(RECLAIMED_AT, ""))
    since = parse_time(raw)
    first = since + timedelta(seconds=LEFT_FOR_SCALE_DOWN_SECONDS) if since is not None else EPOCH
    elapsed = (now - first).total_seconds()
    index = max(0, math.floor(elapsed / repeat))
    identity = f"{meta.get('uid', '')}/{raw}".encode()
    digest = hashlib.sha256(identity).hexdigest()[:DIGEST_LENGTH]
    name = event_name(str(meta.get("name", "")), f"not-removed-{index}-{digest}")
    return NotRemovedSlot(index, name, (index + 1) * repeat - elapsed)
