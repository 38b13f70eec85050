"""Which worker cluster a capacity-aware MultiKueue dispatcher nominates for a gang.

Kueue's AllAtOnce dispatcher copies a Workload into every worker, so every worker's
provisioning check scales up for the same gang and all but the winner strand what they
brought up; Incremental does the same three workers at a time. With ``multiKueue.dispatcherName``
set to a name Kueue does not own (``DISPATCHER``), Kueue v0.17 copies the Workload only into
the workers listed in its ``status.nominatedClusterNames`` and removes the copies of workers no
longer listed. This is the choice such a dispatcher makes, from facts per worker, one worker
at a time:

1. never a worker that is unreachable (its MultiKueueCluster not Active), nor one whose
   gangcheck is down (its leader Lease there not renewed: ``lease_down``; a worker nominated
   is kept a while before it is given up, ``with_down``), nor one already tried for this gang
   whose attempt failed (rolled back, rejected, stocked out: its request for the gang there
   says its capacity source cannot deliver, see ``cannot_deliver``), or where gangcheck left
   the gang's copy untouched ``UNANSWERED`` seconds after its quota was reserved there
   (``unanswered``: down without leader election, or stuck but still renewing its Lease),
   or whose MultiKueueCluster was re-pointed to another cluster since it was nominated
   (``repointed``: the copy there is left in the earlier cluster, said for a person);
2. while the worker nominated last is still trying, keep it (one at a time: nothing is
   scaled up twice for one gang);
3. first the workers where the gang fits now, on nodes that exist or are reserved, next to
   the gangs already nominated there and not placed yet (nothing needs to arrive, so their
   sources' record does not matter);
4. then the workers not given up lately for another gang (``recent_failures``: a stockout
   seen in the last ``FAILURE_MEMORY`` seconds, read from the records on the Workloads, and
   kept a while by the dispatcher for a gang deleted since: ``departed``);
   only gangs assigned the same resource flavors count here and in 5 (``same_capacity``);
5. then the workers whose capacity sources delivered lately, not those that last stocked out
   (the outcomes of the requests gangcheck there still holds for the gangs sent there; where
   there are none, what gangcheck there publishes on its AdmissionChecks, ``published``):
   by whether any of its sources' last outcome was not a stockout, then by fewer gangs
   nominated there and not placed yet (``pending``: a burst is spread), then by its sources'
   share of deliveries among their recent outcomes (a source with none counts as even odds),
   then by fewer recent stockouts;
6. ties by name, so the choice is the same every time;
7. when every worker has failed for the gang, none: the gang waits, and a new round tries
   them all again once ``RoundWait`` has passed (60 s, doubled each round, up to 30 min).

`decide` is the whole step of the dispatcher for one Workload: from what is recorded on the
manager's Workload (``DispatchRecord``, the annotation ``RECORD_ANNOTATION``: who is
nominated, who was tried and why each failed, who was skipped and why) and the facts of each
worker now, the clusters to nominate and the record to write. A restart reads the record and
goes on from it: a worker nominated stays nominated until its attempt is seen to fail.

Pure: no I/O; the edge is ``gangcheck.dispatcher``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from gangcheck.logic.attempt.published import Outcome
from gangcheck.model.names import (
    ATTEMPT_CONFIG_ANNOTATION,
    SOURCE_ANNOTATION,
    is_dns_label,
    is_dns_subdomain,
)

#: The ``multiKueue.dispatcherName`` this dispatcher would answer to.
DISPATCHER = "gangcheck.io/capacity-aware"
#: The share of deliveries assumed for a source with no recent outcome.
UNKNOWN_SHARE = 0.5
#: How long (seconds) a worker given up for one gang is tried after the others for the next
#: gangs (``recent_failures``): long enough for a burst, short enough that a worker whose
#: stockout ended is tried again soon (it is only ranked lower, never left out).
FAILURE_MEMORY = 120.0
#: cluster-autoscaler's reason on ``Provisioned=False`` (and on ``Failed=True`` with
#: ``noRetry``) when no node group can host the pods: its word for a stockout.
CAPACITY_NOT_FOUND = "CapacityIsNotFound"
#: How long (seconds) a worker nominated may go without Kueue's copy of the Workload before
#: the reason says so: Kueue copies within a second or two; v0.17 copies no Workload of a
#: MultiKueue check while a worker it counts connected does not answer (docs/multicluster.md).
COPY_GRACE = 30.0


#: How long (seconds) a gang every worker failed for waits before a new round tries them all
#: again (``RoundWait``): a stockout is seldom for good, and Kueue's own dispatchers leave the
#: copies in the workers, whose checks try again with backoff; doubled each round.
ROUND_WAIT = 60.0
#: The longest wait between two rounds (seconds).
ROUND_WAIT_MAX = 1800.0


@dataclass(frozen=True)
class RoundWait:
    """How long a gang whose every worker failed waits before the next round (``decide``):
    ``first`` seconds after its first round, doubled each round after, at most ``most``."""

    first: float = ROUND_WAIT
    most: float = ROUND_WAIT_MAX

    def after(self, round_: int) -> float:
        """Seconds between the end of round ``round_`` (its last worker given up) and the
        next."""
        return min(self.first * 2.0 ** min(max(round_ - 1, 0), 32), self.most)


#: How long (seconds) a pass waits for one worker's reads, all of them together: a worker that
#: does not answer within it (a network black hole: no refusal, the request hangs until the
#: client's own timeout) is skipped, and holds up the other Workloads' nominations no longer.
ANSWER_WITHIN = 5.0
#: How long (seconds) a worker that did not answer within ``ANSWER_WITHIN`` is skipped without
#: being read, the first time; doubled each time it stays silent when tried again, up to
#: ``SILENT_MAX`` (later passes do not wait for it again meanwhile).
SILENT_FIRST = 30.0
SILENT_MAX = 240.0


@dataclass(frozen=True)
class Silence:
    """A worker that did not answer within ``ANSWER_WITHIN``: skipped unread until ``until``,
    then read again (``wait``: the seconds of that window, doubled at the next silence)."""

    until: datetime
    wait: float


def silence(previous: Silence | None, now: datetime) -> Silence:
    """The window of a worker that did not answer when read at ``now`` (``previous``: its
    window before, None when it answered last; an answer, an error included, ends it):
    skipped unread for ``SILENT_FIRST`` seconds, twice as long as the last time when it was
    silent already, at most ``SILENT_MAX``."""
    wait = SILENT_FIRST if previous is None else min(previous.wait * 2, SILENT_MAX)
    return Silence(now + timedelta(seconds=wait), wait)


def patient(held: Silence | None) -> bool:
    """A silent worker is waited for a while when nominated: in its first window only."""
    return held is not None and held.wait <= SILENT_FIRST


def unread(held: Silence | None, now: datetime, *, within: float = ANSWER_WITHIN) -> str:
    """Why a worker is skipped without being read now ('' : read it): it did not answer
    within ``within`` seconds, and its window (``held``) has not ended."""
    if held is None or now >= held.until:
        return ""
    return silent_reason(held, within=within)


def silent_reason(held: Silence, *, within: float = ANSWER_WITHIN) -> str:
    """The reason recorded for a worker that did not answer (the same for the whole window:
    the record is written once per window)."""
    return f"unreachable: no answer within {within:g}s (tried again after {_stamp(held.until)})"


#: How long (seconds) past its ``leaseDurationSeconds`` the leader Lease of a worker's
#: gangcheck may go unrenewed before gangcheck there counts as down (``lease_down``). A
#: standby takes a Lease over once it has seen it unchanged for a whole duration, trying every
#: retry period (2 s), each try bounded by half the renew deadline (5 s): a hand-over leaves
#: the Lease at most about 7 s past its duration; a leader killed and started again in its pod
#: (the same identity, which renews at once) a few seconds more. 20 s covers them with room; a
#: worker skipped wrongly only has a new gang tried elsewhere. The age is the manager's clock
#: less the worker's ``renewTime``, bounded by what the dispatcher has seen itself
#: (``Sighting``), so that two clocks apart by more than this neither hide a dead gangcheck
#: nor make a live one look down for longer than one renewal.
DOWN_GRACE = 20.0
#: How often (seconds) a running dispatcher reads gangcheck's Lease (and the cluster's
#: identity, ``IDENTITY_NAMESPACE``) in each worker it holds, in the background: a pass uses
#: the latest answer, not waiting for a slow worker's (each read bounded by ``ANSWER_WITHIN``:
#: one not answered by then counts as the worker's silence). A live leader renews every 2 s.
LEASE_EVERY = 2.0
#: How long (seconds) more a worker NOMINATED whose gangcheck is down is kept nominated before
#: it is given up as a failed copy is: giving up throws away what it is bringing up, and a pod
#: rescheduled to another node (a node drained: image pulled, process started, then a whole
#: duration before its new identity takes the Lease over) comes back later than a restart in
#: place. Past ``leaseDurationSeconds`` + ``DOWN_GRACE`` + this (95 s at the default 15 s
#: duration) gangcheck there is not coming back soon.
DOWN_PATIENCE = 60.0


@dataclass(frozen=True)
class Down:
    """gangcheck in a worker counted down from its leader Lease (``lease_down``): ``reason``,
    what the record says of the worker skipped (the same at every pass while the Lease stays
    unrenewed: written once), ``failure``, what it says of a worker nominated there when it is
    given up (with the Lease's age then), and whether that is now (``give_up``: down for
    ``DOWN_PATIENCE`` seconds more)."""

    reason: str
    failure: str
    give_up: bool


@dataclass(frozen=True)
class Sighting:
    """A worker's leader Lease as the dispatcher has read it, by the dispatcher's own clock
    (``sighted``). A value of ``renewTime`` read unchanged since ``first`` was written no
    later than ``first``: the Lease is at least that old, however far ahead the worker's
    clock is; a value that replaced another read at ``after`` was written after it: the
    Lease is at most that old, however far behind the worker's clock is."""

    renewed: str
    """``spec.renewTime`` as read (compared as written: each renewal writes a new one)."""
    first: datetime
    """When this value was first read."""
    last: datetime
    """When it was last read."""
    after: datetime | None = None
    """When the value it replaced was last read; None: it replaced none that was read."""


