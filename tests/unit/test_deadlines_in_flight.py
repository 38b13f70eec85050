"""The one rule for the config an attempt in flight follows, table-tested for every source:
its deadlines follow the gang's config now, so `startDeadlineSeconds` edited mid-flight,
lengthened or shortened, applies to a gang binding; what it asked follows the config it was
made under (docs/configure.md, "Changing a config while gangs are in flight").

Each row: the startDeadlineSeconds the attempt was made under (recorded on its request), the
one of the config now (None: the config is gone), and whether the start deadline has passed.
Every source is past 250 s of its start and within 900 s: a Workload admitted 300 s ago, a
slice Ready 300 s ago, a PodGroup's gang released 660 s ago, a growth's members released onto
it 601 s ago."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gangcheck.logic.attempt import lifecycle
from gangcheck.logic.attempt.actions import AnnotateRequest, ReleaseHold
from gangcheck.logic.podgroups import growth
from gangcheck.model.objects import request_of
from gangcheck.model.provisioning_config import parse_spec, spec_record
from tests.builders import node
from tests.unit import test_admission_decide as wl
from tests.unit import test_podgroup_decide as pg
from tests.unit import test_podgroup_growth as grown
from tests.unit import test_slices as sl

SHORT, LONG = 250, 900


def made_under(seconds: int) -> dict[str, str]:
    """The record of an attempt made under startDeadlineSeconds `seconds`."""
    spec = parse_spec({"fulfillment": {"startDeadlineSeconds": seconds}})
    return {"gangcheck.io/attempt-config": spec_record(spec)}


def now_config(seconds: int) -> dict[str, Any]:
    return {"fulfillment": {"startDeadlineSeconds": seconds}}


def _rolls_back(actions: Any) -> bool:
    return any(
        isinstance(a, AnnotateRequest)
        and a.annotations.get("gangcheck.io/rollback-reason", "").startswith("StartDeadline")
        for a in actions
    )


def workload(made: int, now: int | None) -> bool:
    """A Workload admitted 300 s ago, 1 of its 2 members scheduled: its start watchdog."""
    assert now is not None
    decision = wl.run(
        wl.Case(
            "watchdog",
            wl.admitted(),
            config=now_config(now),
            requests=[wl.req(conditions={"Provisioned": ""}, annotations=made_under(made))],
            pods=[wl.member("p0", bound=True), wl.member("p1", bound=False)],
        )
    )
    return _rolls_back(decision.actions)


def slice_(made: int, now: int | None) -> bool:
    """A slice Ready 300 s ago, 7 of its 8 members scheduled: the hold on what arrived for it,
    lifted (and the attempt started) once its start deadline has passed."""
    assert now is not None
    decision = sl.run(
        sl.Case(
            "held",
            sl.held_slice(state="Ready", pod_set_updates=sl.CONSUMES_REQ1),
            requests=[
                sl.req(conditions={"Provisioned": ""}, annotations={**sl.HELD, **made_under(made)})
            ],
            nodes=[node("n1", gpu=4, labels={"pool": "gpu"}), sl.held_node()],
            pods=[*sl.running(4), *sl.added(3)],
            config=now_config(now),
        )
    )
    return any(isinstance(a, ReleaseHold) and a.nodes == ("n2",) for a in decision.actions)


def podgroup_gang(made: int, now: int | None) -> bool:
    """A PodGroup's gang released 660 s ago, 1 of its 2 members bound: its start watchdog."""
    decision = pg._watchdog(
        pg.RELEASED,
        [pg.consuming(0, node_name="n1"), pg.consuming(1)],
        made_under(made),
        config=None if now is None else now_config(now),
    )
    return _rolls_back(decision.actions)


def podgroup_growth(made: int, now: int | None) -> bool:
    """A growth whose 2 members were released onto it 601 s ago, none bound: its start
    watchdog."""
    assert now is not None
    decision = grown.watched(
        annotations={**grown.DELIVERED, **made_under(made)},
        now=datetime(2026, 11, 30, 10, 14, 1, tzinfo=UTC),
        config=now_config(now),
    )
    return _rolls_back(decision.actions)


SOURCES: dict[str, Callable[[int, int | None], bool]] = {
    "workload": workload,
    "slice": slice_,
    "podgroup-gang": podgroup_gang,
    "podgroup-growth": podgroup_growth,
}

#: (made under, the config now, the start deadline passed)
ROWS = [
    pytest.param(LONG, SHORT, True, id="shortened-mid-flight-applies"),
    pytest.param(SHORT, LONG, False, id="lengthened-mid-flight-applies"),
    pytest.param(LONG, LONG, False, id="unchanged-within"),
    pytest.param(SHORT, SHORT, True, id="unchanged-past"),
]


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize(("made", "now", "passed"), ROWS)
def test_the_start_deadline_of_an_attempt_in_flight_is_the_config_nows(
    source: str, made: int, now: int, passed: bool
) -> None:
    assert SOURCES[source](made, now) is passed


@pytest.mark.parametrize(("made", "passed"), [(LONG, False), (SHORT, True)])
def test_a_podgroup_whose_config_is_gone_follows_the_start_deadline_it_recorded(
    made: int, passed: bool
) -> None:
    """Without a config (deleted, made invalid) there is no config now: the attempt goes on
    under the one it recorded, its start deadline too."""
    assert podgroup_gang(made, None) is passed


def test_a_growth_rolled_back_with_no_stamp_backs_off_from_the_deadline_it_was_made_under() -> None:
    """A start rollback with no ``gangcheck.io/start-rolled-back-at`` was begun by a release
    before the stamp, which judged it by the startDeadlineSeconds it was made under: the next
    growth is due a backoff after that one (10:04 + 900 s), when it rolled back, not after the
    config now's (10:04 + 250 s). tests/unit/test_upgrade_in_flight.py has the table."""
    req = request_of(
        grown.grow_req(
            annotations={
                **grown.START_ROLLED,
                **made_under(LONG),
                "gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z",
                "gangcheck.io/released-at": "2026-11-30T10:04:00Z",
            }
        )
    )
    config = parse_spec(now_config(SHORT))
    due = growth.next_due(config, 1, req)
    started_by = datetime(2026, 11, 30, 10, 4, tzinfo=UTC) + timedelta(seconds=LONG)
    backoff = lifecycle.backoff_seconds(1, config.retry_strategy)
    assert due == started_by + timedelta(seconds=backoff)


@pytest.mark.parametrize("raised_to", [LONG, 86400])
def test_a_start_deadline_raised_after_a_growth_rolled_back_does_not_move_the_next(
    raised_to: int,
) -> None:
    """A growth its start watchdog rolled back at 10:08:10 (under 250 s), startDeadlineSeconds
    raised since (the natural answer to start rollbacks): the next growth is still due a
    backoff after 10:08:10, when it rolled back, not after 10:04 + the raised deadline (before:
    10:20, or the next day)."""
    req = request_of(
        grown.grow_req(
            annotations={
                **grown.START_ROLLED,
                **made_under(SHORT),
                "gangcheck.io/fulfillment-deadline": "2026-11-30T10:07:00Z",
                "gangcheck.io/released-at": "2026-11-30T10:04:00Z",
                "gangcheck.io/start-rolled-back-at": "2026-11-30T10:08:10Z",
            }
        )
    )
    config = parse_spec(now_config(raised_to))
    due = growth.next_due(config, 1, req)
    backoff = lifecycle.backoff_seconds(1, config.retry_strategy)
    rolled = datetime(2026, 11, 30, 10, 8, 10, tzinfo=UTC)
    assert due == rolled + timedelta(seconds=backoff)
