"""Which worker cluster a capacity-aware MultiKueue dispatcher nominates for a gang.

Kueue's AllAtOnce dispatcher copies a Workload into every worker, so every worker's
provisioning check scales up for the same gang and all but the winner strand what they
brought up; Incremental does the same three workers at a time. With ``multiKueue.dispatcherName``
set to a name Kueue does not own (``DISPATCHER``), Kueue v0.17 copies the Workload only into
the workers listed in its ``status.nominatedClusterNames`` and removes the copies of workers no
longer listed. This is the choice such a dispatcher makes, from facts per worker, one worker
at a time:

1. never a worker that is unreachable (its MultiKueueCluster not Active), nor one already
   tried for this gang whose attempt failed (rolled back, rejected, stocked out);
2. while the worker nominated last is still trying, keep it (one at a time: nothing is
   scaled up twice for one gang);
3. first the workers where the gang fits now, on nodes that exist or are reserved (nothing
   needs to arrive, so their sources' record does not matter);
4. then the workers whose capacity sources delivered lately, not those that last stocked out:
   by whether any of its sources' last outcome was not a stockout, then by its sources' share
   of deliveries among their recent outcomes (a source with none counts as even odds), then
   by fewer recent stockouts;
5. ties by name, so the choice is the same every time.

`decide` is the whole step of the dispatcher for one Workload: from what is recorded on the
manager's Workload (``DispatchRecord``, the annotation ``RECORD_ANNOTATION``: who is
nominated, who was tried and why each failed, who was skipped and why) and the facts of each
worker now, the clusters to nominate and the record to write. A restart reads the record and
goes on from it: a worker nominated stays nominated until its attempt is seen to fail.

Pure: no I/O; the edge is ``gangcheck.dispatcher``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

#: The ``multiKueue.dispatcherName`` this dispatcher would answer to.
DISPATCHER = "gangcheck.io/capacity-aware"
#: The share of deliveries assumed for a source with no recent outcome.
UNKNOWN_SHARE = 0.5


class Outcome(StrEnum):
    """How an attempt at a capacity source ended."""

    DELIVERED = "Delivered"
    STOCKOUT = "Stockout"


@dataclass(frozen=True)
class SourceHistory:
    """One capacity source of a worker: its recent outcomes, counted, and the latest."""

    deliveries: int = 0
    stockouts: int = 0
    last: Outcome | None = None

    @property
    def share(self) -> float:
        total = self.deliveries + self.stockouts
        return self.deliveries / total if total else UNKNOWN_SHARE

    @property
    def open(self) -> bool:
        """Its latest outcome was not a stockout."""
        return self.last is not Outcome.STOCKOUT


@dataclass(frozen=True)
class WorkerFacts:
    """What the dispatcher knows of one worker cluster for one gang."""

    name: str
    reachable: bool = True
    fits_now: bool = False
    sources: tuple[SourceHistory, ...] = ()
    skip: str = ""
    """Why it cannot be used now (set with ``reachable=False``): unreachable, its Secret
    missing or wrong, no gangcheck there."""
    failure: str = ""
    """Why the attempt of its copy of the Workload failed (Retry, Rejected, evicted), read
    only for a worker nominated; empty: trying, or no copy yet."""


@dataclass(frozen=True)
class Nomination:
    """The worker to list in ``nominatedClusterNames`` (None: none), and why."""

    cluster: str | None
    reason: str

    @property
    def nominated(self) -> list[str]:
        """The value of ``status.nominatedClusterNames``."""
        return [self.cluster] if self.cluster else []


def nominate(
    workers: Sequence[WorkerFacts],
    *,
    current: str | None = None,
    failed: Sequence[str] = (),
) -> Nomination:
    """The worker to nominate for a gang (module doc). ``current``: the worker nominated
    last, still trying; ``failed``: the workers tried for this gang whose attempt failed."""
    reachable = {w.name: w for w in workers if w.reachable}
    if current is not None and current not in failed and current in reachable:
        return Nomination(current, f"{current} is still trying")
    candidates = [w for w in reachable.values() if w.name not in failed]
    if not candidates:
        return Nomination(None, _why_none(workers, failed))
    best = min(candidates, key=_rank)
    return Nomination(best.name, _why(best, current, failed))


def _rank(worker: WorkerFacts) -> tuple[bool, bool, float, int, str]:
    """Smaller is better: fits now (then only the name counts: nothing has to arrive), a
    source open, share of deliveries, stockouts, name."""
    if worker.fits_now:
        return (False, False, 0.0, 0, worker.name)
    sources = worker.sources
    is_open = not sources or any(s.open for s in sources)
    share = max((s.share for s in sources), default=UNKNOWN_SHARE)
    stockouts = sum(s.stockouts for s in sources)
    return (not worker.fits_now, not is_open, -share, stockouts, worker.name)


def _why(best: WorkerFacts, current: str | None, failed: Sequence[str]) -> str:
    if best.fits_now:
        reason = f"the gang fits now in {best.name}, on nodes that exist or are reserved"
    elif not best.sources:
        reason = f"{best.name} has no record of its capacity sources; tried by name"
    elif any(s.open for s in best.sources):
        reason = f"{best.name}'s capacity sources delivered best lately"
    else:
        reason = f"every candidate's sources last stocked out; {best.name} did so least"
    if current is not None and current in failed:
        reason = f"{current} failed; {reason}"
    return reason


def _why_none(workers: Sequence[WorkerFacts], failed: Sequence[str]) -> str:
    if not workers:
        return "no worker cluster is configured"
    unreachable = sorted(w.name for w in workers if not w.reachable)
    tried = sorted(w.name for w in workers if w.reachable and w.name in failed)
    parts = [f"unreachable: {', '.join(unreachable)}"] if unreachable else []
    if tried:
        parts.append(f"tried and failed: {', '.join(tried)}")
    return "no worker left to try (" + "; ".join(parts) + ")"


#: The annotation on the manager's Workload holding the dispatcher's record (JSON).
RECORD_ANNOTATION = "gangcheck.io/dispatch"


@dataclass(frozen=True)
class DispatchRecord:
    """What the dispatcher wrote on a Workload: the workers nominated now, every worker ever
    nominated for it (in order), those whose attempt failed and why, those skipped at the
    last step and why, and the reason of the last choice."""

    nominated: tuple[str, ...] = ()
    tried: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "nominated": list(self.nominated),
                "tried": list(self.tried),
                "failed": dict(self.failed),
                "skipped": dict(self.skipped),
                "reason": self.reason,
            },
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, raw: str | None) -> DispatchRecord:
        """The record, or an empty one when there is none; an unreadable one keeps what can
        be read (a worker it names as nominated stays so: never two at once by accident)."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls(reason=f"unreadable record {raw[:80]!r}")
        if not isinstance(data, dict):
            return cls(reason=f"unreadable record {raw[:80]!r}")
        return cls(
            nominated=tuple(str(c) for c in data.get("nominated") or ()),
            tried=tuple(str(c) for c in data.get("tried") or ()),
            failed={str(k): str(v) for k, v in (data.get("failed") or {}).items()},
            skipped={str(k): str(v) for k, v in (data.get("skipped") or {}).items()},
            reason=str(data.get("reason") or ""),
        )


