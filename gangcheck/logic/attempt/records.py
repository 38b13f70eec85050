"""What an attempt leaves on its request, read back: the attempt's record (number, deadline,
phase, rollback and its outcome, members, config), parsed once into a typed `Record` (the
arrival ledger on nodes is read by fulfillment.arrived_for). A leaf: imports nothing of
logic/."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from gangcheck.logic.timefmt import parse_time
from gangcheck.model.names import (
    ATTEMPT_ANNOTATION,
    DEADLINE_ANNOTATION,
    FULFILLED,
    GANG_MEMBERS_ANNOTATION,
    KEPT,
    OUTCOME_ANNOTATION,
    PHASE_ANNOTATION,
    RESERVED_ANNOTATION,
    ROLLBACK_NODES_ANNOTATION,
    ROLLBACK_REASON_ANNOTATION,
    ROLLING_BACK,
    SOURCE_ANNOTATION,
    STARTED,
)


@dataclass(frozen=True)
class Outcome:
    """What one rollback did to the nodes that arrived for its request."""

    reclaimed: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    kept: dict[str, str] = field(default_factory=dict)
    """Kept by a safety rule, final: node -> reason."""
    node_seconds: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    """Not reclaimed because of an error, retried with backoff: node -> last error."""

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "reclaimed": list(self.reclaimed),
                "draining": list(self.draining),
                "kept": self.kept,
                "failed": self.failed,
                "nodeSeconds": self.node_seconds,
            },
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, raw: str) -> Outcome:
        try:
            data = json.loads(raw)
            return cls(
                reclaimed=tuple(data.get("reclaimed") or ()),
                draining=tuple(data.get("draining") or ()),
                kept=dict(data.get("kept") or {}),
                node_seconds=int(data.get("nodeSeconds") or 0),
                failed=dict(data.get("failed") or {}),
            )
        except (ValueError, TypeError, AttributeError):
            return cls(kept={UNREADABLE: f"unreadable outcome {raw[:80]!r}"})

    @property
    def settled(self) -> frozenset[str]:
        """The nodes this outcome is done with: reclaimed, draining or kept (not failed)."""
        return frozenset({*self.reclaimed, *self.draining, *self.kept})

    def after(self, earlier: Outcome) -> Outcome:
        """This reclaim's outcome with an earlier one's of the same request (a request kept
        open after its gang went reclaims in several passes: lifecycle.reclaim_promised):
        every node reclaimed by either; draining and kept as the latest says of a node, else
        as the earlier did; the time held of both; the failures of this one."""
        reclaimed = tuple(sorted({*earlier.reclaimed, *self.reclaimed}))
        done = set(reclaimed)
        kept = {**earlier.kept, **self.kept}
        draining = {*earlier.draining, *self.draining} - done - set(kept)
        return Outcome(
            reclaimed,
            tuple(sorted(draining)),
            {n: why for n, why in kept.items() if n not in done},
            earlier.node_seconds + self.node_seconds,
            dict(self.failed),
        )

    def summary(self, gone: Collection[str] = ()) -> str:
        """What the rollback did, in one line (the RolledBack Event's, the check's or the
        group's message). `gone`: nodes that no longer exist; a kept one of them is said kept
        then and gone since (`_kept_parts`), never kept as if it were still there."""
        parts = [
            f"reclaimed {len(self.reclaimed)} node{'s' * (len(self.reclaimed) != 1)}"
            f" ({self.node_seconds / 60:.1f} node-minutes held)"
        ]
        if self.draining:
            parts.append(f"{len(self.draining)} to reclaim once the gang's pods leave")
        parts += _kept_parts(self.kept, gone)
        if self.failed:
            parts.append(f"failed, retrying: {_each(self.failed)}")
        return "; ".join(parts)

    def kept_gone(self, exists: Collection[str]) -> tuple[str, ...]:
        """The nodes it kept that are not among `exists` (the nodes there now)."""
        return tuple(sorted(n for n in self.kept if n != UNREADABLE and n not in exists))


UNREADABLE = "?"
"""The node an unreadable outcome is kept under, with what was read."""


def _kept_parts(kept: Mapping[str, str], gone: Collection[str]) -> list[str]:
    """`kept n1 (why)` for the kept nodes still there; `kept then, gone since: n2 (why)` for
    those that are not (deleted by the autoscaler or by hand since)."""
    there = {n: why for n, why in kept.items() if n not in gone}
    left = {n: why for n, why in kept.items() if n in gone}
    parts = [f"kept {_each(there)}"] if there else []
    return parts + ([f"kept then, gone since: {_each(left)}"] if left else [])


def _each(reasons: Mapping[str, str]) -> str:
    """Every node with its reason: `n1 (why), n2 (why)`."""
    return ", ".join(f"{name} ({why})" for name, why in sorted(reasons.items()))


_KEPT_IN_SUMMARY = re.compile(
    r"reclaimed \d+ nodes? \(\d+\.\d node-minutes held\)"
    r"(?:; \d+ to reclaim once the gang's pods leave)?; (?P<kept>kept )"
)
_NODE_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?(?= \()")


def kept_restated(text: str, exists: Collection[str]) -> str:
    """`text` (a message that quotes rollbacks' `summary`s, written when they were made) with
    each kept node that is not among `exists` said gone, as `summary` says it now; the rest
    as written. A kept part that cannot be read back whole (a reason with unbalanced
    parentheses) is left as written."""
    out, at = [], 0
    for found in _KEPT_IN_SUMMARY.finditer(text):
        start = found.start("kept")
        if start < at:
            continue
        read = _read_kept(text, found.end("kept"))
        if read is None:
            continue
        kept, end = read
        gone = [n for n in kept if n not in exists]
        if gone:
            out += [text[at:start], "; ".join(_kept_parts(kept, gone))]
            at = end
    return "".join([*out, text[at:]])


def _read_kept(text: str, at: int) -> tuple[dict[str, str], int] | None:
    """The `name (why), ...` list `_each` wrote from `at`, and where it ends; None when a
    reason's parentheses do not close."""
    kept: dict[str, str] = {}
    while True:
        name = _NODE_NAME.match(text, at)
        if name is None:
            return None
        open_at = name.end() + 2
        depth, i = 1, open_at
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth:
            return None
        kept[name.group()] = text[open_at : i - 1]
        if not (text.startswith(", ", i) and _NODE_NAME.match(text, i + 2)):
            return kept, i
        at = i + 2


class AttemptPhase(StrEnum):
    """Where an attempt is, as its record says (PHASE_ANNOTATION)."""

    ASKED = ""
    """Asked for and followed: no phase recorded yet."""
    ROLLING_BACK = ROLLING_BACK
    FULFILLED = FULFILLED
    """The gang fits: the request claims and holds back no new node."""
    STARTED = STARTED
    """Every member is scheduled: its nodes are the gang's."""
    KEPT = KEPT
    """The source stopped short: what arrived is kept for the attempt, the next source asked
    for the rest (topup.py). It claims no new node."""


class RollbackCause(StrEnum):
    """Why a rollback began: the word its reason starts with."""

    DEADLINE = "Deadline"
    START_DEADLINE = "StartDeadline"
    FAILED = "Failed"
    REVOKED = "CapacityRevoked"
    EXPIRED = "BookingExpired"
    CONFIG_CHANGED = "ConfigChanged"
    """The config changed under the attempt: the next follows at once, no retry counted."""
    STRAY_PODS = "StrayPods"
    NOT_FOUND = "CapacityIsNotFound"
    """The source said it cannot find the capacity, and another source is next in line."""
    RACE_LOST = "RaceLost"
    """Another capacity source of the race delivered the whole gang first."""
    GANG_GONE = "GangGone"
    """The gang was withdrawn (deleted, finished, evicted, gave up): any other reason."""

    @classmethod
    def of(cls, reason: str) -> RollbackCause:
        word = reason.partition(":")[0]
        return next((c for c in cls if c.value == word), cls.GANG_GONE)


@dataclass(frozen=True)
class Record:
    """gangcheck's record of one attempt, as its request carries it."""

    number: int | None = None
    deadline: datetime | None = None
    phase: AttemptPhase = AttemptPhase.ASKED
    reason: str = ""
    """Why its rollback began ("" when none did)."""
    reserved: int = 0
    gang_members: int | None = None
    raw_nodes: str = ""
    raw_outcome: str = ""
    source: int = 0
    """The capacity source the attempt asks (its index in spec.capacitySources)."""

    @property
    def cause(self) -> RollbackCause | None:
        return RollbackCause.of(self.reason) if self.reason else None

    @property
    def rollback_nodes(self) -> dict[str, str]:
        """The nodes recorded when the rollback began: name -> creationTimestamp."""
        return _nodes_of(self.raw_nodes)

    @property
    def outcome(self) -> Outcome | None:
        """What the rollback did, once recorded."""
        return Outcome.from_annotation(self.raw_outcome) if self.raw_outcome else None

    @property
    def settled(self) -> bool:
        """Fulfilled or started: its nodes are the gang's, nothing of it is to reclaim."""
        return self.phase in (AttemptPhase.FULFILLED, AttemptPhase.STARTED)

    @classmethod
    def of(cls, annotations: Mapping[str, str]) -> Record:
        """The record in these annotations; what is missing or unreadable is left unset."""
        phase = annotations.get(PHASE_ANNOTATION, "")
        return cls(
            number=count_of(annotations.get(ATTEMPT_ANNOTATION)),
            deadline=parse_time(annotations.get(DEADLINE_ANNOTATION) or ""),
            phase=AttemptPhase(phase) if phase in set(AttemptPhase) else AttemptPhase.ASKED,
            reason=annotations.get(ROLLBACK_REASON_ANNOTATION, ""),
            reserved=count_of(annotations.get(RESERVED_ANNOTATION)) or 0,
            gang_members=count_of(annotations.get(GANG_MEMBERS_ANNOTATION)),
            raw_nodes=annotations.get(ROLLBACK_NODES_ANNOTATION, ""),
            raw_outcome=annotations.get(OUTCOME_ANNOTATION, ""),
            source=count_of(annotations.get(SOURCE_ANNOTATION)) or 0,
        )


MAX_COUNT_DIGITS = 18
"""The longest count read from an annotation (int64's 19 digits, less one)."""


def count_of(raw: str | None) -> int | None:
    """A count gangcheck wrote in an annotation (ASCII digits, as `str(int)` writes them), or
    None when it is missing or unreadable. A hand-written value is read the same way, never
    raising: `'²'` (a digit to `str.isdigit`, not to `int`), other scripts' digits, or
    thousands of digits (past `int`'s limit on digits) are unreadable."""
    if not raw or len(raw) > MAX_COUNT_DIGITS or not (raw.isascii() and raw.isdigit()):
        return None
    return int(raw)


def _nodes_of(raw: str | None) -> dict[str, str]:
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