def sighted(previous: Sighting | None, lease: object, now: datetime) -> Sighting | None:
    """The sighting of a worker's Lease read at ``now`` (``previous``: the one before; kept
    as it was when this read has no ``renewTime``, so a Lease unreadable for a while is not
    taken for renewed when it is read again unchanged)."""
    spec = _dict(lease.get("spec")) if isinstance(lease, Mapping) else {}
    renewed = spec.get("renewTime")
    if not isinstance(renewed, str) or not renewed:
        return previous
    if previous is not None and previous.renewed == renewed:
        return replace(previous, last=now)
    return Sighting(renewed, first=now, last=now, after=previous.last if previous else None)


#: On a MultiKueueCluster in the manager: gangcheck's leader Lease in that worker,
#: ``<namespace>/<name>``, where it is not the dispatcher's setting (``workerLeaseNamespace``,
#: ``workerLeaseName``): a worker whose gangcheck was installed otherwise.
WORKER_LEASE_ANNOTATION = "gangcheck.io/worker-lease"


def worker_lease(cluster: Mapping[str, object], default: tuple[str, str]) -> tuple[str, str] | str:
    """gangcheck's leader Lease to read in the worker of the MultiKueueCluster ``cluster``
    (namespace, name): its annotation ``WORKER_LEASE_ANNOTATION``, else ``default``; or, when
    the annotation is no Lease's namespace and name, why (the worker is skipped, said why:
    reading another Lease, or none, would hide its gangcheck's death)."""
    annotations = _dict(_dict(cluster.get("metadata")).get("annotations"))
    if WORKER_LEASE_ANNOTATION not in annotations:
        return default
    raw = annotations[WORKER_LEASE_ANNOTATION]
    namespace, slash, name = raw.partition("/") if isinstance(raw, str) else ("", "", "")
    if slash and is_dns_label(namespace) and is_dns_subdomain(name):
        return (namespace, name)
    shown = json.dumps(raw)[:80]
    return (
        f"its MultiKueueCluster's annotation {WORKER_LEASE_ANNOTATION} is {shown}, not "
        "<namespace>/<name> of gangcheck's leader Lease there"
    )


#: What a kubeconfig's entries may name that the dispatcher does not use (section, key, what it
#: is): a command to run, a provider to ask, a file of the reading pod's, a password. Kueue
#: v0.17 refuses the same in a MultiKueueCluster's kubeconfig (``validateKubeconfig``,
#: pkg/controller/admissionchecks/multikueue/multikueuecluster.go) unless its gate
#: ``MultiKueueAllowInsecureKubeconfigs`` is on; a file or command named there is Kueue's
#: pod's, not the dispatcher's.
KUBECONFIG_UNUSED = (
    ("user", "exec", "an exec plugin (a command to run)"),
    ("user", "auth-provider", "an auth provider"),
    ("user", "tokenFile", "a token file"),
    ("user", "client-certificate", "a client certificate file"),
    ("user", "client-key", "a client key file"),
    ("user", "username", "basic auth"),
    ("user", "password", "basic auth"),
    ("cluster", "certificate-authority", "a certificate authority file"),
)


#: A cluster entry's flag turning TLS verification off: the loader reads any truthy value as
#: true (a quoted "false" too), so one that is not a boolean is refused.
TLS_VERIFY_OFF = "insecure-skip-tls-verify"
#: The most a kubeconfig may hold once its YAML aliases are expanded (characters of its keys
#: and strings, one for each other value): a Secret's data is at most 1 MiB, so one without
#: aliases always holds less. The loader formats each entry whole: a billion laughs of under
#: a KB took it 10 s at 10**8 strings, out of memory at 10**9. Go's YAML reader, Kueue's,
#: refuses excessive aliasing as well.
KUBECONFIG_EXPANDED_MAX = 1 << 20
#: The most values (maps, lists, keys, scalars) a kubeconfig may hold: one of a few hundred
#: contexts holds fewer. The loader reads a kubeconfig on the event loop, at a few
#: microseconds a value: a Secret's MiB of small entries (30,000 users) took it 5 s.
KUBECONFIG_VALUES_MAX = 10_000


def _too_large(config: object) -> str:
    """Why ``config`` (parsed YAML: an alias is the same object again) is too large, once
    expanded, to be loaded (``KUBECONFIG_EXPANDED_MAX``, ``KUBECONFIG_VALUES_MAX``), or '';
    walked without recursion, and only until a limit is passed."""
    size, values, stack = 0, 0, [config]
    while stack:
        value = stack.pop()
        values += 1
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
            size += 1
        elif isinstance(value, list | tuple):
            stack.extend(value)
            size += 1
        else:
            size += len(value) if isinstance(value, str | bytes) else 1
        if size > KUBECONFIG_EXPANDED_MAX:
            return (
                f"its kubeconfig expands to more than {KUBECONFIG_EXPANDED_MAX} characters (YAML "
                "aliases repeating its values; a Secret holds at most 1 MiB): not loaded"
            )
        if values > KUBECONFIG_VALUES_MAX:
            return (
                f"its kubeconfig holds more than {KUBECONFIG_VALUES_MAX} values (a worker's "
                "holds a few dozen: one cluster, user and context): not loaded"
            )
    return ""