@dataclass(frozen=True)
class Step:
    """What the dispatcher does for one Workload now: the ``nominatedClusterNames`` to write,
    the record to write, the workers newly nominated and those newly given up (worker ->
    why), for Events and metrics. ``changed``: something to write."""

    nominated: tuple[str, ...]
    record: DispatchRecord
    newly_nominated: tuple[str, ...] = ()
    fallbacks: Mapping[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.newly_nominated or self.fallbacks)


def decide(record: DispatchRecord, workers: Sequence[WorkerFacts], *, at_once: int = 1) -> Step:
    """The dispatcher's step for one Workload (module doc). ``at_once``: how many workers
    may try at the same time (1 by default: one cluster scales up for a gang at a time).

    A worker nominated whose copy failed (``failure``), or that became unreachable, is given
    up (recorded as failed: not nominated again for this gang) and the next is nominated; a
    worker nominated and still trying is kept."""
    facts = {w.name: w for w in workers}
    failed = dict(record.failed)
    fallbacks: dict[str, str] = {}
    keep: list[str] = []
    for cluster in record.nominated:
        worker = facts.get(cluster)
        if cluster in failed:
            continue
        why = (
            "no longer configured"
            if worker is None
            else worker.failure or ("" if worker.reachable else f"unreachable: {worker.skip}")
        )
        if why:
            failed[cluster] = why
            fallbacks[cluster] = why
        else:
            keep.append(cluster)
    chosen = list(keep)
    reason = record.reason if keep else ""
    while len(chosen) < max(at_once, 1):
        pick = nominate(workers, failed=[*failed, *chosen])
        if pick.cluster is None:
            if not chosen:
                reason = pick.reason
            break
        chosen.append(pick.cluster)
        reason = pick.reason
    if fallbacks and reason:
        given_up = ", ".join(f"{c} ({why})" for c, why in sorted(fallbacks.items()))
        reason = f"given up: {given_up}; {reason}"
    newly = tuple(c for c in chosen if c not in keep)
    tried = record.tried + tuple(c for c in newly if c not in record.tried)
    skipped = {w.name: w.skip or "unreachable" for w in workers if not w.reachable}
    new = DispatchRecord(tuple(chosen), tried, failed, skipped, reason)
    return Step(tuple(chosen), new, newly, fallbacks)


