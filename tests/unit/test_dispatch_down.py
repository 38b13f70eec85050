"""A worker whose gangcheck is down (gangcheck.logic.dispatch: ``lease_down``, ``with_down``):
when its leader Lease counts as stale, what the record says, and how ``decide`` skips the
worker, keeps it while nominated, then gives it up as a failed copy, as tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.logic.dispatch import (
    DOWN_GRACE,
    DOWN_PATIENCE,
    DispatchRecord,
    Down,
    Sighting,
    WorkerFacts,
    decide,
    lease_down,
    recent_failures,
    sighted,
    with_down,
    worker_lease,
)

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
REASON = (
    "gangcheck down: its Lease gangcheck-system/gangcheck last renewed at 2026-12-05T11:58:20Z "
    "(duration 15s)"
)
FAILURE = (
    "gangcheck down: its Lease gangcheck-system/gangcheck last renewed 100s ago, at "
    "2026-12-05T11:58:20Z (duration 15s)"
)


def lease(
    age: float | None = 0.0, duration: Any = 15, *, holder: str | None = "gangcheck-0"
) -> dict[str, Any]:
    """gangcheck's Lease as leader.py writes it: renewed ``age`` seconds before NOW."""
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration}
    if age is not None:
        renewed = NOW - timedelta(seconds=age)
        spec["renewTime"] = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"metadata": {"namespace": "gangcheck-system", "name": "gangcheck"}, "spec": spec}


def test_the_bounds_are_those_the_docs_give() -> None:
    assert (DOWN_GRACE, DOWN_PATIENCE) == (20.0, 60.0)


LEASES = {
    "renewed just now: up": (lease(0), None),
    "within its duration: up": (lease(14.9), None),
    "past its duration, within the grace (a hand-over): up": (lease(15 + DOWN_GRACE), None),
    "past duration + grace: down, kept if nominated": (lease(15 + DOWN_GRACE + 0.1), False),
    "down, the last moment before given up": (lease(15 + DOWN_GRACE + DOWN_PATIENCE), False),
    "down past the patience too: given up if nominated": (
        lease(15 + DOWN_GRACE + DOWN_PATIENCE + 0.1),
        True,
    ),
    "a longer duration counts: 60 s + grace": (lease(60 + DOWN_GRACE, 60), None),
    "no Lease (leader election off): not known": (None, None),
    "no renewTime: not known": (lease(None), None),
    "no duration: not known": (lease(100, None), None),
    "a duration as text: not known": (lease(100, "15"), None),
    "a duration of true: not known": (lease(100, True), None),
    "a duration of 0: not known": (lease(100, 0), None),
    "renewed in the future (another clock ahead): up": (lease(-30), None),
    "a duration beyond an int32's (no Lease's): not known": (lease(100, 2**31), None),
    "a duration too large for a float: not known": (lease(100, 10**400), None),
    "a duration NaN (a JSON decoder accepts it): not known": (lease(100, float("nan")), None),
    "a duration infinite: not known": (lease(100, float("inf")), None),
    "a negative duration: not known": (lease(100, -15), None),
    "a list, not a Lease: not known": ([lease(100)], None),
    "text, not a Lease: not known": ("garbage", None),
    "a spec that is text: not known": ({"spec": "x"}, None),
    "released by its leader (no holder, duration 1), none took it": (
        lease(1 + DOWN_GRACE + 0.1, 1, holder=None),
        False,
    ),
}


@pytest.mark.parametrize(("read", "give_up"), LEASES.values(), ids=LEASES.keys())
def test_gangcheck_is_down_once_its_lease_is_past_its_duration_plus_the_grace(
    read: object, give_up: bool | None
) -> None:
    down = lease_down(read, NOW)
    if give_up is None:
        assert down is None
    else:
        assert down is not None and down.give_up is give_up


