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

Pure: no I/O; the edge that would read MultiKueueClusters and each worker's state and write
``nominatedClusterNames`` does not exist yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