def kubeconfig_unused(config: object) -> str:
    """Why the dispatcher does not use a worker's kubeconfig (``config``: as parsed from its
    Secret), or '' (it may, or it is no map: loading it says why): larger expanded than a
    Secret holds or than a worker's (``_too_large``), a cluster entry's ``TLS_VERIFY_OFF`` not a
    boolean, or an entry of it naming what ``KUBECONFIG_UNUSED`` lists. Read before the
    kubeconfig is loaded: loading it runs an exec plugin (a pass waiting on the command,
    however long) and reads a token file of this pod's (its own ServiceAccount token, then
    sent to the server the Secret names).
    Every entry counts, not only the current context's, as Kueue checks them."""
    too_large = _too_large(config)
    if too_large:
        return too_large
    for entry in _list(_dict(config).get("clusters")):
        flag = _dict(_dict(entry).get("cluster")).get(TLS_VERIFY_OFF)
        if flag is not None and not isinstance(flag, bool):
            name = json.dumps(str(_dict(entry).get("name") or ""))
            return (
                f"its kubeconfig's {TLS_VERIFY_OFF} is no boolean (cluster {name}: "
                f"{json.dumps(flag)[:64]}): its loader turns TLS verification off for any value "
                "but false (client-go's reader, Kueue's, refuses it); write true or false, "
                "unquoted"
            )
    for section, key, what in KUBECONFIG_UNUSED:
        for entry in _list(_dict(config).get(f"{section}s")):
            body = _dict(_dict(entry).get(section))
            if body.get(key) not in (None, ""):
                name = json.dumps(str(_dict(entry).get("name") or ""))
                return (
                    f"its kubeconfig names {what} ({section} {name}: {key}): not used by the "
                    "dispatcher, which runs no command and reads no file of its own for a "
                    "worker (Kueue v0.17 refuses it too, unless MultiKueueAllowInsecureKubeconfigs "
                    "is on); give the credentials in it (token, client-certificate-data and "
                    "client-key-data, certificate-authority-data)"
                )
    return ""


#: The largest ``leaseDurationSeconds`` a Lease has (an int32): one larger, or not a finite
#: number, is not a Lease's (not known, as an unreadable one is).
MAX_LEASE_DURATION = 2**31 - 1


def lease_down(
    lease: object,
    now: datetime,
    *,
    grace: float = DOWN_GRACE,
    patience: float = DOWN_PATIENCE,
    name: tuple[str, str] | None = None,
    seen: Sighting | None = None,
) -> Down | None:
    """Whether gangcheck in a worker is down, from its leader Lease there (``lease``, as read):
    down when its age is more than its ``leaseDurationSeconds`` plus ``grace`` seconds. Its
    age: ``now`` less its ``spec.renewTime``, bounded by ``seen`` (the dispatcher's sightings
    of it, ``Sighting``) when it says so of this ``renewTime``: at least the time since that
    value was first read, at most the time since the value it replaced was last read. Given
    up (``give_up``) past ``patience`` seconds more, and, with ``seen``, only once the value
    has been read unchanged for ``patience`` seconds (a live worker whose clock is behind is
    never given up on its first reads). None (not down) when renewed within that, and when it
    cannot be told: no Lease (None: leader election may be off there, or the Lease not readable), no
    ``renewTime`` or no ``leaseDurationSeconds``, or either unreadable. A Lease released (no
    holder: its leader stopped gracefully, and none took it over) counts from its last renewal
    as well, with the duration it was left with. A worker's answer that is no Lease (not an
    object, a duration beyond an int32's or not finite) is not known either. The reasons
    name the Lease ``name`` (namespace, name: the one read), else as its metadata says."""
    if not isinstance(lease, Mapping):
        return None
    spec = _dict(lease.get("spec"))
    renewed = _parse(str(spec.get("renewTime") or ""))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or isinstance(duration, bool) or not isinstance(duration, int | float):
        return None
    if not 0 < duration <= MAX_LEASE_DURATION:  # NaN fails it too
        return None
    stamped = age = (now - renewed).total_seconds()
    watched: float | None = None
    if seen is not None and seen.renewed == spec.get("renewTime"):
        watched = (now - seen.first).total_seconds()
        age = max(age, watched)
        if seen.after is not None:
            age = min(age, (now - seen.after).total_seconds())
    if age <= duration + grace:
        return None
    if name is None:
        meta = _dict(lease.get("metadata"))
        name = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    lease_of = f"its Lease {name[0]}/{name[1]}"
    held = "" if spec.get("holderIdentity") else ", no holder"
    if seen is not None and watched is not None and watched > stamped:  # its clock is ahead
        since = f"unchanged since read at {_stamp(seen.first)} (renewTime {_stamp(renewed)}"
        return Down(
            reason=f"gangcheck down: {lease_of} {since}, duration {duration:g}s{held})",
            failure=(
                f"gangcheck down: {lease_of} not renewed for {age:.0f}s, {since} by its "
                f"clock, duration {duration:g}s{held})"
            ),
            give_up=age > duration + grace + patience and watched >= patience,
        )
    return Down(
        reason=(
            f"gangcheck down: {lease_of} last renewed at {_stamp(renewed)} "
            f"(duration {duration:g}s{held})"
        ),
        failure=(
            f"gangcheck down: {lease_of} last renewed {age:.0f}s ago, at {_stamp(renewed)} "
            f"(duration {duration:g}s{held})"
        ),
        give_up=age > duration + grace + patience and (watched is None or watched >= patience),
    )


def with_down(facts: WorkerFacts, down: Down | None, *, nominated: bool) -> WorkerFacts:
    """The facts of a worker whose gangcheck is down (``down``: ``lease_down``; None: up, or
    not known): skipped, with the reason; when ``nominated``, kept nominated (``patience``)
    until ``down.give_up``, then given up as a failed copy is (``failure``: the record says
    why, ``recent_failures`` counts it). A copy failed on its own is given up with its own
    failure at once; a copy admitted there is left alone (gangcheck's part there is done:
    MultiKueue places the gang), as is a worker skipped already for another reason."""
    if down is None or not facts.reachable or facts.admitted:
        return facts
    if not nominated:
        return replace(facts, reachable=False, skip=down.reason)
    failure = facts.failure or (down.failure if down.give_up else "")
    return replace(facts, reachable=False, skip=down.reason, failure=failure, patience=not failure)


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
    """Why the attempt of its copy of the Workload failed (Retry, Rejected, evicted, its
    capacity source cannot deliver), read only for a worker nominated; empty: trying, or no
    copy yet."""
    pending: int = 0
    """Other gangs nominated to it and not placed yet (counted against its room)."""
    lately_failed: str = ""
    """Why it was given up for another gang lately (``recent_failures``); empty: not."""
    admitted: bool = False
    """Its copy of the Workload is admitted there (read only for a worker nominated)."""
    copied: bool = True
    """Kueue's copy of the Workload is there (read only for a worker nominated)."""
    unlisted: bool = False
    """No longer listed by the Workload's MultiKueueConfig, or its MultiKueueCluster gone
    (read only for a worker nominated): Kueue no longer manages its copy there, never a
    candidate (``decide``)."""
    identity: str = ""
    """Which cluster its MultiKueueCluster reaches now: the uid of that cluster's
    ``kube-system`` Namespace (``IDENTITY_NAMESPACE``); '' when not known (not read, not
    granted)."""
    patience: bool = False
    """A worker nominated that did not answer, in its first window of silence (``patient``),
    or whose gangcheck is down for less than ``DOWN_PATIENCE`` past ``DOWN_GRACE``
    (``with_down``): kept nominated, since a stall is no stockout and moving on would throw
    away what it is bringing up; given up as unreachable if it is silent again when that
    window ends, with its ``failure`` once gangcheck there is down that long."""


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
    return Nomination(best.name, _why(best, current, failed) + _passed_over(best, candidates))


def _rank(worker: WorkerFacts) -> tuple[bool, bool, bool, int, float, int, str]:
    """Smaller is better: fits now (then only the name counts: nothing has to arrive), not
    given up lately for another gang, a source open, fewer gangs pending there, share of
    deliveries, stockouts, name."""
    if worker.fits_now:
        return (False, False, False, 0, 0.0, 0, worker.name)
    sources = worker.sources
    share = max((s.share for s in sources), default=UNKNOWN_SHARE)
    stockouts = sum(s.stockouts for s in sources)
    return (
        True,
        bool(worker.lately_failed),
        not _is_open(worker),
        worker.pending,
        -share,
        stockouts,
        worker.name,
    )