def test_the_reasons_name_the_lease_read_not_what_its_metadata_says() -> None:
    """A worker's answer names itself as it likes (10,000 characters, or nothing): the
    reasons written on the record name the Lease the dispatcher read."""
    read = lease(100, holder="h" * 10_000)
    read["metadata"] = {"namespace": "n" * 10_000, "name": "x" * 10_000}
    down = lease_down(read, NOW, name=("gangcheck-system", "gangcheck"))
    assert down is not None
    assert (down.reason, down.failure) == (REASON, FAILURE)
    read["metadata"] = ["not", "a", "map"]
    down = lease_down(read, NOW, name=("gangcheck-system", "gangcheck"))
    assert down is not None and down.reason == REASON


def test_a_renew_time_without_its_zone_or_not_a_time_is_not_known() -> None:
    for stamp in ("2026-12-05T11:00:00", "yesterday", 12):
        read = lease(None)
        read["spec"]["renewTime"] = stamp
        assert lease_down(read, NOW) is None, stamp


def test_the_reason_is_the_same_at_every_pass_the_failure_says_how_long_ago() -> None:
    """The skip reason is written on the record once (a reason moving each second would
    rewrite it at every pass); the failure is written once, when the worker is given up."""
    down = lease_down(lease(100), NOW)
    assert down == Down(REASON, FAILURE, give_up=True)
    later = lease_down(lease(100), NOW + timedelta(seconds=10))  # the same Lease, read later
    assert later is not None and later.reason == REASON
    released = lease_down(lease(40, 1, holder=""), NOW)
    assert released is not None
    assert released.reason.endswith("(duration 1s, no holder)"), released.reason


def renewed_at(stamp: datetime) -> dict[str, Any]:
    """gangcheck's Lease renewed at ``stamp`` by the worker's clock."""
    read = lease(None)
    read["spec"]["renewTime"] = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return read


def reads(renewals: list[tuple[int, int]], *, until: int) -> list[tuple[int, Down | None]]:
    """The dispatcher reading a worker's Lease once a second from NOW to NOW + ``until``:
    ``renewals`` are (when by the manager's clock, the worker's renewTime then, as seconds
    from NOW); what ``lease_down`` says at each read, with the sightings kept between."""
    seen: Sighting | None = None
    said: list[tuple[int, Down | None]] = []
    for tick in range(until + 1):
        done = [stamp for at, stamp in renewals if at <= tick]
        if not done:
            continue
        now = NOW + timedelta(seconds=tick)
        read = renewed_at(NOW + timedelta(seconds=done[-1]))
        seen = sighted(seen, read, now)
        said.append((tick, lease_down(read, now, seen=seen)))
    return said


def first_down(said: list[tuple[int, Down | None]]) -> float | None:
    return next((t for t, d in said if d is not None), None)


def first_given_up(said: list[tuple[int, Down | None]]) -> float | None:
    return next((t for t, d in said if d is not None and d.give_up), None)


def test_a_dead_gangcheck_whose_clock_is_ahead_is_down_from_what_the_dispatcher_saw() -> None:
    """Its clock 100 s ahead, gangcheck renewed every 2 s until NOW + 10, then died: its last
    renewTime reads 110 s in the manager's future for ever. Down once the dispatcher has read
    it unchanged for the duration and the grace (at 10 + 36 s), given up 60 s later; the
    reason says so, the same at every pass. Before, it was never down."""
    renewals = [(t, t + 100) for t in range(0, 11, 2)]
    said = reads(renewals, until=120)
    assert first_down(said) == 10 + 15 + DOWN_GRACE + 1
    assert first_given_up(said) == 10 + 15 + DOWN_GRACE + DOWN_PATIENCE + 1
    reasons = {d.reason for _, d in said if d is not None}
    assert reasons == {
        "gangcheck down: its Lease gangcheck-system/gangcheck unchanged since read at "
        "2026-12-05T12:00:10Z (renewTime 2026-12-05T12:01:50Z, duration 15s)"
    }
    last = said[-1][1]
    assert last is not None and last.failure == (
        "gangcheck down: its Lease gangcheck-system/gangcheck not renewed for 110s, unchanged "
        "since read at 2026-12-05T12:00:10Z (renewTime 2026-12-05T12:01:50Z by its clock, "
        "duration 15s)"
    )