def describe(record: DispatchRecord) -> list[str]:
    """The record as diagnose prints it: which worker is being tried and why, which were
    given up and skipped, and why."""
    if record.nominated:
        lines = [f"trying {', '.join(record.nominated)}: {record.reason}"]
    else:
        lines = [f"no worker nominated: {record.reason or 'nothing decided yet'}"]
    lines += [f"given up: {c} ({why})" for c, why in sorted(record.failed.items())]
    lines += [f"skipped: {c} ({why})" for c, why in sorted(record.skipped.items())]
    return lines


#: The controller of MultiKueue's AdmissionCheck (Kueue v0.17).
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"


@dataclass(frozen=True)
class WorkerRow:
    """One gang of a MultiKueue manager under one worker, as ``gangcheck status`` lists it.

    ``placement``: ``placed`` (its copy there reserved quota: ``status.clusterName``),
    ``nominated`` (``status.nominatedClusterNames``: a copy there, trying), ``recorded`` (the
    dispatcher's record names it, the nomination not written yet), ``given up`` (tried there
    and failed, from the record) or ``waiting`` (no worker yet: ``worker`` is empty)."""

    worker: str
    namespace: str
    name: str
    placement: str
    check: str
    state: str
    age_seconds: int | None
    detail: str


def worker_rows(
    workloads: Sequence[Mapping[str, object]], checks: Sequence[str], now: datetime
) -> list[WorkerRow]:
    """The manager's gangs per worker: every Workload not finished that lists one of
    ``checks`` (MultiKueue's AdmissionChecks) or carries the dispatcher's record, once under
    each worker it is placed in, nominated to or was given up by, from
    ``status.clusterName``, ``status.nominatedClusterNames`` and the record
    (``RECORD_ANNOTATION``); a gang with no worker yet once, under none. Sorted by worker,
    then namespace and name."""
    rows: list[WorkerRow] = []
    for wl in workloads:
        meta = _dict(wl.get("metadata"))
        status = _dict(wl.get("status"))
        annotations = _dict(meta.get("annotations"))
        raw = annotations.get(RECORD_ANNOTATION)
        mk = [
            _dict(c) for c in _list(status.get("admissionChecks")) if _dict(c).get("name") in checks
        ]
        if (not mk and raw is None) or _finished(status):
            continue
        record = DispatchRecord.from_annotation(str(raw) if raw is not None else None)
        check = mk[0] if mk else {}

        base = WorkerRow(
            worker="",
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            placement="waiting",
            check=str(check.get("name") or ""),
            state=str(check.get("state") or ""),
            age_seconds=_age(meta.get("creationTimestamp"), now),
            detail="",
        )
        message = str(check.get("message") or "")
        placed = str(status.get("clusterName") or "")
        nominated = [str(c) for c in _list(status.get("nominatedClusterNames"))]
        if placed:
            rows.append(replace(base, worker=placed, placement="placed", detail=message))
        elif nominated:
            rows += [
                replace(base, worker=c, placement="nominated", detail=record.reason or message)
                for c in nominated
            ]
        elif record.nominated:
            rows += [
                replace(base, worker=c, placement="recorded", detail=record.reason)
                for c in record.nominated
            ]
        rows += [
            replace(base, worker=c, placement="given up", detail=why)
            for c, why in sorted(record.failed.items())
            if c != placed and c not in nominated
        ]
        if not placed and not nominated and not record.nominated:
            rows.append(replace(base, detail=record.reason or message))
    rows.sort(key=lambda r: (r.worker == "", r.worker, r.namespace, r.name, r.placement))
    return rows


def _dict(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _finished(status: Mapping[str, object]) -> bool:
    return any(
        _dict(c).get("type") == "Finished" and _dict(c).get("status") == "True"
        for c in _list(status.get("conditions"))
    )


def _age(created: object, now: datetime) -> int | None:
    if not isinstance(created, str) or not created:
        return None
    try:
        when = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0, int((now - when).total_seconds()))