def _why(best: WorkerFacts, current: str | None, failed: Sequence[str]) -> str:
    if best.fits_now:
        reason = f"the gang fits now in {best.name}, on nodes that exist or are reserved"
    elif best.lately_failed:
        reason = f"every candidate was given up lately for another gang; {best.name} by rank"
    elif not best.sources:
        reason = f"{best.name} has no record of its capacity sources; tried by name"
    elif any(s.open for s in best.sources):
        reason = f"{best.name}'s capacity sources delivered best lately"
    else:
        reason = f"every candidate's sources last stocked out; {best.name} did so least"
    if best.pending and not best.fits_now:
        reason += f" ({best.pending} other gang(s) pending there)"
    if current is not None and current in failed:
        reason = f"{current} failed; {reason}"
    return reason


#: How much of the latest why a worker was given up for another gang the reason names.
PASSED_OVER_WHY = 160


def _passed_over(best: WorkerFacts, candidates: Sequence[WorkerFacts]) -> str:
    """The candidates ranked after ``best`` for a recent give-up of another gang of the same
    flavors (``lately_failed``), named with the first one's latest why, then those ranked
    after it because every source of theirs last stocked out (for gangs of the same
    flavors): a person reading "tried by name" then sees why the first by name was not."""
    if best.fits_now or best.lately_failed:
        return ""
    over = [w for w in candidates if w.lately_failed and not w.fits_now]
    said = ""
    if over:
        names = ", ".join(w.name for w in over)
        why = _clip(over[0].lately_failed, PASSED_OVER_WHY)
        said = f"; after {names}, given up lately for another gang ({why})"
    if not _is_open(best):
        return said
    closed = [w for w in candidates if w not in over and not w.fits_now and not _is_open(w)]
    if closed:
        names = ", ".join(w.name for w in closed)
        said += f"; after {names}, whose capacity sources last stocked out for such gangs"
    return said


def _is_open(worker: WorkerFacts) -> bool:
    """No record of its sources, or one of them whose latest outcome was not a stockout."""
    return not worker.sources or any(s.open for s in worker.sources)


@dataclass(frozen=True)
class CheckWorkers:
    """The worker clusters MultiKueue copies the Workloads of its AdmissionCheck(s) to: those
    of the MultiKueueConfig the check's parameters name, each once, in order (Kueue v0.17,
    ``remoteClientsForAC``: no other, whatever is nominated); ``problem``: why none."""

    clusters: tuple[str, ...] = ()
    problem: str = ""


def check_workers(
    checks: Sequence[Mapping[str, object]], configs: Sequence[Mapping[str, object]]
) -> dict[str, CheckWorkers]:
    """Each AdmissionCheck of MultiKueue's controller, by name, with its workers (the
    manager's AdmissionChecks and MultiKueueConfigs as listed)."""
    lists = {
        str(_dict(_dict(c).get("metadata")).get("name") or ""): _names(
            _dict(_dict(c).get("spec")).get("clusters")
        )
        for c in configs
    }
    out: dict[str, CheckWorkers] = {}
    for check in checks:
        spec = _dict(_dict(check).get("spec"))
        if spec.get("controllerName") != MULTIKUEUE_CONTROLLER:
            continue
        name = str(_dict(_dict(check).get("metadata")).get("name") or "")
        params = _dict(spec.get("parameters"))
        config = str(params.get("name") or "") if params.get("kind") == "MultiKueueConfig" else ""
        if not config:
            out[name] = CheckWorkers(problem=f"AdmissionCheck {name} names no MultiKueueConfig")
        elif config not in lists:
            out[name] = CheckWorkers(problem=f"MultiKueueConfig {config} of {name} not found")
        else:
            out[name] = CheckWorkers(lists[config])
    return out


def workers_for(checks: Iterable[str], by_check: Mapping[str, CheckWorkers]) -> CheckWorkers:
    """The workers of a Workload's MultiKueue checks (names, ``by_check`` from
    ``check_workers``) together, each once; when none, why."""
    found = [by_check[c] for c in sorted(set(checks)) if c in by_check]
    clusters = tuple(dict.fromkeys(c for f in found for c in f.clusters))
    problem = "" if clusters else "; ".join(f.problem for f in found if f.problem)
    return CheckWorkers(clusters, problem)


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
    nominated for it (in order), those whose attempt failed and why, and when each was given
    up (RFC 3339; what ``recent_failures`` reads for the next gangs), those skipped at the last
    step and why, and the reason of the last choice."""

    nominated: tuple[str, ...] = ()
    tried: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""
    failed_at: Mapping[str, str] = field(default_factory=dict)
    admitted: str = ""
    """The worker nominated whose copy was seen admitted (MultiKueue places the gang there)."""
    nominated_at: Mapping[str, str] = field(default_factory=dict)
    """When each worker nominated now was nominated (RFC 3339)."""
    uid: str = ""
    """The uid of the manager's Workload it was written for (``for_workload``): Kueue's copy
    of the Workload in a worker carries the record as it was when the copy was made, so the
    copy names the Workload it was made for (``copy_of``)."""
    identities: Mapping[str, str] = field(default_factory=dict)
    """Which cluster each worker nominated now reached when it was nominated (its
    ``WorkerFacts.identity``; first known since, for a worker nominated while it was not):
    the cluster Kueue made the copy in (``repointed``)."""
    round: int = 1
    """Which round of tries this is: a new one begins, ``failed`` emptied, once every
    worker has failed and the wait after the last round has passed (``decide``)."""

    def to_annotation(self) -> str:
        data: dict[str, object] = {
            "nominated": list(self.nominated),
            "tried": list(self.tried),
            "failed": dict(self.failed),
            "skipped": dict(self.skipped),
            "reason": self.reason,
        }
        if self.failed_at:
            data["failedAt"] = dict(self.failed_at)
        if self.admitted:
            data["admitted"] = self.admitted
        if self.nominated_at:
            data["nominatedAt"] = dict(self.nominated_at)
        if self.uid:
            data["uid"] = self.uid
        if self.identities:
            data["identities"] = dict(self.identities)
        if self.round > 1:
            data["round"] = self.round
        return json.dumps(data, sort_keys=True)

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
            nominated=_names(data.get("nominated")),
            tried=_names(data.get("tried")),
            failed=_by_name(data.get("failed")),
            skipped=_by_name(data.get("skipped")),
            reason=str(data.get("reason") or ""),
            failed_at=_by_name(data.get("failedAt")),
            admitted=str(data.get("admitted") or ""),
            nominated_at=_by_name(data.get("nominatedAt")),
            uid=data["uid"] if isinstance(data.get("uid"), str) else "",
            identities=_by_name(data.get("identities")),
            round=_round(data.get("round")),
        )


def _round(value: object) -> int:
    """A record's round: a whole number from 1 on; anything else (hand-edited) reads as 1."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


#: How the record of a Workload made again under its name says the earlier one's was set
#: aside (``for_workload``).
_SET_ASIDE = "the record of an earlier Workload of this name"
_ASIDE_END = ") set aside"


def for_workload(record: DispatchRecord, uid: str) -> DispatchRecord:
    """The record as it counts for the manager's Workload of uid ``uid``: its own (stamped
    with ``uid`` when it names none: written before records did), or, when it names another
    uid, none: the Workload was deleted and made again under its name from a manifest that
    kept its annotations (nothing of the earlier one's dispatch carries over: not its worker
    nominated, not those it gave up), said so."""
    if not uid or record.uid == uid:
        return record
    if not record.uid:
        return replace(record, uid=uid)
    return DispatchRecord(reason=f"{_SET_ASIDE} (uid {record.uid}{_ASIDE_END}", uid=uid)


def copy_of(copy: Mapping[str, object], uid: str) -> bool:
    """Whether a worker's Workload ``copy`` is Kueue's copy of the manager's Workload of uid
    ``uid``, not one left there by an earlier Workload of the same name (Kueue removes it
    after the deletion; one made again meanwhile finds it there): the record the copy
    carries (Kueue copies the annotations when it makes the copy, after the dispatcher wrote
    the record) names that uid, or names none (a record written before records did, or no
    record: not told apart, taken as its copy)."""
    raw = _dict(_dict(copy.get("metadata")).get("annotations")).get(RECORD_ANNOTATION)
    made_for = DispatchRecord.from_annotation(raw if isinstance(raw, str) else None).uid
    return not made_for or not uid or made_for == uid


