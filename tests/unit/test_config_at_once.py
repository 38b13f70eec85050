"""How many at once, set above what there is to ask: the dispatcher's --dispatch-at-once
(the chart's dispatcher.atOnce) above the worker clusters, and Race's raceWidth above the
capacity sources. The first asks every worker once, with nothing to fix; the second is a
config error naming the field."""

from __future__ import annotations

import pytest

from gangcheck import cli
from gangcheck.logic.dispatch import DispatchRecord, WorkerFacts, decide
from gangcheck.model.provisioning_config import parse_spec


def _worker(name: str) -> WorkerFacts:
    return WorkerFacts(name, reachable=True, fits_now=False, sources=())


def test_dispatch_at_once_above_the_workers_nominates_each_of_them_once() -> None:
    step = decide(DispatchRecord(), (_worker("b"), _worker("a")), at_once=5)
    assert sorted(step.nominated) == ["a", "b"]
    assert sorted(step.newly_nominated) == ["a", "b"]
    again = decide(step.record, (_worker("b"), _worker("a")), at_once=5)
    assert sorted(again.nominated) == ["a", "b"]
    assert again.newly_nominated == ()


def test_dispatch_at_once_below_one_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["run", "--role", "dispatcher", "--dispatch-at-once", "0"]) == 2
    assert "--dispatch-at-once: must be 1 or more" in capsys.readouterr().err


def test_a_race_wider_than_the_sources_is_refused_naming_the_field() -> None:
    sources = [{"nodeSelector": {"pool": p}} for p in "ab"]
    with pytest.raises(ValueError, match=r"^spec\.raceWidth: 3 sources at once, but "):
        parse_spec({"capacitySources": sources, "capacitySourcePolicy": "Race", "raceWidth": 3})
    racing = parse_spec({"capacitySources": sources, "capacitySourcePolicy": "Race"})
    assert racing.racing == 2  # the default width, with exactly as many sources


def test_a_race_of_one_source_is_refused_as_such() -> None:
    """Not by a raceWidth the config never set: the policy names the fault."""
    said = r"^spec\.capacitySourcePolicy: Race asks at least two sources at once, but .* lists 1 "
    for width in ({}, {"raceWidth": 2}):
        with pytest.raises(ValueError, match=said):
            parse_spec(
                {
                    "capacitySources": [{"nodeSelector": {"pool": "a"}}],
                    "capacitySourcePolicy": "Race",
                    **width,
                }
            )