def test_a_live_gangcheck_whose_clock_is_behind_is_down_at_most_until_its_next_renewal() -> None:
    """Its clock 100 s behind, gangcheck renewing every 2 s: each renewTime reads 100 s ago.
    The first read (no renewal seen yet) counts it down, never given up; from the first
    renewal the dispatcher sees happen, up for good. Before, it was down, and given up when
    nominated, for as long as it lived."""
    renewals = [(t, t - 100) for t in range(0, 121, 2)]
    said = reads(renewals, until=120)
    assert [t for t, d in said if d is not None] == [0, 1]
    assert first_given_up(said) is None


def test_a_gangcheck_whose_clock_is_behind_is_down_once_it_stops_renewing() -> None:
    """Its clock 100 s behind, renewing every 2 s until NOW + 10, then dead: down once the
    last renewal seen happen is older than the duration and the grace (it came after the
    read at 9 s), given up when read unchanged for the patience too."""
    renewals = [(t, t - 100) for t in range(0, 11, 2)]
    said = reads(renewals, until=120)
    assert [t for t, d in said if d is not None][:3] == [0, 1, 9 + 15 + DOWN_GRACE + 1]
    assert first_given_up(said) == 9 + 15 + DOWN_GRACE + DOWN_PATIENCE + 1


def test_clocks_that_agree_count_as_before() -> None:
    """The clocks agree: renewing every 2 s until NOW + 10, then dead: down and given up at
    the renewTime's age, as without the sightings."""
    said = reads([(t, t) for t in range(0, 11, 2)], until=120)
    assert first_down(said) == 10 + 15 + DOWN_GRACE + 1
    assert first_given_up(said) == 10 + 15 + DOWN_GRACE + DOWN_PATIENCE + 1
    assert reads([(t, t) for t in range(0, 121, 2)], until=120)[-1][1] is None


def test_a_dispatcher_that_starts_late_gives_a_long_dead_gangcheck_up_only_after_watching() -> None:
    """The dispatcher started (or restarted) with a worker's gangcheck dead for 200 s by the
    renewTime: down at the first read, given up only once it has read the Lease unchanged for
    the patience itself (a clock behind looks the same on a first read)."""
    read = lease(200)
    seen = sighted(None, read, NOW)
    down = lease_down(read, NOW, seen=seen)
    assert down is not None and not down.give_up
    later = NOW + timedelta(seconds=DOWN_PATIENCE)
    seen = sighted(seen, read, later)
    down = lease_down(read, later, seen=seen)
    assert down is not None and down.give_up


def test_a_read_without_a_renew_time_keeps_the_sighting_before() -> None:
    """A Lease read without its renewTime (or none read) is no renewal: the sighting is kept,
    so reading the old value again later is not taken for a renewal."""
    seen = sighted(None, lease(0), NOW)
    assert seen is not None
    assert sighted(seen, lease(None), NOW + timedelta(seconds=5)) == seen
    assert sighted(seen, None, NOW + timedelta(seconds=5)) == seen
    again = sighted(seen, lease(0), NOW + timedelta(seconds=9))
    assert again == Sighting(seen.renewed, first=NOW, last=NOW + timedelta(seconds=9))
    released = lease(0, 1, holder=None)  # released: the holder cleared, renewTime kept
    assert sighted(again, released, NOW + timedelta(seconds=10)).first == NOW  # type: ignore[union-attr]