def _names(value: object) -> tuple[str, ...]:
    """Worker names as a record lists them (hand-edited too): a lone name is one, anything
    but a non-empty string is left out, and each name counts once, in order."""
    items = [value] if isinstance(value, str) else _list(value)
    return tuple(dict.fromkeys(v for v in items if isinstance(v, str) and v))


def _by_name(value: object) -> dict[str, str]:
    """A record's map of worker -> text; anything but a map reads as none."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


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


def _unreachable(skip: str) -> str:
    """Why a nominated worker that cannot be read now is given up: its skip reason, said as
    unreachable once (a reason that says so already is not prefixed again)."""
    return skip if skip.startswith("unreachable") else f"unreachable: {skip}"


def decide(
    record: DispatchRecord,
    workers: Sequence[WorkerFacts],
    *,
    at_once: int = 1,
    now: datetime | None = None,
    unconfigured: str = "",
    written: Sequence[str] = (),
    rounds: RoundWait = RoundWait(),
) -> Step:
    """The dispatcher's step for one Workload (module doc). ``at_once``: how many workers
    may try at the same time (1 by default: one cluster scales up for a gang at a time);
    ``now``: the time stamped on a worker given up (none: not stamped); ``unconfigured``: why
    the Workload has no worker at all (``workers_for``), said when ``workers`` is empty;
    ``written``: the Workload's ``status.nominatedClusterNames``, read as nominated when the
    record names none (a record lost, or unreadable when hand-edited: the worker trying
    there is kept, not replaced by another that would scale up beside it).

    A worker nominated whose copy failed (``failure``: its check Retry or Rejected, evicted,
    or its capacity source there says it cannot deliver), or that became unreachable, is
    given up (recorded as failed: not nominated again for this gang in this round) in the
    same step as the next is nominated; a worker nominated and still trying is kept. A
    worker nominated whose copy is admitted there is recorded as such (``admitted``): the
    record written then is also what has MultiKueue, which otherwise looks at a worker's
    change only after its 1 s batch period, place the gang at once (a change of the
    manager's Workload). A worker nominated ``COPY_GRACE`` seconds ago or more that has no
    copy of the Workload yet is said after the reason (Kueue is not copying it: nothing the
    dispatcher can change, but why the gang waits); it stays nominated. That part is derived
    again at each step from the copy now: once Kueue copies the Workload, the reason is the
    choice's alone again.

    When no worker is left to try, every one reachable having failed for the gang, the gang
    waits (said with when the next round begins) until the wait after its round
    (``rounds``) has passed since the last was given up; then a new round begins: the record's
    ``failed`` emptied (``failed_at`` kept, for the ranking of other gangs), every worker a
    candidate again, nominated by rank. A stockout is seldom for good; without rounds, a gang
    every worker failed once waited for good, holding its quota in the manager.

    Only the first ``at_once`` workers the record names are read as nominated (a record
    hand-edited to name more, or written under a larger ``at_once``, never has more clusters
    scale up for one gang than set; the others' nomination is dropped, not given up)."""
    if not record.nominated and written:
        record = replace(record, nominated=_names(list(written)))
    facts = {w.name: w for w in workers}
    failed = dict(record.failed)
    failed_at = dict(record.failed_at)
    fallbacks: dict[str, str] = {}
    keep: list[str] = []
    stranded = ""
    for cluster in record.nominated[: max(at_once, 1)]:
        if cluster in failed:
            continue
        why, left = _given_up(facts.get(cluster), record.identities.get(cluster, ""))
        if why:
            failed[cluster] = fallbacks[cluster] = why
            if now is not None:
                failed_at[cluster] = _stamp(now)
        else:
            keep.append(cluster)
            stranded = stranded or (_stranded(cluster) if left else "")
    reason = _without_copy_wait(record.reason, keep, record.nominated_at) if keep else ""
    listed = [w for w in workers if not w.unlisted]
    chosen, reason = _choose(listed, keep, failed, reason, at_once=at_once)
    if not chosen and not listed and unconfigured:
        reason = f"{reason} ({unconfigured})"
    round_ = record.round
    if not chosen:
        round_, failed, chosen, reason = _rounds(
            listed,
            keep,
            failed,
            failed_at,
            reason=reason,
            round_=round_,
            at_once=at_once,
            rounds=rounds,
            now=now,
        )
    if fallbacks and reason and chosen:  # none left: said as at the next step (written once)
        given_up = ", ".join(f"{c} ({why})" for c, why in sorted(fallbacks.items()))
        reason = f"given up: {given_up}; {reason}"
    newly = tuple(c for c in chosen if c not in keep)
    if newly and round_ > 1 and not reason.startswith(f"round {round_}"):
        reason = f"round {round_}: {reason}"  # each choice of a round after the first says so
    tried = record.tried + tuple(c for c in chosen if c not in record.tried)
    skipped = {w.name: _clip(w.skip or "unreachable") for w in listed if not w.reachable}
    admitted = next(
        (c for c in keep if c in facts and facts[c].admitted and not facts[c].unlisted), ""
    )
    since = {
        c: record.nominated_at[c]
        for c in keep
        if c in record.nominated_at
        and (now is None or _when(record.nominated_at[c], now) is not None)
    }
    if now is not None:
        since |= {c: _stamp(now) for c in chosen if c not in since}
    uncopied = _not_copied(keep, facts, since, now)
    if uncopied and not fallbacks:
        reason = f"{reason}; {uncopied}" if reason else uncopied
    if stranded:  # said alone, or after why another was nominated beside it (at once > 1)
        reason = f"{reason}; {stranded}" if newly else stranded
    if not keep:
        reason = _with_aside(record.reason, reason)
    new = DispatchRecord(
        tuple(chosen),
        tried,
        failed,
        skipped,
        reason,
        failed_at,
        admitted,
        since,
        record.uid,
        _identities(record, chosen, facts),
        round_,
    )
    return Step(tuple(chosen), new, newly, fallbacks)


def _choose(
    listed: Sequence[WorkerFacts],
    keep: Sequence[str],
    failed: Mapping[str, str],
    reason: str,
    *,
    at_once: int,
) -> tuple[list[str], str]:
    """The workers nominated: those kept, then the best of the others not failed, up to
    ``at_once``; and the reason of the last choice (``reason`` when none is made, why none
    is left when none is kept either)."""
    chosen = list(keep)
    while len(chosen) < max(at_once, 1):
        pick = nominate(listed, failed=[*failed, *chosen])
        if pick.cluster is None:
            if not chosen:
                reason = pick.reason
            break
        chosen.append(pick.cluster)
        reason = pick.reason
    return chosen, reason


def _rounds(
    listed: Sequence[WorkerFacts],
    keep: Sequence[str],
    failed: dict[str, str],
    failed_at: dict[str, str],
    *,
    reason: str,
    round_: int,
    at_once: int,
    rounds: RoundWait,
    now: datetime | None,
) -> tuple[int, dict[str, str], list[str], str]:
    """No worker left to try for a gang: a new round once it is due (``_next_round``: its
    round incremented, ``failed`` emptied, the workers chosen by rank again), else the
    reason said with when the next begins. (round, failed, chosen, reason)."""
    due = _next_round(listed, failed, failed_at, round_, rounds=rounds, now=now)
    if due is None or now is None:
        return round_, failed, [], reason
    if due > now:
        return round_, failed, [], f"{reason}; round {round_ + 1} at {_stamp(due)}"
    chosen, reason = _choose(listed, keep, {}, reason, at_once=at_once)
    said = f"round {round_ + 1}, every worker having failed in round {round_}: {reason}"
    return round_ + 1, {}, chosen, said


def _next_round(
    listed: Sequence[WorkerFacts],
    failed: Mapping[str, str],
    failed_at: dict[str, str],
    round_: int,
    *,
    rounds: RoundWait,
    now: datetime | None,
) -> datetime | None:
    """When the next round begins for a gang none of whose workers is left to try: the
    wait after round ``round_`` (``rounds``) past its end, the last time one of its workers
    was given up (``failed_at``; a worker given up with no time that counts, in a record
    written before times were or hand-edited, is stamped ``now`` in it, once: a time taken
    from each pass would move); None when no worker reachable now has failed (unreachable
    ones are tried once they answer) or no time is known (``now`` None)."""
    if now is None:
        return None
    gave_up = [w.name for w in listed if w.reachable and w.name in failed]
    if not gave_up:
        return None
    for cluster in gave_up:
        if _when(failed_at.get(cluster, ""), now) is None:
            failed_at[cluster] = _stamp(now)
    stamps = [_when(failed_at[c], now) for c in gave_up]
    return max(t for t in stamps if t is not None) + timedelta(seconds=rounds.after(round_))


def _identities(
    record: DispatchRecord, chosen: Sequence[str], facts: Mapping[str, WorkerFacts]
) -> dict[str, str]:
    """Which cluster each worker ``chosen`` reached when nominated: as recorded, else as
    read now (``WorkerFacts.identity``; none when not known)."""
    out = {}
    for cluster in chosen:
        now = facts[cluster].identity if cluster in facts else ""
        if record.identities.get(cluster) or now:
            out[cluster] = record.identities.get(cluster) or now
    return out


def _with_aside(was: str, reason: str) -> str:
    """``reason``, after the note that an earlier Workload's record was set aside when the
    record said so (``for_workload``): said once, however many passes follow (the reason
    written before is not put in front again, or each pass grew the record by a clause)."""
    if not was.startswith(_SET_ASIDE):
        return reason
    head, said, _ = was.partition(_ASIDE_END)
    aside = head + said if said else _SET_ASIDE  # (a hand-edited record: its head only)
    if reason.startswith(aside):
        return reason
    return f"{aside}; {reason}" if reason else aside


#: The most characters the record keeps of why a worker was given up or skipped: what a worker
#: says (a check's message, a condition's, an error's) may be 32 KiB long, written twice (in
#: ``failed`` and in the reason) for each worker, and the record must fit in the Workload's
#: 256 KiB of annotations, or its write is refused and the gang stuck.
WHY_MAX = 512


def _clip(why: str, limit: int = WHY_MAX) -> str:
    """``why`` cut to ``limit`` characters, said cut ('...')."""
    return why if len(why) <= limit else why[: limit - 3] + "..."


def _given_up(worker: WorkerFacts | None, identity: str = "") -> tuple[str, bool]:
    """Why a worker nominated is given up now ('' : kept), and whether it is kept only as
    left with a copy Kueue no longer manages (``unlisted``, its copy seen there).
    ``identity``: the cluster it reached when nominated (``DispatchRecord.identities``)."""
    repointing = repointed(identity, worker.identity) if worker is not None else ""
    if repointing:
        return _clip(repointing), False
    if worker is not None and worker.unlisted:
        if worker.reachable and worker.copied:
            return "", True
        worker = None  # no copy there, or not known: given up as no longer configured
    if worker is not None and not worker.reachable and worker.patience:
        return "", False  # silent, first window: waited for (``WorkerFacts.patience``)
    if worker is None:
        return "no longer configured", False
    return _clip(worker.failure or ("" if worker.reachable else _unreachable(worker.skip))), False


#: The Namespace whose uid tells one cluster from another (``WorkerFacts.identity``): made
#: with the cluster, never deleted, the same whatever address or credentials reach it.
IDENTITY_NAMESPACE = "kube-system"


def repointed(was: str, now: str) -> str:
    """Why a worker nominated is given up when its MultiKueueCluster was re-pointed (its
    kubeconfig Secret changed to reach another cluster) since it was nominated, or ''. ``was``:
    the cluster it reached when nominated, ``now``: the one it reaches now (each the uid of
    its ``IDENTITY_NAMESPACE``; '' not known: not said). Kueue (v0.17) only makes its client
    of that MultiKueueCluster again: it copies the Workload into the new cluster, and its
    garbage collection looks there only, so the copy it made in the earlier cluster stays
    there, gangcheck there perhaps still bringing capacity up for it (or the gang running
    there too). The dispatcher writes in no worker: the copy is said, for a person to delete."""
    if not was or not now or was == now:
        return ""
    return (
        f"re-pointed: its MultiKueueCluster now reaches another cluster ({IDENTITY_NAMESPACE} "
        f"uid {now}; nominated when it reached uid {was}): Kueue's copy of this Workload (its "
        "namespace and name), if it made one, is left in that earlier cluster, where Kueue no "
        "longer looks: delete it there, with its job"
    )


def _stranded(cluster: str) -> str:
    """Why no other worker is nominated while ``cluster``, no longer a worker of the
    Workload's MultiKueueConfig (dropped, or its MultiKueueCluster deleted) while nominated,
    still holds its copy."""
    return (
        f"{cluster} is no longer a worker of the Workload's MultiKueueConfig (dropped from it, "
        f"or its MultiKueueCluster deleted) while nominated, and its copy is still there: Kueue "
        f"no longer manages it (it stays until this Workload is deleted) and gangcheck there "
        f"may still scale up for it, so no other worker is nominated while it is there "
        f"(delete that copy in {cluster}, or make {cluster} a worker of it again)"
    )


def _not_copied(
    keep: Sequence[str],
    facts: Mapping[str, WorkerFacts],
    since: Mapping[str, str],
    now: datetime | None,
) -> str:
    """What is said of a worker nominated ``COPY_GRACE`` seconds ago or more whose copy of the
    Workload Kueue has not made ('' when none), naming the workers that likely block Kueue
    (``_blocking``): stable, so it is written once."""
    for cluster in keep:
        worker, when = facts.get(cluster), _parse(since.get(cluster, ""))
        if worker is None or worker.copied or when is None or now is None:
            continue
        if (now - when).total_seconds() >= COPY_GRACE:
            return _copy_wait(cluster, since[cluster], _blocking(facts.values()))
    return ""


#: How a worker's skip reason begins when its MultiKueueCluster was Active (read before the
#: dispatcher's own reads) but the worker could not be read: Kueue counts it connected, and
#: its reads there fail as the dispatcher's did (``_blocking``).
_UNREADABLE_WHILE_ACTIVE = ("unreachable", "credentials refused")


def _blocking(workers: Iterable[WorkerFacts]) -> list[str]:
    """The workers of the Workload that Kueue v0.17 likely stops on: skipped because they
    could not be read (does not answer, credentials refused) although their MultiKueueCluster
    was Active. Kueue reads the copy in every worker of the check it counts connected and
    gives up at the first error other than NotFound, before copying the Workload anywhere
    (``readGroup``, pkg/controller/admissionchecks/multikueue/workload.go); its watches
    still open, a worker whose server stopped answering or whose token was revoked stays
    Active. Not a worker whose MultiKueueCluster is not Active (Kueue leaves it out), nor one
    skipped for what it holds (no gangcheck: Kueue reads it fine)."""
    return sorted(
        w.name
        for w in workers
        if not w.reachable and not w.unlisted and w.skip.startswith(_UNREADABLE_WHILE_ACTIVE)
    )


def _copy_wait_head(cluster: str, since: str) -> str:
    return f"{cluster} nominated at {since}, and Kueue has not copied the Workload there"


def _copy_wait(cluster: str, since: str, blocking: Sequence[str] = ()) -> str:
    head = _copy_wait_head(cluster, since)
    if blocking:
        named = ", ".join(blocking)
        verb = "is" if len(blocking) == 1 else "are"
        return (
            f"{head}: Kueue copies no Workload of the check while a worker it counts connected "
            f"(its MultiKueueCluster Active) cannot be read, and {named} {verb} (skipped, "
            "below): mend its kubeconfig Secret, or take it off the MultiKueueConfig"
        )
    return (
        f"{head}: is the Workload's namespace missing there (Kueue cannot create the copy), or "
        "is MultiKueue stuck on another worker it counts connected that does not answer (a "
        "kubeconfig Secret pointing nowhere)?"
    )


def _without_copy_wait(reason: str, keep: Sequence[str], since: Mapping[str, str]) -> str:
    """``reason`` less what ``_not_copied`` said after it at an earlier step (said again, or
    not, from the copy now, and naming the workers blocking now). A record written before
    that was said after the choice's reason holds it alone: then the worker kept is said to
    be trying, as ``nominate`` says."""
    for cluster in keep:
        if cluster not in since:
            continue
        head = _copy_wait_head(cluster, since[cluster])
        if reason.startswith(head):
            return f"{cluster} is still trying"
        said = reason.find(f"; {head}")
        if said >= 0:
            return reason[:said]
    return reason


#: What a gang asks of a worker's capacity: the names of the resource flavors its quota
#: reservation in the manager assigned it, over its pod sets and resources (``flavors_of``).
Flavors = frozenset[str]


def flavors_of(wl: Mapping[str, object]) -> Flavors | None:
    """The resource flavors the manager's quota reservation assigned the gang
    (``status.admission.podSetAssignments[].flavors``, the flavors of every resource of
    every pod set: a flavor is a kind of node, whichever resources it is counted for); None
    when none is recorded (no reservation yet, or an admission not shaped as Kueue writes
    it)."""
    admission = _dict(_dict(wl.get("status")).get("admission"))
    names = {
        str(flavor)
        for assignment in _list(admission.get("podSetAssignments"))
        for flavor in _dict(_dict(assignment).get("flavors")).values()
    }
    return frozenset(names) or None


def same_capacity(one: Flavors | None, other: Flavors | None) -> bool:
    """Whether what one gang's attempt in a worker showed (a stockout, a delivery) speaks for
    another gang there: both were assigned the same resource flavors. A stockout is of a kind
    of node (an H100 flavor's says nothing of an A100 or a CPU gang's chances), so a gang of
    other flavors neither sends the next gangs elsewhere nor vouches for the worker. Either
    not known: it counts, as it did before flavors were read."""
    return one is None or other is None or one == other


#: The workers given up for one gang lately: when, and why (``given_up``).
GaveUp = Mapping[str, tuple[datetime, str]]
#: Per gang (namespace, name), the flavors it asked and its give-ups (``departed``).
Departed = dict[tuple[str, str], tuple[Flavors | None, GaveUp]]


def given_up(
    record: DispatchRecord, now: datetime, *, memory: float = FAILURE_MEMORY
) -> dict[str, tuple[datetime, str]]:
    """The workers given up for the gang of ``record`` in the last ``memory`` seconds: when,
    and why."""
    since = now - timedelta(seconds=memory)
    out = {}
    for cluster, stamp in record.failed_at.items():
        when = _when(stamp, now, memory=memory)
        if when is not None and when >= since:
            out[cluster] = (when, record.failed.get(cluster, "failed"))
    return out


def recent_failures(
    records: Iterable[DispatchRecord],
    now: datetime,
    *,
    memory: float = FAILURE_MEMORY,
    also: Iterable[GaveUp] = (),
) -> dict[str, str]:
    """Each worker given up for some gang in the last ``memory`` seconds, with the latest
    reason: from the records on the manager's Workloads (durable: a restart reads them
    again), and ``also`` what ``given_up`` read on the records of gangs deleted since (kept
    by the dispatcher's process: a restart forgets them)."""
    latest: dict[str, tuple[datetime, str]] = {}
    since = now - timedelta(seconds=memory)
    for gave_up in (*(given_up(r, now, memory=memory) for r in records), *also):
        for cluster, (when, why) in gave_up.items():
            if when < since:
                continue
            if cluster not in latest or latest[cluster][0] < when:
                latest[cluster] = (when, why)
    return {c: why for c, (_, why) in latest.items()}


def departed(
    kept: Departed,
    records: Mapping[tuple[str, str], DispatchRecord],
    asks: Mapping[tuple[str, str], Flavors | None],
    now: datetime,
    *,
    memory: float = FAILURE_MEMORY,
) -> Departed:
    """What the dispatcher keeps of each gang's give-ups (``given_up``) for after its Workload
    is deleted: those of the gangs in ``records`` as they read now, with the flavors each
    asks; those ``kept`` of gangs no longer there while any is within ``memory``. A gang
    given up on a stocked-out worker and then deleted (a person tired of waiting, a Job
    finished) no longer sends the next gangs of its flavors to that worker again at once."""
    since = now - timedelta(seconds=memory)
    out = {
        key: (flavors, gave_up)
        for key, (flavors, gave_up) in kept.items()
        if key not in records and any(when >= since for when, _ in gave_up.values())
    }
    for key, record in records.items():
        if gave_up := given_up(record, now, memory=memory):
            out[key] = (asks.get(key), gave_up)
    return out


#: How long (seconds) gangcheck in a nominated worker may leave Kueue's copy there untouched
#: once the copy's quota is reserved before the worker is given up for the gang: gangcheck
#: acts within seconds of the quota (a request made for the copy, or a word on its check),
#: so one that does not is down or stuck. Its leader Lease does not show that when it runs
#: without leader election, or is stuck but still renews it.
UNANSWERED = 300.0


def unanswered(
    copy: Mapping[str, object], checks: Iterable[str], requests: Sequence[Mapping[str, object]]
) -> bool:
    """Kueue's copy of a gang in a worker waits on gangcheck there, which has not acted on
    it: the copy's quota is reserved, not admitted, each of gangcheck's checks on it
    (``checks``: the names of gangcheck's AdmissionChecks there) Pending with no word, and
    gangcheck made no request for it (``requests``: its requests for the copy)."""
    status = _dict(copy.get("status"))
    conds = {str(_dict(c).get("type")): _dict(c) for c in _list(status.get("conditions"))}
    if _dict(conds.get("QuotaReserved")).get("status") != "True" or requests:
        return False
    if _dict(conds.get("Admitted")).get("status") == "True":
        return False
    ours = set(checks)
    states = [_dict(c) for c in _list(status.get("admissionChecks"))]
    mine = [c for c in states if c.get("name") in ours]
    return bool(mine) and all(c.get("state") == "Pending" and not c.get("message") for c in mine)


def not_answering(since: datetime, now: datetime, *, limit: float = UNANSWERED) -> str:
    """Why a worker is given up for a gang whose copy there gangcheck has left untouched
    (``unanswered``) since ``since`` (as this dispatcher saw it), or '' (within ``limit``)."""
    waited = (now - since).total_seconds()
    if waited < limit:
        return ""
    return (
        f"gangcheck there has not acted on the copy in {int(waited)}s since its quota was "
        "reserved (no request made, no word on its check): down, or stuck"
    )


def cannot_deliver(requests: Sequence[Mapping[str, object]]) -> str:
    """Why the capacity source of a worker cannot deliver for a gang, from the worker's
    requests for it (ProvisioningRequests of gangcheck for that Workload), or '' (trying,
    or none yet). Said when every one of them says so (``Failed=True``, or
    ``Provisioned=False`` with cluster-autoscaler's ``CapacityIsNotFound``) and one of them
    asks the last capacity source of its attempt (with a source after it, gangcheck moves
    on inside the worker: as InOrder sources do in one cluster)."""
    if not requests:
        return ""
    saids: list[str] = []
    last = False
    for req in requests:
        said = _not_delivering(req)
        if not said:
            return ""
        saids.append(said)
        last = last or _on_last_source(req)
    return f"its capacity source cannot deliver ({saids[0]})" if last else ""


def _not_delivering(req: Mapping[str, object]) -> str:
    conds = {
        str(_dict(c).get("type")): _dict(c)
        for c in _list(_dict(req.get("status")).get("conditions"))
    }
    failed = conds.get("Failed") or {}
    if failed.get("status") == "True":
        return _said("Failed", failed)
    provisioned = conds.get("Provisioned") or {}
    if provisioned.get("status") == "False" and provisioned.get("reason") == CAPACITY_NOT_FOUND:
        return _said(CAPACITY_NOT_FOUND, provisioned)
    return ""


def _said(kind: str, cond: Mapping[str, object]) -> str:
    reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
    head = kind if reason in ("", kind) else f"{kind}: {reason}"
    return f"{head}: {message}" if message else head


def _on_last_source(req: Mapping[str, object]) -> bool:
    notes = _dict(_dict(req.get("metadata")).get("annotations"))
    try:
        index = int(str(notes.get(SOURCE_ANNOTATION) or 0))
    except ValueError:
        return True
    try:
        config = json.loads(str(notes.get(ATTEMPT_CONFIG_ANNOTATION) or "{}"))
    except ValueError:
        return True
    sources = _list(_dict(config).get("capacitySources"))
    return index >= len(sources) - 1


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(stamp: str, now: datetime, *, memory: float = FAILURE_MEMORY) -> datetime | None:
    """A time of the record as it counts now: None when unreadable, or later than now by
    more than ``memory`` seconds (no clock of another replica is that far off: hand-written,
    it would count for ever)."""
    when = _parse(stamp)
    if when is None or when > now + timedelta(seconds=memory):
        return None
    return when


def _parse(stamp: str) -> datetime | None:
    """A time of the record; None when unreadable, as one without its zone is (every time
    gangcheck writes ends in Z; one without cannot be compared with now)."""
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def describe(record: DispatchRecord) -> list[str]:
    """The record as diagnose prints it: which worker is being tried and why, which were
    given up and skipped, and why."""
    if record.nominated:
        lines = [f"trying {', '.join(record.nominated)}: {record.reason}"]
    else:
        lines = [f"no worker nominated: {record.reason or 'nothing decided yet'}"]
    if record.round > 1:
        lines.append(f"round {record.round}: every worker failed in each round before")
    if record.admitted:
        lines.append(f"admitted in {record.admitted}: MultiKueue places the gang there")
    lines += [f"given up: {c} ({why})" for c, why in sorted(record.failed.items())]
    lines += [f"skipped: {c} ({why})" for c, why in sorted(record.skipped.items())]
    return lines


#: Kueue's field manager of a Workload's admission status (Kueue v0.17,
#: ``constants.AdmissionName``), as which the dispatcher writes the nomination.
KUEUE_ADMISSION = "kueue-admission"


def nominated_by_another(meta: Mapping[str, object]) -> str:
    """The field manager other than Kueue's that owns the Workload's
    ``status.nominatedClusterNames`` (from ``meta``'s managedFields: another dispatcher, or
    a hand's write), or '' when none does. Kueue's: ``KUEUE_ADMISSION`` (its server-side
    apply, and gangcheck's), and ``kueue`` (its user agent, the manager of its merge patches
    under the alpha gate ``WorkloadRequestUseMergePatch``)."""
    for entry in _list(meta.get("managedFields")):
        manager = str(_dict(entry).get("manager") or "")
        if owns_nomination(entry) and manager not in (KUEUE_ADMISSION, "kueue"):
            return manager or "an unnamed field manager"
    return ""


#: Who ``nominated_by_kueue`` says wrote a nomination under Kueue's own field manager that is
#: not gangcheck's (the record's reason: ``left_to_another``).
KUEUE_ITSELF = (
    f"Kueue itself ({KUEUE_ADMISSION}: is its multiKueue.dispatcherName still {DISPATCHER}? "
    "AllAtOnce and Incremental nominate workers themselves)"
)


def nominated_by_kueue(record: DispatchRecord, written: Sequence[str], *, at_once: int = 1) -> bool:
    """Whether the nomination ``written`` (``status.nominatedClusterNames``, under Kueue's
    own field manager, as gangcheck writes it: ``nominated_by_another`` names no other) is
    Kueue's own dispatcher's, not gangcheck's: Kueue restarted with AllAtOnce or Incremental
    as its ``multiKueue.dispatcherName`` nominates workers itself (Kueue v0.17,
    ``nominateAndSynchronizeWorkers``: AllAtOnce writes every worker whenever the nomination
    differs), and writing gangcheck's back would start a loop, each write waking the other.
    Kueue's when it names more workers than gangcheck nominates at once (``at_once``), or,
    once gangcheck has nominated for the gang, a worker it never tried for it. Not when it
    names gangcheck's nomination, nor a worker gangcheck nominated before (gangcheck
    stopped between its record and its nomination: the record's is written next)."""
    names = _names(list(written))
    if not names or set(names) == set(record.nominated):
        return False  # gangcheck's (written under a larger at once: the first ones kept)
    if len(names) > max(at_once, 1):
        return True
    return bool(record.tried) and any(c not in record.tried for c in names)


def owns_nomination(entry: object) -> bool:
    """Whether the managedFields ``entry`` owns ``status.nominatedClusterNames``."""
    return "f:nominatedClusterNames" in _dict(_dict(_dict(entry).get("fieldsV1")).get("f:status"))


def left_to_another(
    record: DispatchRecord,
    written: Sequence[str],
    manager: str,
    *,
    configured: Sequence[str] | None = None,
) -> Step:
    """The step for a Workload whose nomination ``written`` another field manager wrote
    (``nominated_by_another``): left as written, not fought (a forced apply would take it
    back on every pass and the other write it again, each write waking the next pass); the
    record says who wrote it (written once) and names no worker nominated by gangcheck (its
    own was replaced: once the other's is cleared, a worker is chosen afresh), its history
    (tried, given up) kept."""
    reason = f"nominated {', '.join(written)} by {manager}, not by gangcheck: left as written"
    nowhere = [c for c in written if configured is not None and c not in configured]
    if nowhere:  # Kueue v0.17 copies a Workload only to its check's config's clusters
        reason += (
            f" ({', '.join(nowhere)} {'is' if len(nowhere) == 1 else 'are'} not a worker of "
            "its MultiKueueConfig: Kueue copies it nowhere there; the gang waits until that "
            "nomination is cleared)"
        )
    left = replace(record, nominated=(), nominated_at={}, admitted="", reason=reason)
    return Step(tuple(written), left)


#: The conditions Kueue's field manager ``kueue-admission`` owns on a Workload (Kueue v0.17,
#: ``admissionManagedConditions``, pkg/workload/workload.go).
ADMISSION_MANAGED_CONDITIONS = (
    "QuotaReserved",
    "BlockedOnPreemptionGates",
    "Evicted",
    "Admitted",
    "Preempted",
    "Requeued",
    "DeactivationTarget",
    "Finished",
)


def admission_status(status: Mapping[str, object], nominated: Sequence[str]) -> dict[str, object]:
    """The ``status`` of a server-side apply as field manager ``kueue-admission`` that
    changes only ``nominatedClusterNames``: every field that manager owns, as the Workload
    has it now, as Kueue's own apply sends them (``PrepareWorkloadPatch``: the admission,
    the requeue state when it says something, the resource requests (empty once admitted),
    the admission-managed conditions present, the accumulated execution time, the
    evictions' stats, the cluster name, the unhealthy nodes, the preemption gates and every
    admission check). A server-side apply removes what a manager owned and no longer sends:
    ``nominatedClusterNames`` alone dropped the Workload's quota reservation (its
    ``QuotaReserved`` condition and ``admission``), which Kueue then reserved again before
    it copied the Workload to the worker (0.1-0.2 s per nomination, seen in the side-by-side
    benchmark's trace; and the quota open to another Workload meanwhile)."""
    out: dict[str, object] = {}
    admission = status.get("admission")
    if admission is not None:
        out["admission"] = admission
        out["resourceRequests"] = []
    elif status.get("resourceRequests") is not None:
        out["resourceRequests"] = status.get("resourceRequests")
    requeue = _dict(status.get("requeueState"))
    if requeue.get("count") is not None or requeue.get("requeueAt") is not None:
        out["requeueState"] = requeue
    conditions = [
        c
        for c in _list(status.get("conditions"))
        if _dict(c).get("type") in ADMISSION_MANAGED_CONDITIONS
    ]
    if conditions:
        out["conditions"] = conditions
    for key in ("accumulatedPastExecutionTimeSeconds", "clusterName", "unhealthyNodes"):
        if status.get(key) is not None:
            out[key] = status.get(key)
    evictions = _dict(status.get("schedulingStats")).get("evictions")
    if evictions:
        out["schedulingStats"] = {"evictions": evictions}
    if status.get("preemptionGates") is not None:
        out["preemptionGates"] = status.get("preemptionGates")
    if status.get("admissionChecks") is not None:
        out["admissionChecks"] = status.get("admissionChecks")
    out["nominatedClusterNames"] = list(nominated)
    return out


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