UP = WorkerFacts("worker-1", fits_now=True)
DOWN = Down(REASON, FAILURE, give_up=False)
LONG_DOWN = Down(REASON, FAILURE, give_up=True)
FACTS = {
    "up: as read": (UP, None, False, UP),
    "down, not nominated: skipped with the reason": (
        UP,
        DOWN,
        False,
        WorkerFacts("worker-1", reachable=False, fits_now=True, skip=REASON),
    ),
    "down long, not nominated: skipped the same": (
        UP,
        LONG_DOWN,
        False,
        WorkerFacts("worker-1", reachable=False, fits_now=True, skip=REASON),
    ),
    "nominated, down a while: kept (patience)": (
        UP,
        DOWN,
        True,
        WorkerFacts("worker-1", reachable=False, fits_now=True, skip=REASON, patience=True),
    ),
    "nominated, down past the patience: failed, as a copy failing": (
        UP,
        LONG_DOWN,
        True,
        WorkerFacts("worker-1", reachable=False, fits_now=True, skip=REASON, failure=FAILURE),
    ),
    "nominated, its copy failed on its own: that failure, at once": (
        WorkerFacts("worker-1", failure="check gpu Rejected"),
        DOWN,
        True,
        WorkerFacts("worker-1", reachable=False, skip=REASON, failure="check gpu Rejected"),
    ),
    "nominated, its copy admitted: left alone (MultiKueue places the gang)": (
        WorkerFacts("worker-1", admitted=True),
        LONG_DOWN,
        True,
        WorkerFacts("worker-1", admitted=True),
    ),
    "skipped already for another reason: that reason": (
        WorkerFacts("worker-1", reachable=False, skip="unreachable: 503"),
        LONG_DOWN,
        True,
        WorkerFacts("worker-1", reachable=False, skip="unreachable: 503"),
    ),
}


@pytest.mark.parametrize(("facts", "down", "nominated", "want"), FACTS.values(), ids=FACTS.keys())
def test_a_worker_whose_gangcheck_is_down_is_skipped_and_kept_a_while_when_nominated(
    facts: WorkerFacts, down: Down | None, nominated: bool, want: WorkerFacts
) -> None:
    assert with_down(facts, down, nominated=nominated) == want


TWO = WorkerFacts("worker-2", fits_now=True)
AT = "2026-12-05T12:00:00Z"
STEPS = {
    "fits in both, worker-1's gangcheck down: worker-2, worker-1 skipped": (
        DispatchRecord(),
        DOWN,
        ("worker-2",),
        {},
    ),
    "worker-1 nominated, down a while: kept, nothing given up": (
        DispatchRecord(nominated=("worker-1",), tried=("worker-1",), reason="worker-1 fits"),
        DOWN,
        ("worker-1",),
        {},
    ),
    "worker-1 nominated, down past the patience: given up, worker-2 nominated": (
        DispatchRecord(nominated=("worker-1",), tried=("worker-1",), reason="worker-1 fits"),
        LONG_DOWN,
        ("worker-2",),
        {"worker-1": FAILURE},
    ),
}


@pytest.mark.parametrize(
    ("record", "down", "nominated", "given_up"), STEPS.values(), ids=STEPS.keys()
)
def test_decide_skips_a_down_worker_and_gives_a_nominated_one_up_after_the_patience(
    record: DispatchRecord,
    down: Down,
    nominated: tuple[str, ...],
    given_up: dict[str, str],
) -> None:
    one = with_down(UP, down, nominated="worker-1" in record.nominated)
    step = decide(record, [one, TWO], now=NOW)
    assert step.nominated == nominated
    assert dict(step.fallbacks) == given_up
    assert step.record.skipped == {"worker-1": REASON}
    assert dict(step.record.failed) == given_up
    if given_up:
        assert step.record.failed_at == {"worker-1": AT}
        assert step.record.reason.startswith(f"given up: worker-1 ({FAILURE}); ")
        assert step.record.tried == ("worker-1", "worker-2")
        # counted against worker-1 for the next gangs, as any failed copy is
        assert recent_failures([step.record], NOW) == {"worker-1": FAILURE}
    else:
        assert not step.record.failed_at


def test_the_record_of_a_worker_kept_down_is_not_written_again_at_the_next_pass() -> None:
    """A pass with gangcheck still down changes nothing the record holds: nothing to write."""
    down = lease_down(lease(100), NOW)
    assert down is not None
    first = decide(DispatchRecord(), [with_down(UP, down, nominated=False), TWO], now=NOW)
    later = lease_down(lease(100), NOW + timedelta(seconds=5))  # the same Lease, read later
    assert later is not None
    again = decide(
        first.record,
        [with_down(UP, later, nominated=False), TWO],
        now=NOW + timedelta(seconds=5),
    )
    assert again.record == first.record
    assert not again.changed


def test_the_lease_read_in_the_workers_is_set_by_environment_or_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Section ``dispatcher`` of the settings: its defaults are gangcheck's own Lease; an
    environment variable sets it, a flag of ``gangcheck run`` wins over both."""
    from gangcheck.cli import _parser, _settings

    def lease_read(*argv: str) -> tuple[str, str]:
        got = _settings(_parser().parse_args(["run", "--role", "dispatcher", *argv])).dispatcher
        return got.worker_lease_namespace, got.worker_lease_name

    assert lease_read() == ("gangcheck-system", "gangcheck")
    monkeypatch.setenv("GANGCHECK_DISPATCHER__WORKER_LEASE_NAMESPACE", "ops")
    monkeypatch.setenv("GANGCHECK_DISPATCHER__WORKER_LEASE_NAME", "gc")
    assert lease_read() == ("ops", "gc")
    assert lease_read("--worker-lease-name", "gc2", "--worker-lease-namespace", "o2") == (
        "o2",
        "gc2",
    )


def test_the_bound_on_a_workers_reads_is_set_by_file_environment_or_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dispatcher.workerAnswerWithinSeconds``: the dispatcher's ``ANSWER_WITHIN`` by default;
    an environment variable sets it, a flag of ``gangcheck run`` wins; a value that is no
    positive number of seconds up to 300 is refused, naming the flag."""
    from gangcheck.cli import _parser, _settings
    from gangcheck.logic.dispatch import ANSWER_WITHIN
    from gangcheck.settings import SettingsError

    def bound(*argv: str) -> float:
        args = _parser().parse_args(["run", "--role", "dispatcher", *argv])
        return float(_settings(args).dispatcher.worker_answer_within_seconds)

    assert bound() == ANSWER_WITHIN
    monkeypatch.setenv("GANGCHECK_DISPATCHER__WORKER_ANSWER_WITHIN_SECONDS", "12.5")
    assert bound() == 12.5
    assert bound("--worker-answer-within", "30") == 30.0
    for wrong in ("0", "-1", "301", "nan", "inf"):
        with pytest.raises(SettingsError, match="--worker-answer-within"):
            bound("--worker-answer-within", wrong)


DEFAULT_LEASE = ("gangcheck-system", "gangcheck")
ANNOTATED = {
    "no annotation: the dispatcher's setting": (None, DEFAULT_LEASE),
    "namespace/name": ("ops/gc", ("ops", "gc")),
    "a name with dots": ("ops/gangcheck.leader", ("ops", "gangcheck.leader")),
    "no slash": ("gc", None),
    "no name": ("ops/", None),
    "no namespace": ("/gc", None),
    "two slashes": ("ops/gc/x", None),
    "upper case": ("Ops/gc", None),
    "a namespace of 64 characters": ("n" * 64 + "/gc", None),
    "a trailing newline": ("ops/gc\n", None),
    "empty": ("", None),
}


@pytest.mark.parametrize(("value", "lease"), ANNOTATED.values(), ids=ANNOTATED.keys())
def test_the_lease_read_in_a_worker_is_its_clusters_annotation_else_the_setting(
    value: str | None, lease: tuple[str, str] | None
) -> None:
    """``gangcheck.io/worker-lease`` on a MultiKueueCluster names gangcheck's Lease in that
    worker (installed in another namespace, or under another name); what is no namespace
    and Lease name there is said, the annotation as written (bounded), for the worker to be
    skipped with it."""
    meta: dict[str, Any] = {"name": "worker-1"}
    if value is not None:
        meta["annotations"] = {"gangcheck.io/worker-lease": value}
    got = worker_lease({"metadata": meta}, DEFAULT_LEASE)
    if lease is not None:
        assert got == lease
    else:
        assert isinstance(got, str)
        assert got.startswith("its MultiKueueCluster's annotation gangcheck.io/worker-lease is ")
        assert got.endswith("not <namespace>/<name> of gangcheck's leader Lease there")
